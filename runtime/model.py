"""A runnable scheduled model, from a freshly built library or from an exported ``.so``.

Needs only TVM's runtime (it works with ``TVM_USE_RUNTIME_LIB=1``) and this package: that is the deployment
contract. Two executors share one library:
- ``threads`` (CPU default): the plan's concurrent groups on worker threads (``runtime.thread_executor``);
- ``vm``: the Relax VM running the stream-lowered ``main`` (the GPU path; on a CPU it runs the schedule order).
"""
from __future__ import annotations

import os
import time
from typing import Sequence

import numpy as np

from .errors import DeviceError, ExportError, InputError, InteropError
from .plan import ExecutionPlan

PLAN_FUNC = "__tvm_interop_plan"
CONSTANTS_FUNC = "__tvm_interop_constants"
EXECUTORS = ("threads", "vm")


def _device_for(kind: str):
    import tvm

    if kind == "cpu":
        return tvm.cpu(0)
    dev = tvm.device(kind, 0)
    if not dev.exist:
        raise DeviceError(f"no {kind.upper()} device is available on this machine; the model was compiled for "
                          f"{kind} — run it on a machine with a {kind.upper()} GPU, or compile for target 'llvm'")
    return dev


class ScheduledModel:
    """Runs a scheduled program. ``run(*inputs)`` returns numpy output(s)."""

    def __init__(self, library, device_kind: str = "cpu", executor: str | None = None, mode: str | None = None,
                 num_workers: int | None = None):
        import tvm
        from tvm.runtime import vm as rvm

        self.library = library
        self.device_kind = device_kind
        self._device = None
        self._vm = None
        self._threads = None
        self._executor_name = executor or ("threads" if device_kind == "cpu" else "vm")
        if self._executor_name not in EXECUTORS:
            raise InteropError(f"unknown executor {self._executor_name!r}; choose from {EXECUTORS}")
        if self._executor_name == "threads" and device_kind != "cpu":
            raise InteropError("the worker-thread executor runs CPU kernels only; use executor='vm' on a GPU")
        # The payload lives in the same library; read it with a CPU VM (no device needed to inspect).
        try:
            meta_vm = rvm.VirtualMachine(library, tvm.cpu(0)) if device_kind == "cpu" else None
            plan_fn = (meta_vm or rvm.VirtualMachine(library, tvm.cpu(0)))[PLAN_FUNC]
        except Exception as e:  # noqa: BLE001
            raise ExportError(f"this library is not a tvm-interop model (no {PLAN_FUNC}): {e}") from None
        self.plan = ExecutionPlan.loads(str(plan_fn()))
        self.mode = mode or self.plan.meta.get("mode", "stage")
        self._num_workers = num_workers
        self._meta_vm = meta_vm

    # ------------------------------------------------------------------ properties
    @property
    def executor(self) -> str:
        return self._executor_name

    @property
    def inputs(self) -> list[dict]:
        return self.plan.inputs

    def device(self):
        if self._device is None:
            self._device = _device_for(self.device_kind)
        return self._device

    # ------------------------------------------------------------------ executors
    def _vm_executor(self):
        if self._vm is None:
            from tvm.runtime import vm as rvm

            self._vm = rvm.VirtualMachine(self.library, self.device())
        return self._vm

    def _thread_executor(self):
        if self._threads is None:
            from .thread_executor import ThreadExecutor

            vm = self._meta_vm or self._vm_executor()
            constants = list(vm[CONSTANTS_FUNC]())
            kernel_lib = _kernel_library(self.library)
            self._threads = ThreadExecutor(self.plan, lambda n: _lookup(kernel_lib, n), constants, self.device(),
                                           mode=self.mode, num_workers=self._num_workers)
        return self._threads

    def _check_inputs(self, inputs: Sequence) -> None:
        spec = self.plan.inputs
        if len(inputs) != len(spec):
            raise InputError(f"model takes {len(spec)} input(s) ({', '.join(s['name'] for s in spec)}), got {len(inputs)}")
        for x, s in zip(inputs, spec):
            if tuple(x.shape) != tuple(s["shape"]) or str(x.dtype) != s["dtype"]:
                raise InputError(
                    f"input {s['name']!r} must be {s['dtype']}{list(s['shape'])}, got {x.dtype}{list(x.shape)} "
                    "(the model was compiled for fixed shapes and batch size)")

    def run(self, *inputs, numpy: bool = True):
        """Run once on numpy arrays (or TVM tensors); returns numpy array(s)."""
        if self._executor_name == "threads":
            return self._thread_executor().run(*inputs, numpy=numpy)
        import tvm

        self._check_inputs(inputs)
        dev = self.device()
        args = [x if isinstance(x, tvm.runtime.Tensor) else tvm.runtime.tensor(np.ascontiguousarray(x), dev)
                for x in inputs]
        out = self._vm_executor()["main"](*args)
        return _vm_to_numpy(out) if numpy else out

    def benchmark(self, *inputs, repeat: int = 20, warmup: int = 3) -> dict:
        """Median / mean / min latency in seconds over ``repeat`` runs after ``warmup`` runs."""
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


def _lookup(lib, name: str):
    try:
        return lib.get_function(name)
    except Exception:  # noqa: BLE001 - reported by the executor as a missing kernel
        return None


def _kernel_library(library):
    """The module holding the compiled kernels: the executable's imported library."""
    lib = getattr(library, "mod", library)  # a fresh VMExecutable wraps the runtime module in .mod
    imports = list(getattr(lib, "imports", []) or [])
    return imports[0] if imports else lib


def _vm_to_numpy(out):
    import tvm

    if isinstance(out, tvm.runtime.Tensor):
        return out.numpy()
    return [_vm_to_numpy(o) for o in out]


def export_library(library, path: str) -> None:
    """Write the library atomically: a failure never replaces a previous good file."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}.so")
    try:
        library.export_library(tmp)
        os.replace(tmp, path)
    except Exception as e:  # noqa: BLE001
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise ExportError(f"could not export the model to {path}: {e}") from None


def load(path: str, device: str | None = None, executor: str | None = None, mode: str | None = None,
         num_workers: int | None = None) -> ScheduledModel:
    """Load an exported ``.so`` with TVM's runtime only and return a runnable ScheduledModel."""
    import tvm

    if not os.path.exists(path):
        raise ExportError(f"{path}: no such file")
    try:
        lib = tvm.runtime.load_module(path)
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"{path}: not a loadable TVM library ({str(e).splitlines()[0] if str(e) else e})") from None
    model = ScheduledModel(lib, device_kind="cpu", executor="vm" if executor == "vm" else None, mode=mode,
                           num_workers=num_workers)
    kind = device or model.plan.meta.get("device", "cpu")
    if kind != "cpu":
        model = ScheduledModel(lib, device_kind=kind, executor=executor or "vm", mode=mode, num_workers=num_workers)
    elif executor:
        model = ScheduledModel(lib, device_kind="cpu", executor=executor, mode=mode, num_workers=num_workers)
    return model
