"""One parallel region per wave on a CPU: the members' loop nests as one TVM parallel loop.

The region has one iteration per worker thread (a virtual execution unit, Rammer's vEU); each iteration runs
its share of every member (:mod:`passes.wave.partition`): serial nests whole, longest first onto the least
loaded unit, and the members' parallel loops laid end to end and cut so that the units' loads come out equal.
A member's parallel loop becomes a serial loop over the unit's range of its iterations (the loop variable and
body are the member's own; the ranges are compile-time tables indexed by the unit). So there is one thread
hand-off per wave instead of one per kernel, and no thread idles while another member's kernel still runs.

Wave ``k`` holds the ``k``-th nest of every member (a member being one kernel or a group's chain of kernels),
and the end of a parallel region is a barrier: a member's nests stay in their order, and members never wait
for each other inside a wave.
"""
from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx import stmt as S

from .lowered import LoweredKernel, Nest
from .partition import plan_wave, share_range


def _i64(x: int):
    return tirx.IntImm("int64", int(x))


def _table(t, values: list[int], dtype: str):
    """``values[t]`` as a TIR expression (a Select chain; the tables are as long as the thread count)."""
    expr = tirx.IntImm(dtype, values[-1])
    for k in range(len(values) - 2, -1, -1):
        expr = tirx.Select(tirx.EQ(t, tirx.IntImm("int64", k)), tirx.IntImm(dtype, values[k]), expr)
    return expr


def wave_region(nests: list[Nest], veus: int, name: str):
    """One parallel loop over ``veus`` units running ``nests`` (one per member), placed by
    :func:`partition.plan_wave`."""
    t = tirx.Var(f"{name}_veu", "int64")
    par = [n for n in nests if n.kind == "parallel"]
    ser = [n for n in nests if n.kind != "parallel"]
    plan = plan_wave([(n.iterations, max(1, n.work // n.iterations)) for n in par], [n.work for n in ser], veus)
    owner = dict(zip(map(id, ser), plan.owners))
    share = dict(zip(map(id, par), plan.shares))
    body = []
    for nest in nests:
        if nest.kind != "parallel":
            body.append(S.IfThenElse(tirx.EQ(t, _i64(owner[id(nest)])), nest.stmt, None))
            continue
        loop, sh = nest.stmt, share[id(nest)]
        dtype = str(loop.loop_var.ty.dtype)
        ranges = [share_range(sh, plan.bounds[u], plan.bounds[u + 1]) for u in range(veus)]
        lo_v, hi_v = [lo for lo, _ in ranges], [hi for _, hi in ranges]
        lo, hi = _table(t, lo_v, dtype), _table(t, hi_v, dtype)
        body.append(S.For(loop.loop_var, lo, hi - lo, tirx.ForKind.SERIAL, loop.body, annotations=loop.annotations))
    return S.For(t, _i64(0), _i64(veus), tirx.ForKind.PARALLEL, S.SeqStmt(body) if len(body) > 1 else body[0])


def fuse_cpu(members: list[list[LoweredKernel]], prologue: list, params: list, veus: int,
             attrs: dict) -> tuple[tirx.PrimFunc, int]:
    """The fused PrimFunc: ``params`` (the fused kernel's buffers), ``prologue`` (statements binding every
    member parameter to one of them), each member's declarations, then the waves. ``members``: per member, its
    chain of lowered kernels (run one after another). Returns the function and its number of waves."""
    chains = [[n for k in chain for n in k.nests] for chain in members]
    decls = [d for chain in members for k in chain for d in k.decls]
    waves = []
    for w in range(max(len(c) for c in chains)):
        nests = [c[w] for c in chains if w < len(c)]
        if len(nests) == 1 and nests[0].kind == "serial":
            waves.append(nests[0].stmt)        # nothing to share: no region
        else:
            waves.append(wave_region(nests, veus, f"wave{w}"))
    body = S.SeqStmt(list(prologue) + decls + waves)
    return tirx.PrimFunc(params, body, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs)), len(waves)
