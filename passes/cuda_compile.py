"""CUDA kernels as binaries in the deployable library: one fatbin with a cubin for every requested arch.

Why: without a CUDA runtime in the build process (this machine has no GPU), TVM 0.27's ``target.build.cuda``
keeps the generated CUDA *source* in the library (its fallback module, format ``cuda``); TVM's runtime then
compiles it when the library is loaded, through the Python callback ``tvm_callback_cuda_compile``, which needs
TVM's compiler library and nvcc on the deployment machine. On the H100 nothing loaded with TVM's runtime alone.

So the build compiles the source here with nvcc into a fatbin holding SASS for each arch (``-gencode
arch=compute_XY,code=sm_XY`` per arch; no PTX, so nothing is ever JIT-compiled at load), and the export writes
that fatbin into the library in place of the source: the CUDA module's serialized form is ``[format][function
table][code]``, the same for TVM's fallback and real CUDA modules, so only the format (``cuda`` -> ``fatbin``)
and the code change. A deployed library then needs TVM's runtime and the CUDA driver only.

The arches are recorded in the plan (``plan.meta["cuda_arches"]``) so the runtime can refuse a GPU the library
has no binary for, with a clear message, before any kernel is loaded (``runtime.cuda.check_arch``).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import struct
import subprocess
import tempfile
import time

from runtime.errors import InteropError


log = logging.getLogger(__name__)

FATBIN_MAGIC = 0xBA55ED50
CUDA_SOURCE_FORMAT = "cuda"
BINARY_FORMAT = "fatbin"

_compiled: dict[str, bytes] = {}   # sha256(source + arches) -> fatbin, filled by the build, used by the export


def gencode_flags(arches: list[str]) -> list[str]:
    flags: list[str] = []
    for a in arches:
        cc = a[3:]
        flags += ["-gencode", f"arch=compute_{cc},code=sm_{cc}"]
    return flags


def _key(source: str, arches: list[str]) -> str:
    return hashlib.sha256((",".join(arches) + "\0" + source).encode()).hexdigest()


def compile_fatbin(source: str, arches: list[str]) -> bytes:
    """nvcc ``--fatbin -O3`` with one cubin per arch (cached per source and arches in this process)."""
    key = _key(source, arches)
    if key in _compiled:
        return _compiled[key]
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise InteropError("building for CUDA needs nvcc (the CUDA toolkit) on PATH to compile the kernels")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tvm_interop_cuda_") as d:
        src, out = os.path.join(d, "kernels.cu"), os.path.join(d, "kernels.fatbin")
        with open(src, "w", encoding="utf-8") as f:
            f.write(source)
        cmd = [nvcc, "--fatbin", "-O3", *gencode_flags(arches), "-o", out, src]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            raise InteropError("nvcc failed to compile the CUDA kernels:\n  " + "\n  ".join(tail))
        with open(out, "rb") as f:
            data = f.read()
    log.info("CUDA kernels compiled for %s in %.1f s (%d KiB fatbin)", ",".join(arches), time.perf_counter() - t0,
             len(data) // 1024)
    _compiled[key] = data
    return data


# ---------------------------------------------------------------------------------------------- modules
def cuda_modules(library) -> list:
    """The CUDA modules imported (directly or not) by a built executable or loaded library."""
    lib = getattr(library, "mod", library)
    out, stack, seen = [], [lib], set()
    while stack:
        m = stack.pop()
        if m.same_as(lib) and id(m) in seen:
            continue
        seen.add(id(m))
        if m.kind == "cuda":
            out.append(m)
        stack.extend(m.imports)
    return out


def cuda_sources(library) -> list[str]:
    """The CUDA source of each CUDA module of a freshly built executable."""
    return [str(m.inspect_source(CUDA_SOURCE_FORMAT)) for m in cuda_modules(library)]


def compile_library_kernels(library, arches: list[str]) -> list[bytes]:
    """Compile every CUDA module's source of a built executable (done by the build, so that nvcc errors and
    time show up when the model is compiled, not when it is exported)."""
    return [compile_fatbin(src, arches) for src in cuda_sources(library) if src]


# ---------------------------------------------------------------------------------------------- the blob
def _u64(b: bytes, pos: int) -> tuple[int, int]:
    return struct.unpack_from("<Q", b, pos)[0], pos + 8


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def split_library_blob(blob: bytes) -> tuple[bytes, list[tuple[str, bytes | None]]]:
    """tvm-ffi's packed-imports blob -> (header: size, import tree), [(kind, payload)] (``_lib``: no payload)."""
    pos = 8
    n, pos = _u64(blob, pos)
    pos += 8 * n
    n, pos = _u64(blob, pos)
    pos += 8 * n
    header = blob[8:pos]
    mods: list[tuple[str, bytes | None]] = []
    while pos < len(blob):
        ln, pos = _u64(blob, pos)
        kind = blob[pos:pos + ln].decode()
        pos += ln
        if kind == "_lib":
            mods.append((kind, None))
            continue
        ln, pos = _u64(blob, pos)
        mods.append((kind, blob[pos:pos + ln]))
        pos += ln
    if pos != len(blob):
        raise InteropError("unexpected layout of TVM's library blob (tvm-ffi version mismatch?)")
    return header, mods


def join_library_blob(header: bytes, mods: list[tuple[str, bytes | None]]) -> bytes:
    body = header
    for kind, payload in mods:
        body += _string(kind.encode())
        if payload is not None:
            body += _string(payload)
    return struct.pack("<Q", len(body)) + body


def cuda_payload_parts(payload: bytes, source: str | None = None) -> tuple[str, bytes, bytes]:
    """A CUDA module's serialized form -> (format, function table bytes, code). The code is the last field;
    when ``source`` is known its length is matched too."""
    ln, pos = _u64(payload, 0)
    fmt = payload[pos:pos + ln].decode()
    pos += ln
    code_len = len(source.encode()) if source is not None else None
    # the first length-prefixed field that runs exactly to the end (a later match could be a length field
    # inside the code itself, e.g. a fatbin's own size)
    for start in range(pos, len(payload) - 7):
        n = struct.unpack_from("<Q", payload, start)[0]
        if n == len(payload) - start - 8 and (code_len is None or n == code_len):
            return fmt, payload[pos:start], payload[start + 8:]
    raise InteropError("could not find the kernel code in a CUDA module (unexpected serialization)")


def with_binary_cuda_modules(blob: bytes, binaries: list[bytes]) -> bytes:
    """The blob with each CUDA module's source replaced by the given binaries, in module order."""
    header, mods = split_library_blob(blob)
    cuda = [i for i, (k, _) in enumerate(mods) if k == "cuda"]
    if len(cuda) != len(binaries):
        raise InteropError(f"the library has {len(cuda)} CUDA module(s) but {len(binaries)} binaries were built")
    for i, binary in zip(cuda, binaries):
        _, fmap, _ = cuda_payload_parts(mods[i][1])
        mods[i] = ("cuda", _string(BINARY_FORMAT.encode()) + fmap + _string(binary))
    return join_library_blob(header, mods)


def blob_as_c(blob: bytes) -> str:
    """The C file that defines tvm-ffi's ``__tvm_ffi__library_bin`` symbol (what TVM's own packer writes)."""
    rows = ",\n".join("  " + ",".join(f"0x{c:02x}" for c in blob[i:i + 20]) for i in range(0, len(blob), 20))
    return ("#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
            "__attribute__((visibility(\"default\"))) extern const unsigned char __tvm_ffi__library_bin[];\n"
            f"const unsigned char __tvm_ffi__library_bin[{len(blob)}] = {{\n{rows}\n}};\n"
            "#ifdef __cplusplus\n}\n#endif\n")


def export_cuda_library(library, path: str, arches: list[str]) -> None:
    """Export a CUDA executable with fatbins (one cubin per arch) instead of CUDA source (atomic write)."""
    import tvm_ffi

    from runtime.model import export_library

    sources = cuda_sources(library)
    binaries = [compile_fatbin(src, arches) for src in sources]
    lib = getattr(library, "mod", library)

    def pack_imports(mod, is_system_lib, prefix, workspace_dir):
        if is_system_lib or prefix:
            raise InteropError("system-library export is not supported for CUDA models")
        blob = bytes(tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")(lib).numpy().tobytes())
        path_c = os.path.join(workspace_dir, "devc.c")
        with open(path_c, "w", encoding="utf-8") as f:
            f.write(blob_as_c(with_binary_cuda_modules(blob, binaries)))
        return path_c

    export_library(library, path, fpack_imports=pack_imports)


# ---------------------------------------------------------------------------------------------- inspection
def library_cuda_images(path: str) -> list[tuple[str, bytes]]:
    """(format, code) of each CUDA module inside an exported ``.so`` (read from its bytes; no TVM needed)."""
    data = open(path, "rb").read()
    out = []
    for start in _find_blob_starts(data):
        try:
            _, mods = split_library_blob(data[start:start + 8 + struct.unpack_from("<Q", data, start)[0]])
        except (InteropError, struct.error, UnicodeDecodeError):
            continue
        for kind, payload in mods:
            if kind == "cuda":
                fmt, _, code = cuda_payload_parts(payload)
                out.append((fmt, code))
        if out:
            return out
    return out


def _find_blob_starts(data: bytes):
    """Offsets where a packed-imports blob may start (its first module kind is a known executable kind)."""
    for marker in (b"relax.VMExecutable",):
        i = data.find(marker)
        while i != -1:
            # header: size, row_ptr vector, child vector, then the kind string's length
            for back in range(16, 8 * 64, 8):
                s = i - 8 - back
                if s >= 0 and struct.unpack_from("<Q", data, i - 8)[0] == len(marker):
                    size = struct.unpack_from("<Q", data, s)[0]
                    if 0 < size <= len(data) - s - 8:
                        yield s
            i = data.find(marker, i + 1)


def fatbin_entries(image: bytes) -> list[tuple[str, str]]:
    """The entries of a fatbin as (kind, arch): kind ``sass`` (a cubin) or ``ptx``; arch ``sm_XY``. Read from
    the fatbin container's headers (magic 0xBA55ED50, then entries with kind, header size, payload size and
    arch), so no CUDA tool is needed."""
    magic, _version, header_size, size = struct.unpack_from("<IHHQ", image, 0)
    if magic != FATBIN_MAGIC:
        raise InteropError("not a fatbin (bad magic)")
    pos, end, out = header_size, header_size + size, []
    while pos < end:
        kind, _unk, hsize, psize = struct.unpack_from("<HHIQ", image, pos)
        arch = struct.unpack_from("<I", image, pos + 28)[0]
        out.append(({1: "ptx", 2: "sass"}.get(kind, f"kind{kind}"), f"sm_{arch}"))
        pos += hsize + psize
    return out


def fatbin_arches(image: bytes) -> list[str]:
    """The SASS arches of a fatbin, e.g. ``["sm_80", "sm_90"]``."""
    return sorted({a for k, a in fatbin_entries(image) if k == "sass"}, key=lambda a: int(a[3:]))
