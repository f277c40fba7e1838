"""``passes.pipeline`` inside ``tvm.compile`` gives the same numbers and the same order as ``tvm_interop.compile``."""
import json

import numpy as np
import tvm
from tvm import relax

import tvm_interop
from tvm_interop.passes.pipeline import pipeline


def test_pipeline_pass_matches_compile(branchy_model, branchy_input, branchy_reference):
    ex = tvm.compile(branchy_model, "llvm", relax_pipeline=pipeline(scheduler="greedy"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(branchy_input)).numpy()
    cm = tvm_interop.compile(branchy_model, scheduler="greedy")
    np.testing.assert_allclose(out, cm.run(branchy_input), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(out, branchy_reference, rtol=1e-4, atol=1e-4)


def test_pipeline_pass_attaches_schedule(branchy_model):
    captured = {}

    @tvm.transform.module_pass(opt_level=0)
    def grab(mod, _ctx):
        captured["mod"] = mod
        return mod

    seq = tvm.transform.Sequential([pipeline(scheduler="sequential"), grab])
    with tvm.target.Target("llvm"):
        seq(branchy_model)
    sched = json.loads(str(captured["mod"].attrs["tvm_interop.schedule"]))
    assert sched["scheduler"] == "sequential"
    assert len(sched["stages"]) == len(sched["units"])


def test_pipeline_pass_with_learned_cost(branchy_model, branchy_input, branchy_reference, tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_INTEROP_CACHE", str(tmp_path))  # the timed cost model's cache goes here
    ex = tvm.compile(branchy_model, "llvm", relax_pipeline=pipeline(scheduler="ios", cost="learned:rounds=2"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(branchy_input)).numpy()
    np.testing.assert_allclose(out, branchy_reference, rtol=1e-4, atol=1e-4)
    assert list(tmp_path.glob("cost-cache-*.json"))  # one cache file per device (CPU and target)
