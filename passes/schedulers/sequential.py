"""Baseline: one unit per stage in topological order: what a plain TVM build does."""
from __future__ import annotations

from ..cost import CostModel
from ..graph import OpGraph
from ..schedule import sequential_stages
from .base import Scheduler
from .result import SchedulerResult, SearchStats


class SequentialScheduler(Scheduler):
    """No options: the reference every other schedule is compared with (and the fallback the guards keep)."""

    name = "sequential"

    def place(self, graph: OpGraph, cost: CostModel) -> SchedulerResult:
        return SchedulerResult(sequential_stages(u.name for u in graph.units), SearchStats(states=len(graph)))
