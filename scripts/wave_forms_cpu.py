"""Which form of a wave-fused CPU stage is fastest, stage by stage and in the whole program.

A fused CPU stage can run as whole chains (one thread each), as whole chains with its one-kernel members cut over
the threads, or as waves (``passes.wave.cpu``). For each model: schedule with lios on measured costs, then

1. per fusable stage, time every form it offers (``cpu_forms``) and its groups in order, in interleaved rounds
   (``StageTimer.time_stages``): which form is fastest alone, and by how much against the default form;
2. build four programs from the same schedule, every stage fused: the default forms, every stage in the form
   that was fastest alone, the default forms with whole chains compiled inline instead of outlined (what was
   built before 2026-11-30), and sequential (same kernels); check each against plain TVM; time them in
   interleaved rounds and report medians and ratios over sequential.

Step 2 is the one that decides: a form that wins alone has to win in the program. Writes a JSON and prints a
table (``--out``).

    .venv/bin/python scripts/wave_forms_cpu.py --models inception_v3 randwire --rounds 40 --repeat 150 \\
        --cache /tmp/wave_forms.json --out /tmp/wave_forms
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import tvm_interop  # noqa: E402
from bench_cpu import CONFIGS, RTOL, ATOL  # noqa: E402
from tvm_interop.passes.build import build_library  # noqa: E402
from tvm_interop.passes.cost.measured import MeasuredCostModel  # noqa: E402
from tvm_interop.passes.lower import make_plan  # noqa: E402
from tvm_interop.passes.schedulers import schedule_graph  # noqa: E402
from tvm_interop.passes.wave import apply_wave_fusion, fusable_stages  # noqa: E402
from tvm_interop.passes.wave import cpu as wave_cpu  # noqa: E402
from tvm_interop.passes.wave.kernel import build_wave_kernel, wave_forms  # noqa: E402
from tvm_interop.runtime.model import ScheduledModel  # noqa: E402


def stage_forms(cost: MeasuredCostModel, sched, rounds: int) -> list[dict]:
    """Every fusable stage's forms and its groups in order, timed together (seconds, medians of ``rounds``)."""
    src, graph = cost._wave_source(), cost.program.graph
    timer = cost._timer_ready()
    out = []
    for si in fusable_stages(sched):
        names = [list(g) for g in sched.stages[si].groups]
        groups = [[graph.unit(u) for u in g] for g in names]
        lowered: dict = {}   # the members lowered once for both questions
        forms = wave_forms(src, names, cost.target, lowered=lowered)
        default = build_wave_kernel(src, names, cost.target, lowered=lowered).mode
        plain = [cost._call(u) for g in groups for u in g]
        values = timer.time_stages([[[cost._wave_call(groups, f)]] for f in forms] + [[plain]], repeat=rounds)
        times = dict(zip(forms, values[:-1]))
        best = min(times, key=times.get)
        out.append({"stage": si, "groups": [len(g) for g in names], "default": default, "best": best,
                    "forms_s": times, "in_order_s": values[-1]})
        print(f"  stage {si:3d} {str([len(g) for g in names]):24s} " + "  ".join(
            f"{f} {t * 1e6:7.1f}{'*' if f == best else ' '}" for f, t in times.items())
            + f"  in order {values[-1] * 1e6:7.1f} us (default {default})", flush=True)
    return out


def programs(prog, sched, best_forms: dict[int, str], target) -> dict:
    """The schedule fused in the default forms, in the forms fastest alone, and in the default forms with whole
    chains compiled inline (not outlined: ``passes.wave.cpu.OUTLINE_CHAINS``), and sequential, each built."""
    built = {}
    for name, forms, outline in (("default forms", None, True), ("fastest alone", best_forms, True),
                                 ("default, inline chains", None, False)):
        saved, wave_cpu.OUTLINE_CHAINS = wave_cpu.OUTLINE_CHAINS, outline
        try:
            p, s, _ = apply_wave_fusion(prog, sched, target, forms=forms)
            built[name] = ScheduledModel(build_library(p, s, make_plan(p, s), target), executor="vm")
        finally:
            wave_cpu.OUTLINE_CHAINS = saved
    seq = schedule_graph(prog.graph, "sequential", "sim:cpu")
    built["sequential"] = ScheduledModel(build_library(prog, seq, make_plan(prog, seq), target), executor="vm")
    return built


def run_model(name: str, rounds: int, repeat: int, cache: str) -> dict:
    mod, _ = tvm_interop.load_module(name, **CONFIGS[name])
    prog = tvm_interop.api.prepare_program(mod, name=name)
    cost = MeasuredCostModel(prog, cache=cache)
    t = time.perf_counter()
    sched = schedule_graph(prog.graph, "lios", cost, model_name=name)
    print(f"[{name}] lios: {sched.num_stages} stages, {len(fusable_stages(sched))} fusable "
          f"({time.perf_counter() - t:.0f} s)", flush=True)
    stages = stage_forms(cost, sched, rounds)
    summed = {k: sum(st["forms_s"][st[k]] for st in stages) for k in ("default", "best")}
    built = programs(prog, sched, {st["stage"]: st["best"] for st in stages}, cost.target)
    cost.close()
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape.values)
    x = [np.random.default_rng(0).standard_normal(shape).astype("float32")]
    ref = tvm_interop.run_reference(mod, x)
    diffs = {}
    for k, m in built.items():
        out = m.run(*x)
        diffs[k] = float(np.max(np.abs(out - ref)))
        if not np.allclose(out, ref, rtol=RTOL, atol=ATOL):
            raise SystemExit(f"{name} {k}: output differs from plain TVM (max abs diff {diffs[k]:.3g})")
        for _ in range(5):
            m.run(*x)
    times = {k: [] for k in built}
    for _ in range(repeat):
        for k, m in built.items():
            t0 = time.perf_counter()
            m.run(*x)
            times[k].append(time.perf_counter() - t0)
    for m in built.values():
        m.close()
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {"model": name, "config": CONFIGS[name], "stages": stages,
            "stages_summed_us": {k: v * 1e6 for k, v in summed.items()},
            "median_ms": {k: v * 1e3 for k, v in med.items()},
            "speedup": {k: med["sequential"] / v for k, v in med.items()}, "max_abs_diff": diffs}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["inception_v3", "randwire"], choices=sorted(CONFIGS))
    ap.add_argument("--rounds", type=int, default=40, help="interleaved rounds per stage timing")
    ap.add_argument("--repeat", type=int, default=150, help="interleaved rounds of the whole programs")
    ap.add_argument("--cache", default=None, help="measured-cost cache (the lios search's stage timings)")
    ap.add_argument("--out", default="wave_forms_cpu", help="output path without extension (.json is written)")
    args = ap.parse_args(argv)
    results = [run_model(m, args.rounds, args.repeat, args.cache) for m in args.models]
    for r in results:
        s = r["stages_summed_us"]
        print(f"\n{r['model']}: fused stages summed alone: default forms {s['default']:.0f} us, fastest forms "
              f"{s['best']:.0f} us ({s['best'] / s['default'] - 1:+.1%})")
        for k, v in r["median_ms"].items():
            print(f"  {k:14s} {v:7.3f} ms  {r['speedup'][k]:.3f}x over sequential  "
                  f"(max abs diff {r['max_abs_diff'][k]:.1e})")
    with open(args.out + ".json", "w") as f:
        json.dump({"command": "python scripts/wave_forms_cpu.py " + " ".join(sys.argv[1:] if argv is None else argv),
                   "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
