"""A cost table whose stages carry what they cost inside the programs a GPU run timed (``passes.cost.in_context``).

    .venv/bin/python scripts/in_context_table.py RESULT.json UNIT_TABLE.json --model inception_v3 -o costs.json
    tvm-interop schedule inception_v3 --cost table:costs.json -o sched.json     (the table names its target)

``RESULT.json``: a ``gpu_check run`` result whose model entry has timed twins (``in_context`` of its direct
stage-mode variants; ``gpu_check build`` makes them unless ``--no-stage-times``). ``UNIT_TABLE.json``: the cost table
of the same build (``unit_costs/MODEL.json`` of that run, or any table measured for the model). Prints, per timed
program, its measured latency, the sum of its stages in context and the sum of the same stages from the table as it
was (isolated): how far apart composing isolated costs and the program are.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tvm_interop.passes.cost.in_context import merge_in_context  # noqa: E402
from tvm_interop.runtime import atomic  # noqa: E402
from tvm_interop.runtime.profile_bundle import stage_key  # noqa: E402


def timed_programs(result: dict, model: str) -> list[dict]:
    """The in-context records of ``model``'s variants in a gpu_check result (failed or wrong ones left out)."""
    entries = [m for m in result.get("models", []) if m.get("name") == model]
    if not entries:
        raise SystemExit(f"{model}: not in the result (models: {', '.join(m.get('name', '?') for m in result.get('models', []))})")
    out = []
    for v in entries[0].get("variants", []):
        ic = v.get("in_context")
        if ic and "error" not in ic and ic.get("ok", True):
            out.append({**ic, "name": v["name"], "measured_ms": v.get("median_ms")})
    return out


def isolated_sum_ms(table: dict, stages: list) -> float | None:
    """The schedule's cost from the table's own stages (None when one is missing)."""
    by_key = {s["key"]: s.get("isolated_latency", s["latency"]) for s in table.get("stages", [])}
    total = 0.0
    for groups in stages:
        lat = by_key.get(stage_key(groups, "concurrent"))
        if lat is None:
            return None
        total += lat
    return total * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result")
    ap.add_argument("table")
    ap.add_argument("--model", required=True)
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    with open(args.result, encoding="utf-8") as f:
        result = json.load(f)
    with open(args.table, encoding="utf-8") as f:
        table = json.load(f)
    timed = timed_programs(result, args.model)
    if not timed:
        raise SystemExit(f"{args.model}: no variant of {args.result} has in-context stage times")
    merged = merge_in_context(table, timed, source=os.path.basename(args.result))
    atomic.write_text(args.out, json.dumps(merged, indent=1))
    print(f"{'program':28s} {'measured':>9s} {'in context':>11s} {'isolated':>9s}   (ms)")
    for t in timed:
        iso = isolated_sum_ms(table, t["stages"])
        print(f"{t['name']:28s} {t['measured_ms'] or float('nan'):9.3f} {t['sum_ms']:11.3f} "
              f"{'—' if iso is None else f'{iso:9.3f}':>9s}")
    ic = merged["in_context"]
    print(f"{args.out}: {ic['stages']} stages with in-context costs from {ic['programs']} programs; the other "
          f"stages and the units scaled by {ic['unseen_scale']:.3f} (median in-context / isolated of those seen)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
