"""Measured cost model: stage latency is timed on this machine with the kernels that will really run.

IOS's central idea: the scheduler asks the device, not a formula. Each distinct stage is built from the units'
TVM kernels and timed by ``runtime.stage_timer`` (the same worker-thread executor that ships; warm-up, repeats,
median). Results go to a persistent cache so later compiles of the same model (or models sharing kernels) do not
measure again. See ``passes.cost.cache`` for the cache's keys and its refusal of foreign files.
"""
from __future__ import annotations

import logging
import os
import platform
from typing import Sequence

import tvm

from runtime.stage_timer import KernelCall, StageTimer

from ..graph import Unit
from .base import CostModel
from .cache import CostCache, default_cache_path

log = logging.getLogger(__name__)


def _structural_hash(obj) -> int:
    """Structural hash of an IR object (moved from tvm.ir to tvm_ffi in TVM 0.27)."""
    fn = getattr(getattr(tvm, "ir", None), "structural_hash", None)
    if fn is None:
        from tvm_ffi import structural_hash as fn
    return int(fn(obj))


def cpu_fingerprint() -> str:
    """Identifies the measuring machine: CPU model, usable cores, TVM version, executor."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cores = os.cpu_count() or 1
    return f"cpu:{model}:{cores}cores"


class MeasuredCostModel(CostModel):
    """Times stages of a Program's units on the CPU with worker threads.

    ``program``: the extracted Program (its prepared module supplies the PrimFuncs). Kernels are built once
    (``tvm.compile`` of the prepared module; every PrimFunc becomes a callable symbol). ``cache``: a path, a
    CostCache, or None for the default location; ``use_cache=False`` measures everything afresh.
    """

    def __init__(self, program, target: "str | tvm.target.Target" = "llvm", cache=None, use_cache: bool = True,
                 warmup: int = 2, repeat: int = 7, library=None, batch: int | None = None):
        self.program = program
        self.target = tvm.target.Target(target) if isinstance(target, str) else target
        if self.target.kind.name not in ("llvm", "c"):
            raise NotImplementedError(
                "in-process measurement runs CPU kernels; for a GPU use a profiling bundle (cost 'table:FILE')")
        self.name = "measured:" + cpu_fingerprint()
        self.batch = batch
        self._library = library
        self._timer: StageTimer | None = None
        self.warmup, self.repeat = warmup, repeat
        self._func_hash: dict[str, str] = {}
        if isinstance(cache, CostCache):
            self.cache = cache
        else:
            self.cache = CostCache(cache or default_cache_path(), device=self.name,
                                   tvm_version=tvm.__version__) if use_cache else None
        self._memo: dict[tuple, float] = {}
        self.cache_hits = 0

    @property
    def device_fingerprint(self) -> str:
        return self.name

    # ------------------------------------------------------------------ kernels
    def _timer_ready(self) -> StageTimer:
        if self._timer is None:
            from runtime.model import _kernel_library, _lookup

            if self._library is None:
                self._library = tvm.compile(self.program.mod, self.target)
            lib = _kernel_library(self._library)
            self._timer = StageTimer(lambda n: _lookup(lib, n), warmup=self.warmup, repeat=self.repeat)
        return self._timer

    def _kernel_hash(self, func_name: str) -> str:
        if func_name not in self._func_hash:
            func = self.program.mod[func_name]
            self._func_hash[func_name] = f"{_structural_hash(func) & 0xFFFFFFFFFFFF:012x}"
        return self._func_hash[func_name]

    def _call(self, unit: Unit) -> KernelCall:
        call = self.program.calls[unit.name]
        return KernelCall(call.func_name, tuple((tuple(t.shape), t.dtype) for t in unit.inputs),
                          tuple((tuple(t.shape), t.dtype) for t in unit.outputs))

    def _signature(self, unit: Unit) -> str:
        shapes = ";".join(f"{'x'.join(map(str, t.shape))}{t.dtype}" for t in unit.inputs + unit.outputs)
        return f"{self._kernel_hash(unit.func_name)}[{shapes}]"

    # ------------------------------------------------------------------ CostModel
    def unit_latency(self, unit: Unit) -> float:
        return self.stage_latency([[unit]])

    def stage_latency(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> float:
        if strategy == "merge":
            # Until the merged kernel exists, a merge stage runs as concurrent single-unit groups.
            groups = [[u] for g in groups for u in g]
        sig_groups = tuple(sorted(tuple(self._signature(u) for u in g) for g in groups))
        key = (strategy, sig_groups)
        if key in self._memo:
            return self._memo[key]
        cache_key = f"{strategy}|{'|'.join(','.join(g) for g in sig_groups)}|b{self.batch}"
        value = self.cache.get(cache_key) if self.cache is not None else None
        if value is not None:
            self.cache_hits += 1
        else:
            value = self._timer_ready().time_stage([[self._call(u) for u in g] for g in groups])
            if self.cache is not None:
                self.cache.put(cache_key, value)
        self._memo[key] = value
        return value

    # ------------------------------------------------------------------ reporting
    @property
    def measurements(self) -> int:
        return self._timer.measurements if self._timer else 0

    @property
    def seconds_spent(self) -> float:
        return self._timer.seconds_spent if self._timer else 0.0

    def stats(self) -> dict:
        return {"measurements": self.measurements, "measure_seconds": self.seconds_spent,
                "cache_hits": self.cache_hits, "cache": None if self.cache is None else str(self.cache.path)}

    def close(self) -> None:
        if self.cache is not None:
            self.cache.flush()
        if self._timer is not None:
            self._timer.close()
