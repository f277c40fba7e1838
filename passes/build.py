"""Build a scheduled program into one TVM library: the stream-lowered Relax VM program, every unit's kernel,
the execution plan (for the CPU worker-thread executor) and the constants, all in a single module.

Embedding the plan and the constants as two extra Relax functions (``__tvm_interop_plan`` returns the plan as a
string, ``__tvm_interop_constants`` the weights as a tuple) means an exported ``.so`` is self-contained: TVM's
runtime loads it and ``runtime`` finds everything it needs inside, with no side files to lose.
"""
from __future__ import annotations

import logging
import time

import tvm
from tvm import relax

from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.model import CONSTANTS_FUNC, PLAN_FUNC
from tvm_interop.runtime.plan import ExecutionPlan

from .extract import Program
from .layout import program_layout
from .schedule import Schedule

log = logging.getLogger(__name__)


def _string_imm(text: str):
    cls = getattr(relax.expr, "StringImm", None) or tvm.ir.expr.StringImm
    return cls(text)


def attach_runtime_payload(mod: tvm.IRModule, program: Program, plan: ExecutionPlan) -> tvm.IRModule:
    """Add the plan and constants functions to a lowered module."""
    bb = relax.BlockBuilder()
    with bb.function(PLAN_FUNC, []):
        bb.emit_func_output(_string_imm(plan.dumps()))
    with bb.function(CONSTANTS_FUNC, []):
        bb.emit_func_output(relax.Tuple(list(program.const_exprs)))
    extra = bb.get()
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in extra.functions.items():
        out[gv.name_hint] = func
    return out


def build_library(program: Program, schedule: Schedule, plan: ExecutionPlan,
                  target: "str | tvm.target.Target" = "llvm", max_streams: int = 8, mode: str | None = None,
                  cuda_graph: bool = False, check_memory: bool = True, candidates: bool | None = None,
                  cuda_arches: list[str] | None = None, sync: str = "tvm",
                  unfused: "tuple[Program, Schedule] | None" = None, fused_by: str = "wave"):
    """Lower and compile; returns the TVM VM executable (call ``.export_library(path)`` to deploy).

    CUDA targets go through ``passes.cuda_build`` (nvcc, DLight schedules, the CUDA-graph variant when
    ``cuda_graph``); it needs no GPU. ``check_memory``: the stream memory check runs *inside* the build's
    pipeline, on the IR it compiles (``passes.as_built``), and the build raises :class:`InteropError` for an
    unsafe program. ``candidates`` (default: on for GPU targets): the library also carries the other
    synchronisation mode and sequential, each direct and as a CUDA graph, for the runtime to pick from by
    measurement (``passes.candidates``, ``runtime.picker``). ``cuda_arches``: the arches the kernels are compiled
    for (default: the target's), recorded for the runtime's arch check. ``sync="events"`` (CUDA): streams are
    ordered with events reused for the life of the loaded model (the native extension, linked into the export)
    instead of TVM's per-call event. ``unfused``: for a program that ``fused_by`` (``"wave"`` or ``"flow"``
    fusion) rewrote, the (program, schedule) it rewrote; the candidates then include that schedule unfused
    (``passes.candidates``), whose kernels the fused program's module still holds. What was decided (streams,
    CUDA graph and why not, the candidates, the memory check) is recorded in ``plan.meta`` before the plan is
    embedded.
    """
    from .as_built import MemoryCheckResult, build_checked_cpu, memory_check_pass
    from .candidates import describe, graph_functions, lower_variants, merge_modules
    from .cuda_build import build_cuda, graph_feasibility
    from .target import cpu_isa_features, normalize_target, requested_arches

    t0 = time.perf_counter()
    target = normalize_target(target)
    mode = mode or plan.meta.get("mode", "stage")
    is_cuda = target.kind.name == "cuda"
    layout = program_layout(program)   # read before the repack, which rebuilds the module
    if target.kind.name == "llvm":   # weights repacked once here, not on every call (the library only)
        from .kernels.prepack import prepack_weights

        program = prepack_weights(program, target)
        if unfused is not None:   # repacked as wave fusion repacked it: the very kernels the fused module holds
            from .wave.apply import fusion_program

            unfused = (fusion_program(unfused[0], target), unfused[1])
    if candidates is None:
        candidates = target.kind.name != "llvm"

    if is_cuda:
        arches = list(cuda_arches) if cuda_arches else requested_arches(target)
    library_units = {name: {"func": uc.func_name, "params": list(uc.params)}
                     for name, uc in program.calls.items() if uc.is_library}
    events = is_cuda and sync == "events"
    if library_units or events:
        if not is_cuda:
            raise InteropError(f"{len(library_units)} unit(s) run as cuDNN/cuBLAS calls, which need a CUDA target, "
                               f"not {target.kind.name}")
        from .offload import ensure_extension

        plan.meta["native_extension"] = ensure_extension()
        if library_units:
            plan.meta["library_units"] = library_units
    plan.meta["sync"] = "events" if events else "tvm"
    plan.meta["layout"] = layout
    refused: dict[str, str] = {}   # graph functions the build's own rewrite did not capture, and why

    def graph_ok(low):
        if low.graph_function in refused:
            return False, refused[low.graph_function]
        ok, why = graph_feasibility(low.mod, target, low.graph_function)
        if not ok:
            log.warning("CUDA graph not possible for %s, using direct launches: %s", low.graph_function, why)
        return ok, why

    def lower_all():
        return lower_variants(program, schedule, target, max_streams, mode, cuda_graph, candidates,
                              graph_ok if is_cuda else None, sync=sync if is_cuda else "tvm",
                              unfused=unfused if candidates else None, fused_by=fused_by)

    variants = lower_all()
    checked = MemoryCheckResult()

    def compile_variants(vs):
        primary = vs[0].lowered
        meta = {"num_streams": primary.num_streams, "cuda_graph": bool(primary.cuda_graph),
                "cuda_graph_reason": primary.cuda_graph_reason if cuda_graph else None,
                "memory_check": "as-built IR, after KillAfterLastUse" if check_memory else "off"}
        if candidates:
            meta["candidates"], meta["default_candidate"] = describe(vs)
        if is_cuda:
            meta["cuda_arches"] = list(arches)
        elif target.kind.name == "llvm":   # what the runtime checks this CPU for before any kernel runs
            meta["cpu_features"] = cpu_isa_features(target)
            meta["cpu"] = target.attrs.get("mcpu") or "generic"
        plan.meta.update(meta)
        lowered = attach_runtime_payload(merge_modules(vs), program, plan)
        try:
            if is_cuda:
                checks = [memory_check_pass(checked)] if check_memory else []
                return build_cuda(lowered, target, cuda_graph=bool(graph_functions(vs)),
                                  graph_funcs=graph_functions(vs), after_kill=checks, arches=arches)
            if check_memory:
                return build_checked_cpu(lowered, target, checked), None
            from .wave.cpu_pipeline import compile_with_waves

            return compile_with_waves(lowered, target), None
        except Exception:
            # the check raised inside TVM's pass infrastructure, which does not keep the exception's type
            if checked.report is not None and not checked.report.ok:
                checked.report.raise_if_unsafe()
            raise

    ex, report = compile_variants(variants)
    wanted = set(graph_functions(variants))
    if report is not None and wanted and not wanted <= set(report.graph_functions):
        # The prediction said yes, the build's own rewrite said no for some: their graph functions would run
        # direct launches behind staging copies. Say so, and lower and build again without them.
        missing = sorted(wanted - set(report.graph_functions))
        log.warning("CUDA graph rewrite disagreed with the feasibility check for %s: %s", ", ".join(missing),
                    report.reason)
        refused.update({name: report.reasons.get(name, report.reason) or "not captured by RewriteCUDAGraph"
                        for name in missing})
        variants = lower_all()
        ex, report = compile_variants(variants)
    if check_memory:
        log.info("build: as-built stream memory check passed (%s) in %.2f s",
                 checked.report.summary() if checked.report else "not run", checked.seconds)
    log.info("build: lowered and compiled %d units (%d candidate program(s)) in %.2f s", len(program.graph),
             len(plan.meta.get("candidates", [])) or 1, time.perf_counter() - t0)
    return ex
