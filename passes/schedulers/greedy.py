"""Baseline: every ready unit in one stage (capped at ``max_streams`` groups), like wavefront execution.

When more units are ready than streams, the extra units are chained behind others in the same group (longest
first onto the least-loaded group), so the cap never splits the wavefront into more stages than needed.
"""
from __future__ import annotations

from ..cost import CostModel
from ..graph import OpGraph
from ..schedule import Stage
from .base import Scheduler
from .options import limit
from .result import SchedulerResult, SearchStats

DEFAULT_STREAMS = 8


class GreedyScheduler(Scheduler):
    name = "greedy"
    options = (limit("max_streams", DEFAULT_STREAMS, "at most this many groups per stage", unbounded=False),)

    def place(self, graph: OpGraph, cost: CostModel, *, max_streams: int) -> SchedulerResult:
        stats = SearchStats()
        return SchedulerResult(wavefront_stages(graph, cost, max_streams, stats), stats)


def wavefront_stages(graph: OpGraph, cost: CostModel, max_streams: int,
                     stats: SearchStats | None = None) -> list[Stage]:
    """One stage per wavefront of ready units, at most ``max_streams`` groups each (see module docstring).

    Also one of the alternatives ``ios``'s guard compares with, hence a function of its own.
    """
    stats = stats if stats is not None else SearchStats()
    n = len(graph)
    indeg = [len(p) for p in graph.preds]
    ready = [i for i in range(n) if indeg[i] == 0]
    stages: list[Stage] = []
    while ready:
        lat = {i: cost.unit_latency(graph.units[i]) for i in ready}
        stats.stages_costed += len(ready)
        groups: list[list[int]] = []
        load: list[float] = []
        for i in sorted(ready, key=lambda i: (-lat[i], i)):
            if len(groups) < max_streams:
                groups.append([i])
                load.append(lat[i])
            else:
                k = min(range(len(groups)), key=lambda k: load[k])
                groups[k].append(i)
                load[k] += lat[i]
        stages.append(Stage([[graph.units[i].name for i in sorted(g)] for g in groups]))
        stats.states += 1
        nxt = []
        for i in ready:
            for j in graph.succs[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    nxt.append(j)
        ready = sorted(nxt)
    return stages
