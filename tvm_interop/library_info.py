"""What an exported library holds, for people: model, schedule, target, arches, candidate programs, the pick.

Why: a CUDA library is usually built on a machine without a GPU, where it cannot be loaded (TVM needs its CUDA
runtime to load the kernels), yet that is where one wants to check what was built before copying it to the
device. Everything here is read from the file's bytes (``runtime.library_file``), so it works for every library
on every machine, and says nothing that the library does not record.
"""
from __future__ import annotations

import os

from tvm_interop.runtime import read_library
from tvm_interop.runtime.picker import file_sha256, pick_path, read_pick_file
from tvm_interop.runtime.plan import ExecutionPlan


def library_summary(path: str) -> tuple[dict, ExecutionPlan]:
    """A JSON-able summary of the library at ``path`` and of the pick file beside it, and the library's plan."""
    plan, kinds = read_library(path)
    meta = plan.meta
    candidates = meta.get("candidates") or []
    summary = {
        "library": os.fspath(path), "megabytes": os.path.getsize(path) / 2**20,
        "model": meta.get("model"), "scheduler": meta.get("scheduler"), "target": meta.get("target"),
        "device": "cuda" if "cuda" in kinds else meta.get("device", "cpu"),
        "cuda_arches": meta.get("cuda_arches"), "mode": meta.get("mode"), "num_streams": meta.get("num_streams"),
        "cuda_graph": meta.get("cuda_graph"), "units": len(plan.calls), "stages": len(plan.stages),
        "max_concurrency": plan.max_concurrency(),
        "candidates": [c["name"] for c in candidates], "default_candidate": meta.get("default_candidate"),
        "fused_units": meta.get("fused_units") or [],
        "pick": None,
    }
    report = read_pick_file(path)
    if report is not None:
        summary["pick"] = {"file": pick_path(path), "choice": report.choice, "device": report.device,
                           "summary": report.summary(),
                           "current": report.library_sha256 == file_sha256(path)}
    return summary, plan


def describe_library(summary: dict, plan: ExecutionPlan | None = None) -> str:
    """The summary as text; with ``plan``, one line per stage (its groups' units, ``|`` between groups)."""
    s = summary
    target = s["target"] or "?"
    if s["cuda_arches"]:
        target += f" (binaries: {', '.join(s['cuda_arches'])})"
    head = [f"{s['library']}: {s['model']}, scheduler {s['scheduler']}, target {target}, {s['megabytes']:.1f} MiB"]
    width = s["max_concurrency"]
    layout = (f"{s['units']} units in {s['stages']} stages, "
              + (f"up to {width} concurrent groups" if width > 1 else "one group at a time"))
    if s["device"] == "cuda":
        layout += (f"; {s['mode']} mode on {s['num_streams']} streams" if s["num_streams"] else "; one stream")
        layout += ", CUDA graph" if s["cuda_graph"] else ""
    head.append(f"  {layout}")
    if s["candidates"]:
        head.append(f"  candidate programs ({len(s['candidates'])}, the device picks the fastest at first run or with "
                    f"`tvm-interop pick`; default {s['default_candidate']}): {', '.join(s['candidates'])}")
    for f in s.get("fused_units") or []:
        if f["fusion"] == "flow":
            head.append(f"  {f['unit']}: one flow launch running {f['stages']} stage(s) of the schedule "
                        f"({f['launches']} kernel launches, {f['blocks']} blocks, each waiting only for its producers)")
        else:
            left = f", {f['left']} group(s) beside it" if f["left"] else ""
            head.append(f"  {f['unit']}: stage {f['stage']}'s {f['groups']} groups as one wave-fused kernel{left}")
    pick = s["pick"]
    if pick is not None:
        state = "" if pick["current"] else " — written for another build of this library, ignored at load"
        head.append(f"  {pick['file']}: on {pick['device']}, {pick['summary']}{state}")
    if plan is not None:
        for i, stage in enumerate(plan.stages):
            groups = " | ".join(", ".join(plan.calls[c].unit for c in g) for g in stage)
            head.append(f"  {i:3d} {groups}")
    return "\n".join(head)
