"""Whole-program GPU latency: a timeline simulation of the issued stream program (``ProgramCostModel``).

Why: on an H100, the isolated stage costs of a cost table (``passes.cost.table``) summed to 3.75 ms for an
inception_v3 schedule that ran in 6.84 ms (``shared/gpu-data/h100-2026-11-22``). Stage costs do not compose: the
VM does host work for every kernel, event and stream switch; ``runtime.Device_StreamSyncFromTo`` creates and
destroys a CUDA event per call; a kernel cannot start before the host has issued it; concurrent kernels share
the device; a CUDA graph removes the host work but adds its own per-node cost. This module predicts the latency
of a *whole program* -- one call of the lowered function, as ``scripts/gpu_check.py`` times it (wall clock of
the call plus a device synchronisation) -- from per-unit device data and a handful of global parameters fitted
on measured programs (``scripts/fit_gpu_cost.py``; parameters and validation in ``docs/gpu_cost_model.{md,json}``).

What is simulated
-----------------
The input is the op list that the lowering issues (``passes.lower_streams.plan_streams``: kernels, events
``sync(a -> b)``, stream switches ``set``, keep-alive calls ``release``), i.e. exactly what the VM runs, in
stage or dependency mode, with or without CUDA graph. :func:`issued_program` builds it from a Program and a
Schedule; tests build :class:`IssuedProgram` objects by hand.

*Host* (direct launches). The host walks the op list once, in order, and never blocks (every CUDA call in the
program is asynchronous)::

    host starts at  call_overhead
    kernel          host_kernel      (VM dispatch + cuLaunchKernel; the kernel is enqueued on the current stream)
    sync(a -> b)    host_sync        (cudaEventCreate + Record on a + StreamWaitEvent on b + EventDestroy)
    set(s)          host_set         (runtime.Device_SetStream)
    release         host_keepalive per keep-alive call (one per KEEPALIVE_CHUNK tensors; host_keepalive_v1 for
                    programs of the builds before 2026-11-24, IssuedProgram.keepalive == "v1")

*Host* (CUDA graph, ``cuda_graph=True``). The input copies are launched directly (``host_kernel`` each), then
the captured region is one graph launch (``graph_launch``): every op inside it is on the device at that moment
and costs the host nothing; the output copies are launched directly after it.

*Device.* Every stream (the caller's stream and the created ones) is a FIFO of its enqueued items. An item can
start ``launch_latency`` after the host issued it and once everything before it on its stream is done:

* a kernel first waits a fixed gap (``kernel_gap`` direct, ``graph_node_gap`` in a graph: launch processing
  that does not occupy the SMs), then runs; alone it takes ``d = max(rho * kernel_min, rho * (kernel_scale * (u -
  timing_floor / number) + kernel_offset) + delta)`` where ``u`` is the unit's **isolated latency** (a cost table's unit
  entry, or any ``CostModel.unit_latency``) and ``number`` the calls per timing of the protocol that measured it
  (the table's ``number``): the isolated timing includes a host floor for tiny kernels, so the map from isolated
  latency to device time is affine, and part of that floor is paid once per timing (the first launch after the
  timer starts), so a table timed with ``number`` 10 reads lower than one timed with 5 for the same kernel;
  ``rho`` is ``program_scale`` in a whole program (times ``program_deep_factor`` for a *deep* convolution, one
  that sums over at least :data:`DEEP_REDUCTION` inputs per output, :func:`is_deep`) and 1 in a stage replayed as
  the cost-table protocol (``IssuedProgram.isolated``, :func:`table_protocol_program`): how much slower a kernel
  runs inside a program than timed alone, warm, a few calls back to back; ``delta`` is ``program_offset`` in a
  whole program and 0 in the table protocol: the fixed part of a kernel's isolated time that it sheds inside a
  program (fitted negative: a sequential program of many short kernels runs faster than its kernels timed alone,
  one of few long kernels slower);
* concurrent kernels share the device as a fluid (processor sharing): a kernel demands ``f = min(1, work items
  / (fill_items))`` of the device (work items = output elements, as ``passes.cost.simulated`` counts them;
  ``fill_items`` = how many output elements fill the GPU) and every running kernel progresses at rate
  ``1 / max(1, sum of demands of the running kernels)``: kernels that each fill a small part of the GPU overlap
  fully, kernels that fill it serialise (work is conserved); ``interference["V<-A"] = x``: a kernel of class V
  (:func:`unit_class`) progresses ``1 / (1 + x)`` as fast while one of class A runs beside it (the fitted H100 set:
  a spatial conv beside an avg_pool, ``passes.cost.program_fit.FIXED_INTERFERENCE``);
* an event record fires when everything before it on its stream is done; a wait completes ``event_latency``
  (``graph_event_latency`` in a graph) after its event fired.

The program's latency is ``max(host end, device end) + tail``.

Parameters (:class:`ProgramCostParams`) are seconds unless noted; :data:`PARAM_DOCS` documents each. They are
saved/loaded as JSON (:meth:`ProgramCostParams.save` / :meth:`ProgramCostParams.load`); the fitted H100 set
is ``docs/gpu_cost_model.json`` (:func:`load_fitted`).

*Table protocol.* :func:`table_protocol_program` replays how ``runtime.profile_bundle`` times a cost-table stage
(the stage function called ``number`` times back to back, each call ``call_overhead`` of host time, fork/join
events around the groups), so the tables' thousands of stage measurements (chains, concurrent groups) are fitting
data next to the whole programs: they pin the isolated -> device map, the fill and the call floor.

Not modelled (documented limits): the legacy default stream's implicit synchronisation (the lowering never
overlaps work on it with the created streams, so it would only matter for foreign code), memory-bandwidth
contention separately from compute fill, L2 interference between neighbouring kernels beyond the affine
isolated->in-program map, and the CUDA graph executor's own mapping of branches onto hardware queues.
"""
from __future__ import annotations

import heapq
import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.json_file import read_json

from .conv_geometry import conv_weight_shape, reduction_depth  # noqa: F401 - part of this module's API

PARAMS_FORMAT = "tvm-interop-program-cost"
PARAMS_VERSION = 4          # 2: timing_floor, host_keepalive_v1; 3: program_offset; 4: program_deep_factor
MAIN = -1                    # the caller's stream (as in passes.lower_streams)
KEEPALIVE_CHUNK = 16         # tensors per keep-alive call (passes.lower_streams.KEEPALIVE_CHUNK)
H100_FILL_ITEMS = 132 * 2048  # SMs x resident threads: the simulated device's capacity (passes.cost.simulated)
DEEP_REDUCTION = 1024        # a convolution summing over at least this many inputs per output is "deep" (is_deep)

# op codes of an IssuedProgram
KERNEL, SYNC, SET, RELEASE, CALL = "kernel", "sync", "set", "release", "call"
KEEPALIVE_KINDS = ("ffi", "v1")  # IssuedProgram.keepalive

PARAM_DOCS: dict[str, str] = {
    "kernel_scale": "device time of a kernel per second of its isolated unit latency (dimensionless)",
    "kernel_offset": "device time = kernel_scale * (isolated - timing_floor / number) + kernel_offset (s; "
                     "negative: the isolated timing includes a per-call host floor)",
    "timing_floor": "the part of an isolated unit timing paid once per timing of `number` calls back to back (the "
                    "first launch after the timer starts), so it adds timing_floor / number to the unit's latency "
                    "(s); what makes tables timed with another `number` comparable",
    "program_scale": "a kernel's time inside a whole program per second of its device time in the isolated "
                     "(cost-table) protocol (dimensionless)",
    "program_deep_factor": "a deep convolution's in-program factor over program_scale (one summing over at least "
                           "DEEP_REDUCTION inputs per output: in channels per group x kernel area; 1: none; "
                           "dimensionless)",
    "program_offset": "time added to every kernel inside a whole program, after program_scale (s; fitted negative: "
                      "a fixed part of a kernel's isolated time that it does not take inside a program)",
    "kernel_min": "shortest in-program kernel (s)",
    "fill_items": "output elements that fill the device: a kernel demands min(1, work items / fill_items) of it "
                  "(dimensionless count)",
    "call_overhead": "host time of one VM function call before its first op (VM entry, current stream) (s)",
    "tail": "time after the last op and the last kernel until the call returns with the device synchronised (s)",
    "host_kernel": "host time per directly launched kernel (VM dispatch + launch) (s)",
    "host_sync": "host time per runtime.Device_StreamSyncFromTo (event create/record/wait/destroy) (s)",
    "host_set": "host time per runtime.Device_SetStream (s)",
    "host_keepalive": "host time per keep-alive call (s)",
    "host_keepalive_v1": "host time per keep-alive call of builds before 2026-11-24 (a VM function per chunk, "
                         "before ffi.Array): describes the 2026-11-22 fitting data only (s)",
    "launch_latency": "from the host issuing an item to the earliest time the device can start it (s)",
    "kernel_gap": "device gap before each directly launched kernel, not occupying the SMs (s)",
    "event_latency": "device delay of a cross-stream event wait after the event fired (s)",
    "graph_launch": "host time of one CUDA graph launch (s)",
    "graph_node_gap": "device gap before each kernel node of a CUDA graph (s)",
    "graph_event_latency": "device delay of a cross-stream dependency inside a CUDA graph (s)",
    "copy_bandwidth": "bytes/s of the input/output copies of the CUDA-graph variant (bytes/s)",
}


@dataclass
class ProgramCostParams:
    """The global parameters of the program model (see the module docstring and :data:`PARAM_DOCS`)."""

    kernel_scale: float = 1.15
    kernel_offset: float = -3.0e-6
    timing_floor: float = 0.0
    program_scale: float = 1.0
    program_deep_factor: float = 1.0
    program_offset: float = 0.0
    kernel_min: float = 1.5e-6
    fill_items: float = float(H100_FILL_ITEMS)
    call_overhead: float = 20e-6
    tail: float = 5e-6
    host_kernel: float = 4.5e-6
    host_sync: float = 3.0e-6
    host_set: float = 0.7e-6
    host_keepalive: float = 1.0e-6
    host_keepalive_v1: float = 1.0e-6
    launch_latency: float = 3.0e-6
    kernel_gap: float = 0.5e-6
    event_latency: float = 1.0e-6
    graph_launch: float = 10e-6
    graph_node_gap: float = 0.8e-6
    graph_event_latency: float = 0.5e-6
    copy_bandwidth: float = 1.0e12
    # slowdown of a running kernel of class V while a kernel of class A runs beside it: "V<-A" -> x means V
    # progresses at 1 / (1 + x) of its rate (unit classes: unit_class)
    interference: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict, compare=False)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("meta", "interference")]

    def values(self) -> dict[str, float]:
        return {k: float(getattr(self, k)) for k in self.names()}

    def replace(self, **kw) -> ProgramCostParams:
        bad = sorted(set(kw) - set(self.names()))
        if bad:
            raise InteropError(f"unknown program-cost parameter(s) {bad}; known: {self.names()}")
        d = self.values()
        d.update({k: float(v) for k, v in kw.items()})
        return ProgramCostParams(**d, interference=dict(self.interference), meta=dict(self.meta))

    def with_interference(self, **pairs) -> ProgramCostParams:
        """A copy with interference entries set (keys ``victim__aggressor``, e.g. ``conv_spatial__avg_pool``)."""
        out = self.replace()
        for k, v in pairs.items():
            victim, _, aggressor = k.partition("__")
            out.interference[f"{victim}<-{aggressor}"] = float(v)
        return out

    def to_json(self) -> dict:
        return {"format": PARAMS_FORMAT, "version": PARAMS_VERSION, "params": self.values(),
                "interference": dict(self.interference),
                "units": {k: PARAM_DOCS[k] for k in self.names()}, "meta": self.meta}

    @staticmethod
    def from_json(d: Mapping) -> ProgramCostParams:
        if not isinstance(d, Mapping) or d.get("format") != PARAMS_FORMAT:
            raise InteropError("not a tvm-interop program-cost parameter file "
                               f"(format {d.get('format') if isinstance(d, Mapping) else type(d).__name__!r})")
        if int(d.get("version", 0)) > PARAMS_VERSION:
            raise InteropError(f"program-cost parameters version {d.get('version')} is newer than this code "
                               f"({PARAMS_VERSION})")
        vals = dict(d.get("params", {}))
        known = set(ProgramCostParams.names())
        bad = sorted(set(vals) - known)
        if bad:
            raise InteropError(f"unknown program-cost parameter(s) {bad} in the file; known: {sorted(known)}")
        inter = {str(k): float(v) for k, v in dict(d.get("interference", {})).items()}
        for k in inter:
            if "<-" not in k:
                raise InteropError(f"interference key {k!r} is not 'victim<-aggressor'")
        return ProgramCostParams(**{k: float(v) for k, v in vals.items()}, interference=inter,
                                 meta=dict(d.get("meta", {})))

    def save(self, path: str) -> None:
        from tvm_interop.runtime import atomic

        atomic.write_text(path, json.dumps(self.to_json(), indent=1) + "\n")

    @staticmethod
    def load(path: str) -> ProgramCostParams:
        d = read_json(path, f"program-cost parameters {path}")
        # docs/gpu_cost_model.json holds the parameters under "model" next to the validation tables
        if isinstance(d, dict) and d.get("format") != PARAMS_FORMAT and isinstance(d.get("model"), dict):
            d = d["model"]
        return ProgramCostParams.from_json(d)


def fitted_params_path() -> str:
    """``docs/gpu_cost_model.json`` of this checkout (written by ``scripts/fit_gpu_cost.py``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(os.path.dirname(here)), "docs", "gpu_cost_model.json")


def load_fitted(path: str | None = None) -> ProgramCostParams:
    """The parameters fitted on the H100 measurements (all models), from ``docs/gpu_cost_model.json``."""
    return ProgramCostParams.load(path or fitted_params_path())


# ---------------------------------------------------------------------------------------------- issued program
@dataclass
class IssuedOp:
    """One op of the issued program: ``kernel`` (``unit`` on the current stream), ``sync`` (event ``a`` -> ``b``),
    ``set`` (current stream = ``a``), ``release`` (``calls`` keep-alive calls) or ``call`` (the host entering
    another VM function call: ``call_overhead``; used to replay the cost-table protocol, many calls back to
    back)."""

    kind: str
    a: int = MAIN
    b: int = MAIN
    unit: str = ""
    calls: int = 0
    stage: int = -1


@dataclass
class IssuedProgram:
    """What the VM runs for one call: ops in issue order, and per unit its isolated latency input.

    ``copies`` (CUDA-graph variants): unit names of the input / output copies (``__in*`` / ``__out*``), which are
    launched directly around the graph; ``copy_bytes`` their sizes. ``mode`` and ``cuda_graph`` are recorded for
    reports only; :meth:`ProgramCostModel.simulate` takes ``cuda_graph`` from here.
    """

    ops: list[IssuedOp]
    num_streams: int = 0
    mode: str = "stage"
    cuda_graph: bool = False
    copy_bytes: dict[str, float] = field(default_factory=dict)
    name: str = ""
    # True: a stage replayed as the cost-table protocol times it (time_evaluator, one stage function called back
    # to back, warm), whose kernels take their device time; False: a whole program, whose kernels take
    # program_scale times that
    isolated: bool = False
    # how the build kept tensors alive: "ffi" (today: one ffi.Array call per chunk, host_keepalive) or "v1" (the
    # builds of the 2026-11-22 data: a VM function per chunk, host_keepalive_v1)
    keepalive: str = "ffi"

    def count(self, kind: str) -> int:
        if kind == RELEASE:
            return sum(o.calls for o in self.ops if o.kind == RELEASE)
        return sum(1 for o in self.ops if o.kind == kind)

    def kernels(self) -> list[str]:
        return [o.unit for o in self.ops if o.kind == KERNEL]

    def summary(self) -> dict:
        return {"kernels": sum(1 for o in self.ops if o.kind == KERNEL and o.unit not in self.copy_bytes),
                "copies": len(self.copy_bytes), "syncs": self.count(SYNC), "sets": self.count(SET),
                "keepalive_calls": self.count(RELEASE), "streams": self.num_streams}


def from_stream_program(sp, cuda_graph: bool = False, copy_bytes: Mapping[str, float] | None = None,
                        name: str = "", keepalive: str = "ffi") -> IssuedProgram:
    """An :class:`IssuedProgram` from a ``passes.lower_streams.StreamProgram`` (``release`` ops become keep-alive
    calls, one per :data:`KEEPALIVE_CHUNK` tensors, as the emitter chunks them)."""
    ops = []
    copies = dict(copy_bytes or {})
    for o in sp.ops:
        if o.kind == "unit":
            if o.unit.startswith(("__in", "__out")) and o.unit not in copies:
                copies[o.unit] = 0.0
            ops.append(IssuedOp(KERNEL, unit=o.unit, stage=o.stage))
        elif o.kind == "sync":
            ops.append(IssuedOp(SYNC, o.a, o.b, stage=o.stage))
        elif o.kind == "set":
            ops.append(IssuedOp(SET, o.a, stage=o.stage))
        elif o.kind == "release":
            n = len(set(map(_tensor_key, o.tensors)))
            ops.append(IssuedOp(RELEASE, calls=max(1, math.ceil(n / KEEPALIVE_CHUNK)), stage=o.stage))
        else:
            raise InteropError(f"unknown stream op {o.kind!r}")
    if keepalive not in KEEPALIVE_KINDS:
        raise InteropError(f"keep-alive kind {keepalive!r}: expected one of {KEEPALIVE_KINDS}")
    return IssuedProgram(ops, num_streams=sp.num_streams, mode=sp.mode, cuda_graph=cuda_graph, copy_bytes=copies,
                         name=name, keepalive=keepalive)


def stage_ops(groups) -> list[IssuedOp]:
    """One stage as a profiling bundle's stage or program function issues it (``passes.profile_bundle``): a single
    group on the caller's stream; several groups forked onto a stream each by events, and joined back."""
    groups = [list(g) for g in groups if len(g)]
    if len(groups) == 1:
        return [IssuedOp(KERNEL, unit=u) for u in groups[0]]
    ops = [IssuedOp(SYNC, MAIN, i) for i in range(len(groups))]
    for i, g in enumerate(groups):
        ops.append(IssuedOp(SET, i))
        ops += [IssuedOp(KERNEL, unit=u) for u in g]
    ops.append(IssuedOp(SET, MAIN))
    ops += [IssuedOp(SYNC, i, MAIN) for i in range(len(groups))]
    return ops


def table_protocol_program(groups, number: int = 5) -> IssuedProgram:
    """A cost-table stage as ``runtime.profile_bundle`` times it: its stage function called ``number`` times back to
    back (``time_evaluator``), each call a VM entry (``call_overhead``; ``call`` ops after the first), then, with
    several groups, a fork (events from the caller's stream to one stream per group), the groups' kernels on their
    streams, and a join (``passes.profile_bundle._build_stage_module``); a single group runs on the caller's
    stream. Its simulated latency divided by ``number`` is the table's stage latency; ``isolated`` (kernels take
    their device time)."""
    groups = [list(g) for g in groups if len(g)]
    if not groups:
        raise InteropError("a stage needs at least one non-empty group")
    ops: list[IssuedOp] = []
    for k in range(max(1, int(number))):
        if k:
            ops.append(IssuedOp(CALL))   # the first call's entry is the simulation's call_overhead
        ops += stage_ops(groups)
    return IssuedProgram(ops, num_streams=len(groups) if len(groups) > 1 else 0, isolated=True,
                         name="stage " + ";".join("|".join(g) for g in groups))


def _tensor_key(t) -> str:
    return repr(t)


def issued_program(program, schedule, mode: str = "stage", cuda_graph: bool = False, max_streams: int = 8,
                   name: str = "", waits: str | None = None) -> IssuedProgram:
    """The op list the stream lowering issues for ``schedule`` (``passes.lower_streams.plan_streams`` with the
    stream count ``lower_program`` uses; with ``cuda_graph`` the CUDA-graph function, input/output copies
    included). ``waits``: the dependency mode's wait placement of the build (default: today's lowering)."""
    from tvm_interop.passes.lower_streams import DEFAULT_WAIT_PLACEMENT, plan_streams, resolve_stream_count

    n = resolve_stream_count(max_streams, schedule.max_concurrency())
    sp = plan_streams(program, schedule, mode, n, staged_io=cuda_graph, keep_alive=True,
                      waits=waits or DEFAULT_WAIT_PLACEMENT)
    copies: dict[str, float] = {}
    if cuda_graph:
        for i, t in enumerate(program.input_infos):
            copies[f"__in{i}"] = float(t.nbytes)
        for k, r in enumerate(program.output_refs()):
            nb = 0.0
            if r.kind == "unit":
                nb = float(program.graph.unit(r.unit).outputs[r.index].nbytes)
            elif r.kind == "input":
                nb = float(program.input_infos[r.index].nbytes)
            copies[f"__out{k}"] = nb
    return from_stream_program(sp, cuda_graph=cuda_graph, copy_bytes=copies, name=name)


# ---------------------------------------------------------------------------------------------- the timeline
@dataclass
class Timeline:
    """Result of one simulation (seconds). ``kernels``: unit -> (stream, start, end) when traced."""

    latency: float
    host_end: float
    device_end: float
    kernels: dict[str, tuple[int, float, float]] = field(default_factory=dict)

    @property
    def host_bound(self) -> bool:
        return self.host_end >= self.device_end




def simulate(prog: IssuedProgram, units: Mapping[str, tuple], params: ProgramCostParams,
             trace: bool = False) -> Timeline:
    """Run the timeline of ``prog``. ``units[name] = (isolated latency s, work items[, class[, kernel_time[,
    number[, deep]]]])`` for every kernel that is not a copy (class: :func:`unit_class`, default ``"other"``;
    ``kernel_time`` true: the first entry already is the in-program kernel time, e.g. a simulated unit cost times a
    calibrated factor, and the isolated -> in-program map is skipped; ``number``: calls per timing of the protocol
    that timed the isolated latency, which then carries ``timing_floor / number``; absent or 0: no such correction;
    ``deep``: a deep convolution (:func:`is_deep`), whose in-program factor is ``program_scale *
    program_deep_factor``). See the module docstring."""
    p = params
    graph = prog.cuda_graph
    queues: list[list[tuple]] = []
    smap: dict[int, int] = {}

    def sid(s: int) -> int:
        i = smap.get(s)
        if i is None:
            i = smap[s] = len(smap)
            queues.append([])
        return i

    sid(MAIN)
    classes: dict[str, int] = {}
    t_h = p.call_overhead
    cur = 0
    n_events = 0
    rho = 1.0 if prog.isolated else p.program_scale
    rho_deep = 1.0 if prog.isolated else p.program_scale * p.program_deep_factor
    ks = p.kernel_scale * rho
    ko = p.kernel_offset * rho + (0.0 if prog.isolated else p.program_offset)
    ks_deep = p.kernel_scale * rho_deep
    ko_deep = p.kernel_offset * rho_deep + (0.0 if prog.isolated else p.program_offset)
    kmin = p.kernel_min
    floor = p.timing_floor
    keepalive = p.host_keepalive_v1 if prog.keepalive == "v1" else p.host_keepalive
    fill = max(p.fill_items, 1e-9)
    lat = p.launch_latency
    ops = prog.ops
    copies = prog.copy_bytes
    first_body, last_body = _graph_region(prog) if graph else (0, len(ops))
    in_graph = False
    gap_direct = p.kernel_gap
    gap_graph = p.graph_node_gap
    for i, o in enumerate(ops):
        if graph and i == first_body:
            t_h += p.graph_launch
            in_graph = True
        if graph and i == last_body:
            in_graph = False
        k = o.kind
        if k == KERNEL:
            c = 0
            if o.unit in copies:
                d = max(kmin, 2.0 * copies[o.unit] / max(p.copy_bandwidth, 1.0))
                f = 0.0
            else:
                try:
                    info = units[o.unit]
                except KeyError:
                    raise InteropError(f"no isolated latency for unit {o.unit!r}") from None
                u, w = info[0], info[1]
                if len(info) > 2:
                    c = classes.setdefault(info[2], len(classes) + 1)
                if len(info) > 3 and info[3]:
                    d = u                     # given as in-program kernel seconds (no isolated -> in-program map)
                else:
                    if len(info) > 4 and info[4]:
                        u -= floor / info[4]  # the timing's once-per-timing part, amortised over its calls
                    if len(info) > 5 and info[5]:
                        d = max(ks_deep * u + ko_deep, kmin * rho_deep)
                    else:
                        d = max(ks * u + ko, kmin * rho)
                f = w / fill
                f = min(f, 1.0)
            if not in_graph:
                t_h += p.host_kernel
            queues[cur].append((0, t_h + lat, d, f, gap_graph if in_graph else gap_direct, o.unit, c))
        elif k == SYNC:
            if not in_graph:
                t_h += p.host_sync
            a, b = sid(o.a), sid(o.b)
            e = n_events
            n_events += 1
            queues[a].append((1, t_h + lat, e))
            queues[b].append((2, t_h + lat, e, p.graph_event_latency if in_graph else p.event_latency))
        elif k == SET:
            if not in_graph:
                t_h += p.host_set
            cur = sid(o.a)
        elif k == RELEASE:
            if not in_graph:
                t_h += keepalive * o.calls
        elif k == CALL:
            t_h += p.call_overhead
        else:
            raise InteropError(f"unknown issued op {k!r}")
    host_end = t_h
    inter = None
    if p.interference and classes:
        n = len(classes) + 1
        inter = [[0.0] * n for _ in range(n)]
        for key, x in p.interference.items():
            victim, _, aggressor = key.partition("<-")
            if victim in classes and aggressor in classes:
                inter[classes[victim]][classes[aggressor]] = float(x)
        if not any(any(row) for row in inter):
            inter = None
    dev_end, spans = _device(queues, n_events, inter, trace)
    kern = {}
    if trace:
        inv = {v: k for k, v in smap.items()}
        kern = {name: (inv[s], a, b) for name, (s, a, b) in spans.items()}
    return Timeline(latency=max(host_end, dev_end) + p.tail, host_end=host_end, device_end=dev_end, kernels=kern)


def _graph_region(prog: IssuedProgram) -> tuple[int, int]:
    """``[first, last)``: the ops inside the captured region (between the input copies and the output copies)."""
    ops = prog.ops
    copies = prog.copy_bytes
    first = 0
    while first < len(ops) and ops[first].kind == KERNEL and ops[first].unit.startswith("__in") \
            and ops[first].unit in copies:
        first += 1
    last = first
    for i in range(len(ops) - 1, first - 1, -1):
        o = ops[i]
        if not (o.kind == KERNEL and o.unit.startswith("__out") and o.unit in copies):
            last = i + 1
            break
    return first, last


def _device(queues: list[list[tuple]], n_events: int, inter, trace: bool):
    """Fluid discrete-event simulation of the stream queues. Items: ``(0, ready, d, f, gap, name, class)``
    kernel, ``(1, ready, e)`` event record, ``(2, ready, e, latency)`` event wait. ``inter[v][a]``: slowdown of a
    class-``v`` kernel while a class-``a`` kernel runs (None: no interference). Returns (end time, spans)."""
    S = len(queues)
    head = [0] * S
    qlen = [len(q) for q in queues]
    phase = [0] * S          # 0 idle, 1 fixed delay (gap / event latency), 2 running a kernel
    until = [0.0] * S        # end of the fixed delay
    pend: list = [None] * S  # kernel item to run after the gap
    rem = [0.0] * S          # remaining work (seconds at full rate)
    dem = [0.0] * S
    cls = [0] * S
    start = [0.0] * S
    names = [""] * S
    rate = [1.0] * S
    fired = [False] * n_events
    waiting: list[list[int]] = [[] for _ in range(n_events)]
    running: list[int] = []
    delayed: list[int] = []
    future: list[tuple[float, int]] = []   # (issue time, stream) of idle streams whose next item is not issued
    spans: dict[str, tuple[int, float, float]] = {}
    push, pop = heapq.heappush, heapq.heappop

    def run_kernel(s: int, it: tuple, now: float) -> None:
        """Stream ``s`` starts kernel item ``it`` at ``now`` (after its gap, if it had one)."""
        phase[s] = 2
        rem[s] = it[2]
        dem[s] = it[3]
        cls[s] = it[6]
        start[s] = now
        names[s] = it[5]
        running.append(s)

    t = 0.0
    dirty = list(range(S))
    while True:
        while dirty:
            s = dirty.pop()
            if phase[s] != 0:
                continue
            q = queues[s]
            h = head[s]
            n = qlen[s]
            while h < n:
                it = q[h]
                if it[1] > t:
                    push(future, (it[1], s))
                    break
                kind = it[0]
                if kind == 1:                       # event record: fires now
                    e = it[2]
                    fired[e] = True
                    h += 1
                    if waiting[e]:
                        dirty.extend(waiting[e])
                        waiting[e] = []
                    continue
                if kind == 2:                       # event wait
                    e = it[2]
                    if not fired[e]:
                        waiting[e].append(s)
                        break
                    h += 1
                    if it[3] > 0.0:
                        phase[s] = 1
                        until[s] = t + it[3]
                        pend[s] = None
                        delayed.append(s)
                        break
                    continue
                h += 1                              # kernel
                if it[4] > 0.0:
                    phase[s] = 1
                    until[s] = t + it[4]
                    pend[s] = it
                    delayed.append(s)
                else:
                    run_kernel(s, it, t)
                break
            head[s] = h
        if not running and not delayed and not future:
            break
        # rates of the running kernels
        load = 0.0
        for s in running:
            load += dem[s]
        base = 1.0 if load <= 1.0 else 1.0 / load
        if inter is not None and len(running) > 1:
            for s in running:
                row = inter[cls[s]]
                x = 0.0
                for s2 in running:
                    if s2 != s:
                        x += row[cls[s2]]
                rate[s] = base / (1.0 + x)
        else:
            for s in running:
                rate[s] = base
        # next event
        tn = math.inf
        for s in delayed:
            tn = min(tn, until[s])
        for s in running:
            x = t + rem[s] / rate[s]
            tn = min(tn, x)
        if future and future[0][0] < tn:
            tn = future[0][0]
        if tn == math.inf:
            break
        dt = tn - t
        lim = tn * (1.0 + 1e-12)
        still = []
        for s in running:
            r = rate[s]
            if t + rem[s] / r <= lim:           # finishes at tn (no rounding residue)
                phase[s] = 0
                if trace:
                    spans[names[s]] = (s, start[s], tn)
                dirty.append(s)
            else:
                rem[s] -= dt * r
                still.append(s)
        running = still
        if delayed:
            still = []
            for s in delayed:
                if until[s] <= tn:
                    it = pend[s]
                    if it is not None:
                        pend[s] = None
                        run_kernel(s, it, tn)
                    else:
                        phase[s] = 0
                        dirty.append(s)
                else:
                    still.append(s)
            delayed = still
        while future and future[0][0] <= tn:
            dirty.append(pop(future)[1])
        t = tn
    for s in range(S):
        if head[s] < qlen[s]:
            raise InteropError(f"deadlock in the issued program: stream {s} waits for an event that is never "
                               "recorded")
    return t, spans


def is_deep(unit) -> bool:
    """Whether ``unit`` is a deep convolution (reduction depth >= :data:`DEEP_REDUCTION`): inside a whole program
    such a kernel runs ``program_deep_factor`` times longer than ``program_scale`` says. Why: kernel by
    kernel, the 2026-11-28 H200 timelines split along this axis: in Inception-v3's sequential program
    (``scripts/kernel_map_check.py``, ``docs/kernel_map_h200_inception_v3.json``) deep convolutions ran 1.32-1.40x
    their isolated time, shallow ones 1.13-1.26x, and NASNet-A-large's deep 1x1 convolutions grew more than the
    model said (``scripts/gpu_kernel_check.py``); one factor for every kernel cannot follow that. The threshold is
    the one ``gpu_kernel_check`` used before any fit, not tuned."""
    depth = reduction_depth(unit)
    return depth is not None and depth >= DEEP_REDUCTION


def unit_class(unit) -> str:
    """The interference class of a unit: ``avg_pool`` (``avg_pool2d``), ``conv_spatial`` (a convolution with a
    kernel larger than 1x1), ``conv_1x1``, or ``other``. On the H100 with TVM's default (DLight) CUDA kernels,
    a spatial convolution runs 3-6x slower while an avg_pool2d kernel runs beside it (inception_v3 cost tables:
    the isolated pair costs pool + ~5x conv); every other pair shares the device as the fluid model says."""
    kind = getattr(unit, "kind", "")
    if kind == "avg_pool2d":
        return "avg_pool"
    if kind == "conv2d":
        ws = conv_weight_shape(unit)
        return "conv_spatial" if ws is not None and ws[2] * ws[3] > 1 else "conv_1x1"
    return "other"


# ---------------------------------------------------------------------------------------------- the model
class ProgramCostModel:
    """Predicts a whole program's latency on a GPU.

    ``unit_latency``: isolated latency per unit name (seconds: a cost table's ``units``, or a ``CostModel`` whose
    ``unit_latency`` is asked for each unit of the graph); ``timing_number``: calls per timing of the protocol that
    measured them (a cost table's ``number``; taken from a ``TableCostModel``; ``0``: the latencies are not
    timings and carry no per-timing floor, as a simulated cost; required with a mapping when the parameters have a
    ``timing_floor``); ``params``: :class:`ProgramCostParams` (default: the
    fitted H100 set when ``docs/gpu_cost_model.json`` exists, else the defaults)::

        model = ProgramCostModel(TableCostModel("costs.json"), load_fitted())   # its units and their timing protocol
        seconds = model.predict(program, schedule, mode="dependency", cuda_graph=True)
    """

    def __init__(self, unit_latency, params: ProgramCostParams | None = None, max_streams: int = 8,
                 timing_number: int | None = None):
        if timing_number is None:
            timing_number = _table_number(unit_latency)
        if timing_number is not None and not int(timing_number) >= 0:
            raise InteropError(f"timing_number must be >= 1 (calls per timing of the unit table) or 0 (latencies "
                               f"that are not timings), got {timing_number}")
        if params is None:
            try:
                params = load_fitted()
            except InteropError:
                params = ProgramCostParams()
        if timing_number is None and isinstance(unit_latency, Mapping) and params.timing_floor > 0:
            # measured latencies read lower the more calls one timing averages; without the protocol the kernel map
            # would be off by up to timing_floor per unit (the 2026-11-26 tables against those of 2026-11-22)
            raise InteropError("unit latencies given as a mapping: say how they were timed, timing_number=<the cost "
                               "table's 'number'> (calls per timing), or timing_number=0 if they are not timings")
        self.timing_number = int(timing_number) if timing_number else None
        self.params = params
        self.unit_latency = unit_latency
        self.max_streams = max_streams

    def unit_inputs(self, graph) -> dict[str, tuple]:
        """``{unit: (isolated latency, work items, class, False, timing number, deep)}`` for every unit of ``graph``
        (the tuple :func:`simulate` takes)."""
        out = {}
        lat = self.unit_latency
        for u in graph.units:
            if isinstance(lat, Mapping):
                if u.name not in lat:
                    raise InteropError(f"no isolated latency for unit {u.name!r} (graph {graph.name!r})")
                x = float(lat[u.name])
            else:
                x = float(lat.unit_latency(u))
            out[u.name] = (x, work_items(u), unit_class(u), False, self.timing_number or 0, is_deep(u))
        return out

    def simulate(self, program, schedule, mode: str = "stage", cuda_graph: bool = False,
                 trace: bool = False, waits: str | None = None) -> Timeline:
        prog = issued_program(program, schedule, mode, cuda_graph, self.max_streams, waits=waits)
        return simulate(prog, self.unit_inputs(program.graph), self.params, trace=trace)

    def predict(self, program, schedule, mode: str = "stage", cuda_graph: bool = False,
                waits: str | None = None) -> float:
        """Seconds for one call of the lowered program (wall clock + device sync); ``waits``: the dependency
        mode's wait placement the build used (default: today's lowering; ``"consumer"`` for builds before
        2026-11-27)."""
        return self.simulate(program, schedule, mode, cuda_graph, waits=waits).latency

    def predict_issued(self, prog: IssuedProgram, units: Mapping[str, tuple[float, float]]) -> float:
        return simulate(prog, units, self.params).latency


def _table_number(unit_latency) -> int | None:
    """The ``number`` of the table behind ``unit_latency`` (a ``TableCostModel`` or a cost-table dict), else None."""
    table = getattr(unit_latency, "table", None)
    if isinstance(unit_latency, Mapping) and unit_latency.get("format") == "tvm-interop-cost-table":
        raise InteropError("pass a cost table's 'units' and its 'number' (timing_number), not the whole table")
    if isinstance(table, Mapping) and table.get("number"):
        return int(table["number"])
    return None


def work_items(unit) -> float:
    """Output elements of ``unit`` (at least 1): how much of the device it can fill (as ``passes.cost.simulated``)."""
    w = 0
    for t in unit.outputs:
        w += t.numel
    return float(max(1, w))


def sum_stage_costs(schedule, graph, cost) -> float:
    """The baseline the program model replaces: the sum of the schedule's isolated stage costs under ``cost``."""
    total = 0.0
    for st in schedule.stages:
        total += cost.stage_latency([[graph.unit(n) for n in g] for g in st.groups], st.strategy)
    return total


__all__ = [
    "CALL",
    "KERNEL",
    "MAIN",
    "DEEP_REDUCTION",
    "PARAM_DOCS",
    "RELEASE",
    "SET",
    "SYNC",
    "IssuedOp",
    "IssuedProgram",
    "ProgramCostModel",
    "ProgramCostParams",
    "Timeline",
    "conv_weight_shape",
    "from_stream_program",
    "is_deep",
    "issued_program",
    "load_fitted",
    "reduction_depth",
    "simulate",
    "stage_ops",
    "sum_stage_costs",
    "table_protocol_program",
    "unit_class",
    "work_items",
]


def _asdict(p: ProgramCostParams) -> dict:  # pragma: no cover - debugging helper
    return asdict(p)
