"""``tvm-interop compile``: model in, scheduled deployable .so (and schedule JSON) out."""
from __future__ import annotations

import os
import sys
import time

from .common import add_layout_arg, add_model_args, add_rpc_args, fleet_from_args, fleet_line, print_json, progress_logging, status


def register(sub) -> None:
    p = sub.add_parser("compile", help="compile a model with an inter-operator schedule into a .so",
                       description="Compile a zoo model or ONNX file with an inter-operator schedule.",
                       epilog="example: tvm-interop compile inception_v3 --target llvm --scheduler greedy -o m.so")
    add_model_args(p)
    p.add_argument("--target", default="llvm", help="TVM target (default llvm)")
    p.add_argument("--arch", default=None,
                   help="CUDA targets: GPU arches to carry binaries for, e.g. sm_80,sm_90 (default: the target's, "
                        "sm_90)")
    p.add_argument("--scheduler", default="greedy", help="sequential | greedy | ios | lios | hios | autograph (substitutions + ios) "
                        "(default greedy)")
    p.add_argument("--cost", default=None,
                   help="cost model for the scheduler: sim:cpu | sim:h100 | ... | table:FILE | measured (stages timed "
                        "on this CPU) | learned[:rounds=N] (XGBoost on timed stages); timed costs turn the "
                        "never-slower guard on")
    p.add_argument("--guard", default="auto", choices=["auto", "on", "off"],
                   help="CPU: never ship a schedule slower than sequential. auto (default): sequential ships when "
                        "the cost model predicts the schedule slower, else the schedule is timed against sequential "
                        "and the faster ships (a --schedule file ships as given); on: always timed; off: ship what "
                        "the scheduler found")
    p.add_argument("--groups-in-order", default="auto", choices=["auto", "on", "off"],
                   help="CPU: run each stage's concurrent groups one after another, every kernel on all cores (the "
                        "Relax VM), instead of on worker threads. auto (default): for a program that --wave-fusion "
                        "or merges rewrote, the guard times both (and sequential) and builds the fastest; on: "
                        "always; off: never")
    p.add_argument("--tuning-db", default=None, help="use MetaSchedule-tuned kernels from this database "
                   "(written by `tvm-interop tune`)")
    p.add_argument("--schedule", default=None, help="use this schedule JSON instead of running a scheduler")
    fuse = p.add_mutually_exclusive_group()
    fuse.add_argument("--wave-fusion", action="store_true",
                      help="compile each concurrent stage that the cost model prices faster fused into one kernel "
                           "(Rammer's wave fusion: one parallel region per wave on a CPU, one launch on a GPU)")
    fuse.add_argument("--flow-fusion", action="store_true",
                      help="CUDA: compile every run of consecutive stages that can share a launch as one persistent "
                           "launch whose blocks wait only for their producers; the library keeps the schedule "
                           "unfused beside it, and the device's picker runs the faster")
    p.add_argument("--units", default="tvm", choices=["tvm", "cudnn", "auto"],
                   help="CUDA: run convolutions / dense layers as TVM kernels (tvm, default) or as cuDNN / cuBLAS "
                        "calls (cudnn: every one the libraries compute exactly; auto: per unit, the faster by "
                        "device measurement, else the library); the summary lists the units left to TVM and why")
    p.add_argument("--tf32", action="store_true",
                   help="let cuDNN / cuBLAS units use TF32 tensor cores (PyTorch's default for convolutions)")
    p.add_argument("--sync", default="tvm", choices=["tvm", "events"],
                   help="CUDA: order streams with TVM's per-call event (tvm, default) or with events created once per "
                        "loaded model and reused (events: the native extension, linked into the library)")
    add_layout_arg(p, "auto", "CPU (default auto)")
    p.add_argument("--mode", default="stage", choices=["stage", "dependency"], help="synchronisation mode")
    p.add_argument("--max-streams", type=int, default=8, help="streams / worker threads at most (default 8)")
    p.add_argument("--max-memory-ratio", type=_memory_ratio, default=1.5, metavar="R",
                   help="bound the activation memory at R times the sequential program's (default 1.5; none: no "
                        "bound): stages over it are split, down to the sequential order")
    p.add_argument("--no-candidates", dest="candidates", action="store_false", default=None,
                   help="GPU targets: do not carry the alternative programs (other mode, sequential, direct/graph) "
                        "that the runtime picks from by measurement")
    add_rpc_args(p, "run the never-slower guard (and --cost measured|learned's timing)")
    p.add_argument("-o", "--output", default=None, help="write the deployable library here (.so)")
    p.add_argument("--schedule-out", default=None, help="write the schedule JSON here")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def _memory_ratio(text: str) -> float | None:
    """``--max-memory-ratio``: a ratio >= 1, or ``none``."""
    import argparse

    if text.lower() in ("none", "off"):
        return None
    try:
        ratio = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 or 'none', got {text!r}") from None
    if not ratio >= 1.0:
        raise argparse.ArgumentTypeError(f"must be >= 1 (the sequential program's own memory), got {text!r}")
    return ratio


def _wave_summary(s) -> dict | None:
    """What wave fusion did: stages priced, fused (as built), groups that could not join (see the schedule file)."""
    wf = s.options.get("wave_fusion")
    if not wf:
        return None
    built = s.options.get("waves", [])
    return {"fusable": len(wf.get("decisions", [])), "chosen": len(wf.get("stages", [])),
            "fused": sum(1 for r in built if r.get("fused")), "cost": wf.get("cost"),
            "left_unfused": sum(len(r.get("left", [])) for r in built if r.get("fused")),
            "restaged": wf.get("restaged"), "in_order": wf.get("in_order")}


def _flow_summary(s) -> dict | None:
    """What flow fusion did: the runs of stages built as one launch each, and the stages left as scheduled."""
    if not s.options.get("flow_fusion"):
        return None
    records = s.options.get("flow", [])
    runs = [r for r in records if r.get("units")]
    return {"runs": len(runs), "stages_fused": sum(len(r["stages"]) for r in runs),
            "launches": sum(r.get("members", 0) for r in runs), "blocks": sum(r.get("tasks", 0) for r in runs),
            "stages_left": sum(len(r["stages"]) for r in records if not r.get("units")),
            "reasons": sorted({why for r in records for why in r.get("reasons", [])})}


def run(args) -> int:
    import tvm_interop
    from tvm_interop.runtime.cpu_threads import kernel_threads

    status(args, f"compiling {args.model} for {args.target} with scheduler {args.scheduler} ...")
    with progress_logging(args), fleet_from_args(args) as fleet:
        cm = tvm_interop.compile(args.model, target=args.target, scheduler=args.scheduler, cost=args.cost,
                                 schedule=args.schedule, mode=args.mode, batch_size=args.batch,
                                 image_size=args.image_size, width=args.width, max_streams=args.max_streams,
                                 tuning_db=args.tuning_db, candidates=args.candidates, cuda_arch=args.arch,
                                 guard={"auto": None, "on": True, "off": False}[args.guard], fleet=fleet,
                                 fusion="wave" if args.wave_fusion else "flow" if args.flow_fusion else None,
                                 units=args.units, tf32=args.tf32,
                                 sync=args.sync, layout=args.layout, max_memory_ratio=args.max_memory_ratio,
                                 groups_in_order={"auto": None, "on": True, "off": False}[args.groups_in_order])
        fleet_report = fleet.report() if fleet is not None else None
    if args.schedule_out:
        cm.schedule.save(args.schedule_out)
    export_seconds = None
    if args.output:
        t_export = time.perf_counter()
        cm.export(args.output)
        export_seconds = time.perf_counter() - t_export
    s = cm.schedule
    mem_error = None
    try:   # activation memory in TVM's memory plan: scheduled (streams) vs sequential
        mem = cm.memory_report()
    except Exception as e:  # noqa: BLE001 - a report about what was built; the outputs are written already
        # once (2026-11-29, a wave-fused Inception-v3 lios build) TVM's pipeline failed on the built program's plain
        # main here (FuseTIR: "expected 12, provided 10": TVM's FuseOps regrouping our kernels, since kept from it by
        # passes.keep_kernels) after the library had been written: a failure here says so, not a traceback
        mem_error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else e}"
        mem = {"scheduled_bytes": None, "sequential_bytes": None}
        print(f"warning: the activation memory report failed ({mem_error}); the library and schedule were built "
              "and written", file=sys.stderr)
    summary = {
        "model": s.model_name, "target": cm.target, "scheduler": s.scheduler, "units": len(cm.graph),
        "shipped_because": s.search.get("shipped_because"), "rejected_scheduler": s.search.get("guard_rejected"),
        "stages": s.num_stages, "max_concurrency": s.max_concurrency(), "cost": s.device,
        "groups_in_order": bool(s.options.get("groups_in_order")), "executor": cm.runner.executor,
        "predicted_ms": None if s.predicted_latency is None else s.predicted_latency * 1e3,
        "sequential_predicted_ms": None if s.sequential_latency is None else s.sequential_latency * 1e3,
        "activation_bytes": cm.plan.storage_bytes(), "compile_seconds": cm.timings,
        "activation_scheduled_bytes": mem["scheduled_bytes"], "activation_sequential_bytes": mem["sequential_bytes"],
        "activation_report_error": mem_error,
        "output": args.output, "export_seconds": export_seconds, "schedule_out": args.schedule_out,
        "candidates": [c["name"] for c in cm.plan.meta.get("candidates", [])],
        "guard": None if cm.guard is None else {**cm.guard.to_json(), "device": s.search.get("guard_device")},
        "fleet": fleet_report,
        "wave_fusion": _wave_summary(s),
        "flow_fusion": _flow_summary(s),
        "memory_bound": None if cm.memory is None else cm.memory.to_json(),
        "kernel_threads": kernel_threads() if "llvm" in str(cm.target) else None,
        "library_units": None if cm.offload is None else cm.offload.to_json(),
        "layout": cm.layout,
        "gpu_estimate": cm.gpu_estimate(),
    }
    if args.json:
        print_json(summary)
    else:
        print(f"{s.model_name}: {len(cm.graph)} units -> {s.num_stages} stages (scheduler {s.scheduler}, "
              f"max {s.max_concurrency()} concurrent groups)")
        print(f"target: {cm.target}")
        if summary["groups_in_order"]:
            print(f"groups in order: each stage's {s.max_concurrency()} concurrent groups at most run one after "
                  f"another, every kernel on all cores ({cm.runner.executor} executor)")
        if cm.layout["layout"] == "nchwc":
            lay = cm.layout
            print(f"layout: NCHW{lay['block']}c activations: {lay['blocked_convs']} of {lay['convs']} convolutions "
                  "channel-blocked (the others' channels do not divide the block, or they are grouped)")
        if summary["kernel_threads"] is not None:
            print(f"kernel threads: {summary['kernel_threads']} per kernel call (TVM_NUM_THREADS; default: one per "
                  "physical core of this process)")
        if s.predicted_latency is not None:
            print(f"predicted by {s.device}: {s.predicted_latency * 1e3:.3f} ms "
                  f"(sequential {s.sequential_latency * 1e3:.3f} ms)")
        est = summary["gpu_estimate"]
        if est:
            progs = ", ".join(f"{label} {t['direct']:.3f} / {t['cuda_graph']:.3f}" for label, t in est["programs"].items())
            print(f"expected on an H100 with TVM's default kernels (program model on {est['cost']}; ms direct / "
                  f"CUDA graph): {progs}")
        if summary["shipped_because"]:
            rejected = f" instead of {summary['rejected_scheduler']}" if summary["rejected_scheduler"] else ""
            print(f"shipped: {s.scheduler}{rejected}: {summary['shipped_because']}")
        if fleet_report is not None:
            print(fleet_line(fleet_report))
        if cm.offload is not None:
            print(cm.offload.summary())
            reasons: dict[str, int] = {}
            for why in cm.offload.refused.values():
                short = why.split(": ", 1)[-1]
                reasons[short] = reasons.get(short, 0) + 1
            for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:5]:
                print(f"  left to TVM ({n}): {why}")
        bound = summary["memory_bound"]
        if bound and (bound["tightened"] or bound["sequential_fallback"]):
            what = ("the sequential order ships" if bound["sequential_fallback"]
                    else f"stages split to at most {bound['max_groups']} groups")
            print(f"memory bound {bound['limit']:.2f}x: the searched schedule needed more; {what} "
                  f"({bound['ratio']:.2f}x the sequential activation memory; --max-memory-ratio changes the bound)")
        if summary["wave_fusion"] is not None:
            wf = summary["wave_fusion"]
            print(f"wave fusion: {wf['fused']} of {wf['fusable']} concurrent stage(s) fused into one kernel each "
                  f"(priced by {wf['cost']}); {wf['left_unfused']} group(s) left beside their fused kernel")
            if wf["restaged"]:
                print(f"  the choice was restaged: {wf['restaged']}")
            if wf["in_order"]:
                print(f"  {wf['in_order']}")
        if summary["flow_fusion"] is not None:
            ff = summary["flow_fusion"]
            print(f"flow fusion: {ff['runs']} run(s) of {ff['stages_fused']} stage(s) in one launch each "
                  f"({ff['launches']} kernel launches, {ff['blocks']} blocks); {ff['stages_left']} stage(s) left as "
                  "scheduled (the reasons are in the schedule file)")
        runs_on = cm.runner.executor   # the executor a run of this library uses: its memory is the one that counts
        print(f"activation memory, threads executor's buffers (its own plan for this schedule): "
              f"{cm.plan.storage_bytes() / 2**20:.2f} MiB{'  <- runs this library' if runs_on == 'threads' else ''}")
        if mem_error is None:
            print(f"activation memory, TVM's memory plan as built (VM executor): scheduled "
                  f"{mem['scheduled_bytes'] / 2**20:.2f} MiB vs sequential {mem['sequential_bytes'] / 2**20:.2f} MiB"
                  f"{'  <- runs this library' if runs_on == 'vm' else ''}")
        phases = ", ".join(f"{k.replace('_', ' ')} {v:.1f} s" for k, v in cm.timings.items() if k != "total")
        print(f"compile {cm.timings['total']:.1f} s ({phases})")
        if summary["candidates"]:
            print(f"candidate programs ({len(summary['candidates'])}, the device picks the fastest at first run or "
                  f"with `tvm-interop pick`): {', '.join(summary['candidates'])}")
        if args.output:
            print(f"wrote {args.output} ({os.path.getsize(args.output) / 2**20:.1f} MiB, {export_seconds:.1f} s)")
        if args.schedule_out:
            print(f"wrote {args.schedule_out}")
    cm.close()
    return 0
