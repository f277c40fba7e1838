"""Groups in order (``passes.in_order``): a CPU schedule's concurrent groups run one after another on the VM when
the never-slower guard times that fastest; the build then has no concurrent groups, computes what plain TVM
computes, and a loaded library runs on the VM without being told."""
import json

import numpy as np
import pytest

import tvm_interop
from tvm_interop.api import prepare_program
from tvm_interop.passes import guard as guard_mod
from tvm_interop.passes.guard import decide
from tvm_interop.passes.in_order import IN_ORDER_OPTION, groups_in_order, runs_groups_in_order
from tvm_interop.passes.schedule import MERGE, Schedule, Stage
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.target import normalize_target
from tvm_interop.passes.wave import fusable_stages
from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.model import load
from conftest import refuse_in_wave_fusion

TOL = dict(rtol=1e-4, atol=1e-4)
HOST = normalize_target("llvm")


def _greedy(model):
    program = prepare_program(model, HOST, name="branchy")
    return program, schedule_graph(program.graph, "greedy", "sim:cpu")


def test_groups_in_order_split_every_concurrent_stage_in_group_order(branchy_model):
    program, sched = _greedy(branchy_model)
    assert sched.max_concurrency() >= 3
    before = sched.to_json()
    flat = groups_in_order(sched)
    flat.validate(program.graph)
    assert flat.max_concurrency() == 1 and flat.unit_order() == sched.unit_order()
    assert flat.num_stages == sum(len(st.groups) for st in sched.stages)
    assert [st.groups for st in flat.stages] == [[g] for st in sched.stages for g in st.groups]
    assert flat.search["in_order_from"] == sched.num_stages
    assert sched.to_json() == before            # the searched schedule is left as it is
    assert not runs_groups_in_order(sched) and "one after another" not in sched.describe()
    sched.options[IN_ORDER_OPTION] = True
    assert runs_groups_in_order(sched) and "one after another" in sched.describe().splitlines()[0]


def test_a_merge_stage_stays_one_stage():
    sched = Schedule([Stage([["a"], ["b"]], strategy=MERGE), Stage([["c"], ["d", "e"]]), Stage([["f"]])])
    flat = groups_in_order(sched)
    assert [(st.strategy, st.groups) for st in flat.stages] == [
        (MERGE, [["a"], ["b"]]), ("concurrent", [["c"]]), ("concurrent", [["d", "e"]]), ("concurrent", [["f"]])]


def test_decide_ships_the_lowest_median_and_the_schedule_wins_a_tie_with_sequential():
    three = decide({"scheduled": [3.0, 3.0, 3.1], "in_order": [1.0, 1.1, 1.0], "sequential": [2.0, 2.0, 2.1]})
    assert three.choice == "in_order" and three.keep_schedule and three.in_order_ms == pytest.approx(1000.0)
    assert three.scheduled_ms == pytest.approx(3000.0) and three.sequential_ms == pytest.approx(2000.0)
    assert decide({"scheduled": [2.0], "in_order": [3.0], "sequential": [2.5]}).choice == "scheduled"
    seq = decide({"scheduled": [2.0], "in_order": [2.2], "sequential": [1.5]})
    assert seq.choice == "sequential" and not seq.keep_schedule
    tie = decide({"scheduled": [2.0], "sequential": [2.0]})
    assert tie.choice == "scheduled" and tie.keep_schedule and tie.in_order_ms is None
    # an executor that only runs the groups in order: they stand for the schedule
    vm_only = decide({"in_order": [1.0], "sequential": [2.0]})
    assert vm_only.choice == "in_order" and vm_only.scheduled_ms == pytest.approx(1000.0)
    json.dumps(three.to_json())


def test_a_schedule_built_in_order_matches_plain_tvm_and_loads_on_the_vm(branchy_model, branchy_input,
                                                                         branchy_reference, tmp_path):
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", guard=False, max_memory_ratio=None,
                             groups_in_order=True)
    try:
        assert cm.schedule.max_concurrency() >= 3            # the schedule keeps what the search found
        assert cm.schedule.options[IN_ORDER_OPTION] is True
        assert cm.plan.max_concurrency() == 1 and cm.runner.executor == "vm"
        assert len(cm.plan.stages) == sum(len(st.groups) for st in cm.schedule.stages)
        np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, **TOL)
        so, sj = tmp_path / "m.so", tmp_path / "s.json"
        cm.export(str(so))
        cm.schedule.save(sj)
    finally:
        cm.close()
    m = load(str(so))
    try:
        assert m.executor == "vm" and m.plan.max_concurrency() == 1
        np.testing.assert_allclose(m.run(branchy_input), branchy_reference, **TOL)
    finally:
        m.close()
    # the schedule file compiles to the same program again; groups_in_order=False drops the file's choice
    again = tvm_interop.compile(branchy_model, schedule=str(sj), guard=False, max_memory_ratio=None)
    concurrent = tvm_interop.compile(branchy_model, schedule=str(sj), guard=False, max_memory_ratio=None,
                                     groups_in_order=False)
    try:
        assert again.plan.max_concurrency() == 1 and again.runner.executor == "vm"
        assert concurrent.plan.max_concurrency() >= 3 and concurrent.runner.executor == "threads"
        assert IN_ORDER_OPTION not in concurrent.schedule.options
        np.testing.assert_allclose(concurrent.run(branchy_input), branchy_reference, **TOL)
    finally:
        again.close()
        concurrent.close()


def test_groups_in_order_needs_a_cpu_target(branchy_model):
    with pytest.raises(InteropError, match="groups_in_order runs a CPU schedule"):
        tvm_interop.compile(branchy_model, target="cuda", scheduler="greedy", guard=False, groups_in_order=True)


@pytest.fixture
def one_member_refused(branchy_model, monkeypatch):
    """Wave fusion with one group of the widest stage refused: that stage runs the fused kernel and the refused
    group side by side, so the rewritten program still has concurrent groups."""
    program, sched = _greedy(branchy_model)
    si = max(fusable_stages(sched), key=lambda i: len(sched.stages[i].groups))
    assert len(sched.stages[si].groups) >= 3
    refused = sched.stages[si].groups[0][0]
    refuse_in_wave_fusion(monkeypatch, refused)
    return refused


class _Offered(dict):
    libraries: dict = {}


def _offered(monkeypatch, times_of):
    """Replace the guard's clock: record the runs it is offered (name -> plan concurrency; the libraries under
    ``offered.libraries``), answer ``times_of``."""
    offered = _Offered()

    def compare(runs, repeat=15, **_):
        offered.update({k: plan.max_concurrency() for k, (_lib, plan) in runs.items()})
        offered.libraries = {k: lib for k, (lib, _plan) in runs.items()}
        return {k: list(times_of[k]) for k in runs}

    monkeypatch.setattr(guard_mod, "compare_libraries", compare)
    return offered


def test_the_guard_builds_the_groups_in_order_when_they_time_fastest(branchy_model, branchy_input,
                                                                     branchy_reference, one_member_refused,
                                                                     monkeypatch):
    offered = _offered(monkeypatch, {"scheduled": [3e-3] * 3, "in_order": [1e-3] * 3, "sequential": [2e-3] * 3})
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", fusion="wave", guard=True, max_memory_ratio=None)
    try:
        assert offered == {"scheduled": 2, "in_order": 1, "sequential": 1}
        assert cm.guard.choice == "in_order" and cm.schedule.options[IN_ORDER_OPTION] is True
        assert cm.plan.max_concurrency() == 1 and cm.runner.executor == "vm"
        assert cm.runner.library is offered.libraries["in_order"]      # the library timed is the one that ships
        assert "one after another" in cm.schedule.search["shipped_because"]
        assert cm.schedule.measured_latency == pytest.approx(1e-3)
        assert any(r["fused"] for r in cm.schedule.options["waves"])     # still the waves, now in order
        np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, **TOL)
    finally:
        cm.close()


def test_the_guard_keeps_the_worker_threads_when_they_time_fastest(branchy_model, one_member_refused, monkeypatch):
    _offered(monkeypatch, {"scheduled": [1e-3] * 3, "in_order": [3e-3] * 3, "sequential": [2e-3] * 3})
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", fusion="wave", guard=True, max_memory_ratio=None)
    try:
        assert cm.guard.choice == "scheduled" and IN_ORDER_OPTION not in cm.schedule.options
        assert cm.plan.max_concurrency() == 2 and cm.runner.executor == "threads"
    finally:
        cm.close()


def test_the_caller_s_executor_decides_what_the_guard_times(branchy_model, one_member_refused, monkeypatch):
    times = {"scheduled": [1e-3] * 3, "in_order": [1.5e-3] * 3, "sequential": [2e-3] * 3}
    offered = _offered(monkeypatch, times)
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", fusion="wave", guard=True, max_memory_ratio=None,
                             executor="vm")
    try:   # the VM runs the groups in order anyway: the worker threads are not timed
        assert set(offered) == {"in_order", "sequential"} and cm.guard.choice == "in_order"
        assert cm.plan.max_concurrency() == 1
    finally:
        cm.close()
    offered.clear()
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", fusion="wave", guard=True, max_memory_ratio=None,
                             executor="threads")
    try:
        assert set(offered) == {"scheduled", "sequential"} and cm.plan.max_concurrency() == 2
    finally:
        cm.close()


def test_over_the_model_s_own_kernels_sequential_stands_for_the_groups_in_order(branchy_model, monkeypatch):
    """Unfused, unmerged: the groups in order are sequential's work in another order, so only the worker threads
    are timed against sequential."""
    offered = _offered(monkeypatch, {"scheduled": [1e-3] * 3, "sequential": [2e-3] * 3})
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", guard=True, max_memory_ratio=None)
    try:
        assert set(offered) == {"scheduled", "sequential"} and cm.guard.in_order_ms is None
    finally:
        cm.close()


def test_the_guard_times_the_groups_in_order_for_real(branchy_model, branchy_input, branchy_reference,
                                                      one_member_refused):
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", fusion="wave", guard=True, max_memory_ratio=None,
                             guard_repeat=3)
    try:
        g = cm.guard
        assert g.in_order_ms is not None and g.in_order_ms > 0 and g.choice in ("scheduled", "in_order", "sequential")
        assert (cm.plan.max_concurrency() == 1) == (g.choice != "scheduled")
        np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, **TOL)
    finally:
        cm.close()


def test_cli_compile_groups_in_order(tmp_path, capsys):
    from tvm_interop.cli import main

    rc = main(["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--scheduler", "greedy",
               "--guard", "off", "--groups-in-order", "on", "--max-memory-ratio", "none", "--json", "--quiet"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["groups_in_order"] is True and out["executor"] == "vm"
