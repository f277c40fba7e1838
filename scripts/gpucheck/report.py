"""The GPU check's reports: Markdown of a run and of a diagnose, and the ``report`` step (here: copy a run's
JSON into ``docs/`` and render it)."""
from __future__ import annotations

import json
import os

from .common import REPO

def render_diagnose(result: dict) -> str:
    env = result.get("environment", {})
    lines = ["# GPU check: diagnose", "", "Environment: " + "; ".join(f"{k} {v}" for k, v in env.items()), "",
             f"Each concurrent variant ran {result['runs']} times on the same inputs, then again with "
             "`CUDA_LAUNCH_BLOCKING=1` (serialized). racy = wrong or unstable only when concurrent.", ""]
    for m in result["models"]:
        lines += [f"## {m['name']}", "", "| variant | max err | run-to-run | serialized max err | verdict |",
                  "|---|---:|---:|---:|---|"]
        for v in m["variants"]:
            s = v.get("serialized")
            lines.append(f"| {v['name']} | {v['max_err']:.1e} | {v['run_to_run']:.1e} | "
                         f"{s['max_err']:.1e} | {v['verdict']} |" if s else
                         f"| {v['name']} | {v['max_err']:.1e} | {v['run_to_run']:.1e} | — | {v['verdict']} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def render_markdown(result: dict) -> str:
    b = result.get("build", {})
    lines = [
        "# GPU check",
        "",
        f"Device: **{result.get('device')}** (compute {result.get('compute_version')}, "
        f"{result.get('multi_processors')} SMs); TVM {result.get('tvm')} runtime; PyTorch {result.get('torch')}.",
        f"Built for `{b.get('target')}` (width {b.get('width')}, batch {b.get('batch')}, image size "
        f"{b.get('image_size') or 'default'}, schedules searched with `{b.get('cost')}`, at most "
        f"{b.get('max_streams')} streams).",
        f"Latency: {result.get('timing')} of {result.get('repeat')} runs after {result.get('warmup')} warm-up runs. "
        "Correctness: outputs compared with plain TVM's direct build on the same GPU.",
        "",
        "Produced by `scripts/gpu_check.sh` (build here, run on the GPU machine with TVM's runtime only).",
        "",
    ]
    env = result.get("environment")
    if env:
        lines += ["Environment: " + "; ".join(f"{k} {v}" for k, v in env.items()), ""]
    for m in result.get("models", []):
        lines += [f"## {m['name']} ({m['units']} units, {m['image_size']}x{m['image_size']})", "",
                  "| variant | median ms | p90 ms | vs plain TVM | streams | stages | CUDA graph | output |",
                  "|---|---:|---:|---:|---:|---:|---|---|"]
        base = next((v.get("median_ms") for v in m["variants"] if v["name"] == "plain TVM"), None)
        for v in m["variants"]:
            med = v.get("median_ms")
            speed = f"{base / med:.2f}x" if (base and med) else ""
            graph = "yes" if v.get("cuda_graph") else ("no" if "graph" not in v["name"] else
                                                      f"no: {v.get('note') or 'fallback'}")
            ok = "n/a" if v.get("ok") is None else ("ok" if v.get("ok") else f"FAIL {v.get('error', '')}")
            if "max_abs_err" in v and v.get("ok"):
                ok = f"ok ({v['max_abs_err']:.1e})"
            lines.append(f"| {v['name']} | {med:.3f} | {v.get('p90_ms', 0):.3f} | {speed} | "
                         f"{v.get('num_streams') if v.get('num_streams') is not None else ''} | "
                         f"{v.get('stages') or ''} | {graph} | {ok} |" if med is not None else
                         f"| {v['name']} | — | — | | | | {graph} | {ok} |")
        lines.append("")
        if m.get("picked"):
            lines += ["What the runtime's candidate picker ships (interleaved timing of a library's candidates: the "
                      "scheduler's variants and sequential):", "",
                      "| scheduler | picked | median ms | best sequential ms | speed-up | never slower |",
                      "|---|---|---:|---:|---:|---|"]
            for s, pk in m["picked"].items():
                lines.append(f"| {s} | {pk['choice']} | {pk['median_ms']:.3f} | {pk['best_sequential_ms']:.3f} | "
                             f"{pk['speedup']:.2f}x | {'yes' if pk['never_slower'] else 'NO'} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def cmd_report(args) -> int:
    with open(args.result, encoding="utf-8") as f:
        result = json.load(f)
    docs = os.path.join(REPO, "docs")
    os.makedirs(docs, exist_ok=True)
    with open(os.path.join(docs, "gpu_check.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(docs, "gpu_check.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(result))
    print(f"wrote {docs}/gpu_check.json and {docs}/gpu_check.md")
    return 0
