#!/usr/bin/env python3
"""Report active device searches (`tvm-interop schedule MODEL --target cuda --active DIR`) that ran on a GPU: the
rounds, what each pick was predicted and measured at, the optimisation cost next to IOS's published one, and how
the shipped picks fared in a gpu_check run beside the other schedulers.

    .venv/bin/python scripts/active_search_report.py docs/active_h200_2026-11-27 \\
        --gpu-check docs/gpu_check_h200_2026-11-27_active.json --name active_search_h200_2026-11-27

DIR holds one folder per model (the model's zoo name) with the search's ``active.json`` and merged ``costs.json``,
and per round ``round-K.bundle.json`` (the bundle's plan) and ``round-K.costs.json`` (what the device measured);
optionally ``command_seconds.json`` beside them (the wall time of each `schedule --active` call, for states written
before the search recorded its own time).

Why a report of its own: the search's whole-program numbers come from the profiling bundle (stages back to back,
timed with CUDA events), not from a deployed library; gpu_check times the library the user loads. Both are shown,
each labelled. Every pick is also priced two ways offline, from the search's own measured table: the sum of its
isolated stage costs (what the schedulers optimise) and the fitted whole-program model (``passes.cost.program``,
fitted on H100 data of 2026-11-22..27): these programs are held out from that fit.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# IOS (Ding et al., MLSys'21): optimisation cost reported for its schedules (as issue 12 quotes them), seconds
IOS_PUBLISHED = {"inception_v3": 48.0, "randwire": 4407.0, "nasnet_a_large": 3653.0}
OTHERS = ("sequential", "greedy", "lios", "ios")


def _read(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _rounds(mdir: str) -> list[int]:
    ks = [int(f[len("round-"):-len(".bundle.json")]) for f in os.listdir(mdir)
          if f.startswith("round-") and f.endswith(".bundle.json")]
    return sorted(ks)


def price_candidates(model: str, mdir: str) -> list[dict]:
    """Every measured pick: its search prediction, stage sum and program-model prediction from the final table."""
    from tvm_interop.api import load_module, prepare_program
    from tvm_interop.passes.cost.program import ProgramCostModel, load_fitted, simulate, stage_ops, IssuedProgram
    from tvm_interop.passes.cost.table import TableCostModel

    state = _read(os.path.join(mdir, "active.json"))
    mod, name = load_module(model)
    graph = prepare_program(mod, state["target"], name=name).graph
    if graph.fingerprint() != state["graph_fingerprint"]:
        raise SystemExit(f"{mdir}: the search is for graph {state['graph_fingerprint']}, today's {model} is "
                         f"{graph.fingerprint()}")
    table = TableCostModel(os.path.join(mdir, "costs.json"), fallback="units", clock=state.get("clock", "issue"))
    by_name = {u.name: u for u in graph.units}
    pm = ProgramCostModel(table.units, load_fitted(), timing_number=int(table.table.get("number") or 0))
    units = pm.unit_inputs(graph)
    rows = []
    for k in _rounds(mdir):
        plan = _read(os.path.join(mdir, f"round-{k}.bundle.json"))
        measured = _read(os.path.join(mdir, f"round-{k}.costs.json"))
        for entry in measured.get("programs", []):
            pr = plan["programs"][entry["index"]]
            if pr.get("mode", "stage") != "stage":   # a dependency-mode twin: the program model's protocol is
                continue                              # stages back to back; its time is in the state's candidates
            cand = state["candidates"][pr["name"]]
            stages = pr["stages"]
            stage_sum = sum(table.stage_latency([[by_name[n] for n in g] for g in groups]) for groups in stages)
            streams = max(len(groups) for groups in stages)
            prog = IssuedProgram([op for groups in stages for op in stage_ops(groups)],
                                 num_streams=streams if streams > 1 else 0, name=pr["name"])
            rows.append({"name": pr["name"], "scheduler": cand["scheduler"], "round": cand["round"],
                         "stages": len(stages), "search_predicted_ms": cand["predicted_ms"],
                         "stage_sum_ms": stage_sum * 1e3,
                         "program_model_ms": simulate(prog, units, pm.params).latency * 1e3,
                         "measured_ms": entry["latency"] * 1e3,
                         # its dependency-mode twin (searches since c60f49b, on a GPU), else None
                         "measured_dependency_ms": cand.get("measured_dependency_ms")})
    return rows


def gpu_check_cells(run: dict, model: str, label: str = "active") -> list[dict]:
    """Per (mode, CUDA graph): the active pick's library against the schedulers' of the same gpu_check run."""
    entry = next((m for m in run.get("models", []) if m["name"] == model), None)
    if entry is None:
        return []
    cells: dict[tuple, dict] = {}
    for v in entry["variants"]:
        if not v.get("ok") or v.get("median_ms") is None or "mode" not in v:
            continue
        base = v["name"].split(" (")[0].split(" + ")[0]
        if base in (label,) + OTHERS:
            cells.setdefault((v["mode"], bool(v["cuda_graph"])), {})[base] = v["median_ms"]
    out = []
    for (mode, graph), ms in sorted(cells.items()):
        if label not in ms:
            continue
        others = {k: v for k, v in ms.items() if k != label}
        best = min(others, key=others.get)
        out.append({"mode": mode, "cuda_graph": graph, "active_ms": ms[label], "ios_ms": ms.get("ios"),
                    "best_other": best, "best_other_ms": others[best], "ratio": ms[label] / others[best]})
    return out


def optimisation_cost(model: str, state: dict, command_seconds: dict | None) -> dict:
    """Device seconds from the rounds' tables; host seconds from the state when every round recorded its search
    (``passes.device_search.optimisation_cost``), else from the calls' wall times in ``command_seconds``."""
    from tvm_interop.passes.device_search import optimisation_cost as recorded

    rec = recorded(state)
    if rec["unrecorded_rounds"] == 0:
        host, source = rec["search_seconds"], "the state's own search_seconds"
    elif command_seconds and model in command_seconds:
        host, source = sum(command_seconds[model].values()), "command_seconds.json (wall of every call)"
    else:
        host, source = None, "not recorded"
    device = rec["device_seconds"]
    return {"device_seconds": device, "host_seconds": host, "host_source": source,
            "total_seconds": None if host is None else host + device,
            "ios_published_seconds": IOS_PUBLISHED.get(model)}


def _err(pred: float, meas: float) -> float:
    return (pred - meas) / meas


def report(root: str, gpu_check: str | None) -> dict:
    cs_path = os.path.join(root, "command_seconds.json")
    command_seconds = _read(cs_path) if os.path.exists(cs_path) else None
    run = _read(gpu_check) if gpu_check else None
    models = []
    for model in sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d))):
        mdir = os.path.join(root, model)
        state = _read(os.path.join(mdir, "active.json"))
        shipped = _read(os.path.join(mdir, "shipped.json"))["search"]["device_search"]["shipped"] \
            if os.path.exists(os.path.join(mdir, "shipped.json")) else None
        models.append({"model": model, "device": state["device"], "clock": state.get("clock", "issue"),
                       "history": state["history"], "shipped": shipped,
                       "candidates": price_candidates(model, mdir),
                       "cost": optimisation_cost(model, state, command_seconds),
                       "gpu_check": gpu_check_cells(run, model) if run else []})
    allc = [c for m in models for c in m["candidates"]]
    summary = {}
    for key in ("program_model_ms", "stage_sum_ms"):
        errs = [abs(_err(c[key], c["measured_ms"])) for c in allc]
        summary[key] = {"median_abs_err": statistics.median(errs), "worst_abs_err": max(errs), "programs": len(errs)}
    return {"format": "tvm-interop-active-search-report", "version": 1, "source": root,
            "gpu_check": gpu_check, "models": models, "prediction": summary}


def to_markdown(rep: dict) -> str:
    out = ["# Active device search on a GPU", "",
           f"Source: `{rep['source']}`" + (f"; libraries timed in `{rep['gpu_check']}`" if rep["gpu_check"] else "")
           + ". Produced by `scripts/active_search_report.py`.", ""]
    pm, ss = rep["prediction"]["program_model_ms"], rep["prediction"]["stage_sum_ms"]
    out += ["## Whole-program prediction, held out", "",
            f"Every program the searches measured ({pm['programs']}), priced from the search's own measured table: "
            f"the fitted program model (`passes.cost.program`) median |error| {pm['median_abs_err'] * 100:.1f}%, "
            f"worst {pm['worst_abs_err'] * 100:.1f}%; the sum of isolated stage costs (what the schedulers minimise) "
            f"median {ss['median_abs_err'] * 100:.1f}%, worst {ss['worst_abs_err'] * 100:.1f}% (target: median "
            "<= 10%, worst <= 25%).", ""]
    out += ["## Optimisation cost", "",
            "| model | device | rounds | device s | host s | total s | IOS published s | host time from |",
            "|---|---|---:|---:|---:|---:|---:|---|"]
    for m in rep["models"]:
        c = m["cost"]
        host = "—" if c["host_seconds"] is None else f"{c['host_seconds']:.1f}"
        total = "—" if c["total_seconds"] is None else f"{c['total_seconds']:.1f}"
        ios = "—" if c["ios_published_seconds"] is None else f"{c['ios_published_seconds']:.0f}"
        out.append(f"| {m['model']} | {m['device']} | {len(m['history'])} | {c['device_seconds']:.1f} | {host} | "
                   f"{total} | {ios} | {c['host_source']} |")
    out.append("")
    for m in rep["models"]:
        out += [f"## {m['model']}", "", f"Shipped: **{m['shipped']}** (lowest measured whole program, "
                f"{m['clock']} clock).", "",
                "| round | stages measured | programs measured | device s | best measured so far ms |",
                "|---:|---:|---:|---:|---:|"]
        for h in m["history"]:
            out.append(f"| {h['round']} | {h['stages_measured']} | {h['programs_measured']} | "
                       f"{h['device_seconds']:.1f} | {h['best_measured_ms']:.3f} |")
        out += ["", "Picks (profiling bundle: stages back to back, CUDA events; ms):", "",
                "| pick | stages | search predicted | stage sum (final table) | program model | measured | "
                "program model error | measured, dependency mode |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for c in m["candidates"]:
            dep = c.get("measured_dependency_ms")
            out.append(f"| {c['name']} | {c['stages']} | {c['search_predicted_ms']:.3f} | {c['stage_sum_ms']:.3f} | "
                       f"{c['program_model_ms']:.3f} | {c['measured_ms']:.3f} | "
                       f"{_err(c['program_model_ms'], c['measured_ms']) * 100:+.1f}% | "
                       f"{'—' if dep is None else f'{dep:.3f}'} |")
        if m["gpu_check"]:
            out += ["", "The shipped pick as a library (gpu_check, same run as the schedulers' own; median ms):", "",
                    "| mode | CUDA graph | active pick | ios (sim:h100) | fastest of sequential/greedy/lios/ios | "
                    "active / it |", "|---|---|---:|---:|---|---:|"]
            for g in m["gpu_check"]:
                ios = "—" if g["ios_ms"] is None else f"{g['ios_ms']:.3f}"
                out.append(f"| {g['mode']} | {'yes' if g['cuda_graph'] else 'no'} | {g['active_ms']:.3f} | {ios} | "
                           f"{g['best_other']} {g['best_other_ms']:.3f} | {g['ratio']:.3f} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="directory of per-model active-search folders")
    p.add_argument("--gpu-check", default=None, help="a gpu_check run (JSON) that built the shipped picks as 'active'")
    p.add_argument("--name", default=None, help="write docs/NAME.md and docs/NAME.json")
    args = p.parse_args(argv)
    rep = report(args.root, args.gpu_check)
    md = to_markdown(rep)
    if args.name:
        base = os.path.join(ROOT, "docs", args.name)
        with open(base + ".json", "w", encoding="utf-8") as f:
            json.dump(rep, f, indent=1)
        with open(base + ".md", "w", encoding="utf-8") as f:
            f.write(md + "\n")
        print(f"wrote {base}.md and {base}.json")
    else:
        print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
