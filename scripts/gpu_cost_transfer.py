#!/usr/bin/env python3
"""The fitted whole-program GPU model (``docs/gpu_cost_model.json``) predicting a later gpu_check run from that run's
own unit tables: how well the model transfers to kernels and tables it was not fitted on (each table's ``number``,
the calls per timing, goes with its latencies).

    python scripts/gpu_cost_transfer.py RUN/gpu_check.json RUN/unit_costs --out docs/gpu_cost_transfer.json

For every model of the run with a unit table (``gpu_check build --unit-costs``), every scheduled variant with TVM's
per-call events (sequential, greedy, lios, ios; stage and dependency; direct and CUDA graph) is rescheduled here
as the build scheduled it (``sim:h100``, at most 8 streams; a schedule with IOS merge stages is skipped: the run
built it merged), its issued program simulated with the run's isolated unit latencies, and compared with the
run's median. Prints median / worst |predicted / measured - 1| per model and writes every row.

``--clock device`` feeds the model each unit's *device-clock* latency instead (the table's single-unit stages timed
behind a held stream: the kernel's device time without the host's issue cost, ``runtime.device_clock``), as
latencies that are not timings (``timing_number=0``). The model was fitted on issue-clock tables; on the H200 run
of 2026-11-27 the device clock transferred better (median 9.2 % against 11.8 %), chiefly on RandWire, whose tiny
kernels' issue-clock timings are the host's launch rate.

``--sim PRESET`` feeds it a simulated device's unit latencies instead of any table (``sim:h200-tvm``, fitted to
TVM's default kernels by ``scripts/fit_sim_preset.py``): every model of the run is predicted without a measured
table (the ``+cudnn`` entries are left out: their library calls are not TVM kernels). ``unit_dir`` is then unused.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

TARGET = {"kind": "cuda", "arch": "sm_90"}
SCHEDULERS = ("sequential", "greedy", "lios", "ios")


def unit_latencies(path: str, clock: str = "issue") -> tuple[dict[str, float], int]:
    """``(latency per unit, timing number)`` of the unit table at ``path`` on ``clock``, read by the product's own
    ``TableCostModel`` (its damage checks, and its refusal of a device clock the table was not measured with,
    naming the table). A unit without a time on that clock is refused, naming the table's model."""
    from tvm_interop.passes.cost.table import TableCostModel
    from tvm_interop.runtime.errors import InteropError

    try:
        table = TableCostModel(path, clock=clock)
    except InteropError as err:
        raise SystemExit(str(err)) from None
    units = table.table["units"]
    missing = [u for u in units if u not in table.units]
    if missing:
        raise SystemExit(f"the {table.table.get('model')} table has no {clock}-clock time for {len(missing)} of its "
                         f"{len(units)} units (e.g. {missing[0]})")
    if table.clock_fallbacks:   # the product prices them at their issue time; say so, as it does
        print(table.composed_report(), file=sys.stderr)
    return table.units, int(table.table["number"]) if clock == "issue" else 0


def transfer_rows(run: dict, unit_dir: str | None, models: list[str] | None = None, clock: str = "issue",
                  sim: str | None = None, params_path: str | None = None) -> list[dict]:
    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.cost.program import ProgramCostModel, load_fitted
    from tvm_interop.passes.merge import has_merges
    from tvm_interop.passes.schedulers import schedule_graph

    params = load_fitted(params_path)
    # the placement of the variants without a suffix: a build of both ("stage-start,consumer") names the consumer
    # twins "[waits at consumer]"; builds before the waits option had only the consumer placement
    waits = (run.get("build", {}).get("waits") or "consumer").split(",")[0]
    rows = []
    for m in run["models"]:
        name = m["name"]
        table = None if sim else os.path.join(unit_dir, f"{name}.json")
        if (models and name not in models) or (table and not os.path.exists(table)) or (sim and "+" in name):
            continue
        program = prepare_program(get_model(name), TARGET, name=name)
        if sim:   # simulated latencies are not timings: no per-timing floor
            model = ProgramCostModel(get_cost_model(sim), params, timing_number=0)
        else:     # the table's protocol (calls per timing) goes with its latencies: the model corrects for it
            units, number = unit_latencies(table, clock)
            model = ProgramCostModel(units, params, timing_number=number)
        recorded = {v["name"]: v for v in m["variants"]}
        for sname in SCHEDULERS:
            sched = schedule_graph(program.graph, sname, "sim:h100", model_name=name,
                                   **({"max_streams": 8} if sname == "greedy" else {}))
            if has_merges(sched):
                continue
            for mode in ("stage", "dependency"):
                for graph in (False, True):
                    label = sname + (" (dependency)" if mode == "dependency" else "") + (" + CUDA graph" if graph else "")
                    rec = recorded.get(label)
                    if not rec or not rec.get("median_ms") or rec.get("stages") != sched.num_stages:
                        continue
                    pred = model.predict(program, sched, mode, graph, waits=waits) * 1e3
                    rows.append({"model": name, "variant": label, "measured_ms": rec["median_ms"],
                                 "predicted_ms": pred, "error": pred / rec["median_ms"] - 1})
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for key in sorted({r["model"] for r in rows}) + ["all"]:
        errs = [abs(r["error"]) for r in rows if key in ("all", r["model"])]
        signed = [r["error"] for r in rows if key in ("all", r["model"])]
        out[key] = {"variants": len(errs), "median": statistics.median(errs), "worst": max(errs),
                    "signed_median": statistics.median(signed), "within_10": sum(e <= 0.10 for e in errs),
                    "within_25": sum(e <= 0.25 for e in errs)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a gpu_check run's gpu_check.json")
    ap.add_argument("unit_dir", nargs="?", default=None, help="that run's unit_costs directory (not with --sim)")
    ap.add_argument("--models", default=None)
    ap.add_argument("--clock", choices=("issue", "device"), default="issue",
                    help="the unit latencies the model is fed: issue (the tables' 'units', the fit's) or device")
    ap.add_argument("--sim", default=None, metavar="PRESET",
                    help="feed a simulated device's unit latencies instead of tables (e.g. sim:h200-tvm)")
    ap.add_argument("--params", default=None, metavar="FILE",
                    help="the fitted parameters (default: docs/gpu_cost_model.json; e.g. an older version's, to "
                         "compare two fits on the same run)")
    ap.add_argument("--out", default=None, help="write rows and summary as JSON")
    args = ap.parse_args(argv)
    if bool(args.sim) == bool(args.unit_dir):
        ap.error("give the run's unit_costs directory, or --sim PRESET (not both)")
    if args.sim and args.clock != "issue":
        ap.error("--clock chooses between a table's two times; --sim has one")
    with open(args.run, encoding="utf-8") as f:
        run = json.load(f)
    rows = transfer_rows(run, args.unit_dir, args.models.split(",") if args.models else None, args.clock, args.sim,
                         args.params)
    if not rows:
        print("no variant to predict (no unit tables beside the run?)", file=sys.stderr)
        return 1
    s = summary(rows)
    for k, v in s.items():
        print(f"{k:16s} {v['variants']:3d} variants: median {v['median'] * 100:5.1f} %, worst {v['worst'] * 100:5.1f} %,"
              f" signed median {v['signed_median'] * 100:+5.1f} %, within 10 %: {v['within_10']}, 25 %: {v['within_25']}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"run": os.path.basename(args.run), "device": run.get("device"),
                       **({"units": args.sim} if args.sim else {"clock": args.clock}),
                       "params": os.path.relpath(args.params) if args.params else "docs/gpu_cost_model.json",
                       "summary": s, "rows": rows},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
