"""Learned cost model (XGBoost on measured stages) and the active search that measures what it picks.

Ground truth for the model-level tests is the simulated device: a real cost model whose stage latencies have
contention the learned model must pick up from samples. The end-to-end test times real kernels.
"""
import numpy as np
import pytest

import tvm_interop
from tvm_interop.passes.cost import get_cost_model
from tvm_interop.passes.cost.learned import LearnedCostModel, TreeEnsemble, stage_features
from tvm_interop.passes.schedule import sequential_stages
from tvm_interop.passes.schedulers.active import active_search
from tvm_interop.passes.schedulers.latency import annotate_latency
from tvm_interop.passes.synthetic import inception_like, randwire_like
from tvm_interop.runtime.errors import InteropError


def test_tree_ensemble_equals_booster():
    xgb = pytest.importorskip("xgboost")
    rng = np.random.RandomState(0)
    X = rng.rand(200, 6).astype(np.float32)
    y = X[:, 0] * 2 + np.sin(X[:, 3] * 6) + (X[:, 5] > 0.3)
    for depth in (1, 3, 5):  # depth 5 on 200 rows leaves some leaves above the bottom: padding is exercised
        b = xgb.train({"max_depth": depth, "eta": 0.2, "nthread": 1}, xgb.DMatrix(X, label=y), 40)
        forest = TreeEnsemble(b, depth)
        T = rng.rand(100, 6).astype(np.float32)
        np.testing.assert_allclose([forest.predict_one(t) for t in T], b.inplace_predict(T), rtol=1e-5, atol=1e-5)


def test_stage_features_ignore_group_order():
    a = [(1e-3, 2, 1e6, 1e4), (3e-3, 1, 5e6, 2e4), (2e-4, 1, 1e5, 1e3)]
    assert stage_features(a, 2) == stage_features(a[::-1], 2)
    assert stage_features(a, 16)[2] == 5.0  # 16 cores over 3 groups


def _learned(graph, truth="sim:cpu", **kw):
    return LearnedCostModel(get_cost_model(truth), graph, **kw)


def test_measured_stages_are_answered_exactly_and_others_predicted():
    g = inception_like(blocks=2)
    truth = get_cost_model("sim:cpu")
    m = _learned(g, seed_stages=24)
    seeded = m.seed_from(g)
    assert seeded >= 10 and m.measured_stages == seeded
    u = g.units
    assert m.unit_latency(u[3]) == truth.unit_latency(u[3])
    assert m.stage_latency([[u[1], u[2]]]) == pytest.approx(truth.unit_latency(u[1]) + truth.unit_latency(u[2]))
    known = next(iter(m._known))  # a measured stage comes back as its measurement
    groups = [[g.unit(n) for n in grp] for grp in known]
    assert m.stage_latency(groups) == truth.stage_latency(groups)
    # an unmeasured stage is predicted: never below its slowest group, never above twice the sum
    ind = [x for x in u if not g.preds[g.index[x.name]]][:1] + [x for x in u if x.kind.startswith("conv")][-1:]
    pred = m.predict([[x] for x in ind])
    lat = [m.unit_latency(x) for x in ind]
    assert max(lat) <= pred <= 2 * sum(lat)
    assert m.fits == 1 and m.cv_error is not None and m.cv_error >= 0


def test_learned_model_tracks_the_truth_on_held_out_stages():
    g = randwire_like(nodes=24, stages=1)
    truth = get_cost_model("sim:cpu")
    m = _learned(g, seed_stages=160, seed=1)
    m.seed_from(g)
    m.fit()
    other = _learned(g, seed_stages=40, seed=7)._random_antichains(g)
    held = [s for s in other if tuple(sorted(tuple(x.name for x in grp) for grp in s)) not in m._known]
    assert len(held) >= 10
    err = [abs(m.predict(s) - truth.stage_latency(s)) / truth.stage_latency(s) for s in held]
    naive = [abs(sum(m.unit_latency(grp[0]) for grp in s) - truth.stage_latency(s)) / truth.stage_latency(s)
             for s in held]
    assert np.median(err) < 0.25
    assert np.median(err) < np.median(naive)  # it learned something about concurrency, not just "sum of units"


def test_active_search_measures_what_it_ships():
    g = inception_like(blocks=2)
    truth = get_cost_model("sim:cpu")
    m = _learned(g, seed_stages=16)
    sched = active_search(g, "ios", m, rounds=4)
    sched.validate(g)
    rounds = sched.search["active_rounds"]
    assert 1 <= len(rounds) <= 4 and sched.search["seed_stages_measured"] > 0
    assert rounds[-1]["new_stages_measured"] == 0 or len(rounds) == 4
    for st in sched.stages:  # every stage of the shipped schedule is a measurement (here: the truth)
        groups = [[g.unit(n) for n in grp] for grp in st.groups]
        assert m.is_measured(groups, st.strategy)
    check = sched.__class__.from_json(sched.to_json())
    annotate_latency(check, g, truth)
    assert sched.predicted_latency == pytest.approx(check.predicted_latency, rel=1e-9)
    assert sched.predicted_latency == pytest.approx(min(r["measured_ms"] for r in rounds) / 1e3)
    seq = sum(truth.stage_latency([[g.unit(n) for n in grp] for grp in st.groups])
              for st in sequential_stages(u.name for u in g.units))
    assert sched.predicted_latency <= seq * (1 + 1e-9)


def test_active_search_rejects_bad_rounds():
    g = inception_like(blocks=1)
    with pytest.raises(ValueError, match="rounds"):
        active_search(g, "ios", _learned(g), rounds=0)


def test_cost_spec_errors_are_clear(branchy_model):
    with pytest.raises(InteropError, match="learned cost option"):
        tvm_interop.compile(branchy_model, scheduler="ios", cost="learned:rounds=zero")
    with pytest.raises(InteropError, match="profiling bundle"):
        tvm_interop.compile(branchy_model, target="cuda", scheduler="ios", cost="learned")
    with pytest.raises(InteropError, match="times kernels"):
        get_cost_model("learned")


def test_compile_with_learned_cost_matches_tvm(branchy_model, branchy_input, branchy_reference, tmp_path):
    cm = tvm_interop.compile(branchy_model, scheduler="ios", cost="learned:rounds=3,seed_stages=8",
                             cost_cache=tmp_path / "cc.json", guard_repeat=5)
    search = cm.schedule.search
    np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, rtol=1e-4, atol=1e-4)
    if cm.schedule.scheduler == "ios":
        assert search["active_rounds"] and search["measurements"] > 0
        assert search["learned_measured_stages"] >= 1
    cm.close()
