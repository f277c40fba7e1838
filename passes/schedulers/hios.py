"""HIOS-style multi-device scheduling (Xu et al.): longest-path mapping of units to ``M`` devices, then
sliding-window grouping per device into stages. Whole-graph scheduler; returns the unit -> device map too.

1. Mapping. Repeatedly take the longest path (by unit latency alone) among the units not yet mapped and put
   all of it on one device: the one on which the units mapped so far finish first, estimated by running each
   device's units one at a time in topological order, a unit waiting for its producers and, from another
   device, for the transfer of their outputs (``bytes / link_bandwidth + link_latency``). The critical path
   goes first and stays on one device without transfers; the next-longest paths go where they overlap best.
2. Stages (sliding window, ``w`` units, default 4). While units remain, build one stage: for each device take
   the next ``w`` unscheduled units of that device (topological order), keep those whose producers are done
   (or are kept units of the same device), run the exact IOS dynamic program on them
   (:func:`~passes.schedulers.ios_dp.ending_dp`, at most ``s`` groups) and take the first stage of its best
   sequence; the stage is the union of these per-device stages. The window then slides. (The globally first
   unscheduled unit is always ready, so every stage makes progress.)

A stage's groups may be on different devices; they run in parallel and the stage ends when the slowest
device does, each device first receiving the tensors it reads from other devices
(:func:`~passes.schedulers.latency.multi_device_stage_latency`, which the driver uses for the predicted latency
of a schedule with a device map). Merge stages are not used (a stage cannot be merged on one device and
concurrent on another).

3. Guard (``guard=True``): the same windows on one device are costed too, and the one-device schedule (every
   unit on device 0) is returned when it is predicted faster — at batch 1 the transfers and the barriers
   between devices usually cost more than a second GPU gains.

Options: ``devices`` (M, default 2), ``w`` (default 4), ``s`` (groups per stage and device, default 8),
``link_bandwidth`` (bytes/s, default 300e9, NVLink-class), ``link_latency`` (seconds, default 5e-6), ``guard``.
"""
from __future__ import annotations

from ..cost import CostModel
from ..graph import OpGraph
from ..schedule import Stage
from .base import Scheduler
from .bitdag import LocalDAG, ideals
from .ios_dp import ending_dp
from .latency import DEFAULT_LINK_BANDWIDTH, DEFAULT_LINK_LATENCY, multi_device_stage_latency, schedule_cost
from .options import flag, limit, non_negative, positive
from .result import SchedulerResult, SearchStats
from .stage_coster import StageCoster

DEFAULT_DEVICES = 2
DEFAULT_WINDOW = 4


class HiosScheduler(Scheduler):
    name = "hios"
    whole_graph = True  # the device mapping follows the longest paths through the whole graph
    options = (
        limit("devices", DEFAULT_DEVICES, "number of devices M", unbounded=False),
        limit("w", DEFAULT_WINDOW, "window: units per device considered for each stage", unbounded=False),
        positive("link_bandwidth", DEFAULT_LINK_BANDWIDTH, "bytes/s between two devices"),
        non_negative("link_latency", DEFAULT_LINK_LATENCY, "seconds per transfer"),
        limit("s", 8, "at most this many groups per stage and device (None: unbounded)"),
        flag("guard", True, "keep the one-device schedule when it is predicted faster"),
    )

    def place(self, graph: OpGraph, cost: CostModel, *, devices: int, w: int, link_bandwidth: float,
              link_latency: float, s: int | None, guard: bool) -> SchedulerResult:
        M = devices
        stats = SearchStats()
        lat = [cost.unit_latency(u) for u in graph.units]
        dev = map_devices(graph, lat, M, link_bandwidth, link_latency)
        stages = window_stages(graph, cost, dev, M, w, s, stats)
        devmap = {u.name: dev[i] for i, u in enumerate(graph.units)}
        if M > 1 and guard and len(set(dev)) > 1:
            # spreading over devices pays only when the parallelism gained outweighs the transfers and the
            # barriers between devices: keep the one-device schedule when it is predicted faster
            multi = sum(multi_device_stage_latency(cost, graph, st, devmap, link_bandwidth, link_latency)
                        for st in stages)
            one_dev = [0] * len(graph)
            one = window_stages(graph, cost, one_dev, 1, w, s, stats)
            if schedule_cost(one, graph, cost) < multi:
                stages, devmap = one, {u.name: 0 for u in graph.units}
        return SchedulerResult(stages, stats, unit_devices=devmap)


def map_devices(graph: OpGraph, lat: list[float], M: int, link_bandwidth: float, link_latency: float) -> list[int]:
    """Longest-path-first mapping of units to ``M`` devices (see module docstring)."""
    n = len(graph)
    if M == 1:
        return [0] * n
    xfer = [sum(t.nbytes for t in u.outputs) / link_bandwidth + link_latency for u in graph.units]
    dev = [-1] * n
    dist = [0.0] * n
    back = [-1] * n
    left = n
    while left:
        # the longest path among the units not mapped yet
        best_end, best_d = -1, -1.0
        for i in range(n):
            if dev[i] >= 0:
                continue
            d, b = 0.0, -1
            for p in graph.preds[i]:
                if dev[p] < 0 and dist[p] > d:
                    d, b = dist[p], p
            dist[i] = d + lat[i]
            back[i] = b
            if dist[i] > best_d:
                best_end, best_d = i, dist[i]
        path = []
        i = best_end
        while i >= 0:
            path.append(i)
            i = back[i]
        # the device on which the mapped part of the graph finishes first
        best_dev, best_t = 0, float("inf")
        for d in range(M):
            for i in path:
                dev[i] = d
            t = _makespan(graph, lat, xfer, dev, M)
            if t < best_t - 1e-15:
                best_dev, best_t = d, t
        for i in path:
            dev[i] = best_dev
        left -= len(path)
    return dev


def _makespan(graph: OpGraph, lat: list[float], xfer: list[float], dev: list[int], M: int) -> float:
    """Finish time of the mapped units, each device running its units one at a time in topological order and
    waiting for the tensors of other devices (a cheap stand-in for the schedule, used to compare mappings)."""
    free = [0.0] * M
    finish = [0.0] * len(graph)
    end = 0.0
    for i, d in enumerate(dev):
        if d < 0:
            continue
        t = free[d]
        for p in graph.preds[i]:
            dp = dev[p]
            if dp < 0:
                continue
            ready = finish[p] + (xfer[p] if dp != d else 0.0)
            if ready > t:
                t = ready
        t += lat[i]
        finish[i] = free[d] = t
        if t > end:
            end = t
    return end


def window_stages(graph: OpGraph, cost: CostModel, dev: list[int], M: int, w: int, s: int | None,
                  stats: SearchStats) -> list[Stage]:
    """Sliding-window grouping per device into global stages (see module docstring)."""
    n = len(graph)
    order = [[i for i in range(n) if dev[i] == d] for d in range(M)]
    head = [0] * M  # order[d][:head[d]] are all done
    done = [False] * n
    left = n
    stages: list[Stage] = []
    while left:
        groups: list[list[str]] = []
        finished: list[int] = []
        for d in range(M):
            od = order[d]
            while head[d] < len(od) and done[od[head[d]]]:
                head[d] += 1
            window: list[int] = []
            taken: set[int] = set()
            k = head[d]
            seen = 0
            while k < len(od) and seen < w:
                u = od[k]
                k += 1
                if done[u]:
                    continue
                seen += 1
                if all(done[p] or p in taken for p in graph.preds[u]):
                    window.append(u)
                    taken.add(u)
            if not window:
                continue
            dag = LocalDAG(graph, window)
            coster = StageCoster(cost, dag, stats)
            _, choices = ending_dp(dag, coster, stats, None, s, merge=False, states=ideals(dag),
                                   group_enum_limit=None)
            _, first = choices[0]
            for g in first:
                names = dag.names(g)
                groups.append(names)
                finished.extend(graph.index[nm] for nm in names)
        for i in finished:
            done[i] = True
        left -= len(finished)
        stages.append(Stage(groups))
    return stages
