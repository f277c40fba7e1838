"""Lowering, part 2: the stream-lowered Relax program (what the VM runs, on GPU streams).

``lower_to_relax(program, schedule, target, max_streams=8, mode="stage", cuda_graph=False)`` returns a copy of the
prepared module with these functions (names in :mod:`runtime.cuda`):

* ``__tvm_interop_main(*inputs, streams)``: the units in schedule order, each group dispatched to its stream
  (``runtime.Device_SetStream``), ordering by events (``runtime.Device_StreamSyncFromTo(dev, src, dst)`` records
  an event on ``src`` and makes ``dst`` wait for it; never a device-wide synchronisation):

  - *stage mode*: a concurrent stage forks every stream it uses from the caller's stream, issues its groups,
    and joins them back (the caller's stream waits for each). A single-group stage runs on the caller's stream.
  - *dependency mode*: every stream is forked from the caller's stream once at the start; a group then waits
    only for the streams of the units it reads from (and only when stream order and earlier events do not
    already guarantee it); all streams are joined into the caller's stream at the end. Streams are assigned
    with affinity: a group continues on the stream whose last unit it reads from, else on the least recently
    used stream not taken in its stage. The waits of the first group on each stream are issued at the start of
    its stage, before any unit of the stage: an event is recorded when it is issued, so a wait issued right
    before its group (``waits="consumer"``, the builds before 2026-11-27) also waited for the stage's groups
    queued behind the producer on its stream, and the groups of a stage ran one after another (Inception-v3 ios
    on an H100: 6.38 ms against 4.40 ms in stage mode). Issued at the stage's start, dependency mode orders
    nothing that stage mode does not (``tests/test_dependency_waits.py``).

  The "caller's stream" is the stream current when the function is entered (read with a tiny host function
  ``__tvm_interop_current_stream`` that returns ``TVMFFIEnvGetStream``), not a hard-coded stream 0: under
  CUDA-graph capture it is the capture stream, otherwise usually the legacy default stream. Concurrent groups
  never run on it (work on the legacy stream would serialise against every other stream).
* ``__tvm_interop_streams()`` / ``__tvm_interop_free_streams(streams)``: create / free the streams, so they are
  created **once per loaded model**: ``main`` takes them from the VM's per-VM cache
  (``vm.builtin.cuda_graph.get_cached_alloc``, which runs the creating function on the first call and keeps the
  result for the life of that VirtualMachine); ``runtime.ScheduledModel`` calls ``__tvm_interop_streams`` once
  and frees them on ``close``. On a CPU, ``main`` passes null handles (no streams exist; the calls are no-ops).
* ``__tvm_interop_main_graph`` (``cuda_graph=True``, CUDA targets): the same program with the inputs copied into
  static buffers first and the outputs copied out last, so that TVM's ``RewriteCUDAGraph`` (applied to this
  function only, see ``passes.cuda_build``) lifts everything in between into one captured graph.
* ``main(*inputs)``: calls one of the two with the cached streams.
* ``__tvm_interop_stage_times(streams)`` (``stage_timing=True``: CUDA, stage mode, no CUDA graph): the last
  call's in-context time of every stage, in ms. The scheduled function records a timing event of the native
  extension (``tvm_interop.cuda.timing_record``) on the caller's stream when each stage begins and after the last;
  in stage mode every stage is joined into that stream before the next one starts, so consecutive events span
  what each stage cost *inside the program* (its launch gaps, host work and events included), and the times add
  up to the program's device time. A stage timed alone (the cost tables) leaves all that out, which is why
  isolated stage costs did not add up to the program on the H100 (issue 12). The timing pool is the last handle.

The number of streams is ``min(max_streams, widest stage)``; ``max_streams`` above :func:`stream_limit` (32, or
``TVM_INTEROP_STREAM_LIMIT``) is clamped with a logged warning. Groups beyond the streams share them
round-robin (same-stream work is ordered, so this stays correct).

Memory (DESIGN.md): TVM's ``StaticPlanBlockMemory`` frees a tensor's storage after the tensor's last *use in
program order* and hands it to the next allocation; with streams, that next kernel may run while the last user
is still running on another stream. (A tuple binding of the tensors is *not* a use, and a call of a no-op
PrimFunc is a *pure* call that FoldConstant and FuseTIR delete: both were tried, and the second raced on an
H100.) So every tensor is kept alive, by passing it to an impure packed call (``runtime.cuda.KEEPALIVE_FUNC``),
which the planner counts as a use and which no Relax pass may remove, until its **release point**: the
first unit in issue order after which every unit issued *happens after* (by stream order and events) every
unit that touches the tensor. It is computed with vector clocks over the issued stream program
(:func:`release_points`), which covers both modes: in stage mode the release point is the first unit after the
stage's join, in dependency mode wherever the event graph makes it safe (at the latest: after the final join).
The same rule keeps the VM's pooled allocator safe (a storage returns to the pool only after its tensors'
releases). ``passes.stream_memory.check_stream_memory_safety`` verifies the result on the memory-planned IR.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import tvm
from tvm import relax, tirx

from tvm_interop.runtime.cuda import (COPY_FUNC, CURRENT_STREAM_FUNC, DL_DEVICE_TYPE, FREE_STREAMS_FUNC, KEEPALIVE_FUNC,
                          MAIN_FUNC, MAIN_GRAPH_FUNC, STAGE_TIMES_FUNC, STREAM_CACHE_INDEX, STREAMS_FUNC)
from tvm_interop.runtime.errors import InteropError, ScheduleError

from .extract import Program
from .schedule import MERGE, Schedule
from .target import GPU_KINDS, device_kind

log = logging.getLogger(__name__)

MAIN = -1                 # the caller's stream
DEFAULT_MAX_STREAMS = 8
DEFAULT_STREAM_LIMIT = 32
MODES = ("stage", "dependency")
# Dependency mode, where a group's cross-stream waits are issued: "stage-start" (before any unit of its stage, for
# the first group on each stream) or "consumer" (right before the group; the builds before 2026-11-27).
WAIT_PLACEMENTS = ("stage-start", "consumer")
DEFAULT_WAIT_PLACEMENT = "stage-start"
KEEPALIVE_CHUNK = 16      # tensors per keep-alive call

SYNC = "runtime.Device_StreamSyncFromTo"
# Reused events (``sync="events"``, CUDA): a pool of events created once per loaded model by the native extension
# (``runtime/native``), one per source stream; ``event_sync(pool, k, src, dst)`` records event k on src and makes dst
# wait for it. TVM's SYNC creates and destroys an event on every call.
SYNC_MODES = ("tvm", "events")
EVENTS_CREATE = "tvm_interop.cuda.events_create"
EVENTS_FREE = "tvm_interop.cuda.events_free"
EVENT_SYNC = "tvm_interop.cuda.event_sync"
# In-context stage timing (``stage_timing=True``): a pool of timing events of the native extension, one per stage
# boundary, recorded on the caller's stream; ``__tvm_interop_stage_times(streams)`` reads the last call's times.
TIMING_CREATE = "tvm_interop.cuda.timing_create"
TIMING_FREE = "tvm_interop.cuda.timing_free"
TIMING_RECORD = "tvm_interop.cuda.timing_record"
TIMING_READ = "tvm_interop.cuda.timing_read"
SET = "runtime.Device_SetStream"
CREATE = "runtime.Device_StreamCreate"
FREE = "runtime.Device_StreamFree"


def stream_limit() -> int:
    """The most streams a model may use (``TVM_INTEROP_STREAM_LIMIT``, default 32)."""
    try:
        return max(1, int(os.environ.get("TVM_INTEROP_STREAM_LIMIT", DEFAULT_STREAM_LIMIT)))
    except ValueError:
        return DEFAULT_STREAM_LIMIT


def resolve_stream_count(max_streams: int, concurrency: int) -> int:
    """Streams to create for a schedule whose widest stage has ``concurrency`` groups (0: run sequentially)."""
    if not isinstance(max_streams, int) or max_streams < 1:
        raise InteropError(f"max_streams must be an integer >= 1, got {max_streams!r}")
    limit = stream_limit()
    if max_streams > limit:
        log.warning("max_streams=%d is more than the %d streams allowed (TVM_INTEROP_STREAM_LIMIT); using %d",
                    max_streams, limit, limit)
        max_streams = limit
    if concurrency <= 1 or max_streams <= 1:
        return 0
    return min(max_streams, concurrency)


# ---------------------------------------------------------------------------------------------- stream program
@dataclass
class StreamOp:
    """One step of the issued program: ``sync`` (event a -> b), ``set`` (current stream = a), ``unit`` (a
    kernel on the current stream) or ``release`` (end the keep-alive of ``tensors``)."""

    kind: str
    a: int = MAIN
    b: int = MAIN
    unit: str = ""
    tensors: list = field(default_factory=list)
    stage: int = -1


@dataclass
class StreamProgram:
    """The issue order of one lowered function, before it becomes Relax (what tests and the checker reason on).

    Unit names starting with ``__in`` / ``__out`` are the input / output copies of the CUDA-graph variant.
    Tensor keys: ``("u", unit, k)`` (output k of a unit) and ``("i", k)`` (staged input k).
    """

    mode: str
    num_streams: int
    ops: list[StreamOp]
    unit_stream: dict[str, int]
    users: dict[tuple, list[str]] = field(default_factory=dict)

    def count(self, kind: str) -> int:
        return sum(1 for o in self.ops if o.kind == kind)

    def per_stage(self) -> dict[int, dict[str, int]]:
        out: dict[int, dict[str, int]] = {}
        for o in self.ops:
            if o.kind in ("sync", "set"):
                d = out.setdefault(o.stage, {"sync": 0, "set": 0})
                d[o.kind] += 1
        return out


def stage_groups(stage) -> list[list[str]]:
    """The groups a stage issues, each on its own stream (a merge stage's units run as separate kernels here)."""
    return [[u] for u in stage.units] if stage.strategy == MERGE else [list(g) for g in stage.groups]


def plan_streams(program: Program, schedule: Schedule, mode: str = "stage", num_streams: int = 0,
                 staged_io: bool = False, keep_alive: bool = True,
                 waits: str = DEFAULT_WAIT_PLACEMENT) -> StreamProgram:
    """Decide streams, events and keep-alive releases for ``schedule`` (see the module docstring).

    ``waits`` (dependency mode): where a cross-stream wait is issued, :data:`WAIT_PLACEMENTS`; ``"consumer"`` is
    the placement of the builds before 2026-11-27, kept to reproduce what they issued (``scripts/fit_gpu_cost.py``).
    """
    if mode not in MODES:
        raise InteropError(f"unknown synchronisation mode {mode!r}; use one of {MODES}")
    if waits not in WAIT_PLACEMENTS:
        raise InteropError(f"unknown wait placement {waits!r}; use one of {WAIT_PLACEMENTS}")
    ops: list[StreamOp] = []
    unit_stream: dict[str, int] = {}
    n_in = len(program.input_names)
    out_refs = program.output_refs()
    if staged_io:
        for i in range(n_in):
            ops.append(StreamOp("unit", unit=f"__in{i}"))
            unit_stream[f"__in{i}"] = MAIN
    if num_streams <= 0:
        for si, stage in enumerate(schedule.stages):
            for g in stage_groups(stage):
                for u in g:
                    ops.append(StreamOp("unit", unit=u, stage=si))
                    unit_stream[u] = MAIN
    elif mode == "stage":
        for si, stage in enumerate(schedule.stages):
            groups = stage_groups(stage)
            if len(groups) == 1:
                for u in groups[0]:
                    ops.append(StreamOp("unit", unit=u, stage=si))
                    unit_stream[u] = MAIN
                continue
            used = list(dict.fromkeys(gi % num_streams for gi in range(len(groups))))
            for s in used:
                ops.append(StreamOp("sync", MAIN, s, stage=si))
            cur = MAIN
            for gi, g in enumerate(groups):
                s = gi % num_streams
                if s != cur:
                    ops.append(StreamOp("set", s, stage=si))
                    cur = s
                for u in g:
                    ops.append(StreamOp("unit", unit=u, stage=si))
                    unit_stream[u] = s
            ops.append(StreamOp("set", MAIN, stage=si))
            for s in used:
                ops.append(StreamOp("sync", s, MAIN, stage=si))
    else:
        ops.extend(_dependency_ops(program, schedule, num_streams, unit_stream, waits))
    if staged_io:
        for k in range(len(out_refs)):
            ops.append(StreamOp("unit", unit=f"__out{k}"))
            unit_stream[f"__out{k}"] = MAIN
    users = _tensor_users(program, staged_io)
    sp = StreamProgram(mode=mode, num_streams=num_streams, ops=ops, unit_stream=unit_stream, users=users)
    if keep_alive:
        _insert_releases(sp)
    return sp


def _dependency_ops(program: Program, schedule: Schedule, n: int, unit_stream: dict[str, int],
                    waits: str = DEFAULT_WAIT_PLACEMENT) -> list[StreamOp]:
    graph = program.graph
    # pass 1: assign streams (affinity to the stream whose tail is a producer, else least recently used)
    assign: list[tuple[int, list[str], int]] = []   # (stage, group, stream)
    tail: dict[int, str] = {}
    last_used: dict[int, int] = {s: s - n for s in range(n)}  # lower = used longer ago (ties: low ids first)
    where: dict[str, int] = {}
    tick = 0
    for si, stage in enumerate(schedule.stages):
        groups = stage_groups(stage)
        taken: set[int] = set()
        for gi, g in enumerate(groups):
            prods = [p for u in g for p in graph.pred_names(u) if p not in g]
            choice = None
            for p in reversed(prods):
                s = where.get(p)
                if s is not None and s not in taken and tail.get(s) == p:
                    choice = s
                    break
            if choice is None:
                free = [s for s in range(n) if s not in taken]
                choice = min(free, key=lambda s: last_used[s]) if free else gi % n
            taken.add(choice)
            for u in g:
                where[u] = choice
            tail[choice] = g[-1]
            tick += 1
            last_used[choice] = tick
            assign.append((si, g, choice))
    used = sorted({s for _, _, s in assign})
    # pass 2: events, with vector clocks so that no event is issued that order already guarantees
    ops = [StreamOp("sync", MAIN, s, stage=-1) for s in used]
    count: dict[int, int] = {MAIN: 0}
    vc: dict[int, dict[int, int]] = {MAIN: {}}
    for s in used:
        count[s] = 0
        vc[s] = {MAIN: 0}
    loc: dict[str, tuple[int, int]] = {}

    def sync(src: int, dst: int, stage: int) -> None:
        ops.append(StreamOp("sync", src, dst, stage=stage))
        merged = dict(vc[dst])
        for k, v in vc[src].items():
            if v > merged.get(k, 0):
                merged[k] = v
        merged[src] = max(merged.get(src, 0), count[src])
        vc[dst] = merged

    def waits_for(g: list[str], s: int, si: int) -> None:
        for u in g:
            for p in graph.pred_names(u):
                if p in loc:
                    ps, pi = loc[p]
                    if ps != s and vc[s].get(ps, 0) <= pi:
                        sync(ps, s, si)

    cur = MAIN
    first_on_stream: set[tuple[int, int]] = set()   # (stage, stream) whose first group's waits were hoisted
    for k, (si, g, s) in enumerate(assign):
        if waits == "stage-start" and (k == 0 or assign[k - 1][0] != si):
            # a new stage: the first group on each stream waits here, before any unit of the stage is issued, so
            # each event is recorded before the stage's other groups are queued behind its producer (issued at
            # the group, the record would also wait for them: the groups of a stage would run one after another)
            for sj, gj, sk in assign[k:]:
                if sj != si:
                    break
                if (si, sk) not in first_on_stream:
                    first_on_stream.add((si, sk))
                    waits_for(gj, sk, si)
        for u in g:
            for p in graph.pred_names(u):
                ps, pi = loc[p]
                if ps != s and vc[s].get(ps, 0) <= pi:
                    sync(ps, s, si)
            if s != cur:
                ops.append(StreamOp("set", s, stage=si))
                cur = s
            ops.append(StreamOp("unit", unit=u, stage=si))
            unit_stream[u] = s
            loc[u] = (s, count[s])
            count[s] += 1
    last = len(schedule.stages) - 1
    if cur != MAIN:
        ops.append(StreamOp("set", MAIN, stage=last))
    # join the stream that issued last first: its clock usually covers the others already
    last_unit = {s: i for i, (_, _, s) in enumerate(assign)}
    for s in sorted(used, key=lambda s: -last_unit.get(s, -1)):
        if vc[MAIN].get(s, 0) < count[s]:
            sync(s, MAIN, last)
    return ops


def _tensor_users(program: Program, staged_io: bool) -> dict[tuple, list[str]]:
    users: dict[tuple, list[str]] = {}
    for name, uc in program.calls.items():
        for k in range(len(uc.outputs)):
            users.setdefault(("u", name, k), []).append(name)
    for name, uc in program.calls.items():
        for a in uc.args:
            for r in a.flatten():
                if r.kind == "unit":
                    users[("u", r.unit, r.index)].append(name)
                elif r.kind == "input" and staged_io:
                    users.setdefault(("i", r.index), [f"__in{r.index}"]).append(name)
    if staged_io:
        for i in range(len(program.input_names)):
            users.setdefault(("i", i), [f"__in{i}"])
        for k, r in enumerate(program.output_refs()):
            if r.kind == "unit":
                users[("u", r.unit, r.index)].append(f"__out{k}")
            elif r.kind == "input":
                users[("i", r.index)].append(f"__out{k}")
    return users


@dataclass
class _Issued:
    pos: int          # position among unit ops
    stream: int
    idx: int          # index on its stream
    vc: dict          # stream -> ops of that stream complete before this one starts (own stream: idx)


def simulate(ops: list[StreamOp]) -> dict[str, _Issued]:
    """Vector clocks of every unit op: which earlier ops are guaranteed complete when it starts."""
    count: dict[int, int] = {}
    vc: dict[int, dict[int, int]] = {}
    cur = MAIN
    out: dict[str, _Issued] = {}
    pos = 0
    for o in ops:
        if o.kind == "set":
            cur = o.a
        elif o.kind == "sync":
            src, dst = o.a, o.b
            merged = dict(vc.get(dst, {}))
            for k, v in vc.get(src, {}).items():
                if v > merged.get(k, 0):
                    merged[k] = v
            merged[src] = max(merged.get(src, 0), count.get(src, 0))
            vc[dst] = merged
        elif o.kind == "unit":
            n = count.get(cur, 0)
            snap = dict(vc.get(cur, {}))
            snap[cur] = n
            out[o.unit] = _Issued(pos, cur, n, snap)
            count[cur] = n + 1
            pos += 1
    return out


def release_points(sp: StreamProgram, issued: dict[str, _Issued] | None = None) -> dict[tuple, int]:
    """For every tensor, the position of the first unit before which it may be released (``len(units)`` = only
    after the end). See the module docstring; each stream's clock only grows, so per stream the units that are
    ordered after all of a tensor's users form a suffix, found by bisection."""
    issued = issued or simulate(sp.ops)
    by_stream: dict[int, list[_Issued]] = {}
    for it in sorted(issued.values(), key=lambda i: i.pos):
        by_stream.setdefault(it.stream, []).append(it)
    n_units = len(issued)
    out: dict[tuple, int] = {}
    for key, us in sp.users.items():
        its = [issued[u] for u in us if u in issued]
        if not its:
            continue
        frontier: dict[int, int] = {}
        for it in its:
            frontier[it.stream] = max(frontier.get(it.stream, -1), it.idx)
        last = max(it.pos for it in its)
        point = last + 1

        def covered(v: _Issued) -> bool:
            return all(v.vc.get(s, 0) > f for s, f in frontier.items())

        for s, lst in by_stream.items():
            lo, hi = 0, len(lst)
            while lo < hi:  # first covered unit on this stream
                mid = (lo + hi) // 2
                if covered(lst[mid]):
                    hi = mid
                else:
                    lo = mid + 1
            if lo > 0 and lst[lo - 1].pos > last:
                point = max(point, lst[lo - 1].pos + 1)
        out[key] = min(point, n_units)
    return out


def _insert_releases(sp: StreamProgram) -> None:
    issued = simulate(sp.ops)
    points = release_points(sp, issued)
    n_units = len(issued)
    last_use = {key: max(issued[u].pos for u in us if u in issued) for key, us in sp.users.items()
                if any(u in issued for u in us)}
    before: dict[int, list] = {}
    for key, p in points.items():
        if p > last_use[key] + 1:
            before.setdefault(p, []).append(key)
    if not before:
        return
    new_ops: list[StreamOp] = []
    pos = 0
    # the end releases go after the final join, before the output copies (which stay outside the graph)
    end_at = len(sp.ops)
    for i, o in enumerate(sp.ops):
        if o.kind == "unit" and o.unit.startswith("__out"):
            end_at = i
            break
    for i, o in enumerate(sp.ops):
        if i == end_at and n_units in before:
            new_ops.append(StreamOp("release", tensors=sorted(before.pop(n_units), key=str)))
        if o.kind == "unit":
            if pos in before:
                new_ops.append(StreamOp("release", tensors=sorted(before.pop(pos), key=str), stage=o.stage))
            pos += 1
        new_ops.append(o)
    for p in sorted(before):
        new_ops.append(StreamOp("release", tensors=sorted(before[p], key=str)))
    sp.ops = new_ops


# ---------------------------------------------------------------------------------------------- relax
def _str(text: str):
    cls = getattr(relax.expr, "StringImm", None) or tvm.ir.expr.StringImm
    return cls(text)


def _i64(v: int):
    return relax.prim_value(tirx.IntImm("int64", v))


def i32_value(v: int):
    return relax.prim_value(tirx.IntImm("int32", v))


def _current_stream_func() -> tirx.PrimFunc:
    """``int64 f(dev_type, dev_id)``: the stream current on the device (``TVMFFIEnvGetStream``), a host function."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def current_stream(dev_type: T.int32, dev_id: T.int32) -> T.int64:
        T.func_attr({"tirx.is_host_func": True, "tirx.is_scheduled": True})
        # TVMFFIEnvGetStream returns a pointer; on the 64-bit hosts TVM supports it comes back in the integer
        # return register, so declaring it int64 reads the handle as the integer the stream calls take.
        return T.call_extern("int64", "TVMFFIEnvGetStream", dev_type, dev_id)

    return current_stream


@dataclass
class Lowered:
    """What ``lower_program`` produced: the module, the stream programs of its functions, and decisions."""

    mod: tvm.IRModule
    programs: dict[str, StreamProgram]
    num_streams: int
    mode: str
    device: str
    cuda_graph: bool
    cuda_graph_reason: str | None = None
    prefix: str = ""
    sync: str = "tvm"      # what orders the streams: TVM's per-call event, or the reused events ("events")
    waits: str = DEFAULT_WAIT_PLACEMENT   # dependency mode: where cross-stream waits are issued (WAIT_PLACEMENTS)
    stage_timing: bool = False   # the function records in-context stage times (``stage_times_function``)

    @property
    def stage_times_function(self) -> str:
        """The function that returns the last call's in-context stage times (present when ``stage_timing``)."""
        return self.prefix + STAGE_TIMES_FUNC

    @property
    def graph_function(self) -> str:
        """The name of the CUDA-graph variant's function (present when ``cuda_graph``)."""
        return self.prefix + MAIN_GRAPH_FUNC


class ProgramEmitter:
    """Shared state of one lowering: the BlockBuilder and the helper functions added to it."""

    def __init__(self, program: Program, device: str, lift_constants: bool = False, prefix: str = "",
                 sync: str = "tvm", timed_stages: int = 0):
        if sync not in SYNC_MODES:
            raise InteropError(f"unknown sync {sync!r}; use one of {SYNC_MODES}")
        if sync == "events" and device != "cuda":
            raise InteropError(f"sync='events' uses CUDA events; the target device is {device}")
        self.timed_stages = timed_stages   # > 0: record a timing event at every stage boundary
        self.program = program
        self.device = device
        self.sync = sync
        self.lift = lift_constants
        self.prefix = prefix
        self.dev = _str(f"{device}:0")
        self.bb = relax.BlockBuilder()
        self._cur = None
        old_main = program.mod["main"]
        self.old_main = old_main
        self.old_bindings: dict[relax.Var, relax.Expr] = {}
        for block in old_main.body.blocks:
            for b in block.bindings:
                self.old_bindings[b.var] = b.value

    def const_params(self) -> list:
        """With ``lift_constants``: one parameter per model constant (the weights come in as arguments)."""
        if not self.lift:
            return []
        return [relax.Var(f"w{i}", relax.TensorType([int(d) for d in c.value.shape], str(c.value.dtype)))
                for i, c in enumerate(self.program.const_exprs)]

    def packed(self, name: str, *args, ty=None):
        return relax.Call(relax.ExternFunc(name), list(args), ty_args=[ty or relax.ObjectType()])

    def current_stream_gv(self):
        if self._cur is None:
            self._cur = self.bb.add_func(_current_stream_func(), self.prefix + CURRENT_STREAM_FUNC)
        return self._cur

    def keepalive(self, tensors: list) -> relax.Call:
        """A use of ``tensors`` that no pass may remove: a call of an external (packed) function is impure in
        Relax, and dead-code elimination (run inside FoldConstant, FuseTIR, ...) only drops pure calls. The
        callee, :data:`runtime.cuda.KEEPALIVE_FUNC`, packs the handles into a short-lived array: it exists in
        every TVM runtime, touches no device memory, and can sit inside a captured CUDA graph."""
        return relax.Call(relax.ExternFunc(KEEPALIVE_FUNC), list(tensors), ty_args=[relax.ObjectType()])

    # -------------------------------------------------------------- one scheduled function
    def emit_scheduled(self, name: str, sp: StreamProgram, staged: bool, n_streams: int):
        bb = self.bb
        program = self.program
        old_main = self.old_main
        params = [relax.Var(p.name, p.ty) for p in old_main.params]
        const_params = self.const_params()
        const_of = {_const_key(c): v for c, v in zip(program.const_exprs, const_params)}
        stream_ty = relax.TupleType([tvm.ir.PrimType("int64")] * self.handle_count(n_streams))
        streams_param = relax.Var("streams", stream_ty)
        var_map: dict[relax.Var, relax.Expr] = {}
        unit_var: dict[str, relax.Var] = {}
        tensor_var: dict[tuple, relax.Expr] = {}
        old_bindings = self.old_bindings

        def remap(e: relax.Expr) -> relax.Expr:
            if isinstance(e, relax.Var):
                if e in var_map:
                    return var_map[e]
                if e in old_bindings:  # glue binding (tuple / tuple item / alias) whose inputs now exist
                    nv = bb.emit(remap(old_bindings[e]), name_hint=e.name)
                    var_map[e] = nv
                    return nv
                raise ScheduleError(f"variable {e.name} used before it is produced in the schedule")
            if isinstance(e, relax.Tuple):
                return relax.Tuple([remap(f) for f in e.fields])
            if isinstance(e, relax.TupleGetItem):
                return relax.TupleGetItem(remap(e.tuple_value), e.index)
            if isinstance(e, relax.Call):
                return relax.Call(e.op, [remap(a) for a in e.args], e.attrs, e.ty_args)
            if self.lift and isinstance(e, _GenericConst):
                return const_of.get(_const_key(e), e)
            return e

        def tensor(key: tuple) -> relax.Expr:
            if key not in tensor_var:
                if key[0] == "i":
                    tensor_var[key] = var_map[old_main.params[key[1]]]
                else:
                    _, uname, k = key
                    v = unit_var[uname]
                    if isinstance(v.ty, relax.TupleType):
                        tensor_var[key] = bb.emit(relax.TupleGetItem(v, k), name_hint=f"{uname}_{k}")
                    else:
                        tensor_var[key] = v
            return tensor_var[key]

        with bb.function(self.prefix + name, params + const_params + [streams_param],
                         attrs={"num_input": len(params)}, pure=False):
            for old, new in zip(old_main.params, params):
                var_map[old] = bb.emit_te(_identity, new, primfunc_name_hint=self.prefix + COPY_FUNC,
                                          name_hint=f"{old.name}_static") if staged else new
            cur_type = DL_DEVICE_TYPE.get(self.device, 1)
            main_s = bb.emit(relax.Call(self.current_stream_gv(), [i32_value(cur_type), i32_value(0)]), name_hint="main_stream")
            svars = [bb.emit(relax.TupleGetItem(streams_param, k), name_hint=f"stream{k}") for k in range(n_streams)]
            events = bb.emit(relax.TupleGetItem(streams_param, n_streams), name_hint="events") \
                if self.uses_events(n_streams) else None
            timing = bb.emit(relax.TupleGetItem(streams_param, self.handle_count(n_streams) - 1),
                             name_hint="timing") if self.timed_stages else None
            timed = -1   # the last stage whose start was recorded

            def record(k: int) -> None:
                bb.emit(self.packed(TIMING_RECORD, timing, _i64(k), main_s), name_hint="timed")

            def sv(s: int):
                return main_s if s == MAIN else svars[s]

            for o in sp.ops:
                if timing is not None and o.stage > timed:   # stage o.stage begins: all before it is joined
                    record(o.stage)
                    timed = o.stage
                if o.kind == "sync" and events is not None:   # event k belongs to source stream k (MAIN: the last)
                    k = n_streams if o.a == MAIN else o.a
                    bb.emit(self.packed(EVENT_SYNC, events, _i64(k), sv(o.a), sv(o.b)), name_hint="event")
                elif o.kind == "sync":
                    bb.emit(self.packed(SYNC, self.dev, sv(o.a), sv(o.b)), name_hint="event")
                elif o.kind == "set":
                    bb.emit(self.packed(SET, self.dev, sv(o.a)), name_hint="switch")
                elif o.kind == "release":
                    vs = list(dict.fromkeys(tensor(k) for k in o.tensors))
                    for c in range(0, len(vs), KEEPALIVE_CHUNK):
                        bb.emit(self.keepalive(vs[c:c + KEEPALIVE_CHUNK]), name_hint="keepalive")
                elif o.unit.startswith(("__in", "__out")):
                    continue  # the input copies come first (above), the output copies last (below)
                else:
                    uc = program.calls[o.unit]
                    value = old_bindings[uc.binding_var]
                    nv = bb.emit(remap(value), name_hint=uc.binding_var.name)
                    var_map[uc.binding_var] = nv
                    unit_var[o.unit] = nv
            if timing is not None:
                if timed != self.timed_stages - 1:
                    raise InteropError(f"stage timing: recorded {timed + 1} stage starts, the schedule has "
                                       f"{self.timed_stages} stages")
                record(self.timed_stages)
            result = remap(old_main.body.body)
            if staged:  # copy every output leaf out of the static buffers, on the caller's stream
                leaves = _leaves(bb, result)
                copies = [bb.emit_te(_identity, leaf, primfunc_name_hint=self.prefix + COPY_FUNC, name_hint=f"output{k}")
                          for k, leaf in enumerate(leaves)]
                result = _rebuild(result, copies)
            if not isinstance(result, relax.Var):
                result = bb.emit(result, name_hint="result")
            bb.emit_func_output(result)
        return bb.get().get_global_var(self.prefix + name)

    # -------------------------------------------------------------- stream set and the public main
    def uses_events(self, n_streams: int) -> bool:
        return self.sync == "events" and n_streams > 0

    def handle_count(self, n_streams: int) -> int:
        """Handles the scheduled function takes: its streams, then the event pool when it uses reused events, then
        the timing pool when it records stage times."""
        return n_streams + (1 if self.uses_events(n_streams) else 0) + (1 if self.timed_stages else 0)

    def emit_stream_funcs(self, n: int):
        """``__tvm_interop_streams()`` creates the handles once per loaded model (streams, then the event pool: one
        event per stream and one for the caller's stream); ``__tvm_interop_free_streams`` frees them."""
        bb = self.bb
        ty = tvm.ir.PrimType("int64")
        with bb.function(self.prefix + STREAMS_FUNC, [], pure=False):
            hs = [bb.emit(self.packed(CREATE, self.dev, ty=ty), name_hint=f"stream{k}") for k in range(n)]
            if self.uses_events(n):
                hs.append(bb.emit(self.packed(EVENTS_CREATE, _i64(0), _i64(n + 1), ty=ty), name_hint="events"))
            if self.timed_stages:
                hs.append(bb.emit(self.packed(TIMING_CREATE, _i64(0), _i64(self.timed_stages + 1), ty=ty),
                                  name_hint="timing"))
            out = bb.emit(relax.Tuple(hs), name_hint="streams")
            bb.emit_func_output(out)
        streams = relax.Var("streams", relax.TupleType([ty] * self.handle_count(n)))
        with bb.function(self.prefix + FREE_STREAMS_FUNC, [streams], pure=False):
            for k in range(n):
                s = bb.emit(relax.TupleGetItem(streams, k), name_hint=f"stream{k}")
                bb.emit(self.packed(FREE, self.dev, s), name_hint="freed")
            if self.uses_events(n):
                ev = bb.emit(relax.TupleGetItem(streams, n), name_hint="events")
                bb.emit(self.packed(EVENTS_FREE, ev), name_hint="freed")
            if self.timed_stages:
                tm = bb.emit(relax.TupleGetItem(streams, self.handle_count(n) - 1), name_hint="timing")
                bb.emit(self.packed(TIMING_FREE, tm), name_hint="freed")
            bb.emit_func_output(relax.Tuple([]))
        if self.timed_stages:
            streams = relax.Var("streams", relax.TupleType([ty] * self.handle_count(n)))
            with bb.function(self.prefix + STAGE_TIMES_FUNC, [streams], pure=False):
                tm = bb.emit(relax.TupleGetItem(streams, self.handle_count(n) - 1), name_hint="timing")
                times = bb.emit(self.packed(TIMING_READ, tm, _i64(self.timed_stages + 1)), name_hint="times")
                bb.emit_func_output(times)
        return bb.get().get_global_var(self.prefix + STREAMS_FUNC)

    def emit_main(self, target_gv, streams_gv, n: int, gpu: bool, cache_index: int = STREAM_CACHE_INDEX):
        bb = self.bb
        old_main = self.old_main
        params = [relax.Var(p.name, p.ty) for p in old_main.params] + self.const_params()
        ty = relax.TupleType([tvm.ir.PrimType("int64")] * self.handle_count(n))
        with bb.function(self.prefix + "main", params, pure=False):
            if gpu:
                streams = bb.emit(relax.op.call_builtin_with_ctx(
                    "vm.builtin.cuda_graph.get_cached_alloc", relax.Tuple([streams_gv, _i64(cache_index)]),
                    ty_args=[ty]), name_hint="streams")
            else:
                streams = relax.Tuple([_i64(0)] * self.handle_count(n))
            out = bb.emit(relax.Call(target_gv, params + [streams]), name_hint="result")
            bb.emit_func_output(out)


_GenericConst = tvm.ir.expr.GenericConst


def _const_key(c):
    """Identity of an IR constant (a new Python wrapper is made at every access, so not ``id``)."""
    return c.__chandle__() if hasattr(c, "__chandle__") else id(c)


def _identity(x):
    from tvm import te

    return te.compute(x.shape, lambda *i: x(*i), name="copy")


def _leaves(bb, expr) -> list[relax.Expr]:
    ty = expr.ty
    if isinstance(ty, relax.TupleType):
        out = []
        for i in range(len(ty.fields)):
            item = expr.fields[i] if isinstance(expr, relax.Tuple) else bb.emit(relax.TupleGetItem(expr, i))
            out.extend(_leaves(bb, item))
        return out
    return [expr]


def _rebuild(expr, leaves: list):
    it = iter(leaves)

    def go(e):
        if isinstance(e.ty, relax.TupleType):
            n = len(e.ty.fields)
            return relax.Tuple([go(e.fields[i] if isinstance(e, relax.Tuple) else relax.TupleGetItem(e, i))
                                for i in range(n)])
        return next(it)

    return go(expr)


def lower_program(program: Program, schedule: Schedule, target: "str | tvm.target.Target" = "llvm",
                  max_streams: int = DEFAULT_MAX_STREAMS, mode: str = "stage", cuda_graph: bool = False,
                  keep_alive: bool = True, lift_constants: bool = False, prefix: str = "",
                  stream_cache_index: int = STREAM_CACHE_INDEX, sync: str = "tvm",
                  waits: str = DEFAULT_WAIT_PLACEMENT, stage_timing: bool = False) -> Lowered:
    """Lower ``schedule`` into the functions described in the module docstring. ``keep_alive=False`` leaves out
    the lifetime extension (deliberately unsafe; only for testing the memory checker). ``lift_constants``: the
    model's constants become parameters after the inputs (``main(*inputs, *weights)``; used by the GPU check, whose
    libraries must not carry the weights). ``prefix`` is put before every function name the lowering adds (several
    schedules of one model in one library); each such lowering needs its own ``stream_cache_index`` (the key of its
    stream set in the VM's per-VM cache, used by its ``main``). ``sync``: ``"tvm"`` (TVM's
    ``Device_StreamSyncFromTo``: an event created and destroyed per call) or ``"events"`` (CUDA: reused events of
    the native extension, created with the streams; see :data:`SYNC_MODES`). ``waits``: where dependency mode
    issues its cross-stream waits (:data:`WAIT_PLACEMENTS`; ``"consumer"`` rebuilds the programs of the builds
    before 2026-11-27 for comparison). ``stage_timing``: record every stage's in-context time (see the module
    docstring; CUDA, stage mode, without CUDA graph; the program issues one more host call per stage)."""
    if mode not in MODES:
        raise InteropError(f"unknown synchronisation mode {mode!r}; use one of {MODES}")
    schedule.validate(program.graph)
    dev_kind = device_kind(target)
    if stage_timing:
        why = ("it times with CUDA events" if dev_kind != "cuda" else
               "in dependency mode stages overlap, so no point of the caller's stream separates them"
               if mode != "stage" else
               "a timing event inside a captured graph is timed at capture, not at replay" if cuda_graph else None)
        if why:
            raise InteropError(f"stage timing needs a CUDA target, stage mode and no CUDA graph ({why}; target "
                               f"device {dev_kind}, mode {mode}, cuda_graph={cuda_graph})")
    gpu = dev_kind in GPU_KINDS
    n = resolve_stream_count(max_streams, schedule.max_concurrency())
    reason = None
    if cuda_graph and dev_kind != "cuda":
        reason = f"CUDA graphs need a CUDA target (target device is {dev_kind})"
        log.warning("cuda_graph requested but not used: %s", reason)
        cuda_graph = False
    em = ProgramEmitter(program, dev_kind, lift_constants=lift_constants, prefix=prefix, sync=sync,
                        timed_stages=schedule.num_stages if stage_timing else 0)
    programs = {MAIN_FUNC: plan_streams(program, schedule, mode, n, staged_io=False, keep_alive=keep_alive,
                                        waits=waits)}
    impl = em.emit_scheduled(MAIN_FUNC, programs[MAIN_FUNC], staged=False, n_streams=n)
    target_gv = impl
    if cuda_graph:
        programs[MAIN_GRAPH_FUNC] = plan_streams(program, schedule, mode, n, staged_io=True, keep_alive=keep_alive,
                                                 waits=waits)
        target_gv = em.emit_scheduled(MAIN_GRAPH_FUNC, programs[MAIN_GRAPH_FUNC], staged=True, n_streams=n)
    streams_gv = em.emit_stream_funcs(n)
    em.emit_main(target_gv, streams_gv, n, gpu, stream_cache_index)
    built = em.bb.get()
    mod = program.mod
    funcs = {gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"}
    names = {gv.name_hint for gv in funcs}
    for gv, f in built.functions.items():
        if gv.name_hint in names:
            raise InteropError(f"function name {gv.name_hint!r} of the lowered program clashes with the model's")
        funcs[gv] = f
    new_mod = tvm.IRModule(funcs, attrs=mod.attrs)
    return Lowered(mod=new_mod, programs=programs, num_streams=n, mode=mode, device=dev_kind, cuda_graph=cuda_graph,
                   cuda_graph_reason=reason, prefix=prefix, sync=sync if em.uses_events(n) else "tvm",
                   waits=waits if mode == "dependency" and n > 0 else DEFAULT_WAIT_PLACEMENT,
                   stage_timing=stage_timing)


def lift_main_constants(program: Program, name: str = "main") -> tvm.IRModule:
    """The prepared module (plain TVM's program) with the model's constants as parameters of ``main`` after the
    inputs, in ``program.const_exprs`` order (``num_input`` = number of inputs), nothing else changed."""
    old = program.mod["main"]
    keys = {_const_key(c): i for i, c in enumerate(program.const_exprs)}
    weights = [relax.Var(f"w{i}", relax.TensorType([int(d) for d in c.value.shape], str(c.value.dtype)))
               for i, c in enumerate(program.const_exprs)]

    @relax.expr_functor.mutator
    class _Lift(relax.PyExprMutator):
        def visit_generic_const_(self, op):  # noqa: N802 - TVM's visitor name
            i = keys.get(_const_key(op))
            return weights[i] if i is not None else op

    body = _Lift().visit_expr(old.body)
    attrs = dict(old.attrs) if old.attrs else {}
    attrs["num_input"] = len(old.params)
    func = relax.Function(list(old.params) + weights, body, old.ret_ty, old.is_pure).with_attrs(attrs)
    out = tvm.IRModule({gv: f for gv, f in program.mod.functions.items() if gv.name_hint != "main"},
                       attrs=program.mod.attrs)
    out[name] = func
    return relax.transform.Normalize()(out)


def lower_to_relax(program: Program, schedule: Schedule, target: "str | tvm.target.Target" = "llvm",
                   max_streams: int = DEFAULT_MAX_STREAMS, mode: str = "stage", cuda_graph: bool = False,
                   keep_alive: bool = True) -> tvm.IRModule:
    """The lowered module (see :func:`lower_program`); ``tvm.compile(result, target)`` builds it."""
    return lower_program(program, schedule, target, max_streams=max_streams, mode=mode, cuda_graph=cuda_graph,
                         keep_alive=keep_alive).mod
