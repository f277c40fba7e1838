"""Refusing a CPU library on a CPU that lacks the instructions its kernels use, before any kernel runs.

Why: a library built for this machine's CPU (``target="llvm"`` means ``-mcpu=<host>``) may hold AVX-512 code;
loaded on an older CPU its first kernel dies with SIGILL, which tells the user nothing. The build records the
instruction-set features its target allows (``plan.meta["cpu_features"]``, LLVM's names, from
``passes.target.cpu_isa_features``); here they are compared with what the kernel reports for this CPU
(``/proc/cpuinfo`` flags on Linux, or the ``Features`` line on Arm), without TVM's compiler or LLVM.
"""
from __future__ import annotations

from .errors import DeviceError

# LLVM feature name -> /proc/cpuinfo flag, where they differ
_CPUINFO_NAME = {"sse3": "pni", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "bmi": "bmi1", "avx512vnni": "avx512_vnni",
                 "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avx512vbmi2": "avx512_vbmi2",
                 "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq", "avxvnni": "avx_vnni",
                 "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
                 "neon": "asimd", "fp-armv8": "fp", "dotprod": "asimddp", "fullfp16": "fphp", "bf16": "bf16"}


def host_cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's feature flags as the kernel reports them, or None where that cannot be read (then nothing is
    refused: the check only refuses what it can prove)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                key = line.split(":", 1)[0].strip().lower()
                if key in ("flags", "features"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def missing_features(required: list[str], flags: set[str]) -> list[str]:
    """The LLVM features in ``required`` that ``flags`` (cpuinfo names) lack."""
    return [f for f in required if _CPUINFO_NAME.get(f, f) not in flags]


def check_cpu_features(meta: dict, flags: set[str] | None = None) -> None:
    """Raise DeviceError when this CPU lacks an instruction-set feature the library's kernels may use."""
    required = list(meta.get("cpu_features") or [])
    if not required:
        return
    flags = host_cpu_flags() if flags is None else flags
    if flags is None:
        return
    missing = missing_features(required, flags)
    if missing:
        built = meta.get("target") or "this library's CPU target"
        raise DeviceError(f"this library was built for {built} and its kernels may use {', '.join(missing)}, which "
                          "this CPU does not have: running it would stop at the first such instruction. Rebuild "
                          "it on this machine (--target llvm) or for any x86-64 CPU (--target llvm-generic).")
