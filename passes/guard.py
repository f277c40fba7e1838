"""The never-slower guard: measure the chosen schedule against sequential with the same kernels; ship the faster.

A scheduler's prediction can be wrong (a cost model is a model). Before shipping, both plans run on the real
executor with identical kernels and inputs, interleaved so that machine noise hits both alike; the scheduled
program ships only if its median is not slower than sequential's. A schedule that is slower but within the noise
has shown no gain, and sequential is the simpler program with the smaller memory footprint, so it ships then too;
the noise (IQR / median) is reported so a user can tell a clear loss from a coin toss.

A CPU schedule with concurrent groups has a third contender: the schedule built with each stage's groups run one
after another on the Relax VM (``passes.in_order``), every kernel on all the cores; the library timed is the one
that ships. It ships when it beats both
(``choice == "in_order"``): worker threads, and the dispatch of every kernel from Python that comes with them, do
not pay on every machine.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class GuardResult:
    scheduled_ms: float
    sequential_ms: float
    noise: float          # relative spread (IQR / median) of the measurements, at least 1%
    keep_schedule: bool
    repeat: int
    in_order_ms: float | None = None   # the scheduled library with its groups run one after another (VM)
    choice: str = ""                   # "scheduled", "in_order" or "sequential": what ships

    def to_json(self) -> dict:
        return asdict(self)


def compare_plans(library, plans: dict, device_kind: str = "cpu", repeat: int = 15, warmup: int = 2,
                  seed: int = 0) -> dict[str, list[float]]:
    """Run each plan (same kernels, same inputs) ``repeat`` times, interleaved; seconds per run per plan."""
    if device_kind != "cpu":
        raise NotImplementedError("the in-process guard measures CPU plans; GPU plans are checked on the device")
    return compare_libraries({k: (library, p) for k, p in plans.items()}, repeat=repeat, warmup=warmup, seed=seed)


def compare_libraries(runs: dict, repeat: int = 15, warmup: int = 2, seed: int = 0) -> dict[str, list[float]]:
    """``runs`` maps a name to ``(library, plan)``; all run on the same inputs, interleaved (see
    ``runtime.plan_timer.time_plans``, which a remote device server runs too)."""
    from tvm_interop.runtime.plan_timer import time_plans

    return time_plans(runs, repeat=repeat, warmup=warmup, seed=seed)


def decide(times: dict[str, list[float]]) -> GuardResult:
    """The lowest median ships; the schedule (as built, then with its groups in order) wins a tie with
    sequential, as before the third contender. ``times`` holds ``scheduled`` and ``sequential``, and ``in_order``
    when it was timed; without ``scheduled`` (an executor that only runs the groups in order was asked for) the
    groups in order stand for the schedule."""
    meds = {k: float(np.median(v)) for k, v in times.items() if k in ("scheduled", "in_order", "sequential")}
    iqr = lambda a: float(np.percentile(a, 75) - np.percentile(a, 25)) / max(float(np.median(a)), 1e-12)  # noqa: E731
    noise = max([0.01] + [iqr(np.array(times[k])) for k in meds])
    choice = min((k for k in ("scheduled", "in_order", "sequential") if k in meds), key=lambda k: meds[k])
    shown = meds.get("scheduled", meds.get("in_order"))
    return GuardResult(shown * 1e3, meds["sequential"] * 1e3, noise, choice != "sequential",
                       len(times["sequential"]),
                       in_order_ms=meds["in_order"] * 1e3 if "in_order" in meds else None, choice=choice)
