"""``tvm-interop show``: a schedule as text, a Chrome/Perfetto trace of a measured run, a Gantt chart."""
from __future__ import annotations

import numpy as np

from .common import print_json


def register(sub) -> None:
    p = sub.add_parser(
        "show", help="print a schedule or what a library holds; write a trace or a Gantt chart",
        description="Show a schedule JSON, or an exported model (.so): what the library holds (read from the file, "
                    "so a CUDA library shows on a machine without a GPU) and, for a CPU library, a run of its "
                    "schedule traced kernel by kernel.",
        epilog="examples:\n  tvm-interop show s.json\n  tvm-interop show m.so --trace run.json   "
               "# open in ui.perfetto.dev\n  tvm-interop show m.so --png run.png\n"
               "  tvm-interop show s.json --png predicted.png   # from predicted latencies",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("path", help="a schedule JSON or an exported .so")
    p.add_argument("--trace", default=None, help="write a Chrome/Perfetto trace of a measured run (needs a .so)")
    p.add_argument("--png", default=None, help="write a Gantt chart (matplotlib, viz extra)")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs before the traced one")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from tvm_interop.runtime.errors import InteropError
    from tvm_interop import report

    if args.path.endswith(".so"):
        from tvm_interop.library_info import describe_library, library_summary

        summary, plan = library_summary(args.path)
        if summary["device"] != "cpu" and (args.trace or args.png):
            raise InteropError("--trace and --png draw a measured run on CPU worker threads, one bar per kernel; a "
                               "CUDA library is timed as a whole (`tvm-interop run`, `tvm-interop pick`). For a "
                               "picture of the schedule: `compile ... --schedule-out s.json`, then `show s.json "
                               "--png` (predicted latencies)")
        if not args.json:
            print(describe_library(summary, plan))
        events, title = None, None
        if summary["device"] == "cpu":
            events, title, measured = _measured_run(args)
            summary.update(measured)
    else:
        from tvm_interop.passes.schedule import Schedule

        s = Schedule.load(args.path)
        events = None
        title = f"{s.model_name} ({s.scheduler}): predicted by {s.device}"
        summary = {"model": s.model_name, "scheduler": s.scheduler, "device": s.device, "num_stages": s.num_stages,
                   "units": len(s.unit_order()),
                   "predicted_ms": None if s.predicted_latency is None else s.predicted_latency * 1e3}
        if args.trace:
            raise InteropError("--trace records a measured run: give the exported .so, not the schedule JSON")
        if not args.json:
            print(s.describe())
        if args.png:
            events = report.predicted_events(s)
    if args.trace:
        report.write_chrome_trace(events, args.trace, name=title)
        summary["trace"] = args.trace
        if not args.json:
            print(f"wrote {args.trace} (open in https://ui.perfetto.dev)")
    if args.png:
        report.draw_gantt(events, args.png, title=title)
        summary["png"] = args.png
        if not args.json:
            print(f"wrote {args.png}")
    if args.json:
        print_json(summary)
    return 0


def _measured_run(args) -> tuple[list[dict], str, dict]:
    """One traced run of a CPU library on worker threads (after ``--warmup`` untimed ones): its kernel events,
    a title, and what it measured."""
    from tvm_interop import runtime

    model = runtime.load(args.path, executor="threads")
    try:
        meta = model.plan.meta
        ex = model._thread_executor()
        rng = np.random.default_rng(0)
        x = [rng.standard_normal(s["shape"]).astype(s["dtype"]) for s in model.inputs]
        for _ in range(args.warmup):
            ex.run(*x)
        events = ex.run_traced(*x)
        title = f"{meta.get('model')} ({meta.get('scheduler')}): measured run, {len(model.plan.stages)} stages"
    finally:
        model.close()
    total = max(e["end"] for e in events)
    threads = sorted({e["thread"] for e in events})
    if not args.json:
        print(f"measured run: {total * 1e3:.3f} ms on {len(threads)} thread(s)")
    return events, title, {"measured_ms": total * 1e3, "threads": threads}
