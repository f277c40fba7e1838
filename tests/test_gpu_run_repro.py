"""scripts/gpu_run_repro.py: the same lowered program compared across gpu_check runs (the ground truth's own noise)."""
from __future__ import annotations

import glob
import json
import os

import pytest
from scripts_under_test import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
repro = load_script("gpu_run_repro")


def _variant(name, median, stages=10, streams=4, graph=False, mean=None, syncs=20):
    seq = name.startswith("sequential")
    return {"name": name, "median_ms": median, "mean_ms": mean if mean is not None else median * 1.01,
            "stages": stages, "num_streams": 0 if seq else streams, "max_concurrency": 1 if seq else streams,
            "mode": "stage", "cuda_graph": graph, "sync": "tvm", "syncs": 0 if seq else syncs,
            "waits": "stage-start", "ok": True}


def _run(path, device, models):
    run = {"device": device, "build": {"built_from": os.path.basename(path)}, "models": models}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(run, f)
    return str(path)


def _model(name, *variants):
    return {"name": name, "variants": list(variants)}


def test_a_program_is_compared_only_with_itself_and_relative_to_its_runs_kernels(tmp_path):
    a = _run(tmp_path / "a.json", "NVIDIA H200", [_model(
        "m", _variant("sequential + CUDA graph", 2.0, graph=True), _variant("ios", 1.0),
        _variant("lios", 1.0, stages=7), _variant("greedy", 3.0, mean=2.0))])
    b = _run(tmp_path / "b.json", "NVIDIA H200", [_model(
        "m", _variant("sequential + CUDA graph", 3.0, graph=True), _variant("ios", 1.8),
        _variant("lios", 1.0, stages=8), _variant("greedy", 3.0)),
        _model("m+cudnn", _variant("ios", 5.0))])
    rows = {r["variant"]: r for r in repro.programs([(a, repro.load_run(a)), (b, repro.load_run(b))])}
    # lios was rescheduled between the builds (7 vs 8 stages): not the same program, not compared
    assert set(rows) == {"sequential + CUDA graph", "ios", "greedy"}
    assert rows["ios"]["spread"] == pytest.approx(1.8)
    # the control moved 1.5x too (the kernels changed): relative to it, ios moved 1.8 / 1.5
    assert rows["ios"]["relative_spread"] == pytest.approx(1.2)
    assert rows["ios"]["kind"] == "concurrent, direct"
    assert rows["sequential + CUDA graph"]["kind"] == "sequential"
    assert rows["greedy"]["bimodal_in"] == [a] and rows["ios"]["bimodal_in"] == []
    s = repro.summarise(rows.values(), "kind")
    assert s["concurrent, direct"]["programs"] == 2 and s["concurrent, direct"]["over_1.25"] == 1


def test_runs_of_other_devices_or_other_files_are_refused_by_name(tmp_path, capsys):
    h200 = _run(tmp_path / "h200.json", "NVIDIA H200", [_model("m", _variant("ios", 1.0))])
    h100 = _run(tmp_path / "h100.json", "NVIDIA H100 80GB HBM3", [_model("m", _variant("ios", 1.0))])
    assert repro.main([h200, h100]) == 2
    err = capsys.readouterr().err
    assert "NVIDIA H100 80GB HBM3 and NVIDIA H200" in err and "--device" in err
    assert repro.main([h200, h100, "--device", "H200"]) == 2   # one run left: nothing to compare
    assert "two or more runs" in capsys.readouterr().err
    other = tmp_path / "transfer.json"
    other.write_text(json.dumps({"summary": {}, "rows": []}))
    assert repro.main([h200, str(other)]) == 2
    assert "transfer.json: not a gpu_check run" in capsys.readouterr().err


def test_writes_a_report_and_its_rows(tmp_path, capsys):
    a = _run(tmp_path / "a.json", "NVIDIA H200", [_model("m", _variant("ios", 1.0, graph=True))])
    b = _run(tmp_path / "b.json", "NVIDIA H200", [_model("m", _variant("ios", 1.1, graph=True))])
    out = str(tmp_path / "repro")
    assert repro.main([a, b, "--out", out]) == 0
    data = json.load(open(out + ".json"))
    assert data["by_kind"]["concurrent, CUDA graph"]["worst_spread"] == pytest.approx(1.1)
    assert data["programs"][0]["relative_spread"] is None   # no control in these runs
    assert "| m | ios | 1.10x | — |" in open(out + ".md").read()


def test_the_h200_runs_say_which_programs_repeat():
    """The committed H200 runs: device-bound programs (sequential, CUDA graphs) repeat within a few per cent, while
    RandWire's directly launched concurrent programs (a sync every few microseconds of work: host-bound) moved by
    more than the program model's 25 % target between sessions, relative to their own run's kernels."""
    paths = [p for p in sorted(glob.glob(os.path.join(ROOT, "docs", "gpu_check*h200*.json"))) if "transfer" not in p]
    rows = repro.programs([(p, repro.load_run(p)) for p in paths])
    by_kind = repro.summarise(rows, "kind")
    assert by_kind["sequential"]["median_relative_spread"] < 1.02
    assert by_kind["concurrent, CUDA graph"]["median_relative_spread"] < 1.05
    direct_rw = [r for r in rows if r["model"] == "randwire" and r["kind"] == "concurrent, direct"]
    assert max(r["relative_spread"] for r in direct_rw) > 1.5
    assert all(r["spread"] < 1.05 for r in rows if r["model"] == "squeezenet")
