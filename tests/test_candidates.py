"""Candidate programs in one library (passes.candidates) and picking the fastest on the device (runtime.picker).

The timing logic is device-agnostic, so it is tested here on the CPU with the VM executor (a CPU library built
with ``candidates=True``); on a GPU the same code runs at the first run of a CUDA library. A CUDA build is checked
for the candidate set it records (no GPU needed).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tvm_interop import runtime
import tvm_interop
from tvm_interop.passes.build import build_library
from tvm_interop.passes.lower import make_plan
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.runtime.errors import ExportError, InteropError
from tvm_interop.runtime.model import ScheduledModel
from tvm_interop.runtime.picker import choose, device_name, load_pick, pick_fastest, pick_path, save_pick

TOL = dict(rtol=1e-4, atol=1e-4)
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="CUDA builds need nvcc")


@pytest.fixture(scope="module")
def cpu_candidates(branchy_model):
    cm = tvm_interop.compile(branchy_model, target="llvm", scheduler="greedy", executor="vm", candidates=True, guard=False,
                             name="branchy")
    yield cm
    cm.close()


def test_cpu_library_carries_every_candidate_and_each_is_exact(cpu_candidates, branchy_input, branchy_reference):
    meta = cpu_candidates.plan.meta
    names = [c["name"] for c in meta["candidates"]]
    assert names == ["greedy-stage-direct", "greedy-dependency-direct", "sequential-direct"]
    assert meta["default_candidate"] == "greedy-stage-direct"
    m = ScheduledModel(cpu_candidates.runner.library, executor="vm", plan=cpu_candidates.plan)
    seen = set()
    for name in names:
        m.select_candidate(name)
        np.testing.assert_allclose(m.run(branchy_input), branchy_reference, **TOL, err_msg=name)
        seen.add(m.entry_function)
    assert len(seen) == 3  # three different programs ran
    m.close()


def test_cpu_default_builds_have_no_candidates(branchy_model):
    cm = tvm_interop.compile(branchy_model, target="llvm", scheduler="greedy", guard=False)
    assert "candidates" not in cm.plan.meta
    cm.close()


def test_unknown_candidate_is_a_clear_error(cpu_candidates):
    m = ScheduledModel(cpu_candidates.runner.library, executor="vm", plan=cpu_candidates.plan)
    with pytest.raises(InteropError, match="no candidate program 'nope'.*greedy-stage-direct"):
        m.select_candidate("nope")
    with pytest.raises(InteropError, match="unknown pick mode"):
        ScheduledModel(cpu_candidates.runner.library, executor="vm", plan=cpu_candidates.plan, pick="sometimes")


def test_choose_takes_the_lowest_median_and_breaks_ties_in_order():
    times = {"a": [1.0, 1.0, 9.0], "b": [0.5, 0.6, 0.55], "seq": [0.8, 0.8, 0.8]}
    assert choose(times, ["a", "b", "seq"]) == "b"
    assert choose({"a": [1.000], "seq": [0.995]}, ["a", "seq"]) == "a"   # within 1%: the earlier one
    assert choose({"a": [1.0], "seq": [0.9]}, ["a", "seq"]) == "seq"


def test_picker_times_interleaved_and_selects(cpu_candidates, branchy_input, branchy_reference):
    m = ScheduledModel(cpu_candidates.runner.library, executor="vm", plan=cpu_candidates.plan)
    report = pick_fastest(m, [branchy_input], rounds=5, warmup=1)
    assert set(report.timings) == {c["name"] for c in m.candidates}
    assert all(t["runs"] == 5 and t["median_ms"] > 0 for t in report.timings.values())
    best = min(t["median_ms"] for t in report.timings.values())
    assert report.timings[report.choice]["median_ms"] <= best * 1.01
    assert m.candidate == report.choice and m.pick_report is report
    np.testing.assert_allclose(m.run(branchy_input), branchy_reference, **TOL)
    assert "picked" in report.summary() and "sequential" in report.summary()
    m.close()


def test_pick_file_round_trip_and_refusals(cpu_candidates, branchy_input, tmp_path, caplog):
    path = str(tmp_path / "m.so")
    cpu_candidates.export(path)
    m = runtime.load(path, executor="vm")
    report = pick_fastest(m, [branchy_input], rounds=3, warmup=1, names=["sequential-direct",
                                                                            "greedy-dependency-direct"])
    m.close()
    written = save_pick(report, path)
    assert written == pick_path(path)
    again = runtime.load(path, executor="vm")
    assert again.candidate == report.choice and again.pick_report.choice == report.choice
    again.close()
    assert runtime.load(path, executor="vm", candidate="greedy-stage-direct").candidate == "greedy-stage-direct"
    # measured on another device: ignored, with a warning
    data = json.loads(open(written).read())
    data["device"] = "cuda:NVIDIA H100 80GB HBM3:sm_90"
    open(written, "w").write(json.dumps(data))
    assert load_pick(path, "cpu:other") is None
    fresh = runtime.load(path, executor="vm")
    assert fresh.candidate is None and "measured on" in caplog.text
    fresh.close()
    # a choice it never timed: refused, not a KeyError in the summary
    data["choice"] = "no-such-candidate"
    open(written, "w").write(json.dumps(data))
    with pytest.raises(ExportError, match="not a candidate pick file .*'no-such-candidate' has no timing"):
        runtime.load(path, executor="vm")
    # not a pick file: a clear error naming it
    open(written, "w").write("{not json")
    with pytest.raises(ExportError, match="not a candidate pick file"):
        runtime.load(path, executor="vm")


def test_pick_cli(cpu_candidates, tmp_path, capsys):
    from tvm_interop.cli import main

    path = str(tmp_path / "m.so")
    cpu_candidates.export(path)
    assert main(["pick", path, "--rounds", "3", "--warmup", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choice"] in out["timings"] and out["pick_file"] == pick_path(path)
    assert main(["run", path, "--executor", "vm", "--repeat", "2", "--json"]) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["candidate"] == out["choice"] and ran["pick"]["choice"] == out["choice"]
    plain = tmp_path / "plain.so"
    from tvm_interop.models import get_model

    cm = tvm_interop.compile(get_model("squeezenet", width=0.125, image_size=32), scheduler="greedy",
                             guard=False)
    cm.export(str(plain))
    cm.close()
    assert main(["pick", str(plain)]) == 1
    assert "no candidate programs" in capsys.readouterr().err


def test_device_name_of_a_cpu_model(cpu_candidates):
    assert device_name(cpu_candidates.runner).startswith("cpu:")


@needs_nvcc
def test_cuda_library_records_six_candidates(branchy_model):
    program = tvm_interop.api.prepare_program(branchy_model, "cuda")
    sched = schedule_graph(program.graph, "greedy")
    plan = make_plan(program, sched, meta={"mode": "stage"})
    build_library(program, sched, plan, "cuda", cuda_graph=True)
    names = [c["name"] for c in plan.meta["candidates"]]
    assert names == ["greedy-stage-direct", "greedy-stage-graph", "greedy-dependency-direct",
                     "greedy-dependency-graph", "sequential-direct", "sequential-graph"]
    assert plan.meta["default_candidate"] == "greedy-stage-graph"
    seq = [c for c in plan.meta["candidates"] if c["scheduler"] == "sequential"]
    assert all(c["num_streams"] == 0 for c in seq)
    streams = {c["streams_function"] for c in plan.meta["candidates"]}
    assert len(streams) == 3   # one stream set per lowering, each under its own cache key


def test_a_sequential_schedule_has_no_alternatives(branchy_model):
    program = tvm_interop.api.prepare_program(branchy_model, "llvm")
    sched = schedule_graph(program.graph, "sequential")
    plan = make_plan(program, sched)
    build_library(program, sched, plan, "llvm", candidates=True)
    assert [c["name"] for c in plan.meta["candidates"]] == ["sequential-direct"]
