"""The fused kernel of one wave stage: its signature in the program and its PrimFunc.

A stage's groups (each a chain of units run in order) become one kernel: its parameters are the stage's
external inputs (each tensor once, however many members read it) followed by every member unit's outputs, in
group order. A unit that reads another member's output (the next unit of a chain) reads that output parameter
directly, so a chain's intermediate results never leave the kernel's arguments. Every member parameter is
re-declared as a view of the fused parameter it stands for; the members' bodies are not rewritten at all.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import tvm
from tvm import tirx
from tvm.tirx import stmt as S

from tvm_interop.runtime.plan import Ref

from .lowered import LoweredKernel, NotFusable, lower, split_cpu

WAVE_ATTR = "tvm_interop.wave"


@dataclass
class WaveSignature:
    """How the fused kernel is called: ``inputs`` (external, in parameter order) then ``outputs`` (unit, index)."""

    groups: list[list[str]]
    inputs: list[Ref] = field(default_factory=list)
    outputs: list[tuple[str, int]] = field(default_factory=list)

    @property
    def units(self) -> list[str]:
        return [u for g in self.groups for u in g]


def wave_signature(program, groups: list[list[str]]) -> WaveSignature:
    sig = WaveSignature([list(g) for g in groups])
    members = set(sig.units)
    for u in sig.units:
        for ref in program.calls[u].args:
            if ref.kind == "tuple":
                raise NotFusable(f"{u}: a tuple argument")
            if ref.kind == "unit" and ref.unit in members:
                continue
            if ref not in sig.inputs:
                sig.inputs.append(ref)
        sig.outputs.extend((u, i) for i in range(len(program.calls[u].outputs)))
    return sig


# the fused kernel's code generation, part of every cache key of a timed wave stage (``passes.cost.measured``):
# bump it when the same members come to be fused into different code, so no timing of the old code is reused
WAVE_CODEGEN = 5   # 2: CPU stages of balanced chains run one whole chain per thread (passes.wave.cpu);
                   # 3: where whole chains do not balance, one-kernel members are cut over the threads;
                   # 4: each whole chain outlined into its own function (passes.wave.cpu.outlined; never landed);
                   # 5: 4 with each outlined chain declaring its own buffers (cpu.member_declarations)


@dataclass
class WaveKernel:
    """A built wave: the PrimFunc, its signature, and how many waves (barriers) it has."""

    func: tirx.PrimFunc
    signature: WaveSignature
    num_waves: int
    mode: str = "waves"   # CPU: "chains" (each member's chain on one thread, no barrier), "chains+split" (the
                          # one-kernel members cut over the threads) or "waves" (passes.wave.cpu)


def lower_unit(program, unit: str, target: tvm.target.Target) -> LoweredKernel:
    """The unit's kernel, scheduled as the build would schedule it, lowered and split into nests."""
    call = program.calls[unit]
    if call.is_library:   # an extern call (cuDNN / cuBLAS) has no TIR to interleave
        raise NotFusable(f"{unit} runs as a library call ({call.func_name}), an extern call that cannot share a "
                         "kernel", unit=unit)
    func = program.mod[call.func_name]
    if target.kind.name == "cuda":
        from ..cuda_build import scheduled_as_built
        from .cuda import split_cuda, sync_passes

        return split_cuda(unit, lower(scheduled_as_built(func, target), target, sync_passes()))
    if target.kind.name != "llvm":
        raise NotFusable(f"wave fusion supports CPU (llvm) and CUDA targets, not {target.kind.name}")
    return split_cpu(unit, lower(func, target))


def fused_param_map(program, sig: WaveSignature, kernels: dict, extra_inputs: list | None = None
                    ) -> tuple[list, dict]:
    """The fused kernel's parameters (``sig.inputs``, then ``extra_inputs`` (buffers), then every member output),
    and for each member parameter ``(unit, position)`` the fused parameter it stands for. Shared by the wave and
    the flow kernels (``passes.wave.flow``), which differ only in how the members' launches are laid out."""
    fused_param: dict = {}
    params: list = []

    def new_param(key, like, name: str):
        buf = tirx.decl_buffer(like.shape, like.dtype, name=name)
        fused_param[key] = buf
        params.append(buf)

    # parameters: inputs first, then outputs (the order call_tir passes them)
    first_use: dict = {}
    for u in sig.units:
        for pos, ref in enumerate(program.calls[u].args):
            first_use.setdefault(ref, kernels[u].params[pos])
    for k, ref in enumerate(sig.inputs):
        new_param(("in", ref), first_use[ref], f"wave_in{k}")
    params.extend(extra_inputs or [])
    for u, i in sig.outputs:
        n_in = len(program.calls[u].args)
        new_param(("out", u, i), kernels[u].params[n_in + i], f"{u}_out{i}")
    binding = {}
    members = set(sig.units)
    for u in sig.units:
        call, kern = program.calls[u], kernels[u]
        if len(kern.params) != len(call.args) + len(call.outputs):
            raise NotFusable(f"{u}: the kernel takes {len(kern.params)} parameters, the call passes "
                             f"{len(call.args) + len(call.outputs)}")
        for pos, p in enumerate(kern.params):
            if pos < len(call.args):
                ref = call.args[pos]
                key = ("out", ref.unit, ref.index) if ref.kind == "unit" and ref.unit in members else ("in", ref)
            else:
                key = ("out", u, pos - len(call.args))
            target_buf = fused_param[key]
            if [int(d) for d in p.shape] != [int(d) for d in target_buf.shape] or str(p.dtype) != str(target_buf.dtype):
                raise NotFusable(f"{u}: parameter {pos} does not match the tensor passed to it")
            binding[(u, pos)] = target_buf
    return params, binding


def fused_params(program, sig: WaveSignature, kernels: dict, extra_inputs: list | None = None
                 ) -> tuple[list, list]:
    """The fused kernel's parameters (:func:`fused_param_map`) and the prologue re-declaring each member parameter
    as a view of the fused one it stands for (the members' bodies are not rewritten at all)."""
    params, binding = fused_param_map(program, sig, kernels, extra_inputs)
    prologue = [S.DeclBuffer(kernels[u].params[pos], data=buf.data) for (u, pos), buf in binding.items()]
    return params, prologue


def wave_forms(program, groups: list[list[str]], target: tvm.target.Target, veus: int | None = None,
               lowered: dict | None = None) -> list[str | None]:
    """The forms ``groups`` can be fused into (``build_wave_kernel``'s ``form``): on a CPU those of
    :func:`cpu.cpu_forms`; a GPU stage has one form (None)."""
    if target.kind.name == "cuda":
        return [None]
    from tvm_interop.runtime.cpu_threads import kernel_threads

    from .cpu import cpu_forms

    kernels = _lowered(program, wave_signature(program, groups), target, lowered)
    return list(cpu_forms([[kernels[u] for u in g] for g in groups], veus or kernel_threads()))


def _lowered(program, sig: WaveSignature, target, lowered: dict | None) -> dict:
    """The members' lowered kernels, from ``lowered`` where it has them (units lowered here are added to it)."""
    cache = {} if lowered is None else lowered
    for u in sig.units:
        if u not in cache:
            cache[u] = lower_unit(program, u, target)
    return {u: cache[u] for u in sig.units}


def build_wave_kernel(program, groups: list[list[str]], target: tvm.target.Target,
                      veus: int | None = None, lowered: dict | None = None, form: str | None = None) -> WaveKernel:
    """Fuse ``groups`` (one stage's, each a chain of units) into one kernel; :class:`NotFusable` if a member
    cannot share it. ``lowered``: units already lowered by :func:`lower_unit` (the others are lowered here).
    ``form``: on a CPU, one of :data:`cpu.CPU_FORMS` (None: :func:`cpu.fuse_cpu`'s default); a GPU stage has
    one form."""
    sig = wave_signature(program, groups)
    kernels = _lowered(program, sig, target, lowered)
    params, prologue = fused_params(program, sig, kernels)
    chains = [[kernels[u] for u in g] for g in sig.groups]
    first = kernels[sig.units[0]].func
    attrs = {k: v for k, v in (first.attrs or {}).items() if k not in ("tvm_interop.cpu_plan", "global_symbol")}
    attrs.update({"tirx.is_scheduled": True, "tirx.noalias": True,
                  WAVE_ATTR: json.dumps({"groups": sig.groups, "target": target.kind.name})})
    if target.kind.name == "cuda":
        from .cuda import fuse_cuda

        func, waves = fuse_cuda(chains, prologue, params, attrs)
        mode = "waves"
    else:
        from tvm_interop.runtime.cpu_threads import kernel_threads

        from .cpu import fuse_cpu

        func, waves, mode = fuse_cpu(chains, prologue, params, veus or kernel_threads(), attrs, form)
    return WaveKernel(in_root_block(func), sig, waves, mode)


def in_root_block(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its body inside an empty root block, as every function TVM itself makes has it.

    Why: Relax's passes assume that shape. ``RewriteDataflowReshape`` asks ``HasReshapePattern`` about every
    dataflow call that passes one tensor, and that check stops the build with an InternalError on a body that is
    not a root block: a fused stage of members that all read one tensor and no weights (GoogLeNet's greedy
    stage of two layout transforms of one activation, on an 8-lane CPU) failed `compile --wave-fusion` that
    way. The block has no iterators, buffers or reads: TVM's lowering removes it again (``LowerOpaqueBlock``),
    so the kernel compiled is the same (``tests/test_wave.py`` compares the lowered code with and without it)."""
    from tvm import s_tir

    if isinstance(func.body, s_tir.SBlockRealize):
        return func
    root = s_tir.SBlock([], [], [], "root", func.body)
    return func.with_body(s_tir.SBlockRealize([], True, root))
