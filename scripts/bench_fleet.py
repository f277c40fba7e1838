"""Fleet throughput on loopback: tuning candidates and profiling-bundle stages per minute with 1, 2, ... servers.

A tracker and N device servers (``runtime.rpc_server``) are started on this machine
(``passes.fleet.loopback``); the same tuning job (fresh database, fixed seed) and the same bundle measurement run
through each fleet size; the rates are medians over ``--repeat`` runs. On a machine with few cores the servers
share the cores with each other and with the tuner's search and builds, so this measures the fleet's overhead
and its scaling of *waiting* (``time_evaluator``'s ``min_repeat_ms`` per candidate is wall time), not device
scaling: on real device machines each server has its own device. Writes docs/bench_fleet.json and .md.

    .venv/bin/python scripts/bench_fleet.py --servers 1 2 --repeat 3
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tvm_interop.passes.fleet import Fleet, FleetOptions  # noqa: E402
from tvm_interop.passes.fleet.loopback import LoopbackFleet  # noqa: E402


def run_tuning(program, tracker: str | None, trials: int, per_iter: int, ops: list[str], seed: int) -> dict:
    """One tuning run with a fresh database: through the fleet at ``tracker``, or in this process (None)."""
    from tvm_interop.passes.kernels.tuning import tune_program

    db = tempfile.mkdtemp(prefix="bench_fleet_db_")
    try:
        fleet = Fleet(tracker, "cpu", FleetOptions(device_wait=30.0)).start() if tracker else None
        try:
            t0 = time.perf_counter()
            report = tune_program(program, "llvm", db, trials=trials, op_names=ops, num_trials_per_iter=per_iter,
                                  quiet=True, seed=seed, baselines=False, fleet=fleet)
            seconds = time.perf_counter() - t0
        finally:
            if fleet is not None:
                fleet.close()
    finally:
        shutil.rmtree(db, ignore_errors=True)
    return {"candidates": report.new_trials, "seconds": seconds, "per_minute": 60.0 * report.new_trials / seconds,
            "devices": fleet.report()["devices"] if fleet else "this process"}


def run_bundle(bundle: str, tracker: str, repeat: int) -> dict:
    from tvm_interop.passes.fleet.bundle import measure_bundle_on_fleet

    with Fleet(tracker, "cpu", FleetOptions(device_wait=30.0)) as fleet:
        t0 = time.perf_counter()
        table = measure_bundle_on_fleet(bundle, fleet, repeat=repeat, warmup=2)
        seconds = time.perf_counter() - t0
    n = len(table["stages"])
    return {"stages": n, "seconds": seconds, "per_minute": 60.0 * n / seconds, "devices": table["fleet"]["devices"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--width", type=float, default=0.5)
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--trials", type=int, default=32, help="tuning trials per kernel")
    ap.add_argument("--per-iter", type=int, default=16)
    ap.add_argument("--ops", default="conv2d", help="tune kernels whose name contains one of these")
    ap.add_argument("--tasks", type=int, default=3, help="tune at most this many kernels")
    ap.add_argument("--bundle-repeat", type=int, default=500, help="timed runs per bundle stage")
    ap.add_argument("--repeat", type=int, default=3, help="runs per fleet size (median reported)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "bench_fleet"))
    args = ap.parse_args(argv)

    from tvm_interop.api import load_module, prepare_program
    from tvm_interop.passes.profile_bundle import BundleOptions, build_profile_bundle

    mod, name = load_module(args.model, batch_size=1, image_size=args.image_size, width=args.width)
    program = prepare_program(mod, "llvm", name=name)
    # a fixed, small set of kernels: the first --tasks whose names match --ops
    import tvm

    ops = [o for o in args.ops.split(",") if o]
    names = sorted({gv.name_hint for gv, f in program.mod.functions.items()
                    if isinstance(f, tvm.tirx.PrimFunc) and any(o in gv.name_hint for o in ops)})[: args.tasks]
    bundle = tempfile.mkdtemp(prefix="bench_fleet_bundle_")
    build_profile_bundle(program, "llvm", bundle, BundleOptions())
    rows = []
    local = [run_tuning(program, None, args.trials, args.per_iter, names, seed=i) for i in range(args.repeat)]
    local_row = {"candidates_per_minute": statistics.median(t["per_minute"] for t in local),
                 "tune_seconds": [round(t["seconds"], 2) for t in local]}
    print(f"no fleet (in-process runner): {local_row['candidates_per_minute']:.1f} candidates/min "
          f"({local_row['tune_seconds']} s)", flush=True)
    try:
        for n in args.servers:
            with LoopbackFleet() as lf:
                for _ in range(n):
                    lf.add_server("cpu")
                lf.wait_for("cpu", n)
                tune = [run_tuning(program, lf.tracker, args.trials, args.per_iter, names, seed=i)
                        for i in range(args.repeat)]
                bund = [run_bundle(bundle, lf.tracker, args.bundle_repeat) for _ in range(args.repeat)]
            row = {"servers": n,
                   "candidates_per_minute": statistics.median(t["per_minute"] for t in tune),
                   "candidates": tune[0]["candidates"], "tune_seconds": [round(t["seconds"], 2) for t in tune],
                   "stages_per_minute": statistics.median(b["per_minute"] for b in bund),
                   "stages": bund[0]["stages"], "bundle_seconds": [round(b["seconds"], 2) for b in bund],
                   "tune_devices": tune[-1]["devices"], "bundle_devices": bund[-1]["devices"]}
            rows.append(row)
            print(f"{n} server(s): {row['candidates_per_minute']:.1f} candidates/min "
                  f"({row['candidates']} per run, {row['tune_seconds']} s), {row['stages_per_minute']:.0f} bundle "
                  f"stages/min ({row['stages']} per run, {row['bundle_seconds']} s)", flush=True)
    finally:
        shutil.rmtree(bundle, ignore_errors=True)
    base = rows[0]
    for r in rows:
        r["tune_scaling"] = r["candidates_per_minute"] / base["candidates_per_minute"]
        r["bundle_scaling"] = r["stages_per_minute"] / base["stages_per_minute"]
    result = {"command": "python scripts/bench_fleet.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0))},
              "model": name, "width": args.width, "image_size": args.image_size, "tuned_kernels": names,
              "trials_per_kernel": args.trials, "local": local_row, "rows": rows}
    with open(args.out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    lines = ["# Fleet throughput on loopback", "",
             f"Command: `{result['command']}` on this {result['machine']['cores']}-core machine: a TVM RPC tracker and "
             f"N device servers started locally (`passes.fleet.loopback`). Tuning: {len(names)} kernels of "
             f"{name} (width {args.width}, {args.image_size} px), {args.trials} trials each, batches of "
             f"{args.per_iter}, fresh database per run. Bundle: {base['stages']} stages, {args.bundle_repeat} timed "
             f"runs each. Medians of {args.repeat} runs.", "",
             "| servers | candidates / min | scaling | bundle stages / min | scaling | tuning runs (s) | bundle runs (s) |",
             "|---|---|---|---|---|---|---|",
             f"| none (in-process runner) | {local_row['candidates_per_minute']:.1f} | "
             f"{local_row['candidates_per_minute'] / base['candidates_per_minute']:.2f}x | | | "
             f"{local_row['tune_seconds']} | |"]
    for r in rows:
        lines.append(f"| {r['servers']} | {r['candidates_per_minute']:.1f} | {r['tune_scaling']:.2f}x | "
                     f"{r['stages_per_minute']:.0f} | {r['bundle_scaling']:.2f}x | {r['tune_seconds']} | "
                     f"{r['bundle_seconds']} |")
    lines += ["", "Scaling is relative to one server; the first row tunes without a fleet (MetaSchedule candidates "
              "timed in the tuning process), for the fleet's overhead.", "",
              "Every server runs on the same cores as the others and as the tuner (search, builds), so the "
              "scaling here is what a fleet gains on one small host; on real device machines each server has "
              "its own device."]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
