"""Flow launches run on the CPU, checked member by member against TVM.

Why: a flow launch (``passes/wave/flow.py``) has only ever been checked on the CPU through a hand-written
emulation of its TIR that drops barriers, so it was exact only for members whose threads do not synchronise, and
the zoo's runs are full of convolutions that stage data in shared memory. Here the device IR that the product's
build hands to nvcc is interpreted by :mod:`passes.simt` (lock-step threads, shared memory, barriers, warp
shuffles, atomics, with race checks), and each member's output is compared with its unit run alone: the unit's
own PrimFunc, as prepared and before any GPU schedule, built for the CPU by TVM.

Used by ``tests/test_simt.py`` (small zoo configs) and ``scripts/flow_emulate.py`` (any size, e.g. the exact runs
a gpu_check build sends to the device).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm.tirx import stmt as S

from .. import simt
from ..build import build_library
from ..lower import make_plan
from ..schedule import Schedule
from ..target import normalize_target
from . import flow as F
from .kernel import wave_signature
from .lowered import rebuild


def ref_value(program, values: dict, ref):
    """The value of an argument reference among ``values`` (``unit_outputs``' result)."""
    if ref.kind == "input":
        return values["__inputs__"][ref.index]
    if ref.kind == "const":
        return program.constants[ref.index]
    return values[ref.unit][ref.items[0] if ref.items else 0]


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


def _counters(zero_kernel) -> int:
    """How many counters a zeroing kernel clears (the length of its one buffer)."""
    found = []

    def see(s):
        if isinstance(s, S.DeclBuffer):
            found.append(int(s.buffer.shape[0]))
        return s
    rebuild(zero_kernel.body, see)
    return found[0] if len(found) == 1 else -1


@dataclass
class RunResult:
    """One run's launch emulated: what it computed against the members alone, and its counters."""

    name: str
    members: int
    tasks: int
    seconds: float
    max_abs_error: float
    wrong: dict = field(default_factory=dict)   # unit -> max |error| (or "nan")
    counters_right: bool = True

    @property
    def ok(self) -> bool:
        return not self.wrong and self.counters_right

    def as_json(self) -> dict:
        return {"launch": self.name, "members": self.members, "tasks": self.tasks, "seconds": round(self.seconds, 2),
                "max_abs_error": self.max_abs_error, "wrong": self.wrong, "counters_right": self.counters_right,
                "ok": self.ok}


class FlowEmulation:
    """A program flow-fused, built by the product's build (``build_library``, nvcc included), its device IR
    captured; and every unit's output computed on the CPU. ``rtol``/``atol``: the comparison's tolerance."""

    def __init__(self, program, schedule: Schedule, target="cuda -arch=sm_90", seed: int = 0,
                 rtol: float = 1e-4, atol: float = 1e-5, **flow_options):
        target = normalize_target(target)
        self.program, self.rtol, self.atol = program, rtol, atol
        self.coarsen = bool(flow_options.get("coarsen", False))
        self.plan_kernels = F.plan_flow_runs(program, schedule, target)[1]
        self.flow_prog, flow_sched, self.records = F.apply_flow_fusion(program, schedule, target, **flow_options)
        t0 = time.perf_counter()
        _, modules = simt.capture_device_modules(
            lambda: build_library(self.flow_prog, flow_sched, make_plan(self.flow_prog, flow_sched), target))
        self.build_seconds = time.perf_counter() - t0
        self.kernels = simt.kernels_of(modules)
        self.reference = unit_outputs(program, np.random.default_rng(seed))

    def runs(self) -> list:
        """(record, flow PrimFunc name, signature) of every run that became a launch."""
        by_units = {tuple(json.loads(f.attrs[F.FLOW_ATTR])["units"]): gv.name_hint
                    for gv, f in self.flow_prog.mod.functions.items()
                    if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and F.FLOW_ATTR in f.attrs}
        return [(r, by_units[tuple(r.units)], wave_signature(self.program, [r.units])) for r in self.records if r.units]

    def zeroing_kernel(self, name: str, n: int) -> str:
        """The kernel that zeroes the run's ``n`` counters: its own, or the identical one of another run with as
        many counters, which TVM's build keeps in its place (it merges structurally equal functions)."""
        own = f"flow_zero_{name[len('flow_'):]}_kernel"
        if own in self.kernels:
            return own
        same = sorted(k for k, f in self.kernels.items() if k.startswith("flow_zero_") and _counters(f) == n)
        if not same:
            raise simt.Unsupported(f"no kernel zeroes the {n} counters of {name}")
        return same[0]

    def launch(self, run, name: str, sig, kernels: dict | None = None):
        """The run's counters filled with garbage, zeroed by its zeroing kernel, then its launch, both emulated.
        Returns ({(unit, output index): array}, counters)."""
        kernels = kernels or self.kernels
        n = int(next(p for p in self.flow_prog.mod[name].params if p.name == "flow_flags").shape[0])
        flags = np.full(n, 7777, np.int32)
        emu = simt.Emulator(kernels)
        emu.launch(self.zeroing_kernel(name, n), [flags])
        if flags.any():
            raise simt.EmulationError(f"{name}: the zeroing kernel leaves counters set: {flags.tolist()}")
        outs, args = {}, []
        for p in kernels[f"{name}_kernel"].params:
            arg = p.name[:-len("_ptr")] if p.name.endswith("_ptr") else p.name
            if arg == "flow_flags":
                args.append(flags)
            elif arg.startswith("wave_in"):
                args.append(np.ascontiguousarray(ref_value(self.program, self.reference,
                                                           sig.inputs[int(arg[len("wave_in"):])])).copy())
            else:
                unit, _, i = arg.rpartition("_out")
                info = self.program.calls[unit].outputs[int(i)]
                outs[(unit, int(i))] = np.full(info.shape, np.nan, info.dtype)   # unwritten shows as NaN
                args.append(outs[(unit, int(i))])
        emu.launch(f"{name}_kernel", args)
        return outs, flags

    def check(self, run, name: str, sig, kernels: dict | None = None) -> RunResult:
        """Emulate one run and compare every member with its unit alone; races and the like raise
        :class:`simt.EmulationError`."""
        t0 = time.perf_counter()
        outs, flags = self.launch(run, name, sig, kernels)
        seconds = time.perf_counter() - t0
        wrong, worst = {}, 0.0
        for (u, i), a in outs.items():
            ref = self.reference[u][i]
            err = float(np.max(np.abs(a - ref))) if not np.isnan(a).any() else float("nan")
            worst = max(worst, err) if err == err else float("nan")
            if not np.allclose(a, ref, rtol=self.rtol, atol=self.atol):
                wrong[u] = "nan" if err != err else err
        lay = F.layout(F.flow_members(self.program, run.units, self.plan_kernels), self.coarsen)
        counters = int(flags[0]) == lay.total and list(flags[1:]) == [lay.tasks(m) for m in range(len(lay.starts))]
        return RunResult(name, len(run.units), lay.total, seconds, worst, wrong, counters)
