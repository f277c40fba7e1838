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

When the members' chains balance over the units (the busiest within :data:`CHAIN_SLACK` of an even share), a
stage is instead one region in which every unit runs whole chains, kernel after kernel, single-threaded
(:func:`chain_region`): no barrier at all, and each kernel reads its predecessor's output from its own core.
"""
from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx import stmt as S

from .lowered import LoweredKernel, Nest
from .partition import plan_wave, share_range, unit_loads


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


# how far over an even share the busiest unit may be for a stage to run one whole member chain per unit
CHAIN_SLACK = 0.3


def _serial(nest: Nest):
    """A nest as one thread runs it: a parallel loop becomes a serial loop over all its iterations."""
    if nest.kind != "parallel":
        return nest.stmt
    loop = nest.stmt
    return S.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body, annotations=loop.annotations)


def chain_region(chains: list[list[Nest]], veus: int, name: str, slack: float):
    """One parallel loop over ``veus`` units where each member's whole chain runs on one unit (LPT by the chains'
    work), its kernels single-threaded one after another: no barrier inside the stage, and every kernel reads
    what the kernel before it wrote on the same core. None when that would leave the busiest unit more than
    ``slack`` over an even share (then :func:`fuse_cpu` builds waves).

    Why: on a CPU, a kernel reading a tensor that another core has just written pays for the transfer (2-core
    Xeon: a 1x1 convolution 45 us alone, 102-125 us after its input was written by the other core), and a wave
    splits every member's parallel loop over all cores, so each member's next kernel reads half of its input
    from the other core, after a barrier. Measured (2 cores, one process, interleaved): RandWire (width 0.5)
    with lios + wave fusion 1.02-1.04x of sequential as waves, 1.15-1.18x as chains (slack 0.3, 0.6, 2);
    Inception-v3 0.96x -> 1.02-1.05x; greedy schedules (chains of one kernel) within noise."""
    works = [sum(n.work for n in c) for c in chains]
    plan = plan_wave([], works, veus)
    if max(unit_loads(plan, works)) > (1.0 + slack) * sum(works) / veus:
        return None
    t = tirx.Var(f"{name}_veu", "int64")
    body = [S.IfThenElse(tirx.EQ(t, _i64(plan.owners[m])), S.SeqStmt([_serial(n) for n in c]) if len(c) > 1
                         else _serial(c[0]), None) for m, c in enumerate(chains)]
    return S.For(t, _i64(0), _i64(veus), tirx.ForKind.PARALLEL, S.SeqStmt(body) if len(body) > 1 else body[0])


def fuse_cpu(members: list[list[LoweredKernel]], prologue: list, params: list, veus: int,
             attrs: dict) -> tuple[tirx.PrimFunc, int, str]:
    """The fused PrimFunc: ``params`` (the fused kernel's buffers), ``prologue`` (statements binding every
    member parameter to one of them), each member's declarations, then one region of whole chains
    (:func:`chain_region`) when the chains balance over the units, else the waves. ``members``: per member, its
    chain of lowered kernels (run one after another). Returns the function, its number of regions (waves; 1 for
    chains) and its mode (``"chains"`` or ``"waves"``)."""
    chains = [[n for k in chain for n in k.nests] for chain in members]
    decls = [d for chain in members for k in chain for d in k.decls]
    region = chain_region(chains, veus, "chains", CHAIN_SLACK) if len(chains) >= veus > 1 else None
    if region is not None:
        body = S.SeqStmt(list(prologue) + decls + [region])
        return tirx.PrimFunc(params, body, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs)), 1, "chains"
    waves = []
    for w in range(max(len(c) for c in chains)):
        nests = [c[w] for c in chains if w < len(c)]
        if len(nests) == 1 and nests[0].kind == "serial":
            waves.append(nests[0].stmt)        # nothing to share: no region
        else:
            waves.append(wave_region(nests, veus, f"wave{w}"))
    body = S.SeqStmt(list(prologue) + decls + waves)
    return tirx.PrimFunc(params, body, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs)), len(waves), "waves"
