"""Time one stage of kernels on the device, exactly as the executor will run it.

A stage is a list of groups; a group is a list of kernel calls run in order. We build a one-stage
ExecutionPlan whose arguments are freshly allocated random tensors and run it with the same ThreadExecutor the
deployed model uses (so what is measured is what ships): warm-up runs, then ``repeat`` timed runs, and the
median (robust to the noise of a shared machine) is the stage latency.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .plan import Call, ExecutionPlan
from .thread_executor import ThreadExecutor, WorkerPool


@dataclass(frozen=True)
class KernelCall:
    """A kernel and the shapes/dtypes of its arguments and outputs (destination-passing style)."""

    func: str
    args: tuple[tuple[tuple[int, ...], str], ...]
    outs: tuple[tuple[tuple[int, ...], str], ...]


class StageTimer:
    """Measures stages with worker threads (CPU). ``lookup_kernel(name)`` returns a callable TVM function."""

    def __init__(self, lookup_kernel: Callable[[str], object], device=None, warmup: int = 2, repeat: int = 7,
                 min_seconds: float = 0.0, seed: int = 0):
        import tvm

        self.lookup_kernel = lookup_kernel
        self.device = device if device is not None else tvm.cpu(0)
        self.warmup = warmup
        self.repeat = repeat
        self.min_seconds = min_seconds
        self.rng = np.random.default_rng(seed)
        self.pool = WorkerPool()
        self.measurements = 0
        self.seconds_spent = 0.0
        self._tensors: dict[tuple, list] = {}

    def _tensor(self, shape, dtype, k: int):
        """Random tensors, reused across measurements (k-th tensor of that shape) to keep allocation cheap."""
        import tvm

        key = (tuple(shape), dtype)
        pool = self._tensors.setdefault(key, [])
        while len(pool) <= k:
            if "float" in dtype:
                data = self.rng.standard_normal(shape).astype(dtype)
            else:
                data = np.zeros(shape, dtype)
            pool.append(tvm.runtime.tensor(data, self.device))
        return pool[k]

    def _executor(self, groups: Sequence[Sequence[KernelCall]]) -> ThreadExecutor:
        """A one-stage program over ``groups`` (random arguments from the pool), on the shipped executor."""
        constants = []
        buffers = []
        calls = []
        stage = []
        used: dict[tuple, int] = {}
        for g in groups:
            gi = []
            for kc in g:
                args = []
                for shape, dtype in kc.args:
                    key = (tuple(shape), dtype)
                    k = used.get(key, 0)
                    used[key] = k + 1
                    args.append(["c", len(constants)])
                    constants.append(self._tensor(shape, dtype, k))
                outs = []
                for shape, dtype in kc.outs:
                    outs.append(len(buffers))
                    buffers.append({"shape": list(shape), "dtype": dtype, "storage": len(buffers)})
                gi.append(len(calls))
                calls.append(Call(kc.func, kc.func, args, outs))
            stage.append(gi)
        plan = ExecutionPlan(inputs=[], num_constants=len(constants), buffers=buffers, calls=calls, stages=[stage],
                             deps=[[] for _ in calls], output=[])
        return ThreadExecutor(plan, self.lookup_kernel, constants, self.device, workers=self.pool)

    def time_stage(self, groups: Sequence[Sequence[KernelCall]]) -> float:
        """Median seconds of one stage (all groups started together, calls in a group in order)."""
        return self.time_stages([groups])[0]

    def time_stages(self, stages: Sequence[Sequence[Sequence[KernelCall]]], repeat: int | None = None) -> list[float]:
        """Median seconds of each of ``stages``, timed in interleaved repeats (one run of each per round;
        ``repeat`` rounds at least, default the timer's).

        Why interleaved: this host's speed moves by up to 2x between minutes, so two forms of one stage timed
        minutes apart (the search's timing of the stage, then wave fusion's timing of it fused) compare the
        host's phases as much as the forms. Timed round robin, every form sees the same phases."""
        t_start = time.perf_counter()
        executors = [self._executor(groups) for groups in stages]
        try:
            for ex in executors:
                for _ in range(self.warmup):
                    ex.run_raw()
            times: list[list[float]] = [[] for _ in executors]
            t_begin = time.perf_counter()
            rounds = self.repeat if repeat is None else repeat
            while len(times[0]) < rounds or (time.perf_counter() - t_begin) < self.min_seconds:
                for ex, ts in zip(executors, times):
                    t0 = time.perf_counter()
                    ex.run_raw()
                    ts.append(time.perf_counter() - t0)
        finally:
            for ex in executors:
                ex.close()
        self.measurements += len(stages)
        self.seconds_spent += time.perf_counter() - t_start
        return [float(np.median(ts)) for ts in times]

    def close(self) -> None:
        self.pool.close()
