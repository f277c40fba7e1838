"""Wave fusion (Rammer): a stage's groups compiled into one kernel must compute exactly what the unfused program
computes, on every zoo model and on random models; the work partition must cover every iteration once and
balance the units; members that cannot join are left beside the fused kernel with their reason."""
import functools
import json
import os
import random
import re
import shutil

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

import tvm_interop
from tvm_interop.api import prepare_program
from tvm_interop.fuzz import random_input, random_model
from tvm_interop.models import get_model, list_models, small_config
from tvm_interop.passes.build import build_library
from tvm_interop.passes.lower import make_plan
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.target import normalize_target
from tvm_interop.passes.wave import NotFusable, apply_wave_fusion, fusable_stages
from tvm_interop.passes.wave import partition as P
from tvm_interop.passes.wave.kernel import WAVE_ATTR
from tvm_interop.passes.wave.lowered import split_cpu
from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.model import ScheduledModel
from conftest import refuse_in_wave_fusion
from zoo_cases import zoo_case, zoo_param, zoo_params

TOL = dict(rtol=1e-4, atol=1e-4)
HOST = normalize_target("llvm")
LIOS_FAST = ("inception_v3", "googlenet", "squeezenet", "resnet50")   # lios on the others: -m slow


def _input(mod, seed=7):
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape.values)
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _run(program, schedule, x, executor="threads"):
    plan = make_plan(program, schedule)
    model = ScheduledModel(build_library(program, schedule, plan, HOST), executor=executor)
    try:
        return model.run(x)
    finally:
        model.close()


# ------------------------------------------------------------------------------------------- partition
@pytest.mark.parametrize("seed", range(40))
def test_cpu_partition_covers_every_iteration_once_and_balances(seed):
    rng = random.Random(seed)
    veus = rng.randint(1, 9)
    parallel = [(rng.randint(1, 40), rng.randint(1, 500)) for _ in range(rng.randint(0, 5))]
    serial = [rng.randint(1, 20000) for _ in range(rng.randint(0 if parallel else 1, 5))]
    plan = P.plan_wave(parallel, serial, veus)
    assert len(plan.bounds) == veus + 1 and plan.bounds[0] == 0 and plan.bounds == sorted(plan.bounds)
    for share in plan.shares:
        owned = []
        for t in range(veus):
            lo, hi = P.share_range(share, plan.bounds[t], plan.bounds[t + 1])
            assert 0 <= lo <= hi <= share.n
            owned.extend(range(lo, hi))
        assert owned == list(range(share.n))          # contiguous per unit, each iteration exactly once
    assert all(0 <= t < veus for t in plan.owners)
    loads = P.unit_loads(plan, serial)
    assert sum(loads) == sum(n * w for n, w in parallel) + sum(serial)
    # no unit above the ideal level by more than one iteration (or than the largest serial nest, which is whole)
    ideal = max(sum(loads) / veus, max(serial, default=0))
    assert max(loads) <= ideal + max((w for _, w in parallel), default=0) + 1


@pytest.mark.parametrize("seed", range(20))
def test_block_partition_maps_each_block_to_one_member(seed):
    rng = random.Random(seed)
    grids = [rng.randint(1, 300) for _ in range(rng.randint(1, 6))]
    offsets, total = P.block_offsets(grids)
    seen = {m: [] for m in range(len(grids))}
    for b in range(total):
        m, local = P.owner_of_block(offsets, grids, b)
        seen[m].append(local)
    assert all(seen[m] == list(range(g)) for m, g in enumerate(grids))
    dims = (rng.randint(1, 7), rng.randint(1, 5), rng.randint(1, 3))
    n = dims[0] * dims[1] * dims[2]
    assert len({P.unflatten(i, dims) for i in range(n)}) == n


@pytest.mark.parametrize("seed", range(12))
def test_repacked_member_threads_are_each_run_once(seed):
    """A member whose threads do not synchronise is repacked into the wave's block size: every one of its
    ``grid x threads`` threads is some fused thread's, exactly once (the arithmetic of partition)."""
    rng = random.Random(seed)
    grid, threads, block = rng.randint(1, 40), rng.choice([1, 3, 32, 96, 128, 1024]), rng.choice([32, 64, 128, 256])
    runs = [P.member_thread(b, t, block, threads) for b in range(P.repacked_blocks(grid, threads, block))
            for t in range(block) if b * block + t < grid * threads]
    assert sorted(runs) == [(b, t) for b in range(grid) for t in range(threads)]


def test_admit_keeps_one_synchronising_block_size_per_wave():
    """``admit``: launches that do not synchronise go with any block size (repacked); synchronising ones of
    different sizes in one wave cannot, nor one smaller than a warp beside a larger launch."""
    from types import SimpleNamespace as NS

    from tvm_interop.passes.wave.cuda import admit

    def chain(name, threads, syncs):
        return [NS(name=name, syncs=syncs, nests=[NS(stmt=NS(threads=threads))])]

    keep, why = admit([chain("conv", 128, True), chain("add", 1024, False), chain("pool", 64, False)])
    assert keep == [0, 1, 2] and not why
    keep, why = admit([chain("conv", 128, True), chain("add", 1024, False), chain("conv2", 256, True),
                       chain("conv3", 256, True)])
    assert keep == [1, 2, 3] and "conv: its threads synchronise in blocks of 128" in why[0]
    keep, why = admit([chain("tiny", 8, True), chain("add", 1024, False), chain("mul", 512, False)])
    assert keep == [1, 2] and "'s run in blocks of" in why[0]


def _launch(k: int, grid: tuple, threads: tuple):
    """A synthetic kernel launch of member ``k`` (its body: ``Evaluate(k)``) over a 2-D grid and 2-D block."""
    from tvm.tirx import stmt as S

    from tvm_interop.passes.wave.cuda import Launch

    body = S.Evaluate(tvm.tirx.IntImm("int32", k))
    ivars = {}
    for tag, ext in reversed(list(zip(("blockIdx.x", "blockIdx.y", "threadIdx.x", "threadIdx.y"), grid + threads))):
        v = tvm.tirx.Var(f"m{k}_{tag.replace('.', '_')}", "int32")
        iv = tvm.tirx.IterVar(tvm.ir.Range(0, ext), v, tvm.tirx.IterVar.ThreadIndex, tag)
        body = S.AttrStmt(iv, "thread_extent", tvm.tirx.IntImm("int32", ext), body)
        ivars[tag] = v
    return Launch(body, f"m{k}"), ivars


def _emulate_launch(stmt, b: int, t: int) -> tuple[int, dict]:
    """Which member body fused block ``b``, thread ``t`` runs, and the values its index variables get: the
    emitted TIR evaluated (conditions and bindings simplified to constants), as the GPU would run it."""
    from tvm.tirx import stmt as S

    ana = tvm.sym.Analyzer()   # fresh per thread: each variable is bound once, to its constant
    env: dict = {}
    bx_attr = stmt

    def bind(var, x: int) -> None:
        env[var] = x
        ana.bind(var, tvm.tirx.IntImm(var.ty.dtype, x))

    def value(e) -> int:
        return int(ana.simplify(e))

    bind(bx_attr.node.var, b)
    bind(bx_attr.body.node.var, t)

    def walk(s):
        if isinstance(s, S.AttrStmt):
            return walk(s.body)
        if isinstance(s, S.IfThenElse):
            return walk(s.then_case) if value(s.condition) else (walk(s.else_case) if s.else_case else None)
        if isinstance(s, S.SeqStmt):
            for x in s.seq:
                r = walk(x)
                if r is not None:
                    return r
            return None
        if isinstance(s, S.Bind):
            bind(s.var, value(s.value))
            return None
        if isinstance(s, S.Evaluate):
            return int(s.value)
        raise AssertionError(f"unexpected statement {type(s).__name__}")

    return walk(bx_attr.body.body), env


@pytest.mark.parametrize("seed", range(6))
def test_wave_launch_runs_every_member_thread_once(seed):
    """The fused launch as emitted (TIR): synchronising members keep their blocks, the others are repacked into
    the wave's block size; evaluated on every fused (block, thread), each member's every (block, thread) runs
    exactly once, with its own index variables bound to it."""
    from tvm_interop.passes.wave.cuda import wave_launch

    rng = random.Random(seed)
    block = rng.choice([(32, 2), (64, 1), (16, 4)])
    members = []
    for k in range(rng.randint(2, 4)):
        syncs = k == 0 or rng.random() < 0.3
        threads = block if syncs else rng.choice([(1024, 1), (8, 3), (32, 1), (64, 2), block])
        grid = (rng.randint(1, 5), rng.randint(1, 3))
        members.append((k, grid, threads, syncs))
    launches, ivars = [], {}
    for k, grid, threads, syncs in members:
        la, iv = _launch(k, grid, threads)
        launches.append((f"m{k}", la, syncs))
        ivars[k] = iv
    stmt = wave_launch(launches, "w")
    total, width = int(stmt.value), int(stmt.body.value)
    assert width == block[0] * block[1]
    ran = {k: [] for k, *_ in members}
    for b in range(total):
        for t in range(width):
            k, env = _emulate_launch(stmt, b, t)
            if k is None:
                continue
            iv = ivars[k]
            ran[k].append(tuple(env[iv[tag]] for tag in ("blockIdx.x", "blockIdx.y", "threadIdx.x", "threadIdx.y")))
    for k, grid, threads, syncs in members:
        want = sorted((bx, by, tx, ty) for by in range(grid[1]) for bx in range(grid[0])
                      for ty in range(threads[1]) for tx in range(threads[0]))
        assert sorted(ran[k]) == want, f"member {k} (syncs={syncs}, grid {grid}, block {threads})"
        if syncs:   # a synchronising member keeps whole blocks: one fused block is one of its blocks
            assert len(ran[k]) == grid[0] * grid[1] * width


# ------------------------------------------------------------------------------------------- numerics
# RandWire at small_config's depth (5 nodes per stage) is a chain: nothing runs concurrently, nothing to fuse. At 10
# its random graphs branch (greedy fuses 21 stages); at the paper's 32 they do too, and take three times as long.
RANDWIRE_BRANCHY_DEPTH = 10


@functools.lru_cache(maxsize=None)
def _zoo(name: str):
    mod, x, ref = zoo_case(name, depth=RANDWIRE_BRANCHY_DEPTH) if name == "randwire" else zoo_case(name)
    return prepare_program(mod, HOST, name=name), x, ref


ZOO_CASES = ([zoo_param(n, "greedy", id=f"{n}-greedy") for n in list_models()]
             + [zoo_param(n, "lios", id=f"{n}-lios", marks=() if n in LIOS_FAST else pytest.mark.slow)
                for n in list_models()])


@pytest.mark.parametrize("name,scheduler", ZOO_CASES)
def test_every_zoo_model_fused_equals_plain_tvm(name, scheduler):
    """Every fusable stage fused (no cost model in the way): greedy gives wide stages of single units, lios
    chains; the fused program equals plain TVM (which the unfused program equals: test_zoo_pipeline)."""
    program, x, ref = _zoo(name)
    sched = schedule_graph(program.graph, scheduler, "sim:cpu", model_name=name)
    stages = fusable_stages(sched)
    if not stages:
        pytest.skip(f"{scheduler} found no concurrent stage in {name}")
    fused_prog, fused_sched, records = apply_wave_fusion(program, sched, HOST)
    assert [r.stage for r in records] == stages
    fused = [r for r in records if r.fused]
    assert fused, f"{name}: no stage fused: {[r.reasons for r in records]}"
    waves = [f for f in fused_prog.mod.functions.values()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and WAVE_ATTR in f.attrs]
    assert len(waves) == len(fused)
    assert len(fused_prog.graph) < len(program.graph)
    np.testing.assert_allclose(_run(fused_prog, fused_sched, x), ref, **TOL, err_msg=f"{name}: fused vs plain TVM")


def test_balanced_chains_run_whole_on_one_thread_each_and_unbalanced_ones_in_waves(monkeypatch):
    """A stage whose member chains balance over the threads is one region of whole chains (each member's kernels
    single-threaded, one after another, no barrier); with the slack at -1 every stage is waves again. Both
    programs equal plain TVM. Checked on the fused kernel the build compiles: one parallel loop in chain mode."""
    from tvm_interop.passes.wave import cpu as wave_cpu
    from tvm_interop.passes.wave.kernel import build_wave_kernel

    program, x, ref = _zoo("inception_v3")
    sched = schedule_graph(program.graph, "lios", "sim:cpu", model_name="inception_v3")
    stage = max(fusable_stages(sched), key=lambda i: len(sched.stages[i].groups))
    groups = [list(g) for g in sched.stages[stage].groups]
    monkeypatch.setattr(wave_cpu, "CHAIN_SLACK", 100.0)
    chains = build_wave_kernel(program, groups, HOST, veus=2)
    assert chains.mode == "chains" and chains.num_waves == 1
    assert chains.func.script().count("T.parallel") == 1
    fused_prog, fused_sched, records = apply_wave_fusion(program, sched, HOST)
    modes = {r.mode for r in records if r.fused}
    np.testing.assert_allclose(_run(fused_prog, fused_sched, x), ref, **TOL, err_msg="chains vs plain TVM")
    monkeypatch.setattr(wave_cpu, "CHAIN_SLACK", -1.0)
    waves = build_wave_kernel(program, groups, HOST, veus=2)
    assert waves.mode == "waves" and waves.num_waves >= max(len(g) for g in groups)   # a kernel: >= 1 nest
    fused_prog, fused_sched, records = apply_wave_fusion(program, sched, HOST)
    assert {r.mode for r in records if r.fused} == {"waves"}
    np.testing.assert_allclose(_run(fused_prog, fused_sched, x), ref, **TOL, err_msg="waves vs plain TVM")
    from tvm_interop.runtime.cpu_threads import kernel_threads

    if kernel_threads() > 1:
        assert "chains" in modes


def _synthetic_member(works: list[int], parallel_iterations: int | None = None):
    """A lowered kernel chain for the form arithmetic: one nest per work, each a loop that does nothing. With
    ``parallel_iterations``, a one-kernel member of one parallel loop (the kind that can be cut)."""
    from tvm import tirx
    from tvm.tirx import stmt as S
    from tvm_interop.passes.wave.lowered import LoweredKernel, Nest

    kernels = []
    for k, w in enumerate(works):
        n = parallel_iterations or 1
        v = tirx.Var(f"i{k}", "int64")
        loop = S.For(v, tirx.IntImm("int64", 0), tirx.IntImm("int64", n),
                     tirx.ForKind.PARALLEL if parallel_iterations else tirx.ForKind.SERIAL, S.Evaluate(0))
        kind = "parallel" if parallel_iterations else "serial"
        kernels.append(LoweredKernel(f"k{k}", None, [], [Nest(loop, kind, w, n)]))
    return kernels


def test_cpu_forms_and_the_default_form_follow_the_balance_of_the_chains():
    """Whole chains where they balance over the units; where they do not but a one-kernel member can fill the
    short unit, that member is cut (Inception-v3's stage of a 432 us convolution beside 189 us of chains);
    else waves. ``cpu_forms`` lists the forms that differ (what ``scripts/wave_forms_cpu.py`` compares); a
    forced form is built as asked where the stage can take it."""
    from tvm_interop.passes.wave.cpu import cpu_forms, fuse_cpu

    def build(members, veus=2, form=None):
        func, regions, mode = fuse_cpu(members, [], [], veus, {}, form)
        return regions, mode, func.script().count("T.parallel")

    balanced = [_synthetic_member([60, 70, 70]), _synthetic_member([100, 90])]
    assert build(balanced) == (1, "chains", 1)
    assert cpu_forms(balanced, 2) == ["chains", "waves"] and cpu_forms(balanced, 1) == ["waves"]
    stage7 = [_synthetic_member([34, 113, 36]), _synthetic_member([432], 20), _synthetic_member([5], 5)]
    assert build(stage7) == (1, "chains+split", 1)
    assert cpu_forms(stage7, 2) == ["chains", "chains+split", "waves"]
    assert build(stage7, form="chains")[1] == "chains" and build(stage7, form="waves") == (3, "waves", 1)   # one region: the later waves hold one serial nest
    hopeless = [_synthetic_member([400, 400, 200]), _synthetic_member([10], 4)]
    assert build(hopeless)[1] == "waves"
    assert build(balanced, form="chains+split")[1] == "chains"   # nothing to cut: whole chains
    assert build(balanced, veus=1, form="chains")[1] == "waves"  # one thread: no chains to spread
    with pytest.raises(ValueError, match="unknown CPU wave form"):
        build(balanced, form="rows")


def test_the_cut_member_s_iterations_go_to_the_unit_the_chains_leave_short():
    """The plan: unit 0 runs the 183-work chain and the start of the 432-work kernel, unit 1 the rest of it and
    the small kernel, each unit ending near half of the stage's 620. The built region runs every iteration of
    every member exactly once (each iteration adds one to its own element)."""
    from tvm import tirx
    from tvm.tirx import stmt as S
    from tvm_interop.passes.wave.cpu import chain_region
    from tvm_interop.passes.wave.lowered import Nest
    from tvm_interop.passes.wave.partition import plan_wave, share_range, unit_loads

    plan = plan_wave([(20, 432 // 20), (5, 1)], [183], 2)
    loads = unit_loads(plan, [183])
    assert abs(loads[0] - loads[1]) <= 432 // 20
    big = [share_range(plan.shares[0], plan.bounds[u], plan.bounds[u + 1]) for u in range(2)]
    assert big[0][0] == 0 and big[0][1] == big[1][0] and big[1][1] == 20 and 0 < big[0][1] < 20

    bufs = [tirx.decl_buffer((n,), "int32", name=f"b{k}") for k, n in enumerate((3, 20, 5))]

    def nest(buf, n, work, parallel, at=None):
        i = tirx.Var("i", "int64")
        idx = [i] if at is None else [tirx.IntImm("int64", at)]
        body = S.BufferStore(buf, tirx.BufferLoad(buf, idx) + tirx.IntImm("int32", 1), idx)
        kind = tirx.ForKind.PARALLEL if parallel else tirx.ForKind.SERIAL
        return Nest(S.For(i, tirx.IntImm("int64", 0), tirx.IntImm("int64", n), kind, body),
                    "parallel" if parallel else "serial", work, n)

    chains = [[nest(bufs[0], 1, w, False, at=k) for k, w in enumerate((34, 113, 36))],
              [nest(bufs[1], 20, 432, True)], [nest(bufs[2], 5, 5, True)]]
    region = chain_region(chains, 2, "t", 0.3)
    assert region is not None
    func = tirx.PrimFunc(bufs, region).with_attr("global_symbol", "main")
    lib = tvm.tirx.build(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "llvm"}))
    arrays = [tvm.runtime.tensor(np.zeros(b.shape[0].value, "int32")) for b in bufs]
    lib["main"](*arrays)
    for a in arrays:
        np.testing.assert_array_equal(a.numpy(), 1)


def test_every_cpu_form_of_a_fused_stage_equals_plain_tvm():
    """The forms ``cpu_forms`` offers for Inception-v3's lios stages, forced (``apply_wave_fusion(forms=...)``)
    so that every form is built at least once, cut chains included: the records name the forms built and the
    program computes what plain TVM computes. (Width 0.5 at 149 px: its cuts are offered for the AVX2 and the
    AVX-512 targets alike (znver3, znver4, skylake-avx512: the unit graph and the kernels' loops follow the
    target); width 0.25 offered none on znver4.)"""
    from tvm_interop.passes.wave.apply import fusion_program
    from tvm_interop.passes.wave.kernel import wave_forms

    mod, x, ref = zoo_case("inception_v3", width=0.5, image_size=149)
    program = prepare_program(mod, HOST, name="inception_v3")
    sched = schedule_graph(program.graph, "lios", "sim:cpu", model_name="inception_v3")
    fused_source = fusion_program(program, HOST)   # what apply_wave_fusion fuses: the weights repacked at build
    offered = {si: wave_forms(fused_source, [list(g) for g in sched.stages[si].groups], HOST, veus=2)
               for si in fusable_stages(sched)}
    forms, k = {}, 0
    for si, f in offered.items():   # cut chains wherever offered, the other stages taking turns
        forms[si] = "chains+split" if "chains+split" in f else f[k % len(f)]
        k += "chains+split" not in f
    assert set(forms.values()) == {"chains", "chains+split", "waves"}, offered
    fused_prog, fused_sched, records = apply_wave_fusion(program, sched, HOST, veus=2, forms=forms)
    assert {r.stage: r.mode for r in records if r.fused} == forms
    np.testing.assert_allclose(_run(fused_prog, fused_sched, x), ref, **TOL)


@pytest.mark.parametrize("seed", range(4))
def test_random_models_with_wave_fusion_equal_plain_tvm(seed):
    mod, desc = random_model(seed)
    x = random_input(mod, seed)
    ref = tvm_interop.run_reference(mod, [x])
    program = prepare_program(mod, HOST, name=f"fuzz{seed}")
    sched = schedule_graph(program.graph, "greedy", "sim:cpu")
    fused_prog, fused_sched, _ = apply_wave_fusion(program, sched, HOST)
    for executor in ("threads", "vm"):
        out = _run(fused_prog, fused_sched, x, executor)
        outs, refs = (out, ref) if isinstance(ref, list) else ([out], [ref])
        for o, r in zip(outs, refs):
            np.testing.assert_allclose(o, r, **TOL, err_msg=f"seed {seed} ({desc}) {executor}")


# ------------------------------------------------------------------------------------------- refusals
def test_nested_parallel_loops_are_refused_with_the_reason():
    @T.prim_func
    def nested(A: T.Buffer((4, 4), "float32")):
        for i in range(4):
            for j in T.parallel(4):
                A[i, j] = A[i, j] + T.float32(1)

    with pytest.raises(NotFusable, match="parallel loop below the top level"):
        split_cpu("nested", nested)


def test_a_member_that_cannot_join_stays_beside_the_fused_kernel(branchy_model, branchy_input, branchy_reference,
                                                                   monkeypatch):
    program = prepare_program(branchy_model, HOST, name="branchy")
    sched = schedule_graph(program.graph, "greedy", "sim:cpu")
    si = max(fusable_stages(sched), key=lambda i: len(sched.stages[i].groups))
    refused = sched.stages[si].groups[0][0]
    refuse_in_wave_fusion(monkeypatch, refused)
    fused_prog, fused_sched, records = apply_wave_fusion(program, sched, HOST, stages=[si])
    (rec,) = records
    assert [[refused]] == rec.left and any("refused by the test" in r for r in rec.reasons)
    if len(sched.stages[si].groups) >= 3:
        assert rec.fused and len(fused_sched.stages[si].groups) == 2    # the fused kernel and the refused unit
        assert refused in fused_sched.stages[si].units
    out = _run(fused_prog, fused_sched, branchy_input)
    np.testing.assert_allclose(out, branchy_reference, **TOL)
    json.dumps(fused_sched.options["waves"])      # the decisions go into the schedule file


# ------------------------------------------------------------------------------------------- cost and API
def test_simulated_cost_prices_a_fused_stage_without_the_stage_sync():
    from tvm_interop.passes.cost import get_cost_model

    program = prepare_program(get_model("inception_v3", **small_config("inception_v3")), HOST)
    sched = schedule_graph(program.graph, "greedy", "sim:cpu")
    cost = get_cost_model("sim:cpu")
    si = fusable_stages(sched)[0]
    groups = [[program.graph.unit(u) for u in g] for g in sched.stages[si].groups]
    fused, plain = cost.stage_latency(groups, "wave"), cost.stage_latency(groups)
    assert 0 < fused < plain    # small kernels: the fused stage saves the thread hand-offs
    # and never faster than its slowest kernel alone
    assert fused >= max(cost.unit_latency(u) for g in groups for u in g) - cost.spec.launch


def test_compile_with_wave_fusion_matches_plain_tvm_and_records_decisions(branchy_model, branchy_input,
                                                                          branchy_reference):
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", fusion="wave", guard=False, max_memory_ratio=None)
    try:
        np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, **TOL)
        wf = cm.schedule.options["wave_fusion"]
        assert wf["cost"] == "sim:cpu" and wf["decisions"]
        assert all("reason" in d for d in wf["decisions"])
        assert set(wf["stages"]) <= {d["stage"] for d in wf["decisions"]}
        if wf["stages"]:
            assert any(r["fused"] for r in cm.schedule.options["waves"])
    finally:
        cm.close()


def test_compile_with_wave_fusion_and_the_guard_measures_against_sequential(branchy_model):
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", fusion="wave", guard=True, max_memory_ratio=None,
                             guard_repeat=3)
    try:
        assert cm.guard is not None
        assert cm.schedule.search["shipped_because"]
    finally:
        cm.close()


def test_a_wave_library_with_candidates_also_carries_the_schedule_unfused(branchy_model, branchy_input,
                                                                           branchy_reference):
    """Whether the waves or the same schedule unfused is faster depends on the device and on CUDA graphs (H100 with
    graphs: unfused; without graphs: waves), so the library carries both and the device picks; every candidate
    computes what plain TVM computes (CPU: candidates on request, the VM runs each)."""
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", fusion="wave", cost="sim:cpu", guard=False,
                             executor="vm", candidates=True, max_memory_ratio=None, name="branchy")
    try:
        assert cm.schedule.options["wave_fusion"]["stages"], "nothing fused: the test needs a fused stage"
        meta = cm.plan.meta
        cands = {c["name"]: c for c in meta["candidates"]}
        assert list(cands) == ["greedy+wave-direct", "greedy-stage-direct", "greedy-dependency-direct",
                               "sequential-direct"]
        assert meta["default_candidate"] == "greedy+wave-direct"
        assert cands["greedy+wave-direct"]["fusion"] == "wave" and cands["greedy+wave-direct"]["scheduler"] == "greedy"
        assert all(cands[n]["fusion"] is None for n in list(cands)[1:])
        assert cands["greedy-stage-direct"]["num_streams"] >= 2
        m = ScheduledModel(cm.runner.library, executor="vm", plan=cm.plan)
        functions = set()
        for name in cands:
            m.select_candidate(name)
            np.testing.assert_allclose(m.run(branchy_input), branchy_reference, **TOL, err_msg=name)
            functions.add(m.entry_function)
        assert len(functions) == len(cands)
        m.close()
    finally:
        cm.close()


def test_table_without_fused_stages_leaves_them_unfused(tmp_path, branchy_model):
    from tvm_interop.passes.cost.table import TABLE_FORMAT, TableCostModel
    from tvm_interop.passes.wave import choose_wave_stages

    program = prepare_program(branchy_model, HOST, name="branchy")
    sched = schedule_graph(program.graph, "greedy", "sim:cpu")
    table = {"format": TABLE_FORMAT, "model": "branchy", "device": "test",
             "units": {u.name: 1e-5 for u in program.graph.units}, "stages": []}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    cost = TableCostModel(str(path))
    choose_wave_stages(program.graph, sched, cost)
    wf = sched.options["wave_fusion"]
    assert wf["stages"] == [] and all("no measurement of the fused stage" in d["reason"] for d in wf["decisions"])


def test_unknown_fusion_is_refused(branchy_model):
    with pytest.raises(InteropError, match="unknown fusion"):
        tvm_interop.compile(branchy_model, fusion="rammer")


# ------------------------------------------------------------------------------------------- CUDA (no GPU needed)
needs_nvcc = pytest.mark.skipif(not any(os.path.exists(p) for p in ("/usr/local/bin/nvcc", "/usr/local/cuda/bin/nvcc"))
                                and shutil.which("nvcc") is None, reason="CUDA builds need nvcc (the CUDA toolkit)")
CUDA = "cuda -arch=sm_90"


@needs_nvcc
@pytest.mark.parametrize("name", zoo_params())
def test_every_zoo_model_fused_for_cuda_compiles_and_passes_the_as_built_memory_check(name):
    """Every fusable stage fused for CUDA: the fused kernels compile with nvcc, and the scheduled program that
    calls them passes the stream memory check on the IR the build compiles. (Numerics need a GPU: gpu_check.)"""
    from tvm_interop.passes.as_built import check_lowered
    from tvm_interop.passes.lower_streams import lower_program

    target = normalize_target(CUDA)
    cfg = small_config(name)
    if name == "randwire":
        cfg["depth"] = RANDWIRE_BRANCHY_DEPTH
    program = prepare_program(get_model(name, **cfg), target, name=name)
    sched = schedule_graph(program.graph, "lios", "sim:h100", model_name=name)
    fused_prog, fused_sched, records = apply_wave_fusion(program, sched, target)
    fused = [r for r in records if r.fused]
    assert fused, f"{name}: {[r.reasons for r in records]}"
    for r in records:   # every group is either in the fused kernel or left beside it with a reason
        assert sorted(map(tuple, r.fused + r.left)) == sorted(map(tuple, sched.stages[r.stage].groups))
        assert len(r.reasons) >= len(r.left) or not r.fused
    waves = {gv.name_hint: f.with_attr("global_symbol", gv.name_hint) for gv, f in fused_prog.mod.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and WAVE_ATTR in f.attrs}
    assert len(waves) == len(fused)
    lib = tvm.tirx.build(tvm.IRModule(waves), target=target)
    (device,) = lib.imports
    source = device.inspect_source()
    kernels = set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source))
    assert all(any(k.startswith(f"{name}_kernel") for k in kernels) for name in waves)
    assert len(kernels) == sum(r.num_waves for r in fused)   # one launch per wave
    low = lower_program(fused_prog, fused_sched, target)
    report = check_lowered(low.mod, target)
    assert report.ok, report.summary()


@needs_nvcc
def test_cuda_library_with_fused_stages_builds_with_its_memory_check(branchy_model):
    target = normalize_target(CUDA)
    program = prepare_program(branchy_model, target, name="branchy")
    sched = schedule_graph(program.graph, "greedy", "sim:h100")
    fused_prog, fused_sched, records = apply_wave_fusion(program, sched, target)
    assert any(r.fused for r in records)
    plan = make_plan(fused_prog, fused_sched)
    build_library(fused_prog, fused_sched, plan, target)
    assert plan.meta["memory_check"].startswith("as-built")


@needs_nvcc
def test_cuda_wave_library_lets_the_device_pick_between_waves_and_streams(branchy_model):
    cm = tvm_interop.compile(branchy_model, target=CUDA, scheduler="greedy", fusion="wave", cost="sim:h100",
                             name="branchy")
    try:
        meta = cm.plan.meta
        names = [c["name"] for c in meta["candidates"]]
        assert names == ["greedy+wave-direct", "greedy+wave-graph", "greedy-stage-direct", "greedy-stage-graph",
                         "greedy-dependency-direct", "greedy-dependency-graph", "sequential-direct",
                         "sequential-graph"]
        assert meta["default_candidate"] == "greedy+wave-graph"
        fused = [u for u in meta["fused_units"] if u["fusion"] == "wave"]   # what `tvm-interop show` lists
        assert fused and all(u["groups"] >= 2 for u in fused)
        assert meta["memory_check"].startswith("as-built")   # every candidate, the unfused ones included
        streams = {c["streams_function"] for c in meta["candidates"]}
        assert len(streams) == 4   # one stream set per lowering
    finally:
        cm.close()


def test_members_over_the_shared_memory_limit_stay_beside_the_fused_kernel(branchy_model, monkeypatch):
    """A wave declares its members' shared memory together: two members that would exceed what a block may declare
    cannot share it. The largest is left beside the fused kernel, named with the reason, and the others fuse;
    never a failed build (here the members' declarations are inflated: the branchy kernels declare little)."""
    from dataclasses import replace

    from tvm_interop.passes.wave import kernel as wave_kernel
    from tvm_interop.passes.wave.apply import plan_wave_stage
    from tvm_interop.passes.wave.cuda import STATIC_SHARED_LIMIT

    target = normalize_target(CUDA)
    program = prepare_program(branchy_model, target, name="branchy")
    sched = schedule_graph(program.graph, "greedy", "sim:h100")
    si = max(fusable_stages(sched), key=lambda i: len(sched.stages[i].groups))
    groups = [list(g) for g in sched.stages[si].groups]
    assert len(groups) >= 3, "the case needs a stage of three groups"
    big = {groups[0][0]: STATIC_SHARED_LIMIT // 2 + 64, groups[1][0]: STATIC_SHARED_LIMIT // 2 + 32}
    real = wave_kernel.lower_unit
    monkeypatch.setattr(wave_kernel, "lower_unit", lambda prog, u, t: replace(real(prog, u, t), shared_bytes=big[u])
                        if u in big else real(prog, u, t))
    kernel, rec = plan_wave_stage(program, groups, target)
    assert kernel is not None and groups[0] in rec.left and groups[0] not in rec.fused
    assert groups[1] in rec.fused and len(rec.fused) == len(groups) - 1
    assert any("shared memory" in r and groups[0][0] in r for r in rec.reasons), rec.reasons


def test_groups_on_another_device_stay_apart(branchy_model):
    program = prepare_program(branchy_model, HOST, name="branchy")
    sched = schedule_graph(program.graph, "greedy", "sim:cpu")
    si = max(fusable_stages(sched), key=lambda i: len(sched.stages[i].groups))
    other = sched.stages[si].groups[-1]
    sched.unit_devices = {u: (1 if u in other else 0) for u in program.graph.index}
    _, _, (rec,) = apply_wave_fusion(program, sched, HOST, stages=[si])
    assert other in rec.left and any("on device 1" in r for r in rec.reasons)


def test_profiling_bundle_with_fused_stages_prices_them_from_the_table(tmp_path, branchy_model):
    """The bundle carries each greedy/lios stage fused; measured (here, runtime side), the table prices
    ``wave`` stages, and the stage choice uses those prices."""
    from tvm_interop.passes.cost.table import TableCostModel
    from tvm_interop.passes.profile_bundle import BundleOptions, build_profile_bundle
    from tvm_interop.passes.wave import choose_wave_stages
    from tvm_interop.runtime.profile_bundle import measure_bundle

    program = prepare_program(branchy_model, HOST, name="branchy")
    bundle = build_profile_bundle(program, HOST, str(tmp_path / "bundle"), BundleOptions(ios=False, wave=True))
    waves = [st for st in bundle.plan["stages"] if st.get("strategy") == "wave"]
    assert waves and all(st["run"][0][0] in bundle.plan["units"] for st in waves)
    table = measure_bundle(str(tmp_path / "bundle"), repeat=3, warmup=1, out=str(tmp_path / "costs.json"))
    assert sum(1 for st in table["stages"] if st["key"].startswith("wave:")) == len(waves)
    cost = TableCostModel(str(tmp_path / "costs.json"))
    sched = schedule_graph(program.graph, "greedy", "sim:cpu")
    choose_wave_stages(program.graph, sched, cost)
    decisions = sched.options["wave_fusion"]["decisions"]
    priced = [d for d in decisions if "fused_s" in d]
    assert priced, decisions      # greedy's own stages are in the bundle, fused
    assert all(d["fused_s"] > 0 for d in priced)


def test_a_stage_the_schedule_does_not_have_is_refused_by_name(branchy_model):
    """A wave choice naming a stage the schedule lacks (a file edited by hand) is refused, naming it, instead of
    an IndexError inside the pass; a stage that exists but cannot be fused is recorded as left unfused."""
    from tvm_interop.runtime.errors import ScheduleError

    program = prepare_program(branchy_model, HOST, name="branchy")
    sched = schedule_graph(program.graph, "lios", "sim:cpu")
    single = next(i for i, st in enumerate(sched.stages) if len(st.groups) == 1)
    with pytest.raises(ScheduleError, match=rf"stage\(s\) \[{len(sched.stages)}, -1\] that this schedule does not"):
        apply_wave_fusion(program, sched, HOST, stages=[single, len(sched.stages), -1])
    _, _, records = apply_wave_fusion(program, sched, HOST, stages=[single])
    assert records[0].reasons == ["not a concurrent stage of two or more groups"] and not records[0].fused


def test_cli_schedule_chooses_and_compile_applies_wave_fusion(tmp_path, capsys):
    """``schedule --wave-fusion`` saves the choice; ``compile --schedule`` builds it (with the memory bound off: at
    the default 1.5x SqueezeNet's lios schedule falls back to the sequential order, and the choice with it, which
    the summary says); ``compile --wave-fusion`` reports what it fused; the exported library runs with TVM's
    runtime and matches plain TVM."""
    from tvm_interop import runtime
    from tvm_interop.cli import main

    sj, so = tmp_path / "s.json", tmp_path / "m.so"
    model = ["squeezenet", "--width", "0.125", "--image-size", "32"]
    assert main(["schedule", *model, "--scheduler", "lios", "--cost", "sim:cpu", "--wave-fusion", "-o", str(sj),
                 "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)["wave_fusion"]["stages"]
    assert chosen and json.loads(sj.read_text())["options"]["wave_fusion"]["stages"] == chosen
    assert main(["compile", *model, "--schedule", str(sj), "--guard", "off", "--json"]) == 0
    bounded = json.loads(capsys.readouterr().out)
    assert bounded["memory_bound"]["sequential_fallback"] and bounded["wave_fusion"]["fused"] == 0
    assert "fallback to the sequential order" in bounded["wave_fusion"]["restaged"]
    assert main(["compile", *model, "--schedule", str(sj), "--guard", "off", "--max-memory-ratio", "none",
                 "-o", str(so), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["wave_fusion"]["fused"] == len(chosen) and summary["memory_bound"] is None
    from tvm_interop.runtime.cpu_threads import kernel_threads

    assert summary["kernel_threads"] == kernel_threads() >= 1   # what every CPU kernel call gets
    assert main(["compile", *model, "--scheduler", "greedy", "--wave-fusion", "--guard", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["wave_fusion"]["fusable"] > 0
    with pytest.raises(SystemExit):
        main(["compile", *model, "--max-memory-ratio", "0.5"])
    assert "--max-memory-ratio: must be >= 1" in capsys.readouterr().err
    m = runtime.load(str(so))
    mod = get_model("squeezenet", width=0.125, image_size=32)
    x = _input(mod)
    np.testing.assert_allclose(m.run(x), tvm_interop.run_reference(mod, [x]), **TOL)


# ------------------------------------------------------------------------ CUDA launches emulated on the CPU
def _serial_launch(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """A CUDA kernel (lowered TIR) as a CPU function: every thread launch a serial loop, barriers dropped. Exact
    for members that do not synchronise (each thread computes alone); a synchronising member's outputs are not."""
    from tvm.tirx import stmt as S

    from tvm_interop.passes.wave.lowered import rebuild

    def serial(s):
        if isinstance(s, S.AttrStmt) and s.attr_key in ("thread_extent", "virtual_thread"):
            v = s.node.var
            extent = s.value if s.value.ty.dtype == v.ty.dtype else tvm.tirx.Cast(v.ty.dtype, s.value)
            return S.For(v, tvm.tirx.IntImm(v.ty.dtype, 0), extent, S.ForKind.SERIAL, s.body)
        if isinstance(s, S.Evaluate) and "storage_sync" in str(s.value):
            return S.Evaluate(tvm.tirx.IntImm("int32", 0))
        return s

    return (func.with_body(rebuild(func.body, serial)).with_attr("target", tvm.target.Target({"kind": "llvm"}))
            .with_attr("global_symbol", "main"))


def _run_serial(func, arrays: list) -> list:
    lib = tvm.tirx.build(tvm.IRModule({"main": _serial_launch(func)}), target=tvm.target.Target({"kind": "llvm"}))
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    lib["main"](*tensors)
    return [t.numpy() for t in tensors]


def _conv_beside_depthwise():
    """x -> 1x1 convolution (DLight's Matmul rule: synchronises, 21 blocks of 128 threads) beside a 3x3 depthwise
    convolution (a thread per output, 256 per block): RandWire's stage that the H100 caught wrong."""
    from tvm import relax
    from tvm.script import relax as R

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((1, 156, 14, 14), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.standard_normal((156, 156, 1, 1)).astype("float32"))))
            b = bb.emit(relax.op.nn.conv2d(x, relax.const(rng.standard_normal((156, 1, 3, 3)).astype("float32")),
                                           padding=1, groups=156))
            out = bb.emit_output(bb.emit(relax.op.add(a, b)))
        bb.emit_func_output(out)
    return bb.get()


@needs_nvcc
def test_repacked_member_of_a_cuda_wave_computes_what_it_computes_alone():
    """The fused launch emulated thread by thread on the CPU: the depthwise convolution, repacked into the
    convolution's blocks of 128 threads after its 21 blocks, writes exactly what its own kernel writes. Its first
    thread is aligned to a whole block of its own (partition.repack_alignment): at 2688 threads in, TVM's
    FlattenBuffer simplified its weight index wrongly (every wave variant of RandWire and NASNet was wrong on the
    H100)."""
    from tvm_interop.passes.wave.apply import plan_wave_stage
    from tvm_interop.passes.wave.kernel import lower_unit

    target = normalize_target(CUDA)
    program = prepare_program(_conv_beside_depthwise(), target, name="conv_dw")
    convs = [u.name for u in program.graph.units if u.kind == "conv2d"]
    members = {u: lower_unit(program, u, target) for u in convs}
    (conv,), (dw,) = [u for u in convs if members[u].syncs], [u for u in convs if not members[u].syncs]
    kernel, rec = plan_wave_stage(program, [[conv], [dw]], target)   # the convolution's blocks first
    assert kernel is not None and rec.fused == [[conv], [dw]]
    assert (members[conv].nests[0].stmt.threads, members[dw].nests[0].stmt.threads) == (128, 256)
    assert members[conv].nests[0].stmt.grid * 128 % 256 != 0, "the case needs an offset that is not aligned"
    sig = kernel.signature
    rng = np.random.default_rng(1)
    inputs = []
    for ref in sig.inputs:
        owner = next(u for u in sig.units if ref in program.calls[u].args)
        p = members[owner].func.params[program.calls[owner].args.index(ref)]
        inputs.append(rng.standard_normal([int(d) for d in p.shape]).astype(str(p.dtype)))
    outs = [np.zeros([int(d) for d in program.calls[u].outputs[i].shape], program.calls[u].outputs[i].dtype)
            for u, i in sig.outputs]
    fused = _run_serial(kernel.func, inputs + outs)[len(inputs):]
    call = program.calls[dw]
    alone = _run_serial(members[dw].func, [inputs[sig.inputs.index(r)] for r in call.args]
                        + [np.zeros([int(d) for d in call.outputs[0].shape], call.outputs[0].dtype)])[-1]
    np.testing.assert_array_equal(fused[sig.outputs.index((dw, 0))], alone)
    assert np.abs(alone).max() > 0


def test_wave_launches_script_counts_every_fused_launch(tmp_path, capsys):
    """``scripts/wave_launches.py`` (docs/wave_launches.md): one row per model, its launches being exactly the
    fused kernels' waves, each with its blocks and threads, and the narrow ones counted against the SMs given."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    try:
        import wave_launches
    finally:
        sys.path.pop(0)
    out = tmp_path / "w.json"
    assert wave_launches.main(["squeezenet", "--width", "0.125", "--image-size", "32", "--sms", "3",
                               "--json", str(out)]) == 0
    assert "| squeezenet |" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    (m,) = doc["models"]
    (row,) = doc["summary"]
    launches = [la for st in m["fused_stages"] for la in st["launches"]]
    assert launches and row["launches"] == len(launches) == row["fused_stages"]   # greedy: one wave per stage
    assert all(b >= 1 and t >= 32 for b, t in launches)
    assert row["under_one_block_per_sm"] == sum(1 for b, _ in launches if b < 3)
    assert sum(row["under_by_block_size"].values()) == row["under_one_block_per_sm"]
    assert all(st["members"] >= 2 and len(st["member_s"]) == st["members"] for st in m["fused_stages"])


def _two_pools_of_one_tensor():
    """Two poolings of one activation, concatenated: a stage whose fused kernel takes one tensor and no weights."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((1, 8, 16, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1))
            b = bb.emit(relax.op.nn.avg_pool2d(x, pool_size=3, strides=1, padding=1))
            out = bb.emit_output(bb.emit(relax.op.concat([a, b], axis=1)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("target", ["llvm", pytest.param(CUDA, marks=needs_nvcc)])
def test_a_fused_stage_of_one_input_builds_through_tvms_own_pipeline(target):
    """A fused kernel whose call passes one tensor went through Relax's RewriteDataflowReshape, which asks
    HasReshapePattern about it and stopped the build with an InternalError (not a root block): `compile
    --wave-fusion` failed so on GoogLeNet's greedy stage of two layout transforms of one activation. Every fused
    kernel now has an empty root block, which TVM's lowering removes: the compiled kernels are the same."""
    from tvm import s_tir

    t = normalize_target(target)
    mod = _two_pools_of_one_tensor()
    program = prepare_program(mod, t, name="pools", layout="nchw")
    sched = schedule_graph(program.graph, "greedy", "sim:h100" if t.kind.name == "cuda" else "sim:cpu")
    fused_prog, _, records = apply_wave_fusion(program, sched, t)
    waves = {gv.name_hint: f for gv, f in fused_prog.mod.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and WAVE_ATTR in f.attrs}
    assert len(waves) == 1 and [r for r in records if r.fused], [r.reasons for r in records]
    (name, func), = waves.items()
    assert isinstance(func.body, s_tir.SBlockRealize) and len(func.params) == 1 + 2   # one input, two outputs
    # the fused program's own sequential main, through TVM's whole pipeline (where it failed)
    lib = tvm.compile(fused_prog.mod, t)
    if t.kind.name != "cuda":
        x = _input(mod)
        got = tvm.relax.VirtualMachine(lib, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, tvm_interop.run_reference(mod, [x]), **TOL)
    # the root block changes nothing that is compiled: the same code with and without it
    kernels = {name: func.with_attr("global_symbol", name)}
    bare = {name: kernels[name].with_body(func.body.block.body)}

    def code(funcs):
        built = tvm.tirx.build(tvm.IRModule(funcs), target=t)
        if t.kind.name == "cuda":
            return built.imports[0].inspect_source()
        seen: dict = {}   # LLVM's alias metadata names buffers by their object's address
        return re.sub(r"0x[0-9a-f]{6,}", lambda m: f"A{seen.setdefault(m.group(0), len(seen))}",
                      built.inspect_source("ll"))

    assert code(kernels) == code(bare)


def test_whole_chains_are_outlined_with_their_tiles_in_the_library_that_ships():
    """The library ``build_library`` compiles (TIR pipeline ``passes.wave.cpu_pipeline``): every whole chain of a
    CPU wave kernel is a function of its own named after its kernel (two kernels in one LLVM module, which its
    verifier accepts), no outlined function receives a register tile as a parameter (``StorageRewrite`` would
    hoist the tiles out of it: memory instead of registers), none receives one tensor through two pointers
    (all its pointers are ``noalias``: LLVM moved a consumer's loads above its producer's stores when a chain's
    producer output and consumer input came in separately), and the program equals plain TVM. The stages are
    the two widest and, of the others, the one with the longest chain: where the aliasing computed wrong numbers
    (groups of 1, 4 and 6 units on znver3, 1, 4 and 7 on znver4: the unit graph follows the target)."""
    import re

    from tvm_interop.passes.wave import cpu as wave_cpu
    from tvm_interop.passes.wave.cpu_pipeline import cpu_tir_pipeline
    from tvm_interop.passes.wave.kernel import (_lowered, build_wave_kernel, fused_param_map,
                                                wave_signature)

    program, x, ref = _zoo("inception_v3")
    sched = schedule_graph(program.graph, "lios", "sim:cpu", model_name="inception_v3")
    stages = sorted(fusable_stages(sched), key=lambda i: -len(sched.stages[i].groups))[:2]
    rest = [i for i in fusable_stages(sched) if i not in stages]
    stages.append(max(rest, key=lambda i: max(len(g) for g in sched.stages[i].groups)))
    assert max(len(g) for g in sched.stages[stages[2]].groups) >= 6, [sched.stages[i].groups for i in stages]
    kernels = {}
    for i, stage in enumerate(stages):
        groups = [list(g) for g in sched.stages[stage].groups]
        wk = build_wave_kernel(program, groups, HOST, veus=2, form=wave_cpu.CHAINS)
        sig = wave_signature(program, groups)
        _, binding = fused_param_map(program, sig, _lowered(program, sig, HOST, None))
        tensors = [len({id(binding[key]) for key in binding if key[0] in g}) for g in sig.groups]
        kernels[f"wave_test{i}"] = (wk.func.with_attr("global_symbol", f"wave_test{i}"), tensors)
    lib = tvm.compile(tvm.IRModule({n: f for n, (f, _) in kernels.items()}), HOST, tir_pipeline=cpu_tir_pipeline())
    ll = lib.mod.inspect_source("ll")
    for name, (_, tensors) in kernels.items():
        outlined = dict(re.findall(rf"^define [^@]*@{name}_chains_m(\d+)_compute_\((.*)$", ll, re.M))
        assert sorted(map(int, outlined)) == list(range(len(tensors))), (name, sorted(outlined))
        assert not any("intermediate_global" in params for params in outlined.values()), outlined
        for m, params in outlined.items():
            pointers = params.count("ptr ")
            assert 0 < pointers <= tensors[int(m)], (name, m, pointers, tensors[int(m)], params)
    fused_prog, fused_sched, records = apply_wave_fusion(program, sched, HOST, forms={s: wave_cpu.CHAINS
                                                                                       for s in stages})
    assert any(r.fused and r.mode == wave_cpu.CHAINS for r in records)
    np.testing.assert_allclose(_run(fused_prog, fused_sched, x, executor="vm"), ref, **TOL)


def test_without_outlining_a_wave_kernel_builds_exactly_as_tvms_own_pipeline_builds_it(monkeypatch):
    """``OUTLINE_CHAINS`` off (the A/B baseline of ``scripts/wave_forms_cpu.py``): the kernel holds no outline
    mark, and our TIR pipeline leaves it to TVM's default one (the same LLVM); on, the mark is there and our
    pipeline outlines the chains while TVM's own pipeline, ignoring the mark, builds the inline code."""
    from tvm_interop.passes.wave import cpu as wave_cpu
    from tvm_interop.passes.wave.cpu_pipeline import cpu_tir_pipeline
    from tvm_interop.passes.wave.kernel import build_wave_kernel

    program = prepare_program(_two_pools_of_one_tensor(), HOST, name="pools", layout="nchw")
    groups = [[u.name] for u in program.graph.units][:2]

    def llvm(func, pipeline):
        lib = tvm.compile(tvm.IRModule({"wave_pools": func.with_attr("global_symbol", "wave_pools")}), HOST,
                          tir_pipeline=pipeline)
        seen: dict = {}   # LLVM's alias metadata names buffers by their object's address
        return re.sub(r"0x[0-9a-f]{6,}", lambda m: f"A{seen.setdefault(m.group(0), len(seen))}",
                      lib.mod.inspect_source("ll"))

    outlined = build_wave_kernel(program, groups, HOST, veus=2, form=wave_cpu.CHAINS)
    assert wave_cpu.OUTLINE_ATTR in outlined.func.script()
    assert "wave_pools_chains_m0_compute_" in llvm(outlined.func, cpu_tir_pipeline())
    assert "chains_m0_compute_" not in llvm(outlined.func, "default")
    monkeypatch.setattr(wave_cpu, "OUTLINE_CHAINS", False)
    inline = build_wave_kernel(program, groups, HOST, veus=2, form=wave_cpu.CHAINS)
    assert inline.mode == wave_cpu.CHAINS and wave_cpu.OUTLINE_ATTR not in inline.func.script()
    assert llvm(inline.func, cpu_tir_pipeline()) == llvm(inline.func, "default")


def _scripted_pairs(left_on_threads: float):
    """sim:cpu with paired timings scripted: the first fusable stage wins fused; every later one is left unfused,
    its groups timed ``left_on_threads`` x their in-order time as scheduled (worker threads)."""
    from tvm_interop.passes.cost import get_cost_model

    cost = get_cost_model("sim:cpu")
    calls = []

    def wave_comparison(groups, strategy="concurrent"):
        calls.append(groups)
        fused = 0.5e-4 if len(calls) == 1 else 3e-4
        return {"wave": fused, strategy: 2e-4 * left_on_threads, "in_order": 2e-4}

    cost.wave_comparison = wave_comparison
    return cost


@pytest.mark.parametrize("left_on_threads", [1.0, 1.5, 0.5])
def test_stages_wave_fusion_leaves_run_in_order_when_the_workers_were_no_faster(branchy_model, branchy_input,
                                                                                branchy_reference, left_on_threads):
    """One concurrent stage left unfused would put the whole CPU program on the worker threads (every kernel
    dispatched from Python); when each stage left was timed no faster there than in order, the build runs their
    groups in order, on the VM. When the workers were faster for one of them, the guard decides (not set here)."""
    program = prepare_program(branchy_model, HOST, name="branchy")
    assert len(fusable_stages(schedule_graph(program.graph, "greedy", "sim:cpu"))) >= 2
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", cost=_scripted_pairs(left_on_threads),
                             fusion="wave", guard=False, max_memory_ratio=None)
    try:
        wf = cm.schedule.options["wave_fusion"]
        assert len(wf["stages"]) == 1 and len(wf["decisions"]) >= 2
        in_order = left_on_threads >= 1.0
        assert bool(cm.schedule.options.get("groups_in_order")) is in_order
        assert ("in_order" in wf) is in_order
        assert cm.runner.executor == ("vm" if in_order else "threads")
        assert cm.plan.max_concurrency() == (1 if in_order else max(len(cm.schedule.stages[d["stage"]].groups)
                                                                    for d in wf["decisions"][1:]))
        np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, **TOL)
    finally:
        cm.close()
    off = tvm_interop.compile(branchy_model, scheduler="greedy", cost=_scripted_pairs(left_on_threads),
                              fusion="wave", guard=False, max_memory_ratio=None, groups_in_order=False)
    try:   # the caller's False wins over wave fusion's choice
        assert not off.schedule.options.get("groups_in_order") and off.runner.executor == "threads"
        assert "in_order" not in off.schedule.options["wave_fusion"]
    finally:
        off.close()
