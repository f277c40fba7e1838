"""``tvm-interop schedule``: search an inter-operator schedule for a model under a cost model (no build).

Examples::

    tvm-interop schedule nasnet_a_large --scheduler ios --cost sim:h100 --json
    tvm-interop schedule inception_v3 --scheduler hios --devices 2 --batch 32 -o schedule.json
    tvm-interop schedule synthetic:randwire --scheduler lios --cost sim:v100
    tvm-interop schedule nasnet_a_mobile --scheduler autograph --cost sim:h100 --json

``--scheduler autograph`` rewrites the model (equivalent substitutions, ``passes.substitutions``) and schedules
each candidate with ``--inner-scheduler`` (default ios); it needs the model itself, not a synthetic graph.

``MODEL`` is a zoo model, an ``.onnx`` file, or ``synthetic:<name>`` (a TVM-free stand-in from
``passes.synthetic``: inception_v3, randwire, nasnet_a_large, squeezenet).
"""
from __future__ import annotations

import os

import time

from .common import add_layout_arg, add_model_args, add_rpc_args, fleet_from_args, fleet_line, print_json, progress_logging, status

SCHEDULERS = ("ios", "lios", "hios", "greedy", "sequential", "exhaustive", "autograph")


def register(sub) -> None:
    p = sub.add_parser("schedule", help="search a schedule for a model under a cost model (no build)",
                       description="Search an inter-operator schedule (IOS, LIOS, HIOS, greedy, ...) for a model "
                                   "under a cost model, without building it.",
                       epilog="example: tvm-interop schedule nasnet_a_large --scheduler ios --cost sim:h100 --json")
    add_model_args(p)
    p.add_argument("--scheduler", default="ios", choices=SCHEDULERS, help="scheduler (default ios)")
    p.add_argument("--wave-fusion", action="store_true",
                   help="also choose the stages to fuse into one kernel each (wave fusion) under the same cost "
                        "model; saved in the schedule, applied by `compile --schedule`")
    p.add_argument("--cost", default=None,
                   help="cost model: sim:h100 | sim:h200 | sim:v100 | sim:cpu | sim:h100-tvm | sim:h200-tvm (fitted to TVM's "
                        "default CUDA kernels) | unit | table:FILE | measured (stages "
                        "timed on this CPU) | learned[:rounds=N,seed_stages=N] (XGBoost on timed stages) "
                        "(default: sim:h100, or sim:cpu with --target llvm)")
    p.add_argument("--target", default=None,
                   help="the target of the build the schedule is for (cuda or llvm...): its graph's layout and "
                        "the default cost (sim:h100 / sim:cpu); with --active the target the kernels are built for "
                        "(default cuda)")
    add_layout_arg(p, None, "the layout of the build the schedule is for (default: the --target's, else NCHW under "
                   "GPU costs, as GPU builds keep it, and auto under CPU costs, as `compile` builds)")
    p.add_argument("--cost-cache", default=None,
                   help="measured/learned: persistent cache of stage timings (default: the user cache directory)")
    p.add_argument("--r", type=_limit, default=None, metavar="R",
                   help="ios: max units per group (default 3; 'none' = unbounded)")
    p.add_argument("--s", type=_limit, default=None, metavar="S",
                   help="ios/hios: max groups per stage (default 8; 'none' = unbounded)")
    p.add_argument("--max-states", type=_limit, default=None, metavar="N",
                   help="ios: DP states per part before a block is cut (default 32768 over chains, 800 over kernels; 'none' = never cut)")
    p.add_argument("--granularity", default=None, choices=("auto", "chain", "kernel"),
                   help="schedule units: 'chain' contracts single-consumer chains of kernels (a separable conv is "
                        "one unit), 'kernel' schedules every kernel; default 'auto' = chain for ios/exhaustive, "
                        "kernel for the others")
    p.add_argument("--max-frontier", type=int, default=None, metavar="K",
                   help="ios/exhaustive: block barriers where at most K tensors are live (default 2)")
    p.add_argument("--max-block-states", type=_limit, default=None, metavar="N",
                   help="ios/exhaustive: cut blocks at small frontiers to keep them within N DP states "
                        "(default 4096; 'none' = cut points only)")
    p.add_argument("--no-merge", action="store_true", help="ios: no merge stages")
    p.add_argument("--streams", type=int, default=None, metavar="X", help="lios / greedy: streams (default 8)")
    p.add_argument("--devices", type=int, default=None, metavar="M", help="hios: devices (default 2)")
    p.add_argument("--window", type=int, default=None, metavar="W", help="hios: window size (default 4)")
    p.add_argument("--link-bandwidth", type=float, default=None, help="hios: bytes/s between devices (300e9)")
    p.add_argument("--max-block-size", type=int, default=None, help="cut blocks larger than this (driver)")
    add_rpc_args(p, "--cost measured|learned: time the stages")
    p.add_argument("--inner-scheduler", default=None, choices=SCHEDULERS[:-1],
                   help="autograph: the scheduler of each candidate graph (default ios)")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="autograph: candidates verified under the cost model (default 4); --active: picks "
                        "measured on the device per round (default 3)")
    g = p.add_argument_group("active search on the device (search, measure the picks there, refit, again)")
    g.add_argument("--active", default=None, metavar="DIR",
                   help="run or continue an active device search in DIR: each round builds a profiling bundle of "
                        "what the top-k picks need measured (their new stages and whole programs); with --rpc it "
                        "is measured on the fleet at once, else measure it on the device and --import the table")
    g.add_argument("--import", dest="import_results", default=None, metavar="RESULTS",
                   help="--active: the measured table of the waiting round")
    g.add_argument("--rounds", type=int, default=4, help="--active: rounds at most (default 4)")
    g.add_argument("--clock", default="issue", choices=["issue", "device"],
                   help="--active: price stages and rank programs by the issue clock (calls back to back: a direct "
                        "program) or the device clock (calls behind a held stream: a CUDA graph); default issue")
    g.add_argument("--stand-in", default=None, metavar="TABLE",
                   help="--active: answer every round from this measured cost table instead of a device (its "
                        "stages as measured, whole programs predicted by the fitted program model: "
                        "passes/table_device.py), until the search ships; the directory stays tied to that stand-in")
    p.add_argument("--rules", default=None, metavar="R1,R2",
                   help="autograph: only these substitution rules (default: all; see passes.substitutions.RULES)")
    p.add_argument("--max-part-nodes", type=int, default=None, metavar="N",
                   help="autograph: chains (a conv with its bias and ReLU is one) per subgraph of the flow "
                        "partition (default 24)")
    p.add_argument("-o", "--output", default=None, help="write the schedule JSON here")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--stages", action="store_true", help="print every stage")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


class _Unbounded:
    """Marks a limit given as 'none' on the command line (None means: not given, use the default)."""

    def __repr__(self) -> str:
        return "none"


UNBOUNDED = _Unbounded()


def _limit(text: str):
    if text.lower() in ("none", "inf", "unbounded"):
        return UNBOUNDED
    try:
        return int(text)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"expected an integer or 'none', got {text!r}") from None


def _value(v, default):
    if v is UNBOUNDED:
        return None
    return default if v is None else v


def scheduler_options(args) -> dict:
    """The options the chosen scheduler understands, from the command line."""
    opts: dict = {}
    name = args.scheduler
    if name == "autograph":   # the search's own options, then the options of the scheduler of each candidate
        inner = getattr(args, "inner_scheduler", None) or "ios"
        for key in ("top_k", "rules", "max_part_nodes"):
            if getattr(args, key, None) is not None:
                opts[key] = getattr(args, key)
        opts["scheduler"] = inner
        args.scheduler = inner
        try:
            opts.update(scheduler_options(args))
        finally:
            args.scheduler = "autograph"
        return opts
    if name == "ios":
        opts["r"] = _value(args.r, 3)
        opts["s"] = _value(args.s, 8)
        if args.max_states is not None:
            opts["max_states"] = _value(args.max_states, None)
        if args.no_merge:
            opts["merge"] = False
    if name == "hios":
        if args.devices is not None:
            opts["devices"] = args.devices
        if args.window is not None:
            opts["w"] = args.window
        if args.s is not None:
            opts["s"] = _value(args.s, 8)
        if args.link_bandwidth is not None:
            opts["link_bandwidth"] = args.link_bandwidth
    if args.streams is not None:
        if name == "lios":
            opts["x"] = args.streams
        elif name == "greedy":
            opts["max_streams"] = args.streams
    if args.max_block_size is not None:
        opts["max_block_size"] = args.max_block_size
    if getattr(args, "granularity", None) is not None:
        opts["unit_granularity"] = args.granularity
    if getattr(args, "max_frontier", None) is not None:
        opts["max_frontier"] = args.max_frontier
    if getattr(args, "max_block_states", None) is not None:
        opts["max_block_states"] = _value(args.max_block_states, None)
    return opts


def load_graph(args):
    model = args.model
    if model.startswith("synthetic:"):
        from tvm_interop.passes.synthetic import synthetic_model

        return synthetic_model(model.split(":", 1)[1], batch=args.batch)
    from tvm_interop.api import model_graph

    return model_graph(model, batch_size=args.batch, image_size=args.image_size, width=args.width,
                       layout=schedule_layout(args))


def schedule_layout(args) -> str:
    """``--layout`` when given, else the layout of the build the cost model is for."""
    return args.layout or graph_layout_for_cost(args.cost)


def graph_layout_for_cost(cost: str) -> str:
    """The layout of the graph a schedule is searched on: the one of the build it is for. GPU costs (``sim:h100``,
    ``sim:h200``, ``sim:v100``, device cost tables) schedule NCHW graphs, as GPU builds keep NCHW; CPU costs
    (``sim:cpu``, ``unit``, timed ones) the default CPU layout (``passes.layout``)."""
    spec = str(cost)
    gpu = spec.startswith("table:") or (spec.startswith("sim:") and not spec[4:].startswith("cpu"))
    return "nchw" if gpu else "auto"


def resolve_target(args) -> None:
    """``--target`` of a plain search: the default cost of that device (``sim:h100`` for CUDA, ``sim:cpu`` for
    LLVM) and the layout its build keeps; a cost model of the other kind of device is refused, naming both (a
    schedule searched on another build's graph would not match the build it is for)."""
    from tvm_interop.passes.search import is_timed_cost
    from tvm_interop.passes.target import device_kind
    from tvm_interop.runtime.errors import InteropError

    if not args.target:
        args.cost = args.cost or "sim:h100"
        return
    kind = device_kind(args.target)
    if kind not in ("cuda", "cpu"):
        raise InteropError(f"--target {args.target!r}: a schedule is searched for a cuda or an llvm build")
    gpu = kind == "cuda"
    if args.cost is None:
        args.cost = "sim:h100" if gpu else "sim:cpu"
    spec = str(args.cost)
    cost_gpu = None if spec == "unit" else graph_layout_for_cost(spec) == "nchw"
    if gpu and is_timed_cost(spec):
        raise InteropError(f"--cost {spec} times stages on this CPU; for a --target {args.target} build use a GPU's "
                           "cost: sim:h100, table:FILE (a profiling bundle measured on the GPU) or --active DIR")
    if cost_gpu is not None and cost_gpu != gpu:
        raise InteropError(f"--cost {spec} prices a {'GPU' if cost_gpu else 'CPU'}, but --target {args.target} builds "
                           f"for a {'GPU' if gpu else 'CPU'}: give a cost of that device (default "
                           f"{'sim:h100' if gpu else 'sim:cpu'})")
    if args.layout is None:
        args.layout = "nchw" if gpu else "auto"


def run(args) -> int:
    from tvm_interop.passes.search import is_timed_cost
    from tvm_interop.runtime.errors import InteropError

    if args.clock != "issue" and not args.active:
        raise InteropError("--clock belongs to --active DIR (a cost table's clock is chosen with "
                           "--cost 'table:FILE;clock=device')")
    if args.active:
        if args.stand_in and (args.rpc or args.import_results):
            raise InteropError("--stand-in answers the rounds itself: not with --rpc or --import")
        with fleet_from_args(args) as fleet:
            return _run_active(args, fleet)
    if args.import_results or args.stand_in:
        raise InteropError("--import and --stand-in belong to --active DIR")
    resolve_target(args)
    if args.rpc and not is_timed_cost(args.cost):
        raise InteropError(f"--rpc times stages on remote devices: it needs --cost measured or learned, not "
                           f"{args.cost!r} (for a GPU: profile-bundle, profile-measure --rpc, --cost table:FILE)")
    with fleet_from_args(args) as fleet:
        args.fleet = fleet
        return _run(args)


def _run(args) -> int:
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.runtime.errors import InteropError

    from tvm_interop.passes.search import is_timed_cost, search_schedule, timed_cost_model

    status(args, f"loading {args.model} (batch {args.batch}) ...")
    t0 = time.perf_counter()
    timed = is_timed_cost(args.cost)
    if args.scheduler == "autograph":
        return _run_autograph(args, t0)
    if timed:  # stage costs come from the model's real kernels: prepare (legalize, fuse, CPU schedules) them
        if args.model.startswith("synthetic:"):
            raise InteropError(f"--cost {args.cost} times real kernels; synthetic graphs have none (use sim:...)")
        from tvm_interop.api import load_module, prepare_program

        mod, name = load_module(args.model, batch_size=args.batch, image_size=args.image_size, width=args.width)
        program = prepare_program(mod, "llvm", name=name, layout=schedule_layout(args))
        graph = program.graph
        cost = timed_cost_model(program, "llvm", args.cost, cache=args.cost_cache, batch=args.batch,
                                fleet=args.fleet)
    else:
        graph = load_graph(args)
        cost = get_cost_model(args.cost)
    load_s = time.perf_counter() - t0
    opts = scheduler_options(args)
    status(args, f"scheduling {len(graph)} units with {args.scheduler} under {cost.device_fingerprint} ...")
    t1 = time.perf_counter()
    try:
        with progress_logging(args):
            sched = search_schedule(graph, args.scheduler, cost, model_name=_model_name(args, graph),
                                    batch=args.batch, **opts)
            if args.wave_fusion:   # priced by the same cost model; compile --schedule applies the choice
                from tvm_interop.passes.wave import choose_wave_stages

                choose_wave_stages(graph, sched, cost)
    finally:
        if timed:
            cost.close()
    wall = time.perf_counter() - t1
    return _report(args, sched, graph, cost.device_fingerprint, opts, load_s, wall)


def _run_autograph(args, t0: float) -> int:
    """``--scheduler autograph``: the search needs the model (it rewrites it) and prepares every candidate."""
    from tvm_interop.passes.autograph.driver import run_autograph
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.search import is_timed_cost, timed_cost_model
    from tvm_interop.runtime.errors import InteropError
    from tvm_interop.api import load_module, prepare_program

    if args.model.startswith("synthetic:"):
        raise InteropError("--scheduler autograph rewrites the model itself; a synthetic graph has no model "
                           "(give a zoo model or an .onnx file)")
    mod, name = load_module(args.model, batch_size=args.batch, image_size=args.image_size, width=args.width)
    timed = is_timed_cost(args.cost)
    fixed = None if timed else get_cost_model(args.cost)

    def cost_for(program):
        if timed:
            cm = timed_cost_model(program, "llvm", args.cost, cache=args.cost_cache, batch=args.batch,
                                  fleet=args.fleet)
            return cm, cm.close
        return fixed, lambda: None

    load_s = time.perf_counter() - t0
    opts = scheduler_options(args)
    fingerprint = args.cost if timed else fixed.device_fingerprint
    status(args, f"autograph on {name} under {fingerprint} ...")
    t1 = time.perf_counter()
    with progress_logging(args):
        layout = schedule_layout(args)
        result = run_autograph(mod, prepare=lambda m: prepare_program(m, "llvm", name=name, layout=layout),
                               cost_for=cost_for,
                               device_kind="cpu" if args.cost in ("sim:cpu", "measured") or timed else "cuda",
                               cost_spec=args.cost if timed else fixed, options=opts, model_name=name,
                               batch=args.batch, progress=None if args.quiet else (lambda m: status(args, m)))
    wall = time.perf_counter() - t1
    return _report(args, result.schedule, result.program.graph, fingerprint, opts, load_s, wall)


def _report(args, sched, graph, fingerprint: str, opts: dict, load_s: float, wall: float) -> int:
    """Save and print a schedule (text or ``--json``)."""
    if args.output:
        sched.save(args.output)
    seq = sched.sequential_latency or 0.0
    pred = sched.predicted_latency or 0.0
    search = dict(sched.search)
    summary = {
        "model": sched.model_name,
        "units": len(graph),
        "batch": args.batch,
        "scheduler": args.scheduler,
        "cost": fingerprint,
        "options": {k: v for k, v in opts.items()},
        "predicted_ms": pred * 1e3,
        "sequential_ms": seq * 1e3,
        "speedup": (seq / pred) if pred > 0 else None,
        "num_stages": sched.num_stages,
        "max_concurrency": sched.max_concurrency(),
        "merge_stages": sum(1 for s in sched.stages if s.strategy == "merge"),
        "devices_used": len(set(sched.unit_devices.values())) if sched.unit_devices else 1,
        "unit_granularity": sched.options.get("unit_granularity"),
        "schedule_units": search.get("schedule_units"),
        "blocks": search.get("blocks", []),
        "search": {k: search.get(k) for k in ("states", "transitions", "stages_costed", "seconds", "measurements",
                                              "cache_hits", "active_rounds", "learned_cv_error") if k in search},
        "autograph": search.get("autograph"),
        "substitutions": search.get("substitutions"),
        "load_seconds": load_s,
        "schedule_seconds": wall,
        "output": args.output,
        "wave_fusion": sched.options.get("wave_fusion"),
    }
    fleet = getattr(args, "fleet", None)
    if fleet is not None:
        summary["fleet"] = fleet.report()
    if args.json:
        print_json(summary)
        return 0
    print(f"{sched.model_name}: {len(graph)} units, batch {args.batch}, scheduler {args.scheduler}, "
          f"cost {fingerprint}")
    print(f"predicted {pred * 1e3:.3f} ms, sequential {seq * 1e3:.3f} ms, speedup {summary['speedup']:.3f}x; "
          f"{sched.num_stages} stages, up to {sched.max_concurrency()} concurrent groups, "
          f"{summary['merge_stages']} merge stages")
    blocks = summary["blocks"]
    if blocks:
        sizes = [b["units"] for b in blocks]
        states = [b["states"] for b in blocks if b["states"] is not None]
        print(f"{summary['schedule_units']} schedule units ({summary['unit_granularity']}) in {len(blocks)} blocks "
              f"(largest {max(sizes)} units" + (f", {max(states)} DP states" if states else "") + ")")
    ag = summary["autograph"]
    if ag:
        rules = ", ".join(f"{k} x{v}" for k, v in sorted(ag["rules_applied"].items())) or "none"
        unrewritten = ag.get("unrewritten_latency")
        print(f"autograph: {ag['substitutions_applied']} substitutions ({rules}) over {ag['operators']} operators "
              f"in {ag['parts']} subgraphs; {ag['states']} rewrite states, {ag['candidates']} candidates verified; "
              f"{ag['scheduler']} alone: " + (f"{unrewritten * 1e3:.3f} ms" if unrewritten else "n/a")
              + f"; {ag['total_s']:.1f} s")
    st = summary["search"]
    print(f"search: {st['states']} states, {st['transitions']} transitions, {st['stages_costed']} stage costs, "
          f"{wall:.2f} s" + (f"; {st['measurements']} stages timed, {st['cache_hits']} from the cache"
                             if "measurements" in st else ""))
    for r in st.get("active_rounds", []):
        print(f"  learned round {r['round']}: predicted {r['predicted_ms']:.3f} ms, measured {r['measured_ms']:.3f} ms, "
              f"{r['new_stages_measured']} stages newly timed")
    if fleet is not None:
        print(fleet_line(summary["fleet"]))
    wf = summary["wave_fusion"]
    if wf:
        print(f"wave fusion: {len(wf['stages'])} of {len(wf['decisions'])} concurrent stages priced faster fused "
              f"under {wf['cost']} (stages {wf['stages']})")
        if wf.get("in_order"):
            print(f"  {wf['in_order']}")
    if args.stages:
        print(sched.describe())
    if args.output:
        print(f"wrote {args.output}")
    return 0


def _model_name(args, graph) -> str:
    return graph.name or args.model


def _run_active(args, fleet) -> int:
    """``--active DIR``: the device search of ``passes.device_search`` (one round per call without --rpc)."""
    from tvm_interop.passes.device_search import device_search
    from tvm_interop.api import load_module, prepare_program

    target = args.target or "cuda"
    status(args, f"preparing {args.model} for {target} ...")
    mod, name = load_module(args.model, batch_size=args.batch, image_size=args.image_size, width=args.width)
    program = prepare_program(mod, target, name=name, layout=args.layout or "auto")
    def search(import_path):
        return device_search(program, target, args.active, scheduler=args.scheduler, top_k=args.top_k or 3,
                             rounds=args.rounds, fleet=fleet, import_path=import_path, model_name=name,
                             batch=args.batch, progress=None if args.quiet else (lambda m: status(args, m)),
                             clock=args.clock)

    with progress_logging(args):
        res = search(args.import_results)
        while args.stand_in and res.status == "waiting":
            from tvm_interop.passes.table_device import answer_bundle

            answer = os.path.join(res.bundle, "costs.json")
            got = answer_bundle(res.bundle, args.stand_in, program.graph, out=answer)
            status(args, f"{os.path.basename(res.bundle)} answered by {args.stand_in}: "
                         f"{got['stand_in']['table_stages']} stages from the table, "
                         f"{got['stand_in']['composed_stages']} composed from its units, "
                         f"{len(got['programs'])} programs predicted")
            res = search(answer)
    if res.schedule is not None and args.output:
        res.schedule.save(args.output)
    out = {"status": res.status, "directory": res.directory, "bundle": res.bundle,
           "measure_command": res.measure_command, "history": res.history, "candidates": res.candidates,
           "shipped": None if res.schedule is None else res.schedule.search["device_search"]["shipped"],
           "measured_ms": None if res.schedule is None else res.schedule.measured_latency * 1e3,
           "output": args.output, "fleet": fleet.report() if fleet is not None else None,
           "optimisation_cost": res.cost}
    if args.json:
        print_json(out)
        return 0
    # a stand-in's whole-program numbers are the program model's predictions, not measurements: say so
    measured = "stand-in (program model)" if args.stand_in else "measured"
    for c in res.candidates:
        meas = "not measured yet" if c["measured_ms"] is None else f"{measured} {c['measured_ms']:.3f} ms"
        if c.get("measured_device_ms") is not None:
            meas += f" (device clock {c['measured_device_ms']:.3f} ms)"
        if c.get("measured_dependency_ms") is not None:
            meas += f"; dependency mode {c['measured_dependency_ms']:.3f} ms"
            if c.get("measured_dependency_device_ms") is not None:
                meas += f" (device clock {c['measured_dependency_device_ms']:.3f} ms)"
        print(f"  {c['name']:<16} predicted {c['predicted_ms']:.3f} ms, {meas}")
    if res.status == "waiting":
        print(f"round waiting for the device: {res.measure_command}")
        print(f"then: this command again with --import {res.bundle}/costs.json")
    else:
        print(f"shipped {out['shipped']}: {measured} {out['measured_ms']:.3f} ms on "
              f"{res.schedule.search['device_search']['device']}"
              + (f" -> {args.output}" if args.output else ""))
    print(_cost_line(res.cost, measured))
    return 0


def _cost_line(cost: dict, measured: str) -> str:
    """The search's cost so far, as IOS reports its optimisation cost: host search plus device time."""
    where = "answering from the stand-in" if measured != "measured" else "measuring on the device"
    device = f"{cost['device_seconds']:.1f} s {where}"
    if cost["unrecorded_rounds"] and not cost["search_seconds"]:
        return (f"optimisation cost so far: {device}; the search time of its {cost['unrecorded_rounds']} round(s) "
                "was not recorded (searched before the state kept it)")
    line = (f"optimisation cost so far: {cost['search_seconds']:.1f} s searching here + {device} = "
            f"{cost['search_seconds'] + cost['device_seconds']:.1f} s")
    if cost["unrecorded_rounds"]:
        line += f" ({cost['unrecorded_rounds']} round(s) searched before search times were recorded: not included)"
    return line
