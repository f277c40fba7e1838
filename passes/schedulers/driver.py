"""``schedule_graph``: from a model's OpGraph, a scheduler name and a cost spec to a costed, validated Schedule.

The one entry point the compile API, the CLI, the pipeline pass and the scripts use: it looks the scheduler up,
lets it schedule the model (:meth:`passes.schedulers.base.Scheduler.schedule`: options checked, blocks, stats),
records the graph fingerprint, device and options in the ``Schedule``, costs every stage and validates the result
against the graph, so a schedule that leaves here is complete and safe to lower.
"""
from __future__ import annotations

import logging

from ..contract import DEFAULT_GRANULARITY
from ..cost import CostModel, get_cost_model
from ..graph import OpGraph
from ..schedule import Schedule
from .latency import annotate_latency
from .registry import get_scheduler

log = logging.getLogger(__name__)


def schedule_graph(
    graph: OpGraph,
    scheduler: str = "greedy",
    cost: "CostModel | str | None" = None,
    max_block_size: int | None = None,
    model_name: str = "",
    unit_granularity: str = DEFAULT_GRANULARITY,
    batch: int | None = None,
    memo=None,
    **options,
) -> Schedule:
    """Schedule a whole model with the scheduler named ``scheduler`` and its ``options``.

    ``cost`` is a cost model or a spec (``"sim:h100"``; default the unit cost model); ``max_block_size`` cuts
    blocks larger than that (per-block schedulers only);
    ``unit_granularity`` is what the search schedules (``"chain"``: single-consumer chains of kernels as one unit,
    the default; ``"kernel"``: every kernel), and ``max_frontier`` / ``max_block_states`` shape the blocks of an
    exact search (see :meth:`passes.schedulers.base.Scheduler.schedule`); the blocks are recorded in
    ``Schedule.search["blocks"]``. ``memo`` (``passes.schedulers.block_memo.BlockMemo``) reuses the schedules of
    blocks seen before in related graphs (autograph's candidates). An option the scheduler does not declare is an
    ``InteropError`` (``SchedulerOptionError``) listing the options it has.
    """
    sched = get_scheduler(scheduler)
    cost_model = get_cost_model(cost)
    check_graph = getattr(cost_model, "check_graph", None)   # a measured table must be this model's
    if check_graph is not None:
        check_graph(graph, model_name)
    result = sched.schedule(graph, cost_model, max_block_size=max_block_size, unit_granularity=unit_granularity,
                            memo=memo, **options)
    search = result.stats.to_json()
    search["blocks"] = result.blocks
    search["schedule_units"] = sum(b["units"] for b in result.blocks)
    schedule = Schedule(
        stages=result.stages,
        graph_fingerprint=graph.fingerprint(),
        model_name=model_name or graph.name,
        scheduler=scheduler,
        device=cost_model.device_fingerprint,
        batch=batch,
        options={"unit_granularity": sched.granularity(unit_granularity),
                 **{k: v for k, v in options.items() if isinstance(v, (int, float, str, bool))}},
        search=search,
        unit_devices=dict(result.unit_devices or {}),
        units=[{"name": u.name, "kind": u.kind, "func": u.func_name} for u in graph.units],
    )
    annotate_latency(schedule, graph, cost_model)
    report = getattr(cost_model, "composed_report", None)
    if report is not None and report():
        log.warning("%s", report())
        schedule.search["cost_note"] = report()
    schedule.validate(graph)
    return schedule
