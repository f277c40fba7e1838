"""``tvm-interop run``: load an exported .so with TVM's runtime and time it."""
from __future__ import annotations

import numpy as np

from .common import print_json


def register(sub) -> None:
    p = sub.add_parser("run", help="run an exported model and print its median latency",
                       epilog="example: tvm-interop run m.so --repeat 50")
    p.add_argument("library", help="a .so written by `tvm-interop compile -o`")
    p.add_argument("--repeat", type=int, default=20, help="timed runs (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    p.add_argument("--executor", choices=["threads", "vm"], default=None,
                   help="threads (CPU worker threads, default on CPU) or vm (Relax VM)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    import runtime

    if args.repeat < 1:
        from runtime.errors import InteropError

        raise InteropError("--repeat must be >= 1")
    model = runtime.load(args.library, executor=args.executor)
    rng = np.random.default_rng(args.seed)
    inputs = [rng.standard_normal(s["shape"]).astype(s["dtype"]) for s in model.inputs]
    stats = model.benchmark(*inputs, repeat=args.repeat, warmup=args.warmup)
    out = model.run(*inputs)
    first = out[0] if isinstance(out, list) else out
    meta = model.plan.meta
    result = {"library": args.library, "model": meta.get("model"), "scheduler": meta.get("scheduler"),
              "executor": model.executor, "median_ms": stats["median"] * 1e3, "mean_ms": stats["mean"] * 1e3,
              "min_ms": stats["min"] * 1e3, "repeat": args.repeat, "output_shape": list(first.shape),
              "candidate": model.candidate,
              "pick": model.pick_report.to_json() if model.pick_report is not None else None}
    if args.json:
        print_json(result)
    else:
        print(f"{args.library}: {meta.get('model')} ({meta.get('scheduler')}, executor {model.executor}) "
              f"median {result['median_ms']:.3f} ms over {args.repeat} runs "
              f"(min {result['min_ms']:.3f} ms); output {list(first.shape)}")
        if model.pick_report is not None:
            print(f"candidate program: {model.pick_report.summary()}")
        elif model.candidate:
            print(f"candidate program: {model.candidate}")
    model.close()
    return 0
