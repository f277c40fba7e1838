"""Bit-mask views of a (sub-)DAG and of its down-sets: the representation the search schedulers work on.

A part of a graph is re-indexed ``0..k-1`` in a topological order; a set of units is an ``int`` whose bit ``i``
stands for local unit ``i``. Set operations on ints are what makes IOS's dynamic program over tens of thousands
of states affordable in Python. The DP's states are the *down-sets* (sets closed under predecessors) of a block:
:func:`ideals` lists them, :func:`split_parts` cuts a block whose down-sets exceed a budget into parts.
"""
from __future__ import annotations

from typing import Iterator, Sequence

from tvm_interop.runtime.errors import InteropError

from ..graph import OpGraph, Unit


def bits(mask: int) -> Iterator[int]:
    """Indices of the set bits, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class LocalDAG:
    """A set of graph units (global indices, in topological order) as bit masks over local indices.

    ``pred[i]`` / ``succ[i]``: the direct predecessors / successors of local unit ``i`` inside the set;
    ``anc[i]`` / ``desc[i]``: all of its ancestors / descendants inside the set; ``full``: every unit.
    Edges to units outside the set are dropped: a part is searched on its own, after the parts before it.
    """

    def __init__(self, graph: OpGraph, idx: Sequence[int]):
        self.graph = graph
        self.idx = list(idx)
        pos = {g: i for i, g in enumerate(self.idx)}
        n = len(self.idx)
        self.n = n
        self.units: list[Unit] = [graph.units[g] for g in self.idx]
        self.pred = [0] * n
        self.succ = [0] * n
        for i, g in enumerate(self.idx):
            for p in graph.preds[g]:
                j = pos.get(p)
                if j is not None:
                    if j >= i:
                        raise InteropError("LocalDAG needs its units in a topological order")
                    self.pred[i] |= 1 << j
                    self.succ[j] |= 1 << i
        self.desc = [0] * n
        for i in reversed(range(n)):
            m = 0
            for s in bits(self.succ[i]):
                m |= self.desc[s] | (1 << s)
            self.desc[i] = m
        self.anc = [0] * n
        for i in range(n):
            m = 0
            for p in bits(self.pred[i]):
                m |= self.anc[p] | (1 << p)
            self.anc[i] = m
        self.full = (1 << n) - 1

    def names(self, mask: int) -> list[str]:
        """Names of the units in ``mask``, in topological order."""
        return [self.units[i].name for i in bits(mask)]


def ideals(dag: LocalDAG, limit: int | None = None) -> list[int] | None:
    """Every down-set (set closed under predecessors) of ``dag``, or None once there are more than ``limit``."""
    out = [0]
    for i in range(dag.n):
        pm, b = dag.pred[i], 1 << i
        out += [s | b for s in out if s & pm == pm]
        if limit is not None and len(out) > limit:
            return None
    return out


def asap_levels(graph: OpGraph) -> list[int]:
    """Length of the longest path from a source to each unit (0 for sources): the wavefront a unit is in."""
    lev = [0] * len(graph)
    for i in range(len(graph)):
        for p in graph.preds[i]:
            if lev[p] + 1 > lev[i]:
                lev[i] = lev[p] + 1
    return lev


def split_parts(graph: OpGraph, max_states: int | None) -> list[tuple[list[int], list[int]]]:
    """Cut ``graph`` into parts, each with at most ``max_states`` down-sets (the DP's states).

    Units are visited level by level (ASAP level, then index), so a part is a horizontal slab of the DAG that
    keeps parallel branches together; a unit is added to the current part unless that would take the part's
    down-set count over the budget. The down-sets are built incrementally (adding a maximal unit ``v`` adds
    ``I + v`` for each down-set ``I`` holding v's predecessors in the part) and returned with each part, as
    local masks. Parts run one after another (a barrier between parts).
    """
    n = len(graph)
    if n == 0:
        return []
    lev = asap_levels(graph)
    order = sorted(range(n), key=lambda i: (lev[i], i))
    parts: list[tuple[list[int], list[int]]] = []
    cur: list[int] = []
    pos: dict[int, int] = {}
    ids: list[int] = [0]
    for v in order:
        pm = 0
        for p in graph.preds[v]:
            j = pos.get(p)
            if j is not None:
                pm |= 1 << j
        b = 1 << len(cur)
        new = [s | b for s in ids if s & pm == pm]
        if cur and max_states is not None and len(ids) + len(new) > max_states:
            parts.append((cur, ids))
            cur, pos, ids = [v], {v: 0}, [0, 1]
        else:
            pos[v] = len(cur)
            cur.append(v)
            ids += new
    parts.append((cur, ids))
    return parts
