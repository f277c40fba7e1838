"""CPU benchmark: sequential vs greedy vs lios vs ios (measured cost) with the same kernels, on this machine.

For each model: prepare once; schedule with each scheduler (ios and lios use the measured cost model: stages
timed on this CPU with the real kernels and worker threads); build each; then time every program with
interleaved repeats (round-robin over the schedules per repeat, so machine noise hits all alike; by default the
exported libraries, in three fresh processes: ``--processes``) and report
medians, speedups over sequential, optimisation (search + measurement) time, and the ios cost model's predicted
latency next to the measured one. Writes docs/bench_cpu.json and docs/bench_cpu.md.

    .venv/bin/python scripts/bench_cpu.py --models inception_v3 squeezenet googlenet randwire --repeat 15

Scheduler specs are ``name`` or ``name:cost``, optionally followed by ``+wave`` (wave fusion, ``passes.wave``) and then
``+inorder`` (the concurrent groups left run one after another on the VM, ``passes.in_order``) or ``+threads`` (they
stay on the worker threads, even where wave fusion would run them in order): ``ios`` / ``lios`` use
the measured cost model, ``ios:learned`` the
learned one (XGBoost trained on measured stages, with the search's picks measured; see passes.cost.learned).
A measured-cost ios search of randwire's single 276-unit block needs hours of stage timing on this CPU, so
randwire runs ``ios:learned`` only (``SKIP``). For every schedule costed by measurements the script also
reports how far the simulated CPU preset (sim:cpu) predicts its stages from their measured latencies.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import tvm  # noqa: E402

import tvm_interop  # noqa: E402
from tvm_interop.runtime.errors import InteropError  # noqa: E402
from tvm_interop.cli.common import parse_tuning_databases  # noqa: E402
from tvm_interop.passes.schedulers import available_schedulers  # noqa: E402

CONFIGS = {  # per model: width, image size chosen so one run stays well under a second with default kernels
    "inception_v3": dict(width=0.5, image_size=149),
    "squeezenet": dict(width=1.0, image_size=112),
    "googlenet": dict(width=0.5, image_size=112),
    "randwire": dict(width=0.5, image_size=112),
}


RTOL = ATOL = 1e-4   # the project's tolerance against plain TVM for fp32

SKIP = {"randwire": {"ios": "a measured-cost ios search of its one 276-unit block needs hours of stage timing "
                            "here; ios:learned (measured units + seed stages + every chosen stage) runs instead"}}


def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import psutil

    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "tvm": tvm.__version__, "numpy": np.__version__}


WAVE = "+wave"   # spec suffix: the same scheduler with wave fusion (passes.wave) where the cost model prices it faster
IN_ORDER = "+inorder"   # spec suffix, last: the concurrent groups left run one after another (passes.in_order)
THREADS = "+threads"    # spec suffix, last: they stay on the worker threads (compile's groups_in_order=False)


def _base_spec(spec: str) -> str:
    """The spec without its ``+wave`` / ``+inorder`` / ``+threads`` suffixes."""
    return spec.removesuffix(IN_ORDER).removesuffix(THREADS).removesuffix(WAVE)


def _cost_of(spec: str) -> tuple[str, str]:
    name, _, cost = _base_spec(spec).partition(":")
    if cost:
        return name, cost
    return name, ("measured" if name in ("ios", "lios") else "sim:cpu")


def cache_for(cache: str, cost: str) -> str:
    """One cost cache per timed cost kind, so each kind's optimisation time is its own (a learned search run
    after a measured one would otherwise find most stages in the cache)."""
    root, ext = os.path.splitext(cache)
    return f"{root}.{cost.partition(':')[0]}{ext or '.json'}"


def sim_vs_measured(cm) -> dict | None:
    """How far sim:cpu predicts the stages of a schedule whose stage latencies were measured (or predicted by the
    learned model from measurements): per-stage median |relative error| and the ratio of the totals."""
    from tvm_interop.passes.cost import get_cost_model

    sched, graph = cm.schedule, cm.program.graph
    if not sched.device.startswith("measured") or any(st.predicted_latency is None for st in sched.stages):
        return None
    sim = get_cost_model("sim:cpu")
    pairs = [(sim.stage_latency([[graph.unit(n) for n in g] for g in st.groups], st.strategy), st.predicted_latency)
             for st in sched.stages]
    rel = [abs(p / m - 1) for p, m in pairs if m > 0]
    return {"stages": len(pairs), "median_abs_rel_error": float(np.median(rel)),
            "sim_total_ms": sum(p for p, _ in pairs) * 1e3, "measured_total_ms": sum(m for _, m in pairs) * 1e3}


def wave_choice(schedule) -> dict | None:
    """How wave fusion chose its stages: how many were priced, chosen, and whether the prices were timed together
    (``passes.wave.choose``), with each decision's reason."""
    wf = schedule.options.get("wave_fusion")
    if not wf:
        return None
    decisions = wf.get("decisions", [])
    return {"cost": wf.get("cost"), "fusable": len(decisions), "chosen": len(wf.get("stages", [])),
            "paired": sum(1 for d in decisions if d.get("paired")),
            "reasons": {str(d["stage"]): d.get("reason", "") for d in decisions},
            "left_in_order": wf.get("in_order")}


TUNED = " +tuned"  # row-name suffix of the schedules built with tuned kernels


def time_interleaved(programs: dict, inputs: list, repeat: int, settle: int) -> dict[str, list[float]]:
    """Seconds of ``repeat`` timed calls of every program, round-robin (each timed call after ``settle`` untimed
    ones of the same program), so machine noise hits all programs alike."""
    times = {s: [] for s in programs}
    for m in programs.values():
        m.run(*inputs, numpy=False)
    for _ in range(repeat):
        for s, m in programs.items():
            for _ in range(settle):
                m.run(*inputs, numpy=False)
            t0 = time.perf_counter()
            m.run(*inputs, numpy=False)
            times[s].append(time.perf_counter() - t0)
    return times


def _library_file(row: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in row) + ".so"


def time_in_fresh_processes(models: dict, inputs: list, repeat: int, settle: int, processes: int,
                            workdir: str, reference=None) -> tuple[list[dict[str, list[float]]], list[dict]]:
    """Each row's exported library (what a user loads) timed in ``processes`` fresh Python processes, one after
    another, each loading every library and timing them interleaved. Why: on these shared 2-core machines a
    process's timings move together by up to 1.4x (measured 2026-11-30 on a znver4 host: RandWire's lios+wave
    library 1.86-2.12 ms against sequential's 2.60-2.91 ms in six fresh processes, 1.37-1.43x; in one process the
    pair went from 1.40x to 1.27x once that process had compiled another program, and to 1.09x with that program in
    the timing loop), so one process's ratio is one sample. With ``reference`` (plain TVM's output) every child
    also runs each loaded library once and reports its largest difference from it: the check sees the library
    that was timed. Returns (per process ``{row: seconds}``, per process ``{row: {"max_abs_diff", "match"}}``)."""
    import subprocess

    manifest = {"rows": {}, "inputs": os.path.join(workdir, "inputs.npz"), "repeat": repeat, "settle": settle}
    np.savez(manifest["inputs"], *inputs)
    if reference is not None:
        manifest["reference"] = os.path.join(workdir, "reference.npy")
        np.save(manifest["reference"], np.asarray(reference))
    for row, cm in models.items():
        path = os.path.join(workdir, _library_file(row))
        cm.export(path)
        manifest["rows"][row] = path
    spec = os.path.join(workdir, "manifest.json")
    with open(spec, "w") as f:
        json.dump(manifest, f)
    runs, library_diffs = [], []
    for k in range(processes):
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--time-libraries", spec],
                             capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise InteropError(f"timing process {k + 1} of {processes} failed: {out.stderr.strip()[-2000:]}")
        got = json.loads(out.stdout.strip().splitlines()[-1])
        runs.append(got["times"])
        library_diffs.append(got["max_abs_diff"])
        print(f"    process {k + 1}/{processes}: " + ", ".join(
            f"{r} {np.median(v) * 1e3:.2f} ms" for r, v in runs[-1].items()), flush=True)
    return runs, library_diffs


def _time_libraries_main(spec: str) -> int:
    """Child of :func:`time_in_fresh_processes`: load the manifest's libraries with TVM's runtime, time them
    interleaved, print ``{row: [seconds, ...]}`` as one JSON line."""
    from tvm_interop import runtime

    with open(spec) as f:
        manifest = json.load(f)
    with np.load(manifest["inputs"]) as z:
        inputs = [z[f"arr_{i}"] for i in range(len(z.files))]
    programs = {row: runtime.load(path) for row, path in manifest["rows"].items()}
    diffs = {}
    if manifest.get("reference"):
        ref = np.load(manifest["reference"])
        for row, m in programs.items():
            out = np.asarray(m.run(*inputs))
            same = out.shape == ref.shape
            diffs[row] = {"max_abs_diff": float(np.max(np.abs(out - ref))) if same else float("inf"),
                          "match": bool(same and np.allclose(out, ref, rtol=RTOL, atol=ATOL))}
    times = time_interleaved(programs, inputs, manifest["repeat"], manifest["settle"])
    print(json.dumps({"times": times, "max_abs_diff": diffs}))
    return 0


def summarize_times(times: dict[str, list[float]], runs: list[dict[str, list[float]]] | None = None) -> dict:
    """Per row: median and IQR (ms), speed-up over the sequential row of its kernels. With ``runs`` (one timing
    dict per fresh process) the median is the median of the processes' medians and the speed-up the median of
    each process's own ratio (both rows timed in the same process), with every process's ratio listed."""
    out = {}
    default_seq = float(np.median(times["sequential"])) if times else None
    for s in times:
        med = float(np.median(times[s]))
        base_row = "sequential" + (TUNED if s.endswith(TUNED) else "")
        base = float(np.median(times[base_row]))
        iqr = float(np.percentile(times[s], 75) - np.percentile(times[s], 25))
        out[s] = dict(median_ms=med * 1e3, iqr_ms=iqr * 1e3, speedup_vs_sequential=base / med,
                      speedup_vs_default_sequential=default_seq / med)
        if runs:
            meds = [float(np.median(r[s])) for r in runs]
            ratios = [float(np.median(r[base_row]) / np.median(r[s])) for r in runs]
            default_ratios = [float(np.median(r["sequential"]) / np.median(r[s])) for r in runs]
            iqrs = [np.percentile(r[s], 75) - np.percentile(r[s], 25) for r in runs]
            out[s].update(median_ms=float(np.median(meds)) * 1e3, iqr_ms=float(np.median(iqrs)) * 1e3,
                          speedup_vs_sequential=float(np.median(ratios)),
                          speedup_vs_default_sequential=float(np.median(default_ratios)),
                          process_medians_ms=[m * 1e3 for m in meds], process_speedups=ratios)
    return out


def bench_model(name: str, schedulers: list[str], repeat: int, cache: str, tuning_db: str | None = None,
                settle: int = 1, processes: int = 0) -> dict:
    """Compile ``name`` with every scheduler (and, with ``tuning_db``, again with the tuned kernels), then time all
    programs in one interleaved loop so default and tuned kernels see the same machine (with ``processes``: their
    exported libraries, in that many fresh processes)."""
    cfg = {k: v for k, v in CONFIGS.get(name, dict(width=0.5, image_size=None)).items()}
    mod, _ = tvm_interop.load_module(name, **cfg)
    rows = {}
    models = {}
    skipped = {}
    for db in [None] + ([tuning_db] if tuning_db else []):
        for spec in schedulers:
            s, cost = _cost_of(spec)
            row_name = spec + (TUNED if db else "")
            if spec in SKIP.get(name, {}):
                skipped[row_name] = SKIP[name][spec]
                print(f"  {name}/{row_name}: skipped ({skipped[row_name]})", flush=True)
                continue
            kw = {"tuning_db": db} if db else {}
            t = time.perf_counter()
            if spec.removesuffix(IN_ORDER).removesuffix(THREADS).endswith(WAVE):
                kw["fusion"] = "wave"
            if spec.endswith(IN_ORDER):
                kw["groups_in_order"] = True
            if spec.endswith(THREADS):
                kw["groups_in_order"] = False
            cm = tvm_interop.compile(mod, scheduler=s, cost=cost, cost_cache=cache_for(cache, cost), guard=False,
                                     name=name,
                                     max_memory_ratio=None, **kw)
            opt = cm.timings.get("schedule", 0.0)
            models[row_name] = cm
            search = cm.schedule.search
            rows[row_name] = {"stages": cm.schedule.num_stages, "max_groups": cm.schedule.max_concurrency(),
                              "executor": cm.runner.executor,
                              "optimisation_s": opt, "compile_s": time.perf_counter() - t, "cost": cost,
                              "kernels": "tuned" if db else "default",
                              "measurements": search.get("measurements"), "cache_hits": search.get("cache_hits"),
                              "predicted_ms": None if cm.schedule.predicted_latency is None
                              else cm.schedule.predicted_latency * 1e3,
                              "sim_vs_measured": sim_vs_measured(cm), "search": search,
                              "wave_fused_stages": sum(1 for r in cm.schedule.options.get("waves", []) if r["fused"])
                              if "fusion" in kw else None,
                              "wave_choice": wave_choice(cm.schedule) if "fusion" in kw else None}
            print(f"  {name}/{row_name}: {cm.schedule.num_stages} stages, optimisation {opt:.1f} s, "
                  f"{search.get('measurements', 0)} measurements", flush=True)
    first = next(iter(models.values()))
    x = first.random_inputs(0)
    ref = tvm_interop.run_reference(mod, x)
    for s, cm in models.items():
        out = cm.run(*x)
        rows[s]["max_abs_diff"] = float(np.max(np.abs(out - ref)))
        rows[s]["match"] = bool(np.shape(out) == np.shape(ref) and np.allclose(out, ref, rtol=RTOL, atol=ATOL))
    runs = None
    if processes:
        import tempfile

        with tempfile.TemporaryDirectory(prefix=f"bench_cpu_{name}_") as workdir:
            runs, diffs = time_in_fresh_processes(models, x, repeat, settle, processes, workdir, reference=ref)
        for s in models:   # the loaded libraries, not only the compiled models, must compute plain TVM's numbers
            rows[s]["library_max_abs_diff"] = max(d[s]["max_abs_diff"] for d in diffs)
            rows[s]["match"] = rows[s]["match"] and all(d[s]["match"] for d in diffs)
        times = {s: [t for r in runs for t in r[s]] for s in models}
    else:
        times = time_interleaved(models, x, repeat, settle)
    for s, stats in summarize_times(times, runs).items():
        rows[s].update(stats)
    for cm in models.values():
        cm.close()
    return {"model": name, "config": cfg, "tuning_db": tuning_db, "rows": rows, "skipped": skipped,
            "timing": f"{processes} fresh processes (exported libraries)" if processes else "this process"}


def markdown(results: list[dict], info: dict, cmd: str) -> str:
    out = ["# CPU benchmark: inter-operator schedules with the same kernels", "",
           f"Machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB; TVM {info['tvm']}, Python "
           f"{info['python']}.", "", f"Command: `{cmd}`", "",
           "Medians of interleaved repeats (all rows of a model, tuned ones included, in one loop; before each timed "
           "call, `--settle` untimed calls of the same program); speedup = "
           "sequential median / schedule median with the same kernels; vs default sequential = the default-kernel "
           "sequential median / this row's median. `ios` and `lios` use the "
           "measured cost model (stages timed on this CPU), `ios:learned` the learned one (XGBoost on measured "
           "stages; the stages of every schedule it picks are measured); optimisation = schedule search incl. "
           "measurements; measurements = stages timed in this run (cache hits not counted). predicted ms = the "
           "cost model's total for the schedule (for measured/learned: the sum of measured stage latencies). "
           "`+wave` rows: the same scheduler with wave fusion (Rammer; `passes.wave`): every concurrent stage that the "
           "row's cost model prices faster fused runs as one kernel: one region where each thread runs whole chains when "
           "they balance, else one parallel region per wave (stages column: "
           "stages of the schedule; fused in brackets). `+inorder` rows: the concurrent groups left run one after "
           "another, every kernel on all cores (the Relax VM; `passes.in_order`), which the never-slower guard "
           "ships when it times faster than the worker threads and sequential (a `+wave` row does so itself where every "
           "stage it left unfused timed no faster on the workers); `+threads` rows: they stay on the worker threads.",
           ""]
    for r in results:
        tag = f" (`{TUNED.strip()}` rows: kernels from the tuning database {r['tuning_db']})" if r["tuning_db"] else ""
        out += [f"## {r['model']}{tag} — width {r['config'].get('width')}, {r['config'].get('image_size')} px", "",
                "| scheduler | stages | max groups | median ms | IQR ms | speedup | vs default sequential "
                "| optimisation s | measurements | predicted ms | max abs diff |",
                "|---|---|---|---|---|---|---|---|---|---|---|"]
        for s, row in r["rows"].items():
            pred = "" if row["predicted_ms"] is None else f"{row['predicted_ms']:.2f}"
            meas = "" if row.get("measurements") is None else str(row["measurements"])
            fused = "" if row.get("wave_fused_stages") is None else f" ({row['wave_fused_stages']} fused)"
            out.append(f"| {s} | {row['stages']}{fused} | {row['max_groups']} | {row['median_ms']:.2f} | {row['iqr_ms']:.2f} | "
                       f"{row['speedup_vs_sequential']:.2f}x | {row['speedup_vs_default_sequential']:.2f}x | "
                       f"{row['optimisation_s']:.1f} | {meas} | {pred} | "
                       f"{row['max_abs_diff']:.1e}{'' if row.get('match', True) else ' **MISMATCH**'} |")
        for s, why in r.get("skipped", {}).items():
            out.append(f"| {s} | skipped: {why} ||||||||||")
        out.append("")
        per_process = [(s, row["process_speedups"]) for s, row in r["rows"].items()
                       if row.get("process_speedups") and s != "sequential"]
        if per_process:
            out.append(f"Timed: {r['timing']}; median ms, IQR ms and speedup are the medians over the processes, "
                       "each process's speedup (same process, same libraries): " + "; ".join(
                           f"{s} " + ", ".join(f"{x:.2f}x" for x in v) for s, v in per_process) + ".")
            out.append("")
        sims = [(s, row["sim_vs_measured"]) for s, row in r["rows"].items() if row.get("sim_vs_measured")]
        if sims:
            out.append("Simulated (sim:cpu) vs measured stage latency of the measured-cost schedules: " + "; ".join(
                f"{s}: median |error| {v['median_abs_rel_error'] * 100:.0f}% over {v['stages']} stages, total "
                f"{v['sim_total_ms']:.2f} ms simulated vs {v['measured_total_ms']:.2f} ms measured" for s, v in sims)
                + ".")
        learned = [(s, row["search"]) for s, row in r["rows"].items() if row["search"].get("active_rounds")]
        for s, search in learned:
            rounds = ", ".join(f"{a['predicted_ms']:.2f}->{a['measured_ms']:.2f} ms (+{a['new_stages_measured']})"
                               for a in search["active_rounds"])
            cv = search.get("learned_cv_error")
            out.append(f"{s}: {search.get('learned_measured_stages')} stages measured "
                       f"({search.get('seed_stages_measured')} seed), {search.get('learned_predictions')} predictions, "
                       f"held-out median error {'n/a (too few stages)' if cv is None else f'{cv * 100:.0f}%'}; rounds (predicted->measured "
                       f"total, new stages): {rounds}.")
        out.append("")
    return "\n".join(out)


def mismatches(results: list[dict]) -> list[str]:
    """``model/scheduler`` of every row whose output differs from plain TVM's."""
    return [f"{r['model']}/{s}" for r in results for s, row in r["rows"].items() if not row.get("match", False)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(CONFIGS))
    ap.add_argument("--schedulers", default="sequential,greedy,lios,ios,ios:learned")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--settle", type=int, default=1,
                    help="untimed calls of the same schedule before each timed one (default 1): each timing is that "
                         "schedule's steady state, not what the previous row left (worker-thread rows leave TVM "
                         "thread pools spinning: measured, a wave-fused row timed right after the greedy row on "
                         "threads ran 1.05x of sequential, 1.13-1.17x without that row)")
    ap.add_argument("--cache", default="out/bench-cost-cache.json",
                    help="cost cache path stem: one file per timed cost kind (.measured.json, .learned.json); delete "
                         "them for first-run optimisation times")
    ap.add_argument("--tuned", action="append", default=[], metavar="MODEL=DIR",
                    help="also benchmark MODEL with the kernels tuned into database DIR (made by `tvm-interop tune "
                         "MODEL --image-size/--width as in CONFIGS --db DIR`); repeatable")
    ap.add_argument("--processes", type=int, default=3, metavar="N",
                    help="time each row's exported library in N fresh processes, one after another, and report the "
                         "median of their medians and of their speed-ups (default 3; 0: time in this process, after "
                         "the compiles); a process's timings on these shared machines move together by up to 1.4x")
    ap.add_argument("--out", default="docs/bench_cpu")
    ap.add_argument("--time-libraries", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.time_libraries:
        return _time_libraries_main(args.time_libraries)
    if args.processes < 0:
        ap.error("--processes must be >= 0")
    schedulers = [s for s in args.schedulers.split(",")
                  if _base_spec(s).partition(":")[0] in available_schedulers()]
    if "sequential" not in schedulers:
        schedulers.insert(0, "sequential")  # the baseline of every ratio
    try:
        tuned = parse_tuning_databases(args.tuned)
    except InteropError as e:
        ap.error(str(e))
    info = machine()
    results = []
    for name in args.models:
        print(f"[bench_cpu] {name}", flush=True)
        results.append(bench_model(name, schedulers, args.repeat, args.cache, tuned.get(name), settle=args.settle,
                                   processes=args.processes))
    cmd = "python scripts/bench_cpu.py " + " ".join(sys.argv[1:])
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump({"machine": info, "command": cmd, "results": results}, f, indent=1)
    md = markdown(results, info, cmd)
    with open(args.out + ".md", "w") as f:
        f.write(md + "\n")
    print(md)
    mismatched = mismatches(results)
    if mismatched:
        # a speed-up of a program that computes something else is no result: the run fails, and says which
        print(f"[bench_cpu] MISMATCH against plain TVM (rtol/atol {RTOL}): {', '.join(mismatched)}", file=sys.stderr)
        return 1
    print("[bench_cpu] every output matches plain TVM", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
