"""Frontends: ONNX and torch.export -> Relax, compiled with the "zero" pipeline and checked against a reference."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import tvm
from tvm import relax

from tvm_interop.runtime.errors import InputError, InteropError, UnsupportedModelError
from tvm_interop.frontends import from_onnx, from_torch


# --------------------------------------------------------------------------------------------------- helpers
def _build_and_run(mod: tvm.IRModule, *inputs: np.ndarray) -> np.ndarray:
    ex = tvm.compile(relax.get_pipeline("zero")(mod), "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    if not hasattr(out, "numpy"):  # a tuple of outputs
        out = out[0]
    return out.numpy()


def _num_main_params(mod: tvm.IRModule) -> int:
    return len(mod["main"].params)


def _onnx_inception(onnx, batch="N", seed=0):
    """A small inception-like ONNX model built with onnx.helper: 4 branches + Concat.

    x[b,4,9,9] -> { 1x1 conv | 1x1 conv -> 3x3 conv (pad 1) | 3x3 conv stride 1 pad 1 -> relu |
                    avgpool 3x3 pad 1 -> 1x1 conv } -> Concat(axis 1) -> Relu
    """
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def w(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype("float32") * 0.3, name)

    inits = [
        w("w1", (3, 4, 1, 1)), w("b1", (3,)),
        w("w2a", (2, 4, 1, 1)), w("b2a", (2,)), w("w2b", (3, 2, 3, 3)), w("b2b", (3,)),
        w("w3", (2, 4, 3, 3)), w("b3", (2,)),
        w("w4", (2, 4, 1, 1)), w("b4", (2,)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["y1"], name="branch1"),
        helper.make_node("Conv", ["x", "w2a", "b2a"], ["t2"], name="branch2a"),
        helper.make_node("Relu", ["t2"], ["t2r"]),
        helper.make_node("Conv", ["t2r", "w2b", "b2b"], ["y2"], pads=[1, 1, 1, 1], name="branch2b"),
        helper.make_node("Conv", ["x", "w3", "b3"], ["t3"], pads=[1, 1, 1, 1], name="branch3"),
        helper.make_node("Relu", ["t3"], ["y3"]),
        helper.make_node("AveragePool", ["x"], ["t4"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                         count_include_pad=1, strides=[1, 1]),
        helper.make_node("Conv", ["t4", "w4", "b4"], ["y4"], name="branch4"),
        helper.make_node("Concat", ["y1", "y2", "y3", "y4"], ["cat"], axis=1),
        helper.make_node("Relu", ["cat"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes, "inception_mini",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, 9, 9])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [batch, 9, 9, 9])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# --------------------------------------------------------------------------------------------------- ONNX
def test_onnx_helper_model_matches_onnx_reference(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    model = _onnx_inception(onnx, batch=2)
    path = tmp_path / "inception_mini.onnx"
    onnx.save(model, str(path))

    mod = from_onnx(path)
    assert _num_main_params(mod) == 1, "weights must be constants, not inputs of main"
    x = np.random.default_rng(1).standard_normal((2, 4, 9, 9)).astype("float32")
    got = _build_and_run(mod, x)
    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_onnx_accepts_model_proto_and_bytes():
    onnx = pytest.importorskip("onnx")
    model = _onnx_inception(onnx, batch=1)
    a = from_onnx(model)
    b = from_onnx(model.SerializeToString())
    tvm.ir.assert_structural_equal(a, b)


def test_onnx_dynamic_dim_requires_shape_dict():
    onnx = pytest.importorskip("onnx")
    model = _onnx_inception(onnx, batch="N")
    with pytest.raises(UnsupportedModelError, match=r"'N'.*shape_dict"):
        from_onnx(model)
    mod = from_onnx(model, shape_dict={"x": [3, 4, 9, 9]})
    shape = [int(d) for d in mod["main"].params[0].ty.shape.values]
    assert shape == [3, 4, 9, 9]


def test_onnx_shape_dict_with_unknown_name():
    onnx = pytest.importorskip("onnx")
    model = _onnx_inception(onnx, batch=1)
    with pytest.raises(InputError, match="not model inputs"):
        from_onnx(model, shape_dict={"nope": [1, 4, 9, 9]})


@pytest.mark.parametrize("content", [b"", b"this is not an onnx model\x00\xff\x13garbage" * 7])
def test_onnx_garbage_file(tmp_path, content):
    pytest.importorskip("onnx")
    path = tmp_path / "broken_model.onnx"
    path.write_bytes(content)
    with pytest.raises(UnsupportedModelError, match="broken_model.onnx"):
        from_onnx(str(path))


def test_onnx_missing_file(tmp_path):
    pytest.importorskip("onnx")
    with pytest.raises(FileNotFoundError, match="ONNX model file not found"):   # the built-in still catches it
        from_onnx(tmp_path / "absent.onnx")
    with pytest.raises(InteropError, match="absent.onnx"):                     # and so does the CLI
        from_onnx(tmp_path / "absent.onnx")


def test_onnx_unsupported_operator():
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    # Celu is a standard ONNX operator (opset 12) that TVM's Relax importer does not convert.
    graph = helper.make_graph(
        [helper.make_node("Celu", ["x"], ["y"], name="my_celu")], "celu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedModelError, match="Celu"):
        from_onnx(model)


def test_onnx_missing_extra(monkeypatch, tmp_path, capsys):
    from tvm_interop.cli import main

    path = tmp_path / "whatever.onnx"
    path.write_bytes(b"\x08\x07")
    monkeypatch.setitem(sys.modules, "onnx", None)  # makes `import onnx` raise ImportError
    with pytest.raises(ImportError, match=r"tvm-interop\[onnx\]"):
        from_onnx(str(path))
    # the CLI names the extra in one line (the error is an InteropError too), not a traceback
    assert main(["compile", str(path)]) == 1
    assert "needs the optional package 'onnx'" in capsys.readouterr().err
    # a missing file is named first, even without onnx
    with pytest.raises(FileNotFoundError, match="ONNX model file not found"):
        from_onnx(str(tmp_path / "absent.onnx"))


# --------------------------------------------------------------------------------------------------- torch
def _torch_inception(torch):
    nn = torch.nn

    class ConvBNReLU(nn.Sequential):
        def __init__(self, cin, cout, k, **kw):
            super().__init__(nn.Conv2d(cin, cout, k, bias=False, **kw), nn.BatchNorm2d(cout), nn.ReLU())

    class InceptionMini(nn.Module):
        def __init__(self):
            super().__init__()
            self.b1 = ConvBNReLU(4, 6, 1)
            self.b2 = nn.Sequential(ConvBNReLU(4, 4, 1), ConvBNReLU(4, 6, 3, padding=1))
            self.b3 = nn.Sequential(ConvBNReLU(4, 4, 1), ConvBNReLU(4, 4, (1, 3), padding=(0, 1)),
                                    ConvBNReLU(4, 4, (3, 1), padding=(1, 0)))
            self.b4 = nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1), ConvBNReLU(4, 2, 1))
            self.head = nn.Linear(18, 5)

        def forward(self, x):
            y = torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], dim=1)
            return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1))

    torch.manual_seed(0)
    model = InceptionMini()
    # non-trivial batch-norm statistics so that a wrong BN lowering shows up
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return model.eval()


@pytest.mark.parametrize("decompose", [True, False])
def test_torch_export_matches_torch(decompose):
    torch = pytest.importorskip("torch")
    model = _torch_inception(torch)
    x = torch.randn(2, 4, 12, 12)
    mod = from_torch(model, (x,), decompose_for_inference=decompose)
    assert _num_main_params(mod) == 1, "weights must be constants, not inputs of main"
    got = _build_and_run(mod, x.numpy())
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_torch_batch_norm_is_fused_into_conv():
    torch = pytest.importorskip("torch")
    model = _torch_inception(torch)
    mod = relax.get_pipeline("zero")(from_torch(model, torch.randn(1, 4, 12, 12)))
    names = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert not any("batch_norm" in n for n in names), names
    assert any(n.startswith("fused_conv2d") and "multiply" in n for n in names), names


def test_torch_restores_training_flag():
    torch = pytest.importorskip("torch")
    model = _torch_inception(torch).train()
    from_torch(model, torch.randn(1, 4, 12, 12))
    assert model.training


def test_torch_onnx_export_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnx")
    model = _torch_inception(torch)
    x = torch.randn(1, 4, 12, 12)
    path = tmp_path / "inception_mini.onnx"
    try:  # the TorchScript exporter needs no onnxscript; the dynamo one does
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"])
    except Exception as err:  # pragma: no cover - depends on the torch build
        pytest.skip(f"torch.onnx.export unavailable here ({err}); covered by the onnx.helper model test")
    mod = from_onnx(path)
    got = _build_and_run(mod, x.numpy())
    with torch.no_grad():
        want = model(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_torch_unsupported_operator():
    torch = pytest.importorskip("torch")

    class Det(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.det(x)

    with pytest.raises(UnsupportedModelError, match="det"):
        from_torch(Det(), torch.randn(3, 3))


def test_torch_export_failure_is_reported():
    torch = pytest.importorskip("torch")

    class DataDependent(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent Python control flow: torch.export refuses it
                return x + 1
            return x - 1

    with pytest.raises(UnsupportedModelError, match="torch.export failed"):
        from_torch(DataDependent(), torch.randn(3))


def test_torch_missing_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"tvm-interop\[torch\]"):
        from_torch(object(), ())
