"""Pictures of schedules: Chrome/Perfetto traces of measured runs and Gantt charts.

A trace has one track per worker thread (on a GPU: per stream) and one slice per unit; load it in
https://ui.perfetto.dev or chrome://tracing. The Gantt chart (``viz`` extra: matplotlib) draws either a measured
trace or, without a device run, the schedule's predicted stage latencies.
"""
from __future__ import annotations

import json
import os

from tvm_interop.runtime.errors import InteropError


def chrome_trace(events: list[dict], name: str = "tvm-interop") -> dict:
    """Trace-event JSON (complete events, microseconds); thread names become track names."""
    threads = sorted({e["thread"] for e in events}, key=lambda t: (t != "MainThread", t))
    tid = {t: i for i, t in enumerate(threads)}
    out = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": name}}]
    for t, i in tid.items():
        label = "main thread" if t == "MainThread" else t.replace("tvm-interop-", "")
        out.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": i, "args": {"name": label}})
    for e in events:
        out.append({"ph": "X", "name": e["unit"], "cat": e.get("func", ""), "pid": 0, "tid": tid[e["thread"]],
                    "ts": e["start"] * 1e6, "dur": max(0.0, (e["end"] - e["start"]) * 1e6),
                    "args": {"kernel": e.get("func", ""), "call": e.get("call")}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(events: list[dict], path: str, name: str = "tvm-interop") -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(events, name), f)


def predicted_events(schedule) -> list[dict]:
    """Events laid out from predicted latencies: stage k starts when stage k-1 ends, group g on track g."""
    events = []
    t = 0.0
    for si, stage in enumerate(schedule.stages):
        total = stage.predicted_latency or 0.0
        for gi, group in enumerate(stage.groups):
            per = total / max(1, len(group))
            for ui, unit in enumerate(group):
                events.append({"unit": unit, "func": stage.strategy, "thread": f"group {gi}",
                               "start": t + ui * per, "end": t + (ui + 1) * per, "call": si})
        t += total
    if t == 0.0:
        raise InteropError("the schedule has no predicted latencies to draw; give a .so to draw a measured run")
    return events


def draw_gantt(events: list[dict], path: str, title: str = "") -> None:
    """A Gantt chart PNG: one row per track, one bar per unit."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InteropError("drawing needs matplotlib: pip install -e .[viz]") from None
    tracks = sorted({e["thread"] for e in events}, key=lambda t: (t != "MainThread", t))
    row = {t: i for i, t in enumerate(tracks)}
    kinds = sorted({e["unit"].split("_")[0] for e in events})
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.45 * len(tracks)))
    for e in events:
        ax.barh(row[e["thread"]], (e["end"] - e["start"]) * 1e3, left=e["start"] * 1e3, height=0.7,
                color=cmap(hash(e.get("func", "")) % 20), edgecolor="black", linewidth=0.3)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels(["main" if t == "MainThread" else t.replace("tvm-interop-", "") for t in tracks])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"{len(events)} units on {len(tracks)} tracks")
    del kinds
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
