"""Bound the activation memory of a scheduled program relative to sequential execution.

Running branches at the same time keeps more tensors alive at once. ``max_memory_ratio`` (default 1.5) caps the
scheduled program's activation storage at that multiple of the sequential program's. When a schedule exceeds it,
we tighten it: stages with more than k groups are split into several stages of at most k groups (valid because the
groups of a stage are independent), halving k until the bound holds (k = 1 is a sequential order).
Dependency mode keeps every buffer alive for the whole run (no barrier proves a buffer dead), so when it exceeds
the bound the program falls back to stage mode first.

k = 1 is *a* sequential order, not the sequential program's: the schedule's stage order can keep tensors alive
longer (NASNet-A-mobile's lios schedule at one group per stage: 1.62x the sequential activation storage). When
even that exceeds the bound, the sequential order ships, which meets any bound >= 1 by definition: before,
the tightened schedule shipped over the bound, and without the concurrency it was chosen for. (The schedule keeps
its identity and options, so an AutoGraph schedule keeps its substitutions; its stages are the sequential ones.)
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from tvm_interop.runtime.plan import tensor_nbytes

from .lower import make_plan
from .schedule import CONCURRENT, Schedule, Stage
from .schedulers import schedule_graph

log = logging.getLogger(__name__)


@dataclass
class MemoryReport:
    scheduled_bytes: int
    sequential_bytes: int
    ratio: float
    limit: float | None
    max_groups: int          # groups per stage after tightening
    mode: str                # synchronisation mode after the check
    tightened: bool
    sequential_fallback: bool = False   # one group per stage still exceeded the bound: the sequential order

    def to_json(self) -> dict:
        return asdict(self)


def limit_concurrency(schedule: Schedule, k: int) -> Schedule:
    """A copy of ``schedule`` whose concurrent stages have at most ``k`` groups (longest groups first)."""
    stages: list[Stage] = []
    origin: list[int] = []   # the stage of ``schedule`` each new stage came from
    for si, st in enumerate(schedule.stages):
        if st.strategy != CONCURRENT or len(st.groups) <= k:
            stages.append(Stage([list(g) for g in st.groups], st.strategy))
            origin.append(si)
            continue
        groups = sorted(st.groups, key=len, reverse=True)
        for i in range(0, len(groups), k):
            stages.append(Stage([list(g) for g in groups[i:i + k]]))
            origin.append(si)
    d = schedule.to_json()
    out = Schedule.from_json(d)
    out.stages = stages
    out.predicted_latency = None
    out.options = dict(out.options, max_groups_per_stage=k)
    _restage_wave_choice(out, origin, f"the memory bound split stages to at most {k} groups")
    return out


def in_sequential_order(schedule: Schedule, sequential: Schedule) -> Schedule:
    """A copy of ``schedule`` (its scheduler, options and substitutions kept) whose stages are ``sequential``'s:
    one unit per stage, in the sequential program's order."""
    out = Schedule.from_json(schedule.to_json())
    out.stages = [Stage([list(g) for g in st.groups], st.strategy) for st in sequential.stages]
    out.predicted_latency = None
    out.options = dict(out.options, max_groups_per_stage=1, memory_fallback="sequential order")
    _restage_wave_choice(out, [None] * len(out.stages), "the memory bound's fallback to the sequential order")
    return out


def _restage_wave_choice(out: Schedule, origin: list, why: str) -> None:
    """Carry a wave-fusion choice (``options["wave_fusion"]``, stage indices) over to ``out``'s new stages.

    Why: the indices name stages of the schedule the bound rewrote. Left as they were, they named other stages
    of the rewritten one, and ``compile`` of a saved wave schedule that the bound fell back to sequential fused
    stages that no longer existed and stopped with "schedule was made for a different model". A stage split by
    the bound keeps its choice in every part that still has groups to fuse (a part of a fused stage is a stage
    of fewer independent groups; the cost model priced the whole); a stage that is gone is dropped, and the
    choice records what happened."""
    wf = out.options.get("wave_fusion")
    if not wf:
        return
    from .wave.apply import fusable_stages   # the wave pass's own test of a stage it can fuse

    chosen = set(wf.get("stages", []))
    stages = [i for i in fusable_stages(out) if origin[i] in chosen]
    out.options = dict(out.options, wave_fusion=dict(wf, stages=stages, restaged=(
        f"{why}: stages {sorted(chosen)} of the searched schedule -> {stages}")))


def bound_memory(program, schedule: Schedule, mode: str = "stage", max_memory_ratio: float | None = 1.5,
                 ) -> tuple[Schedule, str, MemoryReport]:
    """Return (schedule, mode, report) within the bound (or the original when there is no bound)."""
    seq = schedule_graph(program.graph, "sequential", "unit")
    seq_bytes = max(1, make_plan(program, seq).storage_bytes())

    def nbytes(s, m):
        plan = make_plan(program, s, mode=m)
        # dependency mode executors give every buffer its own storage
        if m == "stage":
            return plan.storage_bytes()
        return sum(tensor_nbytes(b["shape"], b["dtype"]) for b in plan.buffers)

    cur, cur_mode = schedule, mode
    used = nbytes(cur, cur_mode)
    tightened = fallback = False
    if max_memory_ratio is not None and used > max_memory_ratio * seq_bytes:
        if cur_mode == "dependency":
            log.warning("dependency mode needs %.2fx the sequential activation memory (limit %.2fx); using stage mode",
                        used / seq_bytes, max_memory_ratio)
            cur_mode = "stage"
            used = nbytes(cur, cur_mode)
            tightened = True
        k = cur.max_concurrency()
        while used > max_memory_ratio * seq_bytes and k > 1:
            k //= 2
            cur = limit_concurrency(schedule, max(1, k))
            cur.validate(program.graph)
            used = nbytes(cur, cur_mode)
            tightened = True
        fallback = used > max_memory_ratio * seq_bytes and cur.max_concurrency() <= 1 and used > seq_bytes
        if fallback:
            log.warning("memory bound %.2fx: one group per stage still needs %.2fx the sequential activation "
                        "storage in this schedule's order; shipping the sequential schedule",
                        max_memory_ratio, used / seq_bytes)
            cur = in_sequential_order(schedule, seq)
            cur.validate(program.graph)
            cur_mode, used, tightened = "stage", nbytes(cur, "stage"), True
        elif tightened:
            log.warning("memory bound %.2fx: schedule tightened to at most %d groups per stage (%.2fx sequential)",
                        max_memory_ratio, cur.max_concurrency(), used / seq_bytes)
    report = MemoryReport(int(used), int(seq_bytes), used / seq_bytes, max_memory_ratio, cur.max_concurrency(),
                          cur_mode, tightened, fallback)
    return cur, cur_mode, report


