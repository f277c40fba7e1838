#!/usr/bin/env python
"""How wide each wave-fused CUDA launch is, against the GPU's SMs: the shape of what the waves ask of the device.

Why: on an H100 with CUDA graphs (2026-11-27) the wave-fused programs ran 0.96x (RandWire) and 0.87x
(NASNet-A-mobile) of the best multi-stream program in dependency mode, while without graphs they won by 1.57x and
1.86x. A wave is one launch and the next wave waits for all of it; a multi-stream program in dependency mode lets
a consumer start as soon as its own producers are done. So the waves lose wherever one launch cannot fill the
device by itself. This prints, per model, the launches that wave fusion builds (as ``gpu_check build``'s
``X+wave`` variants do: schedule under ``sim:h100``, every fusable stage fused) and how many of them have fewer
thread blocks than the GPU has SMs, with the imbalance of their members (slowest member / mean, ``sim:h100``).
No GPU needed (the kernels are lowered for CUDA, not compiled).

    .venv/bin/python scripts/wave_launches.py randwire,nasnet_a_mobile [--scheduler greedy] [--sms 132] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

H100_SMS = 132


def fused_launches(func) -> list[tuple[int, int]]:
    """``(thread blocks, threads per block)`` of every launch of a fused CUDA kernel, in wave order."""
    from tvm_interop.passes.wave.cuda import Launch
    from tvm_interop.passes.wave.lowered import flat, is_declaration
    from tvm.tirx import stmt as S

    out = []
    for s in flat(func.body):
        if is_declaration(s) or not (isinstance(s, S.AttrStmt) and s.attr_key == "thread_extent"):
            continue
        la = Launch(s, "wave")
        out.append((la.grid, la.threads))
    return out


def model_launches(name: str, scheduler: str, config: dict) -> dict:
    """Every fused stage of ``name``'s schedule: its launches and its members' simulated latencies."""
    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.passes.target import normalize_target
    from tvm_interop.passes.wave import apply_wave_fusion

    target = normalize_target("cuda -arch=sm_90")
    program = prepare_program(get_model(name, **config), target, name=name)
    opts = {"max_streams": 8} if scheduler == "greedy" else {}
    sched = schedule_graph(program.graph, scheduler, "sim:h100", model_name=name, **opts)
    sim = get_cost_model("sim:h100")
    fused_program, _, records = apply_wave_fusion(program, sched, target)
    stages = []
    for r in records:
        if not r.fused:
            continue
        func = fused_program.mod[fused_program.calls[r.unit].func_name]
        members = [sum(sim.unit_latency(program.graph.unit(u)) for u in g) for g in r.fused]
        stages.append({"stage": r.stage, "members": len(r.fused), "left_beside": len(r.left),
                       "launches": fused_launches(func), "member_s": members})
    return {"model": name, "scheduler": scheduler, "units": len(program.graph), "stages": len(sched.stages),
            "fused_stages": stages}


def summarise(m: dict, sms: int) -> dict:
    launches = [la for st in m["fused_stages"] for la in st["launches"]]
    under = [(b, t) for b, t in launches if b < sms]
    imbalance = [max(st["member_s"]) / (sum(st["member_s"]) / len(st["member_s"])) for st in m["fused_stages"]]
    blocks = [b for b, _ in launches]
    return {"model": m["model"], "fused_stages": len(m["fused_stages"]), "launches": len(launches),
            "blocks_median": statistics.median(blocks) if blocks else None,
            "blocks_min": min(blocks, default=None), "blocks_max": max(blocks, default=None),
            "under_one_block_per_sm": len(under),
            "under_by_block_size": dict(sorted(Counter(t for _, t in under).items())),
            "imbalance_median": statistics.median(imbalance) if imbalance else None,
            "imbalance_p90": sorted(imbalance)[int(0.9 * (len(imbalance) - 1))] if imbalance else None}


def render(rows: list[dict], sms: int, scheduler: str) -> str:
    lines = [f"| model ({scheduler}+wave) | fused stages | launches | blocks per launch: median (min-max) | "
             f"launches under {sms} blocks (by threads per block) | slowest member / mean: median, p90 |",
             "|---|---:|---:|---|---|---|"]
    for r in rows:
        by = ", ".join(f"{n} x {t}" for t, n in r["under_by_block_size"].items())
        lines.append(f"| {r['model']} | {r['fused_stages']} | {r['launches']} | {r['blocks_median']} "
                     f"({r['blocks_min']}-{r['blocks_max']}) | {r['under_one_block_per_sm']} ({by}) | "
                     f"{r['imbalance_median']:.2f}, {r['imbalance_p90']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", help="comma-separated zoo names")
    ap.add_argument("--scheduler", default="greedy")
    ap.add_argument("--sms", type=int, default=H100_SMS, help="SMs of the GPU to compare with (default: H100)")
    ap.add_argument("--width", type=float, default=None)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--json", default=None, help="write every launch and the summary here")
    args = ap.parse_args(argv)
    config = {k: v for k, v in (("width", args.width), ("image_size", args.image_size)) if v is not None}
    models = [model_launches(n, args.scheduler, config) for n in args.models.split(",") if n]
    rows = [summarise(m, args.sms) for m in models]
    print(render(rows, args.sms, args.scheduler))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"sms": args.sms, "summary": rows, "models": models}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
