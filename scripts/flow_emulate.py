"""Flow launches emulated on the CPU, member by member against TVM, at any model size: a table and a JSON.

Why: ``scripts/gpu_check.sh build --schedulers ...,greedy+flow`` sends full-size flow launches to a GPU that this
project sees for minutes at a time. This runs the same launches first, here: the model as gpu_check builds it
(zoo config, batch 1, ``sim:h100``, 8 streams for greedy), flow-fused with the variant's options, built by the
product's build (nvcc included), and the device IR that build compiled interpreted by ``passes/simt/`` (lock-step
threads, shared memory, barriers, warp shuffles, atomics; races, divergent barriers, out-of-bounds accesses and
tasks that would wait for later ones are errors). Each member's output is compared with its unit run alone
(the unit's PrimFunc built for the CPU). It says nothing about speed.

    python scripts/flow_emulate.py --models randwire,nasnet_a_mobile --variants flow,flow_coarse,flow_noinline \\
        --json docs/emulation.json
    python scripts/flow_emulate.py --models squeezenet --small      # the zoo's small config: seconds
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = {"flow": {}, "flow_coarse": {"coarsen": True}, "flow_noinline": {"inline": False}}


def emulate(model: str, scheduler: str, variant: str, small: bool, max_streams: int, seed: int) -> dict:
    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model, small_config
    from tvm_interop.passes import simt
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.passes.target import normalize_target
    from tvm_interop.passes.wave.emulation import FlowEmulation

    target = normalize_target("cuda -arch=sm_90")
    cfg = small_config(model) if small else {}
    program = prepare_program(get_model(model, **cfg), target, name=model)
    opts = {"max_streams": max_streams} if scheduler == "greedy" else {}
    sched = schedule_graph(program.graph, scheduler, "sim:h100", model_name=model, **opts)
    t0 = time.perf_counter()
    emu = FlowEmulation(program, sched, target, seed=seed, **VARIANTS[variant])
    prepared = time.perf_counter() - t0
    entry = {"model": model, "scheduler": scheduler, "variant": variant, "size": "small" if small else "full",
             "units": len(program.calls), "build_seconds": round(emu.build_seconds, 1),
             "prepared_seconds": round(prepared, 1), "runs": []}
    for run, name, sig in emu.runs():
        try:
            res = emu.check(run, name, sig).as_json()
        except simt.EmulationError as e:   # a race, a divergent barrier, a wait, out of bounds: the finding
            res = {"launch": name, "members": len(run.units), "ok": False, "error": str(e)}
        entry["runs"].append(res)
        print(f"  {model} {variant} {name}: {len(run.units)} members, "
              + (f"{res['tasks']} tasks, {res['seconds']} s, max |error| {res['max_abs_error']:.2e}, "
                 f"{'ok' if res['ok'] else 'WRONG ' + json.dumps(res['wrong'])}" if "error" not in res
                 else f"ERROR {res['error']}"), flush=True)
    entry["ok"] = all(r["ok"] for r in entry["runs"])
    return entry


def table(entries: list[dict]) -> str:
    rows = ["| model | size | variant | launches | members | tasks | emulated (s) | max abs error | result |",
            "|---|---|---|---:|---:|---:|---:|---:|---|"]
    for e in entries:
        runs = e["runs"]
        err = max((r.get("max_abs_error", float("nan")) for r in runs), default=float("nan"))
        rows.append(f"| {e['model']} | {e['size']} | {e['scheduler']}+{e['variant']} | {len(runs)} "
                    f"| {sum(r['members'] for r in runs)} | {sum(r.get('tasks', 0) for r in runs)} "
                    f"| {sum(r.get('seconds', 0) for r in runs):.0f} | {err:.1e} "
                    f"| {'every member equals its unit, no race' if e['ok'] else 'FAILED'} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="randwire,nasnet_a_mobile")
    ap.add_argument("--scheduler", default="greedy")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--small", action="store_true", help="the zoo's small configs instead of full size")
    ap.add_argument("--max-streams", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    entries = []
    for model in a.models.split(","):
        for variant in a.variants.split(","):
            if variant not in VARIANTS:
                ap.error(f"unknown variant {variant}; one of {', '.join(VARIANTS)}")
            t0 = time.perf_counter()
            entries.append(emulate(model, a.scheduler, variant, a.small, a.max_streams, a.seed))
            entries[-1]["seconds"] = round(time.perf_counter() - t0, 1)
            print(f"{model} {variant}: {'ok' if entries[-1]['ok'] else 'FAILED'} in {entries[-1]['seconds']} s",
                  flush=True)
            if a.json:   # written after every entry: a long run leaves what it finished
                with open(a.json, "w") as f:
                    json.dump({"command": " ".join(["python", "scripts/flow_emulate.py"] + (argv or sys.argv[1:])),
                               "entries": entries}, f, indent=1)
    print(table(entries))
    return 0 if all(e["ok"] for e in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
