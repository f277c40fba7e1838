"""Targets, in one leaf module every layer of ``passes`` and the front door use.

Why a module of its own: normalising a target (CUDA defaults and arch, the old CLI spellings this TVM refuses),
telling a device kind and choosing arches were spread over the CUDA build, the stream lowering and the compile
API, with two device-kind classifiers that could disagree, and the CUDA build and the lowering imported each
other for it. This module imports nothing from ``passes``.

* :func:`normalize_target` accepts ``"cuda"``, ``"cuda -arch=sm_90"``, ``"cuda -arch=sm_80,sm_90"`` (code is then
  generated for the oldest arch), dicts, JSON and ``Target`` objects, and fills in ``arch`` (default ``sm_90``,
  the H100 / H200; ``TVM_INTEROP_CUDA_ARCH`` overrides) and the limits TVM would otherwise query from a GPU.
* :func:`device_kind` is the one classifier: a GPU kind (``cuda``, ``rocm``, ...) or ``cpu``.
* :func:`requested_arches` / :func:`parse_arches`: the GPU arches a library carries binaries for.
* CPU: ``"llvm"`` (a string, or a dict without ``mcpu``) means *this machine's CPU*: ``mcpu`` is what LLVM detects
  (:func:`host_cpu`), so kernels use AVX2 / AVX-512 where the host has them (measured in the issue that asked for
  it: inception_v3 410 -> 119 ms on a 2-core znver4 machine). ``"llvm-generic"`` is the portable baseline (x86-64,
  SSE2) for a library that must load anywhere. A ``Target`` object is taken as it is. :func:`cpu_isa_features`
  lists the instruction-set features a CPU library's kernels may use; the plan records them and the runtime
  refuses a CPU that lacks one (``runtime.cpu.check_cpu_features``).
"""
from __future__ import annotations

import os
import re
import shlex

import tvm

from tvm_interop.runtime.errors import InteropError

GPU_KINDS = ("cuda", "rocm", "vulkan", "metal", "opencl")
ARCH_RE = re.compile(r"^sm_(\d)(\d+)$")
DEFAULT_ARCH = "sm_90"
# Limits every CUDA GPU since sm_50 has (TVM asks for them when it cannot query a device).
CUDA_DEFAULTS = {"max_shared_memory_per_block": 49152, "max_threads_per_block": 1024, "thread_warp_size": 32}


def default_arch() -> str:
    """``TVM_INTEROP_CUDA_ARCH`` (one arch or several, ``sm_80,sm_90``) when set and not empty, else sm_90."""
    return os.environ.get("TVM_INTEROP_CUDA_ARCH") or DEFAULT_ARCH


def codegen_arch(arch) -> str:
    """The arch TVM generates code for when several are requested (``sm_80,sm_90``): the oldest, so the
    generated source uses no feature a requested GPU lacks; every requested arch gets its own cubin
    (``passes.cuda_compile``)."""
    return parse_arches(arch)[0]


def requested_arches(target, arch=None) -> list[str]:
    """The arches to compile kernels for: ``arch`` (``"sm_80,sm_90"`` or a list), else those written in the
    target (``cuda -arch=sm_80,sm_90``, a dict, JSON or a Target), else all of :func:`default_arch` (so that
    ``TVM_INTEROP_CUDA_ARCH=sm_80,sm_90`` keeps both: the normalised target holds only the oldest); ``[]`` for a
    target that is not CUDA."""
    if arch:
        return parse_arches(arch)
    written = _written_arch(target)
    if written:
        return parse_arches(written)
    return parse_arches(default_arch()) if normalize_target(target).kind.name == "cuda" else []


def _written_arch(target) -> str | None:
    """The arch spelled in ``target`` itself, or None when it leaves the choice to the default."""
    if isinstance(target, str):
        text = target.strip()
        if text.startswith("{"):
            import json

            return json.loads(text).get("arch") or None
        return text.split("-arch=", 1)[1].split()[0] if "-arch=" in text else None
    if isinstance(target, dict):
        return target.get("arch") or None
    if isinstance(target, tvm.target.Target):
        return target.attrs.get("arch") or None
    return None


GENERIC_CPU = "llvm-generic"
# instruction-set features (LLVM's names) that decide whether a CPU library's kernels can run on a CPU; tuning
# flags (``fast-gather``, ``prefer-256-bit``...) are not requirements
ISA_FEATURES = ("sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "avx", "avx2", "fma", "f16c", "bmi", "bmi2",
                "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512vnni", "avx512bf16",
                "avx512fp16", "avx512vbmi", "avx512vbmi2", "avx512ifma", "avx512bitalg", "avx512vpopcntdq",
                "avxvnni", "amx-tile", "amx-int8", "amx-bf16",
                "neon", "fp-armv8", "dotprod", "fullfp16", "i8mm", "bf16", "sve", "sve2")


def host_cpu() -> str:
    """This machine's CPU as LLVM names it (``znver4``, ``sapphirerapids``, ``neoverse-v2``...)."""
    from tvm.target import codegen

    return str(codegen.llvm_get_system_cpu())


def _check_mcpu(mcpu: str, triple: str | None = None) -> None:
    from tvm.target import codegen

    triple = triple or str(codegen.llvm_get_system_triple())
    if not codegen.llvm_is_valid_cpu(mcpu, triple):
        known = [str(c) for c in codegen.llvm_get_cpu_archlist(tvm.target.Target({"kind": "llvm", "mtriple": triple}))]
        near = [c for c in known if c[:3] == mcpu[:3]][:8] or known[:8]
        raise InteropError(f"-mcpu={mcpu} is not a CPU LLVM knows for {triple} (LLVM: '{mcpu}' is not a recognized "
                           f"processor for this target); e.g. {', '.join(near)}; or use --target llvm for this "
                           f"machine's CPU ({host_cpu()}) or {GENERIC_CPU} for any x86-64")


def cpu_isa_features(target) -> list[str]:
    """The instruction-set features (:data:`ISA_FEATURES`) a CPU target's kernels may use, sorted."""
    from tvm.target import codegen

    t = normalize_target(target)
    if t.kind.name != "llvm":
        return []
    return sorted(set(str(f) for f in codegen.llvm_get_cpu_features(t)) & set(ISA_FEATURES))


def normalize_target(target) -> tvm.target.Target:
    """A ``tvm.target.Target`` from ``"cuda"``, ``"cuda -arch=sm_80"``, ``{"kind": "cuda", ...}``, ``"llvm"``,
    ``"llvm -mcpu=znver4"``, ``"llvm-generic"``, or a Target; a CUDA target without ``arch`` gets
    :func:`default_arch`; an ``llvm`` string or dict without ``mcpu`` gets this machine's CPU (:func:`host_cpu`);
    an ``mcpu`` LLVM does not know is an error with LLVM's words."""
    if isinstance(target, tvm.target.Target):
        if target.kind.name == "cuda" and any(k not in target.attrs or not target.attrs.get(k) for k in
                                              ("arch", *CUDA_DEFAULTS)):
            d = {**CUDA_DEFAULTS, **{k: v for k, v in dict(target.export()).items() if v not in (None, "")}}
            d.setdefault("arch", codegen_arch(default_arch()))
            return tvm.target.Target(_clean(d))
        return target
    if isinstance(target, dict):
        d = dict(target)
    elif isinstance(target, str):
        words = shlex.split(target)
        if not words:
            raise InteropError("empty target")
        if words[0].startswith("{"):
            import json

            d = json.loads(target)
        else:
            d = {"kind": words[0]}
            for w in words[1:]:
                if not w.startswith("-") or "=" not in w:
                    raise InteropError(f"cannot read target option {w!r} in {target!r} (expected -key=value)")
                k, v = w.lstrip("-").split("=", 1)
                d[k.replace("-", "_")] = v
    else:
        raise InteropError(f"cannot make a TVM target from {type(target).__name__}")
    if d.get("kind") == GENERIC_CPU:
        d["kind"] = "llvm"
    elif d.get("kind") == "llvm":
        if d.get("mcpu"):
            _check_mcpu(str(d["mcpu"]), d.get("mtriple"))
        else:
            d["mcpu"] = host_cpu()
    if d.get("kind") == "cuda":
        d = {**CUDA_DEFAULTS, **d}
        if not d.get("arch"):
            d["arch"] = default_arch()
        d["arch"] = codegen_arch(d["arch"])
    try:
        return tvm.target.Target(d if len(d) > 1 else d["kind"])
    except Exception as e:  # noqa: BLE001 - TVM raises several types here
        raise InteropError(f"invalid target {target!r}: {str(e).splitlines()[-1]}") from None


def _clean(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("tag", "keys") or v}


def is_cuda(target) -> bool:
    return normalize_target(target).kind.name == "cuda"


def device_kind(target) -> str:
    """``cuda``, ``rocm``, ... for GPU targets, ``cpu`` for everything else (``llvm``, ``c``)."""
    kind = normalize_target(target).kind.name
    return kind if kind in GPU_KINDS else "cpu"


def target_text(target) -> str:
    """A short, stable spelling for plans and reports: ``llvm``, ``cuda -arch=sm_90``."""
    t = normalize_target(target)
    if t.kind.name == "cuda":
        return f"cuda -arch={t.attrs.get('arch')}"
    if t.kind.name == "llvm":
        mcpu = t.attrs.get("mcpu")
        return f"llvm -mcpu={mcpu}" if mcpu else GENERIC_CPU
    return target if isinstance(target, str) else t.kind.name


def parse_arches(spec) -> list[str]:
    """``"sm_90"``, ``"sm_80,sm_90"`` or a list -> sorted unique ``["sm_80", "sm_90"]``; bad names refused."""
    if spec is None:
        return []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = []
    for item in items:
        a = str(item).strip()
        if not ARCH_RE.match(a):
            raise InteropError(f"invalid CUDA arch {a!r}: use sm_XY names such as sm_80 or sm_90 "
                               "(comma-separated for several)")
        out.append(a)
    if not out:
        raise InteropError("no CUDA arch given")
    return sorted(set(out), key=lambda a: int(a[3:]))
