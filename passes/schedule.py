"""Schedules: IOS's schedule space, and the versioned schedule file.

A schedule is an ordered list of stages. A ``concurrent`` stage holds disjoint groups that run at the same time
(units inside a group run one after another, on one stream or worker); a ``merge`` stage holds several operators
of the same kind reading the same input, replaced by one merged operator (each of its groups is one unit).
A schedule records the fingerprint of the graph it was made for, so it cannot be applied to another model.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from tvm_interop.runtime.errors import ScheduleError, ScheduleFileError

from .graph import OpGraph

SCHEDULE_FORMAT = "tvm-interop-schedule"
SCHEDULE_VERSION = 1
CONCURRENT = "concurrent"
MERGE = "merge"
STRATEGIES = (CONCURRENT, MERGE)


@dataclass
class Stage:
    """One stage: ``groups`` of unit names; ``strategy`` is ``concurrent`` or ``merge``."""

    groups: list[list[str]]
    strategy: str = CONCURRENT
    predicted_latency: float | None = None  # seconds, from the cost model that chose it
    measured_latency: float | None = None   # seconds, when it was timed on the device

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ScheduleError(f"unknown stage strategy {self.strategy!r}; expected one of {STRATEGIES}")
        self.groups = [list(g) for g in self.groups if len(g) > 0]

    @property
    def units(self) -> list[str]:
        return [u for g in self.groups for u in g]

    def to_json(self) -> dict:
        d: dict = {"strategy": self.strategy, "groups": self.groups}
        if self.predicted_latency is not None:
            d["predicted_latency"] = self.predicted_latency
        if self.measured_latency is not None:
            d["measured_latency"] = self.measured_latency
        return d

    @staticmethod
    def from_json(d: dict) -> "Stage":
        groups = d["groups"]
        if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
            raise ScheduleFileError("a stage's 'groups' must be a list of lists of unit names")
        return Stage(
            groups=[[str(u) for u in g] for g in groups],
            strategy=d.get("strategy", CONCURRENT),
            predicted_latency=d.get("predicted_latency"),
            measured_latency=d.get("measured_latency"),
        )


@dataclass
class Schedule:
    """A whole-model schedule plus where it came from."""

    stages: list[Stage]
    graph_fingerprint: str = ""
    model_name: str = ""
    scheduler: str = ""
    device: str = ""           # device fingerprint it was tuned for, e.g. "llvm:cpu:2c" or "sim:h100"
    batch: int | None = None
    predicted_latency: float | None = None  # seconds
    sequential_latency: float | None = None  # seconds, predicted or measured by the same cost model
    measured_latency: float | None = None    # seconds
    unit_devices: dict[str, int] = field(default_factory=dict)  # hios: which device runs each unit
    options: dict = field(default_factory=dict)
    search: dict = field(default_factory=dict)  # search statistics
    units: list[dict] = field(default_factory=list)  # unit summaries (name, kind, func) for readers of the file

    # ------------------------------------------------------------------ shape of the schedule
    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def unit_order(self) -> list[str]:
        return [u for s in self.stages for u in s.units]

    def max_concurrency(self) -> int:
        return max((len(s.groups) for s in self.stages if s.strategy == CONCURRENT), default=1)

    def validate(self, graph: OpGraph) -> None:
        """Raise ScheduleError unless every unit appears exactly once and every dependency is respected.

        A dependency is respected when the producer is in an earlier stage, or in the same group of the same
        concurrent stage and listed before the consumer. Merged units must all read the same input tensor and
        share a kind.
        """
        if self.graph_fingerprint and self.graph_fingerprint != graph.fingerprint():
            raise ScheduleError(
                f"schedule was made for a different model (graph fingerprint {self.graph_fingerprint}, "
                f"this model is {graph.fingerprint()}"
                + (f", schedule model name {self.model_name!r}" if self.model_name else "")
                + "); re-run the scheduler for this model"
            )
        where: dict[str, tuple[int, int, int]] = {}
        for si, stage in enumerate(self.stages):
            for gi, group in enumerate(stage.groups):
                for pi, name in enumerate(group):
                    if name not in graph.index:
                        raise ScheduleError(f"stage {si} names unit {name!r}, which is not in the model")
                    if name in where:
                        raise ScheduleError(f"unit {name!r} appears more than once (stages {where[name][0]} and {si})")
                    where[name] = (si, gi, pi)
        missing = [u.name for u in graph.units if u.name not in where]
        if missing:
            raise ScheduleError(f"schedule leaves out {len(missing)} unit(s), e.g. {missing[:5]}")
        for u in graph.units:
            s2, g2, p2 = where[u.name]
            for p in graph.pred_names(u.name):
                s1, g1, p1 = where[p]
                ok = s1 < s2 or (s1 == s2 and g1 == g2 and p1 < p2 and self.stages[s1].strategy == CONCURRENT)
                if not ok:
                    raise ScheduleError(
                        f"unit {u.name!r} (stage {s2}) runs before or beside its producer {p!r} (stage {s1})"
                    )
        for si, stage in enumerate(self.stages):
            if stage.strategy == MERGE:
                if any(len(g) != 1 for g in stage.groups):
                    raise ScheduleError(f"merge stage {si} must have exactly one unit per group")
                kinds = {graph.unit(n).kind for n in stage.units}
                datas = {graph.unit(n).attrs.get("data") for n in stage.units}
                if len(kinds) != 1 or len(datas) != 1 or None in datas:
                    raise ScheduleError(f"merge stage {si} merges units of different kinds or inputs: {stage.units}")
        for name, dev in self.unit_devices.items():
            if name not in graph.index or not isinstance(dev, int) or dev < 0:
                raise ScheduleError(f"bad device mapping {name!r} -> {dev!r}")

    def device_class(self) -> str:
        """``cpu``, ``gpu`` or ``any``: the kind of device the schedule was tuned for (from ``device``)."""
        d = self.device.lower()
        if not d or d.startswith("unit"):
            return "any"
        if d.startswith(("sim:cpu", "measured:cpu", "cpu", "table:cpu")):
            return "cpu"
        return "gpu"

    def check_device(self, device_kind: str, allow_mismatch: bool = False) -> None:
        """Refuse a schedule tuned for another kind of device (its stage costs were for that device)."""
        target_class = "cpu" if device_kind == "cpu" else "gpu"
        mine = self.device_class()
        if mine not in ("any", target_class) and not allow_mismatch:
            raise ScheduleError(
                f"schedule was tuned for {self.device!r} ({mine}) but the target is {device_kind} ({target_class}); "
                "re-run the scheduler for this target, or pass allow_device_mismatch=True to apply it anyway"
            )

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict:
        return {
            "format": SCHEDULE_FORMAT,
            "version": SCHEDULE_VERSION,
            "model": self.model_name,
            "graph_fingerprint": self.graph_fingerprint,
            "scheduler": self.scheduler,
            "device": self.device,
            "batch": self.batch,
            "predicted_latency": self.predicted_latency,
            "sequential_latency": self.sequential_latency,
            "measured_latency": self.measured_latency,
            "options": self.options,
            "search": self.search,
            "unit_devices": self.unit_devices,
            "units": self.units,
            "stages": [s.to_json() for s in self.stages],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically: a failure never leaves a half-written file over a previous good one."""
        atomic_write_text(path, self.dumps())

    @staticmethod
    def from_json(d: object) -> "Schedule":
        if not isinstance(d, dict) or d.get("format") != SCHEDULE_FORMAT:
            raise ScheduleFileError("not a tvm-interop schedule file (missing 'format': 'tvm-interop-schedule')")
        version = d.get("version")
        if version != SCHEDULE_VERSION:
            raise ScheduleFileError(
                f"schedule file version {version!r} is not supported (this tvm-interop reads version {SCHEDULE_VERSION})"
            )
        try:
            stages = [Stage.from_json(s) for s in d["stages"]]
            return Schedule(
                stages=stages,
                graph_fingerprint=str(d.get("graph_fingerprint", "")),
                model_name=str(d.get("model", "")),
                scheduler=str(d.get("scheduler", "")),
                device=str(d.get("device", "")),
                batch=d.get("batch"),
                predicted_latency=d.get("predicted_latency"),
                sequential_latency=d.get("sequential_latency"),
                measured_latency=d.get("measured_latency"),
                unit_devices={str(k): int(v) for k, v in (d.get("unit_devices") or {}).items()},
                options=dict(d.get("options") or {}),
                search=dict(d.get("search") or {}),
                units=list(d.get("units") or []),
            )
        except ScheduleError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ScheduleFileError(f"schedule file is malformed: {type(e).__name__}: {e}") from None

    @staticmethod
    def loads(text: str) -> "Schedule":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScheduleFileError(f"schedule file is not valid JSON (truncated or corrupt?): {e}") from None
        return Schedule.from_json(d)

    @staticmethod
    def load(path: str | os.PathLike) -> "Schedule":
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            raise ScheduleFileError(f"{path}: not a text file, so not a schedule") from None
        except OSError as e:
            raise ScheduleFileError(f"cannot read schedule file {path}: {e.strerror}") from None
        return Schedule.loads(text)

    def describe(self) -> str:
        """A human-readable rendering, one line per stage."""
        lines = [
            f"schedule for {self.model_name or 'model'} by {self.scheduler or '?'}: {self.num_stages} stages, "
            f"{len(self.unit_order())} units"
            + (f", predicted {self.predicted_latency * 1e3:.3f} ms" if self.predicted_latency else "")
            # passes.in_order's option (named here, not imported: that module builds on this one)
            + ("; a CPU build runs each stage's groups one after another" if self.options.get("groups_in_order")
               else "")
        ]
        for i, s in enumerate(self.stages):
            groups = " | ".join(", ".join(g) for g in s.groups)
            lat = f"  [{s.predicted_latency * 1e3:.3f} ms]" if s.predicted_latency else ""
            lines.append(f"  {i:3d} {s.strategy:10s} {groups}{lat}")
        return "\n".join(lines)


def sequential_stages(order: Iterable[str]) -> list[Stage]:
    """One single-unit stage per unit, in the given order."""
    return [Stage([[n]]) for n in order]


def concatenate(parts: Sequence[list[Stage]]) -> list[Stage]:
    out: list[Stage] = []
    for p in parts:
        out.extend(p)
    return out


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write to a temporary file in the same folder, then rename over the target."""
    from tvm_interop.runtime import atomic

    atomic.write_text(path, text)
