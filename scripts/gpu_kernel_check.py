#!/usr/bin/env python3
"""The whole-program GPU model checked kernel by kernel against a gpu_check run's kernel timelines.

    python scripts/gpu_kernel_check.py RUN/gpu_check.json [--schedule MODEL:LABEL=FILE ...] [--launches] \\
        [--out docs/NAME]      # writes NAME.json and NAME.md

Why: ``scripts/gpu_cost_transfer.py`` checks the model's *latencies*, which mix two errors: the unit costs it is fed
and its model of the program (how concurrent kernels share the device, event and launch gaps). A run's kernel
timelines (``gpu_check run --timeline VARIANT``) measured every kernel's device time inside each profiled program,
and the ``sequential + CUDA graph`` timeline measured each kernel alone, in this run, with this build. Fed those
kernel times as the unit latencies (in-program kernel seconds: no isolated -> in-program map), the model has no
unit-cost error left; what it then gets wrong is the program model. Per profiled program this reports predicted
against measured latency and summed kernel time, per kernel the simulated against the measured device time, and
whether the model orders each model's programs as the device did (pairs more than 5 % apart).

Each profiled variant is rescheduled as the build scheduled it (the run's cost model and stream limit; a variant
name that is not a scheduler comes from ``--schedule``, as ``gpu_check build`` took it), and skipped, with the
reason, when its stage count differs from the run's (another build's schedule) or it has IOS merge stages (merged
kernels of another program). ``--launches`` lowers every kernel as the CUDA build does and adds its launch shape
(thread blocks x threads per block), the other side of how a kernel shares the device (TVM's default kernels:
NASNet-A-large's 4032 -> 672 1x1 convolution runs 44 blocks of 128 threads for 271 us).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import statistics
import sys

REFERENCE = "sequential + CUDA graph"   # each kernel alone, in this run: the unit latencies fed to the model
GRAPH = " + CUDA graph"
DEPENDENCY = " (dependency)"
ORDER_MARGIN = 0.05                     # programs closer than this are not ordered
NEIGHBOURS = 5                          # kernels per program whose neighbours are listed, and neighbours each
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # gpucheck (the run's own helpers)
_KERNEL = re.compile(r"^(?P<func>.+)_kernel(?:_\d+)?$")


def kernel_func(name: str) -> str | None:
    """The TVM function a CUDA kernel of TVM's build belongs to (``fused_conv2d42_add14_kernel`` and a second launch
    ``..._kernel_1`` both to ``fused_conv2d42_add14``); None for a kernel of no TVM function (a copy, a library)."""
    m = _KERNEL.match(name)
    return m.group("func") if m else None


def func_times(timeline: dict) -> tuple[dict[str, float], dict[str, float]]:
    """``(us per call, calls per call)`` per TVM function of a timeline's ``by_kernel`` (its launches summed)."""
    us: dict[str, float] = {}
    calls: dict[str, float] = {}
    for name, k in (timeline.get("by_kernel") or {}).items():
        f = kernel_func(name)
        if f is None:
            continue
        us[f] = us.get(f, 0.0) + k["us"]
        if not re.search(r"_kernel_\d+$", name):
            calls[f] = calls.get(f, 0.0) + k["calls"]
    return us, calls


def kernel_kind(unit) -> str:
    """The model's interference class of a unit (``passes.cost.program.unit_class``), convolutions split by their
    reduction depth (input channels per group x kernel area), the axis along which the 2026-11-28 H200 timelines
    of NASNet-A-large split: deep 1x1 convolutions grew more than the model said, shallow ones less."""
    from tvm_interop.passes.cost.program import is_deep, reduction_depth, unit_class

    cls = unit_class(unit)
    if reduction_depth(unit) is None:
        return cls
    return f"{cls} ({'deep' if is_deep(unit) else 'shallow'})"


def _target(run: dict) -> dict:
    """The run's build target as a TVM target dict (``cuda -arch=sm_90`` -> kind cuda, arch sm_90)."""
    text = str(run.get("build", {}).get("target") or "cuda -arch=sm_90")
    m = re.search(r"-arch=(sm_\d+)", text)
    return {"kind": "cuda", "arch": m.group(1) if m else "sm_90"}


def _program(run: dict, name: str):
    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model

    b = run.get("build", {})
    kw = {"batch_size": int(b.get("batch") or 1), "width": float(b.get("width") or 1.0)}
    if b.get("image_size"):
        kw["image_size"] = int(b["image_size"])
    return prepare_program(get_model(name, **kw), _target(run), name=name)


def split_variant(name: str) -> tuple[str, str, bool]:
    """``(schedule label, mode, CUDA graph)`` of a gpu_check variant name (``ios (dependency) + CUDA graph``)."""
    graph = name.endswith(GRAPH)
    base = name[: -len(GRAPH)] if graph else name
    mode = "dependency" if base.endswith(DEPENDENCY) else "stage"
    return (base[: -len(DEPENDENCY)] if mode == "dependency" else base), mode, graph


def rescheduled(run: dict, model: str, program, label: str, files: dict):
    """The schedule the build made for ``label`` (a scheduler under the run's cost model and stream limit, or a
    ``--schedule`` file), or a string saying why there is none."""
    from tvm_interop.passes.schedulers import available_schedulers, schedule_graph

    if label in files:
        return files[label]
    if label not in available_schedulers():
        return f"{label!r} is not a scheduler; give its schedule with --schedule {model}:{label}=FILE"
    b = run.get("build", {})
    opts = {"max_streams": int(b.get("max_streams") or 8)} if label == "greedy" else {}
    return schedule_graph(program.graph, label, b.get("cost") or "sim:h100", model_name=model, **opts)


def launch_shapes(program, funcs: set[str], target: dict) -> dict[str, list[int]]:
    """``{function: [thread blocks, threads per block]}`` of its largest launch, lowered as the CUDA build lowers it
    (``passes.wave.kernel.lower_unit``); a function that cannot be lowered here is left out."""
    import tvm

    from tvm_interop.passes.wave.kernel import lower_unit

    tgt = tvm.target.Target(target)
    out: dict[str, list[int]] = {}
    for u in program.graph:
        f = u.func_name or u.name
        if f not in funcs or f in out:
            continue
        try:
            nests = lower_unit(program, u.name, tgt).nests
        except Exception:  # noqa: BLE001 - a library call or a kernel the lowering refuses: no shape to report
            continue
        blocks, threads = max(((n.stmt.grid, n.stmt.threads) for n in nests), key=lambda bt: bt[0] * bt[1])
        out[f] = [int(blocks), int(threads)]
    return out


def _schedule_files(specs: list[str], model: str, graph):
    """The ``--schedule`` files of ``model``, read and validated as ``gpu_check build`` reads them."""
    from gpucheck.build import schedule_files

    return schedule_files(specs, model, graph)


def check_model(run: dict, entry: dict, params, schedule_specs: list[str] = (), launches: bool = False,
                block_sim: bool = False) -> dict:
    """Every profiled program of one model of the run, simulated with the reference timeline's kernel times
    (``schedule_specs``: ``MODEL:LABEL=FILE`` schedules of the variants that are not schedulers; ``block_sim``:
    the CUDA-graph programs also by ``block_sim.simulate_blocks``, which needs the launch shapes)."""
    from gpucheck.kernel_profile import union_length
    from tvm_interop.passes.cost.program import issued_program, reduction_depth, simulate, unit_class, work_items
    from tvm_interop.passes.merge import has_merges

    name = entry["name"]
    timelines = entry.get("timelines") or {}
    ref = timelines.get(REFERENCE) or {}
    if "by_kernel" not in ref:
        return {"model": name, "skipped": f"no per-kernel {REFERENCE!r} timeline"}
    program = _program(run, name)
    files = dict(_schedule_files(list(schedule_specs), name, program.graph))
    ref_us, ref_calls = func_times(ref)
    units, funcs, missing = {}, {}, []
    for u in program.graph:
        f = u.func_name or u.name
        funcs[u.name] = f
        if f not in ref_us or not ref_calls.get(f):
            missing.append(u.name)
            continue
        units[u.name] = (ref_us[f] / ref_calls[f] * 1e-6, work_items(u), unit_class(u), True)
    if missing:
        return {"model": name, "skipped": f"{len(missing)} units have no kernel in the {REFERENCE!r} timeline "
                                          f"(e.g. {missing[0]}: a library call, or another build)"}
    unit_of_func = {}
    for u in program.graph:
        unit_of_func.setdefault(funcs[u.name], u)
    shapes = launch_shapes(program, set(ref_us), _target(run)) if (launches or block_sim) else {}
    blocks = _block_kernels(units, funcs, shapes) if block_sim else None
    variants = {v["name"]: v for v in entry.get("variants", [])}
    waits = (run.get("build", {}).get("waits") or "consumer").split(",")[0]
    programs, skipped = [], {}
    for vname, t in timelines.items():
        rec = variants.get(vname)
        if "by_kernel" not in t or not rec or not rec.get("median_ms"):
            skipped[vname] = "no per-kernel timeline or no median"
            continue
        label, mode, graph = split_variant(vname)
        sched = rescheduled(run, name, program, label, files)
        if isinstance(sched, str):
            skipped[vname] = sched
            continue
        if has_merges(sched):
            skipped[vname] = "IOS merge stages: the run built merged kernels, another program"
            continue
        if rec.get("stages") not in (None, sched.num_stages):
            skipped[vname] = f"{sched.num_stages} stages rescheduled here, {rec['stages']} in the run (another build)"
            continue
        prog = issued_program(program, sched, mode, graph, int(run.get("build", {}).get("max_streams") or 8),
                              waits=waits)
        tl = simulate(prog, units, params, trace=True)
        sim_us: dict[str, float] = {}
        spans = []
        for u, (_s, a, b) in tl.kernels.items():
            if u in funcs:
                sim_us[funcs[u]] = sim_us.get(funcs[u], 0.0) + (b - a) * 1e6
                spans.append((a * 1e6, b * 1e6, funcs[u]))
        meas_us, _ = func_times(t)
        block = _block_prediction(prog, blocks, funcs, rec["median_ms"]) if blocks and graph else {}
        kernels = []
        for f in sorted(set(meas_us) & set(sim_us), key=lambda f: -meas_us[f]):
            u = unit_of_func[f]
            kernels.append({"kernel": f, "kind": kernel_kind(u), "reduction": reduction_depth(u),
                            "calls": ref_calls.get(f), "reference_us": ref_us[f], "measured_us": meas_us[f],
                            "simulated_us": sim_us[f], "ratio": sim_us[f] / meas_us[f] if meas_us[f] > 0 else None})
        programs.append({"variant": vname, "measured_ms": rec["median_ms"], "predicted_ms": tl.latency * 1e3,
                         "error": tl.latency * 1e3 / rec["median_ms"] - 1,
                         "kernel_sum_measured_us": sum(meas_us.values()),
                         "kernel_sum_simulated_us": sum(sim_us.values()),
                         "busy_measured_us": t.get("busy_us"), "busy_simulated_us": union_length(spans),
                         "kernels": kernels, "neighbours": neighbours(t, spans, [k["kernel"] for k in kernels]),
                         "pairs": isolated_pairs(t, ref), **block})

    def kind_of(kernel_name: str) -> str:
        u = unit_of_func.get(kernel_func(kernel_name) or "")
        return kernel_kind(u) if u is not None else "not a TVM kernel"

    pairs = [p for prog in programs for p in prog["pairs"]]
    out = {"model": name, "programs": programs, "skipped": skipped, "order": program_order(programs),
           "by_kind": by_kind(programs), "pair_summary": pair_summary(pairs, kind_of)}
    if shapes:
        out["launches"] = shapes
    if block_sim:
        out["block_order"] = program_order([dict(p, predicted_ms=p["block_predicted_ms"]) for p in programs
                                            if "block_predicted_ms" in p])
    return out


def _block_kernels(units: dict, funcs: dict, shapes: dict) -> dict | None:
    """``block_sim.Kernel`` per unit (time alone from the reference timeline, launch shape from the lowering), or
    None when a unit has no shape (a library call)."""
    from block_sim import Kernel

    if any(funcs[u] not in shapes for u in units):
        return None
    return {u: Kernel(units[u][0], *shapes[funcs[u]]) for u in units}


def _block_prediction(prog, kernels: dict, funcs: dict, measured_ms: float) -> dict:
    """The block simulation's time for one CUDA-graph program and its kernels' simulated time per function."""
    from block_sim import simulate_blocks

    end, spans = simulate_blocks(prog, kernels)
    per_func: dict[str, float] = {}
    for u, (a, b) in spans.items():
        per_func[funcs[u]] = per_func.get(funcs[u], 0.0) + (b - a) * 1e6
    return {"block_predicted_ms": end * 1e3, "block_error": end * 1e3 / measured_ms - 1,
            "block_kernel_us": per_func}


def neighbours(timeline: dict, simulated: list[tuple], funcs: list[str], top: int = NEIGHBOURS) -> dict:
    """For the ``top`` kernels of ``funcs`` (the most measured time first), the microseconds per call each other
    kernel ran beside them, measured (the timeline's last-call spans, ``kernel_profile.co_runners``) and simulated
    (``simulated``: ``(start us, end us, function)`` of the simulated program); only where the timeline has spans
    (runs since 2026-11-28). Which neighbour slows which kernel is what the sharing model gets wrong or right."""
    from gpucheck.kernel_profile import co_runners

    if not (timeline.get("spans") or {}).get("items"):
        return {}
    names = timeline["spans"]["names"]
    # the measured spans under their functions' names (a second launch of a function counts as the function)
    measured = {"spans": {"names": [kernel_func(n) or n for n in names], "items": timeline["spans"]["items"]}}
    order = {n: i for i, n in enumerate(dict.fromkeys(f for _, _, f in simulated))}
    sim = {"spans": {"names": list(order), "items": [[a, b - a, order[f]] for a, b, f in simulated]}}
    out = {}
    for f in funcs[:top]:
        both = {}
        for side, tl in (("measured", measured), ("simulated", sim)):
            acc: dict[str, float] = {}
            for inst in co_runners(tl, f):
                for other, us in inst["beside"].items():
                    acc[other] = acc.get(other, 0.0) + us
            both[side] = dict(sorted(acc.items(), key=lambda kv: -kv[1])[:top])
        out[f] = both
    return out


def isolated_pairs(timeline: dict, reference: dict) -> list[dict]:
    """The kernels of the timeline's last call that ran beside exactly one other kernel, which ran beside only
    them (a pair stage of ``scripts/pair_probe.py``, or any such pair in a program): each member's time against its
    time alone in ``reference`` (per call of that kernel). Empty without spans."""
    spans = timeline.get("spans") or {}
    names = spans.get("names") or []
    items = [(a, a + d, names[i]) for a, d, i in spans.get("items") or []]
    ref = reference.get("by_kernel") or {}
    beside: list[list[int]] = [[] for _ in items]
    order = sorted(range(len(items)), key=lambda i: items[i][0])
    for x, i in enumerate(order):           # sweep: the spans that start before i ends
        for j in order[x + 1:]:
            if items[j][0] >= items[i][1]:
                break
            if min(items[i][1], items[j][1]) > items[j][0]:
                beside[i].append(j)
                beside[j].append(i)
    out = []
    for i, (a, b, name) in enumerate(items):
        if len(beside[i]) != 1:
            continue
        j = beside[i][0]
        if beside[j] != [i] or name not in ref or not ref[name]["calls"]:
            continue
        alone = ref[name]["us"] / ref[name]["calls"]
        out.append({"kernel": name, "beside": items[j][2], "us": b - a, "alone_us": alone,
                    "ratio": (b - a) / alone if alone > 0 else None})
    return out


def pair_summary(pairs: list[dict], kind_of) -> dict[str, dict]:
    """Per (kind, kind of its neighbour): how many kernels ran in such a pair, and the median and range of their
    time against their time alone."""
    acc: dict[str, list[float]] = {}
    for p in pairs:
        if p["ratio"] is None:
            continue
        acc.setdefault(f"{kind_of(p['kernel'])} beside {kind_of(p['beside'])}", []).append(p["ratio"])
    return {k: {"kernels": len(v), "median": statistics.median(v), "min": min(v), "max": max(v)}
            for k, v in sorted(acc.items())}


def program_order(programs: list[dict], margin: float = ORDER_MARGIN) -> dict:
    """The pairs of programs whose measured medians differ by more than ``margin``, and those the model orders the
    other way round (named: the pairs a scheduler choosing by this model would get wrong)."""
    pairs, wrong = 0, []
    for a, b in itertools.combinations(programs, 2):
        if abs(a["measured_ms"] / b["measured_ms"] - 1) <= margin:
            continue
        pairs += 1
        if (a["predicted_ms"] < b["predicted_ms"]) != (a["measured_ms"] < b["measured_ms"]):
            wrong.append([a["variant"], b["variant"]])
    return {"pairs": pairs, "wrong": wrong}


def by_kind(programs: list[dict]) -> dict[str, dict]:
    """Per kernel kind, over the concurrent programs (the reference is exact by construction): measured and
    simulated device time summed, and the time-weighted rms of log(simulated / measured) per kernel."""
    acc: dict[str, list[float]] = {}
    for p in programs:
        if p["variant"] == REFERENCE:
            continue
        for k in p["kernels"]:
            if not k["measured_us"] or not k["simulated_us"]:
                continue
            a = acc.setdefault(k["kind"], [0.0, 0.0, 0.0, 0])
            a[0] += k["measured_us"]
            a[1] += k["simulated_us"]
            a[2] += k["measured_us"] * math.log(k["simulated_us"] / k["measured_us"]) ** 2
            a[3] += 1
    return {kind: {"measured_us": a[0], "simulated_us": a[1], "rms_log": math.sqrt(a[2] / a[0]) if a[0] else 0.0,
                   "kernels": a[3]} for kind, a in sorted(acc.items(), key=lambda kv: -kv[1][0])}


def summary(models: list[dict]) -> dict:
    errs = [abs(p["error"]) for m in models for p in m.get("programs", [])]
    pairs = sum(m.get("order", {}).get("pairs", 0) for m in models)
    wrong = sum(len(m.get("order", {}).get("wrong", [])) for m in models)
    out = {"programs": len(errs), "median": statistics.median(errs) if errs else None,
           "worst": max(errs) if errs else None, "ordered_pairs": pairs, "misordered_pairs": wrong}
    block = [abs(p["block_error"]) for m in models for p in m.get("programs", []) if "block_error" in p]
    if block:
        out["block"] = {"programs": len(block), "median": statistics.median(block), "worst": max(block),
                        "ordered_pairs": sum(m.get("block_order", {}).get("pairs", 0) for m in models),
                        "misordered_pairs": sum(len(m.get("block_order", {}).get("wrong", [])) for m in models)}
    return out


def render_markdown(result: dict, top: int = 8) -> str:
    s = result["summary"]
    lines = [f"# Program model, kernel by kernel: {result['run']} ({result.get('device')})", "",
             "Made by `scripts/gpu_kernel_check.py`. Unit latencies: each kernel's device time in the run's "
             f"`{REFERENCE}` timeline, so no unit-cost error is left; what remains is the program model's. Parameters: "
             f"{result['params']}.", ""]
    if s["programs"]:
        lines += [f"**{s['programs']} profiled programs**: |predicted / measured - 1| median {s['median']:.1%}, worst "
                  f"{s['worst']:.1%}; the model orders {s['ordered_pairs'] - s['misordered_pairs']} of "
                  f"{s['ordered_pairs']} pairs of programs (more than {ORDER_MARGIN:.0%} apart) as the device did.", ""]
        if s.get("block"):
            b = s["block"]
            lines += [f"The block simulation on {b['programs']} CUDA-graph programs: median {b['median']:.1%}, worst "
                      f"{b['worst']:.1%}; it orders {b['ordered_pairs'] - b['misordered_pairs']} of "
                      f"{b['ordered_pairs']} pairs as the device did.", ""]
    for m in result["models"]:
        lines.append(f"## {m['model']}")
        lines.append("")
        if isinstance(m.get("skipped"), str):
            lines += [f"Skipped: {m['skipped']}.", ""]
            continue
        lines += ["| program | measured ms | predicted ms | error | kernels measured us | simulated us | "
                  "busy measured us | simulated us |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for p in m["programs"]:
            lines.append(f"| {p['variant']} | {p['measured_ms']:.3f} | {p['predicted_ms']:.3f} | {p['error']:+.1%} | "
                         f"{p['kernel_sum_measured_us']:.0f} | {p['kernel_sum_simulated_us']:.0f} | "
                         f"{p['busy_measured_us'] or 0:.0f} | {p['busy_simulated_us']:.0f} |")
        lines.append("")
        if any("block_predicted_ms" in p for p in m["programs"]):
            lines += ["The block simulation (`scripts/block_sim.py`, CUDA-graph programs): "
                      + "; ".join(f"{p['variant']} {p['block_predicted_ms']:.3f} ms ({p['block_error']:+.1%})"
                                  for p in m["programs"] if "block_predicted_ms" in p) + ".", ""]
        for v, why in m["skipped"].items():
            lines.append(f"- not compared: {v}: {why}")
        o = m["order"]
        lines += [f"- order: {o['pairs'] - len(o['wrong'])} of {o['pairs']} pairs as measured"
                  + ("; the other way round: " + "; ".join(f"{a} / {b}" for a, b in o["wrong"]) if o["wrong"] else ""),
                  ""]
        if m["by_kind"]:
            lines += ["Per kernel kind, over the concurrent programs: device time summed, and the time-weighted rms "
                      "of log(simulated / measured) per kernel:", "",
                      "| kind | kernels | measured us | simulated us | simulated / measured | rms log |",
                      "|---|---:|---:|---:|---:|---:|"]
            for kind, a in m["by_kind"].items():
                lines.append(f"| {kind} | {a['kernels']} | {a['measured_us']:.0f} | {a['simulated_us']:.0f} | "
                             f"{a['simulated_us'] / a['measured_us']:.2f} | {a['rms_log']:.2f} |")
            lines.append("")
        if m.get("pair_summary"):
            lines += ["Kernels that ran beside exactly one other (from the spans of the profiled calls): time against "
                      "time alone, per kind and the kind beside it:", "",
                      "| kernel kind beside | kernels | median | min | max |", "|---|---:|---:|---:|---:|"]
            for k, a in m["pair_summary"].items():
                lines.append(f"| {k} | {a['kernels']} | {a['median']:.2f}x | {a['min']:.2f}x | {a['max']:.2f}x |")
            lines.append("")
        shapes = m.get("launches") or {}
        for p in m["programs"]:
            if p["variant"] == REFERENCE or not p["kernels"]:
                continue
            lines += [f"**{p['variant']}**, the kernels with the most measured time:", "",
                      "| kernel | kind | reduction | launch | calls | alone us | measured us | simulated us | "
                      "simulated / measured |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
            for k in p["kernels"][:top]:
                shape = shapes.get(k["kernel"])
                lines.append(f"| `{k['kernel']}` | {k['kind']} | {k['reduction'] or ''} | "
                             f"{f'{shape[0]} x {shape[1]}' if shape else ''} | {k['calls'] or 0:.0f} | "
                             f"{k['reference_us']:.0f} | {k['measured_us']:.0f} | {k['simulated_us']:.0f} | "
                             f"{k['ratio']:.2f} |")
            lines.append("")
            for f, sides in (p.get("neighbours") or {}).items():
                lines.append(f"- beside `{f}` (us per call): measured " + _listed(sides["measured"])
                             + "; simulated " + _listed(sides["simulated"]))
            if p.get("neighbours"):
                lines.append("")
    return "\n".join(lines) + "\n"


def _listed(us: dict[str, float]) -> str:
    return ", ".join(f"`{k}` {v:.0f}" for k, v in us.items()) or "none"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a gpu_check run's gpu_check.json, with kernel timelines (gpu_check run --timeline)")
    ap.add_argument("--schedule", action="append", default=[], metavar="MODEL:LABEL=FILE",
                    help="the schedule of a variant that is not a scheduler, as gpu_check build took it")
    ap.add_argument("--models", default=None)
    ap.add_argument("--launches", action="store_true",
                    help="lower every kernel as the CUDA build does and report its launch shape (minutes)")
    ap.add_argument("--block-sim", action="store_true",
                    help="also simulate the CUDA-graph programs block by block (scripts/block_sim.py, an experiment; "
                         "lowers every kernel for its launch shape)")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = ap.parse_args(argv)
    from tvm_interop.passes.cost.program import fitted_params_path, load_fitted

    with open(args.run, encoding="utf-8") as f:
        run = json.load(f)
    params = load_fitted()
    models = []
    for entry in run.get("models", []):
        if (args.models and entry["name"] not in args.models.split(",")) or not entry.get("timelines"):
            continue
        models.append(check_model(run, entry, params, args.schedule, launches=args.launches,
                                  block_sim=args.block_sim))
        print(f"{entry['name']}: " + ("skipped: " + models[-1]["skipped"] if isinstance(models[-1].get("skipped"), str)
                                      else ", ".join(f"{p['variant']} {p['error']:+.1%}"
                                                     for p in models[-1]["programs"])), file=sys.stderr)
    if not models:
        print("no model of the run has kernel timelines (gpu_check run --timeline VARIANT)", file=sys.stderr)
        return 1
    result = {"run": os.path.basename(os.path.dirname(os.path.abspath(args.run))) + "/" + os.path.basename(args.run),
              "device": run.get("device"), "params": os.path.relpath(fitted_params_path(), ROOT),
              "summary": summary(models), "models": models}
    s = result["summary"]
    if s["programs"]:
        print(f"{s['programs']} programs: median {s['median']:.1%}, worst {s['worst']:.1%}; "
              f"{s['misordered_pairs']} of {s['ordered_pairs']} pairs ordered the other way round")
    if s.get("block"):
        b = s["block"]
        print(f"block simulation, {b['programs']} programs: median {b['median']:.1%}, worst {b['worst']:.1%}; "
              f"{b['misordered_pairs']} of {b['ordered_pairs']} pairs ordered the other way round")
    if args.out:
        with open(args.out + ".json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        with open(args.out + ".md", "w", encoding="utf-8") as f:
            f.write(render_markdown(result))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
