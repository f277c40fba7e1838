"""Loading tvm-interop's native CUDA extension and the CUDA libraries it opens.

Needs TVM's runtime only (it works with ``TVM_USE_RUNTIME_LIB=1``; nothing here imports a compiler). The extension
(source: ``runtime/native/tvm_interop_cuda.cc``, built by ``passes.native_build``) registers these tvm-ffi globals
when its library is loaded — as ``libtvm_interop_cuda.so`` through :func:`load_extension`, or linked into an
exported model ``.so`` that TVM's runtime loads:

``tvm_interop.cuda.events_create(device_id, n) -> handle`` / ``events_free(handle)`` /
``event_sync(handle, k, src_stream, dst_stream)``
    a pool of reusable events per loaded model (TVM's ``runtime.Device_StreamSyncFromTo`` makes one per call).
``tvm_interop.cuda.timing_create(device_id, n) -> handle`` / ``timing_record(handle, k, stream)`` /
``timing_read(handle, n) -> [ms]`` / ``timing_free(handle)``
    timing events of a program lowered with stage timing: its stages' in-context device times.
``tvm_interop.cudnn.conv2d(params, x, w, [bias], [z], out)``
    ``params = [stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, groups, has_bias, has_z, relu, tf32]``.
``tvm_interop.cublas.dense(params, x, w, [bias], out)``
    ``params = [has_bias, relu, w_transposed, tf32]``.
``tvm_interop.native.info() -> str``
    JSON: version, function names, which CUDA libraries load (never raises).
``tvm_interop.native.call_stats(reset) -> str``
    JSON: per library function, steady-state calls and their mean host time before the library's compute call
    (ours) and in it (the library's); ``reset`` zeroes the counters after reading.

The extension has no link-time dependency on CUDA: it ``dlopen``s ``libcudart.so.13``, ``libcudnn.so.9`` and
``libcublasLt.so.13`` by soname on first use. pip's ``nvidia-*`` wheels put those in ``site-packages/nvidia/*/lib``,
where the dynamic loader does not look; :func:`preload_cuda_libraries` loads them by path (``RTLD_GLOBAL``), after
which a ``dlopen`` by soname finds the loaded copy.
"""
from __future__ import annotations

import ctypes
import glob
import json
import logging
import os
from pathlib import Path

from .errors import ExportError

log = logging.getLogger(__name__)

# The globals the extension registers (kept equal to kFunctionNames in tvm_interop_cuda.cc; tests check it).
EXTENSION_FUNCTIONS = (
    "tvm_interop.cuda.events_create",
    "tvm_interop.cuda.events_free",
    "tvm_interop.cuda.event_sync",
    "tvm_interop.cuda.timing_create",
    "tvm_interop.cuda.timing_record",
    "tvm_interop.cuda.timing_read",
    "tvm_interop.cuda.timing_free",
    "tvm_interop.cuda.stream_hold",
    "tvm_interop.cuda.stream_release",
    "tvm_interop.cudnn.conv2d",
    "tvm_interop.cudnn.set_engine_policy",
    "tvm_interop.cudnn.conv_choices",
    "tvm_interop.cudnn.conv_engines",
    "tvm_interop.cublas.dense",
    "tvm_interop.native.info",
    "tvm_interop.native.call_stats",
)
EXTENSION_PREFIX = "tvm_interop."

# The C++ source, shipped as package data so that an installed wheel can build the extension.
NATIVE_SOURCE_DIR = Path(__file__).resolve().parent / "native"
SHARED_LIBRARY_NAME = "libtvm_interop_cuda.so"
OBJECT_NAME = "tvm_interop_cuda.o"

# soname -> (pip wheel sub-folders of site-packages/nvidia that may hold it, what to install when it is missing)
CUDA_LIBRARIES = {
    "libcudart.so.13": (("cu13", "cuda_runtime"), "pip install nvidia-cuda-runtime (or a CUDA 13 toolkit)"),
    "libcublasLt.so.13": (("cu13", "cublas"), "pip install nvidia-cublas"),
    "libcublas.so.13": (("cu13", "cublas"), "pip install nvidia-cublas"),
    "libcudnn.so.9": (("cudnn",), "pip install nvidia-cudnn-cu13"),
}

_loaded_extensions: dict[str, ctypes.CDLL] = {}
_preloaded: dict[str, str] = {}


def _nvidia_lib_dirs(subfolders) -> list[str]:
    """``site-packages/nvidia/<sub>/lib`` folders of the installed pip wheels (every ``nvidia`` path entry)."""
    try:
        import nvidia  # type: ignore  # namespace package of NVIDIA's wheels
    except ImportError:
        return []
    roots = list(getattr(nvidia, "__path__", []))
    return [os.path.join(r, sub, "lib") for r in roots for sub in subfolders
            if os.path.isdir(os.path.join(r, sub, "lib"))]


def _toolkit_lib_dirs() -> list[str]:
    dirs = []
    for base in filter(None, [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]):
        dirs += [os.path.join(base, "lib64"), os.path.join(base, "lib")]
    return [d for d in dirs if os.path.isdir(d)]


def library_candidates(soname: str) -> list[str]:
    """Files that may provide ``soname``, best first: pip wheels, then a CUDA toolkit."""
    subfolders = CUDA_LIBRARIES.get(soname, ((),))[0]
    dirs = _nvidia_lib_dirs(subfolders) + _toolkit_lib_dirs()
    found = []
    for d in dirs:
        exact = os.path.join(d, soname)
        if os.path.isfile(exact):
            found.append(exact)
        else:  # e.g. libcudart.so.13.0.88 without the soname link
            found += sorted(glob.glob(exact + ".*"))
    return found


def preload_library(soname: str) -> str:
    """Load ``soname`` into the process (``RTLD_GLOBAL``) so that a later ``dlopen(soname)`` finds it.

    Returns the path it was loaded from (``soname`` itself when the loader's search path already finds it), or
    raises OSError naming every place tried and what to install."""
    if soname in _preloaded:
        return _preloaded[soname]
    errors = []
    for path in [soname] + library_candidates(soname):  # the system's choice first: never shadow it
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            errors.append(str(e))
            continue
        _preloaded[soname] = path
        return path
    remedy = CUDA_LIBRARIES.get(soname, ((), "install it"))[1]
    raise OSError(f"{soname} not found ({'; '.join(errors) or 'no candidate'}); {remedy}, "
                  "or put its folder on LD_LIBRARY_PATH")


def preload_cuda_libraries(sonames=None) -> dict[str, str]:
    """Make the CUDA libraries the extension opens findable by soname; never raises.

    Returns ``{soname: path loaded, or "error: <why and how to install>"}``. Call it before the first
    cuDNN/cuBLAS call of a process (``load_extension`` and ``runtime.load`` of a model that uses the extension do).
    cuDNN's sub-libraries (``libcudnn_cnn.so.9`` ...) need no preloading: ``libcudnn.so.9`` opens them from its
    own folder (its RPATH is ``$ORIGIN``)."""
    out = {}
    for soname in sonames or CUDA_LIBRARIES:
        try:
            out[soname] = preload_library(soname)
        except OSError as e:
            out[soname] = f"error: {e}"
            log.debug("preload %s: %s", soname, e)
    return out


def load_extension(path: str | os.PathLike, preload: bool = True) -> list[str]:
    """Load the extension's shared library (or an exported model ``.so`` that links it) so that its globals
    register; returns the ``tvm_interop.*`` globals now registered. Loading twice is a no-op. ``preload``: also
    :func:`preload_cuda_libraries` (never raises)."""
    path = os.path.abspath(os.fspath(path))
    if path not in _loaded_extensions:
        import tvm_ffi  # noqa: F401 - loads libtvm_ffi.so (RTLD_GLOBAL), whose symbols the extension uses

        if not os.path.isfile(path):
            raise ExportError(f"native extension {path} does not exist; build it with "
                              "tvm_interop.passes.native_build.build_extension()")
        if preload:
            preload_cuda_libraries()
        try:
            # RTLD_LOCAL: the extension exports nothing (its globals register through tvm-ffi at load time).
            _loaded_extensions[path] = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as e:
            raise ExportError(f"cannot load the native extension {path}: {e}") from e
    registered = extension_functions()
    missing = [f for f in EXTENSION_FUNCTIONS if f not in registered]
    if missing:
        raise ExportError(f"{path} was loaded but did not register {', '.join(missing)}: not a tvm-interop native "
                          "extension of this version")
    return registered


def extension_functions() -> list[str]:
    """The ``tvm_interop.*`` tvm-ffi globals registered in this process (sorted)."""
    import tvm_ffi.registry

    return sorted(n for n in tvm_ffi.registry.list_global_func_names() if n.startswith(EXTENSION_PREFIX))


def library_call_stats(reset: bool = False) -> dict | None:
    """``tvm_interop.native.call_stats(reset)`` parsed (host microseconds per steady-state cuDNN / cuBLAS call, by
    phase), or None when no extension is loaded."""
    import tvm_ffi

    f = tvm_ffi.get_global_func("tvm_interop.native.call_stats", allow_missing=True)
    return None if f is None else json.loads(f(bool(reset)))


CUDNN_ENGINE_POLICIES = ("legacy", "measured")


def cudnn_engine_policy(policy: str | None = None) -> str | None:
    """The extension's cuDNN engine policy; with ``policy``, set it (process-wide) and return the previous one.

    ``"measured"`` (the default since 2026-11-27): the graph API's engine configurations and the legacy path are
    timed once per shape on the call's own buffers and the fastest is kept (``runtime/native/cudnn_engines.h``).
    ``"legacy"``: each convolution shape runs the fastest of cuDNN's eight legacy algorithms
    (``cudnnFindConvolutionForwardAlgorithmEx``). On an H200, measured made Inception-v3's sequential cuDNN
    program in a CUDA graph 1.47x faster than legacy (docs/gpu_check_h200_2026-11-27.md). The environment variable ``TVM_INTEROP_CUDNN_ENGINES`` sets the initial policy. None when
    no extension is loaded."""
    import tvm_ffi

    if policy is not None and policy not in CUDNN_ENGINE_POLICIES:
        raise ValueError(f"unknown cuDNN engine policy {policy!r}; use one of {', '.join(CUDNN_ENGINE_POLICIES)}")
    f = tvm_ffi.get_global_func("tvm_interop.cudnn.set_engine_policy", allow_missing=True)
    if f is None:
        return None
    if policy is None:
        return cudnn_conv_choices()["policy"]
    return str(f(policy))


def cudnn_conv_choices(reset: bool = False) -> dict | None:
    """What the measured policy chose per convolution shape in this process (``{"policy", "choices": [{"shape",
    "chosen", "legacy_us", "chosen_us", "tried": [[label, us]], "dropped": [why]}]}``), or None when no extension
    is loaded. ``reset``: forget the choices after reading them (the next calls measure again)."""
    import tvm_ffi

    f = tvm_ffi.get_global_func("tvm_interop.cudnn.conv_choices", allow_missing=True)
    return None if f is None else json.loads(f(bool(reset)))


def extension_info() -> dict | None:
    """``tvm_interop.native.info()`` parsed, or None when no extension is loaded."""
    import tvm_ffi

    f = tvm_ffi.get_global_func("tvm_interop.native.info", allow_missing=True)
    return None if f is None else json.loads(f())
