"""Inter-operator schedulers.

* :mod:`.base` — the :class:`Scheduler` base class (options, blocks, statistics); each scheduler module holds one
  policy that only decides placement: :mod:`.sequential`, :mod:`.greedy`, :mod:`.ios` (with its dynamic program
  in :mod:`.ios_dp`), :mod:`.lios`, :mod:`.hios`, :mod:`.exhaustive`;
* shared pieces, each in a module named for it: :mod:`.options` (declaring and checking options), :mod:`.result`
  (:class:`SchedulerResult`, :class:`SearchStats`), :mod:`.bitdag` (bitmask DAG helpers), :mod:`.stage_coster`,
  :mod:`.merge_legality`, :mod:`.latency` (composing stage costs into a schedule's latency);
* :mod:`.registry` (schedulers by name) and :mod:`.driver` (``schedule_graph``: the one entry point).
"""
from .base import Scheduler
from .driver import schedule_graph
from .latency import annotate_latency
from .options import Option, SchedulerOptionError
from .registry import available_schedulers, get_scheduler, register_scheduler
from .result import SchedulerResult, SearchStats

__all__ = ["Option", "Scheduler", "SchedulerOptionError", "SchedulerResult", "SearchStats", "annotate_latency",
           "available_schedulers", "get_scheduler", "register_scheduler", "schedule_graph"]
