"""MetaSchedule runner that times tuning candidates on a fleet (``tvm-interop tune --rpc HOST:PORT``).

Candidates are built here (``InProcessBuilder(export=True)`` writes each as a ``.so``); every candidate of a batch
is a fleet item, so a batch is spread over all free devices of the key at once. On the device the server loads
the candidate and times its entry function with ``time_evaluator`` on random arguments (number / repeat /
min_repeat_ms as MetaSchedule's ``EvaluatorConfig``), as MetaSchedule's own runners do. A candidate whose device
dies is timed again on another one (``passes.fleet.pool``); a candidate that fails on a device that still
answers is a failed candidate, as locally.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from concurrent.futures import Future
from dataclasses import dataclass

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RunnerInput, RunnerResult
from tvm.s_tir.meta_schedule.runner.runner import PyRunner, PyRunnerFuture

from ..kernels.fast_builder import BuildStats, args_info_json
from .device import RemoteDevice
from .pool import Fleet


@dataclass
class KernelJob:
    options: dict
    call_timeout: float
    name: str = "tuning candidate"

    def run(self, device: RemoteDevice, item: tuple[str, list]) -> list[float]:
        path, args_info = item
        remote = device.upload(path, timeout=self.call_timeout)
        text = device.call("time_kernel", remote, json.dumps(args_info), json.dumps(self.options),
                           timeout=self.call_timeout)
        return [float(x) for x in json.loads(text)]


@derived_object
class FleetRunnerFuture(PyRunnerFuture):
    def __init__(self, future: Future, stats: BuildStats, t0: float):
        super().__init__()
        self.future, self.stats, self.t0 = future, stats, t0
        self._result = None

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> RunnerResult:
        if self._result is None:
            try:
                secs = self.future.result()
                self._result = RunnerResult(secs, None)
            except Exception as err:  # noqa: BLE001 - a failed candidate is a result
                self._result = RunnerResult(None, f"FleetRunner: {err}")
            self.stats.add_run(time.perf_counter() - self.t0, self._result.error_msg is None)
        return self._result


@derived_object
class FleetRunner(PyRunner):
    """Times MetaSchedule candidates on ``fleet``. ``evaluator_config``: as ``LocalRunner`` (number 3, repeat 1,
    min_repeat_ms 100 by default)."""

    def __init__(self, fleet: Fleet, evaluator_config: EvaluatorConfig | None = None, stats: BuildStats | None = None):
        super().__init__()
        self.fleet = fleet
        cfg = EvaluatorConfig._normalized(evaluator_config)
        self.job = KernelJob({"number": cfg.number, "repeat": cfg.repeat, "min_repeat_ms": cfg.min_repeat_ms},
                             fleet.options.call_timeout)
        self.stats = stats or BuildStats()

    def run(self, runner_inputs: list[RunnerInput]):
        t0 = time.perf_counter()
        out = []
        for ri in runner_inputs:
            item = (str(ri.artifact_path), args_info_json(ri.args_info))
            out.append(FleetRunnerFuture(self.fleet.submit(self.job, item), self.stats, t0))
        return out

    def time_module(self, rt_mod, args_info, target) -> list[float]:
        """Seconds per repeat of a module built here for ``target`` (an untuned baseline), timed like a
        candidate."""
        from ..kernels.fast_builder import export_candidate

        tmp = tempfile.mkdtemp(prefix="tvm_interop_fleet_")
        try:
            path = os.path.join(tmp, "baseline.so")
            export_candidate(rt_mod, path, target)
            return self.fleet.submit(self.job, (path, args_info_json(args_info))).result()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

