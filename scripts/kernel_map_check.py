#!/usr/bin/env python3
"""The program model's isolated -> in-program kernel map checked kernel by kernel.

    python scripts/kernel_map_check.py RUN/gpu_check.json MODEL UNIT_TABLE [--clock issue|device] [--json OUT]

Why: the whole-program model (``passes.cost.program``) turns a unit table's isolated latency ``u`` into a kernel's
time inside a program, ``rho * (kernel_scale * (u - timing_floor / number) + kernel_offset) + program_offset``
with ``rho = program_scale`` (times ``program_deep_factor`` for a deep convolution, since version 6, which this
check motivated); version 5 fitted ``program_offset`` from whole-program latencies only (long kernels run longer
inside a program than timed alone, every kernel sheds a fixed part). A run's ``sequential + CUDA graph`` kernel
timeline (``gpu_check run --timeline``) measured each kernel's device time inside the program, one after another,
so the map can be checked on every kernel instead of on sums: this script pairs each TVM function's isolated
latency (the table's units of that function, averaged) with its in-program time per call, fits the affine map
``in-program = a * isolated + b`` (least squares of the relative error) and prints what the shipped map predicts for
the same kernels. The table and the timeline may come from two runs of the same device kind; only functions with
the same number of calls in both are paired.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # gpu_kernel_check (timeline helpers)
from gpu_kernel_check import REFERENCE, func_times, kernel_kind  # noqa: E402


def pair_kernels(timeline: dict, units: dict[str, float], func_of: dict[str, str],
                 kind_of: dict[str, str] | None = None, deep_of: dict[str, bool] | None = None) -> list[dict]:
    """``[{func, kind, deep, calls, isolated_us, in_program_us}]``: per TVM function, its units' mean isolated
    latency (seconds in ``units``) and its measured device time per call in ``timeline``; functions whose call count
    differs from their unit count (another build's graph) are left out. ``kind_of``: a kind per unit, ``deep_of``:
    whether the unit is a deep convolution (``passes.cost.program.is_deep``); a function's first unit names its."""
    us, calls = func_times(timeline)
    by_func: dict[str, list[float]] = {}
    kind_by_func: dict[str, str] = {}
    deep_by_func: dict[str, bool] = {}
    for unit, func in func_of.items():
        if unit in units:
            by_func.setdefault(func, []).append(units[unit])
            kind_by_func.setdefault(func, (kind_of or {}).get(unit, ""))
            deep_by_func.setdefault(func, bool((deep_of or {}).get(unit, False)))
    rows = []
    for func, lat in sorted(by_func.items()):
        n = calls.get(func)
        if func not in us or n is None or abs(n - len(lat)) > 0.01:
            continue
        rows.append({"func": func, "kind": kind_by_func[func], "deep": deep_by_func[func], "calls": len(lat),
                     "isolated_us": statistics.fmean(lat) * 1e6, "in_program_us": us[func] / n})
    return rows


def by_kind(rows: list[dict]) -> dict[str, dict]:
    """Per kernel kind: how many, their summed isolated and in-program time per call of the program, and the ratio
    of the sums (how much longer that kind runs inside the program than timed alone)."""
    out: dict[str, dict] = {}
    for r in rows:
        k = out.setdefault(r["kind"] or "?", {"kernels": 0, "isolated_us": 0.0, "in_program_us": 0.0})
        k["kernels"] += r["calls"]
        k["isolated_us"] += r["isolated_us"] * r["calls"]
        k["in_program_us"] += r["in_program_us"] * r["calls"]
    for k in out.values():
        k["ratio"] = k["in_program_us"] / k["isolated_us"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["in_program_us"]))


def fit_affine(rows: list[dict]) -> tuple[float, float]:
    """``(a, b_us)`` minimising the squared relative error of ``a * isolated + b`` against the in-program time."""
    import numpy as np

    if len(rows) < 2:
        raise SystemExit(f"only {len(rows)} kernel(s) paired: nothing to fit")
    y = np.array([r["in_program_us"] for r in rows])
    A = np.array([[r["isolated_us"], 1.0] for r in rows]) / y[:, None]
    (a, b), *_ = np.linalg.lstsq(A, np.ones(len(rows)), rcond=None)
    return float(a), float(b)


def shipped_map_us(isolated_us: float, params, number: int, deep: bool = False) -> float:
    """The in-program time of a kernel of isolated latency ``isolated_us`` by the shipped map (the simulator's
    kernel duration, alone; ``deep``: a deep convolution, which takes ``program_deep_factor`` on top)."""
    from tvm_interop.passes.cost.program import IssuedOp, IssuedProgram, KERNEL, simulate

    quiet = params.replace(call_overhead=0.0, tail=0.0, host_kernel=0.0, launch_latency=0.0, kernel_gap=0.0,
                           graph_node_gap=0.0, graph_launch=0.0)
    prog = IssuedProgram([IssuedOp(KERNEL, unit="k")], cuda_graph=True)
    return simulate(prog, {"k": (isolated_us * 1e-6, 1.0, "other", False, number, deep)}, quiet).latency * 1e6


def check(run: dict, model: str, table_path: str, clock: str = "issue", params=None) -> dict:
    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model
    from tvm_interop.passes.cost.program import is_deep, load_fitted
    from tvm_interop.passes.cost.table import TableCostModel

    entry = next((m for m in run.get("models", []) if m["name"] == model), None)
    timeline = ((entry or {}).get("timelines") or {}).get(REFERENCE)
    if not timeline or not timeline.get("by_kernel"):
        raise SystemExit(f"the run has no '{REFERENCE}' kernel timeline for {model} (gpu_check run --timeline)")
    table = TableCostModel(table_path, clock=clock)
    number = int(table.table.get("number") or 0) if clock == "issue" else 0
    program = prepare_program(get_model(model), {"kind": "cuda", "arch": "sm_90"}, name=model)
    if program.graph.fingerprint() != table.table.get("graph_fingerprint"):
        raise SystemExit(f"{table_path} is for graph {table.table.get('graph_fingerprint')}, today's {model} is "
                         f"{program.graph.fingerprint()}")
    func_of = {u.name: (u.func_name or u.name) for u in program.graph.units}
    units = program.graph.units
    rows = pair_kernels(timeline, table.units, func_of, {u.name: kernel_kind(u) for u in units},
                        {u.name: is_deep(u) for u in units})
    a, b = fit_affine(rows)
    params = params or load_fitted()
    for r in rows:
        r["shipped_us"] = shipped_map_us(r["isolated_us"], params, number, r["deep"])
        r["shipped_error"] = r["shipped_us"] / r["in_program_us"] - 1
        r["affine_error"] = (a * r["isolated_us"] + b) / r["in_program_us"] - 1
    errs = sorted(abs(r["shipped_error"]) for r in rows)
    total = sum(r["in_program_us"] * r["calls"] for r in rows)
    shipped_total = sum(r["shipped_us"] * r["calls"] for r in rows)
    return {"model": model, "table": os.path.relpath(table_path, ROOT), "clock": clock, "number": number,
            "kernels": len(rows), "affine": {"per_us": a, "offset_us": b},
            "shipped": {"median_abs_error": statistics.median(errs), "worst_abs_error": errs[-1],
                        "sum_in_program_us": total, "sum_shipped_us": shipped_total},
            "by_kind": by_kind(rows), "rows": rows}


def render(res: dict) -> str:
    lines = [f"{res['model']}: {res['kernels']} kernels paired ({res['clock']} clock, number {res['number']})",
             f"  fitted:  in-program = {res['affine']['per_us']:.3f} x isolated {res['affine']['offset_us']:+.2f} us",
             f"  shipped map: |error| median {res['shipped']['median_abs_error'] * 100:.1f} %, worst "
             f"{res['shipped']['worst_abs_error'] * 100:.1f} %; kernel time summed {res['shipped']['sum_shipped_us']:.0f}"
             f" us against {res['shipped']['sum_in_program_us']:.0f} us measured",
             "  per kind (time per call of the program, us): " + "; ".join(
                 f"{k} x{v['kernels']} {v['isolated_us']:.0f} -> {v['in_program_us']:.0f} ({v['ratio']:.2f}x)"
                 for k, v in res["by_kind"].items()),
             f"  {'function':44s} {'calls':>5s} {'isolated':>9s} {'in prog':>9s} {'ratio':>6s} {'shipped':>9s}"]
    for r in sorted(res["rows"], key=lambda r: r["isolated_us"]):
        lines.append(f"  {r['func'][:44]:44s} {r['calls']:5d} {r['isolated_us']:9.1f} {r['in_program_us']:9.1f} "
                     f"{r['in_program_us'] / r['isolated_us']:6.2f} {r['shipped_us']:9.1f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a gpu_check run with kernel timelines (gpu_check run --timeline)")
    ap.add_argument("model")
    ap.add_argument("table", help="a unit table of the same model and device kind (gpu_check build --unit-costs)")
    ap.add_argument("--clock", choices=("issue", "device"), default="issue")
    ap.add_argument("--params", default=None, metavar="FILE",
                    help="the fitted parameters (default: docs/gpu_cost_model.json)")
    ap.add_argument("--json", default=None, help="write the result as JSON")
    args = ap.parse_args(argv)
    with open(args.run, encoding="utf-8") as f:
        run = json.load(f)
    from tvm_interop.passes.cost.program import load_fitted

    res = check(run, args.model, args.table, args.clock, load_fitted(args.params))
    res["params"] = os.path.relpath(args.params) if args.params else "docs/gpu_cost_model.json"
    print(render(res))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
