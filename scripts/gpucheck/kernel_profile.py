"""Per-kernel device time of one program, from the CUDA profiler PyTorch ships (CUPTI, through ``torch.profiler``).

Why: issue 13's target 1 puts our sequential program against PyTorch eager + CUDA graph, and the 2026-11-26 H100
run put the gap in the convolutions (Inception-v3: our 95 cuDNN calls ~4.8 ms in a CUDA graph, PyTorch's whole
network 3.83 ms). Which kernels each side runs (a cuDNN kernel's name says its engine: implicit GEMM, Winograd,
FFT, an sm90 xmma kernel) and how long each takes is what explains such a gap. The profiler records every CUDA
kernel of the process, whoever launched it, so our TVM / cuDNN program is profiled exactly like PyTorch's.

Runs only where torch with CUDA is installed (the GPU machine); a failure is recorded, never raised.
"""
from __future__ import annotations

import re
from typing import Callable

TOP = 12        # kernels listed per profile, the most time first
GROWTH_REFERENCE = "sequential + CUDA graph"   # the timeline other programs' kernel times are compared with
RUNS = 5        # profiled calls (after one unprofiled call)

_CLASSES = (    # first match wins; a name is lower-cased before matching
    ("batch norm", re.compile(r"bn_fw|batch_?norm")),
    ("convolution / GEMM", re.compile(r"conv|xmma|gemm|winograd|fft|implicit|cutlass|sm\d\d_")),
    ("pooling", re.compile(r"pool")),
    ("copy / concat", re.compile(r"concat|cat_|copy|memcpy|memset")),
)


def kernel_class(name: str) -> str:
    """A coarse class of a kernel by its name (the classes of :data:`_CLASSES`, else ``other``)."""
    low = name.lower()
    return next((c for c, pat in _CLASSES if pat.search(low)), "other")


def _device_us(event) -> float:
    """An aggregated profiler event's device time in microseconds (the attribute's name changed across torch
    versions: ``self_device_time_total``, ``device_time_total``, ``cuda_time_total``)."""
    for attr in ("self_device_time_total", "device_time_total", "cuda_time_total"):
        v = getattr(event, attr, None)
        if v:
            return float(v)
    return 0.0


def _is_device_event(event) -> bool:
    """A kernel (or copy) on the GPU, not the host-side op that launched it (whose device time would count its
    kernels twice)."""
    return str(getattr(event, "device_type", "")).upper().endswith("CUDA")


def summarise(events, runs: int, top: int = TOP) -> dict:
    """Per-run device time by kernel name and by class, from aggregated profiler events."""
    rows: dict[str, dict] = {}
    for e in events:
        us = _device_us(e)
        if us <= 0 or not _is_device_event(e):
            continue
        row = rows.setdefault(e.key, {"us": 0.0, "calls": 0.0})
        row["us"] += us / runs
        row["calls"] += getattr(e, "count", 0) / runs
    classes: dict[str, float] = {}
    for name, row in rows.items():
        c = kernel_class(name)
        classes[c] = classes.get(c, 0.0) + row["us"]
    ranked = sorted(rows.items(), key=lambda kv: -kv[1]["us"])
    return {"runs": runs, "kernels": len(rows), "total_us": sum(r["us"] for r in rows.values()),
            "classes": dict(sorted(classes.items(), key=lambda kv: -kv[1])),
            "top": [{"name": n, "us": r["us"], "calls": r["calls"]} for n, r in ranked[:top]]}


def _profiled(fn: Callable[[], object], sync: Callable[[], None], runs: int, digest: Callable) -> dict:
    """``digest(profiler)`` of ``runs`` calls of ``fn`` under the CUDA profiler, after one unprofiled call (nothing
    of a first call, algorithm searches or module loads, in the profile); ``{"error": ...}`` when the profiler is
    missing or fails, so that the run goes on without it."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        sync()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                fn()
            sync()
        return digest(prof)
    except Exception as e:  # noqa: BLE001 - a diagnostic: record why it is missing
        return {"error": f"{type(e).__name__}: {e}"}


def profile_kernels(fn: Callable[[], object], sync: Callable[[], None], runs: int = RUNS) -> dict:
    """``fn`` called ``runs`` times under the CUDA profiler: per-run device time by kernel and class; or
    ``{"error": ...}`` when the profiler is missing or fails (the run goes on without it)."""
    return _profiled(fn, sync, runs, lambda prof: summarise(prof.key_averages(), runs))


def timeline_summary(intervals: list[tuple], runs: int) -> dict:
    """Per call, from the (start, end[, kernel name]) microseconds of every kernel and copy of ``runs`` calls: their
    summed device time, the time at least one of them ran (the union of the intervals), and the mean concurrency
    (sum / union); with names, also the device time and calls per call of every kernel (``by_kernel``).

    Why: a multi-stream program can be slower as a CUDA graph than launched directly (NASNet-A-large on an H200,
    2026-11-27: lios (dependency) 8.08 ms direct, 9.92 ms as a graph). Either its kernels overlap less (the sum
    stays, the union grows) or they run longer side by side (the sum grows); the two numbers tell which. On the
    H200 the sum grew (ios + CUDA graph: 29.4 ms of kernel time per call against the sequential program's ~13);
    which kernels grew, against the same kernels in ``sequential + CUDA graph``, is what ``by_kernel`` answers
    (:func:`kernel_growth`)."""
    by_kernel: dict[str, list[float]] = {}
    for iv in intervals:
        if len(iv) > 2:
            row = by_kernel.setdefault(str(iv[2]), [0.0, 0.0])
            row[0] += (iv[1] - iv[0]) / runs
            row[1] += 1.0 / runs
    total = sum(iv[1] - iv[0] for iv in intervals)
    busy = union_length(intervals)
    out = {"runs": runs, "ops_per_run": len(intervals) / runs, "device_us": total / runs, "busy_us": busy / runs,
           "concurrency": total / busy if busy > 0 else 0.0}
    if by_kernel:
        ranked = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])
        out["by_kernel"] = {k: {"us": v[0], "calls": v[1]} for k, v in ranked}
        out["spans"] = last_call_spans(intervals, runs)
    return out


def union_length(intervals) -> float:
    """The time at least one of the ``(start, end, ...)`` intervals covers (the length of their union)."""
    busy = 0.0
    cur_start = cur_end = None
    for start, end in sorted((iv[0], iv[1]) for iv in intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                busy += cur_end - cur_start
            cur_start, cur_end = start, end
        elif end > cur_end:
            cur_end = end
    return busy + (cur_end - cur_start if cur_end is not None else 0.0)


def last_call_spans(intervals: list[tuple], runs: int) -> dict:
    """The kernels of the last profiled call, each ``[start, duration, name index]`` in microseconds from the call's
    first kernel, names listed once (``{"names": [...], "items": [...]}``).

    Why: ``by_kernel`` says *that* a kernel grew beside others (NASNet-A-large's 4032 -> 672 1x1 convolution 3.7x
    under ios's CUDA graph, 1.0x under greedy's, 2026-11-28); which kernels ran beside each instance, and for how
    long, is what a sharing model of the device is fitted on (:func:`co_runners`). One call is enough (the calls
    repeat the same program) and keeps the run's JSON small. The calls of one profile run one after another on the
    device, so the last call's kernels are the last ``len(intervals) / runs`` to start."""
    per_call = max(1, round(len(intervals) / max(runs, 1)))
    last = sorted(intervals, key=lambda iv: iv[0])[-per_call:]
    t0 = last[0][0] if last else 0.0
    names: dict[str, int] = {}
    items = [[round(iv[0] - t0, 3), round(iv[1] - iv[0], 3), names.setdefault(str(iv[2]), len(names))]
             for iv in last]
    return {"names": list(names), "items": items}


def co_runners(timeline: dict, kernel: str) -> list[dict]:
    """Every instance of ``kernel`` in the timeline's last call (:func:`last_call_spans`): its start and duration,
    and the microseconds each other kernel ran beside it (summed per kernel name, the most first). Empty when the
    timeline has no spans or no such kernel."""
    spans = timeline.get("spans") or {}
    names = spans.get("names") or []
    items = [(a, a + d, names[i]) for a, d, i in spans.get("items") or []]
    out = []
    for a, b, name in items:
        if name != kernel:
            continue
        beside: dict[str, float] = {}
        for a2, b2, other in items:
            overlap = min(b, b2) - max(a, a2)
            if overlap > 0 and (a2, b2, other) != (a, b, name):
                beside[other] = beside.get(other, 0.0) + overlap
        out.append({"start_us": a, "us": b - a,
                    "beside": dict(sorted(beside.items(), key=lambda kv: -kv[1]))})
    return out


def kernel_growth(timeline: dict, reference: dict, top: int = TOP) -> list[dict]:
    """The kernels whose device time per call grew most from ``reference``'s timeline (the same kernels in another
    program, e.g. ``sequential + CUDA graph``) to ``timeline``'s, among the kernels both ran as often: each with
    both times and the ratio. Empty when either timeline has no per-kernel times."""
    a, ref = timeline.get("by_kernel") or {}, reference.get("by_kernel") or {}
    rows = []
    for name, k in a.items():
        r = ref.get(name)
        if r and r["us"] > 0 and abs(r["calls"] - k["calls"]) < 1e-6:
            rows.append({"name": name, "us": k["us"], "reference_us": r["us"], "calls": k["calls"],
                         "ratio": k["us"] / r["us"]})
    rows.sort(key=lambda r: -(r["us"] - r["reference_us"]))
    return rows[:top]


def _timeline_of(prof, runs: int) -> dict:
    spans = [(float(e.time_range.start), float(e.time_range.end), str(getattr(e, "name", "?"))) for e in prof.events()
             if _is_device_event(e) and e.time_range.end > e.time_range.start]
    if not spans:
        return {"error": "the profiler recorded no kernel"}
    return timeline_summary(spans, runs)


def profile_timeline(fn: Callable[[], object], sync: Callable[[], None], runs: int = RUNS) -> dict:
    """``fn`` called ``runs`` times under the CUDA profiler: :func:`timeline_summary` of its kernels and copies;
    or ``{"error": ...}`` when the profiler is missing or fails."""
    return _profiled(fn, sync, runs, lambda prof: _timeline_of(prof, runs))


def render_timelines(timelines: dict) -> list[str]:
    """Markdown: per profiled variant its median, device time summed, busy time and concurrency."""
    if not timelines:
        return []
    lines = ["Kernel timelines (CUDA profiler; per call, "
             f"{next(iter(timelines.values())).get('runs', RUNS)} calls after one unprofiled call): *device* is the "
             "kernels' and copies' summed time, *busy* the time at least one ran, *concurrency* device / busy, "
             "*not busy* the median minus busy (host, launch and sync gaps).", "",
             "| variant | median ms | ops per call | device us | busy us | concurrency | not busy us |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, t in timelines.items():
        if "error" in t:
            lines.append(f"| {name} | no profile: {t['error'][:80]} | | | | | |")
            continue
        med = t.get("median_ms")
        median = "—" if med is None else f"{med:.3f}"
        idle = "—" if med is None else f"{med * 1e3 - t['busy_us']:.0f}"
        lines.append(f"| {name} | {median} | {t['ops_per_run']:.0f} | {t['device_us']:.0f} | {t['busy_us']:.0f} | "
                     f"{t['concurrency']:.2f} | {idle} |")
    lines.append("")
    ref_name = GROWTH_REFERENCE if "by_kernel" in timelines.get(GROWTH_REFERENCE, {}) else None
    for name, t in timelines.items():
        if ref_name is None or name == ref_name or "by_kernel" not in t:
            continue
        grown = kernel_growth(t, timelines[ref_name])
        if not grown:
            continue
        same = [k for k in t["by_kernel"] if k in timelines[ref_name]["by_kernel"]]
        was = sum(timelines[ref_name]["by_kernel"][k]["us"] for k in same)
        now = sum(t["by_kernel"][k]["us"] for k in same)
        lines += [f"**{name}** against `{ref_name}`: the {len(same)} kernels both ran take {now:.0f} us per call "
                  f"against {was:.0f} us ({now / was if was else 0:.2f}x); those that grew most:", "",
                  "| kernel | calls | us | reference us | ratio |", "|---|---:|---:|---:|---:|"]
        lines += [f"| `{g['name'][:90]}` | {g['calls']:.0f} | {g['us']:.1f} | {g['reference_us']:.1f} | "
                  f"{g['ratio']:.2f}x |" for g in grown]
        lines.append("")
    return lines


def render_profiles(profiles: list[tuple[str, dict]]) -> list[str]:
    """Markdown: per profiled program its device time per run by class, then its top kernels."""
    profiles = [(label, p) for label, p in profiles if p]
    if not profiles:
        return []
    lines = ["Kernels by device time per run (CUDA profiler through torch.profiler; "
             f"{profiles[0][1].get('runs', RUNS)} runs after one unprofiled call):", ""]
    for label, p in profiles:
        if "error" in p:
            lines += [f"- {label}: no profile ({p['error']})", ""]
            continue
        classes = ", ".join(f"{c} {us:.0f} us" for c, us in p["classes"].items())
        lines += [f"**{label}**: {p['total_us']:.0f} us in {p['kernels']} distinct kernels ({classes}).", "",
                  "| kernel | us per run | calls per run |", "|---|---:|---:|"]
        lines += [f"| `{k['name'][:110]}` | {k['us']:.1f} | {k['calls']:.0f} |" for k in p["top"]]
        lines.append("")
    return lines
