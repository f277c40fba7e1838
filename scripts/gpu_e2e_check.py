#!/usr/bin/env python3
"""The user's path on a GPU, end to end: libraries written by the CLI (`tvm-interop compile MODEL --target cuda
--units tvm|cudnn -o DIR/MODEL_UNITS.so`) loaded with TVM's runtime only (`runtime.load`), as a deployment would.
Per library: load time, the first run (the candidate pick, cuDNN's engine choice per shape, the CUDA-graph
capture), the median of 100 runs through `ScheduledModel.benchmark` (numpy input copied in on every call), and
which engine policy chose what; per model, the cuDNN build's output against the TVM-kernel build's on the same
input. gpu_check times the programs themselves; this checks the thing a user loads.

Here:   tvm-interop compile squeezenet --target cuda --arch sm_90 --units cudnn -o .e2e/squeezenet_cudnn.so
        (and --units tvm -o .e2e/squeezenet_tvm.so; likewise inception_v3 --width 0.25, or other models)
There:  the runtime kit of a gpu_check build on PYTHONPATH with TVM_USE_RUNTIME_LIB=1 (see scripts/gpu_check.sh),
        python3 scripts/gpu_e2e_check.py .e2e --models squeezenet,inception_v3   (writes $OUT/e2e.json)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def check_model(directory: str, name: str) -> dict:
    from tvm_interop.runtime import load
    from tvm_interop.runtime.native_libs import cudnn_conv_choices

    out: dict = {}
    outputs = {}
    for units in ("tvm", "cudnn"):
        t0 = time.perf_counter()
        m = load(os.path.join(directory, f"{name}_{units}.so"))
        t1 = time.perf_counter()
        spec = m.inputs[0]
        x = np.random.default_rng(0).standard_normal(spec["shape"]).astype(spec["dtype"])
        y = m.run(x)
        t2 = time.perf_counter()
        b = m.benchmark(x, repeat=100, warmup=10)
        outputs[units] = y[0] if isinstance(y, (list, tuple)) else y
        rec = {"load_s": t1 - t0, "first_run_s": t2 - t1, "median_ms": b["median"] * 1e3, "executor": b["executor"],
               "entry": m.entry_function}
        choices = cudnn_conv_choices(reset=True)   # this library's shapes only (None: no extension loaded yet)
        if choices is not None and choices["choices"]:
            rec.update(policy=choices["policy"], shapes=len(choices["choices"]),
                       graph_chosen=sum(c["chosen"] != "legacy" for c in choices["choices"]))
        out[units] = rec
        print(name, units, rec, flush=True)
        m.close()
    out["max_abs_diff"] = float(np.max(np.abs(outputs["tvm"] - outputs["cudnn"])))
    out["output_max_abs"] = float(np.max(np.abs(outputs["tvm"])))
    print(name, "max abs diff, cuDNN build against TVM-kernel build:", out["max_abs_diff"], flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the folder of MODEL_tvm.so / MODEL_cudnn.so")
    ap.add_argument("--models", default="squeezenet,inception_v3")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    result = {name: check_model(args.dir, name) for name in args.models.split(",")}
    with open(os.path.join(args.out, "e2e.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
