"""Convolution layers one at a time: TVM's default CPU build against ours (``passes.kernels.cpu_schedule``).

Why: ``scripts/bench.py`` compares whole models, where a slow kernel hides among a hundred others. This times single
convolution + bias + ReLU layers of the zoo's shapes (ResNet, Inception-v3, SqueezeNet), each built twice from the
same module: as TVM builds it untouched (naive loop nests) and with our default CPU schedule. Every scheduled
layer's output is compared with the default build's (rtol = atol = 1e-4) before it is timed, so a faster schedule
that computes something else fails here rather than in a model.

    python scripts/bench_conv_layers.py --layers all --repeat 7 --json /tmp/conv_layers.json

Timing: per layer, the call is repeated until a sample lasts ``--min-time`` seconds, ``--repeat`` samples, median.
``--no-default`` skips the default build (slow: 10-70x) and with it the comparison.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from tvm_interop.passes.kernels.cpu_schedule import apply_cpu_schedules, vector_lanes  # noqa: E402
from tvm_interop.runtime.cpu_threads import kernel_threads  # noqa: E402

# name: (N, C, H, W, F, (KH, KW), stride, (pad_h, pad_w))
LAYERS = {
    "resnet_3x3_64x56": (1, 64, 56, 56, 64, (3, 3), 1, (1, 1)),
    "incv3_3x3_192x35": (1, 192, 35, 35, 192, (3, 3), 1, (1, 1)),
    "incv3_stem_3x3_s2": (1, 3, 299, 299, 32, (3, 3), 2, (0, 0)),
    "incv3_stem_3x3_32x147": (1, 32, 147, 147, 64, (3, 3), 1, (1, 1)),
    "incv3_stem_3x3_80x71": (1, 80, 71, 71, 192, (3, 3), 1, (0, 0)),
    "incv3_1x1_768x17": (1, 768, 17, 17, 192, (1, 1), 1, (0, 0)),
    "incv3_1x7_160x17": (1, 160, 17, 17, 160, (1, 7), 1, (0, 3)),
    "incv3_red_3x3_s2_288x35": (1, 288, 35, 35, 384, (3, 3), 2, (0, 0)),
    "sqz_stem_3x3_s2": (1, 3, 224, 224, 64, (3, 3), 2, (0, 0)),
    "sqz_1x1_64x55_16": (1, 64, 55, 55, 16, (1, 1), 1, (0, 0)),
    "sqz_1x1_16x55_64": (1, 16, 55, 55, 64, (1, 1), 1, (0, 0)),
    "sqz_3x3_16x55_64": (1, 16, 55, 55, 64, (3, 3), 1, (1, 1)),
    "sqz_1x1_256x27_32": (1, 256, 27, 27, 32, (1, 1), 1, (0, 0)),
    "sqz_3x3_32x27_128": (1, 32, 27, 27, 128, (3, 3), 1, (1, 1)),
    "sqz_1x1_384x13_48": (1, 384, 13, 13, 48, (1, 1), 1, (0, 0)),
    "sqz_1x1_512x13_64": (1, 512, 13, 13, 64, (1, 1), 1, (0, 0)),
    "sqz_1x1_64x13_256": (1, 64, 13, 13, 256, (1, 1), 1, (0, 0)),
    "sqz_3x3_64x13_256": (1, 64, 13, 13, 256, (3, 3), 1, (1, 1)),
    "sqz_3x3_48x13_192": (1, 48, 13, 13, 192, (3, 3), 1, (1, 1)),
    "sqz_classifier_512x13_1000": (1, 512, 13, 13, 1000, (1, 1), 1, (0, 0)),
    "resnet_1x1_256x56_64": (1, 256, 56, 56, 64, (1, 1), 1, (0, 0)),
    "resnet_1x1_1024x14_256": (1, 1024, 14, 14, 256, (1, 1), 1, (0, 0)),
}


def layer_module(layer: tuple) -> tuple[tvm.IRModule, int]:
    """A conv2d + bias + ReLU module of ``layer``'s shape after Relax's ``zero`` pipeline (what
    ``apply_cpu_schedules`` receives in a model), and the layer's floating-point operations."""
    n, c, h, w, f, (kh, kw), stride, pad = layer
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, h, w), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = relax.const((rng.standard_normal((f, c, kh, kw)) * 0.1).astype("float32"))
            y = bb.emit(relax.op.nn.conv2d(x, wt, strides=stride, padding=pad))
            y = bb.emit(relax.op.add(y, relax.const(rng.standard_normal((1, f, 1, 1)).astype("float32"))))
            gv = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
        bb.emit_func_output(gv)
    mod = relax.get_pipeline("zero")(bb.get())
    oh = (h + 2 * pad[0] - kh) // stride + 1
    ow = (w + 2 * pad[1] - kw) // stride + 1
    return mod, 2 * n * f * c * kh * kw * oh * ow


def median_seconds(vm, args, repeat: int, min_time: float) -> float:
    """Median over ``repeat`` samples of one call's time; each sample repeats the call until it lasts about
    ``min_time`` (after one warm-up call)."""
    vm["main"](*args)
    t0 = time.perf_counter()
    vm["main"](*args)
    number = max(1, int(min_time / max(time.perf_counter() - t0, 1e-7)))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            vm["main"](*args)
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def bench_layer(name: str, target, repeat: int, min_time: float, default: bool) -> dict:
    """One layer: scheduled (and default) median ms and GFLOP/s; with ``default``, the outputs compared first."""
    mod, flops = layer_module(LAYERS[name])
    shape = [int(d) for d in mod["main"].params[0].ty.shape.values]
    x = [tvm.runtime.tensor(np.random.default_rng(1).standard_normal(shape).astype("float32"))]
    vm_s = relax.VirtualMachine(tvm.compile(apply_cpu_schedules(mod, target), target), tvm.cpu())
    row = {"layer": name, "shape": list(LAYERS[name][:5]), "flops": flops}
    if default:
        vm_d = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
        got, want = vm_s["main"](*x).numpy(), vm_d["main"](*x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name}: scheduled != default build")
        row["max_abs_diff"] = float(np.max(np.abs(got - want)))
    t_s = median_seconds(vm_s, x, repeat, min_time)
    row.update(scheduled_ms=t_s * 1e3, scheduled_gflops=flops / t_s / 1e9)
    if default:
        t_d = median_seconds(vm_d, x, max(3, repeat // 2), min_time / 2)
        row.update(default_ms=t_d * 1e3, default_gflops=flops / t_d / 1e9, speedup=t_d / t_s)
    return row


def parse_target(text: str):
    if text == "host":
        return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    if text.startswith("{"):
        return tvm.target.Target(json.loads(text))
    return tvm.target.Target(text)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="host",
                    help='"host" (llvm with -mcpu of this machine, the default), "llvm", or a JSON target dict')
    ap.add_argument("--layers", default="resnet_3x3_64x56,incv3_3x3_192x35",
                    help=f"comma-separated subset of {sorted(LAYERS)}, or 'all'")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per timing sample (default 0.2)")
    ap.add_argument("--no-default", action="store_true", help="skip the (slow) unscheduled build and the comparison")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    target = parse_target(args.target)
    names = sorted(LAYERS) if args.layers == "all" else args.layers.split(",")
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        ap.error(f"unknown layers {unknown}; known: {sorted(LAYERS)}")
    print(f"target {target}  lanes {vector_lanes(target)}  threads {kernel_threads()}")
    print(f"| layer | scheduled ms | GFLOP/s |{'' if args.no_default else ' default ms | GFLOP/s | speedup |'}")
    print(f"|---|---:|---:|{'' if args.no_default else '---:|---:|---:|'}")
    rows = []
    for name in names:
        r = bench_layer(name, target, args.repeat, args.min_time, not args.no_default)
        rows.append(r)
        line = f"| {name} | {r['scheduled_ms']:.3f} | {r['scheduled_gflops']:.1f} |"
        if "default_ms" in r:
            line += f" {r['default_ms']:.3f} | {r['default_gflops']:.1f} | {r['speedup']:.1f}x |"
        print(line, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": str(target), "threads": kernel_threads(), "repeat": args.repeat,
                       "min_time": args.min_time, "layers": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
