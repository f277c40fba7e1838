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
from .lower_streams import lower_to_relax
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
                  target: "str | tvm.target.Target" = "llvm", max_streams: int = 8):
    """Lower and compile; returns the TVM VM executable (call ``.export_library(path)`` to deploy)."""
    t0 = time.perf_counter()
    lowered = lower_to_relax(program, schedule, target, max_streams=max_streams)
    lowered = attach_runtime_payload(lowered, program, plan)
    if isinstance(target, str):
        target = tvm.target.Target(target)
    ex = tvm.compile(lowered, target)
    log.info("build: lowered and compiled %d units in %.2f s", len(program.graph), time.perf_counter() - t0)
    return ex
