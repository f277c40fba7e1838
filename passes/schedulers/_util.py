"""Shared machinery of the search schedulers (ios, hios, exhaustive): bit-mask views of a (sub-)DAG, memoised
stage costs, the merge rule, option checks, and IOS's dynamic program over endings (:func:`ending_dp`).

Bit masks: a part of a graph is re-indexed ``0..k-1`` in a topological order; a set of units is an ``int``
whose bit ``i`` stands for local unit ``i``.
"""
from __future__ import annotations

import itertools
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

    Units extracted from a Relax module carry ``attrs["conv"]``: their key is :func:`passes.merge.merge_key`
    (the lowering's own rule: conv2d, same input tensor, strides, dilation, fused epilogue, ``groups == 1``,
    output size). Otherwise (synthetic graphs) a convolution (``kind`` starting with ``conv``, with
    ``attrs["data"]``) merges with convolutions of the same kind reading the same tensor with the same
    strides, dilation, ``groups == 1`` and output size (IOS's rule). Anything else is not mergeable. The
    searches check a chosen set once more with :func:`merge_ok`.
    """
    a = unit.attrs
    if not unit.kind.startswith("conv") or a.get("data") is None:
        return None
    if a.get("conv"):
        from ..merge import merge_key as lowering_key

        k = lowering_key(unit)
        return None if k is None else ("lowering",) + tuple(k)
    if int(a.get("groups", 1) or 1) != 1:
        return None
    out = unit.outputs[0] if unit.outputs else None
    return (unit.kind, str(a["data"]), _tup(a.get("strides")), _tup(a.get("dilation")),
            tuple(out.shape[:1]) + tuple(out.shape[2:]) if out else (), out.dtype if out else "")


def merge_ok(units: Sequence[Unit]) -> bool:
    """Final check of a merge candidate set (same :func:`merge_key`): for extracted units the lowering's
    :func:`passes.merge.mergeable` (kernels can be aligned, etc.); synthetic units need nothing more."""
    if any(u.attrs.get("conv") for u in units):
        from ..merge import mergeable

        return bool(mergeable(list(units)))
    return True


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
        self.anc = [0] * n
        for i in range(n):
            m = 0
            for p in bits(self.pred[i]):
                m |= self.anc[p] | (1 << p)
            self.anc[i] = m
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
    """Memoised stage costs over one LocalDAG; counts distinct evaluations in ``stats.stages_costed``.

    Also the lower bounds the searches prune with. Every cost model gets ``max over groups of the group's
    latency sum`` (a stage is never faster than its slowest group alone, and a group alone costs the sum of
    its units). A cost model may offer a sharper bound and a faster path through optional methods, used when
    present: ``unit_token(unit)`` + ``stage_latency_tokens(groups_of_tokens)``, and ``unit_bound_terms(unit)``
    -> (compute area, memory area) + ``concurrent_bound_params()`` -> (lead, sync, per_stream), meaning that
    a concurrent stage of k >= 2 groups costs at least ``max(slowest group, lead + max(area sums)) + sync +
    (k - 1) * per_stream`` (see ``SimulatedDevice``); :meth:`multi_bound` evaluates it.
    """

    def __init__(self, cost: CostModel, dag: LocalDAG, stats: SearchStats):
        self.cost = cost
        self.dag = dag
        self.stats = stats
        self.memo: dict = {}
        units = dag.units
        self.lat = [cost.unit_latency(u) for u in units]
        tok = getattr(cost, "stage_latency_tokens", None)
        self._tokens = [cost.unit_token(u) for u in units] if tok is not None and hasattr(cost, "unit_token") else None
        self._tok_fn = tok
        params = getattr(cost, "concurrent_bound_params", None)
        if params is not None and hasattr(cost, "unit_bound_terms"):
            terms = [cost.unit_bound_terms(u) for u in units]
            self.area_c = [t[0] for t in terms]
            self.area_m = [t[1] for t in terms]
            self.bound_params = tuple(float(x) for x in params())
        else:
            self.area_c = [0.0] * len(units)
            self.area_m = [0.0] * len(units)
            self.bound_params = (0.0, 0.0, 0.0)

    def multi_bound(self, max_group: float, compute_area: float, memory_area: float, groups: int) -> float:
        """Lower bound on a concurrent stage of ``groups >= 2`` groups (see the class docstring)."""
        lead, sync, per = self.bound_params
        a = lead + (compute_area if compute_area > memory_area else memory_area)
        return (max_group if max_group > a else a) + sync + (groups - 1) * per

    @staticmethod
    def canonical(groups: Iterable[int]) -> tuple[int, ...]:
        """Groups ordered by their first unit (unit order inside a group is the topological order)."""
        return tuple(sorted(groups, key=lambda m: m & -m))

    def concurrent(self, groups: tuple[int, ...]) -> float:
        """``groups`` must be canonical (see :meth:`canonical`)."""
        v = self.memo.get(groups)
        if v is None:
            if self._tokens is not None:
                tk = self._tokens
                v = self._tok_fn(tuple(tuple(tk[i] for i in bits(g)) for g in groups))
            else:
                units = self.dag.units
                v = self.cost.stage_latency([[units[i] for i in bits(g)] for g in groups], CONCURRENT)
            self.stats.stages_costed += 1
            self.memo[groups] = v
        return v

    def merge(self, mask: int) -> float:
        """Cost of merging the units of ``mask`` into one kernel; INF when :func:`merge_ok` refuses them."""
        key = ("merge", mask)
        v = self.memo.get(key)
        if v is None:
            units = [self.dag.units[i] for i in bits(mask)]
            if merge_ok(units):
                v = self.cost.stage_latency([[u] for u in units], MERGE)
                self.stats.stages_costed += 1
            else:
                v = INF
            self.memo[key] = v
        return v

    def unit_latency(self, i: int) -> float:
        return self.lat[i]

    def to_stage(self, kind: str, groups: Sequence[int]) -> Stage:
        if kind == MERGE:
            return Stage([[self.dag.units[i].name] for i in bits(sum(groups))], MERGE)
        return Stage([self.dag.names(g) for g in groups], CONCURRENT)


# ---------------------------------------------------------------------------------------------- IOS's DP
def ending_dp(dag: LocalDAG, coster: StageCoster, stats: SearchStats, r: int | None, s: int | None,
              merge: bool = True, states: list[int] | None = None, group_enum_limit: int | None = 6,
              max_merge: int | None = None, bound: bool = True) -> tuple[float, list[tuple[str, tuple[int, ...]]]]:
    """IOS's dynamic program over the endings of ``dag``: returns (latency, stages in execution order).

    ``cost(S) = min over endings E of S of cost(S - E) + stage(E)``, memoised on the remaining set ``S``. The
    remaining sets are exactly the down-sets of the DAG (given in ``states``, else enumerated), so they are
    solved in order of size, without recursion.

    Endings. ``E`` is an ending of ``S`` when no edge leaves ``E`` for ``S - E`` (E is closed under successors
    in S). For unit ``u`` let ``cl(u) = {u} + (descendants of u in S)``; ``E`` is the union of ``cl(a)`` over
    its minimal elements ``a`` (an antichain), so the endings are enumerated as antichains, once each, by a
    depth-first search over the units whose ``cl`` has at most ``r`` units, in bit operations (choosing ``a``
    removes its ancestors and descendants from the choices left). Two closed sets that touch by an edge
    intersect, so the connected components of ``E`` are the classes of intersecting ``cl(a)``; they are
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

    Bounds (``bound=True``). A stage is never faster than its slowest group alone, and a group alone costs the
    sum of its units' latencies (true of the simulated and unit cost models; physically true of a device up
    to measurement noise); cost models may sharpen this (:class:`StageCoster`). At each state the endings are
    tried in order of ``cost(S - E) + bound(E)`` and the state is settled when the bound reaches the best
    value found; the partition search prunes the same way. This changes no result (when the bound is valid)
    and saves most stage-cost evaluations.

    Merge. ``E`` made of >= 2 sinks of ``S`` with the same :func:`merge_key` (at most ``max_merge``) can
    instead run as one merged kernel.
    """
    n = dag.n
    if n == 0:
        return 0.0, []
    if states is None:
        states = ideals(dag)
    states = sorted(states, key=int.bit_count)
    desc, anc = dag.desc, dag.anc
    rcap, scap = r, s
    lat, ac, am = coster.lat, coster.area_c, coster.area_m
    LEAD, SYNC, PER = coster.bound_params
    multi_ok = scap is None or scap >= 2
    latc: dict[int, float] = {}  # latency sum of a component (mask)
    mkeys = [merge_key(u) for u in dag.units] if merge else [None] * n
    mergeable = [k for k in mkeys if k is not None]
    any_merge = merge and len(set(mergeable)) < len(mergeable)
    dp: dict[int, float] = {0: 0.0}
    choice: dict[int, tuple] = {}
    # ending -> (cost, groups) of its best partition; groups == () means: only known to cost at least this
    best: dict[int, tuple[float, tuple[int, ...]]] = {}
    transitions = 0
    # per-state scratch, indexed by unit: closure in S and its latency / area sums
    clA = [0] * n
    slA = [0.0] * n
    scA = [0.0] * n
    smA = [0.0] * n
    rlim = n + 1 if rcap is None else rcap
    for S in states:
        if S == 0:
            continue
        # candidates: units whose closure in S is small enough to belong to a group
        C = 0
        sinks: list[int] = []
        m = S
        while m:
            low = m & -m
            m ^= low
            u = low.bit_length() - 1
            d = desc[u] & S
            if d == 0:
                sinks.append(u)
                C |= low
                clA[u] = low
                slA[u] = lat[u]
                scA[u] = ac[u]
                smA[u] = am[u]
            elif d.bit_count() < rlim:
                C |= low
                clA[u] = d | low
                x, y, z = lat[u], ac[u], am[u]
                while d:
                    lb_ = d & -d
                    d ^= lb_
                    i = lb_.bit_length() - 1
                    x += lat[i]
                    y += ac[i]
                    z += am[i]
                slA[u] = x
                scA[u] = y
                smA[u] = z
        bestv = INF
        bestc = None
        pending: list = []
        # depth-first enumeration of the antichains of candidates
        # frame: (choices left, E, components, slowest component, latency sum, compute area, memory area)
        stack = [(C, 0, (), 0.0, 0.0, 0.0, 0.0)]
        while stack:
            allowed, E, comps, maxc, slat, sac, sam = stack.pop()
            while allowed:
                low = allowed & -allowed
                allowed ^= low
                u = low.bit_length() - 1
                cl = clA[u]
                merged = False
                if comps:
                    new = cl
                    rest = []
                    for c in comps:
                        if c & cl:
                            new |= c
                            merged = True
                        else:
                            rest.append(c)
                    if merged:
                        if new.bit_count() > rlim:
                            continue
                        rest.append(new)
                        comps2 = tuple(rest)
                    else:
                        comps2 = comps + (cl,)
                else:
                    new = cl
                    comps2 = (cl,)
                E2 = E | cl
                size = E2.bit_count()
                nco = len(comps2)
                if scap is not None and nco > scap and rcap is not None:
                    # can the components still be packed into s groups of at most r units?
                    if -(-size // rcap) > scap or sum(1 for c in comps2 if 2 * c.bit_count() > rcap) > scap:
                        continue
                if merged:
                    slat2, sac2, sam2 = slat, sac, sam
                    add = cl & ~E
                    while add:
                        lb_ = add & -add
                        add ^= lb_
                        i = lb_.bit_length() - 1
                        slat2 += lat[i]
                        sac2 += ac[i]
                        sam2 += am[i]
                    lc = latc.get(new)
                    if lc is None:
                        lc = latc[new] = sum(lat[i] for i in bits(new))
                else:
                    lc = slA[u]
                    slat2 = slat + lc
                    sac2 = sac + scA[u]
                    sam2 = sam + smA[u]
                maxc2 = maxc if maxc > lc else lc
                transitions += 1
                rem = dp[S ^ E2]
                hit = best.get(E2)
                if hit is not None and hit[1]:
                    v = hit[0] + rem
                    if v < bestv:
                        bestv = v
                        bestc = (CONCURRENT, E2)
                elif bound:
                    lbv = slat2 if size <= rlim else INF  # as one group
                    if nco >= 2 and multi_ok:
                        a = LEAD + (sac2 if sac2 > sam2 else sam2)
                        k = 2 if rcap is None else max(2, -(-size // rcap))
                        lb2 = (maxc2 if maxc2 > a else a) + SYNC + (k - 1) * PER
                        if lb2 < lbv:
                            lbv = lb2
                    if hit is not None and hit[0] > lbv:  # an earlier search showed it costs at least this
                        lbv = hit[0]
                    lbv += rem
                    if lbv < bestv:
                        pending.append((lbv, E2, comps2))
                else:
                    hit = best[E2] = _best_partition(comps2, coster, rcap, scap, group_enum_limit, INF, False)
                    v = hit[0] + rem
                    if v < bestv:
                        bestv = v
                        bestc = (CONCURRENT, E2)
                nxt = allowed & ~desc[u] & ~anc[u]
                if nxt:
                    stack.append((nxt, E2, comps2, maxc2, slat2, sac2, sam2))

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
                    for combo in itertools.combinations(us, size):
                        E = 0
                        for u in combo:
                            E |= 1 << u
                        transitions += 1
                        v = coster.merge(E) + dp[S ^ E]
                        if v < bestv:
                            bestv = v
                            bestc = (MERGE, E)
        if pending:
            pending.sort()
            for lbv, E2, comps2 in pending:
                if lbv >= bestv:
                    break
                rem = dp[S ^ E2]
                hit = best.get(E2)
                if hit is None or not hit[1]:
                    # only a partition cheaper than (bestv - rem) matters here; an incomplete search (empty
                    # groups) is kept as a lower bound
                    hit = best[E2] = _best_partition(comps2, coster, rcap, scap, group_enum_limit, bestv - rem,
                                                     True)
                    if not hit[1]:
                        continue
                v = hit[0] + rem
                if v < bestv:
                    bestv = v
                    bestc = (CONCURRENT, E2)
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


def _best_partition(comps: Sequence[int], coster: StageCoster, r: int | None, s: int | None,
                    limit: int | None, cutoff: float, bound: bool = True) -> tuple[float, tuple[int, ...]]:
    """Cheapest partition of an ending's components into groups (see :func:`ending_dp`).

    Partitions whose lower bound is ``>= min(cutoff, best so far)`` are not costed. Returns ``(value,
    groups)``; ``groups`` is empty when nothing was found below ``cutoff`` (the value is then only a lower
    bound, ``>= cutoff``).
    """
    lat, mb = coster.lat, coster.multi_bound
    comps = sorted(comps, key=lambda m: m & -m)
    clat = [sum(lat[i] for i in bits(m)) for m in comps]
    sizes = [m.bit_count() for m in comps]
    E = 0
    for m in comps:
        E |= m
    slat = sum(clat)
    sac = sum(coster.area_c[i] for i in bits(E))
    sam = sum(coster.area_m[i] for i in bits(E))
    c = len(comps)
    size = sum(sizes)
    one_ok = r is None or size <= r
    multi_ok = c >= 2 and (s is None or s >= 2)
    bestv, bestg = INF, ()
    limit_v = cutoff

    def consider(groups: Iterable[int]) -> None:
        nonlocal bestv, bestg, limit_v
        key = StageCoster.canonical(groups)
        v = coster.concurrent(key)
        if v < bestv:
            bestv, bestg = v, key
            if v < limit_v:
                limit_v = v

    def lower(max_group: float, k: int) -> float:
        if not bound:
            return 0.0
        return slat if k == 1 else mb(max_group, sac, sam, k)

    # seeds: one group per component; the longest-first packings into k groups
    order = sorted(range(c), key=lambda i: (-clat[i], comps[i] & -comps[i]))
    seeds: list[tuple[float, tuple[int, ...]]] = []
    if s is None or c <= s:
        seeds.append((lower(max(clat), c), StageCoster.canonical(comps)))
    kmax = c if s is None else min(s, c)
    for k in range(1, kmax + 1):
        gm, gl, gs = [0] * k, [0.0] * k, [0] * k
        ok = True
        for i in order:
            g = -1
            for h in range(k):
                if (r is None or gs[h] + sizes[i] <= r) and (g < 0 or gl[h] < gl[g]):
                    g = h
            if g < 0:
                ok = False
                break
            gm[g] |= comps[i]
            gl[g] += clat[i]
            gs[g] += sizes[i]
        if ok:
            used = [m for m in gm if m]
            seeds.append((lower(max(gl), len(used)), StageCoster.canonical(used)))
    seeds.sort(key=lambda t: t[0])
    seen = set()
    for lbv, key in seeds:
        if key in seen:
            continue
        seen.add(key)
        if lbv >= limit_v:
            break
        consider(key)
    if limit is not None and c > limit:
        return (bestv, bestg) if bestv < cutoff else (cutoff, ())
    # exact: every partition into <= s groups of <= r units, longest components placed first, pruned by the
    # bound (which only grows as components are placed)
    groups: list[int] = []
    glat: list[float] = []
    gsz: list[int] = []

    def rec(t: int, cur: float) -> None:
        if bound:
            k = len(groups)
            if k >= 2:
                lb = mb(cur, sac, sam, k)
            else:
                lb = min(slat if one_ok else INF, mb(cur, sac, sam, 2) if multi_ok else INF)
            if lb >= limit_v:
                return
        if t == c:
            key = StageCoster.canonical(groups)
            if key not in seen:
                seen.add(key)
                consider(key)
            return
        i = order[t]
        ci, sz, li = comps[i], sizes[i], clat[i]
        for g in range(len(groups)):
            if r is None or gsz[g] + sz <= r:
                groups[g] |= ci
                glat[g] += li
                gsz[g] += sz
                rec(t + 1, max(cur, glat[g]))
                groups[g] ^= ci
                glat[g] -= li
                gsz[g] -= sz
        if s is None or len(groups) < s:
            groups.append(ci)
            glat.append(li)
            gsz.append(sz)
            rec(t + 1, max(cur, li))
            groups.pop()
            glat.pop()
            gsz.pop()

    rec(0, 0.0)
    return (bestv, bestg) if bestv < cutoff else (cutoff, ())


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


__all__ = ["INF", "DEFAULT_LINK_BANDWIDTH", "DEFAULT_LINK_LATENCY", "SchedulerOptionError", "check_limit",
           "check_positive", "bits", "merge_key", "merge_ok", "LocalDAG", "ideals", "StageCoster", "ending_dp",
           "asap_levels", "split_parts", "schedule_cost", "multi_device_stage_latency", "stages_from_choices"]
