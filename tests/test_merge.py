"""IOS's operator merge (passes.merge): which convolutions merge, the Relax rewrite, its numerics in compile
(both executors), the schedule rewrite, and the measured cost of a merge stage."""
import numpy as np
import pytest

import tvm_interop
from tvm_interop.passes.merge import apply_merges, build_merged_kernel, epilogue_pattern, merge_key, mergeable, plan_merge_stage
from tvm_interop.passes.schedule import MERGE, Schedule, Stage
from tvm_interop.runtime.model import ScheduledModel

TOL = dict(rtol=1e-4, atol=1e-4)
SHAPE = (1, 4, 12, 12)


def make_merge_model(c: int = 4, size: int = 12, seed: int = 0):
    """One input feeding 1x1, 3x3 (pad 1) and 5x5 (pad 2) convs with bias + relu (mergeable), plus convs that must
    not merge with them: stride 2, no bias (other epilogue), depthwise, and one reading another tensor."""
    from tvm import relax

    rng = np.random.default_rng(seed)

    def w(*shape):
        return relax.const((rng.standard_normal(shape) * 0.3).astype("float32"))

    def b(n):
        return relax.const((rng.standard_normal((1, n, 1, 1)) * 0.1).astype("float32"))

    op = relax.op
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((1, c, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w(3, c, 1, 1)), b(3))))
            m = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w(5, c, 3, 3), padding=1), b(5))))
            n = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w(6, c, 5, 5), padding=2), b(6))))
            s = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w(4, c, 3, 3), strides=2, padding=1), b(4))))
            e = bb.emit(op.nn.relu(op.nn.conv2d(x, w(4, c, 3, 3), padding=1)))
            d = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w(c, 1, 3, 3), padding=1, groups=c), b(c))))
            q = bb.emit(op.nn.relu(op.add(op.nn.conv2d(a, w(4, 3, 3, 3), padding=1), b(4))))
            cat = bb.emit(op.concat([a, m, n, e, d, q], axis=1))
            y = bb.emit(op.nn.max_pool2d(cat, pool_size=2, strides=2))
            out = bb.emit_output(bb.emit(op.concat([y, s], axis=1)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def model():
    return make_merge_model()


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(3).standard_normal(SHAPE).astype("float32")


@pytest.fixture(scope="module")
def reference(model, x):
    return tvm_interop.run_reference(model, [x])


@pytest.fixture(scope="module")
def program(model):
    return tvm_interop.api.prepare_program(model, name="merge_model")


@pytest.fixture(scope="module")
def names(program):
    """Unit names by role, found from the units themselves (not from TVM's variable numbering)."""
    out = {}
    for u in program.graph.units:
        if u.kind != "conv2d":
            continue
        conv = u.attrs["conv"]
        o, _, kh, _ = conv["kernel_shape"]
        if conv["groups"] > 1:
            out["depthwise"] = u.name
        elif u.attrs["data"] != "input0":
            out["other_data"] = u.name
        elif conv["strides"] == [2, 2]:
            out["stride2"] = u.name
        elif epilogue_pattern(u.func_name) == ("relu",):
            out["no_bias"] = u.name
        else:
            out[f"k{kh}"] = u.name
    assert set(out) == {"k1", "k3", "k5", "stride2", "no_bias", "depthwise", "other_data"}, out
    return out


def merge_schedule(program, names, merged=("k1", "k3", "k5")):
    """Sequential order, except one merge stage of ``merged`` where the first of them would run."""
    group = [names[k] for k in merged]
    stages = []
    for u in program.graph.units:
        if u.name in group:
            if u.name == group[0]:
                stages.append(Stage([[n] for n in group], MERGE))
            continue
        stages.append(Stage([[u.name]]))
    s = Schedule(stages, graph_fingerprint=program.graph.fingerprint(), model_name="merge_model", scheduler="hand")
    s.validate(program.graph)
    return s


# ---------------------------------------------------------------------------------------------- mergeable
def test_epilogue_pattern():
    assert epilogue_pattern("fused_conv2d1_add1_relu1") == ("add", "relu")
    assert epilogue_pattern("fused_conv2d_add_relu") == ("add", "relu")
    assert epilogue_pattern("fused_conv2d12_relu3") == ("relu",)
    assert epilogue_pattern("conv2d3") == ()
    assert epilogue_pattern("fused_max_pool2d_add") is None
    assert epilogue_pattern("fused_conv2d_add_relu_merged1") == ("add", "relu")


def test_mergeable_three_kernel_sizes(program, names):
    units = [names["k1"], names["k3"], names["k5"]]
    check = mergeable(units, program)
    assert check, check.reason
    geo = check.geometry
    assert geo.pattern == ("add", "relu") and geo.kernel == (5, 5) and geo.padding == (2, 2, 2, 2)
    assert geo.offsets == [(2, 2), (1, 1), (0, 0)] and geo.channels == [3, 5, 6]
    # without the program (unit attributes only) the answer is the same
    assert mergeable([program.graph.unit(n) for n in units])
    assert merge_key(program.graph.unit(names["k1"])) == merge_key(program.graph.unit(names["k5"]))


@pytest.mark.parametrize("other, reason", [
    ("stride2", "different strides"),
    ("other_data", "not the same data"),
    ("no_bias", "different epilogues"),
    ("depthwise", "depthwise"),
])
def test_mergeable_refuses_with_reason(program, names, other, reason):
    check = mergeable([names["k3"], names[other]], program)
    assert not check and reason in check.reason, check.reason
    assert not mergeable([names["k3"]], program)


def test_plan_merge_stage_keeps_what_cannot_merge(program, names):
    stage = [names[k] for k in ("k1", "k3", "no_bias", "k5", "depthwise")]
    subsets, leftovers, reasons = plan_merge_stage(program, stage)
    assert subsets == [[names["k1"], names["k3"], names["k5"]]]
    assert leftovers == [names["no_bias"], names["depthwise"]] and reasons


def test_build_merged_kernel(program, names):
    kern = build_merged_kernel(program, [names["k1"], names["k3"], names["k5"]], suffix="t")
    assert [c[0] for c in kern.calls] == ["fused_conv2d_add_relu_t", "split_t"]
    assert kern.weight.shape == (14, 4, 5, 5)
    w1 = program.constants[program.calls[names["k1"]].args[1].index]
    np.testing.assert_array_equal(kern.weight[:3, :, 2:3, 2:3], w1)      # 1x1 in the centre
    assert np.count_nonzero(kern.weight[:3]) == np.count_nonzero(w1)     # zeros elsewhere


# ---------------------------------------------------------------------------------------------- rewrite
def test_apply_merges_rewrites_graph_and_schedule(program, names):
    from tvm import relax

    sched = merge_schedule(program, names)
    new_prog, new_sched = apply_merges(program, sched, placement="separate")
    relax.analysis.well_formed(new_prog.mod)
    new_sched.validate(new_prog.graph)
    assert new_sched.graph_fingerprint == new_prog.graph.fingerprint() != sched.graph_fingerprint
    assert new_sched.model_name == "merge_model" and new_sched.scheduler == "hand"
    assert all(s.strategy != MERGE for s in new_sched.stages)
    (rec,) = new_sched.options["merges"]
    merged, split = new_prog.graph.unit(rec["merged"]), new_prog.graph.unit(rec["split"])
    assert merged.kind == "conv2d" and merged.attrs["conv"]["kernel_shape"] == [14, 4, 5, 5]
    assert merged.attrs["conv"]["padding"] == [2, 2, 2, 2]
    assert split.kind == "split" and [o.shape[1] for o in split.outputs] == [3, 5, 6]
    # the merge stage became [[merged]], [[split]]; every other unit keeps its name and stage
    order = [st.groups for st in new_sched.stages]
    i = order.index([[rec["merged"]]])
    assert order[i + 1] == [[rec["split"]]]
    old = {u.name for u in program.graph.units} - {names[k] for k in ("k1", "k3", "k5")}
    assert old | {rec["merged"], rec["split"]} == {u.name for u in new_prog.graph.units}
    assert len(new_sched.stages) == len(sched.stages) + 1
    # consumers of the merged convs now read the split's outputs
    assert set(new_prog.graph.succ_names(rec["split"])) == {names["other_data"]} | {
        s for n in ("k1", "k3", "k5") for s in program.graph.succ_names(names[n])}
    # the default placement chains the split after the merged conv: [[merged, split]], no extra stage
    chained_prog, chained = apply_merges(program, sched)
    assert chained_prog.graph.fingerprint() == new_prog.graph.fingerprint()
    chained.validate(new_prog.graph)
    assert [[rec["merged"], rec["split"]]] in [st.groups for st in chained.stages]
    assert len(chained.stages) == len(sched.stages)
    # "fold" moves the split into the next stage: also one stage per original stage, still valid
    _, folded = apply_merges(program, sched, placement="fold")
    folded.validate(new_prog.graph)
    assert len(folded.stages) == len(sched.stages)
    # a merge stage of operators that cannot merge runs as a concurrent stage of the same graph
    bad = merge_schedule(program, names, merged=("k3", "stride2"))
    same_prog, as_concurrent = apply_merges(program, bad)
    assert same_prog is program and as_concurrent.options["merges"] == []
    assert [names["k3"]] in as_concurrent.stages[[st.strategy for st in bad.stages].index(MERGE)].groups
    as_concurrent.validate(program.graph)
    # without merge stages nothing changes
    plain = Schedule([Stage([[u.name]]) for u in program.graph.units], graph_fingerprint=sched.graph_fingerprint)
    assert apply_merges(program, plain) == (program, plain)


def test_compile_with_merge_stage_matches_tvm(model, program, names, x, reference, tmp_path):
    sched = merge_schedule(program, names)
    cm = tvm_interop.compile(model, schedule=sched, name="merge_model")
    # what is kept and saved is the original merge-stage schedule, valid for the original model
    assert cm.schedule is sched and any(s.strategy == MERGE for s in cm.schedule.stages)
    cm.schedule.validate(cm.graph)
    cm.schedule.save(tmp_path / "s.json")
    assert any(s.strategy == MERGE for s in Schedule.load(tmp_path / "s.json").stages)
    # what was built: one merged kernel instead of three convolutions
    funcs = {c.func for c in cm.plan.calls}
    assert "fused_conv2d_add_relu_merged" in funcs and "split_merged" in funcs
    assert len(cm.plan.calls) == len(program.graph) - 3 + 2
    cm.built_schedule.validate(cm.built_program.graph)
    np.testing.assert_allclose(cm.run(x), reference, **TOL)                  # threads (CPU default)
    vm = ScheduledModel(cm.runner.library, executor="vm")
    np.testing.assert_allclose(vm.run(x), reference, **TOL)
    vm.close()
    cm.close()


# ---------------------------------------------------------------------------------------------- cost
def test_measured_cost_times_the_merged_kernel(program, names, tmp_path):
    from tvm_interop.passes.cost.measured import MeasuredCostModel

    cost = MeasuredCostModel(program, cache=tmp_path / "cc.json", repeat=3)
    units = [[program.graph.unit(names[k])] for k in ("k1", "k3", "k5")]
    merged = cost.stage_latency(units, strategy="merge")
    assert merged > 0 and np.isfinite(merged)
    assert cost.merged_builds == 1
    n = cost.measurements
    assert cost.stage_latency(units[::-1], strategy="merge") == merged and cost.measurements == n  # memoised
    # a "merge" of operators that cannot merge costs what will run: the concurrent stage
    bad = [[program.graph.unit(names[k])] for k in ("k3", "stride2")]
    assert cost.stage_latency(bad, strategy="merge") == cost.stage_latency(bad)
    assert cost.merged_builds == 1
    cost.close()
    again = MeasuredCostModel(program, cache=tmp_path / "cc.json", repeat=3)
    assert again.stage_latency(units, strategy="merge") == merged and again.merged_builds == 0
    again.close()


def test_ios_merges_under_sim_cost_end_to_end(model, x, reference):
    """IOS proposes merge stages under the simulated CPU cost; compile applies them and the outputs still match."""
    from tvm_interop.passes.schedulers import schedule_graph

    graph = tvm_interop.api.prepare_program(model).graph
    sched = schedule_graph(graph, "ios", "sim:cpu")
    if not any(s.strategy == MERGE for s in sched.stages):
        pytest.skip("ios chose no merge stage under sim:cpu")
    cm = tvm_interop.compile(model, scheduler="ios", cost="sim:cpu", guard=False)   # the merges, not the guard
    assert any(s.strategy == MERGE for s in cm.schedule.stages)
    assert any(c.func.endswith("_merged") for c in cm.plan.calls)
    np.testing.assert_allclose(cm.run(x), reference, **TOL)
    vm = ScheduledModel(cm.runner.library, executor="vm")
    np.testing.assert_allclose(vm.run(x), reference, **TOL)
    vm.close()
    cm.close()


def make_two_merge_model(seed: int = 1):
    """x feeds a 3x3 and a 1x1 conv (merge A); the 3x3's output feeds a 1x1 and a 3x3 conv (merge B, whose input
    is then an output of merge A's split); the 1x1's output feeds one more conv."""
    from tvm import relax

    rng = np.random.default_rng(seed)

    def cbr(v, cin, cout, k):
        w = relax.const((rng.standard_normal((cout, cin, k, k)) * 0.3).astype("float32"))
        b = relax.const((rng.standard_normal((1, cout, 1, 1)) * 0.1).astype("float32"))
        return relax.op.nn.relu(relax.op.add(relax.op.nn.conv2d(v, w, padding=k // 2), b))

    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((1, 4, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a1 = bb.emit(cbr(x, 4, 4, 3))
            a2 = bb.emit(cbr(x, 4, 3, 1))
            b1 = bb.emit(cbr(a1, 4, 2, 1))
            b2 = bb.emit(cbr(a1, 4, 3, 3))
            c = bb.emit(cbr(a2, 3, 2, 3))
            out = bb.emit_output(bb.emit(relax.op.concat([b1, b2, c, a2], axis=1)))
        bb.emit_func_output(out)
    return bb.get()


def test_two_merges_dependency_mode_and_export(tmp_path):
    from tvm_interop import runtime
    mod = make_two_merge_model()
    prog = tvm_interop.api.prepare_program(mod, name="two")
    a1, a2, b1, b2, c, cat = [u.name for u in prog.graph.units]
    assert prog.graph.unit(b1).attrs["data"] == a1 and prog.graph.unit(c).attrs["data"] == a2
    fp = prog.graph.fingerprint()
    two = Schedule([Stage([[a1], [a2]], MERGE), Stage([[b1], [b2]], MERGE), Stage([[c]]), Stage([[cat]])],
                   graph_fingerprint=fp, model_name="two")
    new_prog, new_sched = apply_merges(prog, two, placement="fold")
    recs = new_sched.options["merges"]
    assert [r["units"] for r in recs] == [[a1, a2], [b1, b2]]
    # folded: [[mergedA]], [[splitA, mergedB]], [[splitB, c]], [[cat]]
    assert [s.groups for s in new_sched.stages] == [
        [[recs[0]["merged"]]], [[recs[0]["split"], recs[1]["merged"]]], [[recs[1]["split"], c]], [[cat]]]
    # a split read by two groups of the next stage keeps a stage of its own
    one = Schedule([Stage([[a1], [a2]], MERGE), Stage([[b1], [b2], [c]]), Stage([[cat]])], graph_fingerprint=fp)
    _, s1 = apply_merges(prog, one, placement="fold")
    (r,) = s1.options["merges"]
    assert [s.groups for s in s1.stages][:2] == [[[r["merged"]]], [[r["split"]]]]

    x = np.random.default_rng(5).standard_normal((1, 4, 10, 10)).astype("float32")
    ref = tvm_interop.run_reference(mod, [x])
    cm = tvm_interop.compile(mod, schedule=two, mode="dependency", name="two")
    funcs = [call.func for call in cm.plan.calls]
    assert sorted(funcs) == sorted(["fused_conv2d_add_relu_merged", "fused_conv2d_add_relu_merged1", "split_merged",
                                    "split_merged1", prog.calls[c].func_name, prog.calls[cat].func_name])
    np.testing.assert_allclose(cm.run(x), ref, **TOL)
    vm = ScheduledModel(cm.runner.library, executor="vm")
    np.testing.assert_allclose(vm.run(x), ref, **TOL)
    vm.close()
    cm.export(str(tmp_path / "two.so"))
    cm.close()
    loaded = runtime.load(str(tmp_path / "two.so"))
    np.testing.assert_allclose(loaded.run(x), ref, **TOL)
    loaded.close()
