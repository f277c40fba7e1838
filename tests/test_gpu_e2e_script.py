"""scripts/gpu_e2e_check.py, the user's path on a GPU: it finds a model's libraries by kind, compares every one
with the TVM-kernel library on the same input and fails on a library that computes something else. Checked here
with CPU libraries of the same script path (the device run is `scripts/gpu_experiments.sh`'s e2e part)."""
from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    import tvm_interop
    from tvm_interop.models import get_model, small_config

    d = tmp_path_factory.mktemp("e2e")
    cm = tvm_interop.compile(get_model("squeezenet", **small_config("squeezenet")), target="llvm",
                             scheduler="greedy", guard=False, name="squeezenet")
    cm.export(str(d / "squeezenet_tvm.so"))
    cm.close()
    return d


def test_every_library_is_compared_with_the_tvm_kernel_one(libraries, tmp_path):
    import gpu_e2e_check

    d = tmp_path / "libs"
    shutil.copytree(libraries, d)
    shutil.copy(d / "squeezenet_tvm.so", d / "squeezenet_flow.so")   # the same program: equal outputs
    assert gpu_e2e_check.main([str(d), "--models", "squeezenet", "--out", str(tmp_path / "out")]) == 0
    r = json.loads((tmp_path / "out" / "e2e.json").read_text())["squeezenet"]
    assert set(r) == {"tvm", "flow"} and r["flow"]["ok"] is True and r["flow"]["max_abs_diff"] == 0.0
    assert r["tvm"]["median_ms"] > 0 and "ok" not in r["tvm"]


def test_a_library_that_computes_something_else_fails_the_check(libraries, tmp_path, monkeypatch):
    import gpu_e2e_check
    import tvm_interop.runtime as runtime

    real_load = runtime.load

    def load(path, *args, **kw):   # the flow library's outputs off by 1e-2 (the TVM-kernel library's as they are)
        m = real_load(path, *args, **kw)
        if path.endswith("_flow.so"):
            real_run = m.run
            def run(*a, numpy=True):   # what the check compares (the benchmark's device-array runs as they are)
                y = real_run(*a, numpy=numpy)
                return [v + 1e-2 for v in y] if numpy and isinstance(y, list) else y + 1e-2 if numpy else y
            m.run = run
        return m
    monkeypatch.setattr(runtime, "load", load)
    d = tmp_path / "libs"
    shutil.copytree(libraries, d)
    shutil.copy(d / "squeezenet_tvm.so", d / "squeezenet_flow.so")
    assert gpu_e2e_check.main([str(d), "--models", "squeezenet", "--out", str(tmp_path / "out")]) == 1
    r = json.loads((tmp_path / "out" / "e2e.json").read_text())["squeezenet"]
    assert r["flow"]["ok"] is False and r["flow"]["max_abs_diff"] == pytest.approx(1e-2, rel=1e-3)


def test_the_tvm_kernel_library_is_required(tmp_path):
    import gpu_e2e_check

    with pytest.raises(SystemExit, match="squeezenet_tvm.so"):
        gpu_e2e_check.check_model(str(tmp_path), "squeezenet")
