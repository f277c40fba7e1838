"""Register tiles of 1-2 KiB kept on the stack (AVX-512's accumulators), where TVM would put them on the heap.

Why: TVM 0.27's ``LowerTVMBuiltin`` leaves a CPU allocation on the stack (an LLVM ``alloca``, registers after
SROA) only when its scope is ``global`` and it is under 1 KiB (``runtime::kMaxStackAlloca``); every larger one
becomes a ``TVMBackendAllocWorkspace`` call, heap memory that LLVM cannot promote to registers, so each
multiply-add then loads and stores its accumulator. Our CPU schedules size the accumulator tile by the target's
vector registers (``cpu_schedule._ACC_REGS``): on AVX-512 that is 20 registers (26 for a reduction over one
axis) of 64 bytes, 1280-1664 bytes, just over TVM's limit. TVM's pass honours an annotation on the allocation,
``disable_lower_builtin``, that keeps it as it is (an ``alloca``); this pass sets it on every constant-size
``global`` CPU allocation of at most :data:`MAX_STACK_BYTES` that TVM would otherwise put on the heap. Larger
buffers (repacked weights, padded inputs: kilobytes to megabytes) stay on TVM's workspace.

The allocation sits where the schedule put it (the tiles: inside the loop nest, inside a parallel loop's body,
so one per thread); LLVM places every ``alloca`` in its function's entry block, so the stack does not grow
per iteration.

It runs in our TIR pipeline (``passes.wave.cpu_pipeline``) after TVM's lowering and before ``LowerTVMBuiltin``
(TVM's host finalisation), on every CPU function of every build of ours. ``ENABLED = False`` builds as before
(for A/B measurements).
"""
from __future__ import annotations

import math

import tvm
from tvm import tirx
from tvm.tirx import stmt as S

__all__ = ["MAX_STACK_BYTES", "STACK_ANNOTATION", "keep_tiles_on_stack", "stack_bytes"]

STACK_ANNOTATION = "disable_lower_builtin"  # TVM's LowerTVMBuiltin leaves an allocation so marked alone
TVM_STACK_LIMIT = 1024  # runtime::kMaxStackAlloca: below this TVM keeps a global CPU allocation on the stack
MAX_STACK_BYTES = 2048  # 32 vector registers of 64 bytes: the largest register tile a CPU target can hold
ENABLED = True


def stack_bytes(buffer: tirx.Buffer) -> int | None:
    """Bytes of ``buffer`` when its shape is constant, else None."""
    dims = [int(d.value) if isinstance(d, tirx.IntImm) else None for d in buffer.shape]
    if any(d is None for d in dims):
        return None
    dtype = buffer.dtype
    return math.prod(dims) * dtype.bits * dtype.lanes // 8


def _is_cpu(func: tirx.PrimFunc) -> bool:
    target = func.attrs.get("target") if func.attrs is not None else None
    return target is not None and target.kind.name in ("llvm", "c")


def _mark(stmt):
    if not isinstance(stmt, S.AllocBuffer):
        return stmt
    buffer = stmt.buffer
    if buffer.scope() != "global":
        return stmt
    nbytes = stack_bytes(buffer)
    if nbytes is None or not TVM_STACK_LIMIT <= nbytes <= MAX_STACK_BYTES:
        return stmt
    annotations = dict(stmt.annotations or {})
    if annotations.get(STACK_ANNOTATION):
        return stmt
    annotations[STACK_ANNOTATION] = tirx.IntImm("bool", 1)  # TVM reads it as an IntImm, not a Python bool
    return S.AllocBuffer(buffer, annotations=annotations)


def keep_tiles_on_stack(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every CPU allocation of 1 KiB to :data:`MAX_STACK_BYTES` marked to stay an ``alloca``
    (module docstring). Functions for other targets, and every function when :data:`ENABLED` is False, are
    returned as they are."""
    if not ENABLED:
        return mod
    from ..wave.lowered import rebuild

    changed = {}
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and _is_cpu(func):
            body = rebuild(func.body, _mark)
            if not body.same_as(func.body):
                changed[gv] = func.with_body(body)
    if not changed:
        return mod
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in changed.items():
        out[gv] = func
    return out
