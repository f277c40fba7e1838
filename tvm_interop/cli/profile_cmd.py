"""``tvm-interop profile-bundle`` / ``profile-measure``: build every candidate stage of a model into one library,
measure them all in one batch, and schedule with the measured table.

    tvm-interop profile-bundle inception_v3 --target cuda -o bundle/        # here (needs the compiler, no GPU)
    python -m tvm_interop.runtime.profile_bundle bundle/ -o costs.json                  # on the GPU machine (runtime only)
    tvm-interop profile-measure bundle/ -o costs.json                       # or here, on this machine's device
    tvm-interop profile-measure bundle/ -o costs.json --rpc HOST:9190 --device-key h100   # or on a fleet
    tvm-interop compile inception_v3 --target cuda --scheduler ios --cost table:costs.json -o m.so
"""
from __future__ import annotations

import sys

from .common import add_model_args, add_rpc_args, fleet_from_args, fleet_line, print_json, status


def register(sub) -> None:
    p = sub.add_parser(
        "profile-bundle", help="build every stage a schedule search may cost into one .so + plan JSON",
        description="Build the candidate stages of a model (each unit alone, the greedy / lios stages, and every "
                    "stage IOS costs with small r, s on small blocks) into BUNDLE_DIR/bundle.so and bundle.json, "
                    "to be measured in one batch by `python -m tvm_interop.runtime.profile_bundle` (runtime only) or "
                    "`tvm-interop profile-measure`.",
        epilog="example: tvm-interop profile-bundle squeezenet --target cuda -o bundle/")
    add_model_args(p)
    p.add_argument("--depth", type=int, default=None, help="zoo models: repeat count (see `tvm-interop models`)")
    p.add_argument("--target", default="llvm", help="TVM target: llvm, cuda, 'cuda -arch=sm_90' (default llvm)")
    p.add_argument("-o", "--output", required=True, help="bundle directory to write")
    p.add_argument("--max-streams", type=int, default=8, help="streams / groups per stage at most (default 8)")
    p.add_argument("--ios-r", type=int, default=2, help="IOS enumeration: units per group at most (default 2)")
    p.add_argument("--ios-s", type=int, default=3, help="IOS enumeration: groups per stage at most (default 3)")
    p.add_argument("--ios-block", type=int, default=8, help="IOS enumeration: block size at most (default 8)")
    p.add_argument("--no-ios", action="store_true", help="leave out the IOS stages")
    p.add_argument("--wave-fusion", action="store_true",
                   help="also the greedy and lios stages fused into one kernel each (wave fusion), so that "
                        "`compile --wave-fusion --cost table:...` can price them")
    p.add_argument("--library-units", action="store_true",
                   help="CUDA: also every offloadable convolution / dense layer as its cuDNN / cuBLAS call, so that "
                        "`compile --units auto --cost table:...` picks per unit by measurement")
    p.add_argument("--measure", action="store_true", help="also measure here, writing BUNDLE_DIR/costs.json")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run_bundle)

    m = sub.add_parser("profile-measure", help="measure a profiling bundle on this machine (writes a cost table)",
                       epilog="example: tvm-interop profile-measure bundle/ -o costs.json")
    m.add_argument("bundle", help="bundle directory written by `tvm-interop profile-bundle`")
    m.add_argument("-o", "--output", default=None, help="cost table (default BUNDLE/costs.json)")
    m.add_argument("--device", default=None, choices=["cpu", "cuda"])
    m.add_argument("--method", default=None, choices=["vm", "threads"])
    m.add_argument("--repeat", type=int, default=20)
    m.add_argument("--number", type=int, default=10)
    m.add_argument("--warmup", type=int, default=3)
    m.add_argument("--no-device-clock", action="store_true",
                   help="GPU: time with the issue clock only (calls back to back), not also with the device clock "
                        "(calls queued behind a held stream: what a stage costs in a CUDA graph)")
    m.add_argument("--chunk", type=int, default=None,
                   help="--rpc: stages per fleet item (default: about four items per device, at most 64 stages)")
    add_rpc_args(m, "measure the stages")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=run_measure)


def run_bundle(args) -> int:
    import os

    from tvm_interop.passes.profile_bundle import BundleOptions, build_profile_bundle
    from tvm_interop.api import load_module, prepare_program

    kw = {"depth": args.depth} if args.depth is not None else {}
    status(args, f"preparing {args.model} ...")
    mod, name = load_module(args.model, batch_size=args.batch, image_size=args.image_size, width=args.width, **kw)
    from tvm_interop.passes.target import normalize_target

    target = normalize_target(args.target)
    program = prepare_program(mod, target, name=name)
    opts = BundleOptions(max_streams=args.max_streams, ios_r=args.ios_r, ios_s=args.ios_s,
                         ios_block=args.ios_block, ios=not args.no_ios, wave=args.wave_fusion,
                         library=args.library_units)
    status(args, f"building the candidate stages of {name} ({len(program.graph)} units) for {args.target} ...")
    bundle = build_profile_bundle(program, target, args.output, opts)
    summary = {"model": name, "units": len(program.graph), "stages": bundle.num_stages,
               "num_streams": bundle.plan["num_streams"], "target": bundle.plan["target"], "output": args.output,
               "seconds": bundle.seconds,
               "sources": _count_sources(bundle.plan["stages"])}
    if args.measure:
        from tvm_interop.runtime.profile_bundle import measure_bundle

        out = os.path.join(args.output, "costs.json")
        table = measure_bundle(args.output, out=out)
        summary["cost_table"] = out
        summary["measure_seconds"] = table["seconds"]
    if args.json:
        print_json(summary)
    else:
        print(f"{name}: {bundle.num_stages} candidate stages ({', '.join(f'{k} {v}' for k, v in summary['sources'].items())})"
              f" built for {summary['target']} in {bundle.seconds:.1f} s -> {args.output}")
        if args.measure:
            print(f"measured in {summary['measure_seconds']:.1f} s -> {summary['cost_table']}")
        else:
            print(f"measure with: python -m tvm_interop.runtime.profile_bundle {args.output} -o costs.json", file=sys.stderr)
    return 0


def _count_sources(stages) -> dict:
    out: dict = {}
    for st in stages:
        for s in st.get("sources", []):
            out[s] = out.get(s, 0) + 1
    return out


def run_measure(args) -> int:
    from tvm_interop.runtime.profile_bundle import measure_bundle

    import os

    out = args.output or os.path.join(args.bundle, "costs.json")
    with fleet_from_args(args) as fleet:
        if fleet is None:
            table = measure_bundle(args.bundle, device=args.device, method=args.method, repeat=args.repeat,
                                   number=args.number, warmup=args.warmup, out=out,
                                   device_clock=False if args.no_device_clock else None)
        else:
            from tvm_interop.passes.fleet.bundle import measure_bundle_on_fleet

            table = measure_bundle_on_fleet(args.bundle, fleet, method=args.method, device=args.device,
                                            repeat=args.repeat, number=args.number, warmup=args.warmup,
                                            chunk=args.chunk, out=out,
                                            device_clock=False if args.no_device_clock else None)
    summary = {"stages": len(table["stages"]), "device": table["device"], "method": table["method"],
               "seconds": table["seconds"], "output": out, "fleet": table.get("fleet"),
               "device_clock": table.get("device_clock")}
    if args.json:
        print_json(summary)
    else:
        print(f"measured {summary['stages']} stages on {summary['device']} ({summary['method']}) in "
              f"{summary['seconds']:.1f} s -> {out}")
        if summary["fleet"]:
            print(fleet_line(summary["fleet"]))
        clock = summary["device_clock"]
        if clock and "skipped" in clock:
            print(f"no device clock: {clock['skipped']}")
        elif clock:
            print(f"device clock: {clock['held']} held runs, {clock['not_held']} not held; "
                  f"{clock['stages_without']} stages without a device time")
    return 0
