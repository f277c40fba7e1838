"""Scheduler options: how a scheduler declares them, and how values are checked.

Each scheduler lists its options as :class:`Option` values (name, default, one line of help, a check). The base
class (:class:`passes.schedulers.base.Scheduler`) resolves what a caller passed with :func:`resolve_options`
before the search starts, so a mistyped option name is an error that lists the valid ones instead of being
silently ignored, and an out-of-range value is an error that names the option instead of a wrong schedule.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from tvm_interop.runtime.errors import InteropError


class SchedulerOptionError(InteropError):
    """A scheduler option is unknown to the scheduler, or out of range (``r < 1``, ``devices < 1``, ...)."""


Check = Callable[[str, Any], Any]


@dataclass(frozen=True)
class Option:
    """One option a scheduler accepts.

    ``check(name, value)`` raises :class:`SchedulerOptionError` for a bad value and returns the value the search
    uses; ``None`` accepts anything (flags, and options whose meaning depends on another option and are
    therefore checked by the scheduler itself).
    """

    name: str
    default: Any
    help: str
    check: Check | None = None

    def resolve(self, value: Any) -> Any:
        return value if self.check is None else self.check(self.name, value)


def check_limit(name: str, value: Any, allow_none: bool = True) -> int | None:
    """``None`` (unbounded, where allowed) or an integer >= 1."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SchedulerOptionError(
            f"scheduler option {name} must be an integer >= 1{' or None (unbounded)' if allow_none else ''}, "
            f"got {value!r}")
    return value


def check_positive(name: str, value: Any) -> float:
    """A number > 0 (not NaN, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise SchedulerOptionError(f"scheduler option {name} must be a number > 0, got {value!r}")
    return float(value)


def check_non_negative(name: str, value: Any) -> float:
    """A number >= 0 (not NaN, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise SchedulerOptionError(f"scheduler option {name} must be a number >= 0, got {value!r}")
    return float(value)


def limit(name: str, default: int | None, help: str, unbounded: bool = True) -> Option:
    """An integer >= 1 option; with ``unbounded``, ``None`` means no limit."""
    return Option(name, default, help, lambda n, v: check_limit(n, v, allow_none=unbounded))


def positive(name: str, default: float, help: str) -> Option:
    return Option(name, default, help, check_positive)


def non_negative(name: str, default: float, help: str) -> Option:
    return Option(name, default, help, check_non_negative)


def flag(name: str, default: bool, help: str) -> Option:
    return Option(name, default, help)


def resolve_options(scheduler: str, declared: Sequence[Option], given: Mapping[str, Any]) -> dict[str, Any]:
    """The value of every declared option (given, else its default), each checked.

    Raises :class:`SchedulerOptionError` naming the scheduler and its valid options when ``given`` holds a name
    the scheduler does not declare.
    """
    known = {o.name: o for o in declared}
    unknown = [k for k in given if k not in known]
    if unknown:
        raise SchedulerOptionError(_unknown_message(scheduler, unknown, declared))
    return {o.name: o.resolve(given[o.name]) if o.name in given else o.resolve(o.default) for o in declared}


def describe_options(declared: Sequence[Option]) -> str:
    """``name=default`` for every option, comma-separated (for error messages and ``--help`` texts)."""
    return ", ".join(f"{o.name}={o.default!r}" for o in declared) or "none"


def _unknown_message(scheduler: str, unknown: list[str], declared: Sequence[Option]) -> str:
    names = [o.name for o in declared]
    hints = []
    for k in unknown:
        close = difflib.get_close_matches(k, names, n=1)
        if close:
            hints.append(f"{k!r} -> did you mean {close[0]!r}?")
    plural = "s" if len(unknown) > 1 else ""
    msg = (f"scheduler {scheduler!r} has no option{plural} {', '.join(map(repr, unknown))}; "
           f"its options are: {describe_options(declared)}")
    return msg + (f" ({'; '.join(hints)})" if hints else "")
