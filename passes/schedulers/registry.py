"""Schedulers by name: the built-in ones, and any registered later with :func:`register_scheduler`.

The built-in schedulers are imported here, explicitly, rather than registering themselves on import: a scheduler
module then depends only on the base class and its helpers, never on the registry, and the registry is complete
as soon as it is imported.
"""
from __future__ import annotations

from tvm_interop.runtime.errors import InteropError

from .base import Scheduler
from .exhaustive import ExhaustiveScheduler
from .greedy import GreedyScheduler
from .hios import HiosScheduler
from .ios import IosScheduler
from .lios import LiosScheduler
from .sequential import SequentialScheduler

_SCHEDULERS: dict[str, Scheduler] = {}


def register_scheduler(cls: type[Scheduler]) -> type[Scheduler]:
    """Make a :class:`Scheduler` subclass available by its ``name`` (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise TypeError(f"register_scheduler takes a Scheduler subclass, got {cls!r}")
    _SCHEDULERS[cls.name] = cls()
    return cls


for _builtin in (SequentialScheduler, GreedyScheduler, IosScheduler, LiosScheduler, HiosScheduler,
                 ExhaustiveScheduler):
    register_scheduler(_builtin)


def available_schedulers() -> list[str]:
    return sorted(_SCHEDULERS)


def get_scheduler(name: str) -> Scheduler:
    """The scheduler registered as ``name``; calling it schedules one graph (``scheduler(graph, cost, **opts)``)."""
    if name not in _SCHEDULERS:
        raise InteropError(f"unknown scheduler {name!r}; available: {', '.join(sorted(_SCHEDULERS))}")
    return _SCHEDULERS[name]
