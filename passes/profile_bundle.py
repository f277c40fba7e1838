"""Profiling bundles: every stage a schedule search may cost, built into one library, measured in one batch.

Measuring stages one at a time from the scheduler (``passes.cost.measured``) needs the compiler next to the
device. A GPU machine here has TVM's runtime only, so the work is split:

1. here (compiler): :func:`build_profile_bundle` collects the **candidate stages** and builds them into
   ``bundle.so`` + ``bundle.json``;
2. there (runtime only): ``python -m tvm_interop.runtime.profile_bundle BUNDLE_DIR -o costs.json`` measures all of them (CUDA
   events via TVM's ``time_evaluator`` on a GPU; worker threads and the wall clock on a CPU) and writes a cost
   table;
3. here again: any scheduler with ``cost="table:costs.json"`` (``passes.cost.table``) searches with the measured
   latencies.

Candidate stages (documented choice; each source is recorded per stage):

* ``unit``: every unit alone (the sequential baseline, LIOS's priorities, greedy's ordering);
* ``greedy``, ``lios``: the stages those schedulers build (greedy at ``max_streams``);
* ``wave`` (``BundleOptions.wave``, CLI ``--wave-fusion``): every greedy and lios stage of two or more groups also
  fused into one kernel (``passes.wave``), recorded with ``"strategy": "wave"`` and the fused unit it ``run``s;
* ``ios``: every concurrent stage IOS's dynamic program costs with small pruning (``r`` units per group, ``s``
  groups per stage, default 2 and 3) on blocks of at most ``ios_block`` units (default 8; larger blocks are split
  in topological order, as ``schedule_graph`` does), with the branch-and-bound pruning off (so the set does not
  depend on the costs) and merge stages left out (the lowering does not build merged kernels yet).

The stages are found by running those schedulers with a recording wrapper around a simulated cost model (the
device's preset): whatever a search asks the cost model is what gets built. IOS's DP asks for the same stages
whatever the costs, so an IOS search run against the table with the same options (:func:`ios_options`:
``r``, ``s``, ``max_block_size``, ``merge=False``, ``guard=False``, every partition of an ending tried) finds
every stage it costs in the table; so do sequential
and greedy while no more units are ready than there are streams. LIOS (placement by unit latency), greedy with
more ready units than streams, and IOS's guard (greedy at 1..s streams) form groups from the unit latencies: with
measured latencies those groups can differ from the recorded ones, and such stages use the table's fallback
(``passes.cost.table``: by default composed from the measured unit latencies).

The bundle: for each stage a Relax function ``__tvm_interop_stage<k>(tensors..., streams)`` that launches the
stage's groups on streams exactly as the stage-mode lowering does (fork from the caller's stream, one stream per
group, join), calling the units' kernels directly on tensors passed in (weights included), so nothing is
allocated or embedded per stage and the library stays small; plus the stream-creating functions. The JSON lists
the tensors (shape, dtype), the units (kernel, argument tensors) and the stages.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

import tvm
from tvm import relax

from tvm_interop.runtime.cuda import DL_DEVICE_TYPE, STREAMS_FUNC
from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.profile_bundle import stage_key

from .cost.base import CostModel
from .extract import Program
from .graph import Unit

log = logging.getLogger(__name__)

BUNDLE_FORMAT = "tvm-interop-profile-bundle"
BUNDLE_VERSION = 1
STAGE_FUNC = "__tvm_interop_stage{}"
PROGRAM_FUNC = "__tvm_interop_program{}"
PROGRAM_MODES = ("stage", "dependency")   # how a whole program is issued: the two lowerings of a schedule
LIBRARY = "bundle.so"
PLAN = "bundle.json"


class RecordingCostModel(CostModel):
    """Delegates to ``inner`` and records every concurrent stage asked for, with the ``source`` label."""

    def __init__(self, inner: CostModel, sink: dict, source: str):
        self.inner = inner
        self.sink = sink
        self.source = source
        self.name = inner.name

    def unit_latency(self, unit: Unit) -> float:
        self._record([[unit.name]], "unit")
        return self.inner.unit_latency(unit)

    def stage_latency(self, groups, strategy: str = "concurrent") -> float:
        if strategy == "concurrent":
            names = [[u.name for u in g] for g in groups if len(g)]
            self._record(names, self.source if sum(len(g) for g in names) > 1 else "unit")
        return self.inner.stage_latency(groups, strategy)

    def _record(self, names, source) -> None:
        key = stage_key(names)
        entry = self.sink.get(key)
        if entry is None:
            self.sink[key] = {"groups": [list(g) for g in names], "sources": [source]}
        elif source not in entry["sources"]:
            entry["sources"].append(source)

    @property
    def device_fingerprint(self) -> str:
        return self.inner.device_fingerprint


@dataclass
class BundleOptions:
    max_streams: int = 8
    ios_r: int = 2
    ios_s: int = 3
    ios_block: int = 8
    ios: bool = True
    lios: bool = True
    cost: str | None = None   # the simulated model the searches run with while recording (default: device preset)
    wave: bool = False        # also each greedy / lios stage fused into one kernel (passes.wave), as "wave" stages
    library: bool = False     # also each offloadable unit as its cuDNN / cuBLAS call (passes.offload), "library" stages

    def to_json(self) -> dict:
        return dict(self.__dict__)


def ios_options(options: BundleOptions | None = None) -> dict:
    """The IOS options whose stages a bundle holds; run ``ios`` with these against the table (``bound`` may be on:
    it only skips stages). Every partition of an ending into groups is tried (``group_enum_limit=None``): the
    packing heuristic used otherwise depends on the costs."""
    o = options or BundleOptions()
    return dict(max_block_size=o.ios_block, r=o.ios_r, s=o.ios_s, merge=False, bound=False, guard=False,
                group_enum_limit=None)


def candidate_stages(graph, options: BundleOptions | None = None, device: str = "cpu") -> list[dict]:
    """The stages (``{"groups", "sources"}``) the searches would cost, in a deterministic order."""
    from .cost import get_cost_model
    from .schedulers import available_schedulers, schedule_graph

    options = options or BundleOptions()
    inner = get_cost_model(options.cost or ("sim:cpu" if device == "cpu" else "sim:h100"))
    sink: dict = {}
    for u in graph.units:
        RecordingCostModel(inner, sink, "unit")._record([[u.name]], "unit")
    schedule_graph(graph, "greedy", RecordingCostModel(inner, sink, "greedy"), max_streams=options.max_streams)
    if options.lios and "lios" in available_schedulers():
        schedule_graph(graph, "lios", RecordingCostModel(inner, sink, "lios"), streams=options.max_streams)
    if options.ios:
        schedule_graph(graph, "ios", RecordingCostModel(inner, sink, "ios"), **ios_options(options))
        # IOS's guard compares with greedy at 1..s streams (on the same blocks)
        for k in range(1, options.ios_s + 1):
            schedule_graph(graph, "greedy", RecordingCostModel(inner, sink, "greedy"), max_streams=k,
                           max_block_size=options.ios_block)
    order = {u.name: i for i, u in enumerate(graph.units)}
    stages = list(sink.values())
    stages.sort(key=lambda st: (sum(len(g) for g in st["groups"]) > 1, min(order[u] for g in st["groups"] for u in g),
                                stage_key(st["groups"])))
    return stages


@dataclass
class Bundle:
    directory: str
    plan: dict
    seconds: float = 0.0
    build_notes: list = field(default_factory=list)

    @property
    def num_stages(self) -> int:
        return len(self.plan["stages"])


def _tensor_table(program: Program):
    """Tensor ids for model inputs, constants and unit outputs, and each unit's (kernel, args, outs); also the id
    of each tensor by its :class:`Ref` (what a fused stage's signature names)."""
    from tvm_interop.runtime.plan import Ref

    tensors: list[dict] = []
    ids: dict[Ref, int] = {}

    def tid(ref: Ref, info) -> int:
        if ref not in ids:
            ids[ref] = len(tensors)
            name = f"{ref.unit}/{ref.index}" if ref.kind == "unit" else str(ref.index)
            tensors.append({"shape": [int(d) for d in info[0]], "dtype": str(info[1]), "kind": ref.kind,
                            "name": name})
        return ids[ref]

    units: dict[str, dict] = {}
    for name, uc in program.calls.items():
        args = []
        for ref in uc.args:
            if ref.kind == "input":
                info = program.input_infos[ref.index]
                args.append(tid(ref, (info.shape, info.dtype)))
            elif ref.kind == "const":
                c = program.constants[ref.index]
                args.append(tid(ref, (c.shape, c.dtype)))
            elif ref.kind == "unit":
                info = program.calls[ref.unit].outputs[ref.index]
                args.append(tid(ref, (info.shape, info.dtype)))
            else:
                raise InteropError(f"unit {name}: a tuple argument cannot be profiled")
        outs = [tid(Ref.unit(name, k), (o.shape, o.dtype)) for k, o in enumerate(uc.outputs)]
        units[name] = {"func": uc.func_name, "args": args, "outs": outs}
        if uc.is_library:   # a cuDNN / cuBLAS call (passes.offload): its integer parameters come first
            units[name]["params"] = list(uc.params)
    return tensors, units, ids


def _build_stage_module(program: Program, stages: list[dict], units: dict, tensors: list[dict], device: str,
                        num_streams: int, programs: list[dict] | None = None) -> tvm.IRModule:
    """One Relax function per stage (its groups forked onto streams and joined, as the stage-mode lowering does)
    and one per whole program (``programs``: its stages in order, in one function, so that it is timed as it
    runs: back to back, without a host round trip between stages). Every function issues the waits, stream
    switches and kernels that ``lower_streams.plan_streams`` plans for the lowering, in stage or dependency mode,
    so that a bundle times what a library would issue."""
    from .lower_streams import MAIN, ProgramEmitter, i32_value, plan_streams  # the lowering's own plan and helpers
    from .schedule import Schedule, Stage

    em = ProgramEmitter(program, device)
    bb = em.bb
    int64 = tvm.ir.PrimType("int64")
    prim_gvs = {gv.name_hint: gv for gv, f in program.mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}

    def tensors_of(stage_groups) -> list[int]:
        used: list[int] = []
        for groups in stage_groups:
            for g in groups:
                for u in g:
                    for t in units[u]["args"] + units[u]["outs"]:
                        if t not in used:
                            used.append(t)
        return used

    def plan(stage_groups, mode: str) -> list:
        """The lowering's ops for these stages; no keep-alive releases: a bundle's tensors are its arguments,
        never reused storage. In stage mode every stage is planned on its own, so the stages need not form a
        schedule of the program (a bundle's stage functions repeat units): one plan serves them all."""
        sched = Schedule([Stage(groups) for groups in stage_groups])
        return plan_streams(program, sched, mode=mode, num_streams=num_streams, keep_alive=False).ops

    def emit_unit(u: str, params) -> None:
        spec = units[u]
        tensor_args = [params[t] for t in spec["args"] + spec["outs"]]
        if "params" in spec:
            bb.emit(em.packed(spec["func"], relax.ShapeExpr(spec["params"]), *tensor_args), name_hint=u)
        else:
            bb.emit(relax.Call(prim_gvs[spec["func"]], tensor_args), name_hint=u)

    def emit_ops(ops, params, streams) -> None:
        """Issue ``ops``; the caller's stream is read once, before the first wait or switch that needs it (a
        function of one-group stages issues its kernels and nothing else)."""
        named: dict[int, relax.Expr] = {}

        def stream(i: int) -> relax.Expr:
            if not named:
                named[MAIN] = bb.emit(relax.Call(em.current_stream_gv(),
                                                 [i32_value(DL_DEVICE_TYPE.get(device, 1)), i32_value(0)]),
                                      name_hint="main_stream")
                for j in range(num_streams):
                    named[j] = bb.emit(relax.TupleGetItem(streams, j), name_hint=f"stream{j}")
            return named[i]

        for op in ops:
            if op.kind == "sync":
                bb.emit(em.packed("runtime.Device_StreamSyncFromTo", em.dev, stream(op.a), stream(op.b)),
                        name_hint="event")
            elif op.kind == "set":
                bb.emit(em.packed("runtime.Device_SetStream", em.dev, stream(op.a)), name_hint="switch")
            elif op.kind == "unit":
                emit_unit(op.unit, params)

    def emit_function(name: str, stage_groups, ops) -> list[int]:
        used = tensors_of(stage_groups)
        params = {t: relax.Var(f"t{t}", relax.TensorType(tensors[t]["shape"], tensors[t]["dtype"])) for t in used}
        streams = relax.Var("streams", relax.TupleType([int64] * num_streams))
        with bb.function(name, [params[t] for t in used] + [streams], pure=False):
            emit_ops(ops, params, streams)
            bb.emit_func_output(relax.Tuple([]))
        return used

    # a wave stage runs its fused kernel (``run``), keyed by the groups it fuses
    runs = [st.get("run", st["groups"]) for st in stages]
    stage_ops: list[list] = [[] for _ in stages]
    for op in plan(runs, "stage"):
        stage_ops[op.stage].append(op)
    for k, st in enumerate(stages):
        st["tensors"] = emit_function(STAGE_FUNC.format(k), [runs[k]], stage_ops[k])
        st["function"] = STAGE_FUNC.format(k)
    for k, pr in enumerate(programs or []):
        pr["tensors"] = emit_function(PROGRAM_FUNC.format(k), pr["stages"], plan(pr["stages"], pr.get("mode", "stage")))
        pr["function"] = PROGRAM_FUNC.format(k)
    em.emit_stream_funcs(num_streams)
    built = bb.get()
    funcs = {gv: f for gv, f in program.mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    for gv, f in built.functions.items():
        funcs[gv] = f
    return tvm.IRModule(funcs)


LIBRARY_UNIT = "{}@library"


def _add_library_stages(program: Program, units: dict, notes: list) -> list[dict]:
    """For every unit that cuDNN / cuBLAS can compute (``passes.offload``), its library call as a unit of its own
    and a ``"library"`` stage that runs it alone, keyed ``library:<unit>`` in the cost table: the measurement that
    ``units="auto"`` chooses by, and that the table prices library units with. Needs the native extension."""
    from .offload import plan_offload

    report = plan_offload(program, "cudnn")
    stages = []
    for name, call in report.offloaded.items():
        spec = units[name]
        lib = LIBRARY_UNIT.format(name)
        units[lib] = {"func": call.func, "params": list(call.params), "args": [spec["args"][i] for i in call.arg_index],
                      "outs": list(spec["outs"])}
        stages.append({"groups": [[name]], "sources": ["library"], "strategy": "library", "run": [[lib]]})
    if report.refused:
        notes.append(f"{len(report.refused)} convolution/matmul unit(s) have no library call (e.g. "
                     f"{next(iter(report.refused.values()))})")
    log.info("profile bundle: %d library stages", len(stages))
    return stages


WAVE_SOURCES = ("greedy", "lios")   # the stages whose fused form a bundle holds (IOS's thousands would each be a kernel)
WAVE_UNIT = "__wave{}"


def _add_wave_stages(program: Program, stages: list[dict], units: dict, ids: dict, target, notes: list):
    """For each multi-group stage from :data:`WAVE_SOURCES`, its fused kernel (``passes.wave``) as a unit of its
    own and a ``"wave"`` stage calling it, timed like any stage and keyed ``wave:...`` in the cost table. A stage
    that does not fuse whole is left out (the note says why): the table prices only what the build would run."""
    import dataclasses

    from .wave.kernel import build_wave_kernel
    from .wave.lowered import NotFusable

    from tvm_interop.runtime.plan import Ref

    bb = relax.BlockBuilder(program.mod)
    fused = []
    for st in stages:
        if len(st["groups"]) < 2 or not set(st["sources"]) & set(WAVE_SOURCES):
            continue
        try:
            kern = build_wave_kernel(program, st["groups"], target)
        except NotFusable as why:
            notes.append(f"wave stage {stage_key(st['groups'])} left out: {why}")
            continue
        k = len(fused)
        gv = bb.add_func(kern.func, f"wave_stage{k}")
        name = WAVE_UNIT.format(k)
        units[name] = {"func": gv.name_hint, "args": [ids[r] for r in kern.signature.inputs],
                       "outs": [ids[Ref.unit(u, i)] for u, i in kern.signature.outputs]}
        fused.append({"groups": [list(g) for g in st["groups"]], "sources": list(st["sources"]), "strategy": "wave",
                      "run": [[name]]})
    log.info("profile bundle: %d fused (wave) stages", len(fused))
    return dataclasses.replace(program, mod=bb.get()), fused


def _export_bundle_library(ex, path: str, arches: list[str] | None, addons: list[str]) -> None:
    """Write the bundle's library. A CUDA bundle carries its kernels as fatbins (``passes.cuda_compile``), like a
    compiled model: the machine that measures it has TVM's runtime only, which cannot compile CUDA source."""
    if arches:
        from .cuda_compile import export_cuda_library

        export_cuda_library(ex, path, arches, addons=addons or None)
        return
    from tvm_interop.runtime.model import export_library

    export_library(ex, path, **({"addons": addons} if addons else {}))


def _native_addons(target, units: dict, notes: list) -> list:
    """The native extension's object, linked into a CUDA bundle: library units call it, and the device clock
    (``runtime.device_clock``: held-stream device times beside ``time_evaluator``'s) needs it. A bundle without
    library units is still built where the extension cannot be (no CUDA headers): measured, it has the issue
    clock only, and the note says why."""
    if target.kind.name != "cuda":
        return []
    from .native_build import NativeBuildError
    from .offload import ensure_extension

    try:
        return [ensure_extension()["object"]]
    except NativeBuildError as e:
        if any("params" in spec for spec in units.values()):
            raise
        notes.append(f"no device clock in this bundle (the native extension did not build: {e})")
        return []


def build_profile_bundle(program: Program, target, out_dir: str, options: BundleOptions | None = None,
                         stages: list[dict] | None = None, programs: list[dict] | None = None) -> Bundle:
    """Collect the candidate stages of ``program`` (or take ``stages``), build them for ``target`` into
    ``out_dir/bundle.so`` and write ``out_dir/bundle.json``. ``programs``: whole schedules to time as well
    (``{"name", "stages": [[group, ...], ...], "mode"}``, concurrent stages only, in order), each one function,
    issued as the stage-mode lowering does (``mode`` "stage", the default) or the dependency-mode one."""
    from .cuda_build import build_cuda
    from .target import normalize_target, target_text
    from .target import device_kind

    t0 = time.perf_counter()
    options = options or BundleOptions()
    target = normalize_target(target)
    device = device_kind(target)
    graph = program.graph
    if stages is None:
        stages = candidate_stages(graph, options, device)
    stages = [{"groups": [list(g) for g in st["groups"]], "sources": list(st.get("sources", []))} for st in stages
              if st.get("strategy", "concurrent") == "concurrent"]
    programs = [{"name": str(pr["name"]), "stages": [[list(g) for g in groups] for groups in pr["stages"]],
                 "mode": str(pr.get("mode", "stage"))} for pr in (programs or [])]
    bad = sorted({pr["mode"] for pr in programs} - set(PROGRAM_MODES))
    if bad:
        raise InteropError(f"unknown program mode {bad[0]!r}: a bundle times programs in {', '.join(PROGRAM_MODES)} "
                           "mode")
    widest = max([len(st["groups"]) for st in stages]
                 + [len(groups) for pr in programs for groups in pr["stages"]], default=1)
    from .lower_streams import resolve_stream_count

    num_streams = resolve_stream_count(options.max_streams, widest)
    tensors, units, ids = _tensor_table(program)
    notes: list = []
    if options.wave:
        program, fused = _add_wave_stages(program, stages, units, ids, target, notes)
        stages = stages + fused
    if options.library:
        if target.kind.name != "cuda":
            raise InteropError("library stages (cuDNN / cuBLAS units) need a CUDA target")
        stages = stages + _add_library_stages(program, units, notes)
    mod = _build_stage_module(program, stages, units, tensors, device, num_streams, programs)
    arches = None
    if target.kind.name == "cuda":
        ex, report = build_cuda(mod, target, cuda_graph=False)
        notes += report.notes
        arches = report.arches
    else:
        from .wave.cpu_pipeline import compile_with_waves

        ex = compile_with_waves(mod, target)
    os.makedirs(out_dir, exist_ok=True)
    addons = _native_addons(target, units, notes)
    _export_bundle_library(ex, os.path.join(out_dir, LIBRARY), arches, addons)
    plan = {
        "format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "model": graph.name,
        "graph_fingerprint": graph.fingerprint(), "target": target_text(target),
        "device": device, "library": LIBRARY, "num_streams": num_streams, "options": options.to_json(),
        "streams_function": STREAMS_FUNC, "tensors": tensors, "units": units, "stages": stages,
        "programs": programs, **({"cuda_arches": list(arches)} if arches else {}),
    }
    from .schedule import atomic_write_text

    atomic_write_text(os.path.join(out_dir, PLAN), json.dumps(plan, indent=1))
    seconds = time.perf_counter() - t0
    log.info("profile bundle: %d stages (%d units) built for %s in %.1f s", len(stages), len(units), device, seconds)
    return Bundle(out_dir, plan, seconds, notes)
