"""Tuning cost, one convolution layer: MetaSchedule trials of ``passes.kernels.tuning`` timed per trial.

Why: tuning a model is hours of trials, and where a trial's time goes (building candidates, running them, the
search and the XGBoost model) decides which knob helps: more builder workers, an in-process runner, a bigger batch
of trials per round. This tunes one conv2d + ReLU layer and prints the tuning report (untuned vs tuned) and a JSON
line with the seconds per trial, split into build, run and the rest.

    python scripts/bench_tuning.py --channels 64 --size 56 --trials 16 --builder local --json /tmp/tune.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tvm import relax  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

from tvm_interop.passes.kernels.tuning import tune_program  # noqa: E402


def conv_layer(channels: int, out_channels: int, size: int, kernel: int):
    """conv2d (same padding) + ReLU on a 1 x ``channels`` x ``size`` x ``size`` input, seeded weights."""
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = relax.const((rng.standard_normal((out_channels, channels, kernel, kernel)) * 0.1).astype("float32"))
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, wt, padding=kernel // 2)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--out-channels", type=int, default=None)
    ap.add_argument("--size", type=int, default=56)
    ap.add_argument("--kernel", type=int, default=3)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--per-iter", type=int, default=64)
    ap.add_argument("--db", default=None, help="database directory (default: a fresh temporary one)")
    ap.add_argument("--builder", default="inprocess", choices=["inprocess", "local"])
    ap.add_argument("--runner", default="inprocess", choices=["inprocess", "local"])
    ap.add_argument("--builder-workers", type=int, default=None,
                    help="build threads (inprocess, default 1) / processes (local, default: logical cores)")
    ap.add_argument("--cost-model", default="xgb", choices=["xgb", "random"])
    ap.add_argument("--target", default="llvm")
    ap.add_argument("--no-baselines", action="store_true")
    ap.add_argument("--json", help="write the summary here too")
    args = ap.parse_args(argv)
    workers = args.builder_workers or (1 if args.builder == "inprocess" else ms.utils.cpu_count(logical=True))
    mod = conv_layer(args.channels, args.out_channels or args.channels, args.size, args.kernel)
    work_dir = args.db or tempfile.mkdtemp(prefix="tvm_interop_tune_")
    t0 = time.perf_counter()
    rep = tune_program(mod, args.target, work_dir, args.trials, num_trials_per_iter=args.per_iter,
                       builder=args.builder, runner=args.runner, builder_workers=workers,
                       cost_model=args.cost_model, baselines=not args.no_baselines, progress=True)
    print(rep.table())
    st = rep.stats
    n = max(1, rep.new_trials)
    tuning_s = sum(t.seconds for t in rep.tasks)
    summary = {"work_dir": work_dir, "builder": args.builder, "runner": args.runner, "builder_workers": workers,
               "trials_per_iter": args.per_iter, "new_trials": rep.new_trials,
               "total_seconds": time.perf_counter() - t0, "tuning_seconds": tuning_s,
               "seconds_per_trial": tuning_s / n, "build_seconds_per_trial": st.get("build_seconds", 0) / n,
               "run_seconds_per_trial": st.get("run_seconds", 0) / n,
               "search_and_overhead_seconds_per_trial":
                   (tuning_s - st.get("build_seconds", 0) - st.get("run_seconds", 0)) / n,
               "load_average": os.getloadavg(),
               # the convolution's task (the layer may also get a layout transform's)
               **max(rep.to_dict()["tasks"], key=lambda task: task.get("flops") or 0)}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
