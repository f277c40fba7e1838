"""Which stages to fuse: those where the cost model prices the fused kernel below the stage as scheduled.

Why per stage and by the cost model: a fused stage saves the thread hand-offs (CPU) or launches and fork/join
events (GPU) of its groups, but puts a barrier after every wave, so a stage of unequal chains can lose. The
scheduler's own cost model prices both forms (``strategy="wave"``, see ``passes.cost``); a model that cannot
price a fused stage (a cost table measured without fused stages) leaves it unfused, and says so.

A cost model that times stages on this machine (``measured``) times the fused stage, the stage as scheduled and
its groups one after another *together* (``wave_comparison``: interleaved repeats), and a stage is fused when it
beats both unfused forms: the as-scheduled timing came from the search, minutes earlier, on a host whose speed
moves by up to 2x between minutes, and on a CPU the program may run the unfused groups in order
(``passes.in_order``), so that is the form the fused stage has to beat there.
"""
from __future__ import annotations

import logging

from tvm_interop.runtime.errors import InteropError

from ..in_order import IN_ORDER_OPTION
from ..schedule import Schedule
from .apply import fusable_stages
from .lowered import NotFusable

log = logging.getLogger(__name__)


def choose_wave_stages(graph, schedule: Schedule, cost) -> Schedule:
    """``schedule`` with ``options["wave_fusion"]`` naming the stages to fuse and why, and its predicted
    latency lowered by what the fused stages save (a copy of nothing: the schedule is updated in place)."""
    decisions, chosen, saved = [], [], 0.0
    for si in fusable_stages(schedule):
        st = schedule.stages[si]
        groups = [[graph.unit(u) for u in g] for g in st.groups]
        entry = {"stage": si}
        try:
            fused, plain, in_order = _price(cost, groups, st.strategy)
        except (InteropError, NotFusable, NotImplementedError) as why:
            entry["reason"] = f"not priced: {why}"
            decisions.append(entry)
            continue
        entry.update(fused_s=fused, scheduled_s=plain)
        rival, rival_name = plain, "as scheduled"
        if in_order is not None:
            entry.update(in_order_s=in_order, paired=True)
            if in_order < plain:
                rival, rival_name = in_order, "in order"
        if fused < rival:
            chosen.append(si)
            # against the stage's price in the schedule's total (the paired timings are another measurement)
            saved += max(0.0, (st.predicted_latency if st.predicted_latency is not None else plain) - fused)
            entry["reason"] = f"fused {fused * 1e6:.1f} us < {rival * 1e6:.1f} us {rival_name}"
        else:
            entry["reason"] = f"fused {fused * 1e6:.1f} us >= {rival * 1e6:.1f} us {rival_name}"
        decisions.append(entry)
    schedule.options["wave_fusion"] = {"stages": chosen, "decisions": decisions,
                                       "cost": getattr(cost, "name", type(cost).__name__)}
    _left_in_order(schedule, decisions, chosen)
    if schedule.predicted_latency is not None and chosen:
        schedule.search["predicted_before_wave_fusion"] = schedule.predicted_latency
        schedule.predicted_latency = max(0.0, schedule.predicted_latency - saved)
    log.info("wave fusion: %d of %d fusable stage(s) priced faster fused under %s", len(chosen),
             len(decisions), schedule.options["wave_fusion"]["cost"])
    return schedule


def _left_in_order(schedule: Schedule, decisions: list[dict], chosen: list[int]) -> None:
    """Run the stages left unfused one group after another (``passes.in_order``) when every one of them was timed
    no faster as scheduled than in order: then the build is a plan without concurrent groups, which the VM runs.

    Why here and not only in the never-slower guard: one concurrent stage left in a CPU program puts the whole
    program on the worker-thread executor, which dispatches every kernel of every stage from Python. A stage's
    paired timing cannot see that cost, so the choice between fusing it and running it in order was priced right
    while the program around it was not: Inception-v3's lios + wave with one of its 15 fusable stages left
    unfused (its fused and in-order timings 1 % apart) ran 0.95x and 1.01x of sequential on the workers, the same
    schedule with that stage's groups in order, on the VM, 1.03-1.10x in four runs; in one process the VM took
    0.93x / 0.97x the workers' time (``docs/bench_cpu_left_in_order_2026-11-30.md``, guard off). Only
    paired timings say which is faster (a local measured cost model); a stage without them (a cost table, a
    stage that could not be fused) leaves the choice to the guard, which times the whole program both ways."""
    left = [d for d in decisions if d["stage"] not in chosen]
    if not left or any(not d.get("paired") or d["in_order_s"] > d["scheduled_s"] for d in left):
        return
    schedule.options[IN_ORDER_OPTION] = True
    schedule.options["wave_fusion"]["in_order"] = (
        f"{len(left)} stage(s) left unfused run their groups in order: each timed no faster on worker threads "
        f"(stages {[d['stage'] for d in left]})")


def _price(cost, groups, strategy: str) -> tuple[float, float, float | None]:
    """(fused, as scheduled, groups in order or None): the three timed together where the cost model can
    (``wave_comparison`` with a local timer), else two separate prices."""
    paired = getattr(cost, "wave_comparison", None)
    if callable(paired):
        v = paired(groups, strategy)
        return v["wave"], v[strategy], v.get("in_order")
    return cost.stage_latency(groups, "wave"), cost.stage_latency(groups, strategy), None


def wave_stages(schedule: Schedule) -> list[int] | None:
    """The stages :func:`choose_wave_stages` chose, or None when wave fusion was not asked for."""
    wf = schedule.options.get("wave_fusion")
    return None if not wf else list(wf.get("stages", []))
