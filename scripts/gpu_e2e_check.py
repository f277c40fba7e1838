#!/usr/bin/env python3
"""The user's path on a GPU, end to end: libraries written by the CLI (`tvm-interop compile MODEL --target cuda
-o DIR/MODEL_KIND.so`) loaded with TVM's runtime only (`runtime.load`), as a deployment would. KIND: `tvm` (TVM
kernels: the reference every other library of the model is compared with), `cudnn` (`--units cudnn`) and `flow`
(`--flow-fusion`: runs of stages as persistent launches beside their unfused candidates), whichever are in DIR.
Per library: load time, the first run (the candidate pick, cuDNN's engine choice per shape, the CUDA-graph
capture), the candidate the picker chose, the median of 100 runs through `ScheduledModel.benchmark` (numpy input
copied in on every call), and which engine policy chose what; per library beside `tvm`, its output against the
TVM-kernel build's on the same input (`ok` within rtol/atol 1e-4, except cuDNN, whose own algorithms differ more).
gpu_check times the programs themselves; this checks the thing a user loads.

Here:   tvm-interop compile squeezenet --target cuda --arch sm_90 --units cudnn -o .e2e/squeezenet_cudnn.so
        (and --units tvm -o .e2e/squeezenet_tvm.so, --flow-fusion -o .e2e/squeezenet_flow.so; likewise other models)
There:  bash scripts/gpu_check.sh e2e .e2e --models squeezenet,inception_v3   (a gpu_check build's runtime kit,
        GPU_CHECK_DIR naming that build; writes $OUT/e2e.json)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


KINDS = ("tvm", "cudnn", "flow")   # tvm first: the reference of the others
EXACT = 1e-4   # rtol and atol of a library that runs TVM's own kernels (the flow launches run the same code)


def check_model(directory: str, name: str) -> dict:
    from tvm_interop.runtime import load
    from tvm_interop.runtime.native_libs import cudnn_conv_choices

    out: dict = {}
    outputs = {}
    kinds = [k for k in KINDS if os.path.exists(os.path.join(directory, f"{name}_{k}.so"))]
    if "tvm" not in kinds:
        raise SystemExit(f"{name}: {directory}/{name}_tvm.so, the reference of the model's other libraries, is missing")
    x = None
    for kind in kinds:
        t0 = time.perf_counter()
        m = load(os.path.join(directory, f"{name}_{kind}.so"))
        t1 = time.perf_counter()
        spec = m.inputs[0]
        if x is None:
            x = np.random.default_rng(0).standard_normal(spec["shape"]).astype(spec["dtype"])
        y = m.run(x)
        t2 = time.perf_counter()
        b = m.benchmark(x, repeat=100, warmup=10)
        outputs[kind] = y[0] if isinstance(y, (list, tuple)) else y
        rec = {"load_s": t1 - t0, "first_run_s": t2 - t1, "median_ms": b["median"] * 1e3, "executor": b["executor"],
               "entry": m.entry_function}
        choices = cudnn_conv_choices(reset=True)   # this library's shapes only (None: no extension loaded yet)
        if choices is not None and choices["choices"]:
            rec.update(policy=choices["policy"], shapes=len(choices["choices"]),
                       graph_chosen=sum(c["chosen"] != "legacy" for c in choices["choices"]))
        if kind != "tvm":
            ref, got = outputs["tvm"], outputs[kind]
            rec["max_abs_diff"] = float(np.max(np.abs(got - ref)))
            rec["output_max_abs"] = float(np.max(np.abs(ref)))
            if kind != "cudnn":
                rec["ok"] = bool(np.allclose(got, ref, rtol=EXACT, atol=EXACT))
        out[kind] = rec
        print(name, kind, rec, flush=True)
        m.close()
    if "cudnn" in out:   # the keys of the runs before flow libraries were checked too
        out["max_abs_diff"] = out["cudnn"]["max_abs_diff"]
        out["output_max_abs"] = out["cudnn"]["output_max_abs"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", help="the folder of MODEL_tvm.so / MODEL_cudnn.so")
    ap.add_argument("--models", default="squeezenet,inception_v3")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)
    result = {name: check_model(args.dir, name) for name in args.models.split(",")}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "e2e.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    wrong = [f"{n} {k}" for n, r in result.items() for k, v in r.items()
             if isinstance(v, dict) and v.get("ok") is False]
    if wrong:
        print("outputs differ from the TVM-kernel build:", ", ".join(wrong), flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
