"""Fused CUDA kernels (flow launches, wave launches) run on the CPU, checked member by member against TVM.

Why: a flow launch (``passes/wave/flow.py``) had only been checked on the CPU through a hand-written emulation of
its TIR that drops barriers, exact only for members whose threads do not synchronise, while the zoo's runs are
full of convolutions that stage data in shared memory; the wave launches (``passes/wave/cuda.py``) had no CPU
check of their numbers at all. Here the device IR that the product's build hands to nvcc is interpreted by
:mod:`passes.simt` (lock-step threads, shared memory, barriers, warp shuffles, atomics, with race checks), and
each member's output is compared with its unit run alone: the unit's own PrimFunc, as prepared and before any GPU
schedule, built for the CPU by TVM.

Used by ``tests/test_simt.py`` (small zoo configs) and ``scripts/flow_emulate.py`` (any size, e.g. the exact runs
a gpu_check build sends to the device).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np
import tvm

from .. import simt
from ..build import build_library
from ..lower import make_plan
from ..schedule import Schedule
from ..target import normalize_target
from . import flow as F
from .kernel import wave_signature


def ref_value(program, values: dict, ref):
    """The value of an argument reference among ``values`` (``unit_outputs``' result)."""
    if ref.kind == "input":
        return values["__inputs__"][ref.index]
    if ref.kind == "const":
        return program.constants[ref.index]
    if ref.kind == "unit":
        return values[ref.unit][ref.index]
    raise simt.Unsupported(f"a {ref.kind} argument: a kernel takes tensors")


def unit_outputs(program, rng: np.random.Generator) -> dict:
    """Every unit's outputs on random inputs (``"__inputs__"``: the inputs), each unit's PrimFunc as prepared
    (before any GPU schedule) built for the CPU and run on its arguments' values, in program order."""
    values = {"__inputs__": [rng.standard_normal(i.shape).astype(i.dtype) for i in program.input_infos]}
    built = {}
    for name, call in program.calls.items():
        if call.func_name not in built:
            built[call.func_name] = tvm.tirx.build(program.mod[call.func_name].with_attr("global_symbol", "main"),
                                                   target="llvm")
        args = [tvm.runtime.tensor(np.ascontiguousarray(ref_value(program, values, a))) for a in call.args]
        outs = [tvm.runtime.tensor(np.zeros(o.shape, o.dtype)) for o in call.outputs]
        built[call.func_name]["main"](*args, *outs)
        values[name] = [o.numpy() for o in outs]
    return values


@dataclass
class RunResult:
    """A flow run's launch or a wave-fused stage's launches emulated: what they computed against the members
    alone, and (flow) the counters."""

    name: str
    members: int
    tasks: int
    seconds: float
    max_abs_error: float
    wrong: dict = field(default_factory=dict)   # unit -> max |error| (or "nan")
    counters_right: bool = True
    waves: int = 0   # a wave-fused stage: its launches

    @property
    def ok(self) -> bool:
        return not self.wrong and self.counters_right

    def as_json(self) -> dict:
        return {"launch": self.name, "members": self.members, "tasks": self.tasks, "waves": self.waves,
                "seconds": round(self.seconds, 2),
                "max_abs_error": self.max_abs_error, "wrong": self.wrong, "counters_right": self.counters_right,
                "ok": self.ok}


class _Emulation:
    """A fused program built by the product's build (``build_library``, nvcc included) with what it compiled
    captured (device functions, host launches), and every unit's output of the original program computed on the
    CPU. A fused unit is emulated the way its library runs it: its host function's kernel launches, in order."""

    def __init__(self, program, fused_prog, fused_sched, target, seed: int, rtol: float, atol: float):
        self.program, self.fused_prog, self.rtol, self.atol = program, fused_prog, rtol, atol
        t0 = time.perf_counter()
        built = simt.capture_build(
            lambda: build_library(fused_prog, fused_sched, make_plan(fused_prog, fused_sched), target))
        self.build_seconds = time.perf_counter() - t0
        self.kernels, self.host = built.device, built.host
        self.reference = unit_outputs(program, np.random.default_rng(seed))

    def launches(self, func_name: str) -> list:
        """The kernel launches of a fused unit's function, as its host code issues them."""
        if func_name not in self.host:
            raise simt.Unsupported(f"the build has no host function {func_name}")
        return simt.host_launches(self.host[func_name], func_name)

    def tensors(self, func_name: str, sig, extra: dict | None = None) -> tuple[dict, dict]:
        """The fused function's tensors by parameter name: ``wave_in<k>`` the signature's k-th input's value,
        ``<unit>_out<i>`` a NaN array (what no thread writes stays NaN), ``extra`` the rest. Returns (tensors,
        {(unit, output index): array})."""
        tensors, outs = dict(extra or {}), {}
        for p in self.fused_prog.mod[func_name].params:
            if p.name in tensors:
                continue
            if p.name.startswith("wave_in"):
                tensors[p.name] = np.ascontiguousarray(ref_value(
                    self.program, self.reference, sig.inputs[int(p.name[len("wave_in"):])])).copy()
            else:
                unit, _, i = p.name.rpartition("_out")
                info = self.program.calls[unit].outputs[int(i)]
                tensors[p.name] = outs[(unit, int(i))] = np.full(info.shape, np.nan, info.dtype)
        return tensors, outs

    def compare(self, outs: dict) -> tuple[dict, float]:
        """(units whose output differs from the unit alone -> max |error| or "nan", the max |error| overall)."""
        wrong, worst = {}, 0.0
        for (u, i), a in outs.items():
            ref = self.reference[u][i]
            err = float(np.max(np.abs(a - ref))) if not np.isnan(a).any() else float("nan")
            worst = max(worst, err) if err == err and worst == worst else float("nan")
            if not np.allclose(a, ref, rtol=self.rtol, atol=self.atol):
                wrong[u] = "nan" if err != err else err
        return wrong, worst


class FlowEmulation(_Emulation):
    """A program flow-fused (``flow_options``: :func:`flow.apply_flow_fusion`'s), built, its device IR captured.
    ``rtol``/``atol``: the comparison's tolerance."""

    def __init__(self, program, schedule: Schedule, target="cuda -arch=sm_90", seed: int = 0,
                 rtol: float = 1e-4, atol: float = 1e-5, **flow_options):
        target = normalize_target(target)
        self.coarsen = bool(flow_options.get("coarsen", False))
        self.plan_kernels = F.plan_flow_runs(program, schedule, target)[1]
        flow_prog, flow_sched, self.records = F.apply_flow_fusion(program, schedule, target, **flow_options)
        super().__init__(program, flow_prog, flow_sched, target, seed, rtol, atol)

    def runs(self) -> list:
        """(record, flow PrimFunc name, signature) of every run that became a launch."""
        by_units = {tuple(json.loads(f.attrs[F.FLOW_ATTR])["units"]): gv.name_hint
                    for gv, f in self.fused_prog.mod.functions.items()
                    if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and F.FLOW_ATTR in f.attrs}
        return [(r, by_units[tuple(r.units)], wave_signature(self.program, [r.units])) for r in self.records if r.units]

    def zeroing(self, name: str) -> tuple[str, int]:
        """(the function of the unit that makes the launch's counters, how many counters)."""
        call = next(c for c in self.fused_prog.calls.values() if c.func_name == name)
        params = [p.name for p in self.fused_prog.mod[name].params]
        unit = self.fused_prog.calls[call.args[params.index("flow_flags")].unit]
        return unit.func_name, int(unit.outputs[0].shape[0])

    def launch(self, run, name: str, sig, kernels: dict | None = None):
        """The run's counters filled with garbage, then the two units the library runs for it emulated: the
        kernel that zeroes the counters, and the launch. ``kernels``: device functions to use instead of the
        build's (a kernel broken on purpose). Returns ({(unit, output index): array}, counters)."""
        emu = simt.Emulator(kernels or self.kernels)
        zero, n = self.zeroing(name)
        flags = np.full(n, 7777, np.int32)
        emu.call(self.launches(zero), {self.fused_prog.mod[zero].params[-1].name: flags})
        if flags.any():
            raise simt.EmulationError(f"{name}: the zeroing kernel leaves counters set: {flags.tolist()}")
        tensors, outs = self.tensors(name, sig, {"flow_flags": flags})
        emu.call(self.launches(name), tensors)
        return outs, flags

    def check(self, run, name: str, sig, kernels: dict | None = None) -> RunResult:
        """Emulate one run and compare every member with its unit alone; races and the like raise
        :class:`simt.EmulationError`."""
        t0 = time.perf_counter()
        outs, flags = self.launch(run, name, sig, kernels)
        seconds = time.perf_counter() - t0
        wrong, worst = self.compare(outs)
        lay = F.layout(F.flow_members(self.program, run.units, self.plan_kernels), self.coarsen)
        counters = [int(v) for v in flags] == lay.final_counters()
        return RunResult(name, len(run.units), lay.total, seconds, worst, wrong, counters)


class WaveEmulation(_Emulation):
    """A program wave-fused (every fusable stage, as gpu_check's ``X+wave`` variants), built, what it compiled
    captured. A fused stage's unit launches one kernel per wave."""

    def __init__(self, program, schedule: Schedule, target="cuda -arch=sm_90", seed: int = 0,
                 rtol: float = 1e-4, atol: float = 1e-5):
        from .apply import apply_wave_fusion

        target = normalize_target(target)
        wave_prog, wave_sched, records = apply_wave_fusion(program, schedule, target, repack_weights=False)
        self.records = [r for r in records if r.fused]
        super().__init__(program, wave_prog, wave_sched, target, seed, rtol, atol)

    def check(self, rec, kernels: dict | None = None) -> RunResult:
        """Emulate a fused stage's waves and compare every member with its unit alone."""
        sig = wave_signature(self.program, rec.fused)
        func = self.fused_prog.calls[rec.unit].func_name
        t0 = time.perf_counter()
        tensors, outs = self.tensors(func, sig)
        simt.Emulator(kernels or self.kernels).call(self.launches(func), tensors)
        seconds = time.perf_counter() - t0
        wrong, worst = self.compare(outs)
        return RunResult(rec.unit, sum(len(g) for g in rec.fused), 0, seconds, worst, wrong, waves=rec.num_waves)
