"""Memoised stage costs and the lower bounds the searches prune with (:class:`StageCoster`).

The IOS DP asks for the same stage many times (an ending is reached from many states) and prunes with bounds
that must never exceed the real cost; both live here so the DP itself only decides which stages to try.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from ..cost import CostModel
from ..schedule import CONCURRENT, MERGE, Stage
from .bitdag import LocalDAG, bits
from .merge_legality import merge_ok
from .result import SearchStats

INF = float("inf")


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

    def to_stage(self, kind: str, groups: Sequence[int]) -> Stage:
        """A stage of unit names from group masks (a merge stage: one group per unit)."""
        if kind == MERGE:
            return Stage([[self.dag.units[i].name] for i in bits(sum(groups))], MERGE)
        return Stage([self.dag.names(g) for g in groups], CONCURRENT)

    def stages(self, choices: Sequence[tuple[str, tuple[int, ...]]]) -> list[Stage]:
        """The stages of a DP answer (``(strategy, group masks)`` per stage)."""
        return [self.to_stage(kind, groups) for kind, groups in choices]
