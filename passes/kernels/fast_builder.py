"""MetaSchedule builder and runner that work inside the tuning process.

MetaSchedule's stock ``LocalBuilder`` starts a fresh pool of worker processes for every batch of candidates, and
each worker imports ``tvm.s_tir.tensor_intrin`` (every tensor intrinsic TVM knows, CUDA's included) before it
builds anything: 40 s to 3 min per batch on a loaded 2-core machine, so its 30 s default timeout fails every
build. Its ``LocalRunner`` keeps one worker process alive, but needs ``cloudpickle`` and pays ``import tvm``
(~10 s) at start. Here:

:class:`InProcessBuilder`
    builds each candidate with ``tvm.tirx.build`` in the calling process (a thread pool of ``max_workers``; TVM's
    lowering and LLVM code generation run in C++). By default (``export=False``) the built module stays in memory
    and is handed to :class:`InProcessRunner` through a registry keyed by the artifact path (a placeholder file
    in a temporary directory, which MetaSchedule's ``RemoveBuildArtifact`` callback deletes as usual); no
    ``.so`` is written and no linker runs. ``export=True`` writes a real shared library instead, for the stock
    ``LocalRunner`` or an RPC runner.
:class:`InProcessRunner`
    times each built module with ``time_evaluator`` in this process, with MetaSchedule's argument allocation and
    evaluator config (so its numbers are the ones ``LocalRunner`` would report). A candidate that crashed would
    take the tuner with it; MetaSchedule's CPU candidates are produced by checked schedule primitives, and the
    tuning database stays consistent (see ``passes.kernels.tuning``).
:func:`tensor_intrinsics_for`
    ``TuneContext`` imports ``tvm.s_tir.tensor_intrin`` unconditionally. Within this context only the tensor
    intrinsics of the target's family are imported (x86: 1 s instead of 1-3 min), with TVMScript's frame
    inspection made cheap (``passes.kernels.tvmscript_frames``: CUDA's 13.8 -> 3.3 s); the full package can still
    be imported normally afterwards.

:class:`TimedBuilder` / :class:`TimedRunner`
    wrap any builder / synchronous runner (the stock ones included) to count their wall time, for comparisons.

Measured on the 2-core EPYC dev machine (busy, load ~3.5), 3x3 conv 64->64 at 56x56, 16 trials in batches of 8:
the stock ``LocalBuilder`` (2 worker processes, timeout raised to 1800 s) spends 28.8 s per candidate (about 230 s
per batch, mostly the workers' imports); :class:`InProcessBuilder` 0.30 s, and a whole trial (search + build +
run) costs 1.1 s instead of 30 s. Reproduce with ``python -m tvm_interop.passes.kernels.tuning --help``.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import types
from concurrent.futures import ThreadPoolExecutor

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RunnerInput
from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture
from tvm.s_tir.meta_schedule.runner.runner import PyRunner
from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common, run_evaluator_common

from .tvmscript_frames import cheap_stack_inspection

log = logging.getLogger(__name__)

__all__ = ["InProcessBuilder", "InProcessRunner", "tensor_intrinsics_for", "BuildStats", "build_candidate",
           "measure_module", "export_candidate", "args_info_json"]

_ARTIFACT_FILE = "inprocess.module"
_TENSOR_INTRIN_PKG = "tvm.s_tir.tensor_intrin"


# ----------------------------------------------------------------------------------------------- registry
class _Registry:
    """Built runtime modules waiting for the runner, keyed by artifact path."""

    def __init__(self):
        self._lock = threading.Lock()
        self._mods: dict[str, object] = {}

    def put(self, path: str, mod) -> None:
        with self._lock:
            self._mods[path] = mod

    def pop(self, path: str):
        with self._lock:
            return self._mods.pop(path, None)

    def discard_missing(self) -> None:
        """Drop modules whose artifact directory is gone (RemoveBuildArtifact ran without a runner)."""
        with self._lock:
            for p in [p for p in self._mods if not os.path.exists(os.path.dirname(p))]:
                del self._mods[p]

    def __len__(self) -> int:
        return len(self._mods)


_REGISTRY = _Registry()


class BuildStats:
    """Wall time spent building / running, for reports and benchmarks (thread-safe counters)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.builds = self.build_errors = self.runs = self.run_errors = 0
        self.build_seconds = self.run_seconds = 0.0

    def add_build(self, seconds: float, ok: bool) -> None:
        with self._lock:
            self.builds += 1
            self.build_errors += 0 if ok else 1
            self.build_seconds += seconds

    def add_run(self, seconds: float, ok: bool) -> None:
        with self._lock:
            self.runs += 1
            self.run_errors += 0 if ok else 1
            self.run_seconds += seconds

    def as_dict(self) -> dict:
        return {"builds": self.builds, "build_errors": self.build_errors, "build_seconds": self.build_seconds,
                "runs": self.runs, "run_errors": self.run_errors, "run_seconds": self.run_seconds}


# ----------------------------------------------------------------------------------------------- tensor intrinsics
def _intrin_modules(target) -> list[str]:
    """Submodules of ``tvm.s_tir.tensor_intrin`` that a target's MetaSchedule rules can use."""
    kind = target.kind.name
    if kind == "llvm":
        triple = str(target.attrs.get("mtriple", "") or "")
        if not triple:
            try:
                triple = str(tvm.target.codegen.llvm_get_system_triple())
            except Exception:  # noqa: BLE001 - no LLVM: assume the host is x86
                triple = "x86_64"
        triple = triple.lower()
        if triple.startswith(("aarch64", "arm")):
            return ["arm_cpu"]
        if triple.startswith("riscv"):
            return ["riscv_cpu"]
        if triple.startswith("hexagon"):
            return ["hexagon"]
        return ["x86"]
    return {"cuda": ["cuda"], "rocm": ["rocm"], "metal": ["metal"], "hexagon": ["hexagon"]}.get(kind, [])


@contextlib.contextmanager
def tensor_intrinsics_for(target):
    """Within this context, ``import tvm.s_tir.tensor_intrin`` registers only ``target``'s intrinsics.

    If the package is already imported, nothing changes. Otherwise a package placeholder (the real package's path,
    without running its ``__init__``) is put in ``sys.modules``, the target's submodules are imported into it, and
    on exit the placeholder is removed again, so a later plain import loads the full package (the submodules
    already loaded are reused, nothing is registered twice).
    """
    if _TENSOR_INTRIN_PKG in sys.modules:
        yield
        return
    import tvm.s_tir as s_tir_pkg

    path = os.path.join(os.path.dirname(s_tir_pkg.__file__), "tensor_intrin")
    stub = types.ModuleType(_TENSOR_INTRIN_PKG, "placeholder: only the tuning target's tensor intrinsics")
    stub.__path__ = [path]
    stub.__package__ = _TENSOR_INTRIN_PKG
    stub.__file__ = os.path.join(path, "__init__.py")
    sys.modules[_TENSOR_INTRIN_PKG] = stub
    try:
        t0 = time.perf_counter()
        for sub in _intrin_modules(target if isinstance(target, tvm.target.Target) else tvm.target.Target(target)):
            try:
                with cheap_stack_inspection():   # CUDA's: 13.8 -> 3.3 s (see passes.kernels.tvmscript_frames)
                    importlib.import_module(f"{_TENSOR_INTRIN_PKG}.{sub}")
            except Exception as err:  # noqa: BLE001 - intrinsics are an optimisation, not a requirement
                log.warning("tensor intrinsics %s could not be registered: %s", sub, err)
        log.debug("tensor intrinsics for %s registered in %.1f s", target, time.perf_counter() - t0)
        yield
    finally:
        if sys.modules.get(_TENSOR_INTRIN_PKG) is stub:
            del sys.modules[_TENSOR_INTRIN_PKG]
            parent = sys.modules.get("tvm.s_tir")
            if parent is not None and getattr(parent, "tensor_intrin", None) is stub:
                delattr(parent, "tensor_intrin")


# ----------------------------------------------------------------------------------------------- builder
def build_candidate(mod: tvm.IRModule, target) -> "tvm.runtime.Module":
    """What MetaSchedule's ``default_build`` does, minus the tensor-intrinsic import, and on a CPU through our TIR
    pipeline (``passes.wave.cpu_pipeline``), so that a candidate is timed as the build will compile it (allocations
    of 1-2 KiB on the stack: ``passes.kernels.stack_tiles``)."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    target = tvm.target.Target(target) if isinstance(target, (str, dict)) else target
    if target.kind.name == "llvm":
        from ..wave.cpu_pipeline import cpu_tir_pipeline

        return tvm.tirx.build(mod, target=target, pipeline=cpu_tir_pipeline())
    return tvm.tirx.build(mod, target=target)


def args_info_json(args_info) -> list:
    """MetaSchedule ``ArgInfo`` objects (or their JSON form) as plain JSON lists (``["TENSOR", dtype, shape]``):
    what a candidate measured on another machine carries (``passes.fleet.runner``, ``tuning_bundle``)."""
    def plain(v):
        if isinstance(v, (str, int, float, bool)) or v is None:
            return v
        if hasattr(v, "value"):
            return v.value
        try:
            return [plain(x) for x in v]
        except TypeError:
            return str(v)

    return [plain(a.as_json() if hasattr(a, "as_json") else a) for a in args_info]


def export_candidate(rt_mod, path: str, target) -> None:
    """Write a built candidate as a shared library another process or machine can load with TVM's runtime alone:
    CUDA kernels as binaries for the target's arch (``passes.cuda_compile``), not as source that would need the
    compiler and nvcc at load."""
    kind = target.kind.name if hasattr(target, "kind") else str(target).split()[0]
    if kind == "cuda":
        from ..cuda_compile import export_cuda_library
        from ..target import requested_arches

        export_cuda_library(rt_mod, path, requested_arches(target))
    else:
        rt_mod.export_library(path)


@derived_object
class InProcessBuilder(PyBuilder):
    """Builds MetaSchedule candidates in this process (see the module doc).

    ``max_workers``: build threads (default 1; parts of TVM's lowering run in Python under the GIL, and on a
    2-core machine the runner and the search want the other core anyway). ``export``: write a ``.so`` per candidate (for a subprocess or RPC
    runner) instead of keeping the module in memory for :class:`InProcessRunner`. ``timeout_sec`` is accepted for
    interface compatibility and not enforced (a build cannot be interrupted from Python).
    """

    def __init__(self, max_workers: int = 1, export: bool = False, stats: BuildStats | None = None,
                 tmp_root: str | None = None, timeout_sec: float | None = None):
        super().__init__()
        self.max_workers = max(1, int(max_workers))
        self.export = export
        self.stats = stats or BuildStats()
        self.tmp_root = tmp_root
        self.timeout_sec = timeout_sec

    def _build_one(self, bi: BuilderInput) -> BuilderResult:
        t0 = time.perf_counter()
        tmp = None
        try:
            if bi.params:
                raise ValueError("InProcessBuilder: candidates with bound parameters are not supported")
            rt_mod = build_candidate(bi.mod, bi.target)
            tmp = tempfile.mkdtemp(prefix="tvm_interop_cand_", dir=self.tmp_root)
            if self.export:
                path = os.path.join(tmp, "candidate.so")
                export_candidate(rt_mod, path, bi.target)
            else:
                path = os.path.join(tmp, _ARTIFACT_FILE)
                with open(path, "w", encoding="utf-8") as f:
                    f.write("module kept in memory by passes.kernels.fast_builder\n")
                _REGISTRY.put(path, rt_mod)
            self.stats.add_build(time.perf_counter() - t0, True)
            return BuilderResult(path, None)
        except Exception as err:  # noqa: BLE001 - a failed candidate is a result, not a crash
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            self.stats.add_build(time.perf_counter() - t0, False)
            return BuilderResult(None, f"InProcessBuilder: {type(err).__name__}: {err}")

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        _REGISTRY.discard_missing()
        inputs = list(build_inputs)
        if self.max_workers == 1 or len(inputs) <= 1:
            return [self._build_one(bi) for bi in inputs]
        with ThreadPoolExecutor(self.max_workers, thread_name_prefix="tvm_interop_build") as pool:
            return list(pool.map(self._build_one, inputs))


# ----------------------------------------------------------------------------------------------- runner
_random_fill = None


def _fill_function():
    global _random_fill
    if _random_fill is None:
        _random_fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure", allow_missing=True)
        if _random_fill is None:  # pragma: no cover - TVM built without contrib random
            import numpy as np

            rng = np.random.default_rng(0)

            def _numpy_fill(arr):
                arr.copyfrom(rng.uniform(-1, 1, size=tuple(arr.shape)).astype(arr.dtype))

            _random_fill = _numpy_fill
    return _random_fill


def measure_module(rt_mod, args_info, device_type: str = "cpu",
                   evaluator_config: EvaluatorConfig | None = None, alloc_repeat: int = 1) -> list[float]:
    """Seconds per call of ``rt_mod``'s entry function, as MetaSchedule's runners measure a candidate.

    ``args_info``: MetaSchedule ``ArgInfo`` objects (``ArgInfo.from_prim_func(func)``) or their JSON form.
    """
    dev = tvm.runtime.device(str(device_type), 0)
    info = [a.as_json() if hasattr(a, "as_json") else a for a in args_info]
    args = alloc_argument_common(_fill_function(), dev, info, alloc_repeat)
    return run_evaluator_common(rt_mod, dev, EvaluatorConfig._normalized(evaluator_config), args)


@derived_object
class InProcessRunner(PyRunner):
    """Times built candidates in this process with MetaSchedule's evaluator (see the module doc).

    ``evaluator_config``: MetaSchedule's ``EvaluatorConfig`` (default: number 3, repeat 1, min_repeat_ms 100, as
    ``LocalRunner``). Artifacts of :class:`InProcessBuilder` are taken from memory; any other path is loaded with
    ``tvm.runtime.load_module``.
    """

    def __init__(self, evaluator_config: EvaluatorConfig | None = None, alloc_repeat: int = 1,
                 stats: BuildStats | None = None):
        super().__init__()
        self.evaluator_config = EvaluatorConfig._normalized(evaluator_config)
        self.alloc_repeat = alloc_repeat
        self.stats = stats or BuildStats()

    def _run_one(self, ri: RunnerInput):
        t0 = time.perf_counter()
        path = str(ri.artifact_path)
        try:
            rt_mod = _REGISTRY.pop(path)
            if rt_mod is None:
                rt_mod = tvm.runtime.load_module(path)
            costs = measure_module(rt_mod, ri.args_info, str(ri.device_type), self.evaluator_config,
                                   self.alloc_repeat)
            self.stats.add_run(time.perf_counter() - t0, True)
            return LocalRunnerFuture(res=costs, error_message=None)
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001
            self.stats.add_run(time.perf_counter() - t0, False)
            return LocalRunnerFuture(res=None, error_message=f"InProcessRunner: {type(err).__name__}: {err}")

    def run(self, runner_inputs: list[RunnerInput]):
        return [self._run_one(ri) for ri in runner_inputs]


# ----------------------------------------------------------------------------------------------- timing wrappers
@derived_object
class TimedBuilder(PyBuilder):
    """Any MetaSchedule builder, with the wall time of each batch added to ``stats`` (for comparisons)."""

    def __init__(self, inner, stats: BuildStats):
        super().__init__()
        self.inner, self.stats = inner, stats

    def build(self, build_inputs):
        t0 = time.perf_counter()
        results = self.inner.build(build_inputs)
        per = (time.perf_counter() - t0) / max(1, len(results))
        for r in results:
            self.stats.add_build(per, r.error_msg is None)
        return results


@derived_object
class TimedRunner(PyRunner):
    """Any synchronous MetaSchedule runner (``LocalRunner``), with the wall time of each batch added to ``stats``."""

    def __init__(self, inner, stats: BuildStats):
        super().__init__()
        self.inner, self.stats = inner, stats

    def run(self, runner_inputs):
        t0 = time.perf_counter()
        futures = [f.result() for f in self.inner.run(runner_inputs)]
        per = (time.perf_counter() - t0) / max(1, len(futures))
        out = []
        for r in futures:
            ok = r.error_msg is None
            self.stats.add_run(per, ok)
            out.append(LocalRunnerFuture(res=[float(s) for s in r.run_secs] if ok else None,
                                         error_message=None if ok else str(r.error_msg)))
        return out
