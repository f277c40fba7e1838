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

import heapq
import time

from ..cost import CostModel
from ..graph import OpGraph
from ..schedule import Stage
from ._util import check_limit
from .base import SearchStats, register_scheduler

DEFAULT_STREAMS = 8


@register_scheduler("lios", per_block=False)
def lios(graph: OpGraph, cost: CostModel, x: int | None = None, streams: int | None = None,
         **_options) -> tuple[list[Stage], SearchStats]:
    if x is None:
        x = streams if streams is not None else DEFAULT_STREAMS
    x = check_limit("x (streams)", x, allow_none=False)
    t0 = time.perf_counter()
    stats = SearchStats()
    stream_of, start, finish = list_schedule(graph, [cost.unit_latency(u) for u in graph.units], x, stats)
    stats.stages_costed += len(graph)
    stages = timeline_to_stages(graph, stream_of, start, finish)
    stats.seconds = time.perf_counter() - t0
    return stages, stats


def list_schedule(graph: OpGraph, lat: list[float], x: int,
                  stats: SearchStats | None = None) -> tuple[list[int], list[float], list[float]]:
    """(stream, start, finish) of every unit under longest-first list scheduling on ``x`` streams."""
    n = len(graph)
    indeg = [len(p) for p in graph.preds]
    ready = [(-lat[i], i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(ready)
    free = [0.0] * x
    stream_of = [-1] * n
    start = [0.0] * n
    finish = [0.0] * n
    while ready:
        _, u = heapq.heappop(ready)
        est = 0.0
        pref = -1  # the stream of the producer that finishes last
        for p in graph.preds[u]:
            if finish[p] >= est:
                est = finish[p]
                pref = stream_of[p]
        best_k, best_t = -1, 0.0
        for k in range(x):
            t = free[k] if free[k] > est else est
            if best_k < 0 or t < best_t or (t == best_t and k == pref):
                best_k, best_t = k, t
        if stats is not None:
            stats.states += 1
            stats.transitions += x
        stream_of[u] = best_k
        start[u] = best_t
        finish[u] = best_t + lat[u]
        free[best_k] = finish[u]
        for v in graph.succs[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(ready, (-lat[v], v))
    return stream_of, start, finish


def timeline_to_stages(graph: OpGraph, stream_of: list[int], start: list[float],
                       finish: list[float]) -> list[Stage]:
    """Cut a per-stream timeline into barrier stages whose groups are per-stream chains (see module doc)."""
    order = sorted(range(len(graph)), key=lambda u: (start[u], finish[u], u))
    stages: list[Stage] = []
    groups: dict[int, list[str]] = {}
    members: set[int] = set()
    for u in order:
        k = stream_of[u]
        if any(p in members and stream_of[p] != k for p in graph.preds[u]):
            stages.append(Stage([g for _, g in sorted(groups.items(), key=lambda kv: kv[0])]))
            groups, members = {}, set()
        groups.setdefault(k, []).append(graph.units[u].name)
        members.add(u)
    if groups:
        stages.append(Stage([g for _, g in sorted(groups.items(), key=lambda kv: kv[0])]))
    return stages
