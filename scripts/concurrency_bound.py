"""What inter-operator concurrency can give each model on this CPU: bounds from its kernels' own times.

Every kernel of the model's sequential program is timed in place (``ThreadExecutor.run_traced``: the calls as
the program makes them), on one thread and on all of them, in interleaved rounds (the calling thread's TVM pool
set to the count between rounds; the same kernels, built for all cores, as a fused stage runs a kernel on one
core: a host whose speed moves between minutes moves both alike). From the two medians
``passes.concurrency_bound`` computes the critical path, the work bound and an idealised list schedule (each
kernel on one core or all, nothing charged for hand-offs or shared caches), next to the sequential program's
kernels: what no schedule of these kernels can beat, and a generous estimate of what a good one reaches.

Why: a schedule that does not win is either a weak schedule or a model whose kernels leave nothing idle. This
says which, before anyone tunes a scheduler against a target the kernels do not allow (Inception-v3's 1.1x on
two cores: ``docs/concurrency_bound_2026-11-30.md``).

Example::

    python scripts/concurrency_bound.py --models inception_v3 randwire --repeat 20 --out /tmp/bound

Writes ``<out>.json`` (every unit's two times and the bounds) when ``--out`` is given and prints a table. Model
sizes are ``bench_cpu.CONFIGS``' (others width 0.5 at 112 px). The in-place timing leaves a gap between calls,
in which the thread pool may go to sleep: a small parallel kernel pays a wake-up the program does not, which
makes the all-core times a little slow and the estimate a little generous to concurrency.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_cpu import CONFIGS, machine  # noqa: E402

OTHER_CONFIG = dict(width=0.5, image_size=112)


def time_kernels(cm, x: np.ndarray, cores: int, repeat: int, warmup: int) -> tuple[dict, dict, dict]:
    """({unit: s on one thread}, {unit: s on ``cores`` threads}, {unit: kernel}): medians of ``repeat``
    interleaved rounds, each one traced run per thread count (the same kernels, the calling thread's TVM pool
    set to the count: what a schedule that runs a kernel on one core of a fused stage gets). Each count change
    is followed by an untimed run: without it GoogLeNet's small kernels took 2-4x their time on both cores
    (a max pool 78 us instead of 20 in a process that never changes the count)."""
    from tvm_interop.runtime.thread_executor import _set_thread_count

    executor = cm.runner._thread_executor()
    samples = {1: collections.defaultdict(list), cores: collections.defaultdict(list)}
    funcs: dict[str, str] = {}
    try:
        for r in range(warmup + repeat):
            for threads in (1, cores):
                _set_thread_count(threads)
                executor.run_traced(x)   # untimed: the first run after a change of the count is slow
                per_unit: dict[str, float] = collections.defaultdict(float)
                for e in executor.run_traced(x):
                    per_unit[e["unit"]] += e["end"] - e["start"]
                    funcs[e["unit"]] = e["func"]
                if r >= warmup:
                    for unit, t in per_unit.items():
                        samples[threads][unit].append(t)
    finally:
        _set_thread_count(cores)
    med = {k: {u: statistics.median(ts) for u, ts in v.items()} for k, v in samples.items()}
    return med[1], med[cores], funcs


def bound_model(model: str, cores: int, repeat: int, warmup: int, width: float | None = None,
                image_size: int | None = None) -> dict:
    import tvm_interop
    from tvm_interop.api import load_module
    from tvm_interop.passes.concurrency_bound import concurrency_bound

    cfg = dict(CONFIGS.get(model, OTHER_CONFIG))
    cfg.update({k: v for k, v in (("width", width), ("image_size", image_size)) if v is not None})
    mod, name = load_module(model, image_size=cfg["image_size"], width=cfg["width"])
    shape = [int(d) for d in mod["main"].params[0].ty.shape.values]
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    cm = tvm_interop.compile(mod, target="llvm", scheduler="sequential", guard=False)
    try:
        one, full, funcs = time_kernels(cm, x, cores, repeat, warmup)
        graph = cm.program.graph
    finally:
        cm.close()
    b = concurrency_bound(graph, one, full, cores)
    kernels = [{"unit": u.name, "func": funcs[u.name], "one_core_us": one[u.name] * 1e6,
                "all_cores_us": full[u.name] * 1e6, "efficiency": one[u.name] / (cores * full[u.name])}
               for u in graph.units]
    return {"model": name, "config": cfg, "units": len(graph.units), **b.to_json(), "kernels": kernels}


def table(rows: list[dict]) -> str:
    lines = ["| model | kernels | sequential ms (all cores) | one core ms | critical path ms | work bound ms | "
             "no schedule beats | idealised list schedule |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['units']} | {r['sequential_s'] * 1e3:.2f} | {r['one_core_s'] * 1e3:.2f} | "
                     f"{r['critical_path_s'] * 1e3:.2f} | {r['work_s'] * 1e3:.2f} | {r['speedup_bound']:.2f}x | "
                     f"{r['list_schedule_s'] * 1e3:.2f} ms ({r['list_speedup']:.2f}x) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=list(CONFIGS), help="zoo models (default: bench_cpu's)")
    ap.add_argument("--cores", type=int, default=None, help="threads of the all-core run (default: kernel_threads())")
    ap.add_argument("--width", type=float, default=None, help="channel multiplier of every model (default: its config)")
    ap.add_argument("--image-size", type=int, default=None, help="input H = W of every model (default: its config)")
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per process (default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    ap.add_argument("--out", default=None, help="write <out>.json")
    args = ap.parse_args(argv)
    from tvm_interop.runtime.cpu_threads import kernel_threads

    cores = args.cores or kernel_threads()
    if cores < 2:
        ap.error(f"the all-core run needs at least 2 threads (this machine gives kernels {cores})")
    rows = []
    for model in args.models:
        rows.append(bound_model(model, cores, args.repeat, args.warmup, args.width, args.image_size))
        print(f"{model}: done", file=sys.stderr, flush=True)
    print(f"### Inter-operator concurrency bounds on {cores} cores (medians of {args.repeat} in-place runs)\n")
    print(table(rows))
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"machine": machine(), "cores": cores, "repeat": args.repeat, "models": rows}, f, indent=1)
        print(f"\nwrote {args.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
