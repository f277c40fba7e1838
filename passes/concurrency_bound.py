"""How much inter-operator concurrency can give a model on this CPU, from its kernels' own times.

Why: on a CPU every kernel of the sequential program already runs its parallel loop over all cores, so a
schedule can only win what those kernels leave idle: the cores a kernel does not keep busy (its parallel
efficiency ``T1 / (n * Tn)`` below 1) and nothing else. With each kernel timed in the program once on one thread
(``T1``) and once on all ``n`` (``Tn``), two numbers bound what any inter-operator schedule of the same kernels
can reach, whichever scheduler or fusion produced it, and a third estimates it:

- the **critical path**, every kernel at the faster of its two times (no schedule runs a chain faster),
- the **work bound** ``sum(min(T1, n * Tn)) / n`` (the core time the kernels need, spread perfectly),
- an **idealised list schedule** (:func:`list_schedule`): every kernel on one core or on all of them, no
  hand-off, no launch, no interference between kernels that share caches and memory: a generous estimate of
  what a good schedule reaches, where the two bounds above are loose.

Inception-v3 on a quiet 2-core EPYC (``docs/concurrency_bound_2026-11-30.md``): its kernels keep both cores
busy (median efficiency 0.86), its stem is one chain, and the idealised schedule comes to 1.08-1.10x of
sequential; RandWire runs 85 of its 276 kernels on one core and the same estimate is 1.52-1.55x. The fused
programs (lios + wave) measured 1.03-1.05x and 1.19-1.25x.
"""
from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass
from typing import Mapping

from tvm_interop.runtime.errors import InteropError

from .graph import OpGraph


@dataclass(frozen=True)
class ConcurrencyBound:
    """Seconds, for one model's kernels on ``cores`` cores (see the module docstring)."""

    cores: int
    sequential_s: float       # every kernel on all cores, one after another: the sequential program's kernels
    one_core_s: float         # every kernel on one core, one after another
    critical_path_s: float
    work_s: float
    list_schedule_s: float

    @property
    def lower_bound_s(self) -> float:
        return max(self.critical_path_s, self.work_s)

    @property
    def speedup_bound(self) -> float:
        """No schedule of these kernels beats the sequential program by more than this."""
        return self.sequential_s / self.lower_bound_s if self.lower_bound_s > 0 else 1.0

    @property
    def list_speedup(self) -> float:
        """The idealised list schedule over the sequential program."""
        return self.sequential_s / self.list_schedule_s if self.list_schedule_s > 0 else 1.0

    def to_json(self) -> dict:
        return {**asdict(self), "lower_bound_s": self.lower_bound_s, "speedup_bound": self.speedup_bound,
                "list_speedup": self.list_speedup}


def concurrency_bound(graph: OpGraph, one_core: Mapping[str, float], all_cores: Mapping[str, float],
                      cores: int) -> ConcurrencyBound:
    """The bounds for ``graph`` from every unit's time on one core and on all ``cores`` (seconds, by unit name).

    Timings that miss units of the graph, or name units it does not have, come from another model (or another
    build of it) and are refused, naming a few of them."""
    if cores < 1:
        raise InteropError(f"cores must be >= 1, got {cores}")
    names = [u.name for u in graph.units]
    for label, times in (("one-core", one_core), ("all-core", all_cores)):
        missing = [n for n in names if n not in times]
        foreign = [n for n in times if n not in graph.index]
        if missing or foreign:
            raise InteropError(
                f"{label} timings do not match graph {graph.name!r}: {len(missing)} unit(s) without a time "
                f"{missing[:3]}, {len(foreign)} timed unit(s) not in the graph {foreign[:3]}")
    t1 = [float(one_core[n]) for n in names]
    tn = [float(all_cores[n]) for n in names]
    # a small kernel can be faster on one core than on all (no hand-off): the path takes the faster of the two
    fastest = [min(a, b) for a, b in zip(t1, tn)]
    return ConcurrencyBound(
        cores=cores, sequential_s=sum(tn), one_core_s=sum(t1),
        critical_path_s=max(_bottom_levels(graph, fastest), default=0.0),
        work_s=sum(min(a, cores * b) for a, b in zip(t1, tn)) / cores,
        list_schedule_s=list_schedule(graph, t1, tn, cores))


def _bottom_levels(graph: OpGraph, times: list[float]) -> list[float]:
    """Longest path from each unit to an exit, the unit included (units are in topological order)."""
    level = [0.0] * len(times)
    for i in reversed(range(len(times))):
        level[i] = times[i] + max((level[s] for s in graph.succs[i]), default=0.0)
    return level


def list_schedule(graph: OpGraph, t_one: list[float], t_all: list[float], cores: int) -> float:
    """Makespan of a list schedule where each kernel runs on one core (``t_one``) or on all (``t_all``).

    Ready kernels go in order of their longest path to the exit. With every core free, the next ready kernels
    (as many as there are cores) run one per core when the slowest of them on one core beats running them one
    after another on all cores (for one kernel: when it is faster on one core); else the first runs on all. With some cores busy, a ready kernel starts
    on a free core unless waiting for every core and running it on all of them finishes it sooner (and no
    other kernel is ready to take the core). Idealised on purpose: nothing is charged for a hand-off, a
    launch or two kernels sharing caches and memory bandwidth."""
    n = len(t_one)
    if cores == 1:
        return sum(t_one)
    bottom = _bottom_levels(graph, t_all)
    waiting = [len(p) for p in graph.preds]
    ready = [i for i in range(n) if waiting[i] == 0]
    running: list[tuple[float, int, int]] = []     # (end, unit, cores held)
    now, free, finished = 0.0, cores, 0
    while finished < n:
        ready.sort(key=lambda i: -bottom[i])
        while ready and free > 0:
            if free == cores:
                batch = ready[:cores]
                if max(t_one[i] for i in batch) < sum(t_all[i] for i in batch):
                    for i in batch:
                        heapq.heappush(running, (now + t_one[i], i, 1))
                    del ready[:len(batch)]
                    free -= len(batch)
                else:
                    i = ready.pop(0)
                    heapq.heappush(running, (now + t_all[i], i, cores))
                    free = 0
                continue
            i = ready[0]
            all_free_at = max(end for end, _, _ in running)
            if len(ready) == 1 and now + t_one[i] > all_free_at + t_all[i]:
                break
            ready.pop(0)
            heapq.heappush(running, (now + t_one[i], i, 1))
            free -= 1
        end, i, held = heapq.heappop(running)
        now, free, finished = end, free + held, finished + 1
        for s in graph.succs[i]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    return now
