#!/usr/bin/env python3
"""GPU check of tvm-interop: correctness and batch-1 latency of the zoo on an NVIDIA GPU, and the race check.

The GPU machine has TVM's *runtime* only (no ``libtvm_compiler.so``, no nvcc), so the check is split: everything
that needs the compiler happens here, the device only loads and runs. ``scripts/gpu_check.sh`` wraps the steps
(its header has the exact recipe for this workplace's device tool); the code is in ``scripts/gpucheck/``.

``build`` (here, with the compiler and nvcc; no GPU needed) -- :mod:`gpucheck.build`
    For each zoo model: prepare it once, then build for CUDA (``--target``, default sm_90)

    * ``<model>.plain.so`` -- **plain TVM**: the prepared module through TVM's default CUDA pipeline (DLight
      schedules): ``main`` with direct launches and ``main_graph``, the same program rewritten by TVM's own
      ``RewriteCUDAGraph``. Its outputs on the GPU are the reference.
    * ``<model>.sched.so`` -- the **scheduled** programs: for each scheduler (sequential, greedy, lios, ios;
      cost ``sim:h100`` unless ``--cost``) and mode (stage, dependency) the stream-lowered program, with and
      without CUDA graph, all in one library sharing the kernels.

    ``--unit-costs MODELS`` adds to each model a profiling bundle of its units (on CUDA each offloadable one also
    as its library call), which ``run`` measures into ``unit_costs/<model>.json``; ``--auto MODEL=TABLE`` builds
    from such a table the entry ``MODEL+auto`` (``units="auto"``: per unit, whichever measured faster). The
    per-unit choice thus takes two device calls, with a build here between them.

    Every direct stage-mode variant (TVM's sync, not merged, not wave-fused) also gets a timed twin in the same
    library (``lower_program(stage_timing=True)``: a timing event at every stage boundary), which ``run`` calls to
    record each stage's cost inside the program (``in_context``; ``--no-stage-times`` leaves the twins out).

    ``--schedule MODEL:LABEL=FILE`` (repeatable) adds a schedule made elsewhere (``tvm-interop schedule -o``: the pick
    of an active device search, ``--active``) as the variants ``LABEL``, checked against the model like any schedule.

    ``--tuned MODEL=DIR`` (repeatable) adds the entry ``MODEL+tuned``: the same libraries built with the kernels of a
    MetaSchedule database (tuned through ``tvm-interop tune --bundle``/``--import`` rounds or ``--rpc``), so one run
    compares default and tuned kernels, each against its own plain TVM reference.

    Kernels are compiled by nvcc into fatbins (``passes.cuda_compile``) and every library is checked to hold no
    CUDA source, so nothing is compiled when the device loads it. Weights are **parameters** (``main(x,
    *weights)``), generated on the device from a seed, so the libraries carry kernels only; they are stored
    xz-compressed (the carry limit is 64 MiB). Also written: ``manifest.json`` (models, shapes, weights, the
    functions to run, the kernels' formats, what was decided: streams, CUDA graph or why not), the runtime-only TVM
    package (``tvm_kit.tar.xz``), the Python 3.12 wheel of ``apache-tvm-ffi`` (``whl/``), and for each model its
    graph JSON (``tvm_interop.export.graph_to_json``) for the PyTorch baseline.

``run`` (there: runtime only, ``TVM_USE_RUNTIME_LIB=1``) -- :mod:`gpucheck.run`
    Refuses (exit 2, before loading anything) a library that holds CUDA source. Loads the libraries with
    ``tvm.runtime`` and ``runtime/`` (``runtime.cuda`` loads TVM's CUDA runtime), computes the reference with the
    plain build, checks every variant's output against it, and measures batch-1 latency: wall clock of one call
    plus a device sync, median of ``--repeat`` (>= 100) runs after ``--warmup`` runs. Then, per scheduler, the
    candidates a compiled library would carry are timed interleaved and chosen as ``runtime.picker`` does (what
    ships, never slower than sequential). PyTorch eager on the same network when ``torch`` with CUDA is importable:
    the graph JSON rebuilt by the one Relax->torch interpreter (``tvm_interop/export/torch_interp.py``, loaded
    without the compiler-side ``tvm_interop`` package: :mod:`gpucheck.torch_replay`). Writes ``gpu_check.json``
    and ``gpu_check.md`` into ``--out``.

``diagnose`` (there: runtime only) -- :mod:`gpucheck.diagnose`
    Every concurrent variant runs ``--runs`` (4) times on the same inputs: run-to-run spread and error against
    plain TVM; then the same in a child process with ``CUDA_LAUNCH_BLOCKING=1``. Each variant is exact / racy
    (not exact concurrently, exact serialized) / wrong (wrong even serialized): ``gpu_check_diagnose.json`` /
    ``.md``. This is the check that found the keep-alive race on the H100.

Both device-side reports record the environment (device, compute capability, SMs, driver, CUDA driver API and
runtime, nvcc or "not found", TVM, Python, PyTorch; :func:`gpucheck.device.environment`, runtime-only queries)
and ``runtime_only``: whether libtvm_compiler was loaded and which compiler-only modules were imported (none).

``report`` (here) -- :mod:`gpucheck.report`
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
from gpucheck.build import torch_program  # noqa: E402,F401 - graph JSON of a model (compiler side)
from gpucheck.torch_replay import torch_runner  # noqa: E402,F401 - its PyTorch replay (runtime side)


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
    b.add_argument("--sync", default="tvm",
                   help="how scheduled variants order their streams: tvm (TVM's per-call event, the default), events "
                        "(reused events of the native extension), or both (tvm,events: each scheduled variant twice, "
                        "'[events]' in its name, so the run compares them; the 2026-11-26 H100 run did)")
    b.add_argument("--waits", default="stage-start,consumer",
                   help="where dependency-mode variants issue their cross-stream waits: stage-start (today's "
                        "lowering), consumer (the builds before 2026-11-27), or both (default: the consumer "
                        "placement as extra variants, '[waits at consumer]' in their names, so the run compares them)")
    b.add_argument("--no-stage-times", dest="stage_times", action="store_false",
                   help="leave out the timed twins: by default every direct stage-mode variant (TVM's sync, no merge, "
                        "no wave) is also built with in-context stage timing, and the run records what each of its "
                        "stages cost inside the program ('in_context' of the variant)")
    b.add_argument("--no-probe", dest="probe", action="store_false",
                   help="leave out the host-cost probe (gpucheck/probe.py: per kernel launch, TVM sync, reused-event "
                        "sync, stream switch and keep-alive call, each measured alone; a few seconds on the device)")
    b.add_argument("--cudnn", default="all", metavar="MODELS",
                   help="comma-separated models (or all, the default; '' for none) that also get an entry "
                        "MODEL+cudnn: every offloadable convolution / dense layer as a cuDNN / cuBLAS call")
    b.add_argument("--tf32", action="store_true", help="also an entry MODEL+cudnn+tf32 per +cudnn entry: cuDNN / cuBLAS may use TF32")
    b.add_argument("--tuned", action="append", default=[], metavar="MODEL=DIR",
                   help="also build MODEL with the kernels of this tuning database (`tvm-interop tune --bundle/"
                        "--import` or `--rpc`): a second entry MODEL+tuned, every variant with tuned kernels")
    b.add_argument("--schedule", action="append", default=[], metavar="MODEL:LABEL=FILE",
                   help="also build this schedule JSON (`tvm-interop schedule -o`, e.g. the pick an active device "
                        "search shipped) as MODEL's variants LABEL, LABEL (dependency), ... beside the schedulers'")
    b.add_argument("--splitk", default="", metavar="MODELS",
                   help="comma-separated models (or all) that also get an entry MODEL+splitk: convolutions with few "
                        "outputs and long reductions scheduled by passes.kernels.gpu_splitk (a thread group per "
                        "output) instead of DLight's GEMM tiles; not measured yet, so opt-in")
    b.add_argument("--unit-costs", default="", metavar="MODELS",
                   help="comma-separated models (or all) that also get a unit bundle: every unit alone and, on CUDA, "
                        "every offloadable one as its cuDNN / cuBLAS call; the run measures it into "
                        "unit_costs/MODEL.json, the table --auto builds with")
    b.add_argument("--auto", action="append", default=[], metavar="MODEL=TABLE",
                   help="also an entry MODEL+auto: each offloadable unit as the library call where TABLE (a run's "
                        "unit_costs/MODEL.json) measured it faster than the TVM kernel (units=\"auto\")")
    b.set_defaults(func=cmd_build)
    r = sub.add_parser("run", help="there: runtime only; check and time every variant")
    r.add_argument("--dir", default=DEFAULT_DIR)
    r.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    r.add_argument("--repeat", type=int, default=200)
    r.add_argument("--warmup", type=int, default=20)
    r.add_argument("--models", default=None)
    r.add_argument("--pick-rounds", type=int, default=30,
                   help="interleaved rounds of the candidate pick per scheduler (0: skip)")
    r.add_argument("--no-cudnn-engines", action="store_true",
                   help="skip the pass that re-times the library entries with cuDNN's measured engines")
    r.add_argument("--no-kernel-profile", action="store_true",
                   help="skip the per-kernel profiles (torch.profiler) of PyTorch eager and of our sequential "
                        "library programs")
    r.add_argument("--timeline", action="append", default=[], metavar="VARIANT",
                   help="also profile this variant of every model that has it (e.g. 'lios (dependency) + CUDA "
                        "graph'; repeatable): its kernels' summed device time, the time at least one ran and their "
                        "concurrency, after every timing (needs PyTorch with CUDA)")
    r.set_defaults(func=cmd_run)
    g = sub.add_parser("diagnose", help="there: run concurrent variants repeatedly, and serialized; find races")
    g.add_argument("--dir", default=DEFAULT_DIR)
    g.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    g.add_argument("--runs", type=int, default=4)
    g.add_argument("--models", default=None)
    g.add_argument("--serialized", action="store_true", help=argparse.SUPPRESS)
    g.set_defaults(func=cmd_diagnose)
    q = sub.add_parser("report", help="here: docs/gpu_check.json + .md from a run's JSON (or several runs' of "
                                      "one build on one device, split by --models: one report)")
    q.add_argument("result", nargs="+")
    q.add_argument("--name", default="gpu_check",
                   help="docs/NAME.json + .md (default gpu_check; another name keeps an earlier run's report)")
    q.set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    if getattr(args, "repeat", 100) < 100:
        p.error("--repeat must be >= 100 (median of at least 100 runs)")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
