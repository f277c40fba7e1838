"""``tvm-interop pick``: time a library's candidate programs on this device and keep the fastest beside it."""
from __future__ import annotations

import numpy as np

from .common import print_json


def register(sub) -> None:
    p = sub.add_parser("pick", help="time the candidate programs of an exported model, keep the fastest",
                       description="Time every candidate program of a library (schedule in both modes, "
                                   "sequential; direct and CUDA graph) interleaved on this device and write the "
                                   "choice beside it (LIB.pick.json), which `runtime.load` then uses.",
                       epilog="example: tvm-interop pick m_cuda.so --rounds 20")
    p.add_argument("library", help="a .so written by `tvm-interop compile -o` (GPU targets carry candidates)")
    p.add_argument("--rounds", type=int, default=20, help="interleaved timing rounds (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs of each candidate first (default 3)")
    p.add_argument("--candidates", default=None, help="only these (comma-separated names)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--dry-run", action="store_true", help="time and print, but do not write the pick file")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from tvm_interop import runtime
    from tvm_interop.runtime.errors import InteropError
    from tvm_interop.runtime.picker import pick_fastest, save_pick

    if args.rounds < 1 or args.warmup < 0:
        raise InteropError("--rounds must be >= 1 and --warmup >= 0")
    model = runtime.load(args.library, executor="vm", pick="off")
    try:
        if not model.candidates:
            raise InteropError(f"{args.library} carries no candidate programs (built for a CPU target, or with "
                               "--no-candidates); there is nothing to pick")
        rng = np.random.default_rng(args.seed)
        inputs = [rng.standard_normal(s["shape"]).astype(s["dtype"]) for s in model.inputs]
        names = args.candidates.split(",") if args.candidates else None
        report = pick_fastest(model, inputs, rounds=args.rounds, warmup=args.warmup, names=names)
        path = None if args.dry_run else save_pick(report, args.library)
    finally:
        model.close()
    if args.json:
        print_json({**report.to_json(), "pick_file": path})
        return 0
    base = report.timings[report.choice]["median_ms"]
    print(f"{args.library} on {report.device}: {len(report.timings)} candidates, {report.rounds} interleaved rounds")
    for name, t in sorted(report.timings.items(), key=lambda kv: kv[1]["median_ms"]):
        mark = "*" if name == report.choice else " "
        print(f" {mark} {name:<28} median {t['median_ms']:9.3f} ms  min {t['min_ms']:9.3f} ms  "
              f"{t['median_ms'] / base:5.2f}x of the pick")
    print(report.summary())
    if path:
        print(f"wrote {path}")
    return 0
