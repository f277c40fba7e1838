"""``tvm-interop show``: print a schedule file's stages as text."""
from __future__ import annotations

from .common import print_json


def register(sub) -> None:
    p = sub.add_parser("show", help="print a schedule JSON as text")
    p.add_argument("schedule", help="a schedule JSON written by compile --schedule-out or schedule -o")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from passes.schedule import Schedule

    s = Schedule.load(args.schedule)
    if args.json:
        print_json({"model": s.model_name, "scheduler": s.scheduler, "device": s.device,
                    "num_stages": s.num_stages, "units": len(s.unit_order()),
                    "predicted_ms": None if s.predicted_latency is None else s.predicted_latency * 1e3})
    else:
        print(s.describe())
    return 0
