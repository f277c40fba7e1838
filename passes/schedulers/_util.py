"""Shared machinery of the search schedulers (ios, hios, exhaustive): bit-mask views of a (sub-)DAG, memoised
stage costs, the merge rule, option checks, and IOS's dynamic program over endings (:func:`ending_dp`).

Bit masks: a part of a graph is re-indexed ``0..k-1`` in a topological order; a set of units is an ``int``
whose bit ``i`` stands for local unit ``i``.
"""
from __future__ import annotations

import math
from typing import Iterable, Iterator, Sequence

from runtime.errors import InteropError

from ..cost import CostModel
from ..graph import OpGraph, Unit
from ..schedule import CONCURRENT, MERGE, Stage
from .base import SearchStats

INF = float("inf")

# hios / multi-device defaults (also used by annotate_latency for schedules with a device map)
DEFAULT_LINK_BANDWIDTH = 300e9   # bytes/s, NVLink-class
DEFAULT_LINK_LATENCY = 5e-6      # seconds per transfer


class SchedulerOptionError(InteropError):
    """A scheduler option is out of range (``r < 1``, ``devices < 1``, ...)."""


def check_limit(name: str, value, allow_none: bool = True) -> int | None:
    """``None`` (unbounded, where allowed) or an integer >= 1."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchedulerOptionError(
            f"scheduler option {name} must be an integer >= 1{' or None (unbounded)' if allow_none else ''}, "
            f"got {value!r}")
    return value


def check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise SchedulerOptionError(f"scheduler option {name} must be a number > 0, got {value!r}")
    return float(value)


def bits(mask: int) -> Iterator[int]:
    """Indices of the set bits, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def merge_key(unit: Unit):
    """Units with equal non-None keys may be merged into one kernel (``strategy="merge"``).

    A convolution (``kind`` starting with ``conv``, with ``attrs["data"]``) merges with convolutions of the same
    kind reading the same tensor with the same strides, dilation, ``groups == 1`` and output size, so that the
    merged kernel is one convolution whose output channels are the concatenation (IOS's rule). Anything else
    is not mergeable.
    """
    a = unit.attrs
    if not unit.kind.startswith("conv") or a.get("data") is None:
        return None
    if int(a.get("groups", 1) or 1) != 1:
        return None
    out = unit.outputs[0] if unit.outputs else None
    return (unit.kind, str(a["data"]), _tup(a.get("strides")), _tup(a.get("dilation")),
            tuple(out.shape[:1]) + tuple(out.shape[2:]) if out else (), out.dtype if out else "")


def _tup(v):
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(_tup(x) if isinstance(x, (list, tuple)) else x for x in v)
    return (v,)


class LocalDAG:
    """A set of graph units (global indices, in topological order) as bit masks over local indices."""

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
        self.full = (1 << n) - 1

    def names(self, mask: int) -> list[str]:
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


class StageCoster:
    """Memoised stage costs over one LocalDAG; counts distinct evaluations in ``stats.stages_costed``."""

    def __init__(self, cost: CostModel, dag: LocalDAG, stats: SearchStats):
        self.cost = cost
        self.dag = dag
        self.stats = stats
        self.memo: dict = {}
        self._lat: dict[int, float] = {}

    @staticmethod
    def canonical(groups: Iterable[int]) -> tuple[int, ...]:
        """Groups ordered by their first unit (unit order inside a group is the topological order)."""
        return tuple(sorted(groups, key=lambda m: m & -m))

    def concurrent(self, groups: tuple[int, ...]) -> float:
        """``groups`` must be canonical (see :meth:`canonical`)."""
        v = self.memo.get(groups)
        if v is None:
            units = self.dag.units
            v = self.cost.stage_latency([[units[i] for i in bits(g)] for g in groups], CONCURRENT)
            self.stats.stages_costed += 1
            self.memo[groups] = v
        return v

    def merge(self, mask: int) -> float:
        key = ("merge", mask)
        v = self.memo.get(key)
        if v is None:
            units = self.dag.units
            v = self.cost.stage_latency([[units[i]] for i in bits(mask)], MERGE)
            self.stats.stages_costed += 1
            self.memo[key] = v
        return v

    def unit_latency(self, i: int) -> float:
        v = self._lat.get(i)
        if v is None:
            v = self._lat[i] = self.cost.unit_latency(self.dag.units[i])
        return v

    def to_stage(self, kind: str, groups: Sequence[int]) -> Stage:
        if kind == MERGE:
            return Stage([[self.dag.units[i].name] for i in bits(sum(groups))], MERGE)
        return Stage([self.dag.names(g) for g in groups], CONCURRENT)


# ---------------------------------------------------------------------------------------------- IOS's DP
def ending_dp(dag: LocalDAG, coster: StageCoster, stats: SearchStats, r: int | None, s: int | None,
              merge: bool = True, states: list[int] | None = None, group_enum_limit: int | None = 6,
              max_merge: int | None = None) -> tuple[float, list[tuple[str, tuple[int, ...]]]]:
    """IOS's dynamic program over the endings of ``dag``: returns (latency, stages in execution order).

    ``cost(S) = min over endings E of S of cost(S - E) + stage(E)``, memoised on the remaining set ``S``. The
    remaining sets are exactly the down-sets of the DAG (given in ``states``, else enumerated), so they are
    solved in order of size, without recursion.

    Endings. ``E`` is an ending of ``S`` when no edge leaves ``E`` for ``S - E`` (E is closed under successors
    in S). For unit ``u`` let ``cl(u) = {u} + (descendants of u in S)``; ``E`` is the union of ``cl(a)`` over
    its minimal elements ``a`` (an antichain), so the endings are enumerated as antichains, once each, by a
    depth-first search over the units whose ``cl`` has at most ``r`` units. Two closed sets that touch by an
    edge intersect, so the connected components of ``E`` are the classes of intersecting ``cl(a)``; they are
    maintained while the search goes, and a branch is cut as soon as a component has more than ``r`` units or
    the components cannot be packed into ``s`` groups of at most ``r`` units (lower bound
    ``max(ceil(|E| / r), #components larger than r / 2)``, which never decreases along a branch). Nothing else
    is cut: every legal ending within the pruning is tried — in particular endings whose groups share
    descendants outside the ending, which the reference implementation drops.

    Groups. A concurrent stage partitions ``E`` into at most ``s`` groups of at most ``r`` units with no edge
    between groups, i.e. each group is a union of components. The best partition of an ending depends on the
    ending only, so it is computed once per distinct ending (memo ``best``): exactly, over all partitions, when
    ``E`` has at most ``group_enum_limit`` components (``None``: always), otherwise over a family of packings
    (one group per component when that fits, and longest-first packings into k = 1..s groups).

    Merge. ``E`` made of >= 2 sinks of ``S`` with the same :func:`merge_key` (at most ``max_merge``) can
    instead run as one merged kernel.
    """
    n = dag.n
    if n == 0:
        return 0.0, []
    if states is None:
        states = ideals(dag)
    states = sorted(states, key=int.bit_count)
    desc = dag.desc
    rcap, scap = r, s
    mkeys = [merge_key(u) for u in dag.units] if merge else [None] * n
    any_merge = merge and len({k for k in mkeys if k is not None}) < sum(k is not None for k in mkeys)
    dp: dict[int, float] = {0: 0.0}
    choice: dict[int, tuple] = {}
    best: dict[int, tuple[float, tuple[int, ...]]] = {}

    def best_of(E: int, comps: list[int]) -> float:
        hit = best.get(E)
        if hit is None:
            hit = _best_partition(comps, coster, rcap, scap, group_enum_limit)
            best[E] = hit
        return hit[0]

    transitions = 0
    for S in states:
        if S == 0:
            continue
        # candidates: units whose closure in S is small enough to belong to a group
        c_low: list[int] = []
        c_cl: list[int] = []
        sinks: list[int] = []
        m = S
        while m:
            low = m & -m
            m ^= low
            u = low.bit_length() - 1
            d = desc[u] & S
            if d == 0:
                sinks.append(u)
            cl = d | low
            if rcap is None or cl.bit_count() <= rcap:
                c_low.append(low)
                c_cl.append(cl)
        nc = len(c_low)
        bestv = INF
        bestc = None

        # depth-first enumeration of antichains of candidates (iterative, explicit stack)
        # frame: (next index, E, chosen, comps)
        stack = [(0, 0, 0, ())]
        while stack:
            j0, E, chosen, comps = stack.pop()
            for j in range(j0, nc):
                low = c_low[j]
                if E & low:
                    continue
                cl = c_cl[j]
                if cl & chosen:
                    continue
                new = cl
                rest = []
                for c in comps:
                    if c & cl:
                        new |= c
                    else:
                        rest.append(c)
                if rcap is not None and new.bit_count() > rcap:
                    continue
                E2 = E | cl
                rest.append(new)
                if scap is not None and rcap is not None and len(rest) > scap:
                    # can the components still be packed into s groups of at most r units?
                    lb = max(-(-E2.bit_count() // rcap), sum(1 for c in rest if 2 * c.bit_count() > rcap))
                    if lb > scap:
                        continue
                comps2 = tuple(rest)
                transitions += 1
                hit = best.get(E2)
                sv = hit[0] if hit is not None else best_of(E2, list(comps2))
                if sv == INF:
                    continue  # no legal partition into groups, nor for any larger ending on this branch
                v = sv + dp[S ^ E2]
                if v < bestv:
                    bestv = v
                    bestc = (CONCURRENT, E2)
                if j + 1 < nc:
                    stack.append((j + 1, E2, chosen | low, comps2))

        if any_merge and len(sinks) >= 2:
            byk: dict = {}
            for u in sinks:
                k = mkeys[u]
                if k is not None:
                    byk.setdefault(k, []).append(u)
            for us in byk.values():
                if len(us) < 2:
                    continue
                top = len(us) if max_merge is None else min(len(us), max_merge)
                for size in range(2, top + 1):
                    for combo in _combinations(us, size):
                        E = 0
                        for u in combo:
                            E |= 1 << u
                        transitions += 1
                        v = coster.merge(E) + dp[S ^ E]
                        if v < bestv:
                            bestv = v
                            bestc = (MERGE, E)
        dp[S] = bestv
        choice[S] = bestc
    stats.states += len(states) - 1
    stats.transitions += transitions

    # reconstruct: the ending chosen for the full set runs last
    out: list[tuple[str, tuple[int, ...]]] = []
    S = dag.full
    while S:
        kind, E = choice[S]
        if kind == MERGE:
            out.append((MERGE, tuple(1 << u for u in bits(E))))
        else:
            out.append((CONCURRENT, best[E][1]))
        S ^= E
    out.reverse()
    return dp[dag.full], out


def _combinations(items: list[int], k: int):
    import itertools

    return itertools.combinations(items, k)


def _best_partition(comps: list[int], coster: StageCoster, r: int | None, s: int | None,
                    limit: int | None) -> tuple[float, tuple[int, ...]]:
    """Cheapest partition of the components of an ending into groups (see :func:`ending_dp`)."""
    comps = sorted(comps, key=lambda m: m & -m)
    sizes = [c.bit_count() for c in comps]
    c = len(comps)
    bestv, bestg = INF, ()
    if limit is None or c <= limit:
        groups: list[int] = []
        gsz: list[int] = []

        def rec(i: int) -> None:
            nonlocal bestv, bestg
            if i == c:
                key = StageCoster.canonical(groups)
                v = coster.concurrent(key)
                if v < bestv:
                    bestv, bestg = v, key
                return
            ci, sz = comps[i], sizes[i]
            for g in range(len(groups)):
                if r is None or gsz[g] + sz <= r:
                    groups[g] |= ci
                    gsz[g] += sz
                    rec(i + 1)
                    groups[g] ^= ci
                    gsz[g] -= sz
            if s is None or len(groups) < s:
                groups.append(ci)
                gsz.append(sz)
                rec(i + 1)
                groups.pop()
                gsz.pop()

        rec(0)
        return bestv, bestg
    # heuristic family for endings with many components
    cands: set[tuple[int, ...]] = set()
    if s is None or c <= s:
        cands.add(StageCoster.canonical(comps))
    lat = [sum(coster.unit_latency(i) for i in bits(m)) for m in comps]
    order = sorted(range(c), key=lambda i: (-lat[i], comps[i] & -comps[i]))
    kmax = c if s is None else min(s, c)
    for k in range(1, kmax + 1):
        gm = [0] * k
        gl = [0.0] * k
        gs = [0] * k
        ok = True
        for i in order:
            room = [g for g in range(k) if r is None or gs[g] + sizes[i] <= r]
            if not room:
                ok = False
                break
            g = min(room, key=lambda g: (gl[g], g))
            gm[g] |= comps[i]
            gl[g] += lat[i]
            gs[g] += sizes[i]
        if ok:
            cands.add(StageCoster.canonical(m for m in gm if m))
    for key in cands:
        v = coster.concurrent(key)
        if v < bestv:
            bestv, bestg = v, key
    return bestv, bestg


# ---------------------------------------------------------------------------------------------- helpers
def asap_levels(graph: OpGraph) -> list[int]:
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


def schedule_cost(stages: Sequence[Stage], graph: OpGraph, cost: CostModel, stats: SearchStats | None = None) -> float:
    total = 0.0
    for st in stages:
        total += cost.stage_latency([[graph.unit(n) for n in g] for g in st.groups], st.strategy)
        if stats is not None:
            stats.stages_costed += 1
    return total


def multi_device_stage_latency(cost: CostModel, graph: OpGraph, stage: Stage, unit_devices: dict[str, int],
                               link_bandwidth: float = DEFAULT_LINK_BANDWIDTH,
                               link_latency: float = DEFAULT_LINK_LATENCY) -> float:
    """Latency of one stage whose groups run on several devices (hios schedules).

    Each device runs its groups as one stage of its own (``cost.stage_latency``), after receiving the inputs
    its units read from units on other devices (earlier stages): one transfer per producer and device,
    ``bytes / link_bandwidth + link_latency``, serialised on the device's link. The stage ends when the last
    device does.
    """
    per_dev: dict[int, list[list[str]]] = {}
    for g in stage.groups:
        per_dev.setdefault(unit_devices.get(g[0], 0), []).append(g)
    worst = 0.0
    for dev, groups in per_dev.items():
        producers: set[str] = set()
        for g in groups:
            for name in g:
                for p in graph.pred_names(name):
                    if unit_devices.get(p, 0) != dev:
                        producers.add(p)
        transfer = sum(sum(t.nbytes for t in graph.unit(p).outputs) / link_bandwidth + link_latency
                       for p in producers)
        t = transfer + cost.stage_latency([[graph.unit(n) for n in g] for g in groups], stage.strategy)
        worst = max(worst, t)
    return worst


def stages_from_choices(coster: StageCoster, choices: Sequence[tuple[str, tuple[int, ...]]]) -> list[Stage]:
    return [coster.to_stage(kind, groups) for kind, groups in choices]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


__all__ = ["INF", "SchedulerOptionError", "check_limit", "check_positive", "bits", "merge_key", "LocalDAG",
           "ideals", "StageCoster", "ending_dp", "asap_levels", "split_parts", "schedule_cost",
           "multi_device_stage_latency", "stages_from_choices", "math"]
