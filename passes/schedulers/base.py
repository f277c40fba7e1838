"""What every scheduler returns, and the per-block driver they share.

A scheduler is a function ``(graph, cost, **options) -> (stages, SearchStats)`` registered under a name. The
driver ``schedule_graph`` cuts the model into blocks (``passes.partition``), runs the scheduler on each block's
sub-DAG, concatenates the stages and wraps them in a ``Schedule`` that records the graph fingerprint.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Protocol

from runtime.errors import InteropError

from ..cost import CostModel, get_cost_model
from ..graph import OpGraph
from ..schedule import Schedule, Stage


@dataclass
class SearchStats:
    """Search effort: DP states, transitions tried, distinct stages costed, wall seconds."""

    states: int = 0
    transitions: int = 0
    stages_costed: int = 0
    seconds: float = 0.0

    def add(self, other: "SearchStats") -> None:
        self.states += other.states
        self.transitions += other.transitions
        self.stages_costed += other.stages_costed
        self.seconds += other.seconds

    def to_json(self) -> dict:
        return asdict(self)


class SchedulerFn(Protocol):
    def __call__(self, graph: OpGraph, cost: CostModel, **options) -> tuple[list[Stage], SearchStats]: ...


_SCHEDULERS: dict[str, SchedulerFn] = {}
_NEEDS_BLOCKS: dict[str, bool] = {}


def register_scheduler(name: str, per_block: bool = True) -> Callable[[SchedulerFn], SchedulerFn]:
    """Decorator. ``per_block=False`` for schedulers that must see the whole graph (hios, lios)."""

    def deco(fn: SchedulerFn) -> SchedulerFn:
        _SCHEDULERS[name] = fn
        _NEEDS_BLOCKS[name] = per_block
        return fn

    return deco


def available_schedulers() -> list[str]:
    _load_builtin()
    return sorted(_SCHEDULERS)


def get_scheduler(name: str) -> SchedulerFn:
    _load_builtin()
    if name not in _SCHEDULERS:
        raise InteropError(f"unknown scheduler {name!r}; available: {', '.join(sorted(_SCHEDULERS))}")
    return _SCHEDULERS[name]


def _load_builtin() -> None:
    import importlib

    for mod in ("sequential", "greedy", "ios", "lios", "hios", "exhaustive"):
        try:
            importlib.import_module(f"{__package__}.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{mod}":
                raise


def schedule_graph(
    graph: OpGraph,
    scheduler: str = "greedy",
    cost: "CostModel | str | None" = None,
    max_block_size: int | None = None,
    model_name: str = "",
    batch: int | None = None,
    **options,
) -> Schedule:
    """Schedule a whole model: per block (unless the scheduler wants the whole graph), then concatenate."""
    from ..partition import partition

    fn = get_scheduler(scheduler)
    cost_model = get_cost_model(cost)
    t0 = time.perf_counter()
    stats = SearchStats()
    stages: list[Stage] = []
    unit_devices: dict[str, int] = {}
    if _NEEDS_BLOCKS[scheduler]:
        blocks = partition(graph, max_block_size=max_block_size)
        parts = [graph.subgraph(b, name=f"{graph.name}/block{i}") for i, b in enumerate(blocks)]
    else:
        parts = [graph]
    for part in parts:
        result = fn(part, cost_model, **options)
        block_stages, block_stats = result[0], result[1]
        if len(result) > 2:  # hios also returns the device of each unit
            unit_devices.update(result[2])
        stages.extend(block_stages)
        stats.add(block_stats)
    stats.seconds = time.perf_counter() - t0
    schedule = Schedule(
        stages=stages,
        graph_fingerprint=graph.fingerprint(),
        model_name=model_name or graph.name,
        scheduler=scheduler,
        device=cost_model.device_fingerprint,
        batch=batch,
        options={k: v for k, v in options.items() if isinstance(v, (int, float, str, bool))},
        search=stats.to_json(),
        unit_devices=unit_devices,
        units=[{"name": u.name, "kind": u.kind, "func": u.func_name} for u in graph.units],
    )
    annotate_latency(schedule, graph, cost_model)
    schedule.validate(graph)
    return schedule


def annotate_latency(schedule: Schedule, graph: OpGraph, cost: CostModel) -> None:
    """Fill predicted stage and total latencies, and the sequential baseline, from ``cost``.

    A schedule whose units are spread over several devices (hios) is costed per device, with transfers
    (``passes.schedulers._util.multi_device_stage_latency``).
    """
    multi = len(set(schedule.unit_devices.values())) > 1
    if multi:
        from ._util import DEFAULT_LINK_BANDWIDTH, DEFAULT_LINK_LATENCY, multi_device_stage_latency

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
