#!/usr/bin/env python
"""Does a substitution rule pay, by itself, on the zoo? Apply every site of one rule and price the result.

Why: ``autograph`` (``passes/autograph``) searches substitution sequences per subgraph and ships the rewritten
graph only when its scheduler predicts it faster. When it ships the model unchanged, the question is whether
the search missed a good rewrite or no rewrite pays under that cost model. This script answers the second part
directly: for each model and rule it applies the rule at every site it can (largest match first, each one
numerically proved, repeatedly until no site is left), prepares the rewritten model with TVM, and reports

* kernels after TVM's fusion,
* ``sequential`` and ``ios`` predicted latency under a simulated device (default ``sim:h100``),
* the same two schedules priced as whole programs by the H100-fitted program model
  (``passes/cost/program.py``, parameters ``docs/gpu_cost_model.json``; unit latencies from the simulated
  device), which charges host work per kernel and per event the way the measured H100 runs did.

Writes ``docs/autograph_ablation.{json,md}``::

    .venv/bin/python scripts/autograph_ablation.py                       # inception_v3, nasnet_a_mobile, ...
    .venv/bin/python scripts/autograph_ablation.py --models squeezenet --rules merge_concat_convs
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

MODELS = ["inception_v3", "nasnet_a_mobile", "nasnet_a_large", "googlenet", "squeezenet"]


def apply_everywhere(mod, rule: str):
    """``mod`` with ``rule`` applied at every site, largest match first, until none applies; (module, count).
    Only sites made of the model's own operators count, so a split is not split again. Each pass applies every
    match found at its start (a match an earlier one overlapped fails its legality check and is skipped)."""
    from tvm_interop.passes.substitutions import SubstitutionError, apply_match, dataflow_nodes, find_matches

    original = {n.name for n in dataflow_nodes(mod)}
    count = 0
    failed: set = set()
    while True:
        matches = [m for m in find_matches(mod, rules=[rule])
                   if (m.rule, m.nodes, m.params) not in failed and set(m.nodes) <= original]
        applied = 0
        for m in sorted(matches, key=lambda m: -len(m.nodes)):
            try:
                mod = apply_match(mod, m, check=True)
                applied += 1
            except SubstitutionError:
                failed.add((m.rule, m.nodes, m.params))
        count += applied
        if not applied:
            return mod, count


def price(mod, name: str, cost: str) -> dict:
    """Kernels, and sequential / ios latency: predicted by ``cost`` and as whole programs (program model)."""
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.cost.program import ProgramCostModel
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.api import prepare_program

    program = prepare_program(mod, "llvm", name=name, cpu_schedule=False)
    device = get_cost_model(cost)
    whole = ProgramCostModel(device)
    out = {"kernels": len(program.graph)}
    for sched, opts in (("sequential", {}), ("ios", {"r": 3, "s": 8})):
        s = schedule_graph(program.graph, sched, device, model_name=name, **opts)
        out[sched] = {"predicted_ms": s.predicted_latency * 1e3,
                      "program_ms": whole.predict(program, s) * 1e3,
                      "program_graph_ms": whole.predict(program, s, cuda_graph=True) * 1e3}
    return out


def run(args) -> dict:
    from tvm_interop.passes.substitutions import RULES, ensure_unique_names
    from tvm_interop.api import load_module

    rules = args.rules or sorted(RULES)
    rows = []
    for name in args.models:
        mod, _ = load_module(name, batch_size=args.batch)
        mod = ensure_unique_names(mod)
        t = time.perf_counter()
        base = price(mod, name, args.cost)
        rows.append({"model": name, "rule": "(none)", "applied": 0, **base,
                     "seconds": round(time.perf_counter() - t, 1)})
        print(_line(rows[-1], base), flush=True)
        for rule in rules:
            t = time.perf_counter()
            new, n = apply_everywhere(mod, rule)
            row = {"model": name, "rule": rule, "applied": n}
            if n:
                row.update(price(new, name, args.cost))
            row["seconds"] = round(time.perf_counter() - t, 1)
            rows.append(row)
            print(_line(row, base), flush=True)
    return {"cost": args.cost, "batch": args.batch, "rows": rows,
            "command": "python " + " ".join([os.path.relpath(__file__, ROOT)] + sys.argv[1:])}


def _ratio(row: dict, base: dict, sched: str, key: str) -> str:
    if sched not in row:
        return "-"
    return f"{row[sched][key]:.3f} ({row[sched][key] / base[sched][key]:.3f})"


def _line(row: dict, base: dict) -> str:
    cells = [row["model"], row["rule"], str(row["applied"]), str(row.get("kernels", "-"))]
    for sched in ("sequential", "ios"):
        for key in ("predicted_ms", "program_ms", "program_graph_ms"):
            cells.append(_ratio(row, base, sched, key))
    cells.append(f"{row['seconds']:.1f}")
    return "| " + " | ".join(cells) + " |"


def markdown(result: dict) -> str:
    lines = ["# Substitution rules one at a time (autograph ablation)", "",
             f"Command: `{result['command']}`. Batch {result['batch']}; `pred` = predicted by {result['cost']}; "
             "`prog` / `prog+graph` = the same schedule priced as a whole program by the H100-fitted program "
             "model (direct launches / CUDA graph; `docs/gpu_cost_model.md`). Every cell: ms (ratio to the "
             "model as given, below 1 = the rewrite pays). Each rule is applied at every site it can, largest "
             "match first, each application numerically proved.", "",
             "| model | rule | applied | kernels | seq pred | seq prog | seq prog+graph | ios pred | ios prog | "
             "ios prog+graph | s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    base = None
    for row in result["rows"]:
        if row["rule"] == "(none)":
            base = row
        lines.append(_line(row, base))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--rules", nargs="+", default=None, help="default: every rule of passes.substitutions.RULES")
    p.add_argument("--cost", default="sim:h100")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--out", default=os.path.join(ROOT, "docs"), help="folder for autograph_ablation.{json,md}")
    args = p.parse_args(argv)
    result = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "autograph_ablation.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "autograph_ablation.md"), "w") as f:
        f.write(markdown(result))
    print(f"wrote {args.out}/autograph_ablation.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
