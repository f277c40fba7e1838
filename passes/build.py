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

from runtime.model import CONSTANTS_FUNC, PLAN_FUNC
from runtime.plan import ExecutionPlan

from .extract import Program
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
                  cuda_graph: bool = False, check_memory: bool = True):
    """Lower and compile; returns the TVM VM executable (call ``.export_library(path)`` to deploy).

    CUDA targets go through ``passes.cuda_build`` (nvcc, DLight schedules, the CUDA-graph variant when
    ``cuda_graph``); it needs no GPU. ``check_memory``: the stream memory check runs *inside* the build's
    pipeline, on the IR it compiles (``passes.as_built``), and the build raises :class:`InteropError` for an
    unsafe program. What was decided (streams, CUDA graph and why not, the memory check) is recorded in
    ``plan.meta`` before the plan is embedded.
    """
    from .as_built import MemoryCheckResult, build_checked_cpu, memory_check_pass
    from .cuda_build import build_cuda, graph_feasibility, normalize_target
    from .lower_streams import lower_program

    t0 = time.perf_counter()
    target = normalize_target(target)
    mode = mode or plan.meta.get("mode", "stage")
    is_cuda = target.kind.name == "cuda"
    low = lower_program(program, schedule, target, max_streams=max_streams, mode=mode, cuda_graph=cuda_graph)
    reason = low.cuda_graph_reason
    if low.cuda_graph:
        ok, why = graph_feasibility(low.mod, target)
        if not ok:
            log.warning("CUDA graph not possible for this program, using direct launches: %s", why)
            reason = why
            low = lower_program(program, schedule, target, max_streams=max_streams, mode=mode, cuda_graph=False)
    checked = MemoryCheckResult()

    def compile_lowered(lowered_low):
        plan.meta.update({"num_streams": lowered_low.num_streams, "cuda_graph": bool(lowered_low.cuda_graph),
                          "cuda_graph_reason": reason if cuda_graph else None,
                          "memory_check": "as-built IR, after KillAfterLastUse" if check_memory else "off"})
        lowered = attach_runtime_payload(lowered_low.mod, program, plan)
        if is_cuda:
            checks = [memory_check_pass(checked)] if check_memory else []
            return build_cuda(lowered, target, cuda_graph=lowered_low.cuda_graph, after_kill=checks)
        if check_memory:
            return build_checked_cpu(lowered, target, checked), None
        return tvm.compile(lowered, target), None

    def compile_checked(lowered_low):
        try:
            return compile_lowered(lowered_low)
        except Exception:
            # the check raised inside TVM's pass infrastructure, which does not keep the exception's type
            if checked.report is not None and not checked.report.ok:
                checked.report.raise_if_unsafe()
            raise

    ex, report = compile_checked(low)
    if report is not None and low.cuda_graph and not report.cuda_graph:
        # The prediction said yes, the build's own rewrite said no: the graph function would run direct
        # launches behind staging copies. Build again without it, and say why.
        log.warning("CUDA graph rewrite disagreed with the feasibility check: %s", report.reason)
        reason = report.reason
        low = lower_program(program, schedule, target, max_streams=max_streams, mode=mode, cuda_graph=False)
        ex, report = compile_checked(low)
    if check_memory:
        log.info("build: as-built stream memory check passed for %s in %.2f s", ", ".join(checked.functions),
                 checked.seconds)
    log.info("build: lowered and compiled %d units in %.2f s", len(program.graph), time.perf_counter() - t0)
    return ex
