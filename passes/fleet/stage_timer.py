"""Stage timing on a fleet: the measured cost model (``cost="measured"`` / ``learned``) with ``--rpc``.

Same interface as ``runtime.stage_timer.StageTimer`` (``time_stage(groups)``, ``measurements``,
``seconds_spent``, ``close``), so ``passes.cost.measured.MeasuredCostModel`` uses it unchanged: the model's
kernels (and the merged kernels built for merge stages) are exported here and uploaded once per device session;
each stage is timed on whichever device of the fleet is free, on its worker threads, exactly as the local timer
does on this machine (``tvm_interop.rpc.time_stage`` runs ``runtime.stage_timer`` there).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from typing import Sequence

from tvm_interop.runtime.stage_timer import KernelCall

from .device import RemoteDevice
from .pool import Fleet
from .tracker import FleetError


class RemoteStageTimer:
    name = "stage timing"

    def __init__(self, fleet: Fleet, library, warmup: int = 2, repeat: int = 7):
        fleet.start()
        kind = fleet.devices[0].info.get("device_kind") if fleet.devices else None
        if kind != "cpu":
            raise FleetError(f"stage timing on a fleet runs CPU worker threads; the devices under key "
                             f"{fleet.key!r} are {kind!r}: for a GPU, measure a profiling bundle "
                             "(tvm-interop profile-measure --rpc) and schedule with cost='table:FILE'")
        self.fleet = fleet
        self.options = {"warmup": warmup, "repeat": repeat}
        self._tmp = tempfile.mkdtemp(prefix="tvm_interop_fleet_kernels_")
        self.libraries: list[str] = []
        self.measurements = 0
        self.seconds_spent = 0.0
        self.add_library(library)

    def add_library(self, module) -> None:
        """Export a compiled module (the model's kernels, or merged kernels) for upload to every session."""
        path = os.path.join(self._tmp, f"kernels{len(self.libraries)}.so")
        module.export_library(path)
        self.libraries.append(path)

    def run(self, device: RemoteDevice, groups: list) -> float:   # the fleet job
        names = [device.upload(p, timeout=self.fleet.options.call_timeout) for p in self.libraries]
        return float(device.call("time_stage", json.dumps(names), json.dumps(groups), json.dumps(self.options),
                                 timeout=self.fleet.options.call_timeout))

    def time_stage(self, groups: Sequence[Sequence[KernelCall]]) -> float:
        t0 = time.perf_counter()
        payload = [[[kc.func, [[list(s), d] for s, d in kc.args], [[list(s), d] for s, d in kc.outs]] for kc in g]
                   for g in groups]
        value = self.fleet.submit(self, payload).result()
        self.measurements += 1
        self.seconds_spent += time.perf_counter() - t0
        return value

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
