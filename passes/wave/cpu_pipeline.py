"""TVM's TIR pipeline with two changes for CPU wave kernels of whole chains: chains outlined, no ``StorageRewrite``.

Why: a CPU wave kernel runs each member chain inside one ``T.parallel`` loop (``passes.wave.cpu``), and inside
that loop the members ran 1.3-1.5x slower than the same code in a serial kernel (LLVM reloads their buffer
pointers from the stack in the multiply-add loops of ``__tvm_parallel_lambda``). So ``chain_region`` marks each
whole chain (``cpu.outlined``), and here the mark becomes a ``compute_scope``, which TVM's code generator makes a
``noinline`` function with ``noalias`` pointer parameters. That only helps if the chain's register tiles are
allocated inside the outlined function, and ``StorageRewrite`` hoists every allocation to the top of the parallel
loop's body (its attach scope) and merges the members' tiles into one, which the outlined function then receives
as a pointer: memory, not registers. The pass only plans the reuse of buffers within a kernel, so the wave
kernels lose little by skipping it. TVM's own pipeline ignores the mark: the chains compile inline there.

Measured (2-core EPYC, AVX2; same process, same lios schedule, every fusable stage fused, 150 interleaved
rounds, two runs): RandWire 1.064x -> 1.130x and 1.192x -> 1.236x over sequential with the chains outlined,
Inception-v3 unchanged within noise (1.036x -> 1.038x, 1.034x -> 1.031x); an
earlier probe of single stages with and without ``StorageRewrite``: outlined with it left in ran slower than not
outlined (RandWire stage 3: 106.7 vs 87.9 us; 69.8 us without it): ``docs/bench_cpu_outlined_chains_2026-11-30.md``,
``docs/bench_cpu_register_tiles_2026-11-30.md``.

Two more things this pipeline does to the wave kernels, both for LLVM's verifier: each outlined function is
named after its kernel (a library compiles every kernel into one LLVM module, where two kernels'
``chains_m0_compute_`` would collide), and a statement follows the parallel loop (TVM 0.27's code generator
leaves the last outlined function's debug location on the builder, and the kernel's ``ret`` would carry it:
"!dbg attachment points at wrong subprogram"; a statement visited after the loop sets the kernel's own).

Every other PrimFunc (wave kernels without marked chains included), and every non-CPU build, goes through TVM's
default pipeline unchanged, with one addition for every CPU function: allocations of 1-2 KiB (AVX-512's register
tiles) are marked to stay on the stack (``passes.kernels.stack_tiles``), where TVM alone would put them on the
heap. Every build of ours compiles through :func:`compile_with_waves`.
"""
from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx import stmt as S

from ..kernels.stack_tiles import keep_tiles_on_stack
from .cpu import OUTLINE_ATTR

PIPELINE_NAME = "tvm_interop_cpu_wave"
# what this pipeline makes of the same scheduled TIR, part of every measured cost's cache key
# (``passes.cost.measured``): bump it when the same kernels come to compile into other code, so that no timing of
# the old code is reused. 1: TVM's pipeline with the chains outlined; 2: allocations of 1-2 KiB kept on the stack
# (``passes.kernels.stack_tiles``: AVX-512's register tiles)
PIPELINE_CODEGEN = 2
_DISABLE_STORAGE_REWRITE = "tirx.disable_storage_rewrite"
_COMPUTE_SCOPE = "compute_scope"


def _is_outlining_cpu_wave_kernel(func) -> bool:
    """A CPU wave kernel with chains marked to be outlined (the others, waves, go through TVM's pipeline)."""
    from .kernel import WAVE_ATTR

    if not isinstance(func, tirx.PrimFunc) or func.attrs is None or WAVE_ATTR not in func.attrs:
        return False
    target = func.attrs.get("target")
    return (target is None or target.kind.name in ("llvm", "c")) and _has_attr(func.body, OUTLINE_ATTR)


def _has_attr(stmt, key: str) -> bool:
    found = []

    def visit(s):
        if isinstance(s, S.AttrStmt) and s.attr_key == key:
            found.append(s)
        return s

    from .lowered import rebuild

    rebuild(stmt, visit)
    return bool(found)


def prepared_wave_kernel(func: tirx.PrimFunc, prefix: str) -> tirx.PrimFunc:
    """``func`` (a CPU wave kernel) with each statement marked :data:`cpu.OUTLINE_ATTR` a ``compute_scope`` named
    ``<prefix>_<mark>_compute_``, and a statement after every parallel loop that holds one (module docstring)."""
    from .lowered import rebuild

    def fix(stmt):
        if isinstance(stmt, S.AttrStmt) and stmt.attr_key == OUTLINE_ATTR:
            return S.AttrStmt(stmt.node, _COMPUTE_SCOPE,
                              tvm.ir.StringImm(f"{prefix}_{stmt.value.value}_compute_"), stmt.body)
        # children are rewritten first: the loop's marks are compute scopes by now
        if isinstance(stmt, S.For) and stmt.kind == tirx.ForKind.PARALLEL and _has_attr(stmt.body, _COMPUTE_SCOPE):
            return S.SeqStmt([stmt, _location_reset()])
        return stmt

    return func.with_body(rebuild(func.body, fix))


def _location_reset():
    """A statement the code generator visits (so it emits the kernel's own debug location) and that does
    nothing: an assertion that always holds. ``tvm_interop`` never builds with assertions removed."""
    return S.AssertStmt(tirx.const(True, "bool"), tvm.ir.StringImm("unreachable"), [])


def _factory():
    default, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("default")

    @tvm.transform.module_pass(opt_level=0, name="tvm_interop.CpuWavePipeline")
    def _pipeline(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        waves = {gv: prepared_wave_kernel(f, gv.name_hint) for gv, f in mod.functions.items()
                 if _is_outlining_cpu_wave_kernel(f)}
        if not waves:
            return keep_tiles_on_stack(default(mod))
        rest = {gv: f for gv, f in mod.functions.items() if gv not in waves}
        out = default(tvm.IRModule(rest, attrs=mod.attrs)) if rest else tvm.IRModule({}, attrs=mod.attrs)
        config = dict(ctx.config)
        config[_DISABLE_STORAGE_REWRITE] = True
        with tvm.transform.PassContext(opt_level=ctx.opt_level, required_pass=list(ctx.required_pass),
                                       disabled_pass=list(ctx.disabled_pass), config=config,
                                       instruments=list(ctx.instruments)):
            fused = default(tvm.IRModule(waves, attrs=mod.attrs))
        for gv, func in fused.functions.items():
            out[gv] = func
        return keep_tiles_on_stack(out)

    return _pipeline, finalize_host, finalize_device


def cpu_tir_pipeline() -> str:
    """The registered name of this pipeline (registered on first use), for ``tvm.compile(tir_pipeline=...)``."""
    from tvm.tirx.compilation_pipeline import PIPELINE_MAP, register_tir_pipeline

    if PIPELINE_NAME not in PIPELINE_MAP:
        register_tir_pipeline(PIPELINE_NAME, _factory)
    return PIPELINE_NAME


def compile_with_waves(mod: tvm.IRModule, target, **kwargs):
    """``tvm.compile`` through this pipeline: how our builds (``build_library``, the as-built check, the measured
    cost model, profiling bundles) compile, so that a fused kernel's marked chains are outlined wherever it is
    built. ``kwargs``: passed on (``relax_pipeline``)."""
    return tvm.compile(mod, target, tir_pipeline=cpu_tir_pipeline(), **kwargs)
