"""Active search across the device boundary (passes/device_search.py), with this CPU as the device.

Each round's bundle is measured for real: by hand (a separate runtime-only process, the GPU machine's situation)
or through a loopback fleet. What must hold: rounds alternate search and measurement until nothing new is
worth measuring; the pick that ships has the lowest *measured* whole-program latency among the picks, and every
stage of it was measured; the state survives between calls; results that do not belong are refused.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tvm_interop.passes.device_search import DEPENDENCY, device_search
from tvm_interop.runtime.errors import InteropError

from runtime_only import runtime_only_env

TINY = dict(batch_size=1, image_size=32, width=0.125)


@pytest.fixture(scope="module")
def program():
    from tvm_interop.api import load_module, prepare_program

    mod, name = load_module("squeezenet", **TINY)
    return prepare_program(mod, "llvm", name=name)


def _measure(bundle: str, env=None) -> str:
    out = os.path.join(bundle, "costs.json")
    r = subprocess.run([sys.executable, "-m", "tvm_interop.runtime.profile_bundle", bundle, "-o", out, "--repeat",
                        "5", "--number", "5", "-q"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def test_rounds_by_hand_until_the_picks_are_measured(program, tmp_path):
    d = str(tmp_path / "active")
    env, _ = runtime_only_env(tmp_path)
    res = device_search(program, "llvm", d, top_k=2, rounds=3)
    assert res.status == "waiting" and res.bundle.endswith("round-1")
    plan = json.load(open(os.path.join(res.bundle, "bundle.json")))
    assert {tuple(st["groups"][0]) for st in plan["stages"] if len(st["groups"]) == 1 and len(st["groups"][0]) == 1} \
        == {(u.name,) for u in program.graph.units}          # round 1 measures every unit alone
    assert 1 <= len(plan["programs"]) <= 2
    with pytest.raises(InteropError, match="round 1 waits for its measurements.*--import"):
        device_search(program, "llvm", d, top_k=2, rounds=3)
    calls = 1
    while res.status == "waiting":
        res = device_search(program, "llvm", d, top_k=2, rounds=3, import_path=_measure(res.bundle, env))
        calls += 1
    assert res.status == "done" and 2 <= calls <= 4
    sched = res.schedule
    info = sched.search["device_search"]
    measured = [c for c in res.candidates if c["measured_ms"] is not None]
    assert sched.measured_latency * 1e3 == min(c["measured_ms"] for c in measured)
    assert info["shipped"] in {c["name"] for c in measured} and info["device"].startswith("cpu:")
    costs = json.load(open(os.path.join(d, "costs.json")))
    keys = {row["key"] for row in costs["stages"]}
    from tvm_interop.runtime.profile_bundle import stage_key

    assert all(stage_key(st.groups) in keys for st in sched.stages)   # the shipped pick is all measurement
    sched.validate(program.graph)
    # the optimisation cost (IOS's published figure): every round's search here plus its measuring there
    cost = info["optimisation_cost"]
    assert cost["unrecorded_rounds"] == 0 and cost["search_seconds"] > 0
    assert cost["device_seconds"] == pytest.approx(sum(h["device_seconds"] for h in res.history))
    assert all(h["search_seconds"] > 0 for h in res.history) and res.cost == cost
    # a finished search answers again without a new round
    again = device_search(program, "llvm", d, top_k=2, rounds=3)
    assert again.status == "done" and again.schedule.measured_latency == sched.measured_latency


def test_results_that_do_not_belong_are_refused(program, tmp_path):
    d = str(tmp_path / "active")
    res = device_search(program, "llvm", d, top_k=1, rounds=2)
    out = _measure(res.bundle)
    table = json.load(open(out))
    for field, value, match in [("device", "cuda:NVIDIA H100:sm_90", None),
                                ("graph_fingerprint", "0" * 16, "measured for model"),
                                ("format", "nope", "not a tvm-interop cost table")]:
        bad = dict(table, **{field: value})
        json.dump(bad, open(tmp_path / "bad.json", "w"))
        if match is None:   # first import sets the device; refused only later: checked below
            continue
        with pytest.raises(InteropError, match=match):
            device_search(program, "llvm", d, import_path=str(tmp_path / "bad.json"))
    partial = dict(table, stages=table["stages"][:3])
    json.dump(partial, open(tmp_path / "partial.json", "w"))
    with pytest.raises(InteropError, match="do not cover round 1"):
        device_search(program, "llvm", d, import_path=str(tmp_path / "partial.json"))
    res = device_search(program, "llvm", d, top_k=1, rounds=2, import_path=out)
    if res.status == "waiting":
        t2 = json.load(open(_measure(res.bundle)))
        json.dump(dict(t2, device="cuda:NVIDIA H100:sm_90"), open(tmp_path / "other.json", "w"))
        with pytest.raises(InteropError, match="measured on 'cuda:NVIDIA H100:sm_90'.*this search measures on 'cpu:"):
            device_search(program, "llvm", d, import_path=str(tmp_path / "other.json"))
    with pytest.raises(InteropError, match="no round is waiting|do not cover round 2"):
        device_search(program, "llvm", d, import_path=out)
    from tvm_interop.api import load_module, prepare_program

    mod, name = load_module("squeezenet", batch_size=2, image_size=32, width=0.125)
    with pytest.raises(InteropError, match="another model or batch size"):
        device_search(prepare_program(mod, "llvm", name=name), "llvm", d)


def test_rounds_on_a_fleet_in_one_call(program, tmp_path):
    from tvm_interop.passes.fleet import Fleet, FleetOptions
    from tvm_interop.passes.fleet.loopback import LoopbackFleet, tracker_available

    if tracker_available():
        pytest.skip(tracker_available())
    with LoopbackFleet() as lf:
        lf.add_server("cpu")
        lf.wait_for("cpu", 1)
        with Fleet(lf.tracker, "cpu", FleetOptions(device_wait=20)) as fleet:
            res = device_search(program, "llvm", str(tmp_path / "a"), top_k=2, rounds=3, fleet=fleet)
    assert res.status == "done" and res.schedule.measured_latency > 0
    assert len(res.history) >= 1 and all(h["programs_measured"] >= 0 for h in res.history)


def test_cli_active_round_trip(tmp_path, capsys):
    from tvm_interop.cli import main

    base = ["schedule", "squeezenet", "--width", "0.125", "--image-size", "32", "--active", str(tmp_path / "a"),
            "--target", "llvm", "--rounds", "1", "--top-k", "1"]
    assert main([*base, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "waiting" and out["measure_command"].startswith("python -m tvm_interop.runtime")
    sched_path = str(tmp_path / "s.json")
    assert main([*base, "--import", _measure(out["bundle"]), "-o", sched_path, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "done" and out["measured_ms"] > 0 and os.path.exists(sched_path)
    assert out["optimisation_cost"]["search_seconds"] > 0 and out["optimisation_cost"]["device_seconds"] > 0
    assert main(base) == 0   # the finished search, as text: its cost line
    assert re.search(r"optimisation cost so far: [\d.]+ s searching here \+ [\d.]+ s measuring on the device = ",
                     capsys.readouterr().out)
    assert main(["schedule", "squeezenet", "--import", "x.json"]) == 1
    assert "--import and --stand-in belong to --active" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- a table for a device
def test_a_measured_table_answers_the_rounds(program, tmp_path):
    """passes/table_device.py: a cost table measured once (here: this CPU, a first search's round-1 bundle) answers
    a second search's rounds: its stages exactly, a stage it lacks composed from units and counted, whole programs
    predicted by the program model; the search ships, tied to the stand-in; a table of another model is refused."""
    from tvm_interop.passes.table_device import STAND_IN_METHOD, answer_bundle

    env, _ = runtime_only_env(tmp_path)
    first = device_search(program, "llvm", str(tmp_path / "first"), top_k=2, rounds=1)
    table_path = _measure(first.bundle, env)
    table = json.load(open(table_path))
    got = answer_bundle(first.bundle, table_path, program.graph)
    assert got["method"] == STAND_IN_METHOD and "[stand-in: costs.json]" in got["device"]
    assert {s["key"]: s["latency"] for s in got["stages"]} == {s["key"]: s["latency"] for s in table["stages"]}
    assert got["stand_in"]["composed_stages"] == 0 and len(got["programs"]) == len(table["programs"])
    assert all(p["latency"] > 0 for p in got["programs"])
    # a stage the table lacks: composed from its units' latencies (the longest group), and counted
    multi = next(s for s in table["stages"] if len(s["groups"]) > 1)
    thin = dict(table, stages=[s for s in table["stages"] if s["key"] != multi["key"]])
    thin_path = str(tmp_path / "thin.json")
    json.dump(thin, open(thin_path, "w"))
    got = answer_bundle(first.bundle, thin_path, program.graph)
    row = next(s for s in got["stages"] if s["key"] == multi["key"])
    assert got["stand_in"]["composed_stages"] == 1
    assert row["latency"] == pytest.approx(max(sum(table["units"][u] for u in g) for g in multi["groups"]))
    # the whole loop, every round answered by the table
    d = str(tmp_path / "second")
    res = device_search(program, "llvm", d, top_k=2, rounds=3)
    while res.status == "waiting":
        answer = os.path.join(res.bundle, "costs.json")
        answer_bundle(res.bundle, table_path, program.graph, out=answer)
        res = device_search(program, "llvm", d, top_k=2, rounds=3, import_path=answer)
    assert res.status == "done" and "stand-in" in res.schedule.search["device_search"]["device"]
    # a table of another model (here: batch 2) answers nothing
    from tvm_interop.api import load_module, prepare_program

    mod, name = load_module("squeezenet", batch_size=2, image_size=32, width=0.125)
    with pytest.raises(InteropError, match="another model or batch size"):
        answer_bundle(first.bundle, table_path, prepare_program(mod, "llvm", name=name).graph)


def test_cli_stand_in_needs_active_and_excludes_import(tmp_path, capsys):
    from tvm_interop.cli import main

    assert main(["schedule", "squeezenet", "--stand-in", "t.json"]) == 1
    assert "belong to --active" in capsys.readouterr().err
    assert main(["schedule", "squeezenet", "--active", str(tmp_path / "a"), "--stand-in", "t.json",
                 "--import", "r.json"]) == 1
    assert "not with --rpc or --import" in capsys.readouterr().err


H100 = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared",
                    "gpu-data", "h100-2026-11-22", "costs_squeezenet_r2s3b8.json")


@pytest.mark.skipif(not os.path.exists(H100), reason="the shared H100 tables are not beside this checkout")
def test_h100_table_answers_a_cuda_search(tmp_path, capsys):
    """With the shared H100 table of SqueezeNet (real device measurements) standing in for the GPU, a CUDA active
    search runs to the end here: every round answered, a pick shipped, its stages the table's measurements."""
    import shutil

    from tvm_interop.cli import main

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found: CUDA bundles cannot be built here")
    out = str(tmp_path / "pick.json")
    assert main(["schedule", "squeezenet", "--active", str(tmp_path / "a"), "--stand-in", H100, "--rounds", "3",
                 "-o", out, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["status"] == "done" and res["shipped"] and res["measured_ms"] > 0
    assert all(h["programs_measured"] >= 1 for h in res["history"])
    assert json.load(open(out))["search"]["device_search"]["device"].endswith(
        "[stand-in: costs_squeezenet_r2s3b8.json]")


def _answer(bundle: str, issue_ms: list[float], device_ms: list[float] | None, device: str) -> str:
    """A round's results written by hand from its bundle (no GPU here): every stage 10 us on the issue clock and
    8 us on the device clock; the programs as given. Illustrative numbers; what is tested is the bookkeeping."""
    import tvm

    from tvm_interop.runtime.profile_bundle import stage_key

    plan = json.load(open(os.path.join(bundle, "bundle.json")))
    table = {"format": "tvm-interop-cost-table", "version": 1, "model": plan["model"],
             "graph_fingerprint": plan["graph_fingerprint"], "target": plan["target"], "device_kind": "cuda",
             "device": device, "tvm_version": tvm.__version__, "units": {},
             "stages": [{"index": i, "key": stage_key(st["groups"]), "groups": st["groups"], "latency": 10e-6,
                         **({"device_latency": 8e-6} if device_ms else {})} for i, st in enumerate(plan["stages"])],
             "programs": [{"index": k, "name": p["name"], "latency": issue_ms[k] * 1e-3,
                           **({"device_latency": device_ms[k] * 1e-3} if device_ms else {})}
                          for k, p in enumerate(plan["programs"])]}
    table["units"] = {st["groups"][0][0]: 10e-6 for st in plan["stages"]
                      if len(st["groups"]) == 1 and len(st["groups"][0]) == 1}
    if device_ms:
        table["device_clock"] = {"held": 1, "not_held": 0, "stages_without": 0, "programs_without": 0}
    out = os.path.join(bundle, "answer.json")
    json.dump(table, open(out, "w"))
    return out


def test_device_clock_search_ranks_programs_by_device_time(tmp_path):
    """``clock="device"`` (``schedule --active DIR --clock device``): the search ships the pick whose whole
    program was fastest on the device clock (what a CUDA graph pays), not on the issue clock; results without
    device times are refused, and a directory keeps the clock it started with."""
    import shutil

    from tvm_interop.api import load_module, prepare_program

    if shutil.which("nvcc") is None and not os.path.exists("/usr/local/bin/nvcc"):
        pytest.skip("nvcc not found: CUDA bundles cannot be built here")
    mod, name = load_module("squeezenet", **TINY)
    cuda = prepare_program(mod, "cuda", name=name)
    with pytest.raises(InteropError, match="needs a CUDA target"):
        device_search(cuda, "llvm", str(tmp_path / "cpu"), clock="device")
    d = str(tmp_path / "active")
    res = device_search(cuda, "cuda", d, top_k=2, rounds=1, clock="device")
    plan = json.load(open(os.path.join(res.bundle, "bundle.json")))
    picks = [p for p in plan["programs"] if p["mode"] == "stage"]
    if len(picks) < 2:
        pytest.skip("the schedulers agreed on one pick: nothing to rank")
    # on a GPU every pick with a concurrent stage also has its dependency-mode twin, right after it
    twins = [p["name"] for p in plan["programs"] if p["mode"] == "dependency"]
    assert twins == [p["name"] + DEPENDENCY for p in picks if any(len(g) > 1 for g in p["stages"])]
    with pytest.raises(InteropError, match="ranks by the device clock, not the issue clock"):
        device_search(cuda, "cuda", d, top_k=2, rounds=1)

    def per_program(first: float, second: float) -> list[float]:   # the twins slower than both picks
        return [first if p["name"] == picks[0]["name"] else second if p["name"] == picks[1]["name"] else 3.0
                for p in plan["programs"]]

    issue_only = _answer(res.bundle, per_program(1.0, 2.0), None, "cuda:stand-in:sm_90")
    with pytest.raises(InteropError, match="no device-clock times .*ranks by the device clock"):
        device_search(cuda, "cuda", d, top_k=2, rounds=1, clock="device", import_path=issue_only)
    # the first program is faster on the issue clock, the second on the device clock
    answer = _answer(res.bundle, per_program(1.0, 2.0), per_program(0.9, 0.5), "cuda:stand-in:sm_90")
    done = device_search(cuda, "cuda", d, top_k=2, rounds=1, clock="device", import_path=answer)
    assert done.status == "done"
    info = done.schedule.search["device_search"]
    assert info["shipped"] == picks[1]["name"] and info["clock"] == "device" and info["measured_mode"] == "stage"
    assert done.schedule.measured_latency == pytest.approx(0.5e-3)
    rows = {c["name"]: c for c in done.candidates}
    assert rows[picks[0]["name"]]["measured_device_ms"] == pytest.approx(0.9)
    costs = json.load(open(os.path.join(d, "costs.json")))
    assert all(row["device_latency"] == 8e-6 for row in costs["stages"])
    from tvm_interop.passes.cost.table import TableCostModel

    assert TableCostModel(os.path.join(d, "costs.json"), clock="device").unit_latency(cuda.graph.units[0]) == 8e-6


def test_a_gpu_pick_counts_with_the_better_of_its_two_lowerings(program, tmp_path):
    """On a GPU a round times each pick as the stage-mode lowering runs it and, as its ``[dependency]`` twin, as the
    dependency-mode lowering issues it (``passes.profile_bundle``: both built from one schedule); the pick counts
    with the better, as the library's picker runs the faster, and the shipped schedule says which. The table here
    stands in for a GPU round's (this machine has no GPU); the merge and the choice are what is tested."""
    import tvm

    from tvm_interop.passes.device_search import DEPENDENCY, _State, _best_measured, _check_identity, _merge_results
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.passes.target import normalize_target, target_text
    from tvm_interop.runtime.profile_bundle import TABLE_FORMAT

    d, bundle = tmp_path / "active", tmp_path / "active" / "round-1"
    os.makedirs(bundle)
    state = _State(str(d))
    _check_identity(state, program.graph, target_text(normalize_target("cuda")), "squeezenet")
    picks = {name: schedule_graph(program.graph, name, "sim:h100", model_name="squeezenet").to_json()
             for name in ("ios", "lios")}
    state.data["candidates"] = {f"r1:{n}": {"signature": n, "scheduler": n, "round": 1, "predicted_ms": 1.0,
                                            "measured_ms": None, "schedule": s} for n, s in picks.items()}
    plan = {"stages": [], "programs": [{"name": "r1:ios"}, {"name": "r1:ios" + DEPENDENCY, "mode": "dependency"},
                                       {"name": "r1:lios"}, {"name": "r1:lios" + DEPENDENCY, "mode": "dependency"}]}
    json.dump(plan, open(bundle / "bundle.json", "w"))
    state.data["pending"] = {"round": 1, "bundle": str(bundle), "stages": 0, "programs": 4, "search_seconds": 1.0}
    table = {"format": TABLE_FORMAT, "graph_fingerprint": program.graph.fingerprint(), "tvm_version": tvm.__version__,
             "device": "cuda:NVIDIA H200:sm_90", "seconds": 2.0, "stages": [],
             "programs": [{"index": k, "latency": ms * 1e-3} for k, ms in enumerate((4.4, 4.0, 4.2, 4.3))]}
    _merge_results(state, table, program.graph)
    c = state.data["candidates"]
    assert c["r1:ios"]["measured_ms"] == pytest.approx(4.4) and c["r1:ios"]["measured_dependency_ms"] == pytest.approx(4.0)
    assert c["r1:lios"]["measured_ms"] == pytest.approx(4.2)
    assert _best_measured(state.data) == ("r1:ios", pytest.approx(4.0))   # lios's 4.2 ms stage mode loses to it
    state.save()
    res = device_search(program, "cuda", str(d), rounds=1)
    info = res.schedule.search["device_search"]
    assert res.status == "done" and info["shipped"] == "r1:ios" and info["measured_mode"] == "dependency"
    assert res.schedule.measured_latency == pytest.approx(4.0e-3)
    row = next(r for r in res.candidates if r["name"] == "r1:ios")
    assert row["measured_dependency_ms"] == pytest.approx(4.0)
