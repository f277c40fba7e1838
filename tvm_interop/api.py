"""The Python front door: ``tvm_interop.compile(...)`` and helpers to load models and graphs."""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace

import numpy as np

from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.model import ScheduledModel

log = logging.getLogger("tvm_interop")


def _target_device_kind(target) -> str:
    from tvm_interop.passes.target import device_kind

    return device_kind(target)


def _target_text(target) -> str:
    """A short, stable spelling of a target for plans and reports (``llvm``, ``cuda -arch=sm_90``)."""
    from tvm_interop.passes.target import target_text

    return target_text(target)


def load_module(model, batch_size: int = 1, image_size: int | None = None, width: float = 1.0,
                shape_dict: dict | None = None, **model_kwargs):
    """Return (IRModule, name) for a zoo model name, an ``.onnx`` path, or an IRModule."""
    import tvm

    if isinstance(model, tvm.IRModule):
        return model, model_kwargs.get("name", "model")
    if isinstance(model, str) and model.endswith(".onnx"):
        from .frontends import from_onnx

        return from_onnx(model, shape_dict=shape_dict), os.path.splitext(os.path.basename(model))[0]
    if isinstance(model, str):
        from .models import get_model

        try:
            return get_model(model, batch_size=batch_size, image_size=image_size, width=width, **model_kwargs), model
        except ValueError as e:
            raise InteropError(str(e)) from None
    raise InteropError(f"cannot load a model from {type(model).__name__}; give a zoo name, an .onnx path or an IRModule")


def prepare_program(mod, target="llvm", name: str = "model", cpu_schedule: bool = True, layout: str = "auto"):
    """prepare (legalize + fuse, default CPU schedules on CPU targets) then extract: the Program and its OpGraph.

    ``layout``: ``auto`` (channel-blocked activations on CPU, ``passes.layout``), ``nchw`` or ``nchwc``; a schedule
    made for one layout's graph does not apply to the other's."""
    from tvm_interop.passes.extract import extract
    from tvm_interop.passes.prepare import prepare

    return extract(prepare(mod, target, cpu_schedule=cpu_schedule, layout=layout), name=name)


def model_graph(model, batch_size: int = 1, image_size: int | None = None, width: float = 1.0,
                layout: str = "auto", **kw):
    """The OpGraph of a zoo model / ONNX file / IRModule (what the schedulers see) as a CPU build prepares it;
    ``layout="nchw"`` gives the graph of a GPU build (GPU targets keep NCHW; ``passes.layout``)."""
    mod, name = load_module(model, batch_size=batch_size, image_size=image_size, width=width, **kw)
    return prepare_program(mod, name=name, layout=layout).graph


@dataclass
class CompiledModel:
    """Result of ``compile``: run it, inspect its schedule, export it."""

    runner: ScheduledModel
    schedule: object
    program: object = field(repr=False)
    target: str = "llvm"
    timings: dict = field(default_factory=dict)
    max_streams: int = 8
    guard: object = None  # passes.guard.GuardResult when the never-slower guard ran
    memory: object = None  # passes.memory_bound.MemoryReport (activation bytes vs sequential, bound applied)
    offload: object = None  # passes.offload.OffloadReport: units run as cuDNN / cuBLAS calls, the others and why
    # what was lowered and built: ``program``/``schedule`` with merge stages applied (passes.merge); the same
    # objects as ``program``/``schedule`` when the schedule has no merge stage
    built_program: object = field(default=None, repr=False)
    built_schedule: object = field(default=None, repr=False)

    def run(self, *inputs, numpy: bool = True):
        return self.runner.run(*inputs, numpy=numpy)

    @property
    def layout(self) -> dict:
        """The activation layout built (``passes.layout``): ``{"layout": "nchw"}`` or ``{"layout": "nchwc",
        "block": c, "blocked_convs": k, "convs": n}``."""
        from tvm_interop.passes.layout import program_layout

        return program_layout(self.program)

    def benchmark(self, *inputs, repeat: int = 20, warmup: int = 3) -> dict:
        return self.runner.benchmark(*inputs, repeat=repeat, warmup=warmup)

    def export(self, path: str) -> None:
        """Write the deployable ``.so``. A CUDA model's kernels go in as fatbins for the compiled arches
        (``plan.meta["cuda_arches"]``), never as source: the library loads with TVM's runtime alone."""
        arches = self.plan.meta.get("cuda_arches")
        if arches:
            from tvm_interop.passes.cuda_compile import export_cuda_library

            native = self.plan.meta.get("native_extension")
            export_cuda_library(self.runner.library, path, arches, addons=[native["object"]] if native else None)
        else:
            self.runner.export(path)

    @property
    def plan(self):
        return self.runner.plan

    @property
    def graph(self):
        return self.program.graph

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(s["shape"]).astype(s["dtype"]) for s in self.runner.inputs]

    def memory_report(self) -> dict:
        """Activation memory (bytes) of the program built vs the model's own sequential program (before merges or
        fusion rewrote it), from TVM's memory plan."""
        from tvm_interop.passes.as_built import memory_report

        return memory_report(self.built_program or self.program, self.built_schedule or self.schedule, self.target,
                             mode=self.runner.mode, max_streams=self.max_streams, baseline=self.program)

    def gpu_estimate(self) -> dict | None:
        """What each candidate program of a CUDA build is expected to take on an H100-class GPU with TVM's default
        kernels (``passes.cost.program_estimate``); None where that estimate does not apply."""
        from tvm_interop.passes.cost.program_estimate import estimate_programs

        return estimate_programs(self.built_program or self.program, self.built_schedule or self.schedule,
                                 str(self.target), max_streams=self.max_streams)

    def close(self) -> None:
        self.runner.close()


def compile(model, target: str = "llvm", scheduler: str = "greedy", cost=None, *, schedule=None,
            executor: str | None = None, mode: str = "stage", batch_size: int = 1, image_size: int | None = None,
            width: float = 1.0, max_streams: int = 8, max_block_size: int | None = None,
            num_workers: int | None = None, scheduler_options: dict | None = None, name: str | None = None,
            shape_dict: dict | None = None, guard: bool | None = None, cost_cache=None,
            guard_repeat: int = 15, cuda_graph: bool | None = None, max_memory_ratio: float | None = 1.5,
            allow_device_mismatch: bool = False, cpu_schedule: bool = True,
            tuning_db: str | None = None, candidates: bool | None = None,
            cuda_arch: "str | list[str] | None" = None, fleet=None, fusion: str | None = None,
            units: str = "tvm", tf32: bool = False, sync: str = "tvm", layout: str = "auto",
            groups_in_order: bool | None = None) -> CompiledModel:
    """Compile ``model`` with an inter-operator schedule.

    ``model``: a Relax IRModule, a zoo model name (``tvm_interop.models.list_models()``) or an ``.onnx`` path.
    ``scheduler``: ``sequential``, ``greedy``, ``ios``, ``lios``, ``hios``, ``exhaustive``, or ``autograph``
    (equivalent graph substitutions searched with the schedule: ``passes.autograph``; each candidate graph is
    scheduled by ``scheduler_options["scheduler"]``, default ``ios``, and the best ships); or pass a ready
    ``schedule`` (a Schedule or a path to a schedule JSON), which is checked against the model (an autograph
    schedule carries its substitutions and rewrites the model the same way, each one proved again).
    ``cost``: cost model spec for the scheduler (``"sim:cpu"``, ``"sim:h100"``, ...); default: a simulated
    preset for the target when available.
    ``executor``: ``threads`` (CPU worker threads) or ``vm`` (Relax VM with streams); by default ``vm`` on a GPU
    and on a CPU for a schedule without concurrent groups, else ``threads``.
    ``max_memory_ratio``: bound on activation memory vs the sequential program (default 1.5x; None = no bound);
    a schedule over it is tightened (fewer groups per stage) and the outcome is in ``.memory``.
    ``allow_device_mismatch``: apply a schedule file tuned for another kind of device anyway.
    ``cpu_schedule``: give CPU kernels the default schedules of ``passes.kernels.cpu_schedule`` (default True;
    TVM's untuned CPU kernels are naive).
    ``tuning_db``: a MetaSchedule database directory made by ``tvm-interop tune`` /
    ``passes.kernels.tuning.tune_program``; its tuned kernels replace the prepared ones before anything is
    measured or built (kernels without a record keep their default schedule).
    ``target``: ``"llvm"`` (this machine's CPU: AVX2/AVX-512 where it has them), ``"llvm-generic"`` (any x86-64),
    ``"llvm -mcpu=<cpu>"``, ``"cuda"`` / ``"cuda -arch=sm_90"`` / a dict / a Target (CUDA builds need nvcc, not a
    GPU; the default arch is sm_90).
    ``guard`` (CPU): ``None`` (default) ships sequential when the cost model predicts the schedule slower (no
    timing needed) and otherwise times the schedule against sequential, the faster one ships (a ``schedule``
    given by the caller ships as given; one that runs the model's own kernels one at a time, e.g. after the memory
    bound's fallback, ships untimed: it is sequential's work); ``True`` always times; ``False`` ships what the scheduler found,
    unchecked. ``schedule.search["shipped_because"]`` says why. ``cuda_graph`` (CUDA only, default True): also build the CUDA-graph variant.
    ``cuda_arch``: the GPU arches whose binaries the library carries (``"sm_80,sm_90"``; default: the target's
    arch, ``cuda -arch=sm_80,sm_90`` also works); a GPU of another arch is refused at load with a clear error.
    ``candidates`` (default: on for GPU targets): the library also carries the schedule in the other
    synchronisation mode and sequential, each direct and as a CUDA graph; on the device the fastest is picked
    by measurement at the first run (or by ``tvm-interop pick``): a GPU library never runs slower than
    sequential for lack of a choice. With ``fusion="wave"`` or ``"flow"`` they also include the schedule
    unfused, in both modes (whether the fused stages pay depends on the device and on CUDA graphs). The CPU keeps
    the compile-time guard (``guard``).
    ``fusion``: ``None`` / ``"none"`` (default), ``"wave"`` (Rammer's wave fusion, CPU and CUDA: each stage that
    the cost model prices faster fused runs its groups as one kernel, ``passes.wave``) or ``"flow"`` (CUDA: every
    run of consecutive stages that can share a launch runs as one persistent launch whose blocks wait only for
    their producers, ``passes.wave.flow``; the stages that cannot join a run, and why, are in
    ``schedule.options["flow"]``). Flow launches are not priced by any cost model yet: the device's picker
    decides between them and the unfused candidates. A flow launch keeps every member's output alive (no two
    blocks may share storage), so ``max_memory_ratio`` does not bound it: ``memory_report()`` compares it with the
    model's sequential program (full-size SqueezeNet, one launch: 16.7 MiB against 6.1 MiB).
    ``fleet``: a started ``passes.fleet.Fleet`` (devices behind an RPC tracker): timed costs (``measured``,
    ``learned``) time their stages on its devices, and the never-slower guard runs there (on by default with a
    fleet), instead of on this machine.
    ``units`` (CUDA): ``"tvm"`` (default: every unit is a TVM kernel), ``"cudnn"`` (every convolution and dense
    layer that cuDNN / cuBLAS can compute exactly runs as a library call through our native extension, linked
    into the exported library; ``passes.offload``), ``"auto"`` (per unit, whichever a device measurement says is
    faster; without one, the library call). Units left to TVM, and why, are in ``.offload``. ``tf32``: let the
    library calls use TF32 tensor cores (PyTorch's default for convolutions; fp32 results then differ from TVM's
    by ~1e-3 relative). ``sync`` (CUDA): ``"tvm"`` (default; TVM's ``Device_StreamSyncFromTo``, which creates and
    destroys a CUDA event per call) or ``"events"`` (events created once per loaded model and reused, through the
    native extension linked into the export).
    ``layout`` (CPU): ``"auto"`` (default: convolutions and the activations between them in ``NCHW[c]c``, ``c`` =
    the CPU's vector width, as ONNX Runtime does; ``passes.layout``), ``"nchw"`` (TVM's layout) or ``"nchwc"``.
    The inputs and outputs stay in the model's layout either way; ``.layout`` says what was built.
    ``groups_in_order`` (CPU): ``None`` (default) lets the never-slower guard also time a program that wave fusion
    or merges rewrote with each stage's groups run one after another, every kernel on all cores (the Relax VM
    instead of worker threads), and build it that way when that is fastest (wave fusion chooses it itself when
    every stage it left unfused was timed no faster on worker threads); ``True`` builds it that way untimed;
    ``False`` never (a schedule file's choice is dropped). ``passes.in_order`` says why;
    ``schedule.options["groups_in_order"]`` records it.
    """
    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.lower import make_plan
    from tvm_interop.passes.guard import compare_libraries
    from tvm_interop.passes.in_order import IN_ORDER_OPTION, groups_in_order as in_order, runs_groups_in_order
    from tvm_interop.passes.merge import apply_merges, has_merges
    from tvm_interop.passes.schedule import Schedule
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.passes.wave import apply_wave_fusion, wave_stages
    from tvm_interop.passes.wave.flow import FLOW_OPTION, apply_flow_fusion, flow_requested

    if fusion not in FUSIONS:
        raise InteropError(f"unknown fusion {fusion!r}; choose one of {', '.join(repr(f) for f in FUSIONS)}")
    fusion = None if fusion == "none" else fusion
    from tvm_interop.passes.offload import UNIT_CHOICES, offload

    if units not in UNIT_CHOICES:
        raise InteropError(f"unknown units {units!r}; choose one of {', '.join(UNIT_CHOICES)}")
    _check_scheduler_name(scheduler, schedule)
    offload_report = None
    timings: dict = {}
    t0 = time.perf_counter()
    kw = {"name": name} if name and not isinstance(model, str) else {}
    mod, model_name = load_module(model, batch_size=batch_size, image_size=image_size, width=width,
                                  shape_dict=shape_dict, **kw)
    model_name = name or model_name
    from tvm_interop.passes.target import normalize_target

    target_text = _target_text(target)
    arches = None
    if _target_device_kind(normalize_target(target)) == "cuda":
        from tvm_interop.passes.target import requested_arches

        arches = requested_arches(target, cuda_arch)
        # code is generated for the oldest requested arch, so it uses nothing a requested GPU lacks
        target = dict(normalize_target(target).export(), arch=arches[0])
        target_text = f"cuda -arch={','.join(arches)}"
    elif cuda_arch:
        raise InteropError(f"cuda_arch={cuda_arch!r} needs a CUDA target, not {target_text!r}")
    from tvm_interop.passes.lower_streams import SYNC_MODES

    if sync not in SYNC_MODES:
        raise InteropError(f"unknown sync {sync!r}; choose one of {', '.join(SYNC_MODES)}")
    if sync == "events" and _target_device_kind(normalize_target(target)) != "cuda":
        raise InteropError(f"sync='events' orders CUDA streams; the target {target_text!r} has none")
    if units != "tvm" and _target_device_kind(normalize_target(target)) != "cuda":
        raise InteropError(f"units={units!r} runs convolutions with cuDNN / cuBLAS, which needs a CUDA target, not "
                           f"{target_text!r}")
    from tvm_interop.passes.layout import check_layout

    try:
        check_layout(layout)
    except ValueError as e:
        raise InteropError(str(e)) from None
    if layout not in ("auto", "nchw") and _target_device_kind(normalize_target(target)) != "cpu":
        raise InteropError(f"layout={layout!r} blocks channels for a CPU's vectors; the target {target_text!r} "
                           "keeps NCHW")
    target = normalize_target(target)
    device_kind = _target_device_kind(target)
    if groups_in_order and device_kind != "cpu":
        raise InteropError(f"groups_in_order runs a CPU schedule's concurrent groups one after another instead of on "
                           f"worker threads; the target {target_text!r} runs them on streams (its library's "
                           "candidates include sequential, picked by measurement on the device)")
    if fusion == "flow" and device_kind != "cuda":
        raise InteropError(f"fusion='flow' runs a schedule's stages as persistent CUDA launches; the target "
                           f"{target_text!r} is not CUDA (fusion='wave' fuses a CPU's stages)")
    if cuda_graph is None:
        cuda_graph = device_kind == "cuda"
    from tvm_interop.passes.cost.table import spec_for_build

    cost = spec_for_build(cost, cuda_graph)   # a CUDA graph runs at the device's pace: a table's device clock
    timings["load"] = time.perf_counter() - t0
    if schedule is not None and not isinstance(schedule, Schedule):
        schedule = Schedule.load(schedule)
    if schedule is not None and schedule.search.get("substitutions"):
        # an autograph schedule belongs to the rewritten model: rewrite this one the same way (each rule checked)
        from tvm_interop.passes.autograph.search import apply_substitutions

        mod = apply_substitutions(mod, schedule.search["substitutions"])

    def prepare_for_build(m):
        p = prepare_program(m, target, name=model_name, cpu_schedule=cpu_schedule, layout=layout)
        if tuning_db is not None:
            import dataclasses

            from tvm_interop.passes.kernels.tuning import apply_database

            t_db = time.perf_counter()
            p = dataclasses.replace(p, mod=apply_database(p.mod, target, tuning_db))
            timings["tuning_db"] = timings.get("tuning_db", 0.0) + time.perf_counter() - t_db
        if units != "tvm":   # library units: cuDNN / cuBLAS calls in place of the TVM kernels they equal
            nonlocal offload_report
            times, clock = _implementation_times(cost) if units == "auto" else (None, None)
            p, offload_report = offload(p, units=units, tf32=tf32, measured=times, clock=clock)
            log.info("%s", offload_report.summary())
        return p

    t = time.perf_counter()
    program = base_program = prepare_for_build(mod)
    timings["prepare"] = time.perf_counter() - t
    t = time.perf_counter()
    cost_model = None
    from tvm_interop.passes.search import is_timed_cost, search_schedule, timed_cost_model

    measured = is_timed_cost(cost)
    if cost is None and schedule is None:
        from tvm_interop.passes.cost.registry import default_spec

        cost = default_spec(device_kind)
    if schedule is not None:
        sched = schedule
        sched.validate(program.graph)
        sched.check_device(device_kind, allow_mismatch=allow_device_mismatch)
    elif scheduler == "autograph":
        from tvm_interop.passes.autograph.driver import run_autograph

        def cost_for(prog):
            if measured:
                cm = timed_cost_model(prog, target, cost, cache=cost_cache, batch=batch_size, fleet=fleet)
                return cm, cm.close
            if isinstance(cost, str) and cost.startswith("table:"):
                from tvm_interop.passes.cost import get_cost_model

                cm = get_cost_model(cost)
                cm.check_target(target_text)
                return cm, lambda: None
            return cost, lambda: None

        found = run_autograph(mod, prepare=lambda m: program if m is mod else prepare_for_build(m),
                              cost_for=cost_for, device_kind=device_kind, cost_spec=cost,
                              options=scheduler_options, model_name=model_name, batch=batch_size,
                              max_block_size=max_block_size, progress=log.info)
        mod, program, sched = found.module, found.program, found.schedule
    else:
        if measured:
            cost = cost_model = timed_cost_model(program, target, cost, cache=cost_cache, batch=batch_size,
                                                 fleet=fleet)
        elif isinstance(cost, str) and cost.startswith("table:"):
            from tvm_interop.passes.cost import get_cost_model

            cost = get_cost_model(cost)
            cost.check_target(target_text)   # measured on another GPU arch / device kind: refused, both named
        opts = dict(scheduler_options or {})
        if scheduler in ("greedy",):
            opts.setdefault("max_streams", max_streams)
        try:
            sched = search_schedule(program.graph, scheduler, cost, max_block_size=max_block_size,
                                    model_name=model_name, batch=batch_size, **opts)
        except BaseException:
            if cost_model is not None:
                cost_model.close()
            raise
    memory = None
    try:
        if max_memory_ratio is not None or mode == "dependency":
            from tvm_interop.passes.memory_bound import bound_memory

            bounded, mode, memory = bound_memory(program, sched, mode, max_memory_ratio)
            if bounded is not sched:
                bounded.search["memory_tightened_from"] = sched.max_concurrency()
                sched = bounded
        if fusion == "wave":
            sched = _choose_waves(sched, program, cost, cost_model, device_kind, target, target_text, cost_cache,
                                  batch_size, fleet)
        elif fusion == "flow":   # every run of stages that can share a launch, built as one (``build`` below)
            sched.options[FLOW_OPTION] = True
    finally:
        if cost_model is not None:
            cost_model.close()
    # guard=False: ship what the scheduler found, unchecked. guard=None (default) on a CPU: a schedule the cost
    # model already predicts slower ships sequential without a build; any other searched schedule is timed against
    # sequential on the executors they ship with, because a prediction does not know the executors: on this
    # project's 2-core machine the default `tvm-interop compile inception_v3` (greedy, sim:cpu, predicted 1.34x
    # faster) ran 2.0-2.4x slower than sequential on the worker threads (2026-11-27), and only a timing sees that.
    # A schedule the caller gives (schedule=) is the caller's choice: timed only with guard=True, a timed cost or
    # a fleet, as before
    predicted_guard = guard is None and not measured and fleet is None
    guard_requested = guard is True
    if guard is None:
        guard = schedule is None or measured or fleet is not None
    if device_kind == "cpu" and predicted_guard and schedule is None:
        sched = _unless_predicted_slower(sched, base_program.graph, model_name, batch_size)
        if sched.scheduler == "sequential":   # the unrewritten model's sequential program ships
            program = base_program
    timings["schedule"] = time.perf_counter() - t
    t = time.perf_counter()
    if offload_report is not None:   # which units ran as library calls, and why the others did not (schedule file)
        sched.options["units"] = offload_report.to_json()

    built: dict = {}

    def build(s, base=None):
        # merge stages (IOS's operator merge) are applied here: the schedule stays in its original form (it is
        # what is saved, and it applies to the original model); the merged program and schedule are what's built
        base = base or program
        prog, run_s = apply_merges(base, s, target=target) if has_merges(s) else (base, s)
        fused_stages = wave_stages(s)
        unfused, fused_by = None, "wave"
        if fused_stages and flow_requested(s):
            raise InteropError("the schedule has wave-fused stages and asks for flow launches: a stage is fused "
                               "one way or the other (compile it with fusion='wave' or fusion='flow', not both)")
        if fused_stages:   # wave fusion, like the merges, rewrites the program that is built
            fused_prog, fused_s, _ = apply_wave_fusion(prog, run_s, target, stages=fused_stages)
            s.options["waves"] = fused_s.options.get("waves", [])
            if fused_prog is not prog:   # the device picks between the waves and the same schedule unfused
                unfused = (prog, run_s)
            prog, run_s = fused_prog, fused_s
        elif flow_requested(s):   # runs of whole stages as one persistent launch each (passes.wave.flow)
            fused_prog, fused_s, _ = apply_flow_fusion(prog, run_s, target)
            s.options["flow"] = fused_s.options.get("flow", [])
            if fused_prog is not prog:   # the device picks between the flow launches and the schedule unfused
                unfused, fused_by = (prog, run_s), "flow"
            prog, run_s = fused_prog, fused_s
        if device_kind == "cpu" and runs_groups_in_order(s):   # after merges and waves (they name its stages)
            run_s = in_order(run_s)
        built.update(program=prog, schedule=run_s)
        meta = {"model": model_name, "scheduler": s.scheduler, "target": target_text, "device": device_kind,
                "mode": mode}
        fused_units = _fused_units(run_s)
        if fused_units:   # what `tvm-interop show` says of the library's fused kernels
            meta["fused_units"] = fused_units
        p = make_plan(prog, run_s, mode=mode, meta=meta)
        return p, build_library(prog, run_s, p, target, max_streams=max_streams, mode=mode, cuda_graph=cuda_graph,
                                candidates=candidates, cuda_arches=arches, sync=sync, unfused=unfused,
                                fused_by=fused_by)

    if groups_in_order is not None and device_kind == "cpu":
        if groups_in_order:
            sched.options[IN_ORDER_OPTION] = True
        else:
            sched.options.pop(IN_ORDER_OPTION, None)
            if isinstance(sched.options.get("wave_fusion"), dict):   # wave fusion's own choice of it, overruled
                sched.options["wave_fusion"] = {k: v for k, v in sched.options["wave_fusion"].items()
                                                if k != "in_order"}
    plan, library = build(sched)
    timings["build"] = time.perf_counter() - t
    guard_result = None
    if guard and not guard_requested and device_kind == "cpu" and sched.scheduler != "sequential" \
            and sched.max_concurrency() <= 1 and built["program"] is base_program:
        # One unit at a time over the model's own kernels (nothing merged, fused or rewritten), as after the memory
        # bound's fallback to the sequential order: the same work as sequential, so timing one against the other
        # measures noise. NASNet-A-large spent 44 s of an 82 s compile on it and reported "greedy measured slower
        # than sequential (686 vs 669 ms)" for two runs of the same kernels in the same order. (guard=True times it.)
        why = sched.options.get("memory_fallback") and "the memory bound's fallback"
        sched.search["shipped_because"] = (f"runs one unit at a time over the model's own kernels"
                                           f"{f' ({why})' if why else ''}: nothing concurrent to time against "
                                           "sequential")
        guard = False
    if guard and device_kind == "cpu" and sched.scheduler != "sequential":
        from tvm_interop.passes.guard import decide
        from tvm_interop.passes.lower import make_plan as _plan

        t = time.perf_counter()
        # the baseline is the model as given: sequential over the unrewritten program (autograph rewrites it)
        seq = schedule_graph(base_program.graph, "sequential", "unit", model_name=model_name, batch=batch_size)
        merged = built["program"] is not base_program
        if not merged:
            runs = {"scheduled": (library, plan), "sequential": (library, _plan(program, seq, mode=mode))}
        else:  # merged kernels: the sequential baseline is the original model, in a library of its own
            merged_built = dict(built)
            seq_plan, seq_library = build(seq, base_program)
            built.update(merged_built)
            runs = {"scheduled": (library, plan), "sequential": (seq_library, seq_plan)}
        in_order_build = None
        if merged and groups_in_order is None and plan.max_concurrency() > 1 and executor != "threads":
            # the schedule built with its groups one after another (a plan without concurrent groups: the VM runs
            # it), the very library that ships if it wins. Only for a rewritten program (waves, merges): over the
            # model's own kernels that is sequential's work in another order, and timing it against sequential
            # measures noise (in-order lios beat sequential by 2-6 %, within the 6-16 % noise, on SqueezeNet,
            # GoogLeNet and RandWire, 2026-11-29)
            scheduled_built = dict(built)
            trial = replace(sched, options={**sched.options, IN_ORDER_OPTION: True}, search=dict(sched.search))
            io_plan, io_library = build(trial)
            in_order_build = (io_plan, io_library, dict(built))
            built.update(scheduled_built)
            runs["in_order"] = (io_library, io_plan)
            if executor == "vm":   # what the caller's VM would run anyway: the worker threads are not an option
                del runs["scheduled"]
        if fleet is not None:
            from tvm_interop.passes.fleet.guard import compare_libraries_on_fleet

            times = compare_libraries_on_fleet(fleet, runs, repeat=guard_repeat)
        else:
            times = compare_libraries(runs, repeat=guard_repeat)
        guard_result = decide(times)
        sched.measured_latency = guard_result.scheduled_ms / 1e3
        if guard_result.choice == "in_order":
            # the library timed ships: its plan has no concurrent groups, so a loaded library runs on the VM
            # without being told, and the option makes the schedule file build it again
            sched.options[IN_ORDER_OPTION] = True
            sched.measured_latency = guard_result.in_order_ms / 1e3
            plan, library, in_order_built = in_order_build
            built.update(in_order_built)
            threads = (f"than on worker threads ({guard_result.scheduled_ms:.3f} ms) and "
                       if "scheduled" in times else "")
            sched.search["shipped_because"] = (
                f"measured faster with each stage's groups run one after another on all cores "
                f"({guard_result.in_order_ms:.3f} ms) {threads}than sequential ({guard_result.sequential_ms:.3f} ms)")
            log.info("never-slower guard: %s", sched.search["shipped_because"])
        elif not guard_result.keep_schedule:
            log.warning("never-slower guard: %s schedule measured %.3f ms vs sequential %.3f ms (noise %.1f%%); "
                        "shipping sequential", sched.scheduler, guard_result.scheduled_ms,
                        guard_result.sequential_ms, guard_result.noise * 100)
            seq.measured_latency = guard_result.sequential_ms / 1e3
            seq.search["guard_rejected"] = sched.scheduler
            seq.search["shipped_because"] = (f"measured slower than sequential ({guard_result.scheduled_ms:.3f} vs "
                                              f"{guard_result.sequential_ms:.3f} ms)")
            sched = seq
            program = base_program
            plan, library = (seq_plan, seq_library) if merged else build(sched)
            built.update(program=program, schedule=seq)
        else:
            sched.search["shipped_because"] = (f"measured faster than sequential ({guard_result.scheduled_ms:.3f} vs "
                                               f"{guard_result.sequential_ms:.3f} ms)")
            log.info("never-slower guard: %s %.3f ms vs sequential %.3f ms (noise %.1f%%): keeping the schedule",
                     sched.scheduler, guard_result.scheduled_ms, guard_result.sequential_ms, guard_result.noise * 100)
        if fleet is not None:
            sched.search["guard_device"] = fleet.fingerprint   # the shipped schedule says where it was timed
        timings["guard"] = time.perf_counter() - t
    runner = ScheduledModel(library, device_kind=device_kind, executor=executor, mode=mode, num_workers=num_workers,
                            plan=plan)
    timings["total"] = time.perf_counter() - t0
    log.info("compiled %s: %d units, %d stages (%s) in %.1f s", model_name, len(program.graph), sched.num_stages,
             sched.scheduler, timings["total"])
    return CompiledModel(runner=runner, schedule=sched, program=program, target=target_text, timings=timings,
                         guard=guard_result, memory=memory, max_streams=max_streams, built_program=built["program"],
                         built_schedule=built["schedule"], offload=offload_report)


def _implementation_times(cost) -> tuple[dict | None, str | None]:
    """Per unit ``(TVM kernel, library call)`` seconds measured on the device, from a cost table made with
    ``profile-bundle --library-units`` (what ``units="auto"`` chooses by), and the table's clock; Nones without."""
    if isinstance(cost, str) and cost.startswith("table:"):
        from tvm_interop.passes.cost import get_cost_model

        cost = get_cost_model(cost)
    times = getattr(cost, "implementation_times", None)
    return (times(), getattr(cost, "clock", None)) if callable(times) else (None, None)


FUSIONS = (None, "none", "wave", "flow")


def _fused_units(built_schedule) -> list[dict]:
    """The fused kernels of a built schedule, for the library's record: each wave-fused stage's kernel and each flow
    launch, with what it holds (the schedule's records, ``options["waves"]`` / ``options["flow"]``)."""
    out = [{"unit": r["unit"], "fusion": "wave", "stage": r["stage"], "groups": len(r["fused"]),
            "left": len(r["left"])} for r in built_schedule.options.get("waves", []) if r.get("fused")]
    out += [{"unit": r["unit"], "fusion": "flow", "stages": len(r["stages"]), "launches": r["members"],
             "blocks": r["tasks"]} for r in built_schedule.options.get("flow", []) if r.get("units")]
    return out


def _choose_waves(sched, program, cost, cost_model, device_kind, target, target_text, cost_cache, batch_size, fleet):
    """Price every fusable stage fused and as scheduled with the search's cost model (or, for a given schedule,
    the cost spec / the target's default) and mark the stages to fuse (``passes.wave.choose``)."""
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.cost.registry import default_spec
    from tvm_interop.passes.search import is_timed_cost, timed_cost_model
    from tvm_interop.passes.wave import choose_wave_stages

    if cost_model is not None or (cost is not None and not isinstance(cost, str)):
        return choose_wave_stages(program.graph, sched, cost_model or cost)
    spec = cost or default_spec(device_kind)
    if is_timed_cost(spec):
        model = timed_cost_model(program, target, spec, cache=cost_cache, batch=batch_size, fleet=fleet)
        try:
            return choose_wave_stages(program.graph, sched, model)
        finally:
            model.close()
    model = get_cost_model(spec)
    if hasattr(model, "check_target"):
        model.check_target(target_text)
    return choose_wave_stages(program.graph, sched, model)


def _unless_predicted_slower(sched, graph, model_name: str, batch_size: int):
    """The schedule, or sequential when its own cost model predicts it slower than sequential: a CPU build ships no
    schedule that its prediction already says loses, and needs no build or timing to know it."""
    from tvm_interop.passes.schedulers import schedule_graph

    pred, seq_pred = sched.predicted_latency, sched.sequential_latency
    if sched.scheduler == "sequential" or not pred or not seq_pred:
        sched.search.setdefault("shipped_because", "sequential requested" if sched.scheduler == "sequential"
                                else "no prediction to compare")
        return sched
    if pred > seq_pred * (1 + 1e-9):
        log.warning("%s schedule predicted %.3f ms, slower than sequential (%.3f ms) under %s: shipping sequential",
                    sched.scheduler, pred * 1e3, seq_pred * 1e3, sched.device)
        seq = schedule_graph(graph, "sequential", "unit", model_name=model_name, batch=batch_size)
        seq.predicted_latency = seq.sequential_latency = seq_pred
        seq.device = sched.device   # the prediction that decided came from this cost model
        seq.search["guard_rejected"] = sched.scheduler
        seq.search["shipped_because"] = (f"{sched.scheduler} predicted slower than sequential under {sched.device} "
                                         f"({pred * 1e3:.3f} vs {seq_pred * 1e3:.3f} ms)")
        return seq
    sched.search["shipped_because"] = (f"predicted faster than sequential under {sched.device} ({pred * 1e3:.3f} vs "
                                       f"{seq_pred * 1e3:.3f} ms)")   # the measured guard then has the last word
    return sched


def _check_scheduler_name(scheduler: str, schedule) -> None:
    """Refuse an unknown scheduler before the model is loaded and built: the registry's schedulers work on one
    operator graph, ``autograph`` on the whole model (here), so the registry alone does not list every choice."""
    from tvm_interop.passes.schedulers import available_schedulers

    choices = sorted([*available_schedulers(), "autograph"])
    if schedule is None and scheduler not in choices:
        raise InteropError(f"unknown scheduler {scheduler!r}; available: {', '.join(choices)}")


def reference_build(mod, target: str = "llvm"):
    """Plain TVM: legalize + fuse (``relax.get_pipeline('zero')``) then ``tvm.compile`` — the ground truth."""
    import tvm
    from tvm import relax

    from tvm_interop.passes.cuda_build import cuda_pipeline, ensure_nvcc
    from tvm_interop.passes.target import normalize_target

    target = normalize_target(target)
    if target.kind.name == "cuda":  # TVM's default CUDA pipeline (DLight schedules), no CUDA graph
        ensure_nvcc()
        return tvm.compile(relax.get_pipeline("zero")(mod), target, relax_pipeline=cuda_pipeline(target, ()))
    return tvm.compile(relax.get_pipeline("zero")(mod), target)


def run_reference(mod, inputs, target: str = "llvm"):
    """Outputs of the plain TVM build on ``inputs`` (numpy)."""
    import tvm
    from tvm import relax

    from tvm_interop.runtime.model import device_for

    ex = reference_build(mod, target)
    dev = device_for(_target_device_kind(target))
    vm = relax.VirtualMachine(ex, dev)
    out = vm["main"](*[tvm.runtime.tensor(x, dev) for x in inputs])
    from tvm_interop.runtime.model import vm_to_numpy

    return vm_to_numpy(out)
