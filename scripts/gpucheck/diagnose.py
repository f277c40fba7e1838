"""The GPU check's ``diagnose`` step (there: TVM's runtime only): the race check. Every concurrent variant runs
several times on the same inputs, then again serialized (``CUDA_LAUNCH_BLOCKING=1``, in a child process)."""
from __future__ import annotations

import json
import os
import sys

from .common import SCRIPT
from .report import render_diagnose
from .run import Variants, _max_err, _to_numpy, environment

def _open_device(manifest: dict):
    import tvm

    from runtime.cuda import check_cuda_device, ensure_cuda_runtime

    if manifest.get("device", "cuda") == "cuda":
        ensure_cuda_runtime()
        return check_cuda_device(0), True
    return tvm.cpu(0), False


def _outputs_of_runs(args, manifest, entry, dev, runs: int) -> dict:
    """name -> [numpy outputs of each run] for plain TVM (once) and every concurrent variant (``runs`` times, on
    the same inputs and weights, a full device sync after each)."""
    variants = Variants(args.dir, entry, manifest["seed"], dev)
    out = {}
    try:
        for var in entry["variants"]:
            if var["name"] != "plain TVM" and not var.get("num_streams"):
                continue
            run_once = variants.call(var)
            res = []
            for _ in range(1 if var["name"] == "plain TVM" else runs):
                res.append(_to_numpy(run_once()))
                dev.sync()
            out[var["name"]] = res
    finally:
        variants.close()
    return out


def _spread(outputs: list, ref) -> dict:
    errs = [_max_err(o, ref) for o in outputs]
    between = max((_max_err(a, outputs[0]) for a in outputs[1:]), default=0.0)
    return {"max_err": max(errs), "run_to_run": between, "runs": len(outputs)}


def cmd_diagnose(args) -> int:
    """Run every concurrent variant several times, then again serialized (``CUDA_LAUNCH_BLOCKING=1``, in a
    child process): a variant whose outputs differ between runs or from plain TVM but are exact when
    serialized has a race (what found the keep-alive bug on the H100)."""
    import subprocess

    with open(os.path.join(args.dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    dev, is_gpu = _open_device(manifest)
    only = set(args.models.split(",")) if args.models else None
    models = []
    for entry in manifest["models"]:
        if only and entry["name"] not in only:
            continue
        runs = _outputs_of_runs(args, manifest, entry, dev, args.runs)
        ref = runs.pop("plain TVM")[0]
        scale = max(1e-6, float(__import__("numpy").max(__import__("numpy").abs(
            ref if not isinstance(ref, list) else ref[0]))))
        tol = 1e-4 * scale + 1e-5
        models.append({"name": entry["name"], "tolerance": tol,
                       "variants": [{"name": n, **_spread(o, ref)} for n, o in runs.items()]})
        print(f"  {entry['name']}: {len(runs)} concurrent variants x {args.runs} runs", file=sys.stderr, flush=True)
    result = {"format": "tvm-interop-gpu-diagnose", "version": 1, "serialized": bool(args.serialized),
              "environment": environment(dev, is_gpu), "runs": args.runs, "models": models}
    os.makedirs(args.out, exist_ok=True)
    if args.serialized:
        with open(os.path.join(args.out, "serialized.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        return 0
    child = os.path.join(args.out, "serialized")
    cmd = [sys.executable, SCRIPT, "diagnose", "--dir", args.dir, "--out", child, "--runs",
           str(args.runs), "--serialized"] + (["--models", args.models] if args.models else [])
    proc = subprocess.run(cmd, env=dict(os.environ, CUDA_LAUNCH_BLOCKING="1"), capture_output=True, text=True)
    serial = {}
    if proc.returncode == 0:
        with open(os.path.join(child, "serialized.json"), encoding="utf-8") as f:
            serial = {(m["name"], v["name"]): v for m in json.load(f)["models"] for v in m["variants"]}
    else:
        result["serialized_error"] = proc.stderr.strip().splitlines()[-1:] if proc.stderr else ["failed"]
    for m in models:
        for v in m["variants"]:
            s = serial.get((m["name"], v["name"]))
            v["serialized"] = s
            v["verdict"] = classify(v, s, m["tolerance"])
    with open(os.path.join(args.out, "gpu_check_diagnose.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "gpu_check_diagnose.md"), "w", encoding="utf-8") as f:
        f.write(render_diagnose(result))
    bad = [v for m in models for v in m["variants"] if v["verdict"] != "exact"]
    print(f"wrote {args.out}/gpu_check_diagnose.json and .md; {len(bad)} variant(s) not exact", file=sys.stderr)
    return 0 if not bad else 1


def classify(run: dict, serialized: dict | None, tol: float) -> str:
    """exact | racy (differs between runs or from plain TVM, exact serialized) | wrong (wrong serialized too)
    | unknown (no serialized run)."""
    if run["max_err"] <= tol and run["run_to_run"] <= tol:
        return "exact"
    if serialized is None:
        return "unknown"
    return "racy" if serialized["max_err"] <= tol and serialized["run_to_run"] <= tol else "wrong"
