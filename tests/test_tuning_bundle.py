"""Tuning in rounds across a machine boundary (passes/kernels/tuning_bundle.py, runtime/tuning_bundle.py).

The device side is run as it runs on a GPU machine: a separate process with TVM's runtime only and every
compiler-only import blocked; here it times CPU candidates for real. What must hold: a round's timings land in
the database as tuning records and in the XGBoost model; the next round proposes other candidates; the
database then serves ``compile``; and results that do not belong to the database are refused, naming why.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tvm_interop.passes.kernels.tuning import (COST_MODEL_FILE, TuningError, apply_database, database_summary,
                                               tuned_functions)
from tvm_interop.passes.kernels.tuning_bundle import FAILED_SECONDS, export_round, import_results

from runtime_only import assert_runtime_only, runtime_only_env

OPS = ["conv2d_add_relu"]   # one kernel of the tiny squeezenet: fused_conv2d_add_relu


@pytest.fixture(scope="module")
def program():
    from tvm_interop.api import load_module, prepare_program

    mod, name = load_module("squeezenet", batch_size=1, image_size=32, width=0.125)
    return prepare_program(mod, "llvm", name=name)


def _measure(bundle: str, out: str, env: dict | None = None) -> dict:
    """The device step in a child process, its kernels timed on one thread: these tests check what the rounds do
    with the timings, not the timings. On two cores shared with other work (the other test worker, a build), TVM's
    spinning thread pool made this step take 136 s instead of 2 s (2026-11-28), and a CI run hit the timeout."""
    env = dict(env if env is not None else os.environ, TVM_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "tvm_interop.runtime.tuning_bundle", bundle, "-o", out, "-q"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.load(open(out))


def _import_in_child(db: str, results: str) -> tuple[dict, list[str]]:
    """``import_results`` in a fresh process: its summary, and which of the other targets' tensor-intrinsic
    modules that process imported."""
    code = ("import json, sys\n"
            "from tvm_interop.passes.kernels.tuning_bundle import import_results\n"
            f"out = import_results({db!r}, {results!r})\n"
            "foreign = ['tvm.s_tir.tensor_intrin.' + m for m in ('cuda', 'rocm', 'metal', 'hexagon', 'arm_cpu')]\n"
            "print(json.dumps([out, [m for m in foreign if m in sys.modules]]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out, loaded = json.loads(r.stdout.strip().splitlines()[-1])
    return out, loaded


def test_rounds_fill_the_database_and_teach_the_model(program, tmp_path):
    db = str(tmp_path / "db")
    env, log = runtime_only_env(tmp_path)
    first = export_round(program, "llvm", db, str(tmp_path / "b1"), trials=8, per_round=4, op_names=OPS, seed=1)
    assert first["candidates"] == 4 and list(first["per_task"].values()) == [4] and not first["done"]
    state = database_summary(db)["state"]
    assert state["pending_bundle"]["id"] == first["id"] and database_summary(db)["records"] == 0
    with pytest.raises(TuningError, match=f"bundle {first['id']} .* still waiting"):
        export_round(program, "llvm", db, str(tmp_path / "other"), trials=8, per_round=4, op_names=OPS)

    res1 = _measure(first["bundle"], str(tmp_path / "r1.json"), env)
    assert_runtime_only(log, processes=1)                      # the device step needs TVM's runtime only
    assert res1["bundle_id"] == first["id"] and all(len(r["run_secs"]) == 1 for r in res1["results"])
    out, loaded = _import_in_child(db, str(tmp_path / "r1.json"))
    # the model's update needs a TuneContext, which imports every tensor intrinsic TVM has (CUDA's: 35 s of
    # TVMScript parsing) unless only the target's are registered first
    assert loaded == [], loaded
    assert (out["records"], out["failed"], out["round"]) == (4, 0, 1)
    summary = database_summary(db)
    assert summary["records"] == 4 and summary["state"]["device"] == res1["device"]
    assert "pending_bundle" not in summary["state"]
    assert os.path.exists(os.path.join(db, COST_MODEL_FILE))   # the XGBoost model saw the round

    second = export_round(program, "llvm", db, str(tmp_path / "b2"), trials=8, per_round=4, op_names=OPS, seed=2)
    assert second["candidates"] == 4
    _measure(second["bundle"], str(tmp_path / "r2.json"))
    assert import_results(db, str(tmp_path / "r2.json"))["round"] == 2
    assert database_summary(db)["records"] == 8
    third = export_round(program, "llvm", db, str(tmp_path / "b3"), trials=8, per_round=4, op_names=OPS)
    assert third["done"] and third["candidates"] == 0
    # the database serves compile like a locally tuned one
    assert tuned_functions(apply_database(program.mod, "llvm", db)) == ["fused_conv2d_add_relu"]


def test_foreign_repeated_and_broken_results_are_refused(program, tmp_path):
    db = str(tmp_path / "db")
    b = export_round(program, "llvm", db, str(tmp_path / "b1"), trials=4, per_round=2, op_names=OPS)
    res = _measure(b["bundle"], str(tmp_path / "r.json"))
    # a database tuned on this CPU refuses a round measured on another device
    db2 = str(tmp_path / "db2")
    b2 = export_round(program, "llvm", db2, str(tmp_path / "b2"), trials=4, per_round=2, op_names=OPS)
    _measure(b2["bundle"], str(tmp_path / "r2.json"))
    import_results(db2, str(tmp_path / "r2.json"))
    b3 = export_round(program, "llvm", db2, str(tmp_path / "b3"), trials=4, per_round=2, op_names=OPS)
    r3 = _measure(b3["bundle"], str(tmp_path / "r3.json"))
    json.dump(dict(r3, device="cuda:NVIDIA H100:sm_90"), open(tmp_path / "r3f.json", "w"))
    with pytest.raises(TuningError, match="measured on 'cuda:NVIDIA H100:sm_90'.*tuned on 'cpu:"):
        import_results(db2, str(tmp_path / "r3f.json"))
    # results of a bundle this database did not export
    with pytest.raises(TuningError, match=f"results of bundle '{b['id']}'.*did not export or already imported"):
        import_results(db2, str(tmp_path / "r.json"))
    # the same results twice
    import_results(db, str(tmp_path / "r.json"))
    with pytest.raises(TuningError, match="already imported"):
        import_results(db, str(tmp_path / "r.json"))
    # not a results file
    (tmp_path / "junk.json").write_text("{\"format\": \"something-else\"}")
    with pytest.raises(TuningError, match="not a tvm-interop tuning results file"):
        import_results(db, str(tmp_path / "junk.json"))
    (tmp_path / "torn.json").write_text("{\"format\": ")
    with pytest.raises(TuningError, match="not valid JSON"):
        import_results(db, str(tmp_path / "torn.json"))
    # a non-empty bundle directory is never overwritten
    with pytest.raises(TuningError, match="not empty"):
        export_round(program, "llvm", db, str(tmp_path / "b1"), trials=8, per_round=2, op_names=OPS)


def test_a_candidate_that_fails_on_the_device_is_a_failed_record(program, tmp_path):
    db = str(tmp_path / "db")
    b = export_round(program, "llvm", db, str(tmp_path / "b"), trials=2, per_round=2, op_names=OPS)
    plan = json.load(open(os.path.join(b["bundle"], "bundle.json")))
    with open(os.path.join(b["bundle"], plan["candidates"][0]["file"]), "wb") as f:
        f.write(b"not a shared library")
    res = _measure(b["bundle"], str(tmp_path / "r.json"))
    assert "error" in res["results"][0] and "run_secs" in res["results"][1]
    out = import_results(db, str(tmp_path / "r.json"))
    assert out["failed"] == 1 and out["records"] == 2
    recs = [json.loads(ln) for ln in open(os.path.join(db, "database_tuning_record.json"))]
    assert sorted(r[1][1][0] for r in recs)[-1] == FAILED_SECONDS


def test_cli_round_trip(program, tmp_path, capsys):
    from tvm_interop.cli import main

    db, bundle = str(tmp_path / "db"), str(tmp_path / "b")
    base = ["tune", "squeezenet", "--width", "0.125", "--image-size", "32", "--db", db]
    assert main([*base, "--ops", "conv2d_add_relu", "--trials", "2", "--per-iter", "2", "--bundle", bundle,
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["candidates"] == 2
    _measure(bundle, str(tmp_path / "r.json"))
    assert main([*base, "--import", str(tmp_path / "r.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 2
    assert main([*base, "--import", str(tmp_path / "r.json")]) == 1
    assert "already imported" in capsys.readouterr().err


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="CUDA builds need nvcc")
def test_cuda_round_trip_without_a_gpu(tmp_path):
    """A CUDA round built here (candidates as fatbins, plus the default kernel a build would ship), its results
    stood in for by made-up timings (there is no GPU here: what is tested is the plumbing, not the timings),
    imported, and used by a CUDA compile, which keeps the default kernel where it measured faster."""
    import tvm_interop
    from tvm_interop.api import load_module, prepare_program
    from tvm_interop.passes.cuda_compile import inspect_cuda_library
    from tvm_interop.passes.target import normalize_target
    from tvm_interop.runtime.tuning_bundle import RESULTS_FORMAT, VERSION

    tiny = dict(batch_size=1, image_size=32, width=0.125)
    mod, name = load_module("squeezenet", **tiny)
    target = normalize_target("cuda")
    program = prepare_program(mod, target, name=name)
    db = str(tmp_path / "db")
    # seeded, so the round proposes the same candidates every time: unseeded, a fresh-clone CI of 2026-11-29 got one
    # tuning candidate in the bundle instead of two (a proposal that did not build, or fewer proposed), which this
    # test of the plumbing of two cannot use
    b = export_round(program, target, db, str(tmp_path / "b"), trials=2, per_round=2, op_names=OPS, seed=1)
    plan = json.load(open(os.path.join(b["bundle"], "bundle.json")))
    tuning = [c for c in plan["candidates"] if not c.get("baseline")]
    (baseline,) = [c for c in plan["candidates"] if c.get("baseline")]   # DLight's kernel, the one that ships
    assert plan["device"] == "cuda" and len(tuning) == 2 and baseline["task"] == tuning[0]["task"]
    for c in plan["candidates"]:
        info = inspect_cuda_library(os.path.join(b["bundle"], c["file"]))
        assert info["formats"] == ["fatbin"] and not info["source_left"], info
    # made-up timings in which the default kernel beats both candidates
    secs = {c["id"]: 1e-5 * (i + 1) for i, c in enumerate(tuning)} | {baseline["id"]: 1e-6}
    stand_in = {"format": RESULTS_FORMAT, "version": VERSION, "bundle_id": plan["id"], "device_kind": "cuda",
                "device": "cuda:stand-in GPU:sm_90", "tvm_version": plan["tvm_version"], "target": plan["target"],
                "results": [{"id": c["id"], "run_secs": [secs[c["id"]]]} for c in plan["candidates"]]}
    json.dump(stand_in, open(tmp_path / "r.json", "w"))
    assert import_results(db, str(tmp_path / "r.json"))["records"] == 2
    assert tuned_functions(apply_database(program.mod, target, db)) == []    # the faster default is kept
    tuned = apply_database(program.mod, target, db, prefer_faster=False)
    assert tuned_functions(tuned) == ["fused_conv2d_add_relu"]
    cm = tvm_interop.compile("squeezenet", target="cuda", scheduler="sequential", tuning_db=db, candidates=False,
                             cuda_graph=False, **tiny)
    assert "tuning_db" in cm.timings
    cm.close()
