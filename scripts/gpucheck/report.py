"""The GPU check's reports: Markdown of a run and of a diagnose, and the ``report`` step (here: copy a run's
JSON into ``docs/`` and render it)."""
from __future__ import annotations

import json
import os
import statistics
import sys

from .common import REPO
from .device import render_environment
from .kernel_profile import render_profiles, render_timelines
from .probe import render_probe
from .targets import render_targets


def _err(x) -> str:
    return "—" if x is None else f"{x:.1e}"


def _runtime_only_line(result: dict) -> list[str]:
    ro = result.get("runtime_only")
    if not ro:
        return []
    ok = not ro.get("tvm_compiler_loaded") and not ro.get("compiler_modules")
    return [f"TVM's runtime only: {'yes' if ok else 'NO'} (libtvm_compiler loaded: {ro.get('tvm_compiler_loaded')}; "
            f"compiler-only modules imported: {', '.join(ro.get('compiler_modules') or []) or 'none'}).", ""]


def _diagnose_row(v: dict) -> str:
    if "error" in v:
        return f"| {v['name']} | — | — | — | — | — | error: {v['error']} |"
    s = v.get("serialized") or {}
    return (f"| {v['name']} | {v['runs']} | {_err(v['max_err'])} | {_err(v['run_to_run'])} | "
            f"{_err(s.get('max_err'))} | {_err(s.get('run_to_run'))} | {v.get('verdict', '')} |")


def render_diagnose(result: dict) -> str:
    """Markdown of a diagnose: the environment, then per model one row per concurrent variant."""
    lines = ["# GPU check: diagnose", "", *render_environment(result.get("environment", {})), "",
             *_runtime_only_line(result),
             f"Each concurrent variant ran {result['runs']} times on the same inputs and weights, then again in a "
             "child process with `CUDA_LAUNCH_BLOCKING=1` (serialized: no two launches overlap). Errors are max abs "
             "differences against plain TVM's direct build; run-to-run is the largest difference between any two "
             "runs. exact: all within tolerance; racy: not exact concurrently, exact serialized; wrong: not exact "
             "even serialized.", ""]
    if result.get("serialized_error"):
        lines += [f"The serialized run failed: {result['serialized_error']}", ""]
    for m in result["models"]:
        lines += [f"## {m['name']} (tolerance {m['tolerance']:.1e})", "",
                  "| variant | runs | max err | run-to-run | serialized max err | serialized run-to-run | verdict |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        lines += [_diagnose_row(v) for v in m["variants"]]
        if not m["variants"]:
            lines.append("| (no concurrent variant: every schedule runs on one stream) | | | | | | |")
        lines.append("")
    return "\n".join(lines) + "\n"


def render_markdown(result: dict) -> str:
    b = result.get("build", {})
    lines = [
        "# GPU check",
        "",
        f"Device: **{result.get('device')}** (compute {result.get('compute_version')}, "
        f"{result.get('multi_processors')} SMs); TVM {result.get('tvm')} runtime; PyTorch {result.get('torch')}.",
        f"Built for `{b.get('target')}` (width {b.get('width')}, batch {b.get('batch')}, image size "
        f"{b.get('image_size') or 'default'}, schedules searched with `{b.get('cost')}`, at most "
        f"{b.get('max_streams')} streams; built from {b.get('built_from') or 'an unrecorded revision'}"
        f"{' at ' + b['built_at'] if b.get('built_at') else ''}).",
        f"Latency: {result.get('timing')} of {result.get('repeat')} runs after {result.get('warmup')} warm-up runs. "
        "Correctness: outputs compared with plain TVM's direct build on the same GPU."
        + (f" The models come from {result['merged_runs']} run calls of this build on this device."
           if result.get("merged_runs") else ""),
        "",
        "Produced by `scripts/gpu_check.sh` (build here, run on the GPU machine with TVM's runtime only).",
        "",
    ]
    if result.get("environment"):
        lines += [*render_environment(result["environment"]), ""]
    lines += _runtime_only_line(result)
    lines += render_targets(result)
    lines += render_probe(result.get("probe"))
    for m in result.get("models", []):
        lines += [f"## {m['name']} ({m['units']} units, {m['image_size']}x{m['image_size']})", "",
                  "| variant | median ms | p90 ms | vs plain TVM | streams | stages | CUDA graph | output |",
                  "|---|---:|---:|---:|---:|---:|---|---|"]
        base = next((v.get("median_ms") for v in m["variants"] if v["name"] == "plain TVM"), None)
        for v in m["variants"]:
            med = v.get("median_ms")
            speed = f"{base / med:.2f}x" if (base and med) else ""
            graph = "yes" if v.get("cuda_graph") else ("no" if "graph" not in v["name"] else
                                                      f"no: {v.get('note') or 'fallback'}")
            ok = "n/a" if v.get("ok") is None else ("ok" if v.get("ok") else f"FAIL {v.get('error', '')}")
            if "max_abs_err" in v and v.get("ok"):
                ok = f"ok ({v['max_abs_err']:.1e})"
            lines.append(f"| {v['name']} | {med:.3f} | {v.get('p90_ms', 0):.3f} | {speed} | "
                         f"{v.get('num_streams') if v.get('num_streams') is not None else ''} | "
                         f"{v.get('stages') or ''} | {graph} | {ok} |" if med is not None else
                         f"| {v['name']} | — | — | | | | {graph} | {ok} |")
        lines.append("")
        if m.get("picked"):
            lines += ["What the runtime's candidate picker ships (interleaved timing of a library's candidates: the "
                      "scheduler's variants and sequential):", "",
                      "| scheduler | picked | median ms | best sequential ms | speed-up | never slower |",
                      "|---|---|---:|---:|---:|---|"]
            for s, pk in m["picked"].items():
                lines.append(f"| {s} | {pk['choice']} | {pk['median_ms']:.3f} | {pk['best_sequential_ms']:.3f} | "
                             f"{pk['speedup']:.2f}x | {'yes' if pk['never_slower'] else 'NO'} |")
            lines.append("")
        lines += _events_table(m)
        lines += _waits_table(m)
        lines += _in_context_table(m)
        lines += _library_host_table(m)
        lines += _cudnn_engines_lines(m)
        lines += _kernel_profile_lines(m)
        lines += render_timelines(m.get("timelines") or {})
        lines += _unit_costs_lines(m)
    return "\n".join(lines) + "\n"


def _library_host_table(m: dict) -> list[str]:
    """Host time of the direct (not captured) cuDNN / cuBLAS calls per variant: ours before the library's compute
    call, and the library's own, in microseconds per call (the native extension's ``call_stats``)."""
    rows = [f"| {v['name']} | {fn} | {st['calls']} | {st['prepare_us']:.1f} | {st['library_us']:.1f} |"
            for v in m.get("variants", []) for fn, st in (v.get("library_host_us") or {}).items()]
    if not rows:
        return []
    return ["Host time per direct library call (steady state; CUDA-graph replays make none):", "",
            "| variant | function | calls | ours us | library us |", "|---|---|---:|---:|---:|", *rows, ""]


_POLICY_TEXT = {"measured": "per convolution shape, cuDNN's graph-API engines and the legacy path timed on the "
                           "call's buffers, the fastest kept",
                "legacy": "per convolution shape, the fastest of cuDNN's legacy algorithms (`cudnnFind`)"}


def _cudnn_engines_lines(m: dict, top: int = 8) -> list[str]:
    """The engines pass (``run_engines``): each variant re-timed under the engine policy the library does not run by
    default, set against its main-pass time, then per convolution shape what the measured policy chose (the
    largest savings first) and why candidates dropped out. A pass from before 2026-11-27 has no policy fields: it
    was the measured policy against a legacy default."""
    ce = m.get("cudnn_engines")
    if not ce:
        return []
    policy, default = ce.get("policy", "measured"), ce.get("default_policy") or "legacy"
    if "error" in ce:
        return [f"{policy.capitalize()} cuDNN engines: the pass failed: {ce['error']}", ""]
    main = {v["name"]: v for v in m.get("variants", [])}
    lines = [f"{policy.capitalize()} cuDNN engines (`TVM_INTEROP_CUDNN_ENGINES={policy}`: {_POLICY_TEXT[policy]}), "
             f"against the main pass ({default}, the library's default):", "",
             f"| variant | {default} ms | {policy} ms | measured over legacy | output |", "|---|---:|---:|---:|---|"]
    for v in ce.get("variants", []):
        base = main.get(v["name"].split(" [")[0], {}).get("median_ms")
        med = v.get("median_ms")
        ok = ("ok" if v.get("ok") else f"FAIL {v.get('error', '')}") if v.get("ok") is not None else "n/a"
        if v.get("ok") and "max_abs_err" in v:
            ok = f"ok ({v['max_abs_err']:.1e})"
        if base and med:
            legacy_ms, measured_ms = (base, med) if policy == "measured" else (med, base)
            lines.append(f"| {v['name']} | {base:.3f} | {med:.3f} | {legacy_ms / measured_ms:.2f}x | {ok} |")
        else:
            lines.append(f"| {v['name']} | {base or '—'} | — | | {ok} |")
    first = main.get("sequential", {}).get("first_call_ms")
    if first is not None and main["sequential"].get("median_ms"):
        lines += ["", f"First call of `sequential` ({default} engines; handles, workspaces and the engine choice per "
                      f"shape): {first:.1f} ms, then {main['sequential']['median_ms']:.3f} ms per call."]
    shapes = ce.get("shapes", [])
    saving = f"{ce['legacy_us'] / ce['chosen_us']:.2f}x" if ce.get("chosen_us") else "n/a"
    lines += ["", f"{len(shapes)} convolution shapes; a graph engine chosen for {ce.get('graph_chosen', 0)}; device "
              f"time per call summed over the shapes (timed alone, 5 calls each): legacy {ce.get('legacy_us', 0):.0f} "
              f"us, chosen {ce.get('chosen_us', 0):.0f} us ({saving}).", ""]
    ranked = sorted((c for c in shapes if c["legacy_us"] > 0 and c["chosen_us"] > 0),
                    key=lambda c: c["chosen_us"] - c["legacy_us"])[:top]
    if ranked:
        lines += ["| shape | chosen | legacy us | chosen us | candidates timed |", "|---|---|---:|---:|---:|"]
        lines += [f"| {c['shape']} | {c['chosen']} | {c['legacy_us']:.1f} | {c['chosen_us']:.1f} | "
                  f"{len(c['tried'])} |" for c in ranked]
        lines.append("")
    if ce.get("dropped"):
        lines += ["Candidates left out (reason: shapes): "
                  + "; ".join(f"{why}: {n}" for why, n in sorted(ce["dropped"].items(), key=lambda x: -x[1])), ""]
    return lines


def _kernel_profile_lines(m: dict) -> list[str]:
    """The entry's per-kernel profiles (``run_profiles``): PyTorch eager's, our sequential program's with the
    legacy and with the measured cuDNN engines."""
    return render_profiles(list((m.get("kernel_profiles") or {}).items()))


def _unit_costs_lines(m: dict) -> list[str]:
    """The unit table's summary (``build --unit-costs``): what a per-unit choice of TVM kernel or library call could
    save, before ``build --auto`` makes the program that does it."""
    uc = m.get("unit_costs")
    if not uc:
        return []
    return [f"Unit table `{uc['table']}` ({uc.get('method')}): {uc['units']} units, {uc['all_tvm_us']:.0f} us as TVM "
            f"kernels one by one. Of the {uc['offloadable']} offloadable units the library call measured faster for "
            f"{uc['library_faster']}; together they take {uc['offloadable_tvm_us']:.0f} us as TVM kernels, "
            f"{uc['offloadable_library_us']:.0f} us as library calls, {uc['offloadable_faster_us']:.0f} us each as "
            "the faster (`build --auto MODEL=TABLE` builds that program).", *_device_clock_line(uc),
            *_unit_sum_line(m, uc), *_splitk_line(uc.get("splitk")), ""]


def _unit_sum_line(m: dict, uc: dict) -> list[str]:
    """Issue 13's target 1 from the unit table alone: the model's units one after another, each the faster of TVM
    kernel and library call, summed on each clock, against PyTorch eager + CUDA graph measured in the same run. A
    sum of isolated unit times is not a program's latency (no launch gaps, no neighbours): it says whether a
    per-unit choice could reach the target before a build makes that program."""
    torch = next((v for v in m.get("variants", []) if v.get("name", "").startswith("PyTorch eager")
                  and v["name"].endswith("+ CUDA graph") and v.get("median_ms")), None)
    if torch is None or "all_faster_us" not in uc:
        return []
    parts = [f"issue clock {uc['all_faster_us'] / 1e3:.3f} ms ({uc['all_faster_us'] / 1e3 / torch['median_ms']:.2f}x)"]
    d = uc.get("device") or {}
    if "all_faster_us" in d:
        parts.append(f"device clock {d['all_faster_us'] / 1e3:.3f} ms "
                     f"({d['all_faster_us'] / 1e3 / torch['median_ms']:.2f}x)")
    return ["", f"Every unit as the faster implementation, summed (a sum of unit times, not a measured program): "
            f"{'; '.join(parts)} of {torch['name']} {torch['median_ms']:.3f} ms."]


def _device_clock_line(uc: dict) -> list[str]:
    """The same unit table on the device clock (calls queued behind a held stream: what a CUDA graph pays), and
    how far the library calls' issue-clock times sat above it: the host-bound floor seen on 2026-11-26."""
    d = uc.get("device")
    if not d:
        clock = uc.get("device_clock") or {}
        return ["", f"No device clock: {clock['skipped']}"] if "skipped" in clock else []
    ratios = d.get("library_issue_over_device") or []
    ratio = (f" Library calls' issue-clock time over their device time: median {statistics.median(ratios):.2f}x, "
             f"max {max(ratios):.2f}x." if ratios else "")
    return ["", f"On the device clock (what a CUDA graph pays): the library call is faster for {d['library_faster']} "
            f"of {d['offloadable']} offloadable units; {d['offloadable_tvm_us']:.0f} us as TVM kernels, "
            f"{d['offloadable_library_us']:.0f} us as library calls, {d['offloadable_faster_us']:.0f} us each as "
            f"the faster. The two clocks choose differently for {d['flips']} units.{ratio}"]


def _splitk_line(sk: dict | None) -> list[str]:
    """The units ``build --splitk`` rescheduled, summed: DLight's kernels, the split-reduction ones, the best of
    those and the library call."""
    if not sk or not sk.get("units"):
        return []
    return ["", f"Split-reduction kernels (`passes/kernels/gpu_splitk.py`) on the {sk['units']} units they take: "
            f"faster than DLight's for {sk['splitk_faster']}; {sk['dlight_us']:.0f} us as DLight's kernels, "
            f"{sk['splitk_us']:.0f} us split, {sk['best_of_three_us']:.0f} us each as the fastest of DLight, "
            "split and library call."]


def _events_table(m: dict) -> list[str]:
    """Each '[events]' variant against its twin with TVM's per-call event: the same program, the same number of
    synchronisations, so the difference divided by that number is what one fork/join event costs more."""
    by_name = {v["name"]: v for v in m.get("variants", [])}
    rows = []
    for v in m.get("variants", []):
        twin = by_name.get(v["name"].replace(" [events]", ""))
        if "[events]" not in v["name"] or twin is None or v.get("median_ms") is None or \
                twin.get("median_ms") is None or not v.get("syncs"):
            continue
        saved_us = (twin["median_ms"] - v["median_ms"]) * 1e3 / v["syncs"]
        rows.append(f"| {twin['name']} | {v['syncs']} | {twin['median_ms']:.3f} | {v['median_ms']:.3f} | "
                    f"{twin['median_ms'] / v['median_ms']:.2f}x | {saved_us:+.2f} |")
    if not rows:
        return []
    return ["Reused events (the native extension's pool) against TVM's per-call event, same program:", "",
            "| variant | events per run | TVM sync ms | reused events ms | speed-up | saved per event (us) |",
            "|---|---:|---:|---:|---:|---:|", *rows, ""]


def _waits_table(m: dict) -> list[str]:
    """Each '[waits at consumer]' variant (dependency mode as built before 2026-11-27: a group's waits issued right
    before it, so an event also waits for the stage's groups queued behind its producer) against its twin with
    the waits issued at the start of the stage (today's lowering): the same schedule, streams and kernels."""
    tag = " [waits at consumer]"
    by_name = {v["name"]: v for v in m.get("variants", [])}
    rows = []
    for v in m.get("variants", []):
        twin = by_name.get(v["name"].replace(tag, ""))
        if tag not in v["name"] or twin is None or v.get("median_ms") is None or twin.get("median_ms") is None:
            continue
        rows.append(f"| {twin['name']} | {v['median_ms']:.3f} | {twin['median_ms']:.3f} | "
                    f"{v['median_ms'] / twin['median_ms']:.2f}x |")
    if not rows:
        return []
    return ["Dependency mode, waits at the stage's start (today) against waits at the consumer (before 2026-11-27), "
            "same schedule:", "", "| variant | waits at consumer ms | waits at stage start ms | speed-up |",
            "|---|---:|---:|---:|", *rows, ""]


def _in_context_table(m: dict) -> list[str]:
    """Stage costs in context (``build`` timed twins): what the stages of each direct stage-mode program cost
    inside it (a timing event on the caller's stream at every stage boundary), summed, against the program's
    measured latency and the scheduler's own stage costs (isolated timings or a simulated device). A sum near the
    measured latency means the in-context costs compose; the scheduler's sum far from it is the gap issue 12 is
    about."""
    rows, failed = [], []
    for v in m.get("variants", []):
        ic = v.get("in_context")
        if not ic or v.get("median_ms") is None:
            continue
        if "error" in ic:
            failed.append(f"{v['name']}: {ic['error']}")
            continue
        pred = sum(ic.get("predicted_stages_ms") or []) or None
        worst = ""
        if pred:   # the stage the scheduler's cost misses most, in absolute time
            gaps = [(abs(t - p), k, t, p) for k, (t, p) in enumerate(zip(ic["stages_ms"], ic["predicted_stages_ms"]))]
            _, k, t, p = max(gaps)
            worst = f"stage {k}: {t * 1e3:.0f} us in context, {p * 1e3:.0f} us predicted"
        rows.append(f"| {v['name']} | {len(ic['stages_ms'])} | {v['median_ms']:.3f} | {ic['timed_median_ms']:.3f} | "
                    f"{ic['sum_ms']:.3f} | {ic['sum_ms'] / v['median_ms']:.2f} | "
                    f"{'—' if pred is None else f'{pred:.3f}'} | {worst or '—'} |"
                    + ("" if ic.get("ok", True) else " (wrong output)"))
    if not rows and not failed:
        return []
    out = ["Stage costs in context (timed twin: a timing event at every stage boundary; medians per stage):", "",
           "| variant | stages | measured ms | timed ms | sum of stages ms | sum / measured | scheduler's sum ms | "
           "largest miss |", "|---|---:|---:|---:|---:|---:|---:|---|", *rows, ""]
    return out + ([f"Not timed: {'; '.join(failed)}", ""] if failed else [])


# what two runs must share for their models to sit in one report: the same device and the same build
_SAME_RUN_KEYS = ("device", "compute_version", "tvm", "repeat", "warmup", "timing", "build")


def merge_results(results: list[dict]) -> dict:
    """One report from several ``run`` calls of the same build on the same device (the device tool's 600 s per
    call splits a full run into calls by ``--models``): the first result with the later ones' models appended
    (and a probe, where the first has none). Runs that differ in device, build or timing are refused with the
    difference named: their numbers are not comparable in one table."""
    merged = json.loads(json.dumps(results[0]))
    names = {m["name"] for m in merged.get("models", [])}
    for i, other in enumerate(results[1:], start=2):
        for key in _SAME_RUN_KEYS:
            if other.get(key) != merged.get(key):
                raise ValueError(f"result {i} differs from result 1 in {key!r} ({other.get(key)!r} vs "
                                 f"{merged.get(key)!r}): report them separately (--name)")
        for m in other.get("models", []):
            if m["name"] in names:
                raise ValueError(f"result {i} repeats model {m['name']!r}: each model belongs to one run")
            names.add(m["name"])
            merged["models"].append(m)
        if not merged.get("probe") and other.get("probe"):
            merged["probe"] = other["probe"]
        ro, ro2 = merged.get("runtime_only"), other.get("runtime_only")
        if ro and ro2:   # runtime-only holds for the report only if it held for every run
            merged["runtime_only"] = {
                "tvm_compiler_loaded": bool(ro.get("tvm_compiler_loaded") or ro2.get("tvm_compiler_loaded")),
                "compiler_modules": sorted(set(ro.get("compiler_modules") or []) | set(ro2.get("compiler_modules") or []))}
        elif ro2 is None:
            merged.pop("runtime_only", None)
    if len(results) > 1:
        merged["merged_runs"] = len(results)
    return merged


def cmd_report(args) -> int:
    results = []
    for path in args.result:
        with open(path, encoding="utf-8") as f:
            results.append(json.load(f))
    try:
        result = merge_results(results)
    except ValueError as e:
        print(f"gpu_check report: {e}", file=sys.stderr)
        return 2
    docs = os.path.join(REPO, "docs")
    os.makedirs(docs, exist_ok=True)
    name = getattr(args, "name", None) or "gpu_check"
    with open(os.path.join(docs, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(docs, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(result))
    print(f"wrote {docs}/{name}.json and {docs}/{name}.md")
    return 0
