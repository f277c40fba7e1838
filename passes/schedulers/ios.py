"""IOS (Ding et al., MLSys'21): dynamic programming over *endings*, with concurrent and merge stages.

For a remaining set ``S`` of units, ``cost(S) = min over endings E of S of cost(S - E) + stage(E)``, where an
ending is a nonempty subset with no edge into the rest of ``S``; ``stage(E)`` is the best way to run ``E`` as
one stage: concurrent groups (each a chain / sub-DAG run in order on one stream; no edge between groups) or,
when ``E`` is several convolutions reading the same tensor, one merged kernel. The details (how every legal
ending is enumerated once, how groups are chosen, what is memoised) are in
:func:`passes.schedulers.ios_dp.ending_dp`; this module is the scheduler around it: options, parts, guard.

Options:

* ``r`` (default 3): at most this many units per group; ``s`` (default 8): at most this many groups per
  stage. ``None`` = unbounded. These are IOS's pruning parameters.
* ``merge`` (default True): also try merge stages. ``max_merge``: at most this many operators per merge.
* ``max_states`` (default ``"auto"``: 32768 over schedule units, 800 over single kernels): the DP's states are
  the down-sets of the block. A block with more is cut
  into parts (horizontal slabs in ASAP-level order, see :func:`~passes.schedulers.bitdag.split_parts`), each
  searched exactly, run one after another — the same remedy as the reference implementation's
  ``max_part_size``, but sized by the real number of states instead of a unit count. ``None`` never cuts.
  The scheduler base hands the DP IOS's blocks (barriers at small frontiers, at most 4096 down-sets each where
  the graph allows, :func:`passes.partition.frontier_blocks`) over schedule units (chains of kernels,
  :mod:`passes.contract`), so on the zoo no block reaches this budget: RandWire's stages, which have no small
  frontier inside, are the largest (21k states, 24 s for the whole model on the 2-core build machine). Over single
  kernels a state has many more endings: synthetic RandWire at 800 / 4096 / 32768 states per part took
  1.0 / 6.8 / 102 s (predicted 0.469 / 0.446 / 0.440 ms), hence the smaller budget there.
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

from ..cost import CostModel
from ..graph import OpGraph
from ..schedule import Stage, sequential_stages
from .base import Scheduler
from .bitdag import LocalDAG, split_parts
from .greedy import wavefront_stages
from .ios_dp import ending_dp
from .latency import schedule_cost
from ..list_scheduling import list_schedule, timeline_to_stages
from .options import Option, check_limit, flag, limit
from .result import SchedulerResult, SearchStats
from .stage_coster import StageCoster

DEFAULT_MAX_STATES = 32768       # per part, over schedule units (chains of kernels)
KERNEL_MAX_STATES = 800          # per part, over single kernels (unit_granularity="kernel")
DEFAULT_GROUP_ENUM_LIMIT = 3


def _max_states(name: str, value):
    return value if value == "auto" else check_limit(name, value)


def _group_enum_limit(name: str, value):
    return value if value == "auto" else check_limit(name, value)


class IosScheduler(Scheduler):
    name = "ios"
    exact_blocks = True
    options = (
        limit("r", 3, "at most this many units per group (None: unbounded)"),
        limit("s", 8, "at most this many groups per stage (None: unbounded)"),
        flag("merge", True, "also try merge stages"),
        Option("max_states", "auto", "DP states per part before a block is cut (None: never cut; 'auto': "
               f"{DEFAULT_MAX_STATES} over chains of kernels, {KERNEL_MAX_STATES} over single kernels)",
               _max_states),
        Option("group_enum_limit", "auto", "endings with at most this many components try every partition "
               f"('auto': all when r and s are unbounded, else {DEFAULT_GROUP_ENUM_LIMIT})", _group_enum_limit),
        limit("max_merge", None, "at most this many operators per merge (None: unbounded)"),
        flag("guard", True, "keep sequential / greedy / lios when they are predicted faster"),
        flag("bound", True, "branch-and-bound with stage lower bounds"),
    )

    def place(self, graph: OpGraph, cost: CostModel, *, r: int | None, s: int | None, merge: bool,
              max_states: int | None, group_enum_limit: int | None | str, max_merge: int | None, guard: bool,
              bound: bool) -> SchedulerResult:
        if max_states == "auto":
            max_states = DEFAULT_MAX_STATES if getattr(graph, "schedule_units", "kernel") == "chain" \
                else KERNEL_MAX_STATES
        if group_enum_limit == "auto":
            group_enum_limit = None if (r is None and s is None) else DEFAULT_GROUP_ENUM_LIMIT
        stats = SearchStats()
        stages: list[Stage] = []
        for idx, states in split_parts(graph, max_states):
            dag = LocalDAG(graph, idx)
            coster = StageCoster(cost, dag, stats)
            _, choices = ending_dp(dag, coster, stats, r, s, merge=merge, states=states,
                                   group_enum_limit=group_enum_limit, max_merge=max_merge, bound=bound)
            stages.extend(coster.stages(choices))
        if guard and len(graph) > 1:
            stages = _guarded(graph, cost, stages, s, stats)
        return SchedulerResult(stages, stats)


def _guarded(graph: OpGraph, cost: CostModel, stages: list[Stage], s: int | None,
             stats: SearchStats) -> list[Stage]:
    """The cheapest of the DP's answer, the sequential schedule, and greedy and lios at 1..s streams (the DP
    cannot find those when a block was cut into parts or their chains are longer than ``r``)."""
    best = schedule_cost(stages, graph, cost)
    alternatives = [sequential_stages(u.name for u in graph.units)]
    kmax = len(graph) if s is None else min(s, len(graph))
    prev = None
    for k in range(1, kmax + 1):  # greedy at 1..s streams
        alt = wavefront_stages(graph, cost, k)
        if prev is not None and _same(alt, prev):
            break  # more streams than any wavefront has units: nothing changes any more
        alternatives.append(alt)
        prev = alt
    lat = [cost.unit_latency(u) for u in graph.units]
    for k in range(1, kmax + 1):  # lios at 1..s streams
        stream_of, start, finish = list_schedule(graph, lat, k)
        alternatives.append(timeline_to_stages(graph, stream_of, start, finish))
        if max(stream_of) < k - 1:
            break  # a stream was left unused: more streams change nothing
    for alt in alternatives:
        c = schedule_cost(alt, graph, cost, stats)
        if c < best * (1 - 1e-12):
            best, stages = c, alt
    return stages


def _same(a: list[Stage], b: list[Stage]) -> bool:
    return len(a) == len(b) and all(x.groups == y.groups for x, y in zip(a, b))
