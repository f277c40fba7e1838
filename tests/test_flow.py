"""Flow fusion (passes.wave.flow): runs of whole stages in one persistent CUDA launch whose blocks take their
tasks in order from a counter and wait only for their producers' counters.

Checked here without a GPU: the task layout and the dependencies on random and real members; the fused launch
emulated block by block on the CPU (the counters as plain integers, every wait turned into an assertion that its
producers are done) computes what the model computes; the runs stop where a member cannot join, with the
reason; the fused kernels of every zoo model compile with nvcc and the program passes the as-built memory check.
Whether the device runs them right and fast is for ``scripts/gpu_check.sh`` (variants ``X+flow``)."""
import json
import os
import random
from dataclasses import dataclass

import numpy as np
import pytest
import tvm
from tvm.tirx import stmt as S

import tvm_interop
from tvm_interop.api import prepare_program
from tvm_interop.models import get_model, small_config
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.target import normalize_target
from tvm_interop.passes.wave import flow as F
from tvm_interop.passes.wave.lowered import rebuild
from tvm_interop.passes.wave.subroutine import SUBROUTINE_ATTR, keep_device_subroutines
from tvm_interop.runtime.errors import ScheduleError

CUDA = "cuda -arch=sm_90"
needs_nvcc = pytest.mark.skipif(not any(os.path.exists(p) for p in ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"))
                                and not os.environ.get("CUDA_HOME"), reason="the CUDA build needs nvcc")


@dataclass
class _Shape:
    """A launch's shape, all that the task layout reads of it."""

    threads: int
    grid: int


@pytest.mark.parametrize("coarsen", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_layout_gives_every_member_its_tasks_once_in_order(seed, coarsen):
    rng = random.Random(seed)
    block = rng.choice([64, 128, 256])
    members = []
    for _ in range(rng.randint(1, 12)):
        syncs = rng.random() < 0.5
        threads = block if syncs else rng.choice([32, 96, 128, 256, 1024])
        members.append(F.FlowMember(f"u{len(members)}", _Shape(threads, rng.randint(1, 40)), syncs))
    if not any(m.syncs for m in members):
        block = max(m.launch.threads for m in members)
    lay = F.layout(members, coarsen)
    assert lay.block == block
    owner = []
    for m, mem in enumerate(members):
        assert lay.starts[m] == (lay.offsets[m - 1] + lay.grids[m - 1] if m else 0)   # contiguous, in order
        assert lay.offsets[m] >= lay.starts[m]
        # every member thread has a slot, in tasks of per_task blocks
        assert lay.repacked[m] * lay.block >= mem.launch.grid * mem.launch.threads
        assert (lay.grids[m] - 1) * lay.per_task[m] < lay.repacked[m] <= lay.grids[m] * lay.per_task[m]
        if mem.launch.threads == block:
            assert lay.grids[m] == mem.launch.grid and lay.offsets[m] == lay.starts[m] and lay.per_task[m] == 1
        elif coarsen:   # a task per block of its own (fewer when its block is narrower than the run's)
            assert lay.grids[m] == (mem.launch.grid if mem.launch.threads % block == 0 else lay.grids[m])
            assert lay.grids[m] <= max(mem.launch.grid, lay.repacked[m]) and lay.offsets[m] == lay.starts[m]
        else:   # a repacked member starts at a whole block of its own (partition.repack_alignment)
            assert lay.offsets[m] * block % mem.launch.threads == 0
        owner += [m] * lay.tasks(m)
    assert len(owner) == lay.total == lay.offsets[-1] + lay.grids[-1]
    assert owner == sorted(owner)


def test_synchronising_members_of_two_block_sizes_are_refused():
    with pytest.raises(F.NotFusable, match=r"\[64, 128\] threads per block"):
        F.layout([F.FlowMember("a", _Shape(128, 4), True), F.FlowMember("b", _Shape(64, 4), True)])


def _program(name: str, **cfg):
    target = normalize_target(CUDA)
    cfg = cfg or small_config(name)
    return prepare_program(get_model(name, **cfg), target, name=name), target


@needs_nvcc
def test_members_wait_for_the_last_launch_of_each_producer_in_the_run():
    program, target = _program("squeezenet")
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name="squeezenet")
    records, kernels = F.plan_flow_runs(program, sched, target)
    runs = [r for r in records if r.units]
    assert runs and all(len(r.units) >= 2 for r in runs)
    for r in runs:
        members = F.flow_members(program, r.units, kernels)
        last = {}
        for i, m in enumerate(members):
            assert all(d < i for d in m.deps)   # tasks are taken in order: a wait is always on an earlier member
            producers = {last[a.unit] for a in program.calls[m.unit].args if a.kind == "unit" and a.unit in last}
            first_launch = i == 0 or members[i - 1].unit != m.unit
            assert set(m.deps) == (producers if first_launch else {i - 1})
            last[m.unit] = i
    # every stage is in exactly one run or left out with its reason
    seen = sorted(si for r in records for si in r.stages)
    assert seen == list(range(len(sched.stages)))
    assert all(r.reasons for r in records if not r.units)


# ----------------------------------------------------------------------- the launch emulated on the CPU
def _atomic(value):
    """(flags buffer, index, added) of an ``atomicAdd(&flags[i], v)`` call, else None."""
    if (isinstance(value, tvm.ir.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name == "tirx.call_extern"
            and value.args[0].value == "atomicAdd"):
        load = value.args[1].args[0]
        return load.source, load.indices[0], value.args[2]
    return None


def _polls(cond) -> bool:
    """Whether ``cond`` is a wait's give-up test: ``polls >= limit && __ldcg(&flags[i]) < need``."""
    right = cond.b.a if isinstance(cond, tvm.ir.prim.expr.And) and hasattr(cond.b, "a") else None
    return (isinstance(right, tvm.ir.Call) and isinstance(right.op, tvm.ir.Op) and right.op.name == "tirx.call_extern"
            and right.args[0].value == "__ldcg")


def _extern_name(stmt) -> str | None:
    v = stmt.value if isinstance(stmt, S.Evaluate) else None
    if not isinstance(v, tvm.ir.Call) or not isinstance(v.op, tvm.ir.Op):   # not an intrinsic (a subroutine call)
        return None
    if v.op.name == "tirx.call_extern":
        return v.args[0].value
    if v.op.name == "tirx.tvm_storage_sync":
        return "__syncthreads"
    return None


def _emulated(func: tvm.tirx.PrimFunc, subroutines: dict) -> tvm.tirx.PrimFunc:
    """The flow launch as a CPU function: blocks then threads as serial loops, so tasks are taken in block order;
    the counters plain integers; every wait an assertion that its producer's counter is complete (in this order
    a correct layout never waits); fences, sleeps and barriers dropped; each subroutine call replaced by the
    subroutine's body on the call's arguments (``subroutines``: by name), as nvcc inlines it. Exact for members
    whose threads do not synchronise."""
    def emulate(s):
        if isinstance(s, S.Evaluate) and isinstance(s.value, tvm.ir.Call) and isinstance(s.value.op, tvm.ir.GlobalVar):
            sub = tvm.s_tir.renew_defs(subroutines[s.value.op.name_hint])
            return rebuild(sub.specialize(dict(zip(sub.params, s.value.args))).body, emulate)
        if isinstance(s, S.AttrStmt) and s.attr_key == "thread_extent":
            v = s.node.var
            return S.For(v, tvm.tirx.IntImm(v.ty.dtype, 0), tvm.tirx.Cast(v.ty.dtype, s.value), S.ForKind.SERIAL,
                         s.body)
        if _extern_name(s) in ("__threadfence", "__nanosleep", "__syncthreads"):
            return S.Evaluate(tvm.tirx.IntImm("int32", 0))
        if isinstance(s, S.Evaluate) and _atomic(s.value):   # a member's counter: one more task done
            buf, i, v = _atomic(s.value)
            return S.BufferStore(buf, tvm.tirx.BufferLoad(buf, [i]) + v, [i])
        if isinstance(s, S.BufferStore) and _atomic(s.value):   # thread 0 takes the next task
            buf, i, v = _atomic(s.value)
            return S.SeqStmt([S.BufferStore(s.buffer, tvm.tirx.BufferLoad(buf, [i]), s.indices),
                              S.BufferStore(buf, tvm.tirx.BufferLoad(buf, [i]) + v, [i])])
        if isinstance(s, S.IfThenElse) and _polls(s.condition):
            # a wait giving up (it counts itself in the last counter): dead here, where every wait is asserted
            # complete (and __ldcg has no CPU symbol)
            return S.Evaluate(tvm.tirx.IntImm("int32", 0))
        if isinstance(s, S.While):   # the wait: its producer must be complete already
            poll = s.condition.a.a   # __ldcg(&flags[i])
            assert poll.args[0].value == "__ldcg"
            load = poll.args[1].args[0]
            buf, i = load.source, load.indices[0]
            need = s.condition.a.b
            # (TVM 0.27's Python signature names kind first; its constructor takes the condition first)
            return S.AssertStmt(tvm.tirx.GE(tvm.tirx.BufferLoad(buf, [i]), need), tvm.ir.StringImm("RuntimeError"),
                                [tvm.ir.StringImm("a task ran before its producer was done")])
        return s

    return (func.with_body(rebuild(func.body, emulate)).with_attr("target", tvm.target.Target({"kind": "llvm"}))
            .with_attr("global_symbol", "main"))


def _subroutines(prog) -> dict:
    """The flow runs' subroutines in ``prog``'s module, by name."""
    return {gv.name_hint: f for gv, f in prog.mod.functions.items()
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and SUBROUTINE_ATTR in f.attrs}


def _pools_and_adds():
    """Element-wise kernels and max pools only (none of whose threads synchronise, so the emulation is exact; TVM's
    CUDA average pools, and a pool fused with an add of two inputs, reduce across threads), of different block
    sizes, in two branches that meet: x -> {relu, -x -> relu} -> max pool (one kernel function, two members that
    share its code) -> (add -> max pool, multiply). Each pool output is read twice and the model returns both
    ends, so the compiler fuses no pool with an add."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 24, 20, 20), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(x))
            n = bb.emit(relax.op.nn.relu(relax.op.negative(x)))
            a = bb.emit(relax.op.nn.max_pool2d(r, pool_size=3, strides=1, padding=1))
            b = bb.emit(relax.op.nn.max_pool2d(n, pool_size=3, strides=1, padding=1))
            c = bb.emit(relax.op.nn.max_pool2d(relax.op.add(a, b), pool_size=2, strides=2))
            d = bb.emit(relax.op.multiply(a, b))
            out = bb.emit_output(relax.Tuple([c, d]))
        bb.emit_func_output(out)
    return bb.get()


@needs_nvcc
@pytest.mark.parametrize("scheduler", ["sequential", pytest.param("greedy", marks=pytest.mark.ci)])
def test_flow_launch_emulated_on_the_cpu_computes_the_model(scheduler):
    mod = _pools_and_adds()
    target = normalize_target(CUDA)
    program = prepare_program(mod, target, name="pools")
    sched = schedule_graph(program.graph, scheduler, "sim:h100")
    new_prog, new_sched, records = F.apply_flow_fusion(program, sched, target)
    (run,) = [r for r in records if r.units]
    assert run.stages == list(range(len(sched.stages))) and run.members >= len(program.graph.units)
    kern_name = next(uc.func_name for uc in new_prog.calls.values() if uc.binding_var.name.startswith("flow0_pools")
                     or F.FLOW_ATTR in (new_prog.mod[uc.func_name].attrs or {}))
    func = new_prog.mod[kern_name]
    members = F.flow_members(program, run.units, F.plan_flow_runs(program, sched, target)[1])
    assert len({m.launch.threads for m in members}) >= 2, "the case needs members of different block sizes"
    lib = tvm.tirx.build(tvm.IRModule({"main": _emulated(func, _subroutines(new_prog))}),
                         target=tvm.target.Target({"kind": "llvm"}))
    x = np.random.default_rng(0).standard_normal((1, 24, 20, 20)).astype("float32")
    args = [np.zeros([int(d) for d in p.shape], str(p.dtype)) for p in func.params]
    names = [p.name for p in func.params]
    assert names[:2] == ["wave_in0", "flow_flags"]   # the run's one input, then the counters
    args[0] = x
    tensors = [tvm.runtime.tensor(a) for a in args]
    lib["main"](*tensors)
    sig = F.wave_signature(program, [run.units])
    outputs = dict(zip(sig.outputs, [t.numpy() for t in tensors[-len(sig.outputs):]]))
    c, d = tvm_interop.run_reference(mod, [x])
    unit_of = {program.calls[u].func_name: u for u in run.units}
    assert len(unit_of) < len(run.units)   # two members of one kernel function, calling one subroutine
    assert json.loads(func.attrs[F.FLOW_ATTR])["subroutines"] == len(unit_of)
    np.testing.assert_allclose(outputs[(unit_of["max_pool2d1"], 0)], c, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(outputs[(unit_of["multiply"], 0)], d, rtol=1e-6, atol=1e-6)
    flags = tensors[1].numpy()
    assert flags[0] == run.tasks   # every task taken once
    assert list(flags[1:-1]) == [F.layout(members).tasks(m) for m in range(len(members))]
    assert flags[-1] == 0   # no wait gave up


@needs_nvcc
@pytest.mark.parametrize("coarsen", [False, True])
def test_coarsened_tasks_emulated_on_the_cpu_compute_the_model(coarsen):
    """``coarsen``: a member repacked into the run's narrower blocks gets one task per block of its own, which
    runs its repacked blocks in a loop. To have such members in a run that the CPU emulates exactly, the
    256-thread max pools are declared synchronising (which only makes the run keep their block: 256 threads);
    the 1024-thread element-wise kernels are then repacked 4 to 1, and, coarsened, each task runs 4 blocks."""
    from dataclasses import replace

    mod = _pools_and_adds()
    target = normalize_target(CUDA)
    program = prepare_program(mod, target, name="pools")
    sched = schedule_graph(program.graph, "sequential", "sim:h100")
    records, kernels = F.plan_flow_runs(program, sched, target)
    (run,) = [r for r in records if r.units]
    kernels = {u: replace(k, syncs=True) if k.nests[0].stmt.threads == 256 else k for u, k in kernels.items()}
    kern = F.build_flow_kernel(program, run.units, target, kernels, coarsen=coarsen)
    lay = kern.layout
    assert lay.block == 256
    assert lay.per_task == [4 if coarsen and m.launch.threads == 1024 else 1 for m in kern.members]
    assert set(lay.per_task) == ({1, 4} if coarsen else {1})
    fine = F.layout(kern.members)
    assert lay.total == (sum(m.launch.grid for m in kern.members) if coarsen else fine.total)
    assert not coarsen or lay.total < fine.total
    lib = tvm.tirx.build(tvm.IRModule({"main": _emulated(kern.func, {sub.gvar.name_hint: sub.func
                                                                    for sub in kern.subroutines})}),
                         target=tvm.target.Target({"kind": "llvm"}))
    x = np.random.default_rng(1).standard_normal((1, 24, 20, 20)).astype("float32")
    tensors = [tvm.runtime.tensor(np.zeros([int(d) for d in p.shape], str(p.dtype))) for p in kern.func.params]
    tensors[0] = tvm.runtime.tensor(x)
    lib["main"](*tensors)
    outputs = dict(zip(kern.signature.outputs, [t.numpy() for t in tensors[-len(kern.signature.outputs):]]))
    c, d = tvm_interop.run_reference(mod, [x])
    unit_of = {program.calls[u].func_name: u for u in run.units}
    np.testing.assert_allclose(outputs[(unit_of["max_pool2d1"], 0)], c, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(outputs[(unit_of["multiply"], 0)], d, rtol=1e-6, atol=1e-6)
    flags = tensors[1].numpy()
    assert list(flags) == lay.final_counters()
    assert flags[0] == lay.total and list(flags[1:-1]) == [lay.tasks(m) for m in range(len(kern.members))]


@needs_nvcc
def test_a_cpu_target_is_refused():
    program, _ = _program("squeezenet")
    sched = schedule_graph(program.graph, "sequential", "sim:h100")
    with pytest.raises(ScheduleError, match="persistent CUDA launch"):
        F.apply_flow_fusion(program, sched, "llvm")


@needs_nvcc
def test_a_schedule_over_several_gpus_is_refused():
    """hios places units on several devices; one flow launch runs on one GPU, so such a schedule is refused by name
    instead of being fused across devices with its mapping dropped."""
    program, target = _program("squeezenet")
    sched = schedule_graph(program.graph, "sequential", "sim:h100")
    sched.unit_devices = {u: i % 2 for i, u in enumerate(sched.unit_order())}
    with pytest.raises(ScheduleError, match=r"devices \[0, 1\] \(hios\)"):
        F.apply_flow_fusion(program, sched, target)


@needs_nvcc
@pytest.mark.parametrize("name", ["squeezenet"] + [pytest.param(n, marks=pytest.mark.ci)
                                                   for n in ("randwire", "nasnet_a_mobile", "inception_v3")])
def test_zoo_flow_kernels_compile_and_the_program_passes_the_as_built_check(name):
    """Every run's kernel compiles with nvcc (one persistent launch each, counters taken and waited on through
    atomics); the program that calls them (the zeroing kernel, then the launch) passes the stream memory check on
    the IR the build compiles. (Numerics need a GPU: gpu_check's ``X+flow`` variants.)"""
    import re

    from tvm_interop.passes.as_built import check_lowered
    from tvm_interop.passes.lower_streams import lower_program

    program, target = _program(name)
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name=name)
    new_prog, new_sched, records = F.apply_flow_fusion(program, sched, target)
    runs = [r for r in records if r.units]
    assert runs, [r.reasons for r in records]
    flows = {gv: f.with_attr("global_symbol", gv.name_hint) for gv, f in new_prog.mod.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and F.FLOW_ATTR in f.attrs}
    assert len(flows) == len(runs)
    subs = {gv: f for gv, f in new_prog.mod.functions.items() if gv.name_hint in _subroutines(new_prog)}
    # the build's last pass makes the subroutines private device functions again (after AttachGlobalSymbol)
    mod = keep_device_subroutines(target)(tvm.IRModule({**flows, **subs}))
    lib = tvm.tirx.build(mod, target=target)
    source = lib.imports[0].inspect_source()
    kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))
    assert len(kernels) == len(runs)   # one launch per run
    assert source.count("atomicAdd") >= 2 * len(runs)   # each run: tasks taken, tasks counted
    # one device function per kernel function and launch of each run, however many members call it
    device = set(re.findall(r'extern "C" __device__ void (\w+)\(', source))
    calls = {name: len(re.findall(rf"\b{name}\(", source)) - 2 for name in device}   # less declaration, definition
    expected = sum(json.loads(f.attrs[F.FLOW_ATTR])["subroutines"] for f in flows.values())
    assert len(device) == len(subs) == expected
    assert all(n >= 1 for n in calls.values()) and sum(calls.values()) == sum(r.members for r in runs)
    low = lower_program(new_prog, new_sched, target)
    report = check_lowered(low.mod, target)
    assert report.ok, report.summary()
    assert sum(len(r.stages) for r in records) == len(sched.stages)


@needs_nvcc
def test_coarsened_tasks_loop_over_their_blocks_without_unrolling():
    """A coarsened task's loop over its member's blocks stays a loop in the CUDA source that the product's build
    hands to nvcc (``#pragma unroll 1``): unrolled by nvcc, RandWire's coarsened run had twice the machine code of
    the run it coarsens (2.16 MB against 1.11), and the variant is there to show what fewer tasks buy, not more
    code."""
    import re

    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.cuda_compile import cuda_sources
    from tvm_interop.passes.lower import make_plan

    program, target = _program("squeezenet")
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name="squeezenet")
    records, kernels = F.plan_flow_runs(program, sched, target)
    loops = sum(k > 1 for r in records if r.units
                for k in F.layout(F.flow_members(program, r.units, kernels), coarsen=True).per_task)
    assert loops
    new_prog, new_sched, _ = F.apply_flow_fusion(program, sched, target, coarsen=True)
    source = "".join(cuda_sources(build_library(new_prog, new_sched, make_plan(new_prog, new_sched), target)))
    assert len(re.findall(r"#pragma unroll 1\n\s*for \(int64_t flow_j\d+ = ", source)) == loops


@needs_nvcc
def test_cuda_library_with_flow_runs_builds():
    """A whole library with flow runs (the zeroing kernels scheduled as the build schedules any kernel, the flow
    launches compiled to binaries by nvcc) builds through the product's build, its memory check included."""
    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.lower import make_plan

    program, target = _program("squeezenet")
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name="squeezenet")
    new_prog, new_sched, records = F.apply_flow_fusion(program, sched, target)
    runs = [r for r in records if r.units]
    assert runs
    zeros = [n for n, uc in new_prog.calls.items() if uc.binding_var.name.endswith("_flags")]
    assert len(zeros) == len(runs)
    assert all(st.groups[0][0] in zeros for st in new_sched.stages if len(st.groups[0]) == 2)
    plan = make_plan(new_prog, new_sched)
    build_library(new_prog, new_sched, plan, target)
    assert plan.meta["memory_check"].startswith("as-built")


@needs_nvcc
def test_compile_with_flow_fusion_lets_the_device_pick_between_flow_launches_and_streams(tmp_path):
    """``compile(fusion="flow")``: the library's default program runs the flow launches; beside it the same schedule
    unfused in both modes and sequential, every one through the as-built memory check, so a device where the flow
    launches lose (unmeasured so far) picks another program of the same library."""
    mod = get_model("squeezenet", **small_config("squeezenet"))
    cm = tvm_interop.compile(mod, target=CUDA, scheduler="greedy", cost="sim:h100", fusion="flow", name="squeezenet")
    try:
        meta, s = cm.plan.meta, cm.schedule
        names = [c["name"] for c in meta["candidates"]]
        assert names[0].startswith("greedy+flow-") and meta["default_candidate"].startswith("greedy+flow-")
        assert {c["fusion"] for c in meta["candidates"]} == {"flow", None}
        assert "greedy-stage-direct" in names and "greedy-dependency-graph" in names
        assert names[-2:] == ["sequential-direct", "sequential-graph"]
        assert meta["memory_check"].startswith("as-built")
        assert s.options["flow_fusion"] is True   # saved with the schedule: compile(schedule=...) fuses it again
        runs = [r for r in s.options["flow"] if r["units"]]
        assert runs and all(r["members"] >= 2 and r["tasks"] > 0 for r in runs)
        assert all(r["reasons"] for r in s.options["flow"] if not r["units"])   # each stage left out says why
        assert cm.gpu_estimate() is None   # the program model prices no flow launch (it would read it as one kernel)
        mem = cm.memory_report()   # against the model's own sequential program, not the flow program's main
        assert mem["scheduled_bytes"] > mem["sequential_bytes"] > 0   # every member's output stays alive
        from tvm_interop.library_info import describe_library, library_summary

        cm.export(str(tmp_path / "m.so"))   # what `tvm-interop show` reads from the file
        summary, plan = library_summary(str(tmp_path / "m.so"))
        (f,) = [u for u in summary["fused_units"] if u["fusion"] == "flow"][:1]
        assert f["launches"] == runs[0]["members"] and f["blocks"] == runs[0]["tasks"]
        assert f"{f['unit']}: one flow launch running {f['stages']} stage(s)" in describe_library(summary, plan)
    finally:
        cm.close()


def test_flow_fusion_of_a_cpu_build_is_refused_before_any_work(branchy_model):
    import time

    t = time.perf_counter()
    with pytest.raises(tvm_interop.InteropError, match="persistent CUDA launches.*not CUDA"):
        tvm_interop.compile(branchy_model, target="llvm", fusion="flow")
    assert time.perf_counter() - t < 10


@needs_nvcc
def test_a_schedule_cannot_be_both_wave_and_flow_fused(branchy_model):
    """A schedule file whose stages were chosen for wave fusion, compiled with flow launches as well: refused with
    both named, not a build that silently drops one of them."""
    from tvm_interop.passes.schedulers import schedule_graph as search

    program = prepare_program(branchy_model, normalize_target(CUDA), name="branchy")
    sched = search(program.graph, "greedy", "sim:h100")
    sched.options["wave_fusion"] = {"stages": [i for i, st in enumerate(sched.stages) if len(st.groups) > 1][:1]}
    sched.options[F.FLOW_OPTION] = True
    with pytest.raises(tvm_interop.InteropError, match="wave-fused stages and asks for flow launches"):
        tvm_interop.compile(branchy_model, target=CUDA, schedule=sched, name="branchy")


def test_cli_fusions_exclude_each_other(capsys):
    from tvm_interop.cli import main

    with pytest.raises(SystemExit):
        main(["compile", "squeezenet", "--target", "cuda", "--wave-fusion", "--flow-fusion"])
    assert "not allowed with argument" in capsys.readouterr().err


@needs_nvcc
@pytest.mark.ci
def test_cli_flow_fusion_summary_and_its_schedule_file_rebuild_the_launches(tmp_path, capsys):
    from tvm_interop.cli import main

    sj = tmp_path / "s.json"
    assert main(["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--target", CUDA,
                 "--scheduler", "greedy", "--cost", "sim:h100", "--flow-fusion", "--schedule-out", str(sj),
                 "--json"]) == 0
    ff = json.loads(capsys.readouterr().out)["flow_fusion"]
    assert ff["runs"] >= 1 and ff["launches"] >= 2 * ff["runs"] and ff["stages_fused"] >= ff["runs"]
    cm = tvm_interop.compile("squeezenet", target=CUDA, width=0.125, image_size=32, schedule=str(sj))
    try:
        assert cm.plan.meta["default_candidate"].startswith("greedy+flow-")
    finally:
        cm.close()


@needs_nvcc
@pytest.mark.parametrize("name", ["squeezenet", pytest.param("inception_v3", marks=pytest.mark.ci)])
def test_compiled_shared_memory_is_one_pool_of_the_largest_subroutines_size(name, tmp_path):
    """The subroutines declare no shared memory of their own (CUDA would lay every device function's arrays side
    by side): their buffers are views into one pool that the launch declares as large as the largest subroutine
    needs, and that is what the run's admission counts, plus the task slot. Read from the library the product's
    build exports (its cubins, read by ``scripts/kernel_resources.py``; exported with its binaries as a compiled
    model is): each flow kernel declares the pool and the slot, and less than its members' shared memory summed
    wherever two of its kernel functions use some."""
    from scripts_under_test import load_script
    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.cuda_compile import export_cuda_library
    from tvm_interop.passes.lower import make_plan
    from tvm_interop.passes.wave.subroutine import SHARED_ALIGN, pooled_shared_bytes

    program, target = _program(name)
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name=name)
    _, kernels = F.plan_flow_runs(program, sched, target)
    new_prog, new_sched, records = F.apply_flow_fusion(program, sched, target)
    path = str(tmp_path / "flow.so")
    export_cuda_library(build_library(new_prog, new_sched, make_plan(new_prog, new_sched), target), path, ["sm_90"])
    built = load_script("kernel_resources").library_kernels(path)
    runs = [r for r in records if r.units]
    assert runs
    summed_somewhere = False
    for r in runs:
        by_func = {program.calls[u].func_name: kernels[u] for u in r.units}
        largest = max(k.shared_bytes for k in by_func.values())
        pooled = max(pooled_shared_bytes(k) for k in by_func.values())
        # the cubin's section holds what the kernel declares plus the 1 KiB sm_90 reserves per block
        compiled = built[f"flow_{r.units[0]}_kernel"]["shared"] - 1024
        assert largest <= pooled and pooled + 4 <= compiled <= pooled + 4 + SHARED_ALIGN <= F.STATIC_SHARED_LIMIT, (
            r.units[0], largest, pooled, compiled)
        with_shared = [k.shared_bytes for k in by_func.values() if k.shared_bytes]
        if len(with_shared) >= 2:
            summed_somewhere = True
            assert compiled < sum(with_shared)
    assert summed_somewhere, "the case needs a run of two kernel functions with shared memory"


@needs_nvcc
def test_noinline_subroutines_stay_calls_in_the_exported_library(tmp_path):
    """``inline=False`` (gpu_check's ``X+flow_noinline``): every device function of a run is compiled as a call
    (``__noinline__``), one copy of its machine code however many members call it, where nvcc inlines most of
    them into the flow kernel otherwise. Read from the cubins of the library the product's build exports
    (``scripts/kernel_resources.py``: a function kept as a call is a symbol of its own in the kernel's code)."""
    from scripts_under_test import load_script
    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.cuda_compile import NOINLINE_SUFFIX, export_cuda_library
    from tvm_interop.passes.lower import make_plan

    resources = load_script("kernel_resources")
    program, target = _program("squeezenet")
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name="squeezenet")
    built = {}
    for inline in (True, False):
        new_prog, new_sched, records = F.apply_flow_fusion(program, sched, target, inline=inline)
        runs = [r for r in records if r.units]
        assert runs
        path = str(tmp_path / f"flow_{inline}.so")
        export_cuda_library(build_library(new_prog, new_sched, make_plan(new_prog, new_sched), target), path,
                            ["sm_90"])
        code = {k: v["code"] for k, v in resources.library_kernels(path).items()
                if k.startswith("flow_") and not k.startswith("flow_zero_")}
        assert len(code) == len(runs)
        built[inline] = (set(_subroutines(new_prog)), resources.library_device_functions(path), sum(code.values()),
                         sum(r.members for r in runs))
    subs, called, code, members = built[False]
    assert subs and all(n.endswith(NOINLINE_SUFFIX) for n in subs)
    assert set(called) == subs   # every one a call, none inlined
    inline_subs, inline_called, inline_code, _ = built[True]
    assert not any(n.endswith(NOINLINE_SUFFIX) for n in inline_subs) and len(inline_called) < len(inline_subs)
    assert len(subs) < members   # some function runs several members: inlined, its code is there once per call
    assert code < inline_code, (code, inline_code)


def _run_protocol(lay, members, slots: int, rng, taking=None) -> list[int]:
    """The launch's protocol played out with ``slots`` blocks resident at once, in a random interleaving: a free slot
    takes the next task from the counter; a block whose member's producers are not all counted waits, holding its
    slot; a running block finishes at a random later step and counts its task. Returns the order tasks finished
    in; raises if no block can move while tasks remain (a deadlock). ``taking``: the order tasks are handed out
    in (the counter's: ascending)."""
    owner = [m for m in range(len(members)) for _ in range(lay.tasks(m))]
    taking = list(range(lay.total)) if taking is None else list(taking)
    done = [0] * len(members)
    next_task, resident, finished = 0, [], []
    while len(finished) < lay.total:
        while len(resident) < slots and next_task < lay.total:
            resident.append(taking[next_task])
            next_task += 1
        ready = [t for t in resident if all(done[p] == lay.tasks(p) for p in members[owner[t]].deps)]
        if not ready:
            raise AssertionError(f"deadlock with {slots} slots: tasks {resident} all wait")
        t = rng.choice(ready)
        resident.remove(t)
        done[owner[t]] += 1
        finished.append(t)
    return finished


@needs_nvcc
@pytest.mark.parametrize("coarsen", [False, True])
def test_the_protocol_never_deadlocks_however_few_blocks_are_resident(coarsen):
    """Tasks are taken in order and wait only for lower ones, so even one resident block makes progress, and every
    task finishes after all of its producers' tasks (RandWire's greedy run, small config; its tasks as repacked
    blocks or, coarsened, one per block of a member's own)."""
    program, target = _program("randwire")
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name="randwire")
    records, kernels = F.plan_flow_runs(program, sched, target)
    run = max((r for r in records if r.units), key=lambda r: len(r.units))
    members = F.flow_members(program, run.units, kernels)
    lay = F.layout(members, coarsen)
    assert (lay.total < F.layout(members).total) == coarsen
    owner = [m for m in range(len(members)) for _ in range(lay.tasks(m))]
    rng = random.Random(0)
    for slots in (1, 2, 7, 132 * 7):
        order = _run_protocol(lay, members, slots, rng)
        at = {t: i for i, t in enumerate(order)}
        for t in range(lay.total):
            for p in members[owner[t]].deps:
                assert all(at[q] < at[t] for q in range(lay.starts[p], lay.starts[p] + lay.tasks(p)))
    # handed out in another order (as blocks the hardware happened to start last-first), the same run deadlocks
    # when fewer blocks fit than it has: the counter's order is what makes the waits safe
    with pytest.raises(AssertionError, match="deadlock"):
        _run_protocol(lay, members, 7, rng, taking=reversed(range(lay.total)))


@needs_nvcc
def test_flow_diff_builds_each_run_beside_its_members(tmp_path):
    """``scripts/gpu_wave_diff.py build --fusion flow`` (run on a GPU by ``gpu_check.sh wave-diff``): a library per
    model holding each run's launch and every member alone, compiled to binaries, and a spec ``run`` can follow:
    members in the run's order, each reading run inputs or earlier members' outputs, every member output compared,
    and the counters' expected values the layout's (every task taken, each member's counted). The run itself
    needs the GPU; it shares its code with the wave check that the CPU runs (``test_gpu_check_script``)."""
    from scripts_under_test import load_script

    from tvm_interop.models import small_config

    diff = load_script("gpu_wave_diff")
    diff.build(["squeezenet"], str(tmp_path), CUDA, model_kwargs=small_config("squeezenet"), fusion="flow")
    spec = json.loads((tmp_path / "squeezenet.json").read_text())
    assert spec["fusion"] == "flow" and spec["stages"]
    program, target = _program("squeezenet")
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name="squeezenet")
    records, kernels = F.plan_flow_runs(program, sched, target)
    runs = [r for r in records if r.units]
    # each run twice: its launch, then coarsened
    assert [st["groups"][0] for st in spec["stages"]] == [r.units for r in runs for _ in range(2)]
    assert [st["coarsen"] for st in spec["stages"]] == [False, True] * len(runs)
    fine, coarse = [st["tasks"][0] for st in spec["stages"][::2]], [st["tasks"][0] for st in spec["stages"][1::2]]
    assert all(c <= f for c, f in zip(coarse, fine)) and sum(coarse) < sum(fine)
    built = load_script("kernel_resources").library_kernels(str(tmp_path / "squeezenet.so"))
    for st in spec["stages"]:
        seen = set()
        for m in st["members"]:
            for a in m["args"]:
                assert a[1] in seen if a[0] == "unit" else 0 <= a[1] < len(st["inputs"])
            seen.add(m["unit"])
            assert f"{m['func']}_kernel" in built
        assert {u for u, _ in st["outputs"]} == seen
        assert len(st["tasks"]) == st["flags"] and st["tasks"][0] == sum(st["tasks"][1:])
        assert st["gave_up"] == st["flags"] - 1 and st["tasks"][-1] == 0   # the count of waits given up: none
        assert f"{st['wave']}_kernel" in built
    with pytest.raises(SystemExit, match="CUDA target"):
        diff.build(["squeezenet"], str(tmp_path / "cpu"), "llvm", model_kwargs=small_config("squeezenet"),
                   fusion="flow")


def test_flow_diff_reads_the_counters_back():
    """What ``gpu_wave_diff.py run`` concludes from a launch's counters read back on the device: all as expected;
    a wait that gave up (named apart, since then a wrong output comes from the wait, not from stale memory); a
    member's count short; and a build from before the give-up counter (no ``gave_up``), checked as it was."""
    from scripts_under_test import load_script

    check = load_script("gpu_wave_diff").check_counters
    st = {"tasks": [5, 2, 3, 0], "gave_up": 3}
    cases = {"right": [5, 2, 3, 0], "gave up": [5, 2, 3, 2], "short": [5, 2, 1, 0]}
    rows = {k: {"bad": []} for k in cases}
    for k, counted in cases.items():
        check(rows[k], counted, st)
    assert rows["right"] == {"bad": [], "waits_given_up": 0, "counters_ok": True}
    assert rows["gave up"] == {"bad": [["waits given up", 2]], "waits_given_up": 2, "counters_ok": True}
    assert rows["short"]["bad"] == [["counters", 1]] and not rows["short"]["counters_ok"]
    old = {"bad": []}
    check(old, [5, 2, 3], {"tasks": [5, 2, 3]})
    assert old == {"bad": [], "counters_ok": True}
