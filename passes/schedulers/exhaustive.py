"""Brute force over every stage sequence: the ground truth the tests hold ``ios`` to. Tiny graphs only.

Written independently of ``ios`` on purpose (no shared enumeration code; only the bit and merge helpers): for a remaining set ``S`` it tries
every nonempty subset ``E`` of ``S``, keeps those with no edge from ``E`` to ``S - E``, and runs each as

* a concurrent stage under every partition of ``E`` into groups with no edge between two groups (units of a
  group run in topological order, groups are ordered by their first unit — the same canonical form ``ios``
  uses, so both cost exactly the same stages), and
* a merge stage, when ``E`` has >= 2 units, no edge inside, one
  :func:`~passes.schedulers.merge_legality.merge_key` and :func:`~passes.schedulers.merge_legality.merge_ok`
  agrees.

No pruning. Because stage costs add up, the best sequence for ``S`` ends with the best sequence for
``S - E``, so results are memoised on ``S`` (that changes no result, only the running time). Stage costs are
memoised too. The number of stage sequences grows like the ordered Bell numbers, so graphs above
``max_units`` (default 10) are refused with a :class:`SchedulerOptionError`.
"""
from __future__ import annotations

from typing import Iterator

from ..cost import CostModel
from ..graph import OpGraph
from ..schedule import CONCURRENT, MERGE, Stage
from .base import Scheduler
from .bitdag import bits
from .merge_legality import merge_key, merge_ok
from .options import SchedulerOptionError, flag, limit
from .result import SchedulerResult, SearchStats

DEFAULT_MAX_UNITS = 10


class ExhaustiveScheduler(Scheduler):
    name = "exhaustive"
    exact_blocks = True
    options = (limit("max_units", DEFAULT_MAX_UNITS, "refuse blocks with more units", unbounded=False),
               flag("merge", True, "also try merge stages"))

    def place(self, graph: OpGraph, cost: CostModel, *, max_units: int, merge: bool) -> SchedulerResult:
        n = len(graph)
        if n > max_units:
            raise SchedulerOptionError(
                f"exhaustive search is only for tiny graphs: {graph.name!r} (or this block of it) has {n} units, "
                f"the limit is max_units={max_units}; use the 'ios' scheduler, or cut blocks with max_block_size")
        return _best_sequence(graph, cost, merge)


def _best_sequence(graph: OpGraph, cost: CostModel, merge: bool) -> SchedulerResult:
    """The cheapest stage sequence of ``graph``, by trying every one (memoised on the remaining set)."""
    n = len(graph)
    stats = SearchStats()
    succ = graph.succ_masks()
    pred = graph.pred_masks()
    units = graph.units
    keys = [merge_key(u) for u in units]
    stage_memo: dict = {}

    def stage_cost(strategy: str, groups: tuple[tuple[int, ...], ...]) -> float:
        key = (strategy, groups)
        v = stage_memo.get(key)
        if v is None:
            v = cost.stage_latency([[units[i] for i in g] for g in groups], strategy)
            stage_memo[key] = v
            stats.stages_costed += 1
        return v

    memo: dict[int, tuple[float, tuple | None]] = {0: (0.0, None)}

    def solve(S: int) -> float:
        hit = memo.get(S)
        if hit is not None:
            return hit[0]
        best_v, best_stage = float("inf"), None
        E = S
        while E:  # every nonempty subset of S
            if all(succ[u] & S & ~E == 0 for u in bits(E)):  # nothing in E feeds the rest of S
                members = list(bits(E))
                rest = solve(S & ~E)
                for part in _set_partitions(members):
                    masks = [sum(1 << u for u in g) for g in part]
                    if any((succ[u] | pred[u]) & E & ~m for g, m in zip(part, masks) for u in g):
                        continue  # an edge between two groups
                    groups = tuple(sorted((tuple(sorted(g)) for g in part), key=lambda g: g[0]))
                    stats.transitions += 1
                    v = stage_cost(CONCURRENT, groups) + rest
                    if v < best_v:
                        best_v, best_stage = v, (CONCURRENT, groups)
                if merge and len(members) >= 2 and keys[members[0]] is not None \
                        and all(keys[u] == keys[members[0]] for u in members) \
                        and not any((succ[u] | pred[u]) & E for u in members) \
                        and merge_ok([units[u] for u in members]):
                    groups = tuple((u,) for u in members)
                    stats.transitions += 1
                    v = stage_cost(MERGE, groups) + rest
                    if v < best_v:
                        best_v, best_stage = v, (MERGE, groups)
            E = (E - 1) & S
        memo[S] = (best_v, best_stage)
        return best_v

    full = (1 << n) - 1
    solve(full)
    stats.states = len(memo) - 1
    stages: list[Stage] = []
    S = full
    while S:
        strategy, groups = memo[S][1]
        stages.append(Stage([[units[i].name for i in g] for g in groups], strategy))
        for g in groups:
            for i in g:
                S &= ~(1 << i)
    stages.reverse()
    return SchedulerResult(stages, stats)


def _set_partitions(items: list[int]) -> Iterator[list[list[int]]]:
    """Every partition of ``items`` into nonempty blocks (restricted growth strings)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _set_partitions(rest):
        yield [[first]] + part
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
