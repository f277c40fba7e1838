"""CUDA kernels as binaries in the deployable library: one fatbin with a cubin for every requested arch.

Why: without a CUDA runtime in the build process (this machine has no GPU), TVM 0.27's ``target.build.cuda``
keeps the generated CUDA *source* in the library (its fallback module, format ``cuda``); TVM's runtime then
compiles it when the library is loaded, through the Python callback ``tvm_callback_cuda_compile``, which needs
TVM's compiler library and nvcc on the deployment machine. On the H100 nothing loaded with TVM's runtime alone.

How TVM decides (``src/runtime/cuda/cuda_module.cc``): the codegen hands the source to ``ffi.Module.create.cuda``,
which compiles it through ``tvm_callback_cuda_compile`` — but that factory lives in ``libtvm_runtime_cuda.so``,
which cannot load without a CUDA driver, so on a GPU-less build machine the codegen's fallback module keeps the
source (format ``cuda``, the callback is never called). ``ffi.Module.load_from_bytes.cuda`` then JIT-compiles any
``cuda``-format payload at load; every other format goes to ``cuModuleLoadData`` as is, lazily, at the first
launch on a device. So a build-time compile callback would not help here: the build compiles the source itself.

The build compiles the source here with nvcc into a fatbin holding SASS for each arch (:func:`nvcc_command`:
TVM's own nvcc flags — ``-O3 --use_fast_math``, the half/bfloat16 operator macros, ``--expt-relaxed-constexpr
--expt-extended-lambda``, ptxas ``--register-usage-level=10`` — with ``-gencode arch=compute_XY,code=sm_XY`` per
arch instead of TVM's single arch; TVM's ``TVM_CUDA_NVCC_NO_FAST_MATH`` / ``TVM_CUDA_PTXAS_*`` variables are
honoured), and the export writes that fatbin into the library in place of the source: the CUDA module's serialized
form is ``[format][function table][code]``, the same for TVM's fallback and real CUDA modules, so only the format
(``cuda`` -> ``fatbin``) and the code change. A deployed library then needs TVM's runtime and the CUDA driver only.

No PTX goes in (decided): PTX would let a *newer* GPU run the library by having the driver JIT-compile every kernel
at first load (seconds to minutes for a large model, with ptxas settings nobody chose), and it would hide a
missing arch instead of reporting it. A library runs where one of its cubins runs (same major, equal or newer
minor: an sm_80 cubin runs on sm_86); anywhere else the runtime refuses it with the ``--arch`` to rebuild with.

The arches are recorded in the plan (``plan.meta["cuda_arches"]``) so the runtime can refuse a GPU the library
has no binary for, with a clear message, before any kernel is loaded (``runtime.cuda.check_arch``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import struct
import subprocess
import tempfile
import time

from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.library_file import (join_library_blob, length_prefixed, library_modules, read_u64,
                                              split_library_blob)


log = logging.getLogger(__name__)

FATBIN_MAGIC = 0xBA55ED50
CUDA_SOURCE_FORMAT = "cuda"
BINARY_FORMAT = "fatbin"

_compiled: dict[str, bytes] = {}   # sha256(nvcc flags + source) -> fatbin: compiled by the build, reused by the export


# TVM's nvcc flags (``tvm.support.nvcc._compile_cuda_nvcc``), so the kernels are the ones TVM itself would build.
TVM_NVCC_FLAGS = ("-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
                  "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                  "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
                  "--expt-relaxed-constexpr", "--expt-extended-lambda")


def gencode_flags(arches: list[str]) -> list[str]:
    """``-gencode arch=compute_XY,code=sm_XY`` per arch: SASS only (``code=sm_``), no PTX (``code=compute_``)."""
    flags: list[str] = []
    for a in arches:
        cc = a[3:]
        flags += ["-gencode", f"arch=compute_{cc},code=sm_{cc}"]
    return flags


def nvcc_flags(arches: list[str]) -> list[str]:
    """Every nvcc flag of the kernel compile but the files: TVM's flags and environment variables (fast math
    unless ``TVM_CUDA_NVCC_NO_FAST_MATH``; ptxas ``TVM_CUDA_PTXAS_REG_LEVEL`` / ``TVM_CUDA_PTXAS_EXTRA_OPTS``;
    not ptxas ``-v``, which only prints register use), one cubin per arch."""
    fast_math = [] if os.environ.get("TVM_CUDA_NVCC_NO_FAST_MATH") else ["--use_fast_math"]
    ptxas = [f"--register-usage-level={os.environ.get('TVM_CUDA_PTXAS_REG_LEVEL', '10')}",
             "--warn-on-local-memory-usage", *shlex.split(os.environ.get("TVM_CUDA_PTXAS_EXTRA_OPTS", ""))]
    return ["--fatbin", *TVM_NVCC_FLAGS, *fast_math, f"--ptxas-options={','.join(ptxas)}", *gencode_flags(arches)]


def nvcc_command(nvcc: str, source_path: str, out_path: str, arches: list[str]) -> list[str]:
    return [nvcc, *nvcc_flags(arches), "-o", out_path, source_path]


# A device function whose name ends with this is compiled as a call (``__noinline__``): the flow runs' subroutines
# built with ``inline=False`` (``passes.wave.subroutine``). TVM's codegen has no way to mark a function, and the
# name travels with the source, so the mark cannot be lost between the build and the export's compile.
NOINLINE_SUFFIX = "__noinline"
_NOINLINE_DECL = re.compile(r'(extern "C" __device__ )(void \w+' + NOINLINE_SUFFIX + r'\()')


def with_noinline_functions(source: str) -> str:
    """``source`` with every device function named ``*__noinline`` declared ``__noinline__`` (nvcc otherwise
    inlines most of them into their caller)."""
    return _NOINLINE_DECL.sub(r"\1__noinline__ \2", source)


def _key(source: str, flags: list[str]) -> str:
    return hashlib.sha256((" ".join(flags) + "\0" + source).encode()).hexdigest()


def compile_fatbin(source: str, arches: list[str]) -> bytes:
    """nvcc (:func:`nvcc_command`) -> a fatbin with one cubin per arch (cached per source and flags in this
    process: the build compiles, the export reuses)."""
    source = with_noinline_functions(source)
    key = _key(source, nvcc_flags(arches))
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
        proc = subprocess.run(nvcc_command(nvcc, src, out, arches), capture_output=True, text=True)
        if proc.returncode != 0:
            errors = [ln for ln in (proc.stderr or proc.stdout).splitlines() if "error" in ln.lower()]
            tail = (errors or (proc.stderr or proc.stdout).strip().splitlines())[-5:]
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
    out, stack, seen = [], [lib], []
    while stack:
        m = stack.pop(0)
        if any(m.same_as(s) for s in seen):   # a module imported twice is one module (and one blob entry)
            continue
        seen.append(m)
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
def cuda_payload_parts(payload: bytes, source: str | None = None) -> tuple[str, bytes, bytes]:
    """A CUDA module's serialized form -> (format, function table bytes, code). The code is the last field;
    when ``source`` is known its length is matched too."""
    ln, pos = read_u64(payload, 0)
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


def with_binary_cuda_modules(blob: bytes, arches: list[str], sources: list[str] = ()) -> bytes:
    """The blob with each CUDA module's code replaced by the fatbin of its source. The source is the module's own
    payload when TVM kept it (format ``cuda``: a build without a CUDA driver); a module TVM already compiled (a
    build on a GPU machine: one arch, source not serialized) takes the in-memory ``sources``, which pair with it
    only when there is one CUDA module (the packer's module order is not the import order)."""
    header, mods = split_library_blob(blob)
    cuda = [i for i, (k, _) in enumerate(mods) if k == "cuda"]
    for i in cuda:
        fmt, fmap, code = cuda_payload_parts(mods[i][1])
        if fmt == CUDA_SOURCE_FORMAT:
            source = code.decode()
        elif len(cuda) == 1 and len(sources) == 1:
            source = sources[0]
        else:
            raise InteropError(f"cannot pair {len(cuda)} compiled CUDA module(s) with their sources to rebuild them "
                               "for the requested arches")
        code = compile_fatbin(source, arches)
        mods[i] = ("cuda", length_prefixed(BINARY_FORMAT.encode()) + fmap + length_prefixed(code))
    return join_library_blob(header, mods)


def blob_as_c(blob: bytes) -> str:
    """The C file that defines tvm-ffi's ``__tvm_ffi__library_bin`` symbol (what TVM's own packer writes)."""
    rows = ",\n".join("  " + ",".join(f"0x{c:02x}" for c in blob[i:i + 20]) for i in range(0, len(blob), 20))
    return ("#ifdef __cplusplus\nextern \"C\" {\n#endif\n"
            "__attribute__((visibility(\"default\"))) extern const unsigned char __tvm_ffi__library_bin[];\n"
            f"const unsigned char __tvm_ffi__library_bin[{len(blob)}] = {{\n{rows}\n}};\n"
            "#ifdef __cplusplus\n}\n#endif\n")


def write_blob(blob: bytes, workspace_dir: str) -> str:
    """The file that defines ``__tvm_ffi__library_bin`` for the linker: an object file written by TVM's own LLVM
    blob codegen (what ``export_library`` does for a library it packs itself), or, without LLVM, a C file.

    Why not always the C file: the blob holds the model's weights, and gcc compiling them as an array literal
    took 341 s of the 382 s that ``compile`` + ``export`` of Inception-v3 (96 MB blob) took for CUDA on the 2-core
    build machine; the object file took 4.4 s."""
    import tvm_ffi

    codegen_blob = tvm_ffi.get_global_func("codegen.codegen_blob", allow_missing=True)
    triple = _host_triple()
    if codegen_blob is None or not triple:
        path_c = os.path.join(workspace_dir, "devc.c")
        with open(path_c, "w", encoding="utf-8") as f:
            f.write(blob_as_c(blob))
        return path_c
    path_o = os.path.join(workspace_dir, "devc.o")
    codegen_blob(blob, False, json.dumps({"kind": "llvm", "mtriple": triple}), "").write_to_file(path_o)
    return path_o


def _host_triple() -> str | None:
    """The target triple of the compiler that links the library (as TVM's ``export_library`` asks it)."""
    from tvm.support import cc

    get = getattr(cc.create_shared, "get_target_triple", None)
    triple = get() if get is not None else None
    return triple.strip() if triple else None


def export_cuda_library(library, path: str, arches: list[str], addons: list[str] | None = None) -> None:
    """Export a CUDA executable with fatbins (one cubin per arch) instead of CUDA source (atomic write).
    ``addons``: object files linked into the library (the native extension of library units: its functions
    register when the ``.so`` is loaded, so a deployed model needs no other file of ours)."""
    import tvm_ffi

    from tvm_interop.runtime.model import export_library

    sources = cuda_sources(library)
    lib = getattr(library, "mod", library)

    def pack_imports(mod, is_system_lib, prefix, workspace_dir):
        if is_system_lib or prefix:
            raise InteropError("system-library export is not supported for CUDA models")
        blob = bytes(tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")(lib).numpy().tobytes())
        return write_blob(with_binary_cuda_modules(blob, arches, sources), workspace_dir)

    missing = [a for a in addons or [] if not os.path.exists(a)]
    if missing:
        raise InteropError(f"cannot export: the native extension object {missing[0]} is gone (it was built with the "
                           "model, in the tvm-interop cache); compile the model again on this machine")
    export_library(library, path, fpack_imports=pack_imports, **({"addons": list(addons)} if addons else {}))


# ---------------------------------------------------------------------------------------------- inspection
def library_cuda_images(path: str) -> list[tuple[str, bytes]]:
    """(format, code) of each CUDA module inside an exported ``.so``, read from its bytes (no TVM, no CUDA tool)."""
    return [cuda_payload_parts(payload)[::2] for kind, payload in library_modules(path) if kind == "cuda"]


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


def fatbin_cubins(image: bytes) -> list[tuple[str, bytes]]:
    """(arch from the entry header, payload) of each SASS entry: an ELF cubin unless the entry is compressed."""
    out, pos = [], struct.unpack_from("<H", image, 6)[0]
    for kind, arch in fatbin_entries(image):
        hsize, psize = struct.unpack_from("<IQ", image, pos + 4)
        if kind == "sass":
            out.append((arch, image[pos + hsize:pos + hsize + psize]))
        pos += hsize + psize
    return out


def cubin_arch(cubin: bytes) -> str | None:
    """The SM arch a cubin's own ELF header names (``e_flags``; ABI version 8+, CUDA 12.8+, moved it to bits
    8-15), or None for data that is not an uncompressed CUDA ELF: a check of the fatbin headers that needs no
    cuobjdump."""
    if cubin[:4] != b"\x7fELF" or struct.unpack_from("<H", cubin, 18)[0] != EM_CUDA:
        return None
    flags = struct.unpack_from("<I", cubin, 48)[0]
    return f"sm_{(flags >> 8) & 0xFF if cubin[8] >= 8 else flags & 0xFF}"


EM_CUDA = 190


def inspect_cuda_library(path: str) -> dict:
    """What the CUDA modules of an exported library hold: ``formats`` (one per module), ``arches`` (the SASS
    arches every module has), ``ptx`` (PTX entries, which the driver would JIT-compile), and ``source_left``
    (a module still holds CUDA source: it would need TVM's compiler and nvcc at load). For the build's and the
    GPU check's assertions."""
    images = library_cuda_images(path)
    binaries = [code for fmt, code in images if fmt != CUDA_SOURCE_FORMAT]
    per_module = [set(fatbin_arches(code)) for code in binaries]
    arches = sorted(set.intersection(*per_module), key=lambda a: int(a[3:])) if per_module else []
    return {"modules": len(images), "formats": [fmt for fmt, _ in images], "arches": arches,
            "ptx": sorted({a for code in binaries for k, a in fatbin_entries(code) if k == "ptx"}),
            "source_left": any(fmt == CUDA_SOURCE_FORMAT for fmt, _ in images)}
