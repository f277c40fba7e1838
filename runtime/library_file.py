"""An exported library read as a file: its modules and its execution plan, without TVM, a compiler or a device.

Why: loading a CUDA library needs TVM's CUDA runtime and a GPU (TVM refuses to create even a CPU VM over
kernels it cannot load), yet what a library holds — which model, schedule, target, arches and candidate programs
— is wanted where it was built, on a machine without a GPU (``tvm-interop show m_cuda.so``). Everything needed
is in the file's bytes:

* tvm-ffi packs a library's imported modules into one blob, the data of the ``__tvm_ffi__library_bin`` symbol:
  ``[u64 size][u64 n, n x u64 import tree][u64 n, n x u64 child index]`` then per module ``[u64 len][type key]``
  and, except for the host library itself (``_lib``), ``[u64 len][payload]``;
* the Relax VM executable's payload (type key ``relax.VMExecutable``) holds its constant pool, where a string is
  ``[i32 type index][u64 len][bytes]``; the plan is the string constant that ``__tvm_interop_plan`` returns
  (``passes.build.attach_runtime_payload``), a compact JSON object that starts with its format name.

The ELF reader is a few lines instead of a dependency: the deployment machine may lack binutils and pyelftools.
"""
from __future__ import annotations

import os
import struct

from .errors import ExportError
from .plan import PLAN_FORMAT, ExecutionPlan

LIBRARY_BLOB_SYMBOL = b"__tvm_ffi__library_bin"
VM_EXECUTABLE_KIND = "relax.VMExecutable"
HOST_LIBRARY_KIND = "_lib"
_PLAN_START = b'{"format":"' + PLAN_FORMAT.encode() + b'"'   # ExecutionPlan.dumps: compact, "format" first
_SECTION = struct.Struct("<IIQQQQIIQQ")   # Elf64_Shdr: name type flags addr offset size link info addralign entsize
_SYMBOL = struct.Struct("<IBBHQQ")       # Elf64_Sym: name info other shndx value size
_SYMBOL_TABLES = (2, 11)                 # SHT_SYMTAB, SHT_DYNSYM


def elf_symbol_data(data: bytes, name: bytes) -> bytes | None:
    """The bytes of a defined data symbol of a 64-bit little-endian ELF file, or None (not such a file, no such
    symbol, or a file cut short)."""
    if data[:6] != b"\x7fELF\x02\x01":
        return None
    try:
        found = _find_symbol(data, name)
    except (struct.error, IndexError):
        return None
    return found if found is not None and len(found) > 0 else None


def _find_symbol(data: bytes, name: bytes) -> bytes | None:
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [_SECTION.unpack_from(data, shoff + k * shentsize) for k in range(shnum)]
    for sec in sections:
        if sec[1] not in _SYMBOL_TABLES:
            continue
        strtab = sections[sec[6]][4]
        for off in range(sec[4], sec[4] + sec[5], _SYMBOL.size):
            st_name, _info, _other, shndx, value, size = _SYMBOL.unpack_from(data, off)
            at = strtab + st_name
            if data[at:at + len(name) + 1] == name + b"\0" and 0 < shndx < len(sections):
                host = sections[shndx]
                start = host[4] + value - host[3]
                return data[start:start + size]
    return None


def read_u64(b: bytes, pos: int) -> tuple[int, int]:
    return struct.unpack_from("<Q", b, pos)[0], pos + 8


def length_prefixed(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def split_library_blob(blob: bytes) -> tuple[bytes, list[tuple[str, bytes | None]]]:
    """tvm-ffi's packed-imports blob -> (header: size, import tree), [(kind, payload)] (``_lib``: no payload)."""
    try:
        pos = 8
        n, pos = read_u64(blob, pos)
        pos += 8 * n
        n, pos = read_u64(blob, pos)
        pos += 8 * n
        header = blob[8:pos]
        mods: list[tuple[str, bytes | None]] = []
        while pos < len(blob):
            ln, pos = read_u64(blob, pos)
            kind = blob[pos:pos + ln].decode()
            pos += ln
            if kind == HOST_LIBRARY_KIND:
                mods.append((kind, None))
                continue
            ln, pos = read_u64(blob, pos)
            mods.append((kind, blob[pos:pos + ln]))
            pos += ln
    except (struct.error, UnicodeDecodeError):
        pos = -1
    if pos != len(blob):
        raise ExportError("unexpected layout of TVM's library blob (tvm-ffi version mismatch?)")
    return header, mods


def join_library_blob(header: bytes, mods: list[tuple[str, bytes | None]]) -> bytes:
    body = header
    for kind, payload in mods:
        body += length_prefixed(kind.encode())
        if payload is not None:
            body += length_prefixed(payload)
    return struct.pack("<Q", len(body)) + body


def library_modules(path: str) -> list[tuple[str, bytes | None]]:
    """(type key, payload) of every module packed into an exported library, e.g. ``relax.VMExecutable``,
    ``_lib`` (the host code, no payload), ``cuda``."""
    if not os.path.exists(path):
        raise ExportError(f"{path}: no such file")
    with open(path, "rb") as f:
        data = f.read()
    blob = elf_symbol_data(data, LIBRARY_BLOB_SYMBOL)
    if blob is None:
        raise ExportError(f"{path} is not a library exported by TVM (no {LIBRARY_BLOB_SYMBOL.decode()} symbol)")
    return split_library_blob(blob)[1]


def plan_from_vm_payload(payload: bytes) -> ExecutionPlan | None:
    """The execution plan in a serialized VM executable's constant pool, or None when it carries none."""
    at = payload.find(_PLAN_START)
    if at < 12:
        return None
    (size,) = struct.unpack_from("<Q", payload, at - 8)
    if at + size > len(payload):
        raise ExportError("the library's execution plan is truncated")
    return ExecutionPlan.loads(payload[at:at + size].decode("utf-8", errors="replace"))


def read_library(path: str) -> tuple[ExecutionPlan, list[str]]:
    """(the execution plan, the type keys of its modules) of an exported tvm-interop library, read from its bytes:
    no TVM runtime, no device."""
    mods = library_modules(path)
    for kind, payload in mods:
        if kind == VM_EXECUTABLE_KIND and payload is not None:
            plan = plan_from_vm_payload(payload)
            if plan is not None:
                return plan, [k for k, _ in mods]
    raise ExportError(f"{path} is a TVM library but not a tvm-interop model (no execution plan inside)")
