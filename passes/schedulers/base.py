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
from ..partition import partition
from ..schedule import Stage
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
                 **options: Any) -> SchedulerResult:
        """Schedule a whole model: per block (unless ``whole_graph``), stages concatenated in block order.

        Blocks run one after another, so searching them separately loses nothing across a block boundary and
        keeps the searches small. ``stats.seconds`` is the wall time of the whole call.
        """
        values = self.resolve_options(options)
        t0 = time.perf_counter()
        if self.whole_graph:
            parts = [graph]
        else:
            blocks = partition(graph, max_block_size=max_block_size)
            parts = [graph.subgraph(b, name=f"{graph.name}/block{i}") for i, b in enumerate(blocks)]
        stages: list[Stage] = []
        stats = SearchStats()
        unit_devices: dict[str, int] | None = None
        for part in parts:
            result = self._place_timed(part, cost, values)
            stages.extend(result.stages)
            stats.add(result.stats)
            if result.unit_devices is not None:
                unit_devices = {**(unit_devices or {}), **result.unit_devices}
        stats.seconds = time.perf_counter() - t0
        return SchedulerResult(stages, stats, unit_devices)

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
