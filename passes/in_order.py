"""Run a schedule's concurrent groups one after another, each kernel on all of the CPU's cores.

Why: on a CPU, concurrent groups run on worker threads (``runtime.thread_executor``), and each group's kernels
then get a share of the cores, while the Python workers dispatch every kernel. Whether that beats the same
stages' groups run one after another, every kernel on the whole TVM thread pool from the Relax VM, depends on the
machine and on the kernels, not on the schedule. On this project's 2-core machine (2026-11-29, interleaved
medians) the worker threads ran Inception-v3 greedy 7.07 ms, the same library on the VM 4.84 ms; and Inception-v3
lios with wave fusion, whose one concurrent stage left unfused made the whole program run on the workers,
4.36 / 4.25 ms (3.97 / 3.54 ms in another run). So the never-slower guard times both for a program that wave
fusion or merges rewrote (over the model's own kernels, the groups in order are sequential's work in another
order: the guard's sequential stands for them). Wave fusion decides it earlier where its paired stage timings
can (``passes.wave.choose``: every stage it left unfused timed no faster on the workers than in order). When the
groups in order win, the schedule records it
(``options["groups_in_order"]``) and a CPU build runs each concurrent stage's groups as consecutive stages of one
group: a plan without concurrent groups, which the VM runs by default wherever the library is loaded. The
schedule itself keeps its stages (it is what the search found, and what a GPU build runs concurrently); like
wave fusion and merges, the option rewrites what is built, so a schedule file compiles to the same program again.
"""
from __future__ import annotations

from dataclasses import replace

from .schedule import CONCURRENT, Schedule, Stage

IN_ORDER_OPTION = "groups_in_order"


def runs_groups_in_order(schedule: Schedule) -> bool:
    """Whether the build runs ``schedule``'s concurrent groups one after another."""
    return bool(schedule.options.get(IN_ORDER_OPTION))


def groups_in_order(schedule: Schedule) -> Schedule:
    """A copy of ``schedule`` where every concurrent stage of several groups is split into consecutive
    single-group stages, in its group order (any order of a stage's groups respects the dependencies: a stage's
    groups are independent). Merge stages and single-group stages are kept as they are. The copy records in
    ``search["in_order_from"]`` how many stages it came from."""
    stages: list[Stage] = []
    for st in schedule.stages:
        if st.strategy == CONCURRENT and len(st.groups) > 1:
            stages.extend(Stage([list(g)]) for g in st.groups)
        else:
            stages.append(st)
    out = replace(schedule, stages=stages, options=dict(schedule.options), search=dict(schedule.search))
    out.search["in_order_from"] = schedule.num_stages
    return out
