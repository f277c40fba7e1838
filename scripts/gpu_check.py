#!/usr/bin/env python3
"""GPU check of tvm-interop: correctness and batch-1 latency of the zoo on an NVIDIA GPU.

The GPU machine has TVM's *runtime* only (no compiler), so the check is split (``scripts/gpu_check.sh`` wraps
the three steps; its header has the exact recipe for this workplace's device tool):

``build`` (here, with the compiler; no GPU needed)
    For each zoo model: prepare it once, then build for CUDA (sm_90, nvcc)

    * ``<model>.plain.so`` -- **plain TVM**: the prepared module (``relax.get_pipeline("zero")``) through TVM's
      default CUDA pipeline (DLight schedules): ``main`` with direct launches and ``main_graph``, the same
      program rewritten by TVM's own ``RewriteCUDAGraph``. Its outputs on the GPU are the reference.
    * ``<model>.sched.so`` -- the **scheduled** programs: for each scheduler (sequential, greedy, lios, ios;
      cost ``sim:h100`` unless ``--cost``) the stream-lowered program, with and without CUDA graph
      (``<sched>__stage____tvm_interop_main`` / ``..._main_graph``), all in one library sharing the kernels.

    Weights are **parameters** (``main(x, *weights)``), generated on the device from a seed, so the libraries
    carry kernels only, and they are stored xz-compressed (``.so.xz``, ~40x smaller; the carry limit is 64 MiB). A ``manifest.json`` lists models, shapes, weights, the
    functions to run and what was decided (streams, CUDA graph or why not). Also written: the runtime-only TVM
    package (``tvm_kit.tar.xz``, the ``tvm`` Python package without ``libtvm_compiler.so``), the Python 3.12 wheel
    of ``apache-tvm-ffi`` (``whl/``), and for each model a small op list that PyTorch can run eagerly.

``run`` (there: runtime only, ``TVM_USE_RUNTIME_LIB=1``)
    Loads the libraries with ``tvm.runtime.load_module`` and ``runtime/`` (``runtime.cuda`` loads TVM's CUDA
    runtime), computes the reference with the plain build, checks every variant's output against it, and
    measures batch-1 latency: wall clock of one call plus a device sync, median of ``--repeat`` (>= 100) runs
    after ``--warmup`` runs. PyTorch eager (the same network from the op list, cuDNN) when ``torch`` with CUDA
    is importable. Writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out``.

    Then, per scheduler, the candidate programs a compiled library would carry (that scheduler's variants and
    the sequential ones) are timed again interleaved and chosen as ``runtime.picker`` does: the report says what
    ships and that it is never slower than sequential. The report records device, driver, nvcc, TVM, Python.

``diagnose`` (there: runtime only)
    Every concurrent variant runs ``--runs`` times on the same inputs, then again in a child process with
    ``CUDA_LAUNCH_BLOCKING=1``; each is classified exact / racy / wrong (``gpu_check_diagnose.json`` / ``.md``).

``report`` (here)
    Copies a run's JSON into ``docs/gpu_check.json`` and renders ``docs/gpu_check.md``.
"""
from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
for p in (REPO, HERE):
    if p not in sys.path:
        sys.path.insert(0, p)

from gpucheck.common import DEFAULT_DIR, SCHEDULERS  # noqa: E402
from gpucheck.report import cmd_report  # noqa: E402
from gpucheck.run import torch_runner  # noqa: E402,F401 - the PyTorch baseline, for tests and callers


def cmd_build(args) -> int:
    from gpucheck.build import cmd_build as build

    return build(args)


def cmd_run(args) -> int:
    from gpucheck.run import cmd_run as run

    return run(args)


def cmd_diagnose(args) -> int:
    from gpucheck.diagnose import cmd_diagnose as diagnose

    return diagnose(args)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="here: cross-compile the zoo for CUDA + manifest + runtime kit")
    b.add_argument("--dir", default=DEFAULT_DIR)
    b.add_argument("--models", default="all", help="comma-separated zoo names, or all")
    b.add_argument("--width", type=float, default=1.0)
    b.add_argument("--image-size", type=int, default=None, help="default: each model's")
    b.add_argument("--depth", type=int, default=None, help="default: each model's (paper) depth")
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--target", default="cuda -arch=sm_90")
    b.add_argument("--schedulers", default=",".join(SCHEDULERS))
    b.add_argument("--modes", default="stage,dependency", help="stage, dependency or both (comma-separated)")
    b.add_argument("--cost", default="sim:h100")
    b.add_argument("--max-streams", type=int, default=8)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--no-kit", action="store_true", help="skip the runtime kit and the wheel (local dry runs)")
    b.set_defaults(func=cmd_build)
    r = sub.add_parser("run", help="there: runtime only; check and time every variant")
    r.add_argument("--dir", default=DEFAULT_DIR)
    r.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    r.add_argument("--repeat", type=int, default=200)
    r.add_argument("--warmup", type=int, default=20)
    r.add_argument("--models", default=None)
    r.add_argument("--pick-rounds", type=int, default=30,
                   help="interleaved rounds of the candidate pick per scheduler (0: skip)")
    r.set_defaults(func=cmd_run)
    g = sub.add_parser("diagnose", help="there: run concurrent variants repeatedly, and serialized; find races")
    g.add_argument("--dir", default=DEFAULT_DIR)
    g.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    g.add_argument("--runs", type=int, default=4)
    g.add_argument("--models", default=None)
    g.add_argument("--serialized", action="store_true", help=argparse.SUPPRESS)
    g.set_defaults(func=cmd_diagnose)
    q = sub.add_parser("report", help="here: docs/gpu_check.json + .md from a run's JSON")
    q.add_argument("result")
    q.set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    if getattr(args, "repeat", 100) < 100:
        p.error("--repeat must be >= 100 (median of at least 100 runs)")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
