"""``tvm-interop run``: load an exported .so with TVM's runtime and time it."""
from __future__ import annotations

import numpy as np

from .common import print_json


def register(sub) -> None:
    p = sub.add_parser("run", help="run an exported model and print its median latency",
                       epilog="example: tvm-interop run m.so --input x.npy --output y.npy --repeat 50")
    p.add_argument("library", help="a .so written by `tvm-interop compile -o`")
    p.add_argument("--repeat", type=int, default=20, help="timed runs (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    p.add_argument("--executor", choices=["threads", "vm"], default=None,
                   help="threads (CPU worker threads, default on CPU) or vm (Relax VM)")
    p.add_argument("--input", default=None, metavar="X.npy[,Y.npy]|X.npz",
                   help="the model's inputs: one .npy per input in order, or one .npz (arrays by input name, or "
                        "arr_0, arr_1...); shapes and dtypes are checked (default: random inputs)")
    p.add_argument("--output", default=None, metavar="OUT.npy|OUT.npz",
                   help="write the outputs here (.npy for a single output; .npz holds output_0, output_1...)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (without --input)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    from tvm_interop import runtime
    if args.repeat < 1:
        from tvm_interop.runtime.errors import InteropError

        raise InteropError("--repeat must be >= 1")
    model = runtime.load(args.library, executor=args.executor)
    try:
        if args.input:
            from .io_files import read_inputs

            inputs = read_inputs(args.input, model.inputs)
        else:
            rng = np.random.default_rng(args.seed)
            inputs = [rng.standard_normal(s["shape"]).astype(s["dtype"]) for s in model.inputs]
        if args.output and not args.output.endswith((".npy", ".npz")):
            from tvm_interop.runtime.errors import InteropError

            raise InteropError(f"--output must end in .npy or .npz, got {args.output!r}")
        stats = model.benchmark(*inputs, repeat=args.repeat, warmup=args.warmup)
        out = model.run(*inputs)
        outputs = out if isinstance(out, list) else [out]
        if args.output:
            from .io_files import write_outputs

            write_outputs(args.output, [np.asarray(o) for o in outputs])
    except BaseException:
        model.close()
        raise
    first = outputs[0]
    meta = model.plan.meta
    result = {"library": args.library, "model": meta.get("model"), "scheduler": meta.get("scheduler"),
              "executor": model.executor, "median_ms": stats["median"] * 1e3, "mean_ms": stats["mean"] * 1e3,
              "min_ms": stats["min"] * 1e3, "repeat": args.repeat, "output_shape": list(first.shape),
              "inputs": args.input or f"random (seed {args.seed})", "output": args.output,
              "candidate": model.candidate,
              "pick": model.pick_report.to_json() if model.pick_report is not None else None}
    if args.json:
        print_json(result)
    else:
        print(f"{args.library}: {meta.get('model')} ({meta.get('scheduler')}, executor {model.executor}) "
              f"median {result['median_ms']:.3f} ms over {args.repeat} runs "
              f"(min {result['min_ms']:.3f} ms); output {list(first.shape)}")
        if args.output:
            print(f"wrote {len(outputs)} output(s) to {args.output}")
        if model.pick_report is not None:
            print(f"candidate program: {model.pick_report.summary()}")
        elif model.candidate:
            print(f"candidate program: {model.candidate}")
    model.close()
    return 0
