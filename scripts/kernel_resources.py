"""Registers, static shared memory and blocks per SM of every kernel in a built CUDA library, read from its cubins.

Why: a fused kernel (a wave, a flow run) takes the registers and shared memory of its heaviest member, and on a
GPU that decides how many of its blocks an SM holds at once. This reads what nvcc decided from the library itself
(the ``.so`` or the ``.so.xz`` that ``scripts/gpu_check.sh build`` writes), with no CUDA tool: each cubin's
``.nv.info.<kernel>`` section (attribute EIATTR_REGCOUNT), ``.nv.shared.<kernel>`` section (its size) and the
block size TVM launches with (``__launch_bounds__``, EIATTR_MAX_THREADS), and the bytes of machine code of each kernel and of each device function
nvcc kept as a call (``.text.<name>``): the instruction cache a flow launch's members share.

    python scripts/kernel_resources.py .gpu_check_flow_randwire/libs/randwire.sched.so.xz --match flow_
"""
from __future__ import annotations

import argparse
import lzma
import os
import struct
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EIATTR_MAX_THREADS = 0x05
EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 0x04
# an SM of compute capability 9.0 (H100, H200): registers, shared memory, blocks and threads it holds at once
SM90 = {"registers": 65536, "shared": 228 * 1024, "blocks": 32, "threads": 2048}


def elf_sections(elf: bytes) -> dict[str, bytes]:
    """Name -> contents of every section of a 64-bit little-endian ELF."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    names_off, names_size = headers[shstrndx][4], headers[shstrndx][5]
    names = elf[names_off:names_off + names_size]
    out = {}
    for h in headers:
        name = names[h[0]:names.index(b"\0", h[0])].decode()
        kind, offset, size = h[1], h[4], h[5]
        out[name] = b"" if kind == 8 else elf[offset:offset + size]   # SHT_NOBITS: no bytes in the file
        out.setdefault("__sizes__", {})[name] = size
    return out


def info_attributes(data: bytes) -> list[tuple[int, bytes]]:
    """(attribute, value bytes) of an ``.nv.info`` section: records of a format byte, an attribute byte and a
    16-bit field, which for EIFMT_SVAL is the size of the value that follows and otherwise the value itself."""
    out, pos = [], 0
    while pos + 4 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        field = data[pos + 2:pos + 4]
        pos += 4
        if fmt == EIFMT_SVAL:
            size, = struct.unpack("<H", field)
            out.append((attr, data[pos:pos + size]))
            pos += size
        else:
            out.append((attr, field))
    return out


def kernel_resources(cubin: bytes) -> dict[str, dict]:
    """Per kernel of one cubin: ``registers``, ``shared`` (static bytes), ``threads`` (its launch bound)."""
    sections = elf_sections(cubin)
    sizes = sections["__sizes__"]
    symbols = elf_symbol_names(cubin, sections)
    out: dict[str, dict] = {}
    for name, data in sections.items():
        if name.startswith(".nv.info.") and isinstance(data, bytes):
            kernel = name[len(".nv.info."):]
            res = out.setdefault(kernel, {"registers": None, "shared": sizes.get(f".nv.shared.{kernel}", 0),
                                          "threads": None, "code": sizes.get(f".text.{kernel}", 0)})
            for attr, value in info_attributes(data):
                if attr == EIATTR_MAX_THREADS and len(value) >= 12:
                    x, y, z = struct.unpack_from("<III", value, 0)
                    res["threads"] = x * y * z
    for attr, value in info_attributes(sections.get(".nv.info", b"")):   # per function: (symbol, registers)
        if attr == EIATTR_REGCOUNT and len(value) >= 8:
            sym, count = struct.unpack_from("<II", value, 0)
            if symbols.get(sym) in out:
                out[symbols[sym]]["registers"] = count
    return out


def device_functions(cubin: bytes) -> dict[str, int]:
    """The device functions of one cubin that nvcc kept as functions of their own (not inlined into a caller),
    with the bytes of their machine code. nvcc (whole-program mode) places such a function in its caller's
    ``.text.<kernel>`` section under a local symbol ``$<kernel>$<function>``, whose size is the function's."""
    sections = elf_sections(cubin)
    table, names = sections.get(".symtab", b""), sections.get(".strtab", b"")
    out: dict[str, int] = {}
    for i in range(len(table) // 24):
        name_off, _info, _other, _shndx, _value, size = struct.unpack_from("<IBBHQQ", table, i * 24)
        name = names[name_off:names.index(b"\0", name_off)].decode() if name_off < len(names) else ""
        if name.startswith("$") and name.count("$") == 2:
            out[name.split("$")[2]] = size
    return out


def elf_symbol_names(elf: bytes, sections: dict) -> dict[int, str]:
    """Symbol index -> name, from ``.symtab`` and ``.strtab``."""
    table, names = sections.get(".symtab", b""), sections.get(".strtab", b"")
    out = {}
    for i in range(len(table) // 24):
        name_off, = struct.unpack_from("<I", table, i * 24)
        out[i] = names[name_off:names.index(b"\0", name_off)].decode() if name_off < len(names) else ""
    return out


def blocks_per_sm(res: dict, sm: dict = SM90) -> int | None:
    """How many blocks of the kernel one SM holds at once (registers allocated per warp in units of 256)."""
    if not res.get("registers") or not res.get("threads"):
        return None
    warps = -(-res["threads"] // 32)
    regs_per_warp = -(-res["registers"] * 32 // 256) * 256
    by_regs = sm["registers"] // (regs_per_warp * warps)
    # the .nv.shared section already holds the 1 KiB that sm_90 reserves per block (ptxas reports 1024 less)
    by_shared = (sm["shared"] // res["shared"]) if res["shared"] else sm["blocks"]
    return min(by_regs, by_shared, sm["blocks"], sm["threads"] // res["threads"])


def library_cubins(path: str) -> list[bytes]:
    """The cubins of the library at ``path`` (``.so`` or ``.so.xz``; compressed cubins left out)."""
    from tvm_interop.passes.cuda_compile import fatbin_cubins, library_cuda_images

    if path.endswith(".xz"):
        with tempfile.NamedTemporaryFile(suffix=".so", delete=False) as f:
            f.write(lzma.decompress(open(path, "rb").read()))
            path = f.name
    return [cubin for fmt, image in library_cuda_images(path) if fmt == "fatbin"
            for _arch, cubin in fatbin_cubins(image) if cubin[:4] == b"\x7fELF"]


def library_kernels(path: str) -> dict[str, dict]:
    """Every kernel of the library at ``path`` (``.so`` or ``.so.xz``) with its resources."""
    out: dict[str, dict] = {}
    for cubin in library_cubins(path):
        out.update(kernel_resources(cubin))
    return out


def library_device_functions(path: str) -> dict[str, int]:
    """Every device function that the library's kernels call (:func:`device_functions`), with its code bytes."""
    out: dict[str, int] = {}
    for cubin in library_cubins(path):
        out.update(device_functions(cubin))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("library", help="a CUDA library built here (.so or .so.xz)")
    ap.add_argument("--match", default="", help="only kernels whose name contains this")
    args = ap.parse_args(argv)
    kernels = {k: v for k, v in library_kernels(args.library).items() if args.match in k}
    if not kernels:
        print(f"no kernel matching {args.match!r} in {args.library} (or its cubins are compressed)", file=sys.stderr)
        return 1
    print("| kernel | threads | registers | static shared (B, with the 1 KiB reserved) | blocks per SM (sm_90) "
          "| code (B) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in sorted(kernels):
        r = kernels[name]
        print(f"| {name} | {r['threads']} | {r['registers']} | {r['shared']} | {blocks_per_sm(r)} | {r['code']} |")
    called = {k: v for k, v in library_device_functions(args.library).items() if args.match in k}
    if called:
        print(f"\n{len(called)} device function(s) kept as calls, {sum(called.values())} bytes of code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
