#!/usr/bin/env python3
"""How far the same program's measured latency moves between gpu_check runs on the same kind of GPU.

    python scripts/gpu_run_repro.py docs/gpu_check_h200_*.json docs/gpu_check_experiments_h200_*.json \\
        --out docs/gpu_run_repro_h200

Why: the whole-program model (issue 12) is judged by |predicted / measured - 1| against one run's medians, with a
target of 10 % median and 25 % worst. A variant whose own measurement moves by more than that between two runs of
the same build on the same GPU model cannot be predicted within the target in both, whatever the model. This
script measures that floor from the runs we already have, instead of assuming the device is repeatable.

Two variants are *the same program* when their model, variant name and everything the run records about the
lowered program agree (stages, streams, the concurrency bound, mode, CUDA graph, the sync kind, the number of
syncs, the wait placement); a variant whose schedule changed between builds is not compared. Only runs on the same
device name are compared (``--device`` picks one when the files mix devices; they are refused otherwise, naming
both). For every program measured in two or more runs: the *spread*, the largest median over the smallest
(1.00 = identical), and whether any of its runs looks *bimodal* (a median above the mean: most calls were slower
than the rest by a wide margin, so the median sits in the slow mode). Grouped by model and by kind of variant
(plain TVM; sequential; concurrent, directly launched; concurrent with a CUDA graph).

The schedule is pinned, the kernels are not: builds from different commits may compile a unit differently (the
runs do not record a kernel fingerprint). So every program also gets a *relative spread*: the same, over its
medians divided by the same run's ``sequential + CUDA graph`` of the model (a device-bound program of the same
kernels). A change of the kernels moves both and cancels; the host and the concurrency do not. Entries whose
units are library calls (``+cudnn``) are left out: cuDNN picks its algorithm (and runtime fusion) when the
library loads, so the name does not pin the program.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence

# what a run records about a variant's lowered program: equal values mean the same program was timed
SIGNATURE = ("stages", "num_streams", "max_concurrency", "mode", "cuda_graph", "sync", "syncs", "waits")
KINDS = ("plain TVM", "sequential", "concurrent, direct", "concurrent, CUDA graph")
CONTROL = "sequential + CUDA graph"


class RunError(ValueError):
    """A run file that cannot be compared (not a gpu_check run, or another device)."""


def load_run(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        run = json.load(f)
    if not isinstance(run, Mapping) or not isinstance(run.get("models"), list) or "device" not in run:
        raise RunError(f"{path}: not a gpu_check run (no 'models' and 'device'; a report or transfer file?)")
    return run


def variant_kind(variant: Mapping) -> str:
    """Which of :data:`KINDS` a variant is (it decides what dominates its time: the host, the device, or both)."""
    name = str(variant.get("name", ""))
    if name.startswith("plain TVM"):
        return KINDS[0]
    if name.startswith("sequential") or not variant.get("num_streams"):
        return KINDS[1]
    return KINDS[3] if variant.get("cuda_graph") else KINDS[2]


def signature(variant: Mapping) -> tuple:
    return tuple(variant.get(k) for k in SIGNATURE)


def bimodal(variant: Mapping) -> bool:
    """A median above the mean: the slower calls are the majority and far from the rest (a unimodal, right-skewed
    timing has its mean above its median)."""
    med, mean = variant.get("median_ms"), variant.get("mean_ms")
    return bool(med and mean and med > mean * 1.02)


def programs(runs: Sequence[tuple[str, Mapping]]) -> list[dict]:
    """Every (model, variant, signature) measured in two or more of ``runs`` (``(label, run)`` pairs), with its
    median per run and its spread."""
    seen: dict[tuple, dict] = {}
    for label, run in runs:
        for model in run["models"]:
            if "+cudnn" in model["name"]:
                continue   # the library picks its algorithm at load: the name does not pin the program
            control = next((c.get("median_ms") for c in model.get("variants", [])
                            if c.get("name") == CONTROL and c.get("ok") is not False), None)
            for v in model.get("variants", []):
                if not v.get("median_ms") or v.get("ok") is False or "PyTorch" in str(v.get("name")):
                    continue   # failed, skipped, or not our build (PyTorch's own kernels change with its version)
                key = (model["name"], v["name"], signature(v))
                entry = seen.setdefault(key, {"model": model["name"], "variant": v["name"],
                                              "kind": variant_kind(v), "runs": {}, "relative": {},
                                              "bimodal_in": []})
                entry["runs"][label] = float(v["median_ms"])
                if control:
                    entry["relative"][label] = float(v["median_ms"]) / float(control)
                if bimodal(v):
                    entry["bimodal_in"].append(label)
    out = []
    for entry in seen.values():
        if len(entry["runs"]) >= 2:
            ms = list(entry["runs"].values())
            entry["spread"] = max(ms) / min(ms)
            rel = list(entry["relative"].values())
            entry["relative_spread"] = max(rel) / min(rel) if len(rel) >= 2 else None
            out.append(entry)
    out.sort(key=lambda e: (e["model"], e["variant"]))
    return out


def summarise(rows: Iterable[Mapping], key: str) -> dict:
    groups: dict[str, list[Mapping]] = {}
    for r in rows:
        groups.setdefault(r[key], []).append(r)
    out = {}
    for name in sorted(groups):
        spreads = [r["spread"] for r in groups[name]]
        rel = [r["relative_spread"] for r in groups[name] if r.get("relative_spread")]
        out[name] = {"programs": len(spreads), "median_spread": statistics.median(spreads),
                     "median_relative_spread": statistics.median(rel) if rel else None,
                     "worst_relative_spread": max(rel) if rel else None,
                     "relative_over_1.25": sum(s > 1.25 for s in rel),
                     "worst_spread": max(spreads), "over_1.25": sum(s > 1.25 for s in spreads),
                     "over_1.10": sum(s > 1.10 for s in spreads),
                     "bimodal": sum(bool(r["bimodal_in"]) for r in groups[name])}
    return out


def pick_device(runs: Sequence[tuple[str, Mapping]], device: str | None) -> list[tuple[str, Mapping]]:
    devices = sorted({str(r["device"]) for _, r in runs})
    if device:
        kept = [(p, r) for p, r in runs if device.lower() in str(r["device"]).lower()]
        if not kept:
            raise RunError(f"no run on a device matching {device!r}; the runs are on: {', '.join(devices)}")
        return kept
    if len(devices) > 1:
        raise RunError(f"the runs are on different devices ({' and '.join(devices)}): one device's runs are "
                       f"comparable; choose with --device")
    return list(runs)


def render(rows: Sequence[Mapping], runs: Sequence[tuple[str, Mapping]], top: int = 12) -> str:
    def table(summary: Mapping, what: str) -> list[str]:
        def f(x):
            return "—" if x is None else f"{x:.3f}"

        lines = [f"| {what} | programs | median spread | worst spread | over 1.10x | over 1.25x | relative: median |"
                 " worst | over 1.25x | bimodal in a run |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for k, s in summary.items():
            lines.append(f"| {k} | {s['programs']} | {s['median_spread']:.3f} | {s['worst_spread']:.3f} | "
                         f"{s['over_1.10']} | {s['over_1.25']} | {f(s['median_relative_spread'])} | "
                         f"{f(s['worst_relative_spread'])} | {s['relative_over_1.25']} | {s['bimodal']} |")
        return lines

    out = ["# The same program measured in several gpu_check runs", "",
           f"Device: **{runs[0][1]['device']}**. Runs (file: the commit it was built from):", ""]
    for label, run in runs:
        out.append(f"- `{label}`: built from {run.get('build', {}).get('built_from') or 'unrecorded'}")
    out += ["", "*spread*: the largest of a program's run medians over the smallest (same model, variant and lowered "
            "program: " + ", ".join(SIGNATURE) + "). *relative*: the same over each median divided by the run's "
            f"`{CONTROL}` of the model (cancels a change of the kernels between builds). *bimodal*: a run's median "
            "above its mean by 2 % or more. `+cudnn` entries are left out (cuDNN picks its algorithm at load).", ""]
    out += table(summarise(rows, "kind"), "kind of variant") + [""]
    out += table(summarise(rows, "model"), "model") + [""]
    all_s = summarise([{**r, "all": "all"} for r in rows], "all").get("all")
    if all_s:
        out.append(f"All: {all_s['programs']} programs, median spread {all_s['median_spread']:.3f}, worst "
                   f"{all_s['worst_spread']:.3f}; {all_s['over_1.25']} move by more than 25 %.")
        out.append("")
    worst = sorted(rows, key=lambda r: -r["spread"])[:top]
    out += [f"The {len(worst)} programs that moved most:", "",
            "| model | variant | spread | relative | medians (ms) by run |", "|---|---|---:|---:|---|"]
    for r in worst:
        ms = ", ".join(f"{os.path.basename(k)} {v:.3f}" + (" (bimodal)" if k in r["bimodal_in"] else "")
                       for k, v in r["runs"].items())
        rel = f"{r['relative_spread']:.2f}x" if r.get("relative_spread") else "—"
        out.append(f"| {r['model']} | {r['variant']} | {r['spread']:.2f}x | {rel} | {ms} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="gpu_check.json files (two or more)")
    ap.add_argument("--device", default=None, help="compare only the runs on this device (substring, e.g. H200)")
    ap.add_argument("--out", default=None, help="write OUT.md and OUT.json")
    args = ap.parse_args(argv)
    try:
        runs = pick_device([(os.path.basename(p), load_run(p)) for p in args.runs], args.device)
    except (RunError, OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if len(runs) < 2:
        print("error: need two or more runs on one device to compare", file=sys.stderr)
        return 2
    rows = programs(runs)
    if not rows:
        print("no program was measured in two of these runs (different models, or every schedule changed)",
              file=sys.stderr)
        return 1
    text = render(rows, runs)
    print(text)
    if args.out:
        with open(args.out + ".md", "w", encoding="utf-8") as f:
            f.write(text)
        with open(args.out + ".json", "w", encoding="utf-8") as f:
            json.dump({"device": runs[0][1]["device"], "runs": [p for p, _ in runs],
                       "by_kind": summarise(rows, "kind"), "by_model": summarise(rows, "model"),
                       "programs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
