"""The one cost-model interface every scheduler uses.

A cost model answers two questions, in seconds: how long one unit takes alone (``unit_latency``) and how long a
stage takes (``stage_latency``): its groups started together, units inside a group one after another, until the
last group ends. For a ``merge`` stage the groups are the operators replaced by one merged kernel. For a ``wave``
stage the groups are compiled into one kernel (``passes.wave``: one parallel region per wave of nests on a CPU,
one launch per wave on a GPU); a model that cannot price that raises :class:`InteropError`, and the stage is
then left unfused (``passes.wave.choose``).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

from ..graph import Unit


class CostModel(ABC):
    """Base class. ``name`` identifies the model and device (it goes into schedule files)."""

    name: str = "cost"

    @abstractmethod
    def unit_latency(self, unit: Unit) -> float:
        """Seconds for ``unit`` alone on an idle device."""

    @abstractmethod
    def stage_latency(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> float:
        """Seconds for one stage of ``groups`` (see module docstring)."""

    def sequential_latency(self, units: Sequence[Unit]) -> float:
        """Seconds to run ``units`` one per stage."""
        return float(sum(self.stage_latency([[u]]) for u in units))

    @property
    def device_fingerprint(self) -> str:
        return self.name


class UnitCostModel(CostModel):
    """The simplest honest model: a stage costs its longest group, a group the sum of its units.

    It ignores contention, so it is optimistic about concurrency; schedulers that need only relative unit costs
    (``lios``) and tests on synthetic graphs use it. ``latency`` maps unit names to seconds; units not listed
    cost ``flops / flops_per_second`` plus ``launch`` seconds.
    """

    def __init__(self, latency: dict[str, float] | None = None, flops_per_second: float = 1e11,
                 launch: float = 5e-6, name: str = "unit"):
        self.latency = dict(latency or {})
        self.flops_per_second = flops_per_second
        self.launch = launch
        self.name = name

    def unit_latency(self, unit: Unit) -> float:
        if unit.name in self.latency:
            return self.latency[unit.name]
        return unit.flops / self.flops_per_second + self.launch

    def stage_latency(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> float:
        if strategy == "merge":
            return max((self.unit_latency(g[0]) for g in groups), default=0.0)
        return max((sum(self.unit_latency(u) for u in g) for g in groups), default=0.0)
