"""Measure a tuning bundle (one round of MetaSchedule candidates, built by ``passes.kernels.tuning_bundle``) on
this machine's device, with TVM's runtime only.

    python -m tvm_interop.runtime.tuning_bundle BUNDLE_DIR -o results.json [--device cuda|cpu]

Every candidate library of the bundle is loaded and its kernel timed as MetaSchedule's runners time a candidate
(``runtime.kernel_timer``); a candidate that fails to load or run is recorded with its error, and the others go
on. The results (JSON) carry the bundle's id and this device's fingerprint; ``tvm-interop tune MODEL --db DIR
--import results.json`` puts them into the tuning database and teaches the XGBoost model before the next round.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from .errors import ExportError, InteropError
from .json_file import read_json

BUNDLE_FORMAT = "tvm-interop-tuning-bundle"
RESULTS_FORMAT = "tvm-interop-tuning-results"
VERSION = 1


def load_tuning_bundle(bundle_dir: str) -> dict:
    path = os.path.join(bundle_dir, "bundle.json")
    plan = read_json(path, error=ExportError)
    if plan.get("format") != BUNDLE_FORMAT:
        raise ExportError(f"{path} is not a tvm-interop tuning bundle")
    if plan.get("version") != VERSION:
        raise ExportError(f"{path}: tuning bundle version {plan.get('version')} is not supported (expected {VERSION})")
    return plan


def measure_tuning_bundle(bundle_dir: str, device: str | None = None, number: int | None = None,
                          repeat: int | None = None, min_repeat_ms: int | None = None, out: str | None = None,
                          progress=None) -> dict:
    """Time every candidate of the bundle; returns (and writes to ``out``) the results."""
    import tvm

    from .cuda import check_cuda_device
    from .kernel_timer import time_kernel
    from .profile_bundle import device_fingerprint

    plan = load_tuning_bundle(bundle_dir)
    kind = device or plan["device"]
    if kind not in ("cpu", "cuda"):
        raise InteropError(f"unknown device {kind!r}; use cpu or cuda")
    dev = check_cuda_device(0) if kind == "cuda" else tvm.cpu(0)
    ev = plan.get("evaluator", {})
    number = int(number or ev.get("number", 3))
    repeat = int(repeat or ev.get("repeat", 1))
    min_repeat_ms = int(min_repeat_ms if min_repeat_ms is not None else ev.get("min_repeat_ms", 100))
    t0 = time.perf_counter()
    results = []
    cands = plan["candidates"]
    for i, c in enumerate(cands):
        row = {"id": c["id"]}
        try:
            mod = tvm.runtime.load_module(os.path.join(bundle_dir, c["file"]))
            row["run_secs"] = time_kernel(mod, c["args_info"], dev, number, repeat, min_repeat_ms)
        except Exception as err:  # noqa: BLE001 - one bad candidate is a result, not the end of the batch
            row["error"] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[-1][:300]}"
        results.append(row)
        if progress:
            progress(i + 1, len(cands), row)
    doc = {"format": RESULTS_FORMAT, "version": VERSION, "bundle_id": plan["id"], "device_kind": kind,
           "device": device_fingerprint(kind, dev if kind == "cuda" else None),
           "tvm_version": getattr(tvm, "__version__", "?"), "target": plan.get("target"),
           "evaluator": {"number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms},
           "results": results, "seconds": time.perf_counter() - t0}
    if out:
        from . import atomic

        atomic.write_json(out, doc)
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tvm_interop.runtime.tuning_bundle",
                                description="Time every candidate of a tvm-interop tuning bundle (runtime only).")
    p.add_argument("bundle", help="bundle directory (bundle.json + candidate libraries)")
    p.add_argument("-o", "--output", default=None, help="results to write (default BUNDLE/results.json)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: the bundle's")
    p.add_argument("--number", type=int, default=None)
    p.add_argument("--repeat", type=int, default=None)
    p.add_argument("--min-repeat-ms", type=int, default=None)
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    out = args.output or os.path.join(args.bundle, "results.json")

    def progress(i, n, row):
        if not args.quiet and (i == n or i % 20 == 0):
            print(f"  {i}/{n} candidates timed", file=sys.stderr, flush=True)

    try:
        doc = measure_tuning_bundle(args.bundle, device=args.device, number=args.number, repeat=args.repeat,
                                    min_repeat_ms=args.min_repeat_ms, out=out, progress=progress)
    except InteropError as e:
        print(f"tuning_bundle: error: {e}", file=sys.stderr)
        return 1
    failed = sum(1 for r in doc["results"] if "error" in r)
    print(f"timed {len(doc['results'])} candidates ({failed} failed) on {doc['device']} in {doc['seconds']:.1f} s "
          f"-> {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
