"""CPU benchmark: sequential vs greedy vs lios vs ios (measured cost) with the same kernels, on this machine.

For each model: prepare once; schedule with each scheduler (ios and lios use the measured cost model: stages
timed on this CPU with the real kernels and worker threads); build each; then time every program with
interleaved repeats (round-robin over the schedules per repeat, so machine noise hits all alike) and report
medians, speedups over sequential, optimisation (search + measurement) time, and the ios cost model's predicted
latency next to the measured one. Writes docs/bench_cpu.json and docs/bench_cpu.md.

    .venv/bin/python scripts/bench_cpu.py --models inception_v3 squeezenet googlenet randwire --repeat 15
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tvm  # noqa: E402

import tvm_interop  # noqa: E402
from passes.schedulers import available_schedulers  # noqa: E402

CONFIGS = {  # per model: width, image size chosen so one run stays well under a second with default kernels
    "inception_v3": dict(width=0.5, image_size=149),
    "squeezenet": dict(width=1.0, image_size=112),
    "googlenet": dict(width=0.5, image_size=112),
    "randwire": dict(width=0.5, image_size=112),
}


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import psutil

    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "tvm": tvm.__version__, "numpy": np.__version__}


def bench_model(name: str, schedulers: list[str], repeat: int, cache: str, tuning_db: str | None) -> dict:
    cfg = CONFIGS.get(name, dict(width=0.5, image_size=None))
    mod, _ = tvm_interop.load_module(name, **cfg)
    rows = {}
    models = {}
    for s in schedulers:
        cost = "measured" if s in ("ios", "lios") else "sim:cpu"
        kw = {"tuning_db": tuning_db} if tuning_db else {}
        t = time.perf_counter()
        cm = tvm_interop.compile(mod, scheduler=s, cost=cost, cost_cache=cache, guard=False, name=name,
                                 max_memory_ratio=None, **kw)
        opt = cm.timings.get("schedule", 0.0)
        models[s] = cm
        rows[s] = {"stages": cm.schedule.num_stages, "max_groups": cm.schedule.max_concurrency(),
                   "optimisation_s": opt, "compile_s": time.perf_counter() - t, "cost": cost,
                   "predicted_ms": None if cm.schedule.predicted_latency is None else cm.schedule.predicted_latency * 1e3,
                   "search": cm.schedule.search}
        print(f"  {name}/{s}: {cm.schedule.num_stages} stages, optimisation {opt:.1f} s", flush=True)
    x = models[schedulers[0]].random_inputs(0)
    ref = tvm_interop.run_reference(mod, x)
    for s, cm in models.items():
        rows[s]["max_abs_diff"] = float(np.max(np.abs(cm.run(*x) - ref)))
    times = {s: [] for s in models}
    for cm in models.values():
        cm.run(*x, numpy=False)
    for _ in range(repeat):
        for s, cm in models.items():
            t0 = time.perf_counter()
            cm.run(*x, numpy=False)
            times[s].append(time.perf_counter() - t0)
    base = float(np.median(times["sequential"]))
    for s in models:
        med = float(np.median(times[s]))
        rows[s].update(median_ms=med * 1e3, iqr_ms=float(np.percentile(times[s], 75) - np.percentile(times[s], 25)) * 1e3,
                       speedup_vs_sequential=base / med)
        models[s].close()
    return {"model": name, "config": cfg, "tuned": bool(tuning_db), "rows": rows}


def markdown(results: list[dict], info: dict, cmd: str) -> str:
    out = ["# CPU benchmark: inter-operator schedules with the same kernels", "",
           f"Machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB; TVM {info['tvm']}, Python "
           f"{info['python']}.", "", f"Command: `{cmd}`", "",
           "Medians of interleaved repeats; speedup = sequential median / schedule median. ios and lios use the "
           "measured cost model (stages timed on this CPU); optimisation = schedule search incl. measurements.", ""]
    for r in results:
        tag = " (tuned kernels)" if r["tuned"] else ""
        out += [f"## {r['model']}{tag} — width {r['config'].get('width')}, {r['config'].get('image_size')} px", "",
                "| scheduler | stages | max groups | median ms | IQR ms | speedup | optimisation s | predicted ms | max abs diff |",
                "|---|---|---|---|---|---|---|---|---|"]
        for s, row in r["rows"].items():
            pred = "" if row["predicted_ms"] is None else f"{row['predicted_ms']:.2f}"
            out.append(f"| {s} | {row['stages']} | {row['max_groups']} | {row['median_ms']:.2f} | {row['iqr_ms']:.2f} | "
                       f"{row['speedup_vs_sequential']:.2f}x | {row['optimisation_s']:.1f} | {pred} | "
                       f"{row['max_abs_diff']:.1e} |")
        out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(CONFIGS))
    ap.add_argument("--schedulers", default="sequential,greedy,lios,ios")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--cache", default="out/bench-cost-cache.json")
    ap.add_argument("--tuning-db", default=None, help="also benchmark with kernels tuned into this database")
    ap.add_argument("--out", default="docs/bench_cpu")
    args = ap.parse_args()
    schedulers = [s for s in args.schedulers.split(",") if s in available_schedulers()]
    info = machine()
    results = []
    for name in args.models:
        print(f"[bench_cpu] {name}", flush=True)
        results.append(bench_model(name, schedulers, args.repeat, args.cache, None))
        if args.tuning_db:
            results.append(bench_model(name, schedulers, args.repeat, args.cache, args.tuning_db))
    cmd = "python scripts/bench_cpu.py " + " ".join(sys.argv[1:])
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"machine": info, "command": cmd, "results": results}, f, indent=1)
    md = markdown(results, info, cmd)
    with open(args.out + ".md", "w") as f:
        f.write(md + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
