#!/usr/bin/env python
"""What issuing dependency mode's waits at the stage's start should do on an H100, before a GPU measures it.

Why: the 2026-11-26 H100 run (``docs/gpu_check.json``) measured every scheduler slower in dependency mode than in
stage mode on the branchy models (Inception-v3 ios 6.38 ms against 4.40), which made "ios <= the others in both
modes" (issue 12) fail on the dependency side. The cause is in the lowering (``passes.lower_streams``: an event is
recorded when its wait is issued, so a wait issued right before its group also waited for the stage's groups
queued behind the producer). This script re-issues every schedule of that run both ways and prices both with the
fitted whole-program model (``passes.cost.program``, the run's own unit tables, held-out median error 8 %), next
to what the run measured, so the next GPU run (``gpu_check build`` builds both placements) can confirm or refute it.

    .venv/bin/python scripts/predict_waits.py            # -> docs/dependency_waits.{md,json}
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

RUN = os.path.join(ROOT, "docs", "gpu_check.json")
UNITS = os.path.join(ROOT, "docs", "unit_costs_h100_2026-11-26")
SCHEDULERS = ("sequential", "greedy", "lios", "ios")
TARGET = {"kind": "cuda", "arch": "sm_90"}


def _label(sname: str, mode: str, graph: bool) -> str:
    return sname + (" (dependency)" if mode == "dependency" else "") + (" + CUDA graph" if graph else "")


def predict(run: dict, models: list[str] | None) -> list[dict]:
    """One row per (model, scheduler, CUDA graph): measured and predicted stage mode, dependency mode with the
    run's (consumer) waits, and predicted dependency mode with waits at the stage's start."""
    import tvm_interop
    from tvm_interop.models import get_model
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.cost.program import ProgramCostModel, load_fitted
    from tvm_interop.passes.merge import has_merges
    from tvm_interop.passes.schedulers import schedule_graph

    params = load_fitted()
    built_waits = run.get("build", {}).get("waits") or "consumer"
    rows = []
    for m in run["models"]:
        name = m["name"]
        table = os.path.join(UNITS, f"{name}.json")
        if (models and name not in models) or not os.path.exists(table):
            continue
        program = tvm_interop.api.prepare_program(get_model(name), TARGET, name=name)
        model = ProgramCostModel(get_cost_model("table:" + table), params)
        measured = {v["name"]: v.get("median_ms") for v in m["variants"]}
        for sname in SCHEDULERS:
            sched = schedule_graph(program.graph, sname, "sim:h100", model_name=name,
                                   **({"max_streams": 8} if sname == "greedy" else {}))
            if has_merges(sched):   # a merged kernel has no unit-table entry (fit_gpu_cost.py skips these too)
                continue
            for graph in (False, True):
                row = {"model": name, "scheduler": sname, "cuda_graph": graph,
                       "measured_stage_ms": measured.get(_label(sname, "stage", graph)),
                       "measured_dependency_ms": measured.get(_label(sname, "dependency", graph)),
                       "measured_waits": built_waits}
                row["predicted_stage_ms"] = model.predict(program, sched, "stage", graph) * 1e3
                row["predicted_consumer_ms"] = model.predict(program, sched, "dependency", graph,
                                                             waits="consumer") * 1e3
                row["predicted_stage_start_ms"] = model.predict(program, sched, "dependency", graph,
                                                                waits="stage-start") * 1e3
                rows.append(row)
    return rows


def _ios_vs_others(rows: list[dict], key: str) -> list[dict]:
    """Per model and setting: ios against the best of sequential, greedy and lios under ``key``."""
    out = []
    for name in dict.fromkeys(r["model"] for r in rows):
        for graph in (False, True):
            mine = {r["scheduler"]: r for r in rows if r["model"] == name and r["cuda_graph"] == graph}
            if "ios" not in mine:
                continue
            others = {s: r[key] for s, r in mine.items() if s != "ios" and r.get(key)}
            best = min(others, key=others.get)
            out.append({"model": name, "cuda_graph": graph, "ios_ms": mine["ios"][key], "best_other": best,
                        "best_other_ms": others[best], "ratio": mine["ios"][key] / others[best]})
    return out


def _model_error() -> str:
    """The fitted model's held-out error on the 2026-11-26 run, as its fit recorded it."""
    from tvm_interop.passes.cost.program import fitted_params_path

    with open(fitted_params_path(), encoding="utf-8") as f:
        ho = json.load(f)["summary"]["ALL (2026-11-26)"]["heldout"]
    return f"held-out median {ho['median_abs'] * 100:.1f} %, worst {ho['max_abs'] * 100:.1f} % on that run"


def render(rows: list[dict], command: str, seconds: float) -> str:
    f = (lambda x: "—" if x is None else f"{x:.3f}")
    lines = ["# Dependency mode: waits at the stage's start (predicted, not yet measured)", "",
             "Generated by `scripts/predict_waits.py` (" + f"{seconds:.0f} s" + "): every schedule of the 2026-11-26 "
             "H100 run (`docs/gpu_check.json`, built with each wait issued right before its group) lowered again both "
             "ways and priced by the fitted whole-program model (`docs/gpu_cost_model.md`: " + _model_error() + ") "
             "from the run's own unit tables (`docs/unit_costs_h100_2026-11-26`). "
             "The *measured* columns are that run; every *predicted* column is the model. **Nothing here ran on a GPU "
             "with the new placement**: `scripts/gpu_check.sh build` now builds each dependency-mode variant both "
             "ways (`[waits at consumer]` in the old one's name) so the next GPU run measures it.", "",
             "```", command, "```", "",
             "| model | scheduler | CUDA graph | stage measured | stage predicted | dependency measured (waits at "
             "consumer) | predicted, waits at consumer | predicted, waits at stage start | predicted speed-up |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['scheduler']} | {'yes' if r['cuda_graph'] else 'no'} | "
                     f"{f(r['measured_stage_ms'])} | {f(r['predicted_stage_ms'])} | {f(r['measured_dependency_ms'])} | "
                     f"{f(r['predicted_consumer_ms'])} | {f(r['predicted_stage_start_ms'])} | "
                     f"{r['predicted_consumer_ms'] / r['predicted_stage_start_ms']:.2f}x |")
    multi = [r for r in rows if r["scheduler"] != "sequential"]
    sp = [r["predicted_consumer_ms"] / r["predicted_stage_start_ms"] for r in multi]
    worse = [r for r in multi if r["predicted_stage_start_ms"] > 1.01 * r["predicted_stage_ms"]]
    lines += ["", f"Scheduled variants (not sequential): predicted speed-up of the new placement median "
              f"{statistics.median(sp):.2f}x, range {min(sp):.2f}-{max(sp):.2f}x over {len(sp)} variants; "
              f"dependency mode predicted more than 1 % slower than stage mode in {len(worse)} of them.", "",
              "ios against the best of sequential, greedy and lios in dependency mode (ratio < 1: ios faster):", "",
              "| model | CUDA graph | measured (waits at consumer) | predicted (waits at stage start) |",
              "|---|---|---|---|"]
    meas = {(x["model"], x["cuda_graph"]): x for x in _ios_vs_others(rows, "measured_dependency_ms")}
    for x in _ios_vs_others(rows, "predicted_stage_start_ms"):
        m = meas.get((x["model"], x["cuda_graph"]))
        mt = f"{m['ratio']:.3f} (vs {m['best_other']})" if m else "—"
        lines.append(f"| {x['model']} | {'yes' if x['cuda_graph'] else 'no'} | {mt} | "
                     f"{x['ratio']:.3f} (vs {x['best_other']}) |")
    lines += ["", "The model cannot rank schedules that differ by less than its error (about 8 %), so the second "
              "column says which comparisons the placement changes, not who wins on the device."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=RUN, help="a gpu_check result JSON (default: docs/gpu_check.json)")
    ap.add_argument("--models", default="", help="comma-separated (default: every model with a unit table)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "dependency_waits"), help="writes OUT.md, OUT.json")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    with open(args.run, encoding="utf-8") as fh:
        run = json.load(fh)
    rows = predict(run, [m for m in args.models.split(",") if m] or None)
    if not rows:
        raise SystemExit(f"{args.run}: no model with a unit table in {UNITS}")
    seconds = time.perf_counter() - t0
    command = ".venv/bin/python scripts/predict_waits.py" + (f" --models {args.models}" if args.models else "")
    md = render(rows, command, seconds)
    print(md)
    from tvm_interop.runtime import atomic

    atomic.write_text(args.out + ".md", md)
    atomic.write_json(args.out + ".json", {"format": "tvm-interop-wait-placement-prediction", "version": 1,
                                           "command": command, "run": os.path.relpath(args.run, ROOT), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
