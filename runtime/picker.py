"""Pick the fastest candidate program of a library by timing them on this device (runtime only).

A GPU library built by ``passes.build`` carries several programs over the same kernels (``plan.meta
["candidates"]``: the schedule in both synchronisation modes and sequential, each with direct launches and as a
CUDA graph). Which is fastest depends on the device, so it is measured here, never predicted: every candidate
runs ``warmup`` times, then ``rounds`` rounds time each candidate once per round in a rotating order
(interleaved, so drift of a shared machine hits all of them alike), with a device sync after each run. The
candidate with the lowest median ships; a tie within 1% keeps the earlier candidate in the library's order
(the compiled schedule's default first, sequential last).

The decision can be kept beside the library (``m.so.pick.json``, written by ``tvm-interop pick m.so``): it names
the library by its SHA-256 and the device by name, and is used only when both match.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import ExportError, InteropError
from .plan import device_tensors

log = logging.getLogger(__name__)

PICK_SUFFIX = ".pick.json"
PICK_VERSION = 1
TIE = 0.01


@dataclass
class PickReport:
    """The decision and the timings behind it (milliseconds)."""

    choice: str
    default: str | None
    device: str
    rounds: int
    timings: dict = field(default_factory=dict)   # name -> {"median_ms", "min_ms", "runs"}
    seconds: float = 0.0
    library_sha256: str | None = None
    version: int = PICK_VERSION

    def speedup_over(self, name: str) -> float | None:
        a, b = self.timings.get(name), self.timings.get(self.choice)
        return a["median_ms"] / b["median_ms"] if a and b and b["median_ms"] > 0 else None

    def summary(self) -> str:
        best = self.timings[self.choice]["median_ms"]
        text = f"picked {self.choice}: {best:.3f} ms median over {self.rounds} interleaved rounds"
        seq = [t["median_ms"] for n, t in self.timings.items() if n.startswith("sequential")]
        if seq and best > 0:
            text += f" (sequential {min(seq):.3f} ms: {min(seq) / best:.2f}x)"
        return text

    def to_json(self) -> dict:
        return asdict(self)


def device_name(model) -> str:
    """What a pick is valid for: the GPU's name and compute capability, or this CPU's identity."""
    if model.device_kind == "cpu":
        from .machine import cpu_identity

        return cpu_identity()
    dev = model.device()
    return f"{model.device_kind}:{dev.device_name}:sm_{str(dev.compute_version).replace('.', '')}"


def _sync(model) -> None:
    if model.device_kind != "cpu":
        model.device().sync()


def time_candidates(model, inputs, names: list[str], rounds: int = 10, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per run of each candidate, ``rounds`` interleaved rounds after ``warmup`` runs of each."""
    if rounds < 1:
        raise InteropError("rounds must be >= 1")
    dev = model.device()
    args = device_tensors(inputs, dev)
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:
        model.select_candidate(n)
        for _ in range(warmup):
            model.run(*args, numpy=False)
        _sync(model)
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            model.select_candidate(n)
            t0 = time.perf_counter()
            model.run(*args, numpy=False)
            _sync(model)
            times[n].append(time.perf_counter() - t0)
    return times


def choose(times: dict[str, list[float]], order: list[str]) -> str:
    """The lowest median; within ``TIE`` of it, the earliest in ``order``."""
    med = {n: float(np.median(t)) for n, t in times.items()}
    best = min(med.values())
    return next(n for n in order if n in med and med[n] <= best * (1 + TIE))


def pick_fastest(model, inputs, rounds: int = 10, warmup: int = 2, names: list[str] | None = None) -> PickReport:
    """Time the candidates of ``model`` on its device, select the fastest (``model.candidate``) and return the
    report (also kept as ``model.pick_report``)."""
    cands = [c["name"] for c in model.candidates]
    names = names or cands
    unknown = [n for n in names if n not in cands]
    if unknown:
        raise InteropError(f"unknown candidate(s) {', '.join(unknown)}; the library has {', '.join(cands)}")
    if not names:
        raise InteropError("this library carries no candidate programs (it was built without them)")
    default = model.plan.meta.get("default_candidate")
    order = ([default] if default in names else []) + [n for n in names if n != default]
    order = [n for n in order if not n.startswith("sequential")] + [n for n in order if n.startswith("sequential")]
    t0 = time.perf_counter()
    previous_pick, model.pick = model.pick, "off"   # no recursion: run() would pick again
    try:
        times = time_candidates(model, inputs, order, rounds=rounds, warmup=warmup)
    finally:
        model.pick = previous_pick
    choice = choose(times, order)
    model.select_candidate(choice)
    report = PickReport(choice=choice, default=default, device=device_name(model), rounds=rounds,
                        timings={n: {"median_ms": float(np.median(t)) * 1e3, "min_ms": float(np.min(t)) * 1e3,
                                     "runs": len(t)} for n, t in times.items()},
                        seconds=time.perf_counter() - t0)
    model.pick_report = report
    log.info("candidate programs: %s", report.summary())
    return report


# ---------------------------------------------------------------------------------------------- pick files
def pick_path(library_path: str) -> str:
    return os.fspath(library_path) + PICK_SUFFIX


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_pick(report: PickReport, library_path: str) -> str:
    """Write the decision beside the library (atomically); returns the file's path."""
    report.library_sha256 = file_sha256(library_path)
    from . import atomic

    path = pick_path(library_path)
    atomic.write_json(path, report.to_json())
    return path


def read_pick_file(library_path: str) -> PickReport | None:
    """The pick file beside a library as written, or None when there is none; whatever library and device it
    was measured for. A file that is not a pick file, or of another version, is a clear error."""
    path = pick_path(library_path)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        report = PickReport(**data)
        if report.choice not in report.timings:
            raise ValueError(f"its choice {report.choice!r} has no timing")
    except (OSError, ValueError, TypeError) as e:
        raise ExportError(f"{path} is not a candidate pick file ({e}); delete it or run `tvm-interop pick "
                          f"{library_path}` again") from None
    if report.version != PICK_VERSION:
        raise ExportError(f"{path} has pick-file version {report.version}, this runtime reads {PICK_VERSION}; "
                          f"run `tvm-interop pick {library_path}` again")
    return report


def load_pick(library_path: str, device: str) -> PickReport | None:
    """The saved decision for this library on this device, or None (no file, another library, another device:
    logged). A file that is not a pick file is a clear error."""
    report = read_pick_file(library_path)
    if report is None:
        return None
    path = pick_path(library_path)
    if report.library_sha256 != file_sha256(library_path):
        log.warning("%s was written for another build of this library; ignoring it (run `tvm-interop pick` again)",
                    path)
        return None
    if report.device != device:
        log.warning("%s was measured on %s, this is %s; ignoring it", path, report.device, device)
        return None
    return report
