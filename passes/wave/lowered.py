"""Kernels as wave fusion sees them: lowered to flat TIR, split into declarations and top-level loop nests.

Why lowered TIR: the members of a wave are already-scheduled kernels (our CPU schedules, DLight on CUDA) with
different shapes; after TVM's own lowering up to ``FlattenBuffer`` each is a flat sequence of buffer
declarations followed by loop nests (CPU: a parallel loop or a serial nest; CUDA: one kernel launch, a
``thread_extent`` nest, per top-level statement). Interleaving those sequences is all that wave fusion does,
so it never has to re-schedule anything. The fused function is handed back to TVM marked as scheduled, and
TVM's remaining lowering passes finish it as they finish any kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import s_tir, tirx
from tvm.tirx import stmt as S

from tvm_interop.runtime.errors import InteropError


class NotFusable(InteropError):
    """A kernel that cannot share a wave; the message says why (recorded, never a failed build). ``unit``: the
    member to leave out, when one is to blame (the others may still fuse)."""

    def __init__(self, message: str, unit: str | None = None):
        super().__init__(message)
        self.unit = unit


def prefix_passes() -> list:
    """TVM's default TIR lowering (``s_tir.pipeline``) up to and including ``FlattenBuffer``, in its order."""
    st, tx = s_tir.transform, tirx.transform
    return [st.CanonicalizeLoop(), st.LowerCrossThreadReduction(), st.LowerInitBlock(),
            st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(), st.LiftThreadBinding(),
            st.ManifestSharedMemoryLocalStage(), st.CompactBufferAllocation(), st.LowerAutoCopy(),
            st.UnifyThreadBinding(), st.LowerMatchBuffer(), st.StmtSimplify(), st.InjectPermutedLayout(),
            st.AnnotateIrregularLoop(), st.InjectSoftwarePipeline(), st.TransformMmaBufferLayout(),
            st.LowerOpaqueBlock(), tx.FlattenBuffer()]


def lower(func: tirx.PrimFunc, target: tvm.target.Target, extra: list | None = None) -> tirx.PrimFunc:
    """A fresh copy of ``func`` (every variable and buffer renewed, so two copies can live in one function)
    lowered through :func:`prefix_passes`, without the allocation annotations that only the passes before
    flattening may read (TVM runs its whole pipeline again on the fused kernel, and ``CompactBufferAllocation``
    would apply a 2-D ``buffer_dim_align`` to the now 1-D buffer). ``extra``: passes run after those."""
    fresh = s_tir.renew_defs(func).with_attr("target", target)   # some passes (LowerThreadAllreduce) need it
    with target:
        mod = tvm.transform.Sequential(prefix_passes() + list(extra or []))(tvm.IRModule({"main": fresh}))
    low = mod["main"].without_attr("target")
    return low.with_body(rebuild(low.body, _drop_pre_flatten_annotations))


_PRE_FLATTEN_ANNOTATIONS = ("buffer_dim_align",)


def _drop_pre_flatten_annotations(stmt):
    if isinstance(stmt, S.AllocBuffer):
        ann = dict(stmt.annotations or {})
        if any(k in ann for k in _PRE_FLATTEN_ANNOTATIONS):
            return S.AllocBuffer(stmt.buffer, annotations={k: v for k, v in ann.items()
                                                          if k not in _PRE_FLATTEN_ANNOTATIONS})
    return stmt


def rebuild(stmt, fn):
    """``stmt`` with ``fn`` applied to every statement, children first (TVM 0.27 has no Python statement mutator);
    a node is rebuilt only when a child changed."""
    if isinstance(stmt, S.SeqStmt):
        seq = [rebuild(s, fn) for s in stmt.seq]
        if any(not a.same_as(b) for a, b in zip(seq, stmt.seq)):
            stmt = S.SeqStmt(seq)
    elif isinstance(stmt, S.For):
        body = rebuild(stmt.body, fn)
        if not body.same_as(stmt.body):
            stmt = S.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                         stmt.annotations, stmt.step)
    elif isinstance(stmt, S.AttrStmt):
        body = rebuild(stmt.body, fn)
        if not body.same_as(stmt.body):
            stmt = S.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)
    elif isinstance(stmt, S.IfThenElse):
        then = rebuild(stmt.then_case, fn)
        other = rebuild(stmt.else_case, fn) if stmt.else_case is not None else None
        if not then.same_as(stmt.then_case) or (other is not None and not other.same_as(stmt.else_case)):
            stmt = S.IfThenElse(stmt.condition, then, other)
    elif isinstance(stmt, S.While):
        body = rebuild(stmt.body, fn)
        if not body.same_as(stmt.body):
            stmt = S.While(stmt.condition, body)
    elif _is_root_wrapper(stmt):
        body = rebuild(stmt.block.body, fn)
        if not body.same_as(stmt.block.body):
            b = stmt.block
            stmt = s_tir.SBlockRealize([], stmt.predicate, s_tir.SBlock(
                b.iter_vars, b.reads, b.writes, b.name_hint, body, b.init, b.alloc_buffers, b.match_buffers,
                b.annotations))
    return fn(stmt)


def _is_root_wrapper(stmt) -> bool:
    """An empty root block around a body (no iterators, buffers or reads): what every fused kernel's body is
    wrapped in (``kernel.in_root_block``), so walks over a fused kernel's statements see through it."""
    return (isinstance(stmt, s_tir.SBlockRealize) and not stmt.iter_values and not stmt.block.iter_vars
            and not stmt.block.alloc_buffers and not stmt.block.match_buffers)


def flat(stmt) -> list:
    """The statements of a (possibly nested) SeqStmt, in order (through a fused kernel's root block)."""
    if _is_root_wrapper(stmt):
        return flat(stmt.block.body)
    if isinstance(stmt, S.SeqStmt):
        out = []
        for s in stmt.seq:
            out.extend(flat(s))
        return out
    return [stmt]


def _int(x) -> int | None:
    return int(x.value) if isinstance(x, tirx.IntImm) else None


def work(stmt) -> int:
    """Dynamic statement count of a loop nest (stores and calls, each loop multiplying its body): the weight
    by which a wave balances its members. Unknown extents count as 1."""
    if isinstance(stmt, S.For):
        return max(_int(stmt.extent) or 1, 1) * work(stmt.body)
    if isinstance(stmt, S.SeqStmt):
        return sum(work(s) for s in stmt.seq)
    if isinstance(stmt, S.IfThenElse):
        return work(stmt.then_case) + (work(stmt.else_case) if stmt.else_case is not None else 0)
    if isinstance(stmt, (S.AttrStmt, S.While)):
        scale = max(_int(stmt.value) or 1, 1) if isinstance(stmt, S.AttrStmt) and stmt.attr_key in (
            "thread_extent", "virtual_thread") else 1
        return scale * work(stmt.body)
    if isinstance(stmt, (S.BufferStore, S.Evaluate)):
        return 1
    return 0


def contains(stmt, pred) -> bool:
    """Whether any statement under ``stmt`` (itself included) satisfies ``pred``."""
    if pred(stmt):
        return True
    if isinstance(stmt, S.SeqStmt):
        return any(contains(s, pred) for s in stmt.seq)
    if isinstance(stmt, S.IfThenElse):
        return contains(stmt.then_case, pred) or (stmt.else_case is not None and contains(stmt.else_case, pred))
    body = getattr(stmt, "body", None)
    return body is not None and isinstance(body, tirx.Stmt) and contains(body, pred)


def is_parallel(stmt) -> bool:
    return isinstance(stmt, S.For) and stmt.kind == tirx.ForKind.PARALLEL


def is_declaration(stmt) -> bool:
    return isinstance(stmt, (S.DeclBuffer, S.AllocBuffer))


@dataclass
class Nest:
    """One top-level statement of a lowered kernel: a unit of a wave."""

    stmt: object
    kind: str            # "parallel" (CPU parallel loop), "serial" (anything else on CPU), "launch" (CUDA)
    work: int
    iterations: int = 1  # parallel: the loop's extent


@dataclass
class LoweredKernel:
    """A lowered kernel split for wave fusion: its parameters, declarations and nests."""

    name: str
    func: tirx.PrimFunc
    decls: list = field(default_factory=list)
    nests: list = field(default_factory=list)
    shared_bytes: int = 0    # CUDA: static shared memory the kernel declares
    syncs: bool = False      # CUDA: its threads synchronise (shared memory, cross-thread reductions, warp ops)

    @property
    def params(self) -> list:
        return list(self.func.params)


def split_cpu(name: str, func: tirx.PrimFunc) -> LoweredKernel:
    """Split a lowered CPU kernel; :class:`NotFusable` when a nest cannot run inside a wave's parallel region
    (a parallel loop below the top level would nest parallel regions)."""
    out = LoweredKernel(name, func)
    for s in flat(func.body):
        if is_declaration(s):
            out.decls.append(s)
            continue
        if is_parallel(s):
            if contains(s.body, is_parallel):
                raise NotFusable(f"{name}: nested parallel loops")
            n = _int(s.extent)
            if n is None or _int(s.min) != 0:
                raise NotFusable(f"{name}: a parallel loop with a symbolic range")
            out.nests.append(Nest(s, "parallel", work(s), n))
        else:
            if contains(s, is_parallel):
                raise NotFusable(f"{name}: a parallel loop below the top level")
            out.nests.append(Nest(s, "serial", max(work(s), 1)))
    return out
