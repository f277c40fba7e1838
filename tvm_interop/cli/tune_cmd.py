"""``tvm-interop tune``: MetaSchedule-tune a model's kernels into a database that ``compile --tuning-db`` uses."""
from __future__ import annotations

import sys

from .common import add_layout_arg, add_model_args, add_rpc_args, fleet_from_args, fleet_line, print_json, status

EPILOG = """examples:
  tvm-interop tune inception_v3 --target llvm --trials 64 --db tuned/incv3
  tvm-interop tune squeezenet --trials 16 --db tuned/sq --ops conv2d --json
  python -c "import tvm_interop; tvm_interop.compile('inception_v3', tuning_db='tuned/incv3')"
  tvm-interop tune resnet50 --target "llvm -mcpu=skylake-avx512" --db tuned/r50 --rpc tracker:9190 --device-key xeon

--trials is per kernel (task). Re-running continues: kernels that already have --trials records are skipped,
others get the missing trials. Ctrl-C leaves the database usable; run the same command again to continue.
"""


def register(sub) -> None:
    p = sub.add_parser("tune", help="tune the model's kernels with MetaSchedule into a database directory",
                       description="Tune every unique kernel of a model with MetaSchedule (evolutionary search, "
                                   "XGBoost cost model) into a resumable JSON database.",
                       epilog=EPILOG, formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--target", default="llvm", help="TVM target (default llvm)")
    add_layout_arg(p, "auto", "CPU: the layout of the build the kernels are tuned for; `compile --tuning-db` "
                   "uses them with the same --layout (default auto)")
    p.add_argument("--trials", type=int, default=64, help="measured candidates per kernel (default 64)")
    p.add_argument("--db", required=True, help="database directory (created; reused to continue)")
    p.add_argument("--ops", default=None,
                   help="comma-separated substrings: tune only kernels whose name contains one (e.g. conv2d)")
    p.add_argument("--per-iter", type=int, default=64, help="candidates per measurement batch (default 64)")
    p.add_argument("--threads", type=int, default=None,
                   help="search threads and the target's num-cores (default: physical cores)")
    p.add_argument("--cost-model", default="xgb", choices=["xgb", "random"], help="search cost model (default xgb)")
    p.add_argument("--no-baselines", action="store_true", help="do not time the untuned kernels")
    p.add_argument("--seed", type=int, default=None, help="random seed of the search")
    add_rpc_args(p, "time the candidates")
    g = p.add_argument_group("tuning in rounds across a machine boundary (no compiler or no link needed there)")
    g.add_argument("--bundle", default=None, metavar="DIR",
                   help="export one round of candidates (--per-iter per kernel) into DIR instead of timing them; "
                        "time them on the device with `python -m tvm_interop.runtime.tuning_bundle DIR -o R.json`")
    g.add_argument("--import", dest="import_results", default=None, metavar="RESULTS",
                   help="import a measured round (R.json) into --db and teach the cost model; then --bundle again")
    g.add_argument("--device-cores", type=int, default=None,
                   help="--bundle with a CPU target: the device's cores (the target's num-cores)")
    p.add_argument("--json", action="store_true", help="print a JSON report")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args) -> int:
    import time

    from tvm_interop.passes.kernels.tuning import tune_program

    from ..api import load_module, prepare_program

    if args.import_results:
        return _import(args)
    t0 = time.perf_counter()
    status(args, f"preparing {args.model} ...")
    mod, name = load_module(args.model, batch_size=args.batch, image_size=args.image_size, width=args.width)
    program = prepare_program(mod, args.target, name=name, layout=args.layout)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    if args.bundle:
        return _export(args, program, ops, name)
    progress = False if (args.quiet or args.json) else None  # None: progress lines only on a terminal
    try:
        with fleet_from_args(args) as fleet:
            report = tune_program(program, args.target, args.db, args.trials, op_names=ops,
                                  num_trials_per_iter=args.per_iter, cost_model=args.cost_model,
                                  num_threads=args.threads, seed=args.seed, baselines=not args.no_baselines,
                                  quiet=args.quiet or args.json, progress=progress, fleet=fleet)
    except KeyboardInterrupt as e:
        partial = e.args[1] if len(e.args) > 1 else None
        if partial is not None and not args.json:
            print(partial.table())
        print(f"tvm-interop tune: interrupted; the database in {args.db} is consistent, run the same command to "
              "continue", file=sys.stderr)
        return 130
    total = time.perf_counter() - t0
    fleet_report = getattr(args, "fleet_report", None)
    if args.json:
        print_json({"model": name, **report.to_dict(), "total_seconds": total, "fleet": fleet_report})
    else:
        print(f"{name}: {len(report.tasks)} kernel(s), target {args.target}, database {args.db}")
        print(report.table())
        print(f"total time {total:.1f} s (tuning {report.seconds:.1f} s)")
        if fleet_report is not None:
            print(fleet_line(fleet_report))
    return 0


def _export(args, program, ops, name: str) -> int:
    from tvm_interop.passes.kernels.tuning_bundle import export_round

    if args.rpc:
        from tvm_interop.runtime.errors import InteropError

        raise InteropError("--bundle is for a device without a link to this machine; --rpc times candidates "
                           "directly (use one or the other)")
    status(args, f"proposing up to {args.per_iter} candidate(s) per kernel of {name} ...")
    out = export_round(program, args.target, args.db, args.bundle, args.trials, per_round=args.per_iter,
                       op_names=ops, num_threads=args.threads, target_cores=args.device_cores,
                       cost_model=args.cost_model, seed=args.seed)
    if args.json:
        print_json({"model": name, **out})
    elif out["done"]:
        print(f"{name}: every kernel has {args.trials} trials (or its search space is exhausted); nothing to export")
    else:
        print(f"{name}: {out['candidates']} candidates for {len(out['per_task'])} kernel(s) -> {out['bundle']} "
              f"({out['seconds']:.1f} s)")
        print(f"on the device: python -m tvm_interop.runtime.tuning_bundle {out['bundle']} -o results.json")
        print(f"then here:     tvm-interop tune {args.model} --db {args.db} --import results.json")
    return 0


def _import(args) -> int:
    from tvm_interop.passes.kernels.tuning_bundle import import_results

    out = import_results(args.db, args.import_results, num_threads=args.threads, cost_model=args.cost_model)
    if args.json:
        print_json(out)
    else:
        print(f"round {out['round']}: {out['records']} records ({out['failed']} failed, {out['missing']} missing "
              f"from the results) for {out['tasks']} kernel(s) measured on {out['device']} -> {args.db}")
    return 0
