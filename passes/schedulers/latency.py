"""How stage latencies compose into a schedule's latency: on one device, and across devices with transfers.

The searches compare candidate schedules with :func:`schedule_cost`; the driver records the predicted latency of
the schedule it ships with :func:`annotate_latency`. A schedule whose units are spread over several devices
(``hios``) is costed per device, each device first receiving the tensors it reads from the others
(:func:`multi_device_stage_latency`), so that both agree on what a multi-device stage costs.
"""
from __future__ import annotations

from typing import Sequence

from ..cost import CostModel
from ..graph import OpGraph
from ..schedule import Schedule, Stage
from .result import SearchStats

# hios's defaults, and what a schedule with a device map is costed with when its options do not say
DEFAULT_LINK_BANDWIDTH = 300e9   # bytes/s, NVLink-class
DEFAULT_LINK_LATENCY = 5e-6      # seconds per transfer


def schedule_cost(stages: Sequence[Stage], graph: OpGraph, cost: CostModel,
                  stats: SearchStats | None = None) -> float:
    """Predicted latency of ``stages`` on one device: the sum of their stage latencies (a barrier after each).
    Each stage costed is counted in ``stats.stages_costed``."""
    total = 0.0
    for st in stages:
        total += cost.stage_latency([[graph.unit(n) for n in g] for g in st.groups], st.strategy)
        if stats is not None:
            stats.stages_costed += 1
    return total


def multi_device_stage_latency(cost: CostModel, graph: OpGraph, stage: Stage, unit_devices: dict[str, int],
                               link_bandwidth: float = DEFAULT_LINK_BANDWIDTH,
                               link_latency: float = DEFAULT_LINK_LATENCY) -> float:
    """Latency of one stage whose groups run on several devices (hios schedules).

    Each device runs its groups as one stage of its own (``cost.stage_latency``), after receiving the inputs
    its units read from units on other devices (earlier stages): one transfer per producer and device,
    ``bytes / link_bandwidth + link_latency``, serialised on the device's link. The stage ends when the last
    device does.
    """
    per_dev: dict[int, list[list[str]]] = {}
    for g in stage.groups:
        per_dev.setdefault(unit_devices.get(g[0], 0), []).append(g)
    worst = 0.0
    for dev, groups in per_dev.items():
        producers: set[str] = set()
        for g in groups:
            for name in g:
                for p in graph.pred_names(name):
                    if unit_devices.get(p, 0) != dev:
                        producers.add(p)
        transfer = sum(sum(t.nbytes for t in graph.unit(p).outputs) / link_bandwidth + link_latency
                       for p in producers)
        t = transfer + cost.stage_latency([[graph.unit(n) for n in g] for g in groups], stage.strategy)
        worst = max(worst, t)
    return worst


def annotate_latency(schedule: Schedule, graph: OpGraph, cost: CostModel) -> None:
    """Fill predicted stage and total latencies, and the sequential baseline, from ``cost``.

    A schedule whose units are spread over several devices (hios) is costed per device, with transfers
    (:func:`multi_device_stage_latency`) over the link given by its options ``link_bandwidth`` and
    ``link_latency``.
    """
    multi = len(set(schedule.unit_devices.values())) > 1
    if multi:
        link_bw = float(schedule.options.get("link_bandwidth", DEFAULT_LINK_BANDWIDTH))
        link_lat = float(schedule.options.get("link_latency", DEFAULT_LINK_LATENCY))
    total = 0.0
    for s in schedule.stages:
        if multi:
            lat = multi_device_stage_latency(cost, graph, s, schedule.unit_devices, link_bw, link_lat)
        else:
            lat = cost.stage_latency([[graph.unit(n) for n in g] for g in s.groups], s.strategy)
        s.predicted_latency = lat
        total += lat
    schedule.predicted_latency = total
    schedule.sequential_latency = cost.sequential_latency(graph.units)
