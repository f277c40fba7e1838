"""Baseline: one unit per stage in topological order: what a plain TVM build does."""
from __future__ import annotations

from ..cost import CostModel
from ..graph import OpGraph
from ..schedule import Stage, sequential_stages
from .base import SearchStats, register_scheduler


@register_scheduler("sequential")
def sequential(graph: OpGraph, cost: CostModel, **_options) -> tuple[list[Stage], SearchStats]:
    return sequential_stages(u.name for u in graph.units), SearchStats(states=len(graph))
