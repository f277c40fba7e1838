"""A profiling bundle measured on a fleet: its stages split into chunks, each chunk timed on a free device.

The result is the same cost table as ``tvm-interop profile-measure`` writes on one machine
(``runtime.profile_bundle``), keyed by the fingerprint the devices reported (not this machine's), plus a
``fleet`` record of which devices measured how many stages, what was lost and retried, and what was refused.
A chunk whose device dies is measured again elsewhere; the table is written once, atomically, at the end, so
an interrupted job leaves no half table behind.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass

from tvm_interop.runtime.profile_bundle import load_bundle, stage_key, unit_row

from .device import RemoteDevice
from .pool import Fleet
from .tracker import FleetError


@dataclass
class BundleJob:
    """Measures chunks of stage indices of one bundle (uploaded once per session)."""

    bundle_dir: str
    options: dict
    call_timeout: float
    name: str = "profiling bundle"

    def __post_init__(self):
        self.plan = load_bundle(self.bundle_dir)
        self.plan_path = os.path.join(self.bundle_dir, "bundle.json")
        self.lib_path = os.path.join(self.bundle_dir, self.plan["library"])

    def run(self, device: RemoteDevice, item: tuple[list[int], list[int]]) -> dict:
        indices, program_indices = item
        kind = self.options.get("device") or self.plan["device"]
        if device.info.get("device_kind") != kind:
            raise FleetError(f"{device.address} measures on {device.info.get('device_kind')!r}, the bundle wants "
                             f"{kind!r} (built for {self.plan.get('target')})")
        plan_name = device.upload(self.plan_path, timeout=self.call_timeout)
        lib_name = device.upload(self.lib_path, timeout=self.call_timeout)
        opts = {**self.options, "indices": indices, "program_indices": program_indices}
        text = device.call("measure_bundle", plan_name, lib_name, json.dumps(opts), timeout=self.call_timeout)
        table = json.loads(text)
        table["measured_by"] = device.address
        return table


def chunk_indices(n: int, devices: int, chunk: int | None = None) -> list[list[int]]:
    """Stage indices in chunks: by default about four chunks per device (so a lost device costs little and the
    devices finish together), at most 64 stages each."""
    size = chunk or max(1, min(64, math.ceil(n / max(1, 4 * devices))))
    return [list(range(i, min(n, i + size))) for i in range(0, n, size)]


def measure_bundle_on_fleet(bundle_dir: str, fleet: Fleet, *, method: str | None = None, device: str | None = None,
                            repeat: int = 20, number: int = 10, warmup: int = 3, chunk: int | None = None,
                            limit: int | None = None, out: str | None = None,
                            device_clock: bool | None = None) -> dict:
    """Measure the bundle's stages on ``fleet`` (started here if needed); returns (and writes to ``out``) the
    cost table. ``device_clock``: as ``runtime.profile_bundle.measure_plan`` (None: each device's default)."""
    t0 = time.perf_counter()
    options = {"repeat": repeat, "number": number, "warmup": warmup}
    if device_clock is not None:
        options["device_clock"] = bool(device_clock)
    if method:
        options["method"] = method
    if device:
        options["device"] = device
    job = BundleJob(bundle_dir, options, fleet.options.call_timeout)
    fleet.start()
    n = len(job.plan["stages"]) if not limit else min(limit, len(job.plan["stages"]))
    # stage chunks, then each whole program on its own (a program is one long measurement)
    items = [(c, []) for c in chunk_indices(n, len(fleet.devices), chunk)]
    items += [([], [k]) for k in range(len(job.plan.get("programs", [])) if not limit else 0)]
    parts = fleet.map(job, items)
    table = merge_tables(parts)
    table["seconds"] = time.perf_counter() - t0
    table["fleet"] = fleet.report()
    if out:
        from tvm_interop.runtime import atomic

        atomic.write_json(out, table)
    return table


def merge_tables(parts: list[dict]) -> dict:
    """One cost table from tables of disjoint stage chunks (all from devices of one fingerprint)."""
    if not parts:
        raise FleetError("nothing was measured")
    prints = {p["device"] for p in parts}
    if len(prints) > 1:   # the fleet refuses foreign devices; this is the last line of defence
        raise FleetError(f"chunks measured on different devices: {sorted(prints)}")
    table = {k: v for k, v in parts[0].items()
             if k not in ("stages", "units", "seconds", "measured_by", "device_clock")}
    rows = sorted((row for p in parts for row in p["stages"]), key=lambda r: r["index"])
    table["stages"] = rows
    # a unit's own row is its concurrent one-unit stage; its library call ("library" strategy) is another row
    table["units"] = {unit_row(r): r["latency"] for r in rows if unit_row(r) is not None}
    table["programs"] = sorted((row for p in parts for row in p.get("programs", [])), key=lambda r: r["index"])
    assert all(r["key"] == stage_key(r["groups"], r.get("strategy", "concurrent")) for r in rows)
    clocks = [p["device_clock"] for p in parts if "device_clock" in p]
    if clocks:
        table["device_clock"] = _merge_clock_summaries(clocks)
    return table


def _merge_clock_summaries(clocks: list[dict]) -> dict:
    """The device-clock summary of a merged table: counts add up; a chunk whose device skipped the clock is kept
    as the reason (its rows have no device times)."""
    timed = [c for c in clocks if "skipped" not in c]
    if not timed:
        return dict(clocks[0])
    merged = {k: v for k, v in timed[0].items() if not isinstance(v, int)}
    for k in ("held", "not_held", "stages_without", "programs_without"):
        merged[k] = sum(int(c.get(k, 0)) for c in timed)
    skipped = [c["skipped"] for c in clocks if "skipped" in c]
    if skipped:
        merged["chunks_skipped"] = len(skipped)   # their rows have no device times
        merged["chunks_skipped_because"] = skipped[0]
    return merged
