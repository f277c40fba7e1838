"""IOS's dynamic program over *endings* (Ding et al., MLSys'21): the search at the heart of the ``ios`` scheduler.

For a remaining set ``S`` of units, ``cost(S) = min over endings E of S of cost(S - E) + stage(E)``. This module
holds the program itself (:func:`ending_dp`) and the choice of groups for one ending (:func:`best_partition`);
the ``ios`` scheduler (:mod:`passes.schedulers.ios`) decides the options, cuts blocks into parts and guards the
answer, and ``hios`` reuses the program on its per-device windows. Everything is in bit masks over a
:class:`~passes.schedulers.bitdag.LocalDAG`; stage costs and bounds come from a
:class:`~passes.schedulers.stage_coster.StageCoster`.
"""
from __future__ import annotations

import itertools
from typing import Iterable, Sequence

from ..schedule import CONCURRENT, MERGE
from .bitdag import LocalDAG, bits, ideals
from .merge_legality import merge_key
from .result import SearchStats
from .stage_coster import INF, StageCoster


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
                    hit = best[E2] = best_partition(comps2, coster, rcap, scap, group_enum_limit, INF, False)
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
                    hit = best[E2] = best_partition(comps2, coster, rcap, scap, group_enum_limit, bestv - rem,
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


def best_partition(comps: Sequence[int], coster: StageCoster, r: int | None, s: int | None,
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
