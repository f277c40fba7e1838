"""Every CPU kernel of a model, as our default schedules build it, against the same kernel unscheduled, on this host.

    .venv/bin/python scripts/cpu_kernel_check.py randwire --width 0.5 --image-size 112
    .venv/bin/python scripts/cpu_kernel_check.py inception_v3 squeezenet --json out/kernels.json

Why: the default CPU schedules (``passes/kernels/cpu_schedule.py``) choose their tiles from the host's vector
width, and the layout pass pads channels to it, so a host with other instructions builds other kernels. A wrong
tile shows up as a whole-program mismatch (``scripts/bench_cpu.py`` fails on one) but does not say which kernel;
this does. It found the cropping-epilogue bug of 2026-11-29 on an AVX2 host (RandWire, width 0.5, 112 px: one
of ~100 kernels off by 55, ``docs/bench_cpu_epyc_avx2_2026-11-29.md``).

Each kernel of ``passes.prepare`` (the fused, scheduled PrimFuncs) is built alone for this machine's CPU and run
on random inputs of its call site's shapes, next to the unscheduled function that the module keeps; outputs are
compared with rtol/atol 1e-4 (scaled by the output's magnitude). Exit status 1 when a kernel differs. These are
the PrimFuncs that the build compiles, each built alone through the TIR pipeline the build uses (the unscheduled
reference through TVM's own); the built library as a whole is what the zoo tests and ``bench_cpu.py`` compare
against plain TVM.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import tvm  # noqa: E402

TOL = 1e-4


def _run(func, args: list[np.ndarray], target, n_out: int, shipped: bool = False) -> list[np.ndarray]:
    """``func`` built alone and run on copies of ``args``; ``shipped``: through the TIR pipeline our builds use
    (``passes.wave.cpu_pipeline``: register tiles of 1-2 KiB on the stack), else TVM's own (the reference)."""
    from tvm_interop.passes.wave.cpu_pipeline import compile_with_waves

    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    lib = compile_with_waves(mod, target) if shipped else tvm.compile(mod, target=target)
    tensors = [tvm.runtime.tensor(a.copy()) for a in args]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors[len(tensors) - n_out:]]


def check_module(mod: tvm.IRModule, target=None, seed: int = 0) -> list[dict]:
    """One row per kernel of ``mod`` prepared for ``target`` (default: this machine's CPU): its name, the plan
    that scheduled it, its largest absolute difference and whether it matches."""
    from tvm_interop.passes.extract import extract
    from tvm_interop.passes.prepare import CPU_SCHEDULED, prepare
    from tvm_interop.passes.target import normalize_target

    target = normalize_target(target or "llvm")
    fused = prepare(mod, target)
    unscheduled = fused.attrs[CPU_SCHEDULED]
    program = extract(fused)
    rng = np.random.default_rng(seed)
    rows, seen = [], set()
    for call in program.calls.values():
        name = call.func_name
        if call.is_library or name in seen or name not in unscheduled:
            continue
        seen.add(name)
        func = fused[name]
        plan = str(func.attrs["tvm_interop.cpu_plan"]) if func.attrs and "tvm_interop.cpu_plan" in func.attrs else None
        if plan is None:
            continue                      # left unscheduled: nothing to compare
        infos = [program.info_of(a) for a in call.args] + list(call.outputs)
        args = [rng.standard_normal(i.shape).astype(i.dtype) if "float" in i.dtype else np.zeros(i.shape, i.dtype)
                for i in infos]
        got = _run(func, args, target, len(call.outputs), shipped=True)
        want = _run(unscheduled[name], args, target, len(call.outputs))
        diff = max(float(np.max(np.abs(g - w))) if g.size else 0.0 for g, w in zip(got, want))
        ok = all(np.allclose(g, w, rtol=TOL, atol=TOL * max(1.0, float(np.max(np.abs(w))) if w.size else 1.0))
                 for g, w in zip(got, want))
        rows.append({"kernel": name, "plan": plan, "max_abs_diff": diff, "match": bool(ok)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="zoo model names")
    ap.add_argument("--width", type=float, default=0.5)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--target", default="llvm", help="default: this machine's CPU")
    ap.add_argument("--json", help="write every kernel's row here")
    args = ap.parse_args()
    import tvm_interop
    from tvm_interop.passes.target import normalize_target, target_text

    report = {"target": None, "models": {}}
    bad = []
    for name in args.models:
        mod, _ = tvm_interop.load_module(name, width=args.width, image_size=args.image_size)
        rows = check_module(mod, args.target)
        report["models"][name] = rows
        wrong = [r for r in rows if not r["match"]]
        bad += [f"{name}/{r['kernel']}" for r in wrong]
        print(f"{name}: {len(rows)} scheduled kernels, {len(wrong)} differ", flush=True)
        for r in wrong:
            print(f"  DIFFERS {r['kernel']} (plan {r['plan']}): max abs diff {r['max_abs_diff']:.3g}", flush=True)
    report["target"] = target_text(normalize_target(args.target))
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
