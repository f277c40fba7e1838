"""Builds tvm-interop's native CUDA extension (``runtime/native/tvm_interop_cuda.cc``) with nvcc.

The source is host C++ only (no device code): nvcc is used because a CUDA model's build already needs it and it
knows the CUDA include folder. Two artifacts from one compile:

- ``tvm_interop_cuda.o``: a relocatable object for ``export_library(path, addons=[obj])``, so an exported model
  carries the extension and registers its globals when TVM's runtime loads it;
- ``libtvm_interop_cuda.so``: the same code as a shared library, for in-process runs
  (``tvm_interop.runtime.native_libs.load_extension``).

Neither links any CUDA library (``--cudart none``): the extension ``dlopen``s them on first use. The headers are
needed at build time: CUDA's (nvcc's toolkit), cuDNN's (pip ``nvidia-cudnn-cu13``: ``nvidia/cudnn/include``),
cuBLAS's (pip ``nvidia-cublas``: ``nvidia/cu13/include``) and tvm-ffi's (``tvm_ffi.libinfo``), else a toolkit's.

Builds are cached in ``$TVM_INTEROP_CACHE/native/<hash>/`` (default ``~/.cache/tvm-interop/native/``), keyed by a
hash of the sources, the flags, nvcc's and the host compiler's versions and the headers' version lines; a build
is made in a temporary folder and renamed into place, so a concurrent process sees either nothing or a complete
build.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.native_libs import (EXTENSION_FUNCTIONS, NATIVE_SOURCE_DIR, OBJECT_NAME,
                                             SHARED_LIBRARY_NAME)

# Compile flags. -fvisibility=hidden: the extension exports nothing (it registers through tvm-ffi), so two copies
# in one process (two exported models) cannot interpose each other's symbols.
CXX_FLAGS = ["-std=c++17", "-O2", "-Xcompiler", "-fPIC,-fvisibility=hidden,-Wall"]
LINK_FLAGS = ["-shared", "--cudart", "none"]

DEFAULT_TOOLKIT = "/usr/local/cuda"
_CUDNN_HINT = "pip install nvidia-cudnn-cu13 (headers in site-packages/nvidia/cudnn/include)"
_CUBLAS_HINT = "pip install nvidia-cublas (headers in site-packages/nvidia/cu13/include)"


class NativeBuildError(InteropError):
    """The native extension cannot be built: nvcc or a header is missing, or the compiler failed."""


@dataclass(frozen=True)
class NativeExtension:
    object_path: str        # tvm_interop_cuda.o: pass to export_library(addons=[...])
    shared_path: str        # libtvm_interop_cuda.so: load with runtime.native_libs.load_extension
    source_hash: str        # the cache key (sources, flags, compiler and header versions)
    functions: tuple[str, ...] = field(default=EXTENSION_FUNCTIONS)


def default_cache_dir() -> Path:
    base = os.environ.get("TVM_INTEROP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tvm-interop")
    return Path(base) / "native"


def _toolkit_roots() -> list[str]:
    return [b for b in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), DEFAULT_TOOLKIT) if b]


def find_nvcc() -> str:
    """nvcc on PATH, else in CUDA_HOME / CUDA_PATH / /usr/local/cuda; NativeBuildError when none."""
    found = shutil.which("nvcc")
    if found:
        return found
    for base in _toolkit_roots():
        cand = os.path.join(base, "bin", "nvcc")
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise NativeBuildError("nvcc not found (not on PATH, nor in $CUDA_HOME/bin or /usr/local/cuda/bin): the native "
                           "CUDA extension (cuDNN/cuBLAS calls, event pools) needs the CUDA 13 toolkit's nvcc to "
                           "build; install the toolkit or set CUDA_HOME")


def _cuda_home(nvcc: str) -> Path:
    """The toolkit nvcc belongs to: its own ``TOP`` (nvcc may be a wrapper script outside the toolkit), else the
    folder above its real path."""
    try:
        proc = subprocess.run([nvcc, "--dryrun", "-x", "c++", "-E", os.devnull], capture_output=True, text=True,
                              timeout=60)
        m = re.search(r"^#\$ TOP=(.+)$", proc.stderr + proc.stdout, flags=re.M)
        if m:
            return Path(os.path.normpath(m.group(1).strip()))
    except (OSError, subprocess.SubprocessError):
        pass
    return Path(os.path.realpath(nvcc)).parent.parent


def _nvidia_include(sub: str) -> list[Path]:
    try:
        import nvidia  # type: ignore
    except ImportError:
        return []
    return [Path(r) / sub / "include" for r in getattr(nvidia, "__path__", [])]


def _find_header(header: str, candidates: list[Path], what: str, hint: str) -> Path:
    for d in candidates:
        if (d / header).is_file():
            return d
    tried = ", ".join(str(d) for d in candidates) or "nowhere"
    raise NativeBuildError(f"{what} header {header} not found (looked in {tried}); {hint}")


def include_dirs(nvcc: str | None = None) -> dict[str, Path]:
    """The include folders the extension needs: cuda, cudnn, cublas, tvm_ffi, dlpack. NativeBuildError naming
    the missing one and how to install it."""
    import tvm_ffi.libinfo

    nvcc = nvcc or find_nvcc()
    cuda = _cuda_home(nvcc)
    toolkit = [cuda / "include"] + [Path(b) / "include" for b in _toolkit_roots()]
    return {
        "cuda": _find_header("cuda_runtime_api.h", toolkit, "CUDA", "install the CUDA 13 toolkit or set CUDA_HOME"),
        "cudnn": _find_header("cudnn.h", _nvidia_include("cudnn") + toolkit, "cuDNN", _CUDNN_HINT),
        "cublas": _find_header("cublasLt.h", _nvidia_include("cu13") + _nvidia_include("cublas") + toolkit,
                               "cuBLAS", _CUBLAS_HINT),
        "tvm_ffi": Path(tvm_ffi.libinfo.find_include_path()),
        "dlpack": Path(tvm_ffi.libinfo.find_dlpack_include_path()),
    }


def _version_lines(path: Path, pattern: str) -> str:
    try:
        return "\n".join(re.findall(pattern, path.read_text(errors="replace"), flags=re.M))
    except OSError:
        return ""


def _tool_version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _sources() -> list[Path]:
    files = sorted(p for p in NATIVE_SOURCE_DIR.glob("*") if p.suffix in (".cc", ".h"))
    if not any(p.suffix == ".cc" for p in files):
        raise NativeBuildError(f"the extension's source is missing from {NATIVE_SOURCE_DIR} (a broken install? the "
                               "wheel must ship runtime/native/*.cc as package data)")
    return files


def build_key(nvcc: str, includes: dict[str, Path]) -> str:
    """Hash of everything that changes the built code: sources, flags, compilers, header versions."""
    import tvm_ffi

    h = hashlib.sha256()
    for src in _sources():
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    h.update(json.dumps([CXX_FLAGS, LINK_FLAGS]).encode())
    h.update(_tool_version([nvcc, "--version"]).encode())
    h.update(_tool_version([os.environ.get("CXX", "g++"), "--version"]).encode())
    h.update(getattr(tvm_ffi, "__version__", "?").encode())
    h.update(_version_lines(includes["cuda"] / "cuda_runtime_api.h", r"^#define CUDART_VERSION.*$").encode())
    h.update(_version_lines(includes["cudnn"] / "cudnn_version.h", r"^#define CUDNN_(?:MAJOR|MINOR|PATCHLEVEL).*$")
             .encode())
    h.update(_version_lines(includes["cublas"] / "cublas_api.h", r"^#define CUBLAS_VER_.*$").encode())
    return h.hexdigest()[:20]


def _run(cmd: list[str], what: str) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeBuildError(f"{what} could not run: {e}") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-4000:]
        raise NativeBuildError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")


def _compile(nvcc: str, includes: dict[str, Path], out: Path) -> None:
    incs = [f"-I{includes[k]}" for k in ("cuda", "cudnn", "cublas", "tvm_ffi", "dlpack")]
    src = next(p for p in _sources() if p.name == "tvm_interop_cuda.cc")
    obj = out / OBJECT_NAME
    # -x c++: the file is host C++; nvcc hands it to the host compiler without CUDA preprocessing.
    _run([nvcc, "-x", "c++", *CXX_FLAGS, *incs, "-c", str(src), "-o", str(obj)], "compiling the native extension")
    _run([nvcc, *LINK_FLAGS, str(obj), "-o", str(out / SHARED_LIBRARY_NAME)], "linking the native extension")


def build_extension(out_dir: str | os.PathLike | None = None, arch: str | None = None) -> NativeExtension:
    """Build (or find in the cache) the extension; returns its object and shared library paths.

    ``out_dir``: the cache folder (default ``$TVM_INTEROP_CACHE/native`` or ``~/.cache/tvm-interop/native``);
    each build lives in ``<out_dir>/<hash>/``. ``arch`` is accepted for symmetry with the kernel builds and
    ignored: the extension has no device code, so one build serves every GPU. Raises NativeBuildError (an
    InteropError) naming what is missing (nvcc, a header) and how to install it, or the compiler's message."""
    del arch  # host code only: nothing depends on the GPU architecture
    nvcc = find_nvcc()
    includes = include_dirs(nvcc)
    key = build_key(nvcc, includes)
    root = Path(out_dir) if out_dir is not None else default_cache_dir()
    final = root / key
    ext = NativeExtension(str(final / OBJECT_NAME), str(final / SHARED_LIBRARY_NAME), key)
    if (final / OBJECT_NAME).is_file() and (final / SHARED_LIBRARY_NAME).is_file():
        return ext
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.tmp-", dir=root))
    try:
        _compile(nvcc, includes, tmp)
        (tmp / "build.json").write_text(json.dumps(
            {"hash": key, "nvcc": nvcc, "includes": {k: str(v) for k, v in includes.items()},
             "functions": list(EXTENSION_FUNCTIONS)}, indent=1))
        try:
            os.rename(tmp, final)  # atomic; fails when another process finished the same build first
        except OSError:
            if not (final / SHARED_LIBRARY_NAME).is_file():
                raise
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
    return ext
