"""The scheduler base class: the work every scheduler shares, so that a scheduler only decides placement.

A scheduler is a subclass of :class:`Scheduler` that declares its ``name`` and ``options`` and implements
:meth:`Scheduler.place` for one graph: which units run in which stage, in which group (and, for a multi-device
scheduler, on which device). The base does the rest, the same way for every scheduler:

* options: what a caller passes is checked against the declared options (:mod:`passes.schedulers.options`)
  before any search starts; an unknown name is a :class:`~passes.schedulers.options.SchedulerOptionError`
  that lists the valid ones, and ``place`` receives every declared option, checked, defaults filled in;
* blocks: :meth:`Scheduler.schedule` cuts a model into blocks (:func:`passes.partition.partition`) unless the
  scheduler must see the whole graph (``whole_graph``, e.g. list scheduling), places each block, concatenates
  the stages, merges the device maps and sums the search statistics;
* statistics: every placement is timed (``SearchStats.seconds``).

The registry (:mod:`passes.schedulers.registry`) maps names to schedulers; the driver
(:func:`passes.schedulers.driver.schedule_graph`) turns a result into a costed ``Schedule``.
"""
from __future__ import annotations

import inspect
import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Mapping

from ..cost import CostModel
from ..graph import OpGraph
from ..contract import DEFAULT_GRANULARITY, chain_cost, check_granularity, contract_chains, expand_stages, identity
from ..partition import DEFAULT_BLOCK_STATES, DEFAULT_MAX_FRONTIER, Block, frontier_blocks, split_large
from ..schedule import Stage
from .block_memo import BlockMemo, prices_by_structure
from .options import Option, resolve_options
from .result import SchedulerResult, SearchStats


class Scheduler(ABC):
    """Base class of every scheduler (see module docstring).

    Subclasses set ``name`` (the registry key), ``options`` (the :class:`Option` values ``place`` takes as
    keyword arguments, in that order of documentation) and, when blocks would hide the parallelism they look
    for, ``whole_graph = True``.
    """

    name: ClassVar[str]
    options: ClassVar[tuple[Option, ...]] = ()
    whole_graph: ClassVar[bool] = False
    exact_blocks: ClassVar[bool] = False  # an exact (exponential) search: give it IOS's bounded blocks

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not inspect.isabstract(cls):
            _check_declaration(cls)

    @abstractmethod
    def place(self, graph: OpGraph, cost: CostModel, **options: Any) -> SchedulerResult:
        """The stages of ``graph`` (a block, or the whole model when ``whole_graph``) under ``cost``.

        ``options`` holds every declared option, already checked. ``SearchStats.seconds`` is filled in by the
        base; a scheduler counts only its own effort (states, transitions, stages costed).
        """

    # ------------------------------------------------------------------ common work
    def resolve_options(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every declared option's value (given, else its default), checked; unknown names are an error."""
        return resolve_options(self.name, self.options, given)

    def __call__(self, graph: OpGraph, cost: CostModel, **options: Any) -> SchedulerResult:
        """Schedule ``graph`` as one block (no cutting into blocks)."""
        return self._place_timed(graph, cost, self.resolve_options(options))

    def schedule(self, graph: OpGraph, cost: CostModel, max_block_size: int | None = None,
                 unit_granularity: str = DEFAULT_GRANULARITY, max_frontier: int = DEFAULT_MAX_FRONTIER,
                 max_block_states: int | None = DEFAULT_BLOCK_STATES, memo: BlockMemo | None = None,
                 **options: Any) -> SchedulerResult:
        """Schedule a whole model: per block (unless ``whole_graph``), stages concatenated in block order.

        The search sees schedule units (``unit_granularity="chain"``: single-consumer chains of kernels
        contracted, :mod:`passes.contract`; ``"kernel"``: every kernel; ``"auto"``, the default: see
        :meth:`granularity`) and returns kernel stages. Blocks run one
        after another (a barrier between blocks), so searching them separately keeps the searches small; an
        exact search (``exact_blocks``) gets IOS's blocks: barriers at small frontiers (at most ``max_frontier``
        live tensors) so that each block has at most ``max_block_states`` down-sets
        (:func:`passes.partition.frontier_blocks`); other schedulers are cut at cut points only, which loses
        nothing. ``stats.seconds`` is the wall time of the whole call. ``memo`` (a :class:`BlockMemo`) hands back
        the stages of a block already scheduled with the same structure, options and cost model, when the cost
        model prices by structure (:func:`~passes.schedulers.block_memo.prices_by_structure`).
        """
        values = self.resolve_options(options)
        t0 = time.perf_counter()
        granularity = self.granularity(unit_granularity)
        contraction = contract_chains(graph) if granularity == "chain" else identity(graph)
        search_graph = contraction.graph
        search_cost = chain_cost(cost, contraction)
        if self.whole_graph:
            blocks = [Block([u.name for u in search_graph.units], None, 0)]
        else:
            budget = max_block_states if self.exact_blocks else None
            blocks = split_large(frontier_blocks(search_graph, max_frontier, budget), max_block_size)
        stages: list[Stage] = []
        stats = SearchStats()
        unit_devices: dict[str, int] | None = None
        searched: list[SearchStats] = []
        for i, b in enumerate(blocks):
            part = search_graph if len(blocks) == 1 else search_graph.subgraph(b.units, name=f"{graph.name}/block{i}")
            part.schedule_units = granularity   # what one unit of this graph is, for searches sized by it
            key = (memo.key(self.name, {**values, "granularity": granularity}, cost, part, contraction.members,
                            contraction.kernels)
                   if memo is not None and prices_by_structure(cost) else None)
            result = memo.get(key, part) if key is not None else None
            if result is None:
                result = self._place_timed(part, search_cost, values)
                if key is not None:
                    memo.put(key, part, result)
            stages.extend(expand_stages(result.stages, contraction.members))
            stats.add(result.stats)
            searched.append(result.stats)
            if result.unit_devices is not None:
                expanded = {k: d for n, d in result.unit_devices.items() for k in contraction.members[n]}
                unit_devices = {**(unit_devices or {}), **expanded}
        stats.seconds = time.perf_counter() - t0
        info = [dict(b.to_json(), kernels=len(contraction.expand(b.units)), transitions=st.transitions,
                     seconds=round(st.seconds, 4)) for b, st in zip(blocks, searched)]
        return SchedulerResult(stages, stats, unit_devices, blocks=info)

    def granularity(self, unit_granularity: str) -> str:
        """What ``unit_granularity`` means for this scheduler: ``"auto"`` is ``"chain"`` for an exact search
        (``exact_blocks``: contraction is what makes IOS's blocks tractable, and a chain kept together loses
        nothing there) and ``"kernel"`` for the heuristics (list scheduling places kernels one at a time and
        can interleave a chain's kernels with other streams' work: on nasnet_a_large, sim:h100, lios predicted
        3.08 ms over kernels and 3.36 ms over chains)."""
        check_granularity(unit_granularity)
        if unit_granularity == "auto":
            return "chain" if self.exact_blocks else "kernel"
        return unit_granularity

    def _place_timed(self, graph: OpGraph, cost: CostModel, values: dict[str, Any]) -> SchedulerResult:
        t0 = time.perf_counter()
        result = self.place(graph, cost, **values)
        result.stats.seconds = time.perf_counter() - t0
        return result

    def __repr__(self) -> str:
        return f"<scheduler {self.name}>"


def _check_declaration(cls: type) -> None:
    """A scheduler's ``place`` must take exactly its declared options as keyword arguments: a declared option
    that ``place`` ignores, or a parameter that cannot be set, is a bug caught when the class is defined."""
    params = list(inspect.signature(cls.place).parameters.values())[3:]  # after self, graph, cost
    taken = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    declared = {o.name for o in cls.options}
    if taken != declared or len(params) != len(taken) or not isinstance(getattr(cls, "name", None), str):
        raise TypeError(f"scheduler {cls.__name__}: place() must take exactly its declared options as keyword-only "
                        f"arguments (declared {sorted(declared)}, place() takes {[p.name for p in params]}) "
                        "and the class must set a name")
