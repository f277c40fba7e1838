#!/usr/bin/env python
"""Compare the schedulers on the zoo models under simulated devices.

For every model x batch x cost model: the predicted latency of every scheduler (``exhaustive`` excluded),
its speedup over ``sequential`` and its search time; writes ``docs/bench_schedulers.json`` and
``docs/bench_schedulers.md``.

    .venv/bin/python scripts/bench_schedulers.py                       # the full table (a few minutes)
    .venv/bin/python scripts/bench_schedulers.py --synthetic            # TVM-free stand-ins (passes.synthetic)
    .venv/bin/python scripts/bench_schedulers.py --models squeezenet --batches 1 --costs sim:h100

Model graphs come from ``tvm_interop.api.model_graph`` (zoo models are built and fused by TVM, which takes a
while for nasnet_a_large); ``--graph-cache DIR`` keeps them as JSON between runs.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tvm_interop.passes.cost import get_cost_model  # noqa: E402
from tvm_interop.passes.graph import OpGraph  # noqa: E402
from tvm_interop.passes.schedulers import schedule_graph  # noqa: E402

MODELS = ["inception_v3", "randwire", "nasnet_a_large", "nasnet_a_mobile", "squeezenet"]
BATCHES = [1, 32]
COSTS = ["sim:h100", "sim:v100"]
SCHEDULERS = ["sequential", "greedy", "lios", "hios", "ios_dp", "ios", "autograph"]
OPTIONS = {"ios": {"r": 3, "s": 8}, "ios_dp": {"r": 3, "s": 8, "guard": False}, "lios": {"x": 8},
           "hios": {"devices": 2, "w": 4}, "greedy": {"max_streams": 8},
           "autograph": {"scheduler": "ios", "r": 3, "s": 8}}
# column name -> registered scheduler (ios_dp: IOS's dynamic program alone, without ios's guard)
SCHEDULER_OF = {"ios_dp": "ios"}


def load_graph(model: str, batch: int, synthetic: bool, cache: str | None) -> OpGraph:
    if synthetic:
        from tvm_interop.passes.synthetic import synthetic_model

        return synthetic_model(model, batch=batch)
    path = os.path.join(cache, f"{model}_b{batch}.json") if cache else None
    if path and os.path.exists(path):
        with open(path) as f:
            return OpGraph.from_json(json.load(f))
    from tvm_interop.api import model_graph

    g = model_graph(model, batch_size=batch)
    if path:
        os.makedirs(cache, exist_ok=True)
        with open(path, "w") as f:
            json.dump(g.to_json(), f)
    return g


def machine() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        info["load_average"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    return info


def run(args) -> dict:
    rows = []
    for model in args.models:
        for batch in args.batches:
            t0 = time.perf_counter()
            g = load_graph(model, batch, args.synthetic, args.graph_cache)
            load_s = time.perf_counter() - t0
            for spec in args.costs:
                cost = get_cost_model(spec)
                row = {"model": model, "batch": batch, "cost": cost.device_fingerprint, "units": len(g),
                       "edges": len(g.edges), "load_seconds": round(load_s, 2), "schedulers": {}}
                for name in args.schedulers:
                    if name == "autograph" and args.synthetic:
                        continue   # autograph rewrites the model itself; a synthetic graph has none
                    t1 = time.perf_counter()
                    c1 = time.process_time()
                    if name == "autograph":
                        sc = autograph_schedule(model, batch, cost)
                    else:
                        sc = schedule_graph(g, SCHEDULER_OF.get(name, name), cost, model_name=model, batch=batch,
                                            **OPTIONS.get(name, {}))
                    wall, cpu = time.perf_counter() - t1, time.process_time() - c1
                    row["schedulers"][name] = {
                        "predicted_ms": sc.predicted_latency * 1e3,
                        "speedup": sc.sequential_latency / sc.predicted_latency,
                        "stages": sc.num_stages,
                        "merge_stages": sum(1 for s in sc.stages if s.strategy == "merge"),
                        "devices_used": len(set(sc.unit_devices.values())) if sc.unit_devices else 1,
                        "search": {k: sc.search.get(k) for k in ("states", "transitions", "stages_costed")},
                        "wall_seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
                    }
                    if name == "autograph":
                        ag = sc.search["autograph"]
                        row["schedulers"][name]["autograph"] = {
                            k: ag[k] for k in ("substitutions_applied", "rules_applied", "substitution_sites",
                                               "parts", "states", "candidates", "partition_s", "search_s",
                                               "verify_s", "total_s", "rejected_rules")}
                        row["schedulers"][name]["unrewritten_ms"] = ag["unrewritten_latency"] * 1e3
                        print(f"{'':15s} autograph: {ag['substitutions_applied']} substitutions {ag['rules_applied']}",
                              flush=True)
                        continue   # its sequential is the unrewritten model's (set by the search)
                    row["sequential_ms"] = sc.sequential_latency * 1e3
                    if name == "ios_dp":   # IOS's granularity: the blocks and schedule units the DP searched
                        bl = sc.search["blocks"]
                        big = max(bl, key=lambda b: b["transitions"])
                        row.update(schedule_units=sc.search["schedule_units"], blocks=len(bl),
                                   largest_block=max(b["units"] for b in bl),
                                   largest_block_states=max(b["states"] or 0 for b in bl),
                                   max_block_transitions=big["transitions"],
                                   blocks_over_budget=sum(b["states"] is None for b in bl))
                    print(f"{model:15s} b{batch:<3d} {cost.device_fingerprint:9s} {name:10s} "
                          f"{sc.predicted_latency * 1e3:9.3f} ms  x{sc.sequential_latency / sc.predicted_latency:5.2f}"
                          f"  {wall:7.2f} s wall {cpu:7.2f} s cpu", flush=True)
                s = row["schedulers"]
                if {"ios", "lios", "greedy"} <= set(s):
                    row["ios<=lios<=greedy"] = bool(s["ios"]["predicted_ms"] <= s["lios"]["predicted_ms"] * (1 + 1e-9)
                                                    and s["lios"]["predicted_ms"] <= s["greedy"]["predicted_ms"] * (1 + 1e-9))
                if {"ios_dp", "lios"} <= set(s):
                    row["ios_dp<=lios"] = bool(s["ios_dp"]["predicted_ms"] <= s["lios"]["predicted_ms"] * (1 + 1e-9))
                rows.append(row)
    return {"machine": machine(), "synthetic": args.synthetic, "options": OPTIONS,
            "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:]), "rows": rows}


def autograph_schedule(model: str, batch: int, cost):
    """AutoGraph on the zoo model under ``cost``: candidates are prepared by TVM (legalize + fuse) the way
    ``tvm_interop.api.model_graph`` prepares the graphs of the other columns."""
    from tvm_interop.passes.autograph.driver import run_autograph
    from tvm_interop.api import load_module, prepare_program

    mod, name = load_module(model, batch_size=batch)
    # prepared exactly as model_graph prepares the other columns' graphs, so the unrewritten candidate is the ios
    # column's graph and the ratio compares like with like
    result = run_autograph(mod, prepare=lambda m: prepare_program(m, "llvm", name=name),
                           cost_for=lambda p: (cost, lambda: None), device_kind="cuda", cost_spec=cost,
                           options=dict(OPTIONS["autograph"]), model_name=model, batch=batch)
    return result.schedule


def markdown(result: dict) -> str:
    m = result["machine"]
    scheds = [s for s in SCHEDULERS if any(s in r["schedulers"] for r in result["rows"])]
    lines = [
        "# Scheduler benchmark (simulated devices)",
        "",
        "Predicted latency of each scheduler's schedule under the analytical device model "
        "(`passes/cost/simulated.py`), speedup over `sequential`, and search time on the build machine. "
        "No GPU is involved: the numbers are what the simulator predicts, useful to compare schedulers, not "
        "measurements." + (" **Graphs: synthetic stand-ins** (`passes/synthetic.py`)." if result["synthetic"] else
                           " Graphs: the zoo models, extracted by TVM (`tvm_interop.api.model_graph`)."),
        "",
        f"Options: {', '.join(f'{k} {v}' for k, v in result['options'].items())}. "
        "`ios_dp` is IOS's dynamic program alone; `ios` adds its guard (the cheapest of the DP's schedule, "
        "sequential, greedy and lios at 1..s streams, per block). "
        "hios predicted latency includes inter-device transfers (300 GB/s, 5 us) and may keep one device "
        "when that is faster. The exact searches (ios, ios_dp) schedule *schedule units* (chains of kernels whose "
        "inner tensors have one producer and one consumer, `passes/contract.py`) in IOS's blocks (barriers where "
        "at most 2 tensors are live, each block within 4096 DP states where the graph has such a barrier, "
        "`passes.partition.frontier_blocks`); the other schedulers place kernels, cut at cut points only. "
        "`units`: kernels / schedule units; `blocks`: ios_dp's blocks, largest in units and DP states, most DP "
        "transitions in one block (IOS's Table 1 measure) and blocks over the 4096-state preference (searched "
        "whole: the DP's own budget is 32768 states over schedule units, never reached here).",
        "",
        f"Machine: {m.get('cpu', '?')}, {m.get('cpus')} CPUs, Python {m.get('python')}, load average at the end "
        f"{m.get('load_average')} (other jobs shared the machine: wall times are inflated; CPU seconds are "
        "the search's own).",
        "",
        # a command file with its own markup (rows merged from two runs) is printed as it is
        f"Reproduce: {result['command']}" if "`" in result["command"] else f"Reproduce: `{result['command']}`",
        "",
        "| model | batch | device | units | blocks (largest: units / states; max transitions; over) | sequential ms | "
        + " | ".join(f"{s} ms (x)" for s in scheds if s != "sequential")
        + " | ios search s (wall / cpu) | ios states / transitions | lios s | ios<=lios<=greedy | ios_dp<=lios |",
        "|" + "---|" * (6 + len([s for s in scheds if s != "sequential"]) + 5),
    ]
    for r in result["rows"]:
        s = r["schedulers"]
        units = f"{r['units']} / {r['schedule_units']}" if "schedule_units" in r else str(r["units"])
        blocks = (f"{r['blocks']} ({r['largest_block']} / {r['largest_block_states']}; "
                  f"{r['max_block_transitions']}; {r['blocks_over_budget']})") if "blocks" in r else "-"
        cells = [r["model"], str(r["batch"]), r["cost"], units, blocks, f"{r['sequential_ms']:.3f}"]
        for name in scheds:
            if name == "sequential":
                continue
            x = s.get(name)
            cells.append("-" if x is None else f"{x['predicted_ms']:.3f} ({x['speedup']:.2f})")
        io = s.get("ios")
        cells.append("-" if io is None else f"{io['wall_seconds']:.2f} / {io['cpu_seconds']:.2f}")
        cells.append("-" if io is None else f"{io['search']['states']} / {io['search']['transitions']}")
        cells.append("-" if "lios" not in s else f"{s['lios']['wall_seconds']:.3f}")
        cells.append(str(r.get("ios<=lios<=greedy", "-")))
        cells.append(str(r.get("ios_dp<=lios", "-")))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines += autograph_section(result["rows"])
    lines += granularity_section(result["rows"])
    return "\n".join(lines)


def autograph_section(rows: list[dict]) -> list[str]:
    """autograph next to ios: the ratio of predicted latencies, the search time and the substitutions applied."""
    out = []
    for r in rows:
        ag, io = r["schedulers"].get("autograph"), r["schedulers"].get("ios")
        if not ag or not io:
            continue
        a = ag["autograph"]
        rules = ", ".join(f"{k} x{v}" for k, v in sorted(a["rules_applied"].items())) or "none"
        base = ag.get("unrewritten_ms", io["predicted_ms"])   # ios on the model as given, inside the search
        out.append(f"| {r['model']} | {r['batch']} | {r['cost']} | {io['predicted_ms']:.3f} | {base:.3f} | "
                   f"{ag['predicted_ms']:.3f} | {ag['predicted_ms'] / base:.3f} | {a['substitution_sites']} | "
                   f"{a['substitutions_applied']} ({rules}) | {a['parts']} | {a['states']} | {a['candidates']} | "
                   f"{a['search_s']:.1f} / {a['verify_s']:.1f} / {a['total_s']:.1f} |")
    if not out:
        return []
    return ["## AutoGraph next to IOS", "",
            "autograph (`passes/autograph`): equivalent substitutions (`passes/substitutions`) searched per subgraph "
            "of a min-cut partition under the mixed critical-path estimate, the top candidates (and the model as "
            "given) scheduled by ios under the same simulated device; the best ships. `ios (search)` = ios on the "
            "model as given, as the search priced it (the candidate without substitutions; equal to the `ios` "
            "column); `ratio` = autograph / ios (search) predicted latency (below 1: the rewrite pays). Seconds: "
            "rewrite search / verification (TVM prepares and ios schedules each candidate) / total.",
            "", "| model | batch | device | ios ms | ios (search) ms | autograph ms | ratio | sites | "
            "substitutions applied | subgraphs | rewrite states | candidates | search / verify / total s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|", *out, ""]


# IOS (Ding et al., MLSys'21) Table 2: blocks and operators (schedule units) per network
IOS_TABLE2 = {"inception_v3": (11, 119), "randwire": (3, 120), "nasnet_a_large": (13, 374), "squeezenet": (10, 50)}


def granularity_section(rows: list[dict]) -> list[str]:
    """Our schedule units and blocks next to IOS's Table 2 (batch 1, the first cost of each model)."""
    seen, out = set(), []
    for r in rows:
        if r["model"] in seen or "schedule_units" not in r or r["batch"] != 1:
            continue
        seen.add(r["model"])
        ios = IOS_TABLE2.get(r["model"])
        ratio = f"{r['schedule_units'] / ios[1]:.2f}" if ios else "-"
        out.append(f"| {r['model']} | {r['units']} | {r['schedule_units']} | {ios[1] if ios else '-'} | {ratio} | "
                   f"{r['blocks']} | {ios[0] if ios else '-'} | {r['largest_block']} | {r['largest_block_states']} | "
                   f"{r['max_block_transitions']} | {r['blocks_over_budget']} |")
    if not out:
        return []
    return ["## Granularity next to IOS (Table 2)", "",
            "Kernels: what TVM fuses the model into. Schedule units: what ios searches (chains contracted). "
            "Blocks: ios_dp's blocks; IOS's counts are its Table 2. `over`: blocks without a small-frontier "
            "barrier inside that exceed the 4096-state preference (RandWire's stages: every position inside a "
            "stage has 8-18 live tensors); each is still searched whole (the DP's budget, 32768 states, is not "
            "reached). Max transitions: the DP transitions of the most expensive block (IOS's Table 1 measure).",
            "", "| model | kernels | schedule units | IOS operators | units / IOS | blocks | IOS blocks | "
            "largest block (units) | largest block (states, within budget) | max transitions in one block | over |",
            "|---|---|---|---|---|---|---|---|---|---|---|", *out, ""]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--batches", nargs="+", type=int, default=BATCHES)
    p.add_argument("--costs", nargs="+", default=COSTS)
    p.add_argument("--schedulers", nargs="+", default=SCHEDULERS)
    p.add_argument("--synthetic", action="store_true", help="use passes.synthetic stand-ins (no TVM)")
    p.add_argument("--graph-cache", default=None, help="keep extracted graphs as JSON in this folder")
    p.add_argument("--out", default=os.path.join(ROOT, "docs"), help="folder for bench_schedulers.{json,md}")
    p.add_argument("--render", default=None, metavar="JSON", help="only re-render the markdown of a result file")
    args = p.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            result = json.load(f)
        with open(os.path.splitext(args.render)[0] + ".md", "w") as f:
            f.write(markdown(result))
        return 0
    if "sequential" not in args.schedulers:
        args.schedulers = ["sequential"] + args.schedulers
    result = run(args)
    os.makedirs(args.out, exist_ok=True)
    stem = "bench_schedulers" + ("_synthetic" if args.synthetic else "")
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(markdown(result))
    print(f"wrote {os.path.join(args.out, stem + '.json')} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
