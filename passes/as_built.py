"""The build's own pipeline, with the stream memory check inside it.

Why this module exists: on the first H100 run, 62 of 126 scheduled programs computed wrong outputs while the
memory checker passed them all, because the checker planned memory with a short pipeline of its own, and the
build's pipeline (TVM's, for the target) deleted the calls that kept tensors alive. A check must check the
thing that ships. So the memory check here is a pass *of the build*: it is inserted into TVM's pipeline for the
target (``relax.backend.cuda`` through :func:`passes.cuda_build.cuda_pipeline_passes`, ``cpu_generic`` for LLVM,
``gpu_generic`` otherwise) right after ``KillAfterLastUse``, where memory is planned, CUDA graphs are rewritten and
every ``kill`` marks where a storage goes back to the VM's pool. The build refuses a program that fails it.

:func:`as_built_ir` runs the same passes up to that point (no code generation), for tests, reports and tools
that need the IR a build compiles.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import tvm

from tvm_interop.runtime.cuda import MAIN_FUNC, MAIN_GRAPH_FUNC
from tvm_interop.runtime.errors import InteropError

from .cuda_build import KILL_PASS, CudaBuildReport, cuda_pipeline_passes, insert_after
from .keep_kernels import keep_kernels_pass
from .target import normalize_target
from .stream_memory import MemorySafetyReport, activation_memory, check_stream_memory_safety

log = logging.getLogger(__name__)


def _backend_passes(target: tvm.target.Target) -> list:
    """TVM's default pipeline for a non-CUDA target, as a list (the order of ``relax.get_default_pipeline``),
    after :func:`passes.keep_kernels.keep_kernels_pass` (TVM's ``FuseOps`` must not group our kernels again)."""
    from tvm.relax.backend import cpu_generic, gpu_generic

    backend = cpu_generic.pipeline if target.kind.name == "llvm" else gpu_generic.pipeline
    return ([keep_kernels_pass()] + backend.library_dispatch_passes(target) + backend.legalize_passes(target)
            + backend.dataflow_lower_passes(target) + backend.finalize_passes(target))


def pipeline_passes(target, graph_funcs=(), report: CudaBuildReport | None = None) -> list:
    """The passes ``tvm.compile`` runs on a lowered module for ``target`` (CUDA: with the graph rewrite limited to
    ``graph_funcs``), without the memory check."""
    target = normalize_target(target)
    if target.kind.name == "cuda":
        return cuda_pipeline_passes(target, tuple(graph_funcs), report)
    return _backend_passes(target)


@dataclass
class MemoryCheckResult:
    """What the in-pipeline check found (filled in when the build runs it)."""

    report: MemorySafetyReport | None = None
    seconds: float = 0.0
    functions: list = field(default_factory=list)


def memory_check_pass(result: MemoryCheckResult | None = None, refuse: bool = True) -> tvm.transform.Pass:
    """A pass that checks the stream memory safety of the module it is given (unchanged) and, with ``refuse``,
    raises :class:`InteropError` naming the violations. (TVM's pass infrastructure re-raises it under another
    type: callers look at ``result.report``, which is set before raising.)"""

    @tvm.transform.module_pass(opt_level=0, name="InteropStreamMemoryCheck")
    def _check(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        t0 = time.perf_counter()
        report = check_stream_memory_safety(mod)
        if result is not None:
            result.report = report
            result.seconds = time.perf_counter() - t0
            result.functions = sorted(report.functions)
        log.info("as-built stream memory check: %s (%.2f s)", report.summary(), time.perf_counter() - t0)
        if refuse:
            report.raise_if_unsafe()
        return mod

    return _check


def checked_passes(target, graph_funcs=(), report: CudaBuildReport | None = None,
                   result: MemoryCheckResult | None = None) -> list:
    """:func:`pipeline_passes` with :func:`memory_check_pass` right after ``KillAfterLastUse``."""
    return insert_after(pipeline_passes(target, graph_funcs, report), KILL_PASS, [memory_check_pass(result)])


def _run(passes: list, mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    with target:
        return tvm.transform.Sequential(passes)(mod)


def default_graph_funcs(mod: tvm.IRModule, target) -> tuple[str, ...]:
    """The functions a CUDA build captures as graphs by default: the lowering's graph variants (also those
    with a prefix, several schedules in one library); none for other targets."""
    if normalize_target(target).kind.name != "cuda":
        return ()
    return tuple(sorted(gv.name_hint for gv in mod.get_global_vars() if gv.name_hint.endswith(MAIN_GRAPH_FUNC)))


def run_until(mod: tvm.IRModule, target, last_pass: str = KILL_PASS, graph_funcs=None) -> tvm.IRModule:
    """Run the build's passes for ``target`` on ``mod`` up to and including ``last_pass``."""
    target = normalize_target(target)
    if graph_funcs is None:
        graph_funcs = default_graph_funcs(mod, target)
    passes = pipeline_passes(target, graph_funcs)
    names = [p.info.name for p in passes]
    if last_pass not in names:
        raise InteropError(f"TVM's pipeline for {target.kind.name} has no {last_pass} pass (passes: "
                           f"{', '.join(names)})")
    return _run(passes[:names.index(last_pass) + 1], mod, target)


def as_built_ir(mod: tvm.IRModule, target, graph_funcs=None) -> tvm.IRModule:
    """The IR that the build of ``mod`` for ``target`` checks and then compiles: the build's passes up to and
    including ``KillAfterLastUse`` (``graph_funcs``: the functions captured as CUDA graphs; default: as the
    build does, :func:`default_graph_funcs`)."""
    return run_until(mod, target, KILL_PASS, graph_funcs)


def build_checked_cpu(mod: tvm.IRModule, target, result: MemoryCheckResult | None = None):
    """``tvm.compile`` for a non-CUDA target with TVM's default pipeline plus the memory check (an unsafe program
    raises :class:`InteropError`)."""
    target = normalize_target(target)
    result = result if result is not None else MemoryCheckResult()
    passes = checked_passes(target, result=result)

    @tvm.transform.module_pass(opt_level=0, name="InteropCheckedPipeline")
    def _pipeline(m: tvm.IRModule, _ctx) -> tvm.IRModule:
        return _run(passes, m, target)

    try:
        from .wave.cpu_pipeline import compile_with_waves

        return compile_with_waves(mod, target, relax_pipeline=_pipeline)
    except Exception:
        if result.report is not None and not result.report.ok:
            result.report.raise_if_unsafe()
        raise


def check_lowered(lowered: tvm.IRModule, target="llvm", graph_funcs=None, functions=None) -> MemorySafetyReport:
    """Check a lowered module as its build for ``target`` would see it (:func:`as_built_ir`: TVM's pipeline up
    to ``KillAfterLastUse``, CUDA graph rewriting of ``graph_funcs`` included)."""
    return check_stream_memory_safety(as_built_ir(lowered, target, graph_funcs), functions=functions)


def memory_report(program, schedule, target="llvm", mode: str = "stage", max_streams: int = 8,
                  baseline=None) -> dict:
    """Activation memory, in bytes, of the scheduled program vs plain TVM's sequential ``main``: the sum of the
    ``alloc_storage`` sizes in the IR each build plans (outputs included, the same way for both). ``baseline``: the
    program whose ``main`` is the sequential reference (default ``program``); a program that fusion or merges
    rewrote is compared with the model's own (a flow launch keeps every member's output alive, and its rewritten
    ``main`` would be a baseline just as large)."""
    from .lower_streams import lower_program

    low = lower_program(program, schedule, target, max_streams=max_streams, mode=mode)
    scheduled = activation_memory(as_built_ir(low.mod, target), MAIN_FUNC)
    base = baseline if baseline is not None else program
    plain = tvm.IRModule({gv: f for gv, f in base.mod.functions.items()}, attrs=base.mod.attrs)
    sequential = activation_memory(as_built_ir(plain, target), "main")
    return {"scheduled_bytes": int(scheduled), "sequential_bytes": int(sequential), "mode": mode,
            "num_streams": low.num_streams, "ratio": (scheduled / sequential) if sequential else None}
