"""Register tiles on the heap (TVM's workspace) vs on the stack: the same sequential program built both ways.

Why: TVM's ``LowerTVMBuiltin`` keeps a CPU allocation on the stack (an LLVM alloca, registers after SROA) only
when its scope is ``global`` and it is under 1 KiB; any other scope becomes a ``TVMBackendAllocWorkspace`` call.
Our CPU schedules allocated their accumulator tiles as ``local`` until 2026-11-30, so every multiply-add loaded
and stored its accumulator (``passes.kernels.cpu_schedule._ACC_SCOPE``). This builds each model's sequential
program with the tiles in ``local`` scope (before) and in ``global`` (now), checks both against plain TVM, times
them in interleaved rounds and reports medians and the ratio, with the number of workspace allocations that the
built kernels make.

    .venv/bin/python scripts/bench_register_tiles.py --models randwire inception_v3 squeezenet googlenet

``--compare stack-tiles`` compares instead tiles of 1-2 KiB (AVX-512's 20-26 accumulator vectors) left to TVM,
which puts them on the heap, with them kept on the stack (``passes.kernels.stack_tiles``, 2026-11-30); on a
target with 16 vector registers the two builds are the same code. ``--compare parallel-threshold``: compute-bound
kernels get a parallel loop from 1 M multiply-adds (before 2026-11-30) vs from 64 K per thread
(``cpu_schedule._MIN_PARALLEL_MACS_PER_THREAD``); ``--macs-per-thread N`` times further thresholds beside them.
``--compare contiguous-rows``: injective kernels (relu, add, ...) whose rows do not fill whole vectors with their
contiguous trailing loops fused into one vectorised loop, or not (``cpu_schedule._FUSE_CONTIGUOUS_ROWS``).

The model configurations are ``bench_cpu.CONFIGS`` (the sizes of the CPU benchmark tables), others width 0.5 at
112 px.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tvm_interop  # noqa: E402
from bench_cpu import ATOL, CONFIGS, RTOL, machine  # noqa: E402
from tvm_interop.passes.kernels import cpu_schedule, stack_tiles  # noqa: E402

OTHER_CONFIG = dict(width=0.5, image_size=112)   # a zoo model without a bench_cpu configuration
# each comparison: (before, now), each a label and the build's settings
COMPARISONS = {
    "scope": {"heap (local)": {"scope": "local"}, "stack (global)": {"scope": "global"}},
    "stack-tiles": {"1-2 KiB tiles on the heap (TVM alone)": {"stack_tiles": False},
                    "1-2 KiB tiles on the stack": {"stack_tiles": True}},
    "parallel-threshold": {"threads from 1 M MACs": {"macs_per_thread": "1M per kernel"},
                           "threads from 64 K MACs per thread": {"macs_per_thread": 1 << 16}},
    "contiguous-rows": {"ragged rows as they are": {"fuse_rows": False},
                        "contiguous rows fused": {"fuse_rows": True}},
}


def workspace_calls(compiled) -> int:
    """``TVMBackendAllocWorkspace`` call sites in the LLVM of the built library (all kernels)."""
    count, stack = 0, [compiled.runner.library.mod]
    while stack:
        mod = stack.pop()
        try:
            count += len(cpu_schedule.workspace_allocations(mod.inspect_source("ll")))
        except Exception:  # noqa: BLE001 - the VM's own module has no LLVM source
            pass
        stack.extend(mod.imports)
    return count


def _macs_per_thread(value) -> int:
    """A threshold per thread; "1M per kernel" is the rule before 2026-11-30 (1 << 20 whatever the threads)."""
    if value == "1M per kernel":
        from tvm_interop.runtime.cpu_threads import kernel_threads

        return (1 << 20) // max(kernel_threads(), 1)
    return int(value)


def build(mod, name: str, scope: str = cpu_schedule._ACC_SCOPE, stack: bool = stack_tiles.ENABLED,
          macs_per_thread=cpu_schedule._MIN_PARALLEL_MACS_PER_THREAD,
          fuse_rows: bool = cpu_schedule._FUSE_CONTIGUOUS_ROWS):
    """The sequential program with the register tiles in ``scope``, tiles of 1-2 KiB kept on the stack or not
    (``stack``), compute-bound kernels threaded from ``macs_per_thread``, and ragged rows of injective kernels
    fused where contiguous or not (``fuse_rows``); the scheduling memo cleared."""
    saved = (cpu_schedule._ACC_SCOPE, stack_tiles.ENABLED, cpu_schedule._MIN_PARALLEL_MACS_PER_THREAD,
             cpu_schedule._FUSE_CONTIGUOUS_ROWS)
    cpu_schedule._ACC_SCOPE, stack_tiles.ENABLED = scope, stack
    cpu_schedule._MIN_PARALLEL_MACS_PER_THREAD = _macs_per_thread(macs_per_thread)
    cpu_schedule._FUSE_CONTIGUOUS_ROWS = fuse_rows
    cpu_schedule._SCHEDULED.clear()
    try:
        return tvm_interop.compile(mod, scheduler="sequential", name=name, guard=False)
    finally:
        (cpu_schedule._ACC_SCOPE, stack_tiles.ENABLED, cpu_schedule._MIN_PARALLEL_MACS_PER_THREAD,
         cpu_schedule._FUSE_CONTIGUOUS_ROWS) = saved
        cpu_schedule._SCHEDULED.clear()


def run_model(name: str, repeat: int, config: dict, variants: dict = COMPARISONS["scope"]) -> dict:
    mod, _ = tvm_interop.load_module(name, **config)
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape.values)
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    ref = tvm_interop.run_reference(mod, [x])
    built, diffs, calls = {}, {}, {}
    for label, settings in variants.items():
        m = build(mod, name, settings.get("scope", cpu_schedule._ACC_SCOPE),
                  settings.get("stack_tiles", stack_tiles.ENABLED),
                  settings.get("macs_per_thread", cpu_schedule._MIN_PARALLEL_MACS_PER_THREAD),
                  settings.get("fuse_rows", cpu_schedule._FUSE_CONTIGUOUS_ROWS))
        out = m.run(x)
        diffs[label] = float(np.max(np.abs(out - ref)))
        if not np.allclose(out, ref, rtol=RTOL, atol=ATOL):
            raise SystemExit(f"{name} {label}: output differs from plain TVM (max abs diff {diffs[label]:.3g})")
        calls[label] = workspace_calls(m)
        for _ in range(3):
            m.run(x)
        built[label] = m
    times = {k: [] for k in built}
    for _ in range(repeat):
        for k, m in built.items():
            t0 = time.perf_counter()
            m.run(x)
            times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    before, now = list(variants)[:2]
    return {"model": name, "config": config, "median_ms": med, "speedup": med[before] / med[now],
            "speedup_over_before": {k: med[before] / v for k, v in med.items()},
            "workspace_calls": calls, "max_abs_diff": diffs}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from tvm_interop.models import list_models

    ap.add_argument("--models", nargs="+", default=["randwire", "inception_v3", "squeezenet", "googlenet"],
                    choices=list_models(), help="zoo models; those without a bench_cpu configuration are built "
                                                f"at {OTHER_CONFIG}")
    ap.add_argument("--repeat", type=int, default=40, help="interleaved rounds")
    ap.add_argument("--compare", choices=sorted(COMPARISONS), default="scope",
                    help="scope: tiles in local vs global scope; stack-tiles: 1-2 KiB tiles left to TVM vs kept "
                         "on the stack; parallel-threshold: threads from 1 M MACs vs 64 K per thread; contiguous-rows: "
                         "ragged rows of injective kernels as they are vs fused where contiguous")
    ap.add_argument("--macs-per-thread", type=int, nargs="*", default=[],
                    help="with --compare parallel-threshold: more thresholds (MACs per thread) timed beside them")
    ap.add_argument("--width", type=float, default=None, help="override the models' width (tests)")
    ap.add_argument("--image-size", type=int, default=None, help="override the models' image size (tests)")
    ap.add_argument("--out", default="bench_register_tiles", help="output path without extension (.json)")
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        config = dict(CONFIGS.get(name, OTHER_CONFIG))
        config.update({k: v for k, v in (("width", args.width), ("image_size", args.image_size)) if v is not None})
        variants = dict(COMPARISONS[args.compare])
        if args.macs_per_thread and args.compare != "parallel-threshold":
            ap.error("--macs-per-thread goes with --compare parallel-threshold")
        variants.update({f"threads from {n} MACs per thread": {"macs_per_thread": n} for n in args.macs_per_thread})
        rows.append(run_model(name, args.repeat, config, variants))
        r = rows[-1]
        print(f"{name:14s} " + "  ".join(f"{k} {v:7.3f} ms ({r['workspace_calls'][k]} workspace calls)"
                                         for k, v in r["median_ms"].items())
              + f"  speed-up {r['speedup']:.3f}x", flush=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"command": "python scripts/bench_register_tiles.py "
                   + " ".join(sys.argv[1:] if argv is None else argv),
                   "machine": machine(), "repeat": args.repeat, "compare": args.compare, "results": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
