"""Where the time goes, operator by operator: our sequential program against ONNX Runtime, on the same model.

``scripts/bench.py`` says how far apart two whole programs are; this says which operators make the difference.
Ours: every kernel call of the compiled model timed in place (``ThreadExecutor.run_traced``: the calls as the
program makes them, with the caches and threads the model leaves behind). ONNX Runtime: its own profiler
(``SessionOptions.enable_profiling``: each node's kernel time), sequential, the same thread count, spinning off.
Both are grouped into the same operator classes (convolution, pooling, concatenation, dense, layout
transforms, other) and the heaviest kernels of each are listed with their shapes.

How the previous kernels were found: GoogLeNet's max pools took 1.27 ms in our program against 0.78 ms in ONNX
Runtime, its classifier 0.37 ms against 0.10 ms, while our convolutions were already faster.

Example::

    python scripts/bench_ops.py googlenet --repeat 20 --out /tmp/googlenet_ops

Writes ``<out>.json`` (per-kernel medians of both) when ``--out`` is given and prints the tables. The profiler
adds a little time to every ONNX Runtime node; compare classes, not single microseconds.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# operator class of one of our kernels (by its function name) / of an ONNX Runtime node (by its op type)
OUR_CLASSES = (("conv2d", "conv"), ("max_pool", "pool"), ("avg_pool", "pool"), ("adaptive_avg_pool", "pool"),
               ("concatenate", "concat"), ("matmul", "dense"), ("dense", "dense"), ("layout_transform", "layout"))
ORT_CLASSES = {"Conv": "conv", "FusedConv": "conv", "MaxPool": "pool", "AveragePool": "pool",
               "GlobalAveragePool": "pool", "ReduceMean": "pool", "Concat": "concat", "Gemm": "dense",
               "MatMul": "dense", "FusedGemm": "dense", "ReorderInput": "layout", "ReorderOutput": "layout"}


def our_class(func: str) -> str:
    return next((cls for key, cls in OUR_CLASSES if key in func), "other")


def time_ours(cm, x: np.ndarray, repeat: int, warmup: int) -> dict:
    """{unit: {"func", "us", "inputs", "outputs"}}: the median in-program time of each unit's kernel call(s)."""
    executor = cm.runner._thread_executor()
    for _ in range(warmup):
        cm.run(x, numpy=False)
    samples: dict[str, list[float]] = collections.defaultdict(list)
    funcs: dict[str, str] = {}
    for _ in range(repeat):
        per_unit: dict[str, float] = collections.defaultdict(float)
        for e in executor.run_traced(x):
            per_unit[e["unit"]] += e["end"] - e["start"]
            funcs[e["unit"]] = e["func"]
        for unit, t in per_unit.items():
            samples[unit].append(t)
    units = {u.name: u for u in cm.program.graph.units}
    out = {}
    for unit, ts in samples.items():
        u = units.get(unit)
        out[unit] = {"func": funcs[unit], "us": statistics.median(ts) * 1e6,
                     "inputs": [list(t.shape) for t in u.inputs] if u else [],
                     "outputs": [list(t.shape) for t in u.outputs] if u else []}
    return out


def time_onnxruntime(mod, x: np.ndarray, repeat: int, warmup: int, threads: int) -> dict:
    """{node: {"op", "us", "inputs", "outputs"}}: ONNX Runtime's profiled kernel time of each node (median)."""
    import onnxruntime as ort

    from tvm_interop.export import to_onnx

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.inter_op_num_threads, so.intra_op_num_threads = 1, threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="bench_ops_"), "ort")
    sess = ort.InferenceSession(to_onnx(mod).SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(warmup + repeat):
        sess.run(None, feed)
    with open(sess.end_profiling()) as f:
        events = json.load(f)
    samples: dict[str, list[float]] = collections.defaultdict(list)
    info: dict[str, dict] = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            node = e["name"][: -len("_kernel_time")]
            samples[node].append(float(e["dur"]))
            args = e.get("args", {})
            info[node] = {"op": args.get("op_name", "?"), "inputs": _shapes(args.get("input_type_shape")),
                          "outputs": _shapes(args.get("output_type_shape"))}
    return {node: {**info[node], "us": statistics.median(ts[warmup:] or ts)} for node, ts in samples.items()}


def _shapes(typed) -> list:
    return [next(iter(t.values())) for t in typed or [] if isinstance(t, dict) and t]


def by_class(kernels: dict, classify) -> dict:
    """{class: {"us", "kernels"}} sorted by time."""
    acc: dict[str, dict] = {}
    for k in kernels.values():
        c = acc.setdefault(classify(k), {"us": 0.0, "kernels": 0})
        c["us"] += k["us"]
        c["kernels"] += 1
    return dict(sorted(acc.items(), key=lambda kv: -kv[1]["us"]))


def class_table(ours: dict, ort_: dict) -> str:
    rows = ["| operator class | ours: kernels | ours ms | ONNX Runtime: nodes | ONNX Runtime ms | ours / ORT |",
            "|---|---:|---:|---:|---:|---:|"]
    for cls in sorted(set(ours) | set(ort_), key=lambda c: -max(ours.get(c, {}).get("us", 0),
                                                                  ort_.get(c, {}).get("us", 0))):
        a, b = ours.get(cls, {"us": 0.0, "kernels": 0}), ort_.get(cls, {"us": 0.0, "kernels": 0})
        ratio = f"{a['us'] / b['us']:.2f}x" if b["us"] > 0 and a["us"] > 0 else "-"
        rows.append(f"| {cls} | {a['kernels']} | {a['us'] / 1e3:.2f} | {b['kernels']} | {b['us'] / 1e3:.2f} | "
                    f"{ratio} |")
    total_a = sum(c["us"] for c in ours.values())
    total_b = sum(c["us"] for c in ort_.values())
    rows.append(f"| **all** | {sum(c['kernels'] for c in ours.values())} | {total_a / 1e3:.2f} | "
                f"{sum(c['kernels'] for c in ort_.values())} | {total_b / 1e3:.2f} | {total_a / total_b:.2f}x |")
    return "\n".join(rows)


def top_table(kernels: dict, label: str, n: int) -> str:
    rows = [f"| {label} | us | class | inputs | outputs |", "|---|---:|---|---|---|"]
    for name, k in sorted(kernels.items(), key=lambda kv: -kv[1]["us"])[:n]:
        what = k.get("func") or k.get("op")
        rows.append(f"| {name} `{what}` | {k['us']:.1f} | {k['class']} | {k['inputs'][:2]} | {k['outputs']} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="zoo model (see `tvm-interop models`) or an .onnx file")
    ap.add_argument("--width", type=float, default=1.0, help="channel multiplier (default 1.0)")
    ap.add_argument("--image-size", type=int, default=None, help="input H = W (default: the model's)")
    ap.add_argument("--layout", default="auto", help="our CPU layout (default auto)")
    ap.add_argument("--repeat", type=int, default=20, help="timed runs of each (default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    ap.add_argument("--top", type=int, default=15, help="heaviest kernels listed per side (default 15)")
    ap.add_argument("--tuning-db", default=None, help="our kernels from this MetaSchedule database (`tvm-interop tune`)")
    ap.add_argument("--out", default=None, help="write <out>.json")
    args = ap.parse_args(argv)

    import tvm_interop
    from tvm_interop.api import load_module
    from tvm_interop.runtime.cpu_threads import kernel_threads

    mod, name = load_module(args.model, image_size=args.image_size, width=args.width)
    shape = [int(d) for d in mod["main"].params[0].ty.shape.values]
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    cm = tvm_interop.compile(mod, target="llvm", scheduler="sequential", guard=False, layout=args.layout,
                             tuning_db=args.tuning_db)
    try:
        ours = time_ours(cm, x, args.repeat, args.warmup)
    finally:
        cm.close()
    ort_ = time_onnxruntime(mod, x, args.repeat, args.warmup, kernel_threads())
    for k in ours.values():
        k["class"] = our_class(k["func"])
    for k in ort_.values():
        k["class"] = ORT_CLASSES.get(k["op"], "other")
    classes_ours = by_class(ours, lambda k: k["class"])
    classes_ort = by_class(ort_, lambda k: k["class"])
    print(f"### {name}: in-program kernel time by operator class (medians of {args.repeat} runs, "
          f"{kernel_threads()} threads)\n")
    print(class_table(classes_ours, classes_ort))
    print()
    print(top_table(ours, "ours", args.top))
    print()
    print(top_table(ort_, "ONNX Runtime", args.top))
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump({"model": name, "args": vars(args), "ours": ours, "onnxruntime": ort_,
                       "classes": {"ours": classes_ours, "onnxruntime": classes_ort}}, f, indent=1)
        print(f"\nwrote {args.out}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
