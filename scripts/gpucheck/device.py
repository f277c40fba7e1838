"""What the GPU check's device-side steps (``run``, ``diagnose``) need besides running programs: the device, the
libraries' kernel formats, the environment the numbers were measured in, and proof that only TVM's runtime was used.

Everything here works with TVM's runtime alone (``TVM_USE_RUNTIME_LIB=1``, no ``libtvm_compiler.so``, no nvcc):
the GPU machine has nothing else. Environment queries go through ``nvidia-smi``, the loaded CUDA libraries
(ctypes) and ``tvm.cuda(0)``'s attributes, and each one that fails reads "not found" instead of stopping a run.
"""
from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
from typing import Any, Callable, Iterable

# Modules that belong to TVM's compiler side (or to this project's compile-time code). The device-side steps
# import none of them: every ``tvm_interop`` module except the package itself (a lazy front door) and
# ``tvm_interop.runtime`` is build-time code (``tvm_interop.passes``, the compile API), and ``tvm.relax`` & co.
# need libtvm_compiler.so. (``import tvm`` itself loads tvm.target, tvm.ir, tvm.te, ... in runtime-only mode
# too, so those are not a sign of anything.)
COMPILER_ONLY_MODULES = ("tvm_interop", "passes", "tvm.relax", "tvm.s_tir", "tvm.topi", "tvm.meta_schedule",
                         "tvm.dlight", "tvm.contrib.nvcc")
RUNTIME_MODULES = ("tvm_interop.runtime",)   # inside a compiler-only prefix, yet runtime-only


def is_compiler_only(name: str) -> bool:
    """Whether importing module ``name`` means compile-time code ran (``tvm_interop`` alone does not)."""
    def under(prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    if name == "tvm_interop" or any(under(p) for p in RUNTIME_MODULES):
        return False
    return any(under(p) for p in COMPILER_ONLY_MODULES)


# How TVM serializes a CUDA module inside a library's packed-imports blob: the kind (u64 length + "cuda"), the
# payload's u64 length, then the payload, which starts with the format (u64 length + name). Format "cuda" is
# source (TVM compiles it when the library is loaded: needs TVM's compiler and nvcc); the others are binaries.
_CUDA_KIND = struct.pack("<Q", 4) + b"cuda"
_CUDA_FORMATS = ("cuda", "cu", "ptx", "cubin", "fatbin")
SOURCE_FORMATS = ("cuda", "cu")
_SOURCE_MARKER = b'extern "C" __global__'

NOT_FOUND = "not found"


class SourceKernelsError(RuntimeError):
    """A library holds CUDA source: loading it would compile the kernels, which the GPU machine cannot do."""


# ---------------------------------------------------------------------------------------------- runtime only
def compiler_modules_loaded() -> list[str]:
    """The compiler-only modules this process has imported (none, on the device-side path)."""
    return sorted(m for m in sys.modules if is_compiler_only(m))


def runtime_only_status() -> dict:
    """Evidence, recorded in every report, that the step ran on TVM's runtime alone."""
    base = sys.modules.get("tvm.base")
    libs = getattr(base, "_LOADED_LIBS", {}) if base is not None else {}
    return {"tvm_compiler_loaded": "tvm_compiler" in libs, "compiler_modules": compiler_modules_loaded()}


def open_device(manifest: dict) -> tuple[Any, bool]:
    """``(device, is_gpu)`` for a manifest: ``tvm.cuda(0)`` with TVM's CUDA runtime loaded (a runtime-only TVM does
    not load it by itself), or the CPU for a dry run built with ``--target llvm``."""
    import tvm

    from tvm_interop.runtime.cuda import check_cuda_device, ensure_cuda_runtime

    if manifest.get("device", "cuda") == "cuda":
        ensure_cuda_runtime()
        return check_cuda_device(0), True
    return tvm.cpu(0), False


# ---------------------------------------------------------------------------------------------- libraries
def library_path(d: str, lib: str) -> str:
    """The path of a library, decompressed from ``lib + '.xz'`` into the temp dir when needed. The cache key is the
    compressed file's identity, so a library rebuilt under the same name is never served stale."""
    import hashlib
    import lzma
    import tempfile

    from tvm_interop.runtime import atomic

    path = os.path.join(d, lib)
    if os.path.exists(path):
        return path
    if not os.path.exists(path + ".xz"):
        raise FileNotFoundError(f"{lib}: neither {path} nor {path}.xz exists (was .gpu_check carried?)")
    st = os.stat(path + ".xz")
    tag = f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}"
    target = os.path.join(tempfile.gettempdir(), "gpu_check_libs", hashlib.sha256(tag.encode()).hexdigest()[:16],
                          os.path.basename(lib))
    if not os.path.exists(target):
        with atomic.atomic_path(target) as tmp, lzma.open(path + ".xz", "rb") as f, open(tmp, "wb") as g:
            g.write(f.read())
    return target


def _format_at(data: bytes, pos: int) -> str | None:
    """The format of a CUDA module whose payload length field starts at ``pos``, or None when the bytes there are
    not one (the kind's bytes can occur elsewhere, e.g. as a format string themselves)."""
    if pos + 16 > len(data):
        return None
    payload_len, fmt_len = struct.unpack_from("<QQ", data, pos)
    if not 0 < fmt_len <= 8 or payload_len < 8 + fmt_len or payload_len > len(data) - pos - 8:
        return None
    fmt = data[pos + 16:pos + 16 + fmt_len].decode("ascii", "replace")
    return fmt if fmt in _CUDA_FORMATS else None


def cuda_kernel_formats(path: str) -> list[str]:
    """The format of each CUDA module inside an exported library, read from its bytes (no TVM needed, nothing is
    loaded): ``[]`` for a CPU library, ``["fatbin"]`` for what ``passes.cuda_compile`` exports, ``["cuda"]`` for
    CUDA source. A library with CUDA source text but no recognisable module counts as source."""
    with open(path, "rb") as f:
        data = f.read()
    out = []
    i = data.find(_CUDA_KIND)
    while i != -1:
        fmt = _format_at(data, i + len(_CUDA_KIND))
        if fmt is not None:
            out.append(fmt)
        i = data.find(_CUDA_KIND, i + 1)
    if not out and _SOURCE_MARKER in data:
        out.append("cuda")
    return out


def check_kernels(d: str, libs: Iterable[str]) -> dict[str, list[str]]:
    """``{library: formats}`` for ``libs``; raises :class:`SourceKernelsError` naming every library that holds
    CUDA source. Run before anything is loaded: TVM would otherwise try to compile the source at load time
    (``tvm_callback_cuda_compile``), which fails deep inside the loader without TVM's compiler and nvcc."""
    formats = {lib: cuda_kernel_formats(library_path(d, lib)) for lib in dict.fromkeys(libs)}
    bad = [lib for lib, fmts in formats.items() if any(f in SOURCE_FORMATS for f in fmts)]
    if bad:
        raise SourceKernelsError(
            f"{', '.join(bad)}: the CUDA kernels are CUDA source, not binaries. Loading them would compile them "
            "on this machine, which needs TVM's compiler and nvcc; the GPU check runs on TVM's runtime only. "
            "Rebuild with 'scripts/gpu_check.sh build' (it exports fatbins through passes.cuda_compile) and carry "
            "the new .gpu_check.")
    return formats


# ---------------------------------------------------------------------------------------------- environment
def _safe(query: Callable[[], Any], default: Any = NOT_FOUND) -> Any:
    """The query's value, or ``default`` when it fails or has nothing to say."""
    try:
        value = query()
    except Exception:  # noqa: BLE001 - a missing tool or attribute must not stop a run
        return default
    return default if value in (None, "") else value


def _command_output(cmd: list[str]) -> str | None:
    """stdout of a command that exists and succeeds within 30 s, else None."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _smi_field(field: str, index: int = 0) -> str | None:
    out = _command_output(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"])
    lines = (out or "").splitlines()
    return lines[index].strip() if len(lines) > index else None


def _smi_cuda_version() -> str | None:
    """The CUDA version the driver supports, from nvidia-smi's banner."""
    m = re.search(r"CUDA Version:\s*([\d.]+)", _command_output(["nvidia-smi"]) or "")
    return m.group(1) if m else None


def _nvcc_version() -> str | None:
    """``release 13.0, V13.0.88`` from ``nvcc --version`` (the device machine may have no nvcc at all)."""
    m = re.search(r"release [^\n]+", _command_output(["nvcc", "--version"]) or "")
    return m.group(0).strip() if m else None


def _loaded_library(part: str) -> str | None:
    """Path of a shared library loaded in this process whose name contains ``part`` (Linux /proc maps)."""
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if part in os.path.basename(path):
                return path
    return None


def _cuda_version_call(lib: str | None, func: str) -> str | None:
    """``major.minor`` from a CUDA ``*GetVersion(int*)`` entry point of an already loaded library."""
    if not lib:
        return None
    v = ctypes.c_int(0)
    if getattr(ctypes.CDLL(lib), func)(ctypes.byref(v)) != 0 or v.value <= 0:
        return None
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


def _version_number(v: Any) -> str | None:
    """TVM's ``api_version`` (CUDA_VERSION at TVM's build, e.g. 13000) as ``13.0``."""
    return f"{int(v) // 1000}.{int(v) % 1000 // 10}" if v else None


def _gpu_environment(dev: Any) -> dict:
    index = _safe(lambda: int(dev.index), 0)
    return {
        "device": _safe(lambda: dev.device_name),
        "compute_capability": _safe(lambda: dev.compute_version),
        "sm_count": _safe(lambda: dev.multi_processor_count),
        "memory_gib": _safe(lambda: round(dev.total_global_memory / 2**30, 1)),
        "driver": _safe(lambda: _smi_field("driver_version", index)),
        "cuda_driver_api": _safe(lambda: _smi_cuda_version()
                                 or _cuda_version_call(_loaded_library("libcuda.so"), "cuDriverGetVersion")),
        "cuda_runtime": _safe(lambda: _cuda_version_call(_loaded_library("libcudart.so"), "cudaRuntimeGetVersion")),
        "tvm_cuda_api": _safe(lambda: _version_number(dev.api_version)),
    }


def _cpu_environment() -> dict:
    keys = ("compute_capability", "sm_count", "memory_gib", "driver", "cuda_driver_api", "cuda_runtime",
            "tvm_cuda_api")
    return {"device": f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
            **{k: None for k in keys}}


def _torch_version() -> str:
    try:
        import torch
    except ImportError:
        return "not installed"
    return f"{torch.__version__} (cuda {torch.version.cuda})"


def environment(dev: Any, is_gpu: bool) -> dict:
    """What the numbers were measured on: device, compute capability, SMs, driver, CUDA (driver API, runtime,
    TVM's), nvcc, TVM, Python, PyTorch. Runtime-only queries; a missing tool or attribute reads "not found"."""
    env = _gpu_environment(dev) if is_gpu else _cpu_environment()
    env["nvcc"] = _safe(_nvcc_version)
    env["tvm"] = _safe(lambda: __import__("tvm").__version__)
    env["python"] = platform.python_version()
    env["torch"] = _safe(_torch_version)
    env["host"] = platform.node()
    return env


ENV_LABELS = {"device": "device", "compute_capability": "compute capability", "sm_count": "SMs",
              "memory_gib": "memory (GiB)", "driver": "driver", "cuda_driver_api": "CUDA (driver API)",
              "cuda_runtime": "CUDA runtime", "tvm_cuda_api": "CUDA (TVM built with)", "nvcc": "nvcc",
              "tvm": "TVM", "python": "Python", "torch": "PyTorch", "host": "host"}


def render_environment(env: dict) -> list[str]:
    """Markdown table rows of an environment (the same in the run and the diagnose reports)."""
    lines = ["| | |", "|---|---|"]
    for k, label in ENV_LABELS.items():
        if k in env:
            lines.append(f"| {label} | {'n/a' if env[k] is None else env[k]} |")
    return lines
