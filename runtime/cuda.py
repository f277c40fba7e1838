"""The GPU side of the runtime: the names of the functions a stream-lowered library carries, loading TVM's CUDA
runtime in a runtime-only install, and the per-model stream set.

Needs TVM's runtime only (it works with ``TVM_USE_RUNTIME_LIB=1``). What a library built by
``passes.lower_streams`` contains (every name below is a Relax function of the library):

``main(*inputs)``
    the model, callable by TVM alone. On a GPU it gets its streams from the VM's per-VM cache
    (``vm.builtin.cuda_graph.get_cached_alloc``: the stream-creating function runs once per VirtualMachine and
    its result is kept by the VM), so streams are created once per loaded model, never per call. On a CPU it
    passes null stream handles (a CPU has no streams; every stream call is a no-op there).
``__tvm_interop_main(*inputs, streams)``
    the scheduled program proper, with the stream handles as a parameter (``num_input`` = number of inputs, so
    TVM's CUDA-graph rewriting treats the handles as fixed). Groups are dispatched to their streams, stages and
    dependencies are enforced with events (``runtime.Device_StreamSyncFromTo``), never with a device-wide sync.
``__tvm_interop_main_graph(*inputs, streams)``
    the same program for CUDA-graph capture (present when the library was built with ``cuda_graph=True``):
    inputs are first copied into static buffers and outputs copied out, so that everything in between runs as
    one captured graph (``vm.builtin.cuda_graph.run_or_capture``). If the build could not lift the program
    into a graph, the function still exists and runs with direct launches (the reason is in the plan's
    ``meta["cuda_graph_reason"]``).
``__tvm_interop_streams()`` / ``__tvm_interop_free_streams(streams)``
    create / free the stream set (``num_streams`` streams; ``runtime.Device_StreamCreate`` / ``StreamFree``).

:class:`StreamSet` is what :class:`runtime.model.ScheduledModel` uses: it calls ``__tvm_interop_streams`` once
when the VM is created, passes the handles to every run and frees them (after a device sync) on ``close``.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from .errors import DeviceError

log = logging.getLogger(__name__)

MAIN_FUNC = "__tvm_interop_main"
MAIN_GRAPH_FUNC = "__tvm_interop_main_graph"
STREAMS_FUNC = "__tvm_interop_streams"
FREE_STREAMS_FUNC = "__tvm_interop_free_streams"
CURRENT_STREAM_FUNC = "__tvm_interop_current_stream"
# A program lowered with stage timing: ``__tvm_interop_stage_times(streams)`` -> the last call's in-context stage
# times (ms), read from the timing events its stages recorded (``passes.lower_streams``).
STAGE_TIMES_FUNC = "__tvm_interop_stage_times"
# The keep-alive use of tensors (``passes.lower_streams``): an impure packed call that no Relax pass may drop.
# ``ffi.Array`` (tvm-ffi's array constructor) is in every TVM runtime, touches no device memory, and is not a
# ``vm.builtin.*`` function, which TVM's RewriteCUDAGraph would refuse to capture (splitting the graph).
KEEPALIVE_FUNC = "ffi.Array"
COPY_FUNC = "__tvm_interop_copy"
# Key of the stream set in the VM's per-VM cache (``vm.builtin.cuda_graph.get_cached_alloc``). TVM's own
# CUDA-graph rewriting uses key 0 for its storage; this one is far from it.
STREAM_CACHE_INDEX = 0x7E5_0001

# DLPack device type codes of the devices a stream program may target.
DL_DEVICE_TYPE = {"cpu": 1, "cuda": 2, "opencl": 4, "vulkan": 7, "metal": 8, "rocm": 10}

_CUDA_RUNTIME_MARKER = "ffi.Module.load_from_bytes.cuda"


def cuda_runtime_available() -> bool:
    """True when TVM's CUDA runtime is loaded (it registers the loader of CUDA kernels)."""
    import tvm_ffi

    return tvm_ffi.get_global_func(_CUDA_RUNTIME_MARKER, allow_missing=True) is not None


def _preload_cudart() -> None:
    """Make ``libcudart.so.13`` loadable: it may live in a pip package (``nvidia-cuda-runtime``) or a toolkit
    (the same search the native extension's libraries get, ``native_libs.preload_library``)."""
    from .native_libs import preload_library

    try:
        preload_library("libcudart.so.13")
    except OSError as e:   # ensure_cuda_runtime reports the failure of the load it retries
        log.debug("%s", e)


def ensure_cuda_runtime() -> None:
    """Load TVM's CUDA runtime library if it is not loaded yet (a runtime-only TVM does not load it itself).

    Raises DeviceError with the reason when it cannot be loaded (no driver, no CUDA runtime library).
    """
    if cuda_runtime_available():
        return
    import tvm  # noqa: F401 - loads libtvm_runtime first
    from tvm.base import _LOADED_LIBS
    from tvm_ffi.libinfo import load_lib_ctypes

    runtime_dir = Path(os.path.realpath(_LOADED_LIBS["tvm_runtime"]._name)).parent
    err = None
    for attempt in range(2):
        try:
            _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
                package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[runtime_dir], mode="RTLD_LOCAL")
            break
        except (OSError, RuntimeError, TypeError) as e:
            err = e
            if attempt == 0:
                _preload_cudart()
    if not cuda_runtime_available():
        raise DeviceError(
            "no CUDA device: TVM's CUDA runtime could not be loaded on this machine "
            f"({str(err).splitlines()[0] if err else 'libtvm_runtime_cuda.so registers no CUDA module loader'}); "
            "run the model on a machine with an NVIDIA GPU and driver, or compile for target 'llvm'")


def check_cuda_device(device_id: int = 0):
    """Return ``tvm.cuda(device_id)`` or raise DeviceError('no CUDA device ...')."""
    import tvm

    ensure_cuda_runtime()
    dev = tvm.cuda(device_id)
    if not dev.exist:
        raise DeviceError(f"no CUDA device: cuda:{device_id} does not exist on this machine (the model was compiled "
                          "for CUDA); run it on a machine with an NVIDIA GPU, or compile for target 'llvm'")
    return dev


def arch_mismatch(arches: list[str], compute_version: str, device_name: str = "this GPU") -> str | None:
    """Why a library whose kernels were compiled for ``arches`` (``["sm_80", "sm_90"]``) cannot run on a GPU of
    ``compute_version`` (``"8.0"``), or None when one of them can: a cubin runs on GPUs of the same major
    version and an equal or newer minor version (``sm_90a`` and newer majors never run older majors' SASS)."""
    if not arches:
        return None
    try:
        major, minor = (int(x) for x in str(compute_version).split(".")[:2])
    except ValueError:
        return None
    for a in arches:
        cc = a[3:].rstrip("a")
        if len(cc) >= 2 and int(cc[:-1]) == major and int(cc[-1]) <= minor:
            return None
    have = f"sm_{major}{minor}"
    return (f"this library was built for {', '.join(arches)}, but {device_name} is {have}: its kernels cannot "
            f"run here; rebuild with --arch {have} (or --arch {','.join(sorted(set(arches) | {have}))} for both)")


def check_arch(arches: list[str], device) -> None:
    """Raise DeviceError when ``device`` (a CUDA device) has no binary in a library built for ``arches``."""
    why = arch_mismatch(arches, device.compute_version, f"this GPU ({device.device_name})")
    if why:
        raise DeviceError(why)


def is_cuda_loader_error(e: BaseException) -> bool:
    """True when ``tvm.runtime.load_module`` failed because TVM's CUDA runtime is missing."""
    text = str(e)
    return "load_from_bytes.cuda" in text or ("{cuda}" in text and "loader" in text)


class StreamSet:
    """The streams of one loaded model: created once (``__tvm_interop_streams``), reused by every run, freed on
    ``close``. ``handles`` is what ``__tvm_interop_main`` takes as its last argument."""

    def __init__(self, vm, device=None, create: str = STREAMS_FUNC, free: str = FREE_STREAMS_FUNC,
                 events: bool = False):
        self._vm = vm
        self.events = events
        self._device = device
        self._free = free
        self.handles = vm[create]()
        self._closed = False

    @property
    def count(self) -> int:
        """The number of streams (a model lowered with reused events carries its event pool as a last handle)."""
        return max(0, len(self.handles) - (1 if self.events else 0))   # (sequential: none)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._device is not None:
                self._device.sync()
            self._vm[self._free](self.handles)
        except Exception as e:  # noqa: BLE001 - freeing is best effort at shutdown
            log.debug("could not free streams: %s", e)

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def has_function(vm, name: str) -> bool:
    try:
        vm[name]
        return True
    except Exception:  # noqa: BLE001 - the VM raises when the function is missing
        return False


def check_library_units(meta: dict) -> None:
    """Before a model with cuDNN / cuBLAS units runs: make the NVIDIA libraries findable (pip's ``nvidia/*/lib``
    folders) and check that the extension's functions are registered (they register when the exported ``.so``,
    which links the extension in, is loaded). Raises DeviceError naming what is missing."""
    import tvm_ffi

    from .native_libs import preload_cuda_libraries

    native = meta.get("native_extension") or {}
    wanted = sorted({u["func"] for u in (meta.get("library_units") or {}).values()})
    preload_cuda_libraries()
    missing = [f for f in wanted if tvm_ffi.get_global_func(f, allow_missing=True) is None]
    if missing:
        raise DeviceError(
            f"this model runs {len(meta.get('library_units') or {})} unit(s) as cuDNN/cuBLAS calls, but "
            f"{', '.join(missing)} is not registered: the tvm-interop native extension "
            f"(source {native.get('source_hash', '?')}) was not linked into this library or not loaded; export the "
            "model with CompiledModel.export / tvm-interop compile -o, which links it in")
