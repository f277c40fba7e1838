"""The GPU check's ``diagnose`` step (there: TVM's runtime only): the race check that found the keep-alive bug on
the H100.

Every concurrent variant (a scheduled program with streams) runs ``--runs`` times on the same inputs and weights;
the report gives its spread (max abs difference between any two runs) and its error against plain TVM. Then the
same runs again in a child process with ``CUDA_LAUNCH_BLOCKING=1``, where every launch completes before the next
starts, so streams cannot overlap. Each variant is then

* **exact**: every run matches plain TVM and the runs agree;
* **racy**: wrong or unstable concurrently, exact serialized: a missing synchronisation or a memory hazard between
  streams (what the H100 showed);
* **wrong**: wrong even serialized: the program computes something else (a lowering bug, not a race);
* **unknown**: not exact, and the serialized run is missing (the child failed); **error**: it did not run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from itertools import combinations


from .common import SCRIPT
from .device import environment, runtime_only_status
from .report import render_diagnose
from .run import CannotRun, Variants, _error_text, _max_err, _to_numpy, log, start, tolerance


def _is_concurrent(var: dict) -> bool:
    """Variants with streams: the only ones that can race (sequential and plain TVM run on one stream)."""
    return bool(var.get("num_streams"))


def spread(outputs: list, ref) -> dict:
    """Run-to-run spread (max abs difference over all pairs of runs) and error against the reference."""
    per_run = [_max_err(o, ref) for o in outputs]
    between = max((_max_err(a, b) for a, b in combinations(outputs, 2)), default=0.0)
    return {"max_err": max(per_run), "run_to_run": between, "runs": len(outputs), "max_err_per_run": per_run}


def _repeat(variants: Variants, var: dict, runs: int, sync) -> list:
    """``runs`` outputs of one variant, a full device sync after each."""
    run_once = variants.call(var)
    out = []
    for _ in range(runs):
        out.append(_to_numpy(run_once()))
        sync()
    return out


def diagnose_model(d: str, manifest: dict, entry: dict, dev, runs: int) -> dict:
    """Plain TVM once (the reference), then every concurrent variant ``runs`` times."""
    variants = Variants(d, entry, manifest["seed"], dev)
    try:
        plain = next(v for v in entry["variants"] if v["name"] == "plain TVM")
        ref = _repeat(variants, plain, 1, dev.sync)[0]
        model = {"name": entry["name"], "tolerance": tolerance(ref), "variants": []}
        for var in filter(_is_concurrent, entry["variants"]):
            try:
                rec = {"name": var["name"], **spread(_repeat(variants, var, runs, dev.sync), ref)}
            except Exception as e:  # noqa: BLE001 - one variant that does not run must not hide the others
                rec = {"name": var["name"], "error": _error_text(e)}
            model["variants"].append(rec)
    finally:
        variants.close()
    log(f"  {entry['name']}: {len(model['variants'])} concurrent variants x {runs} runs")
    return model


def _serialized(args) -> tuple[dict, str | None]:
    """The same diagnosis in a child process with ``CUDA_LAUNCH_BLOCKING=1``: ``{(model, variant): record}`` and
    the child's error, if it failed."""
    child = os.path.join(args.out, "serialized")
    cmd = [sys.executable, SCRIPT, "diagnose", "--dir", args.dir, "--out", child, "--runs", str(args.runs),
           "--serialized"] + (["--models", args.models] if args.models else [])
    proc = subprocess.run(cmd, env=dict(os.environ, CUDA_LAUNCH_BLOCKING="1"), capture_output=True, text=True)
    if proc.returncode != 0:
        return {}, (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    with open(os.path.join(child, "serialized.json"), encoding="utf-8") as f:
        data = json.load(f)
    return {(m["name"], v["name"]): v for m in data["models"] for v in m["variants"]}, None


def classify(run: dict, serialized: dict | None, tol: float) -> str:
    """exact | racy (differs between runs or from plain TVM, exact serialized) | wrong (wrong serialized too)
    | unknown (not exact, no serialized run) | error (did not run)."""
    if "error" in run:
        return "error"
    if run["max_err"] <= tol and run["run_to_run"] <= tol:
        return "exact"
    if serialized is None or "error" in serialized:
        return "unknown"
    return "racy" if serialized["max_err"] <= tol and serialized["run_to_run"] <= tol else "wrong"


def _write(out: str, name: str, result: dict, markdown: bool) -> None:
    from tvm_interop.runtime import atomic

    os.makedirs(out, exist_ok=True)
    atomic.write_text(os.path.join(out, name + ".json"), json.dumps(result, indent=1))
    if markdown:
        atomic.write_text(os.path.join(out, name + ".md"), render_diagnose(result))


def cmd_diagnose(args) -> int:
    """Diagnose every (selected) model; exit 1 when a variant is not exact, 2 when the carried build cannot run
    here (CUDA source in a library)."""
    try:
        manifest, entries, _, dev, is_gpu = start(args)
    except CannotRun as e:
        return e.status
    models = [diagnose_model(args.dir, manifest, e, dev, args.runs) for e in entries]
    result = {"format": "tvm-interop-gpu-diagnose", "version": 1, "serialized": bool(args.serialized),
              "environment": environment(dev, is_gpu), "runtime_only": runtime_only_status(), "runs": args.runs,
              "models": models}
    if args.serialized:
        _write(args.out, "serialized", result, markdown=False)
        return 0
    serial, err = _serialized(args)
    if err:
        result["serialized_error"] = err
    for m in models:
        for v in m["variants"]:
            v["serialized"] = serial.get((m["name"], v["name"]))
            v["verdict"] = classify(v, v["serialized"], m["tolerance"])
    _write(args.out, "gpu_check_diagnose", result, markdown=True)
    bad = [v for m in models for v in m["variants"] if v["verdict"] != "exact"]
    log(f"wrote {args.out}/gpu_check_diagnose.json and .md; {len(bad)} variant(s) not exact")
    return 0 if not bad else 1
