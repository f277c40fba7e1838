"""What every scheduler returns: :class:`SchedulerResult` (stages, search statistics, optional device map).

One type for every policy, so the driver never has to guess a result's shape (the device map of a multi-device
schedule used to be a third tuple element, found by its length).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..schedule import Stage


@dataclass
class SearchStats:
    """Search effort: DP states, transitions tried, distinct stages costed, wall seconds.

    Reported in ``Schedule.search`` so searches can be compared by their work, not only by their wall time.
    """

    states: int = 0
    transitions: int = 0
    stages_costed: int = 0
    seconds: float = 0.0

    def add(self, other: "SearchStats") -> None:
        """Accumulate ``other`` (the effort of one more block)."""
        self.states += other.states
        self.transitions += other.transitions
        self.stages_costed += other.stages_costed
        self.seconds += other.seconds

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class SchedulerResult:
    """The schedule of one graph (or block) as a scheduler found it.

    ``stages`` run one after another. ``unit_devices`` maps every unit to a device index; it is set only by
    schedulers that place units on several devices (``hios``), and ``None`` means one device. The predicted
    latencies are not here: the driver costs the stages once the whole model is scheduled
    (:func:`passes.schedulers.latency.annotate_latency`).
    """

    stages: list[Stage]
    stats: SearchStats = field(default_factory=SearchStats)
    unit_devices: dict[str, int] | None = None
    blocks: list[dict] = field(default_factory=list)  # per block: schedule units, kernels, states, frontier
