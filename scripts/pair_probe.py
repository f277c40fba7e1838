#!/usr/bin/env python3
"""A schedule that runs a model one kernel at a time except for chosen pairs of independent kernels, each pair
alone in its own stage: a controlled experiment on how two kernels share the GPU.

    python scripts/pair_probe.py nasnet_a_large -o pairs.json [--width W --image-size S] [--per-kind 6] [--base ios]

Why: the kernel timelines of whole programs (``gpu_check run --timeline``) show *that* a kernel grew beside
others, not which neighbour did it: in NASNet-A-large's ios graph a 4032 -> 672 1x1 convolution (44 thread blocks
of 128 threads) took 3.7x its time alone, while two of them side by side took 1.0x (H200, 2026-11-28,
``docs/gpu_kernel_check_h200_2026-11-28b.md``). No sharing rule fitted on those totals ordered NASNet-A-large's
programs right. In this schedule every stage but the pairs holds one kernel, and a stage's kernels start together
and nothing else runs until both are done (stage mode joins every stage), so the spans of a profiled call
(``kernel_profile.last_call_spans``) time each member of each pair beside exactly one known neighbour; the same
run's ``sequential + CUDA graph`` times each alone. ``scripts/gpu_kernel_check.py`` reads the pairs off such a run.

The pairs are kernels that a concurrent schedule runs side by side: ios's under ``sim:h100``, as ``gpu_check
build`` schedules it. Each of its stages is replayed as pairs of its groups' heads and single kernels. The pairs
cover the combinations of kernel kinds that schedule offers (deep and shallow 1x1 convolutions, depthwise and other
spatial convolutions, pools, and the rest: element-wise kernels, concatenations, pads), up to ``--per-kind`` pairs
each. The rarest combination goes first, then the most work (FLOPs plus bytes moved, a proxy for time: nothing
here is measured).
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tvm_interop.passes.cost.program import conv_weight_shape, is_deep  # noqa: E402


def pair_kind(unit) -> str:
    """The kind of a unit for pairing: ``deep_1x1``, ``shallow_1x1``, ``depthwise``, ``spatial``, ``pool`` or
    ``other``."""
    ws = conv_weight_shape(unit)
    if ws is None:
        return "pool" if "pool" in unit.kind else "other"
    if ws[2] * ws[3] == 1:
        return "deep_1x1" if is_deep(unit) else "shallow_1x1"
    return "depthwise" if ws[1] == 1 else "spatial"


def _weight(unit) -> float:
    return float(unit.flops) + float(unit.bytes_moved)


def pair_stages(graph, base, per_kind: int = 6) -> tuple[list[list[list[str]]], dict[str, int]]:
    """The stages (each a list of groups) of the probe schedule and the pairs made per kind pair.

    ``base`` is a concurrent schedule of ``graph`` (ios's, by default): its stages say which kernels can run side
    by side. Each base stage is replayed as a sequence of stages: while a group has kernels left, the heads of two
    groups whose kind pair still has fewer than ``per_kind`` pairs (the rarest kind pair first, then the most work)
    run together in a two-group stage, else the first head runs alone. Chains keep their order and stages their
    boundaries, so every dependency the base schedule respects, the probe respects too."""
    units = {u.name: u for u in graph.units}
    made: dict[str, int] = {}
    stages: list[list[list[str]]] = []
    for st in base.stages:
        queues = [list(g) for g in st.groups]
        while any(queues):
            heads = [(i, q[0]) for i, q in enumerate(queues) if q]
            best, best_rank = None, None
            for (i, a), (j, b) in itertools.combinations(heads, 2):
                key = "+".join(sorted((pair_kind(units[a]), pair_kind(units[b]))))
                if made.get(key, 0) >= per_kind:
                    continue
                rank = (made.get(key, 0), -(_weight(units[a]) + _weight(units[b])))
                if best is None or rank < best_rank:
                    best, best_rank = (i, j, key), rank
            if best is None:
                i, a = heads[0]
                stages.append([[a]])
                queues[i].pop(0)
                continue
            i, j, key = best
            made[key] = made.get(key, 0) + 1
            stages.append([[queues[i].pop(0)], [queues[j].pop(0)]])
    return stages, made


def probe_schedule(graph, base, model_name: str, per_kind: int = 6):
    """The probe as a :class:`Schedule` for ``graph`` from the concurrent schedule ``base`` (validated; its options
    record the pairs per kind pair and the base scheduler)."""
    from tvm_interop.passes.schedule import Schedule, Stage

    stages, made = pair_stages(graph, base, per_kind)
    sched = Schedule(stages=[Stage(groups=g) for g in stages], graph_fingerprint=graph.fingerprint(),
                     model_name=model_name, scheduler="pair_probe", device="any",
                     options={"pairs": dict(sorted(made.items())), "per_kind": per_kind, "base": base.scheduler})
    sched.validate(graph)
    return sched


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a zoo model")
    ap.add_argument("-o", "--out", required=True, help="the schedule file to write")
    ap.add_argument("--width", type=float, default=1.0)
    ap.add_argument("--image-size", type=int, default=None)
    ap.add_argument("--per-kind", type=int, default=6, help="pairs per pair of kernel kinds (default 6)")
    ap.add_argument("--base", default="ios", help="the scheduler whose stages say what can run together (default ios)")
    ap.add_argument("--cost", default="sim:h100", help="its cost model (default sim:h100, as gpu_check build)")
    args = ap.parse_args(argv)
    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model

    kw = {"width": args.width, **({"image_size": args.image_size} if args.image_size else {})}
    program = prepare_program(get_model(args.model, **kw), {"kind": "cuda", "arch": "sm_90"}, name=args.model)
    from tvm_interop.passes.schedulers import schedule_graph

    base = schedule_graph(program.graph, args.base, args.cost, model_name=args.model)
    sched = probe_schedule(program.graph, base, args.model, args.per_kind)
    sched.save(args.out)
    pairs = sched.options["pairs"]
    print(f"{args.model}: {sum(pairs.values())} pairs in {sched.num_stages} stages: "
          + ", ".join(f"{k} {n}" for k, n in pairs.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
