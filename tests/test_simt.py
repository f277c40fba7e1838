"""The shipped CUDA kernels run on the CPU by ``passes/simt/``: every flow launch and every wave-fused stage of
a zoo model computes what each of its members computes alone in TVM (the unit's own PrimFunc built for the CPU),
with no race, no divergent barrier, no out-of-bounds access and no task that would have to wait for a later one;
TVM's own kernels pass the same checks (which is also how the emulator is checked against TVM); and each check
fails on a kernel broken on purpose. What runs is what the product's build (``build_library``) compiled: the
device functions TVM's CUDA codegen received, launched as the host functions launch them (kernel, tensors, grid).
Whether a GPU runs them fast stays for ``scripts/gpu_check.sh``."""
import os

import numpy as np
import pytest
import tvm
from tvm.ir import expr as X
from tvm.tirx import stmt as S

from tvm_interop.api import prepare_program
from tvm_interop.models import get_model, small_config
from tvm_interop.passes import simt
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.target import normalize_target
from tvm_interop.passes.wave import flow as F
from tvm_interop.passes.wave.emulation import FlowEmulation, WaveEmulation
from tvm_interop.passes.wave.lowered import rebuild

needs_nvcc = pytest.mark.skipif(not any(os.path.exists(p) for p in ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"))
                                and not os.environ.get("CUDA_HOME"), reason="the CUDA build needs nvcc")
pytestmark = needs_nvcc
CUDA = "cuda -arch=sm_90"


_CASES = {}


def _case(key) -> FlowEmulation:
    """A zoo model at its small config, scheduled, flow-fused with ``options``, built and captured (once per
    session: the build with nvcc is most of a case's time)."""
    if key not in _CASES:
        name, scheduler, options = key
        program = prepare_program(get_model(name, **small_config(name)), normalize_target(CUDA), name=name)
        sched = schedule_graph(program.graph, scheduler, "sim:h100", model_name=name)
        _CASES[key] = FlowEmulation(program, sched, CUDA, **dict(options))
    return _CASES[key]


VARIANTS = {"flow": (), "flow_coarse": (("coarsen", True),), "flow_noinline": (("inline", False),)}
# noinline's device IR is the plain launch's under other names (``__noinline__`` goes into the CUDA source after
# TVM's codegen): SqueezeNet's case checks it by default, the larger models' only with --slow
FLOW_CASES = ([pytest.param("squeezenet", v, id=f"squeezenet-{v}") for v in VARIANTS]
              + [pytest.param(m, v, id=f"{m}-{v}",
                              marks=pytest.mark.slow if v == "flow_noinline" else pytest.mark.ci)
                 for m in ("randwire", "nasnet_a_mobile") for v in VARIANTS])


@pytest.mark.parametrize("model,variant", FLOW_CASES)
def test_every_flow_launch_computes_its_members_without_races(model, variant):
    case = _case((model, "greedy", VARIANTS[variant]))
    coarsen = dict(VARIANTS[variant]).get("coarsen", False)
    runs = case.runs()
    assert runs
    for run, name, sig in runs:
        res = case.check(run, name, sig)
        assert not res.wrong, f"{name}: members whose output differs from the unit alone: {res.wrong}"
        assert res.counters_right, f"{name}: a task taken twice or a member's counter short"
    assert not coarsen or any(k > 1 for run, _, _ in runs
                              for k in F.layout(F.flow_members(case.program, run.units, case.plan_kernels),
                                                True).per_task), "no coarsened member: the case tests nothing new"


@pytest.mark.parametrize("model,scheduler", [
    ("squeezenet", "greedy"),
    ("inception_v3", "ios"),   # chains in a group: stages of 3-5 waves, one launch each
    pytest.param("nasnet_a_mobile", "greedy", marks=pytest.mark.ci),
    pytest.param("googlenet", "greedy", marks=pytest.mark.slow)])
def test_every_wave_fused_stage_computes_its_members_without_races(model, scheduler):
    """Wave fusion's CUDA launches (gpu_check's ``X+wave``), until now checked only on a GPU: each fused stage's
    waves, launched as its host code launches them, compute every member's output as the unit alone."""
    program = prepare_program(get_model(model, **small_config(model)), normalize_target(CUDA), name=model)
    sched = schedule_graph(program.graph, scheduler, "sim:h100", model_name=model)
    case = WaveEmulation(program, sched, CUDA)
    assert case.records
    assert scheduler != "ios" or any(r.num_waves > 1 for r in case.records), "no stage of several waves"
    for rec in case.records:
        res = case.check(rec)
        assert not res.wrong, f"{rec.unit}: members whose output differs from the unit alone: {res.wrong}"


# ------------------------------------------------------------------ the checks fail on broken kernels
def _without(kernels, name, pred):
    """``kernels`` with every statement of ``name`` that ``pred`` matches replaced by a no-op."""
    nop = S.Evaluate(tvm.tirx.IntImm("int32", 0))
    out = dict(kernels)
    out[name] = kernels[name].with_body(rebuild(kernels[name].body, lambda s: nop if pred(s) else s))
    return out


def _is_call(s, suffix):
    return (isinstance(s, S.Evaluate) and isinstance(s.value, X.Call) and hasattr(s.value.op, "name")
            and (s.value.op.name.endswith(suffix)
                 or (s.value.op.name.endswith("call_extern") and s.value.args[0].value == suffix)))


@pytest.fixture(scope="module")
def squeezenet_flow():
    case = _case(("squeezenet", "greedy", ()))
    run, name, sig = case.runs()[0]
    return case, run, name, sig


def _shared_memory_member(case, flow_name):
    """A device function that the run's launch calls and that stages data in shared memory between barriers."""
    launch = case.kernels[f"{flow_name}_kernel"].script()
    for k, f in case.kernels.items():
        text = f.script()
        if f"{k}(" in launch and not k.endswith("_kernel") and 'scope="shared"' in text \
                and text.count("tvm_storage_sync") >= 2:
            return k
    raise AssertionError("no member with shared memory in the run")


def test_a_missing_barrier_is_a_race(squeezenet_flow):
    case, run, name, sig = squeezenet_flow
    member = _shared_memory_member(case, name)
    broken = _without(case.kernels, member, lambda s: _is_call(s, "tvm_storage_sync"))
    with pytest.raises(simt.EmulationError, match="missing __syncthreads"):
        case.launch(run, name, sig, broken)


def test_a_missing_wait_is_a_race(squeezenet_flow):
    case, run, name, sig = squeezenet_flow
    broken = _without(case.kernels, f"{name}_kernel", lambda s: isinstance(s, S.While))
    with pytest.raises(simt.EmulationError, match="without waiting for it"):
        case.launch(run, name, sig, broken)


def test_a_barrier_inside_a_branch_is_divergent(squeezenet_flow):
    """The barrier after thread 0 takes its task, moved inside thread 0's branch."""
    case, run, name, sig = squeezenet_flow
    kern = case.kernels[f"{name}_kernel"]
    sync = S.Evaluate(tvm.tirx.call_intrin("int32", "tirx.tvm_storage_sync", tvm.ir.StringImm("shared")))

    def into_branch(s):
        if (isinstance(s, S.IfThenElse) and isinstance(s.then_case, S.BufferStore)
                and "flow_task" in s.then_case.buffer.name):
            return S.IfThenElse(s.condition, S.SeqStmt([s.then_case, sync]), s.else_case)
        return s
    broken = dict(case.kernels)
    broken[f"{name}_kernel"] = kern.with_body(rebuild(kern.body, into_branch))
    assert broken[f"{name}_kernel"].script() != kern.script()
    with pytest.raises(simt.EmulationError, match="divergent barrier"):
        case.launch(run, name, sig, broken)


def test_a_task_that_waits_for_a_later_one_is_refused(squeezenet_flow):
    """Every wait's count raised by one: no producer is ever complete, so the first wait would spin."""
    case, run, name, sig = squeezenet_flow
    kern = case.kernels[f"{name}_kernel"]

    def harder(s):
        if isinstance(s, S.While):
            c = s.condition
            return S.While(tvm.tirx.And(tvm.tirx.LT(c.a.a, c.a.b + 1), c.b), s.body)
        return s
    broken = dict(case.kernels)
    broken[f"{name}_kernel"] = kern.with_body(rebuild(kern.body, harder))
    with pytest.raises(simt.EmulationError, match="has to wait"):
        case.launch(run, name, sig, broken)


def test_an_out_of_bounds_store_is_refused(squeezenet_flow):
    """The zeroing kernel's guard removed: its 1024 threads store past the counters."""
    case, run, name, sig = squeezenet_flow
    (zero,) = [ln.kernel for ln in case.launches(case.zeroing(name)[0])]
    kern = case.kernels[zero]
    broken = dict(case.kernels)
    broken[zero] = kern.with_body(rebuild(kern.body, lambda s: s.then_case if isinstance(s, S.IfThenElse) else s))
    with pytest.raises(simt.EmulationError, match="outside its"):
        case.launch(run, name, sig, broken)


# ------------------------------------------------------------------ TVM's own kernels, and the emulator against TVM
@pytest.mark.parametrize("model", ["squeezenet", "randwire"] + [
    pytest.param(m, marks=pytest.mark.ci) for m in ("inception_v3", "resnet50", "nasnet_a_mobile")] + [
    pytest.param(m, marks=pytest.mark.slow) for m in ("googlenet", "nasnet_a_large")])
def test_tvm_own_kernels_compute_each_unit_without_races(model):
    """Every kernel of a plain (unfused) build, emulated on its unit's inputs, equals the unit's PrimFunc built
    for the CPU: the emulator agrees with TVM on TVM's default CUDA schedules (convolutions through shared
    memory, reductions across threads and within a warp, RandWire's 8-thread blocks whose shuffles read lanes
    that do not exist, pools, concatenations), and those kernels pass the race checks."""
    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.lower import make_plan
    from tvm_interop.passes.wave.emulation import ref_value, unit_outputs

    program = prepare_program(get_model(model, **small_config(model)), normalize_target(CUDA), name=model)
    sched = schedule_graph(program.graph, "sequential", "sim:h100")
    built = simt.capture_build(
        lambda: build_library(program, sched, make_plan(program, sched), normalize_target(CUDA)))
    values = unit_outputs(program, np.random.default_rng(1))
    emu = simt.Emulator(built.device)
    for unit, call in program.calls.items():
        params = [p.name for p in program.mod[call.func_name].params]
        tensors = {n: np.ascontiguousarray(ref_value(program, values, a)).copy() for n, a in zip(params, call.args)}
        outs = {n: np.full(o.shape, np.nan, o.dtype) for n, o in zip(params[len(call.args):], call.outputs)}
        launches = simt.host_launches(built.host[call.func_name], call.func_name)
        assert launches, f"{unit}: its function launches no kernel"
        emu.call(launches, {**tensors, **outs})
        for (n, a), ref in zip(outs.items(), values[unit]):
            np.testing.assert_allclose(a, ref, rtol=1e-4, atol=1e-5, err_msg=f"{unit} ({call.func_name})")


def test_a_launch_whose_grid_differs_from_its_kernel_is_refused(squeezenet_flow):
    case, run, name, sig = squeezenet_flow
    (ln,) = case.launches(name)
    tensors, _ = case.tensors(name, sig, {"flow_flags": np.zeros(len(run.units) + 1, np.int32)})
    wrong = simt.KernelLaunch(ln.kernel, ln.args, (ln.grid[0] - 1,) + ln.grid[1:], ln.block)
    with pytest.raises(simt.EmulationError, match="compiled for"):
        simt.Emulator(case.kernels).call([wrong], tensors)


def test_and_and_or_short_circuit_as_in_c():
    """``a && b`` evaluates ``b`` only where ``a`` holds, ``a || b`` only where it fails, as the CUDA source TVM
    prints does: a load guarded that way is never out of bounds on the lanes the guard turns away (and a poll in a
    give-up test is not made before its polls ran out). Eight threads, eight elements, ``A[tx + 4]``."""
    from tvm.script import tirx as T

    @T.prim_func(private=True)
    def guarded(a: T.handle("float32", "global"), out: T.handle("float32", "global")):
        A = T.decl_buffer((8,), "float32", data=a)
        O = T.decl_buffer((8,), "float32", data=out)
        tx = T.launch_thread("threadIdx.x", 8)
        if tx < 4 and A[tx + 4] > T.float32(0):
            O[tx] = T.float32(1)
        if tx >= 4 or A[tx + 4] > T.float32(0):
            O[tx] = O[tx] + T.float32(2)

    @T.prim_func(private=True)
    def unguarded(a: T.handle("float32", "global"), out: T.handle("float32", "global")):
        A = T.decl_buffer((8,), "float32", data=a)
        O = T.decl_buffer((8,), "float32", data=out)
        tx = T.launch_thread("threadIdx.x", 8)
        if A[tx + 4] > T.float32(0) and tx < 4:
            O[tx] = T.float32(1)

    x = np.arange(8, dtype="float32") - 5   # A[4:] = -1, 0, 1, 2
    out = np.zeros(8, "float32")
    emu = simt.Emulator({"guarded": guarded, "unguarded": unguarded})
    emu.launch("guarded", [x, out])
    assert out.tolist() == [0, 0, 3, 3, 2, 2, 2, 2]
    with pytest.raises(simt.EmulationError, match="outside its 8 elements"):
        emu.launch("unguarded", [x, np.zeros(8, "float32")])


def test_shared_memory_readers_are_tracked_per_element():
    """The bookkeeping behind the write-after-read check, against a per-element count: an element read by one warp
    may be rewritten by that warp before the next barrier, one read by several warps by none; random accesses of
    1-4 warps, thread-ordered as the interpreter makes them."""
    from tvm_interop.passes.simt import memory

    rng = np.random.default_rng(0)
    for _ in range(200):
        warps = np.sort(rng.integers(0, rng.integers(1, 5), rng.integers(1, 160)))
        idx = rng.integers(0, 40, len(warps))
        got = np.broadcast_to(memory._readers(idx, warps), idx.shape)
        want = [next(iter(s)) if len(s) == 1 else -2
                for s in ({int(w) for w, j in zip(warps, idx) if j == i} for i in idx)]
        assert got.tolist() == want
    st = memory.Storage.make("s", "shared", np.zeros(8, "float32"))
    blk = memory.Block(0, 64, np.arange(64))
    memory._shared_race(st, np.array([1, 2, 2]), np.array([0, 0, 1]), 0, True, "s", "f", blk)
    memory._shared_race(st, np.array([1]), np.array([0]), 0, False, "s", "f", blk)   # its only reader rewrites it
    with pytest.raises(simt.EmulationError, match="read by another warp"):
        memory._shared_race(st, np.array([2]), np.array([0]), 0, False, "s", "f", blk)
    memory._shared_race(st, np.array([2]), np.array([1]), 1, False, "s", "f", blk)   # after a barrier: fine
