"""The never-slower guard on a fleet device: scheduled and sequential plans timed against each other there.

All plans of one comparison run on one device, interleaved (``runtime.plan_timer`` on the device server), so
that noise hits them alike; which device is whichever the tracker hands out. Libraries are exported here and
uploaded; plans travel as their JSON.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass

from .device import RemoteDevice
from .pool import Fleet
from .tracker import FleetError
from tvm_interop.runtime.model import export_library


@dataclass
class _PlansJob:
    files: dict          # run name -> (local library path, plan JSON text)
    options: dict
    call_timeout: float
    name: str = "guard"

    def run(self, device: RemoteDevice, _item) -> dict:
        if device.info.get("device_kind") != "cpu":
            raise FleetError(f"the guard times CPU plans; {device.address} is a {device.info.get('device_kind')} "
                             "device")
        runs = {k: [device.upload(lib, timeout=self.call_timeout), plan] for k, (lib, plan) in self.files.items()}
        return json.loads(device.call("time_plans", json.dumps(runs), json.dumps(self.options),
                                      timeout=self.call_timeout))


def compare_libraries_on_fleet(fleet: Fleet, runs: dict, repeat: int = 15, warmup: int = 2,
                               seed: int = 0) -> dict[str, list[float]]:
    """``runs``: name -> ``(library, plan)`` as for ``passes.guard.compare_libraries``; seconds per run per name,
    measured on one device of ``fleet``."""
    tmp = tempfile.mkdtemp(prefix="tvm_interop_fleet_guard_")
    try:
        exported: dict[int, str] = {}
        files = {}
        for k, (library, plan) in runs.items():
            if id(library) not in exported:
                path = os.path.join(tmp, f"model{len(exported)}.so")
                export_library(library, path)
                exported[id(library)] = path
            files[k] = (exported[id(library)], plan.dumps())
        job = _PlansJob(files, {"repeat": repeat, "warmup": warmup, "seed": seed}, fleet.options.call_timeout)
        fleet.start()
        return fleet.submit(job, None).result()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
