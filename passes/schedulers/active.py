"""Search with a learned cost model, measuring what the search picks (active learning).

A learned model (``passes.cost.learned``) predicts stages it has not measured. A search over predictions can
be fooled where the model is wrong, and is wrong most where it has seen nothing like the stage — exactly the
stages an optimistic prediction makes attractive. So after each search the chosen schedule's unmeasured
stages are measured, added to the training set, the model refit, and the search rerun. It stops when a
schedule's stages were all measured already (the search's answer is then costed by measurements alone) or
after ``rounds`` searches; the schedule with the lowest *measured* total ships. Each round is recorded in
``schedule.search["active_rounds"]``: predicted and measured totals of the pick, stages newly measured.
"""
from __future__ import annotations

import logging
import time

from ..graph import OpGraph
from ..schedule import Schedule
from .driver import schedule_graph
from .latency import annotate_latency

log = logging.getLogger(__name__)


def active_search(graph: OpGraph, scheduler: str, model, rounds: int = 4, **schedule_kwargs) -> Schedule:
    """Run ``scheduler`` with the learned ``model`` up to ``rounds`` times, measuring each pick (see module)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    t0 = time.perf_counter()
    before = model.measured_stages
    model.ensure_seeded()
    seeded = model.measured_stages - before
    history = []
    best: Schedule | None = None
    totals = {"states": 0, "transitions": 0, "stages_costed": 0}
    for r in range(rounds):
        sched = schedule_graph(graph, scheduler, model, **schedule_kwargs)
        for k in totals:
            totals[k] += int(sched.search.get(k, 0))
        predicted = sched.predicted_latency
        new = 0
        for st in sched.stages:
            groups = [[graph.unit(n) for n in g] for g in st.groups]
            if not model.is_measured(groups, st.strategy):
                model.measure(groups)
                new += 1
        annotate_latency(sched, graph, model)  # every stage of the pick is a measurement now
        history.append({"round": r + 1, "predicted_ms": predicted * 1e3, "measured_ms": sched.predicted_latency * 1e3,
                        "new_stages_measured": new, "stages": sched.num_stages,
                        "cv_error": model.cv_error})
        log.info("learned search round %d: predicted %.3f ms, measured %.3f ms, %d new stages measured",
                 r + 1, predicted * 1e3, sched.predicted_latency * 1e3, new)
        if best is None or sched.predicted_latency < best.predicted_latency:
            best = sched
        if new == 0:
            break
    assert best is not None
    best.search.update(totals)
    best.search.update(seconds=time.perf_counter() - t0, active_rounds=history, seed_stages_measured=seeded)
    return best
