"""LIOS-style list scheduling: fast, whole-graph, one pass (well under a second for 1000 units).

1. Every unit gets its latency alone from the cost model (``unit_latency``); that is also its priority.
2. List scheduling over ``x`` streams (default 8): among the ready units (all producers placed) the longest
   goes first, onto the stream where it finishes earliest — it starts when that stream is free and its
   producers have finished (ties: the stream of its last-finishing producer, which needs no cross-stream
   wait, then the lowest stream).
3. The per-stream timeline becomes stages: walking the units in order of start time, each unit joins the
   current stage in its stream's group, unless it reads a unit of the current stage on another stream — then
   the current stage is closed (a barrier) and a new one begins. Groups are thus per-stream chains and never
   depend on each other, so the result is a valid stage list with at most ``x`` groups per stage.

The timeline assumes kernels on different streams do not slow each other down; the stage costs that the
driver reports come from the cost model, contention included.
"""
from __future__ import annotations

from ..cost import CostModel
from ..graph import OpGraph
from ..list_scheduling import list_schedule_stages
from .base import Scheduler
from .options import Option, check_limit
from .result import SchedulerResult, SearchStats

DEFAULT_STREAMS = 8


class LiosScheduler(Scheduler):
    """Options: ``x`` (streams, default 8), or its alias ``streams``; ``x`` wins when both are given."""

    name = "lios"
    whole_graph = True  # list scheduling looks across the whole graph; blocks would add barriers
    options = (Option("x", None, f"streams (default {DEFAULT_STREAMS})"),
               Option("streams", None, "alias of x"))

    def place(self, graph: OpGraph, cost: CostModel, *, x: int | None, streams: int | None) -> SchedulerResult:
        if x is None:
            x = streams if streams is not None else DEFAULT_STREAMS
        x = check_limit("x (streams)", x, allow_none=False)
        stats = SearchStats()
        stages = list_schedule_stages(graph, [cost.unit_latency(u) for u in graph.units], x, stats)
        stats.stages_costed += len(graph)
        return SchedulerResult(stages, stats)
