"""Flow fusion: a run of whole stages in one persistent CUDA launch whose thread blocks wait only for their producers.

Why: a wave-fused stage (:mod:`passes.wave.cuda`) ends with its launch, so the next stage waits for all of it, and
with a CUDA graph the multi-stream programs in dependency mode (a kernel waits only for its own producers) beat
the waves on an H100 and an H200 (``docs/wave_launches.md``). Rammer's answer is one program-wide kernel whose
blocks are scheduled by data dependencies. Here every kernel launch of every unit in the run is a *member*; the
members' thread blocks are laid end to end as *tasks*, in the schedule's order (stages, then groups, then each
chain), and one launch runs them all:

* a block takes the next task from a counter (``atomicAdd``), not from ``blockIdx.x``: tasks are therefore taken
  in order, so every task a block may wait for has been taken by a block already running. Blocks that wait only
  for lower-numbered tasks cannot deadlock, however many blocks the GPU holds at once (the argument of CUB's
  decoupled look-back);
* before its body, a task whose member has producers in the run waits until each producer's counter holds all of
  the producer's tasks (thread 0 polls the counter through L2 with growing sleeps, then fences; the block meets at
  a barrier);
* after its body, the block fences its writes and thread 0 adds one to its member's counter;
* a wait gives up after :data:`SPIN_LIMIT` polls and counts itself in the last counter, so a dependency error is
  a wrong output, never a hung GPU, and a read-back of the counters says whether any wait gave up.

Each member keeps its own thread-block shape (the block size is that of the members whose threads synchronise, the
others are repacked, as in a wave). The code of each (kernel function, launch) is in the run once, as a device
function that every member running it calls with its own tensors (:mod:`passes.wave.subroutine`); their shared
buffers lie in one pool per data type that the launch declares. Every member output is an output of the launch
(the run's tensors never share storage, so no block can overwrite what another still reads). The counters live
in an ``int32`` tensor that a small kernel of its own zeroes right before the launch (it reads one of the run's
inputs, so no compiler pass can fold it into a constant and no two runs can share it).

What cannot join a run ends it, with the reason recorded: library calls (no TIR), kernels whose launch shapes are
not constants, a synchronising launch under a warp or of a block size other than the run's, and static shared
memory over the 48 KiB a block may declare: the largest subroutine's share of the pools plus the task slot.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, replace

import tvm
from tvm import relax, tirx
from tvm.tirx import stmt as S

from tvm_interop.runtime.errors import ScheduleError

from ..schedule import Schedule, Stage
from .cuda import STATIC_SHARED_LIMIT, WARP, Launch
from .kernel import WaveSignature, fused_param_map, in_root_block, lower_unit, wave_signature
from .lowered import LoweredKernel, NotFusable
from .partition import block_offsets, repack_alignment, repacked_blocks
from .subroutine import Subroutine, make_subroutine, pooled_shared_bytes

log = logging.getLogger(__name__)

FLOW_ATTR = "tvm_interop.flow"
FLOW_CODEGEN = 3     # bump when the same members come to be fused into different code (2: one device function
                     # per kernel function and launch, shared memory in pools; 3: a counter of waits given up)
MAX_MEMBERS = 512    # launches per run: one counter each, and one branch each in the kernel's task dispatch


@dataclass
class FlowMember:
    """One kernel launch of a unit in the run (its ``nest``-th): ``deps`` are the members it waits for (indices
    into the run)."""

    unit: str
    launch: Launch
    syncs: bool
    deps: list[int] = field(default_factory=list)
    nest: int = 0


@dataclass
class FlowLayout:
    """The run's tasks: member ``m`` owns tasks ``[starts[m], offsets[m] + grids[m])``; the first ``offsets[m] -
    starts[m]`` of them are alignment blocks that skip the body (:func:`partition.repack_alignment`). Member
    ``m`` has ``repacked[m]`` blocks of the run's size (its grid, or its threads repacked), ``per_task[m]`` of
    them to a task (:func:`coarse_factor`)."""

    block: int
    grids: list[int]
    starts: list[int]
    offsets: list[int]
    total: int
    repacked: list[int]
    per_task: list[int]

    def tasks(self, m: int) -> int:
        """How many tasks member ``m`` owns: the count its consumers wait for."""
        return self.offsets[m] + self.grids[m] - self.starts[m]

    def final_counters(self) -> list[int]:
        """What the counters hold after a right run (:func:`num_flags` of them): every task taken, each member's
        tasks counted, no wait given up."""
        return [self.total] + [self.tasks(m) for m in range(len(self.grids))] + [0]


def flow_block_size(members: list[FlowMember]) -> int:
    """Threads per block of the run: the synchronising members' (one size: the planner ends a run before a launch
    of another, ``_Run.admits``), else the largest member's."""
    syncing = {m.launch.threads for m in members if m.syncs}
    if len(syncing) > 1:
        raise NotFusable(f"synchronising launches of {sorted(syncing)} threads per block in one flow run")
    return syncing.pop() if syncing else max(m.launch.threads for m in members)


def coarse_factor(threads: int, block: int) -> int:
    """Blocks of the run's size that one task of a member with ``threads``-thread blocks runs when the run is
    coarsened: as many as one of the member's own blocks holds, so its tasks are as many as its blocks.

    Why: a member whose blocks are wider than the run's (TVM's element-wise kernels launch 1024 threads, the
    convolutions that set a run's block 128) is repacked into 8x as many blocks, and every task costs a take from
    the one task counter, a barrier, a fence and a count. In RandWire's run such members held 57,086 of the
    60,306 tasks. A coarsened task runs its blocks one after another in a loop (the member's threads do not
    synchronise, which is why they could be repacked)."""
    return max(1, threads // block)


def layout(members: list[FlowMember], coarsen: bool = False) -> FlowLayout:
    """Tasks of ``members`` laid end to end in order: each member's grid, or its threads repacked into the run's
    blocks, aligned as in a wave; ``coarsen``: a repacked member's task runs :func:`coarse_factor` blocks and
    needs no alignment (a subroutine takes its block index as a parameter, which the compiler cannot see
    through)."""
    block = flow_block_size(members)
    repacked = [m.launch.grid if m.launch.threads == block
                else repacked_blocks(m.launch.grid, m.launch.threads, block) for m in members]
    per_task = [coarse_factor(m.launch.threads, block) if coarsen else 1 for m in members]
    grids = [-(-r // k) for r, k in zip(repacked, per_task)]
    aligns = [1 if m.launch.threads == block or coarsen else repack_alignment(m.launch.threads, block)
              for m in members]
    offsets, total = block_offsets(grids, aligns)
    starts = [0] + [o + g for o, g in zip(offsets[:-1], grids[:-1])]
    return FlowLayout(block, grids, starts, offsets, total, repacked, per_task)


def flow_members(program, units: list[str], kernels: dict[str, LoweredKernel]) -> list[FlowMember]:
    """Every launch of ``units`` (in order) as a member, each waiting for the launch before it in its unit, or,
    for a unit's first launch, for the last launch of every unit of the run whose output it reads."""
    last: dict[str, int] = {}
    members: list[FlowMember] = []
    inside = set(units)
    for u in units:
        kern = kernels[u]
        producers = sorted({last[r.unit] for r in program.calls[u].args
                            if r.kind == "unit" and r.unit in inside and r.unit in last})
        for k, nest in enumerate(kern.nests):
            deps = producers if k == 0 else [len(members) - 1]
            members.append(FlowMember(u, nest.stmt, kern.syncs, list(deps), k))
        last[u] = len(members) - 1
    return members


def _flags_index(m: int) -> int:
    return 1 + m   # flags[0] hands out the tasks; flags[1 + m] counts member m's finished tasks


def num_flags(num_members: int) -> int:
    """The run's counters: the task hand-out, one per member, and the count of waits given up (the last)."""
    return num_members + 2


def gave_up_index(num_members: int) -> int:
    return num_members + 1


def _atomic_add(flags, index: int, value: int):
    """``atomicAdd(&flags[index], value)``: the old value."""
    counter = tirx.address_of(tirx.BufferLoad(flags, [tirx.IntImm("int64", index)]))
    return tirx.call_extern("int32", "atomicAdd", counter, tirx.IntImm("int32", value))


def _fence():
    return S.Evaluate(tirx.call_extern("int32", "__threadfence"))


def _barrier():
    return S.Evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", tvm.ir.StringImm("shared")))


SPIN_LIMIT = 1 << 16   # polls of a producer's counter before a block gives up waiting (>= 65 ms asleep)
SPIN_SLEEP_NS = (32, 1024)   # the first sleep between polls, doubled up to the last


def _poll(flags, index: int):
    """``flags[index]`` read through L2 (``__ldcg``: a load that skips the SM's L1, where the counter's line could be
    stale), not through an atomic: polling blocks then cost the L2 loads, not the atomic unit that the blocks
    counting themselves done use."""
    return tirx.call_extern("int32", "__ldcg", tirx.address_of(tirx.BufferLoad(flags, [tirx.IntImm("int64", index)])))


def _wait_for(flags, spin, producer: int, need: int, gave_up: int):
    """Thread 0 polls ``flags[1 + producer]`` until it holds ``need``, sleeping between polls (32 ns, doubling up to
    1 us) so that waiting blocks do not flood the counters' cache line. Bounded: after :data:`SPIN_LIMIT` polls
    (over 65 ms asleep, far beyond any kernel of the zoo) it stops waiting, so a wrong dependency shows as a wrong
    output, never as a hung GPU; and it adds one to ``flags[gave_up]``, so that whoever reads the counters back
    (``scripts/gpu_wave_diff.py``) tells a wait that gave up from a wrong number read after a wait that ended
    (which would point at memory visibility between SMs). ``spin``: thread 0's registers, [polls, next sleep in
    ns]."""
    i64 = lambda v: tirx.IntImm("int64", v)  # noqa: E731
    polls, sleep = tirx.BufferLoad(spin, [i64(0)]), tirx.BufferLoad(spin, [i64(1)])
    unfinished = tirx.LT(_poll(flags, _flags_index(producer)), tirx.IntImm("int32", need))
    more = tirx.And(unfinished, tirx.LT(polls, tirx.IntImm("int32", SPIN_LIMIT)))
    step = S.SeqStmt([S.Evaluate(tirx.call_extern("int32", "__nanosleep", tirx.Cast("uint32", sleep))),
                      S.BufferStore(spin, polls + 1, [i64(0)]),
                      S.BufferStore(spin, tirx.min(sleep * 2, tirx.IntImm("int32", SPIN_SLEEP_NS[1])), [i64(1)])])
    # polled to the limit and the producer still short (polled once more: it may have finished at the last poll)
    give_up = S.IfThenElse(tirx.And(tirx.GE(polls, tirx.IntImm("int32", SPIN_LIMIT)), unfinished),
                           S.Evaluate(_atomic_add(flags, gave_up, 1)), None)
    return S.SeqStmt([S.BufferStore(spin, tirx.IntImm("int32", 0), [i64(0)]),
                      S.BufferStore(spin, tirx.IntImm("int32", SPIN_SLEEP_NS[0]), [i64(1)]), S.While(more, step),
                      give_up])


def _dispatch(branches: list[tuple[int, object]], lo: int, hi: int, key, dtype: str):
    """A balanced tree of tests on ``key`` choosing among ``branches[lo:hi]`` (each ``(end, stmt)``: the branch
    runs for ``key`` below ``end`` and at or above the previous end): about log2(n) tests instead of a chain."""
    if hi - lo == 1:
        return branches[lo][1]
    mid = (lo + hi) // 2
    return S.IfThenElse(tirx.LT(key, tirx.IntImm(dtype, branches[mid - 1][0])),
                        _dispatch(branches, lo, mid, key, dtype), _dispatch(branches, mid, hi, key, dtype))


def _coarse_run(lay: FlowLayout, m: int, run_member, local_task, tx, name: str):
    """Member ``m``'s task ``local_task``: its ``per_task[m]`` blocks one after another (those past its last block
    skipped)."""
    k = lay.per_task[m]
    if k == 1:
        return run_member(m, local_task, tx)
    dtype = "int64"
    j = tirx.Var(f"{name}_j{m}", dtype)
    b = local_task * tirx.IntImm(dtype, k) + j
    run = run_member(m, b, tx)
    if lay.grids[m] * k != lay.repacked[m]:
        run = S.IfThenElse(tirx.LT(b, tirx.IntImm(dtype, lay.repacked[m])), run, None)
    # kept a loop (TVM's CUDA codegen writes ``#pragma unroll 1``): nvcc unrolled it, and the coarsened RandWire
    # run's machine code grew from 1.11 to 2.16 MB, which would confound fewer tasks with more code
    return S.For(j, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, k), S.ForKind.SERIAL, run,
                 annotations={"disable_unroll": tirx.IntImm("int32", 1)})


def flow_launch(members: list[FlowMember], flags, slot, name: str, run_member, allocs: tuple = (),
                coarsen: bool = False):
    """The launch statement (see the module docstring): ``flags`` the counter tensor, ``slot`` a one-element
    shared buffer through which thread 0 hands the block its task, ``run_member(m, local_b, tx)`` the statement
    running member ``m``'s block ``local_b`` (a call of its subroutine), under a balanced tree of tests on the
    task; ``allocs``: further buffers the launch allocates (the shared pools); ``coarsen``: tasks of
    :func:`coarse_factor` blocks (:func:`layout`)."""
    lay = layout(members, coarsen)
    dtype = "int64"
    c = lambda v: tirx.IntImm(dtype, v)  # noqa: E731
    bx = tirx.Var(f"{name}_bx", dtype)
    tx = tirx.Var(f"{name}_tx", dtype)
    task = tirx.Var(f"{name}_task", dtype)
    spin = tirx.decl_buffer((2,), "int32", name=f"{name}_spin", scope="local")
    first = tirx.EQ(tx, c(0))
    branches = []
    for m, mem in enumerate(members):
        local_b = task - c(lay.offsets[m]) if lay.offsets[m] else task
        idle = tirx.GE(task, c(lay.offsets[m])) if lay.offsets[m] > lay.starts[m] else None
        body = []
        if mem.deps:
            waits = [_wait_for(flags, spin, p, lay.tasks(p), gave_up_index(len(members))) for p in mem.deps]
            body += [S.IfThenElse(first, S.SeqStmt(waits + [_fence()]), None), _barrier()]
        run = _coarse_run(lay, m, run_member, local_b, tx, name)
        body.append(run if idle is None else S.IfThenElse(idle, run, None))
        # every thread's writes visible device-wide before the member's counter says so
        body += [_fence(), _barrier(), S.IfThenElse(first, S.Evaluate(_atomic_add(flags, _flags_index(m), 1)), None)]
        branches.append((lay.offsets[m] + lay.grids[m], S.SeqStmt(body)))
    claim = S.IfThenElse(first, S.BufferStore(slot, _atomic_add(flags, 0, 1), [c(0)]), None)
    inner = S.SeqStmt([S.AllocBuffer(slot), S.AllocBuffer(spin), *[S.AllocBuffer(b) for b in allocs], claim,
                       _barrier(),
                       S.Bind(task, tirx.Cast(dtype, tirx.BufferLoad(slot, [c(0)]))),
                       _dispatch(branches, 0, len(branches), task, dtype)])
    tx_iv = tirx.IterVar(tvm.ir.Range(c(0), c(lay.block)), tx, tirx.IterVar.ThreadIndex, "threadIdx.x")
    bx_iv = tirx.IterVar(tvm.ir.Range(c(0), c(lay.total)), bx, tirx.IterVar.ThreadIndex, "blockIdx.x")
    return S.AttrStmt(bx_iv, "thread_extent", c(lay.total), S.AttrStmt(tx_iv, "thread_extent", c(lay.block), inner))


@dataclass
class FlowKernel:
    """A built flow run: the PrimFunc (parameters: the run's inputs, the counters, every member output), its
    signature, the counter count, the members' layout, and the device functions it calls (one per kernel
    function and launch), which the module must hold beside it."""

    func: tirx.PrimFunc
    signature: WaveSignature
    num_flags: int
    members: list[FlowMember]
    layout: FlowLayout
    subroutines: list[Subroutine] = field(default_factory=list)


def build_flow_kernel(program, units: list[str], target, kernels: dict[str, LoweredKernel],
                      name: str = "flow", inline: bool = True, coarsen: bool = False) -> FlowKernel:
    """Fuse ``units`` (whole stages, in the schedule's order) into one flow launch (``kernels``: each unit's
    lowered kernel; units of one kernel function may share one). ``name`` prefixes the subroutines' names, which
    must be unique in the module; ``inline=False`` has them compiled as calls (:func:`make_subroutine`);
    ``coarsen``: a repacked member's task runs one of its own blocks (:func:`coarse_factor`)."""
    sig = wave_signature(program, [list(units)])
    members = flow_members(program, units, kernels)
    if len(members) > MAX_MEMBERS:
        raise NotFusable(f"{len(members)} launches, over the {MAX_MEMBERS} a flow run may hold")
    lay = layout(members, coarsen)
    flags = tirx.decl_buffer((num_flags(len(members)),), "int32", name="flow_flags")
    params, binding = fused_param_map(program, sig, kernels, extra_inputs=[flags])
    slot = tirx.decl_buffer((1,), "int32", name="flow_task", scope="shared")
    subs: dict[tuple[str, int], Subroutine] = {}
    for m, mem in enumerate(members):
        key = (program.calls[mem.unit].func_name, mem.nest)
        if key not in subs:
            subs[key] = make_subroutine(kernels[mem.unit], mem.nest, lay.block, lay.repacked[m],
                                        f"{name}_{key[0]}_{key[1]}", inline)
    need: dict[str, int] = {}
    for sub in subs.values():
        for dtype, n in sub.layout.need.items():
            need[dtype] = max(need.get(dtype, 0), n)
    pools = {d: tirx.decl_buffer((n,), d, name=f"flow_pool_{d}", scope="shared") for d, n in sorted(need.items())}

    def run_member(m: int, local_b, tx):
        mem = members[m]
        sub = subs[(program.calls[mem.unit].func_name, mem.nest)]
        tensors = [binding[(mem.unit, pos)].data for pos in range(len(kernels[mem.unit].params))]
        return sub.call(tensors, local_b, tx, pools)

    launch = flow_launch(members, flags, slot, "flow", run_member, tuple(pools.values()), coarsen)
    first = kernels[units[0]].func
    attrs = {k: v for k, v in (first.attrs or {}).items() if k not in ("tvm_interop.cpu_plan", "global_symbol")}
    attrs.update({"tirx.is_scheduled": True, "tirx.noalias": True,
                  FLOW_ATTR: json.dumps({"units": list(units), "members": len(members), "codegen": FLOW_CODEGEN,
                                         "subroutines": len(subs), "inline": inline,
                                         "coarsen": coarsen})})
    func = tirx.PrimFunc(params, launch, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs))
    return FlowKernel(in_root_block(func), sig, num_flags(len(members)), members, lay, list(subs.values()))


def zero_flags_func(like: relax.Expr, n: int) -> tirx.PrimFunc:
    """A kernel that writes ``n`` zeros: the counters of one run. It takes the tensor ``like`` (one of the run's
    inputs, which it does not read) so that no pass can evaluate it at compile time into a constant that every
    call would then share."""
    from tvm import te

    shape = [int(d) for d in like.ty.shape]
    dummy = te.placeholder(shape, str(like.ty.dtype), name="flow_after")
    zeros = te.compute((n,), lambda i: tirx.IntImm("int32", 0), name="flow_zero")
    return te.create_prim_func([dummy, zeros]).without_attr("global_symbol")


@dataclass
class FlowRecord:
    """What happened to the run of stages ``stages`` (or to a stage left out of every run)."""

    stages: list[int]
    units: list[str] = field(default_factory=list)
    members: int = 0
    tasks: int = 0
    block: int = 0
    unit: str = ""       # the fused unit's name in the new program
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"stages": self.stages, "units": self.units, "members": self.members, "tasks": self.tasks,
                "block": self.block, "unit": self.unit, "reasons": self.reasons}


def _stage_units(st: Stage) -> list[str]:
    return [u for g in st.groups for u in g]


class _Run:
    """A run being grown stage by stage: its stages, units and the block-size constraint so far."""

    def __init__(self, shared_of):
        self.shared_of = shared_of   # a kernel's share of the shared pools (pooled_shared_bytes, once per function)
        self.stages: list[int] = []
        self.units: list[str] = []
        self.sync_block: int | None = None
        self.shared = 0
        self.launches = 0

    def admits(self, kernels: list[LoweredKernel]) -> str | None:
        """Why the stage whose kernels are ``kernels`` cannot join this run (None: it can)."""
        block = self.sync_block
        for k in kernels:
            for n in k.nests:
                if k.syncs and block is not None and n.stmt.threads != block:
                    return (f"{k.name}: its threads synchronise in blocks of {n.stmt.threads}, the run's in blocks "
                            f"of {block}")
                if k.syncs:
                    block = n.stmt.threads
        if max([self.shared] + [self.shared_of(k) for k in kernels]) + 4 > STATIC_SHARED_LIMIT:
            return f"static shared memory over the {STATIC_SHARED_LIMIT} bytes a block may declare"
        if self.launches + sum(len(k.nests) for k in kernels) > MAX_MEMBERS:
            return f"over {MAX_MEMBERS} launches in one run"
        return None

    def add(self, si: int, units: list[str], kernels: list[LoweredKernel]) -> None:
        self.stages.append(si)
        self.units += units
        for k in kernels:
            if k.syncs and k.nests:
                self.sync_block = k.nests[0].stmt.threads
            self.shared = max(self.shared, self.shared_of(k))
            self.launches += len(k.nests)


def lower_flow_unit(program, unit: str, target) -> LoweredKernel:
    """The unit's kernel lowered as for a wave (:func:`kernel.lower_unit`), with its virtual threads expanded first
    (TVM's ``InjectVirtualThread``, run on the member alone): in the fused kernel that pass would otherwise take in
    the run's dispatch and its spin loops, which it refuses ("WhileNode in InjectVirtualThread not supported")."""
    from tvm import s_tir

    from ..cuda_build import scheduled_as_built
    from .cuda import split_cuda, sync_passes
    from .lowered import lower

    call = program.calls[unit]
    if call.is_library:
        return lower_unit(program, unit, target)   # raises NotFusable with the reason
    return split_cuda(unit, lower(scheduled_as_built(program.mod[call.func_name], target), target,
                                  [s_tir.transform.InjectVirtualThread()] + sync_passes()))


def _unit_kernel(program, u: str, target, cache: dict, lowered: dict, refused: dict) -> LoweredKernel:
    """``u``'s lowered kernel: its function's, lowered once for all its units (``lowered``, by function name; the
    run calls one subroutine per function and launch, so the units need no copies of their own) under ``u``'s
    name; :class:`NotFusable`, remembered per function (``refused``), when it cannot join a run."""
    if u not in cache:
        if any(ref.kind == "tuple" for ref in program.calls[u].args):   # the fused call passes tensors only
            raise NotFusable(f"{u}: a tuple argument", unit=u)
        func = program.calls[u].func_name
        if func in refused:
            raise refused[func]
        if func not in lowered:
            try:
                kern = lower_flow_unit(program, u, target)
                for n in kern.nests:
                    if kern.syncs and n.stmt.threads < WARP:
                        raise NotFusable(f"{u}: its threads synchronise in blocks of {n.stmt.threads}, under a "
                                         "warp", unit=u)
            except NotFusable as why:
                refused[func] = why
                raise
            lowered[func] = kern
        cache[u] = replace(lowered[func], name=u)
    return cache[u]


def plan_flow_runs(program, schedule: Schedule, target) -> tuple[list[FlowRecord], dict[str, LoweredKernel]]:
    """Runs of consecutive whole stages that can share one flow launch (two or more launches each), and a record
    for every stage left out, with the reason; also the units' lowered kernels."""
    cache: dict[str, LoweredKernel] = {}
    lowered: dict = {}
    refused: dict = {}
    records: list[FlowRecord] = []
    pooled: dict[int, int] = {}

    def shared_of(k: LoweredKernel) -> int:   # the units of one function share its lowered body: walk it once
        if id(k.func) not in pooled:
            pooled[id(k.func)] = pooled_shared_bytes(k)
        return pooled[id(k.func)]

    run = _Run(shared_of)

    def close():
        nonlocal run
        if run.launches >= 2:
            records.append(FlowRecord(list(run.stages), list(run.units)))
        elif run.stages:
            records.append(FlowRecord(list(run.stages), reasons=["a run of one launch: nothing to fuse"]))
        run = _Run(shared_of)

    for si, st in enumerate(schedule.stages):
        units = _stage_units(st)
        try:
            kernels = [_unit_kernel(program, u, target, cache, lowered, refused) for u in units]
        except NotFusable as why:
            close()
            records.append(FlowRecord([si], reasons=[str(why)]))
            continue
        why = run.admits(kernels)
        if why is not None:
            close()
            why = run.admits(kernels)
            if why is not None:
                records.append(FlowRecord([si], reasons=[why]))
                continue
        run.add(si, units, kernels)
    close()
    return records, cache


def _dummy_arg(sig: WaveSignature, var_of: dict, params: list):
    """The expression of a run input that is not a constant (a model input or a unit output), for the zeroing
    kernel to take."""
    for ref in sig.inputs:
        if ref.kind == "unit":
            var = var_of[ref.unit]
            return var if not ref.index and not isinstance(var.ty, relax.TupleType) else relax.TupleGetItem(
                var, ref.index)
        if ref.kind == "input":
            return params[ref.index]
    raise NotFusable("every input of the run is a constant: nothing the zeroing kernel can wait for")


def splice_flows(program, kernels: list[FlowKernel], name_prefix: str = "") -> tuple[tvm.IRModule, list[str],
                                                                                       list[str]]:
    """``program.mod`` with each run's units replaced by a zeroing call and one flow call; returns (module, flow
    call var names, zeroing var names)."""
    from .apply import MainSplice, out_sinfo

    splice = MainSplice(program)
    bb = splice.bb
    names, zero_names = [], []
    subroutines = []
    for k, kern in enumerate(kernels):
        sig = kern.signature
        bi, var_cls = splice.block(sig.units)
        dummy = bb.normalize(_dummy_arg(sig, splice.var_of, list(splice.main.params)))
        zgv = bb.add_func(zero_flags_func(dummy, kern.num_flags), f"{name_prefix}flow_zero_{sig.units[0]}")
        zcall = bb.normalize(relax.call_tir(zgv, [dummy], relax.TensorType((kern.num_flags,), "int32")))
        zvar = var_cls(splice.name(f"flow{k}_flags"), zcall.ty)
        gv = bb.add_func(kern.func, f"{name_prefix}flow_{sig.units[0]}")
        subroutines += kern.subroutines
        call = bb.normalize(relax.call_tir(gv, splice.args(sig) + [zvar], out_sinfo(program, sig)))
        fused_var = var_cls(splice.name(f"flow{k}_{sig.units[0]}"), call.ty)
        splice.replace(sig, bi, [relax.VarBinding(zvar, zcall), relax.VarBinding(fused_var, call)], fused_var)
        names.append(fused_var.name)
        zero_names.append(zvar.name)
    mod = splice.module()
    taken = {gv.name_hint for gv in mod.functions}
    for sub in subroutines:   # called from the flow kernels (TIR), not from Relax: added under their own names
        if sub.gvar.name_hint in taken:
            raise NotFusable(f"a function named {sub.gvar.name_hint} is in the module already")
        taken.add(sub.gvar.name_hint)
        mod[sub.gvar] = sub.func
    return mod, names, zero_names


# ``Schedule.options`` key: the schedule's runs of stages are to be built as flow launches (``compile(fusion="flow")``
# sets it; a saved schedule keeps it, so ``compile(schedule=...)`` builds the same launches)
FLOW_OPTION = "flow_fusion"


def flow_requested(schedule: Schedule) -> bool:
    """Whether a build of ``schedule`` fuses its runs of stages into flow launches (:data:`FLOW_OPTION`)."""
    return bool(schedule.options.get(FLOW_OPTION))


def apply_flow_fusion(program, schedule: Schedule, target, name_prefix: str = "", inline: bool = True,
                      coarsen: bool = False):
    """Fuse every run of consecutive stages that can share a flow launch (CUDA targets only); ``inline=False``
    compiles each run's device functions as calls (:func:`subroutine.make_subroutine`); ``coarsen`` gives a
    repacked member one task per block of its own (:func:`coarse_factor`).

    Returns ``(new_program, new_schedule, records)``: each run's stages become one stage of one group (the zeroing
    kernel, then the flow launch); stages left out keep their groups. ``schedule.options["flow"]`` records every
    run and every stage left out, with the reason."""
    from ..extract import extract
    from ..target import normalize_target

    target = normalize_target(target)
    if target.kind.name != "cuda":
        raise ScheduleError(f"flow fusion builds one persistent CUDA launch; the target is {target.kind.name}")
    schedule.validate(program.graph)
    devices = sorted(set(schedule.unit_devices.values()))
    if len(devices) > 1:   # a run is one launch on one GPU; the schedule would lose its mapping silently
        raise ScheduleError(f"flow fusion builds one launch per run on one GPU; this schedule places its units on "
                            f"devices {devices} (hios): build it without flow launches")
    records, cache = plan_flow_runs(program, schedule, target)
    kernels, runs = [], []
    for rec in records:
        if not rec.units:
            continue
        try:
            kern = build_flow_kernel(program, rec.units, target, cache, f"{name_prefix}flow{len(kernels)}",
                                     inline, coarsen)
        except NotFusable as why:
            rec.reasons.append(str(why))
            rec.units = []
            continue
        rec.members, rec.tasks, rec.block = len(kern.members), kern.layout.total, kern.layout.block
        kernels.append(kern)
        runs.append(rec)
    for rec in records:
        for r in rec.reasons:
            log.info("flow fusion, stage(s) %s: %s", rec.stages, r)
    out = replace(schedule, options=dict(schedule.options), search=dict(schedule.search))
    if not kernels:
        out.options["flow"] = [r.to_json() for r in records]
        return program, out, records
    new_mod, names, zero_names = splice_flows(program, kernels, name_prefix)
    new_program = extract(new_mod, name=program.graph.name, known_constants=program.const_exprs)
    by_var = {uc.binding_var: n for n, uc in new_program.calls.items()}
    by_name = {uc.binding_var.name: n for n, uc in new_program.calls.items()}   # the new calls' names are unique
    rename = {n: by_var[uc.binding_var] for n, uc in program.calls.items() if uc.binding_var in by_var}
    run_at = {}
    for rec, name, zname in zip(runs, names, zero_names):
        rec.unit = by_name[name]
        run_at[rec.stages[0]] = (rec, by_name[zname])
    fused_stages = {si for rec in runs for si in rec.stages}
    stages_out = []
    for si, st in enumerate(schedule.stages):
        if si in run_at:
            rec, zero = run_at[si]
            stages_out.append(Stage([[zero, rec.unit]], st.strategy))
        elif si not in fused_stages:
            stages_out.append(Stage([[rename[u] for u in g] for g in st.groups], st.strategy, st.predicted_latency,
                                    st.measured_latency))
    out = replace(out, stages=stages_out, graph_fingerprint=new_program.graph.fingerprint(),
                  units=[{"name": u.name, "kind": u.kind, "func": u.func_name} for u in new_program.graph.units],
                  unit_devices={})
    out.options["flow"] = [r.to_json() for r in records]
    out.validate(new_program.graph)
    log.info("flow fusion: %d run(s) of %d stage(s) in one launch each", len(runs),
             sum(len(r.stages) for r in runs))
    return new_program, out, records
