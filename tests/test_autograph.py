"""AutoGraph end to end: substitutions searched with the schedule, checked against plain TVM."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tvm_interop
from tvm_interop.passes.autograph.driver import run_autograph
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.model import ScheduledModel
from tvm_interop.api import prepare_program
from tvm_interop.cli import main
from tvm_interop.fuzz import random_cell_model, random_input, random_model
from tvm_interop.models import get_model, small_config
from zoo_cases import zoo_case, zoo_params

TOL = dict(rtol=1e-4, atol=1e-4)


def _input(mod, seed=0):
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape.values)
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _search(mod, cost="sim:h100", **options):
    """autograph under a simulated cost, candidates prepared without CPU schedules (no build needed)."""
    return run_autograph(mod, prepare=lambda m: prepare_program(m, "llvm", cpu_schedule=False),
                         cost_for=lambda p: (cost, lambda: None), device_kind="cuda", cost_spec=cost,
                         options=options)


@pytest.mark.parametrize("name", zoo_params())
def test_zoo_autograph_matches_plain_tvm_on_both_executors(name):
    mod, x, ref = zoo_case(name)
    # no memory bound: a tightened schedule is re-priced as a new one, and this test checks the search's pick
    cm = tvm_interop.compile(mod, scheduler="autograph", cost="sim:h100", guard=False, name=name,
                             max_memory_ratio=None)
    stats = cm.schedule.search["autograph"]
    assert cm.schedule.scheduler == "autograph"
    cm.schedule.validate(cm.graph)
    np.testing.assert_allclose(cm.run(x), ref, **TOL)
    vm = ScheduledModel(cm.runner.library, device_kind="cpu", executor="vm", plan=cm.plan)
    np.testing.assert_allclose(vm.run(x), ref, **TOL)
    vm.close()
    assert cm.schedule.predicted_latency <= stats["unrewritten_latency"] * (1 + 1e-9)
    cm.close()


@pytest.mark.parametrize("name", zoo_params(["inception_v3", "nasnet_a_mobile"]))
def test_saved_candidate_with_substitutions_rebuilds_the_same_numbers(name, tmp_path):
    """Every verified candidate's schedule carries its substitutions: compiling the original model with it
    rewrites the model the same way, and the scheduled, rewritten program still matches plain TVM."""
    mod = get_model(name, **small_config(name))
    result = _search(mod, top_k=3)
    rewritten = [c for c in result.candidates if c.steps and c.schedule is not None]
    assert rewritten, f"{name}: no candidate applied a substitution"
    most = max(rewritten, key=lambda c: len(c.steps))
    path = tmp_path / "s.json"
    most.schedule.save(path)
    assert json.loads(path.read_text())["search"]["substitutions"]
    _, x, ref = zoo_case(name)
    cm = tvm_interop.compile(mod, schedule=str(path), name=name, allow_device_mismatch=True)
    np.testing.assert_allclose(cm.run(x), ref, **TOL)
    cm.close()


@pytest.mark.parametrize("make,seed", [(random_model, s) for s in range(4)] + [(random_cell_model, s) for s in range(4)])
def test_random_models_autograph_never_predicts_worse_than_ios(make, seed):
    mod, _ = make(seed)
    result = _search(mod)
    ios = schedule_graph(prepare_program(mod, "llvm", cpu_schedule=False).graph, "ios", "sim:h100")
    assert result.schedule.predicted_latency <= ios.predicted_latency * (1 + 1e-6)
    assert result.stats["unrewritten_latency"] == pytest.approx(ios.predicted_latency, rel=1e-6)


@pytest.mark.parametrize("seeds", [pytest.param(range(3), id="seeds0-2"),
                                   pytest.param(range(3, 6), id="seeds3-5", marks=pytest.mark.ci)])
def test_random_cell_models_gain_and_stay_exact(seeds):
    """Random Inception-like cells are full of substitution sites: autograph rewrites most of them into a graph
    its scheduler predicts strictly faster, and every shipped rewrite computes what the model computes (6 seeds:
    the development suite runs the first three, CI all)."""
    gained = rewritten = 0
    for seed in seeds:
        mod, desc = random_cell_model(seed)
        result = _search(mod)
        assert result.schedule.predicted_latency <= result.stats["unrewritten_latency"] * (1 + 1e-9), desc
        if result.stats["substitutions_applied"]:
            rewritten += 1
            gained += result.schedule.predicted_latency < result.stats["unrewritten_latency"] * (1 - 1e-6)
            x = random_input(mod, seed)
            np.testing.assert_allclose(_flat(tvm_interop.run_reference(result.module, [x])),
                                       _flat(tvm_interop.run_reference(mod, [x])), **TOL, err_msg=desc)
    assert rewritten >= 2 and gained >= 2, (rewritten, gained)   # measured: every one of the six rewrites and gains


def _flat(out) -> np.ndarray:
    """One array of every output (cell models may return a tuple of heads)."""
    outs = out if isinstance(out, (list, tuple)) else [out]
    return np.concatenate([np.asarray(o).ravel() for o in outs])


def test_bad_options_are_refused_with_the_choices():
    mod, _ = random_model(0)
    with pytest.raises(InteropError, match="unknown substitution rule"):
        _search(mod, rules=["no_such_rule"])
    with pytest.raises(InteropError, match="top_k"):
        _search(mod, top_k=0)
    with pytest.raises(InteropError, match="cannot be autograph"):
        _search(mod, scheduler="autograph")


def test_cli_schedule_autograph_json(capsys):
    rc = main(["schedule", "squeezenet", "--image-size", "32", "--width", "0.25", "--scheduler", "autograph",
               "--cost", "sim:h100", "--json", "--quiet"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["scheduler"] == "autograph"
    ag = d["autograph"]
    for key in ("operators", "substitution_sites", "parts", "states", "candidates", "substitutions_applied",
                "unrewritten_latency", "total_s", "scheduler"):
        assert key in ag, key
    assert d["predicted_ms"] <= ag["unrewritten_latency"] * 1e3 * (1 + 1e-9)


def test_autograph_under_the_measured_cpu_cost_verifies_by_timing(tmp_path):
    """With cost="measured" every candidate is scheduled over its own kernels timed on this CPU, and the
    never-slower guard times the pick against the model as given, unless the pick runs the model's own kernels
    one at a time (then it is the same work as sequential): whatever ships matches plain TVM."""
    mod = get_model("squeezenet", **small_config("squeezenet"))
    x = _input(mod)
    cm = tvm_interop.compile(mod, scheduler="autograph", cost="measured", cost_cache=str(tmp_path / "cache"),
                             scheduler_options={"top_k": 2}, guard_repeat=3, name="squeezenet")
    np.testing.assert_allclose(cm.run(x), tvm_interop.run_reference(mod, [x]), **TOL)
    ag = cm.schedule.search.get("autograph")
    because = cm.schedule.search["shipped_because"]
    if cm.guard is None:
        assert cm.schedule.max_concurrency() == 1 and cm.program is cm.built_program
        assert because.startswith("runs one unit at a time over the model's own kernels")
    else:
        assert because.startswith(("measured faster", "measured slower"))
    if cm.schedule.scheduler == "autograph":   # the pick survived the guard: it was timed, not simulated
        assert ag["unrewritten_latency"] > 0 and ag["candidates"] >= 2
        assert cm.schedule.search.get("measurements", 0) + cm.schedule.search.get("cache_hits", 0) > 0
    cm.close()


def test_autograph_inside_tvm_compile_and_its_schedule_reapplied(tmp_path):
    """The pipeline pass (``tvm.compile(..., relax_pipeline=pipeline(scheduler="autograph"))``) rewrites and
    schedules like the compile API, and a saved autograph schedule given to the pass rewrites the model the same
    way: both builds compute what plain TVM computes."""
    import tvm
    from tvm import relax

    from tvm_interop.passes.pipeline import pipeline

    mod, desc = random_cell_model(6)   # rewritten by three rules (see the cell-model test)
    x = random_input(mod, 6)
    ref = _flat(tvm_interop.run_reference(mod, [x]))
    captured = {}

    @tvm.transform.module_pass(opt_level=0)
    def grab(m, _ctx):
        captured["schedule"] = str(m.attrs["tvm_interop.schedule"])
        return m

    with tvm.target.Target("llvm"):
        tvm.transform.Sequential([pipeline(scheduler="autograph", cost="sim:h100"), grab])(mod)
    saved = json.loads(captured["schedule"])
    assert saved["scheduler"] == "autograph" and saved["search"]["substitutions"], desc
    path = tmp_path / "s.json"
    path.write_text(captured["schedule"])
    for pipe in (pipeline(scheduler="autograph", cost="sim:h100"), pipeline(schedule=str(path))):
        vm = relax.VirtualMachine(tvm.compile(mod, "llvm", relax_pipeline=pipe), tvm.cpu())
        out = vm["main"](tvm.runtime.tensor(x))
        outs = [out] if hasattr(out, "numpy") else list(out)
        np.testing.assert_allclose(_flat([o.numpy() for o in outs]), ref, **TOL, err_msg=desc)
