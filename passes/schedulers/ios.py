"""IOS (Ding et al., MLSys'21): dynamic programming over *endings*, with concurrent and merge stages.

For a remaining set ``S`` of units, ``cost(S) = min over endings E of S of cost(S - E) + stage(E)``, where an
ending is a nonempty subset with no edge into the rest of ``S``; ``stage(E)`` is the best way to run ``E`` as
one stage: concurrent groups (each a chain / sub-DAG run in order on one stream; no edge between groups) or,
when ``E`` is several convolutions reading the same tensor, one merged kernel. The details (how every legal
ending is enumerated once, how groups are chosen, what is memoised) are in
:func:`passes.schedulers._util.ending_dp`.

Options:

* ``r`` (default 3): at most this many units per group; ``s`` (default 8): at most this many groups per
  stage. ``None`` = unbounded. These are IOS's pruning parameters.
* ``merge`` (default True): also try merge stages. ``max_merge``: at most this many operators per merge.
* ``max_states`` (default 800): the DP's states are the down-sets of the block. A block with more is cut
  into parts (horizontal slabs in ASAP-level order, see :func:`~passes.schedulers._util.split_parts`), each
  searched exactly, run one after another — the same remedy as the reference implementation's
  ``max_part_size``, but sized by the real number of states instead of a unit count. ``None`` never cuts.
* ``group_enum_limit`` (default: all partitions when ``r`` and ``s`` are both unbounded, else 3): endings
  with at most this many connected components try every partition into groups; larger ones a family of
  packings (one group per component; longest-first packings into 1..s groups). On nasnet_a_large
  (sim:h100, fluid contention) 3 instead of 6 changed the result by 0.03% and saved 40% of the search time.
* ``bound`` (default True): branch-and-bound with a stage lower bound (a stage is never faster than its
  slowest group alone; cost models may sharpen it); changes no result when the bound is valid.
* ``guard`` (default True): compare the result with the sequential schedule, ``greedy`` and ``lios`` at
  1..s streams, and keep the cheapest (``SearchStats`` cannot say which won; compare with ``guard=False``).
  The DP's space contains all of these when the block was searched in one part and their groups fit in
  ``r``; otherwise (a block cut into parts, chains longer than ``r``) a list schedule can win.

Statistics: ``states`` (memo entries), ``transitions`` (endings tried, merges included), ``stages_costed``
(distinct stage-cost evaluations), ``seconds``.

Scale (2-core build machine, sim:h100, defaults): nasnet_a_large from the zoo (748 units, one 745-unit block,
35.6k states, 2.0M transitions) in about 8 s of CPU; inception_v3 in 0.1 s. With ``r = s = None`` the result
equals the ``exhaustive`` optimum (tested on hundreds of random DAGs).
"""
from __future__ import annotations

import time

from ..cost import CostModel
from ..graph import OpGraph
from ..schedule import Stage, sequential_stages
from . import greedy as _greedy
from ._util import (LocalDAG, StageCoster, check_limit, ending_dp, schedule_cost, split_parts,
                    stages_from_choices)
from .base import SearchStats, register_scheduler

DEFAULT_MAX_STATES = 800
DEFAULT_GROUP_ENUM_LIMIT = 3


@register_scheduler("ios")
def ios(graph: OpGraph, cost: CostModel, r: int | None = 3, s: int | None = 8, merge: bool = True,
        max_states: int | None = DEFAULT_MAX_STATES, group_enum_limit: int | None | str = "auto",
        max_merge: int | None = None, guard: bool = True, bound: bool = True,
        **_options) -> tuple[list[Stage], SearchStats]:
    r = check_limit("r", r)
    s = check_limit("s", s)
    max_states = check_limit("max_states", max_states)
    max_merge = check_limit("max_merge", max_merge)
    if group_enum_limit == "auto":
        group_enum_limit = None if (r is None and s is None) else DEFAULT_GROUP_ENUM_LIMIT
    else:
        group_enum_limit = check_limit("group_enum_limit", group_enum_limit)
    t0 = time.perf_counter()
    stats = SearchStats()
    stages: list[Stage] = []
    for idx, states in split_parts(graph, max_states):
        dag = LocalDAG(graph, idx)
        coster = StageCoster(cost, dag, stats)
        _, choices = ending_dp(dag, coster, stats, r, s, merge=merge, states=states,
                               group_enum_limit=group_enum_limit, max_merge=max_merge, bound=bound)
        stages.extend(stages_from_choices(coster, choices))
    if guard and len(graph) > 1:
        stages = _guarded(graph, cost, stages, s, stats)
    stats.seconds = time.perf_counter() - t0
    return stages, stats


def _guarded(graph: OpGraph, cost: CostModel, stages: list[Stage], s: int | None,
             stats: SearchStats) -> list[Stage]:
    from . import lios as _lios

    best = schedule_cost(stages, graph, cost)
    alternatives = [sequential_stages(u.name for u in graph.units)]
    kmax = len(graph) if s is None else min(s, len(graph))
    prev = None
    for k in range(1, kmax + 1):  # greedy at 1..s streams
        alt, _ = _greedy.greedy(graph, cost, max_streams=k)
        if prev is not None and _same(alt, prev):
            break  # more streams than any wavefront has units: nothing changes any more
        alternatives.append(alt)
        prev = alt
    lat = [cost.unit_latency(u) for u in graph.units]
    for k in range(1, kmax + 1):  # lios at 1..s streams
        stream_of, start, finish = _lios.list_schedule(graph, lat, k)
        alternatives.append(_lios.timeline_to_stages(graph, stream_of, start, finish))
        if max(stream_of) < k - 1:
            break  # a stream was left unused: more streams change nothing
    for alt in alternatives:
        c = schedule_cost(alt, graph, cost)
        stats.stages_costed += len(alt)
        if c < best * (1 - 1e-12):
            best, stages = c, alt
    return stages


def _same(a: list[Stage], b: list[Stage]) -> bool:
    return len(a) == len(b) and all(x.groups == y.groups for x, y in zip(a, b))
