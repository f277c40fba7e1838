"""A runnable scheduled model, from a freshly built library or from an exported ``.so``.

Needs only TVM's runtime (it works with ``TVM_USE_RUNTIME_LIB=1``) and this package: that is the deployment
contract. Two executors share one library:
- ``threads`` (CPU default for a concurrent plan): the plan's concurrent groups on worker threads
  (``runtime.thread_executor``);
- ``vm``: the Relax VM running the stream-lowered program (the GPU path; on a CPU it runs the schedule order).
  The streams are created once, when the VM is created (``runtime.cuda.StreamSet``), and freed by ``close``;
  with ``cuda_graph=True`` (the default when the library was built with a CUDA-graph variant) the program runs
  as one captured CUDA graph, falling back to direct launches (with a logged reason) if capture fails.
"""
from __future__ import annotations

import logging
import numbers
import os
import time
from typing import Sequence

import numpy as np

from .cpu_features import check_cpu_features
from .cuda import (MAIN_FUNC, MAIN_GRAPH_FUNC, StreamSet, check_arch, check_cuda_device, check_library_units,
                   ensure_cuda_runtime,
                   is_cuda_loader_error)
from .errors import DeviceError, ExportError, InputError, InteropError
from .plan import ExecutionPlan, check_run_inputs, device_tensors
from .tvm_log import quiet_scope_lines

log = logging.getLogger(__name__)

PLAN_FUNC = "__tvm_interop_plan"
CONSTANTS_FUNC = "__tvm_interop_constants"
EXECUTORS = ("threads", "vm")
# When a library carries candidate programs: "auto" times them on a GPU at the first run (unless a pick file or
# an explicit candidate chose already), "off" runs the default one.
PICK_MODES = ("auto", "off")


def device_for(kind: str):
    """The TVM device for a device kind (``cpu``, ``cuda``, ...), or a clear DeviceError when there is none."""
    import tvm

    if kind == "cpu":
        return tvm.cpu(0)
    if kind == "cuda":
        return check_cuda_device(0)
    dev = tvm.device(kind, 0)
    if not dev.exist:
        raise DeviceError(f"no {kind.upper()} device is available on this machine; the model was compiled for "
                          f"{kind} — run it on a machine with a {kind.upper()} GPU, or compile for target 'llvm'")
    return dev


class ScheduledModel:
    """Runs a scheduled program. ``run(*inputs)`` returns numpy output(s)."""

    def __init__(self, library, device_kind: str = "cpu", executor: str | None = None, mode: str | None = None,
                 num_workers: int | None = None, plan: ExecutionPlan | None = None, cuda_graph: bool | None = None,
                 candidate: str | None = None, pick: str = "auto"):
        import tvm
        from tvm.runtime import vm as rvm

        self.library = library
        self.device_kind = device_kind
        self._device = None
        self._vm = None
        self._threads = None
        self._streams: StreamSet | None = None
        self._entry: tuple[str, bool] | None = None
        self._graph_failed: str | None = None
        self._warmed: set[str] = set()   # graph functions whose direct twin ran once (library units, see run)
        self._stream_sets: dict[str, StreamSet] = {}
        self.pick_report = None
        # (a CPU model without an explicit executor is settled once its plan is read: see _default_cpu_executor)
        self._executor_name = executor or ("threads" if device_kind == "cpu" else "vm")
        if self._executor_name not in EXECUTORS:
            raise InteropError(f"unknown executor {self._executor_name!r}; choose from {EXECUTORS}")
        if self._executor_name == "threads" and device_kind != "cpu":
            raise InteropError("the worker-thread executor runs CPU kernels only; use executor='vm' on a GPU")
        meta_vm = None
        if plan is None:
            # The payload lives in the same library. A CPU library is read with a CPU VM (no device needed); a GPU
            # library needs its device (TVM refuses to create even a CPU VM over kernels it cannot load).
            try:
                if device_kind == "cpu":
                    meta_vm = rvm.VirtualMachine(library, tvm.cpu(0))
                    plan_fn = meta_vm[PLAN_FUNC]
                else:
                    plan_fn = self._vm_executor()[PLAN_FUNC]
            except DeviceError:
                raise
            except Exception as e:  # noqa: BLE001
                raise ExportError(f"this library is not a tvm-interop model (no {PLAN_FUNC}): {e}") from None
            plan = ExecutionPlan.loads(str(plan_fn()))
        self.plan = plan
        if plan.meta.get("library_units"):   # cuDNN / cuBLAS units: libraries findable, extension registered
            check_library_units(plan.meta)
        if device_kind == "cuda" and self._device is not None:  # the device was needed to read the plan
            check_arch(plan.meta.get("cuda_arches") or [], self._device)
        if device_kind == "cpu":
            check_cpu_features(plan.meta)
            if executor is None:
                self._executor_name = _default_cpu_executor(plan)
        self.mode = mode or self.plan.meta.get("mode", "stage")
        self.cuda_graph = bool(self.plan.meta.get("cuda_graph", False)) if cuda_graph is None else bool(cuda_graph)
        self._cuda_graph_requested = cuda_graph
        self._num_workers = num_workers
        self._meta_vm = meta_vm
        if pick not in PICK_MODES:
            raise InteropError(f"unknown pick mode {pick!r}; choose from {PICK_MODES}")
        self.pick = pick
        self.candidate: str | None = None
        if candidate is not None:
            self.select_candidate(candidate)

    # ------------------------------------------------------------------ candidate programs
    @property
    def candidates(self) -> list[dict]:
        """The candidate programs the library carries (``passes.candidates``), filtered by ``cuda_graph`` when
        it was given; empty for a library built without them."""
        cands = list(self.plan.meta.get("candidates") or [])
        if self._cuda_graph_requested is False:
            cands = [c for c in cands if not c["cuda_graph"]]
        return cands

    def select_candidate(self, name: str) -> None:
        """Run candidate ``name`` from now on (what the picker does after timing)."""
        names = [c["name"] for c in self.plan.meta.get("candidates") or []]
        if name not in names:
            raise InteropError(f"this library has no candidate program {name!r}"
                               + (f"; it has {', '.join(names)}" if names else " (it was built without candidates)"))
        self.candidate = name
        self._entry = None

    def _candidate_entry(self, vm) -> tuple[str, StreamSet]:
        cands = {c["name"]: c for c in self.plan.meta["candidates"]}
        name = self.candidate or self.plan.meta.get("default_candidate")
        c = cands.get(name)
        if c is None or (self._cuda_graph_requested is False and c["cuda_graph"]):
            c = next(x for x in cands.values() if x["function"] == c["direct_function"]) if c else \
                next(iter(cands.values()))
        if c["cuda_graph"] and self._graph_failed:
            c = next(x for x in cands.values() if x["function"] == c["direct_function"])
        self.candidate = c["name"]
        return c["function"], self.stream_set(vm, c)

    def stream_set(self, vm, cand: dict) -> StreamSet:
        """The streams of one candidate, created on its first use and kept until ``close``."""
        key = cand["streams_function"]
        if key not in self._stream_sets:
            self._stream_sets[key] = StreamSet(vm, self.device() if self.device_kind != "cpu" else None,
                                               create=key, free=cand["free_streams_function"],
                                               events=self.plan.meta.get("sync") == "events")
        return self._stream_sets[key]

    # ------------------------------------------------------------------ properties
    @property
    def executor(self) -> str:
        return self._executor_name

    @property
    def inputs(self) -> list[dict]:
        return self.plan.inputs

    def device(self):
        if self._device is None:
            dev = device_for(self.device_kind)
            if self.device_kind == "cuda" and getattr(self, "plan", None) is not None:
                check_arch(self.plan.meta.get("cuda_arches") or [], dev)
            self._device = dev
        return self._device

    # ------------------------------------------------------------------ executors
    def _vm_executor(self):
        if self._vm is None:
            from tvm.runtime import vm as rvm

            dev = self.device()
            try:
                self._vm = rvm.VirtualMachine(self.library, dev)
            except Exception as e:  # noqa: BLE001
                if self.device_kind == "cuda" and "CUDA runtime is not linked" in str(e):
                    raise DeviceError("no CUDA device: TVM's CUDA runtime is not available in this process") from None
                raise
        return self._vm

    def _entry_point(self, vm) -> tuple[str, bool]:
        """Which function runs the model, and whether it takes the stream handles (created here, once)."""
        if self._entry is None:
            if self.plan.meta.get("candidates"):
                name, self._streams = self._candidate_entry(vm)
                self._entry = (name, True)
            elif vm.module.implements_function(MAIN_FUNC):
                self._streams = StreamSet(vm, self.device() if self.device_kind != "cpu" else None,
                                          events=self.plan.meta.get("sync") == "events")
                name = MAIN_FUNC
                if self.cuda_graph and not self._graph_failed:
                    if vm.module.implements_function(MAIN_GRAPH_FUNC) and self.plan.meta.get("cuda_graph"):
                        name = MAIN_GRAPH_FUNC
                    else:
                        log.warning("CUDA graph requested but not available, running direct launches: %s",
                                    self.plan.meta.get("cuda_graph_reason")
                                    or "the library was built without a CUDA-graph variant")
                self._entry = (name, True)
            else:  # a library lowered before the streams became a parameter
                self._entry = ("main", False)
        return self._entry

    @property
    def entry_function(self) -> str | None:
        """The VM function ``run`` calls (after the first run)."""
        return self._entry[0] if self._entry else None

    @property
    def num_streams(self) -> int:
        return self._streams.count if self._streams is not None else 0

    def _thread_executor(self):
        if self._threads is None:
            from .thread_executor import ThreadExecutor

            vm = self._meta_vm or self._vm_executor()
            constants = list(vm[CONSTANTS_FUNC]())
            kernel_lib = kernel_library(self.library)
            self._threads = ThreadExecutor(self.plan, lambda n: lookup_kernel(kernel_lib, n), constants, self.device(),
                                           mode=self.mode, num_workers=self._num_workers)
        return self._threads

    def _check_inputs(self, inputs: Sequence) -> None:
        check_run_inputs(self.plan.inputs, inputs)

    def run(self, *inputs, numpy: bool = True):
        """Run once on numpy arrays (or TVM tensors); returns numpy array(s). On a GPU, a library with candidate
        programs times them on the first run (``pick="auto"``) and runs the fastest from then on."""
        if self._executor_name == "threads":
            return self._thread_executor().run(*inputs, numpy=numpy)
        self._check_inputs(inputs)
        self._maybe_pick(inputs)
        vm = self._vm_executor()
        dev = self.device()
        args = device_tensors(inputs, dev)
        name, with_streams = self._entry_point(vm)
        extra = [self._streams.handles] if with_streams else []
        if name.endswith(MAIN_GRAPH_FUNC) and name not in self._warmed and self.plan.meta.get("library_units"):
            # cuDNN / cuBLAS units choose algorithms (timed runs) and create handles and workspaces on first use;
            # none of that may happen inside a CUDA-graph capture, so the direct program runs once first
            direct = name[: -len(MAIN_GRAPH_FUNC)] + MAIN_FUNC
            if vm.module.implements_function(direct):
                vm[direct](*args, *extra)
                dev.sync()
            self._warmed.add(name)
        try:
            out = vm[name](*args, *extra)
        except Exception as e:  # noqa: BLE001
            if not name.endswith(MAIN_GRAPH_FUNC):
                raise
            self._graph_failed = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            log.warning("CUDA graph capture failed (%s); falling back to direct launches", self._graph_failed)
            if self.plan.meta.get("candidates"):
                self._entry = None
                name, _ = self._entry_point(vm)
            else:
                self._entry = (MAIN_FUNC, True)
                name = MAIN_FUNC
            out = vm[name](*args, *[self._streams.handles])
        return vm_to_numpy(out) if numpy else out

    def _maybe_pick(self, inputs) -> None:
        """On a GPU, the first run of a library with candidates (and no choice yet) picks by measurement."""
        if self.pick == "auto" and self.candidate is None and self.device_kind != "cpu" and len(self.candidates) > 1:
            from .picker import pick_fastest

            pick_fastest(self, inputs)

    def benchmark(self, *inputs, repeat: int = 20, warmup: int = 3) -> dict:
        """Median / mean / min latency in seconds over ``repeat`` runs after ``warmup`` runs (a pending
        candidate pick happens before, untimed). With the VM executor, numpy inputs are copied to the device once,
        before the timed runs: the latency is the model's with its inputs in place, as the candidate picker,
        gpu_check and the PyTorch baselines time it (on an H100 a copy per run added 0.14-0.23 ms to SqueezeNet's
        0.25-0.51 ms and Inception-v3's 0.50 ms at width 0.25: the latency of the copy, not of the model)."""
        if not (_is_count(repeat) and repeat >= 1 and _is_count(warmup) and warmup >= 0):
            raise InputError(f"benchmark needs an integer repeat >= 1 and warmup >= 0, got repeat={repeat!r}, "
                             f"warmup={warmup!r}")
        if self._executor_name == "vm":
            self._check_inputs(inputs)
            self._maybe_pick(inputs)
            inputs = tuple(device_tensors(inputs, self.device()))
        times = []
        for i in range(warmup + repeat):
            t0 = time.perf_counter()
            self.run(*inputs, numpy=False)
            if self.device_kind != "cpu":
                self.device().sync()
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        arr = np.array(times)
        return {"median": float(np.median(arr)), "mean": float(arr.mean()), "min": float(arr.min()),
                "repeat": repeat, "executor": self._executor_name}

    def export(self, path: str) -> None:
        export_library(self.library, path)

    def close(self) -> None:
        if self._threads is not None:
            self._threads.close()
            self._threads = None
        for ss in self._stream_sets.values():
            ss.close()
        self._stream_sets = {}
        if self._streams is not None:
            self._streams.close()
            self._streams = None
            self._entry = None


def lookup_kernel(lib, name: str):
    """A kernel of ``lib`` by name, or None (the executors report a missing kernel with its name)."""
    try:
        return lib.get_function(name)
    except Exception:  # noqa: BLE001 - reported by the executor as a missing kernel
        return None


def kernel_library(library):
    """The module holding the compiled kernels: the executable's imported library."""
    lib = getattr(library, "mod", library)  # a fresh VMExecutable wraps the runtime module in .mod
    imports = list(getattr(lib, "imports", []) or [])
    return imports[0] if imports else lib


def vm_to_numpy(out):
    """A VM result (a tensor or nested tuples of them) as numpy array(s)."""
    import tvm

    if isinstance(out, tvm.runtime.Tensor):
        return out.numpy()
    return [vm_to_numpy(o) for o in out]


def export_library(library, path: str, **export_options) -> None:
    """Write the library atomically: a failure never replaces a previous good file. ``export_options`` go to
    TVM's ``export_library`` (``passes.cuda_compile`` packs CUDA binaries through ``fpack_imports``)."""
    from . import atomic

    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"cannot export the model to {path}: it is a directory; give a file path, e.g. "
                          f"{os.path.join(path, 'model.so')}")
    try:
        with atomic.atomic_path(path, suffix=".so") as tmp, quiet_scope_lines():
            library.export_library(tmp, **export_options)
    except InteropError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"could not export the model to {path}: {e}") from None


def _is_count(v) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def load_tvm_module(path: str):
    """``tvm.runtime.load_module(path)`` without TVM's per-scope debug lines (``runtime.tvm_log``)."""
    import tvm

    with quiet_scope_lines():
        return tvm.runtime.load_module(path)


def _library_device(lib) -> str:
    """``cuda`` when the library (or a module it imports) holds CUDA kernels, else ``cpu``."""
    seen = set()
    stack = [lib]
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        if getattr(m, "kind", "") == "cuda":
            return "cuda"
        stack.extend(getattr(m, "imports", []) or [])
    return "cpu"


def _default_cpu_executor(plan: ExecutionPlan) -> str:
    """``vm`` for a program that never runs two groups at once (sequential schedules), else ``threads``.

    Why: the worker-thread executor dispatches every kernel from Python (a task, a timing, a hand-off), which is
    what running groups concurrently needs; one group at a time needs none of it, and the Relax VM calls the same
    kernels in the same order from C++. Measured on SqueezeNet (40 kernels, 2 cores, interleaved medians): 3.59
    ms on worker threads, 3.27 ms on the VM, the same output. A library with candidate programs keeps the threads,
    since a candidate may be concurrent.
    """
    if plan.max_concurrency() <= 1 and not plan.meta.get("candidates"):
        return "vm"
    return "threads"


def load(path: str, device: str | None = None, executor: str | None = None, mode: str | None = None,
         num_workers: int | None = None, cuda_graph: bool | None = None, candidate: str | None = None,
         pick: str = "auto") -> ScheduledModel:
    """Load an exported ``.so`` with TVM's runtime only and return a runnable ScheduledModel.

    A library with candidate programs runs ``candidate`` when given, else the one in its pick file
    (``m.so.pick.json`` from ``tvm-interop pick``) when that matches the library and this device, else — on a
    GPU, with ``pick="auto"`` — the fastest by measurement at the first run (``runtime.picker``).

    A library built for CUDA needs TVM's CUDA runtime and a GPU: without them this raises DeviceError
    ("no CUDA device ...")."""
    import tvm

    if not os.path.exists(path):
        raise ExportError(f"{path}: no such file")
    try:
        lib = load_tvm_module(path)
    except Exception as e:  # noqa: BLE001
        if not is_cuda_loader_error(e):
            raise ExportError(f"{path}: not a loadable TVM library ({str(e).splitlines()[0] if str(e) else e})") from None
        ensure_cuda_runtime()  # raises DeviceError when TVM's CUDA runtime (driver, GPU) is missing
        try:
            lib = load_tvm_module(path)
        except Exception as e2:  # noqa: BLE001
            raise ExportError(f"{path}: cannot load ({str(e2).splitlines()[0] if str(e2) else e2})") from None
    kind = device or _library_device(lib)
    if kind == "cpu":
        model = ScheduledModel(lib, device_kind="cpu", executor=executor, mode=mode, num_workers=num_workers,
                               cuda_graph=cuda_graph, candidate=candidate, pick=pick)
    else:
        model = ScheduledModel(lib, device_kind=kind, executor=executor or "vm", mode=mode, num_workers=num_workers,
                               cuda_graph=cuda_graph, candidate=candidate, pick=pick)
    if candidate is None and pick == "auto" and model.plan.meta.get("candidates"):
        _apply_pick_file(model, path)
    return model


def _apply_pick_file(model: ScheduledModel, path: str) -> None:
    """Run the candidate chosen by ``tvm-interop pick`` when its file matches this library and device."""
    from .picker import device_name, load_pick

    report = load_pick(path, device_name(model))
    if report is not None and report.choice in [c["name"] for c in model.candidates]:
        model.select_candidate(report.choice)
        model.pick_report = report
        log.info("%s: running candidate %s (picked by measurement, %s)", path, report.choice, report.summary())
