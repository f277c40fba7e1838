"""``scripts/cpu_kernel_check.py``: every scheduled CPU kernel of a model against its unscheduled self. It passes
on a correct model and names the kernel when a schedule is wrong (the cropping-epilogue bug put back)."""
import collections

import pytest
import tvm
from tvm import relax

from conftest import make_branchy_model
from scripts_under_test import load_script


def test_every_kernel_of_a_model_matches():
    check = load_script("cpu_kernel_check")
    rows = check.check_module(make_branchy_model())
    assert len(rows) >= 5 and all(r["match"] for r in rows), rows
    assert {"spatial_vector", "light_reduction"} <= {r["plan"] for r in rows}


def test_a_wrong_schedule_is_named(monkeypatch):
    from tvm.target import codegen

    import tvm_interop.passes.kernels.cpu_schedule as cs

    host = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
    if not codegen.llvm_cpu_has_features(["avx2"], host):
        pytest.skip("the bug needs 8-lane (AVX2) kernels on this host")
    check = load_script("cpu_kernel_check")
    rng = __import__("numpy").random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 20, 56, 56), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const(rng.standard_normal((40, 20, 3, 3)).astype("float32"))
            b = relax.const(rng.standard_normal((1, 40, 1, 1)).astype("float32"))
            y = bb.emit(relax.op.add(relax.op.nn.conv2d(x, w, strides=2, padding=1), b))
            out = bb.emit_output(relax.op.strided_slice(y, axes=[1], begin=[0], end=[39]))
        bb.emit_func_output(out)
    mod = bb.get()
    target = {"kind": "llvm", "mcpu": "haswell"}
    assert all(r["match"] for r in check.check_module(mod, target))
    monkeypatch.setattr(cs, "_SCHEDULED", collections.OrderedDict())   # schedule again, not from the memo
    monkeypatch.setattr(cs, "_epilogue_crops", lambda *a: False)       # the bug: crop inlined into the write-back
    rows = check.check_module(mod, target)
    wrong = [r for r in rows if not r["match"]]
    assert [r["plan"] for r in wrong] == ["spatial_vector"] and wrong[0]["max_abs_diff"] > 1
