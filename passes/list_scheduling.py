"""List scheduling on a per-stream timeline, and cutting that timeline into barrier stages.

The algorithm of the ``lios`` scheduler (see :mod:`passes.schedulers.lios` for the policy), kept below the
schedulers and cost models because both use it: ``ios`` compares its DP with list schedules, and the learned
cost model (``passes.cost.learned``) seeds its training set with the stages of list schedules. It needs only
the graph and the units' latencies. ``stats``, when given, is any object with ``states`` and ``transitions``
counters (a ``SearchStats``).
"""
from __future__ import annotations

import heapq

from .graph import OpGraph
from .schedule import Stage


def list_schedule(graph: OpGraph, lat: list[float], x: int,
                  stats=None) -> tuple[list[int], list[float], list[float]]:
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


def list_schedule_stages(graph: OpGraph, lat: list[float], x: int,
                         stats=None) -> list[Stage]:
    """The stages of the longest-first list schedule on ``x`` streams, given each unit's latency ``lat``."""
    stream_of, start, finish = list_schedule(graph, lat, x, stats)
    return timeline_to_stages(graph, stream_of, start, finish)
