"""ONNX / torch exports of zoo-style Relax modules (tvm_interop.export): the baselines of scripts/bench.py.

Every zoo model at a small configuration, exported to ONNX (run by ONNX Runtime) and to torch (eager), must compute
what plain TVM computes (``tvm_interop.run_reference``) at rtol = atol = 1e-4. Building the plain-TVM reference
costs 7-30 s per model on a 2-core machine, so the default suite checks one model (squeezenet) against it,
every model against the zoo's independent numpy probe (which tests/test_models.py ties to TVM at the same
tolerance), and a synthetic module covering every supported operator and the awkward attribute cases against TVM;
``-m slow`` adds the plain-TVM check of every other model.
"""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import tvm_interop  # noqa: E402
from tvm_interop.runtime.errors import UnsupportedModelError  # noqa: E402
from tvm_interop.export import SUPPORTED_OPS, ZOO_OPS, read_relax, to_onnx, to_torch, zoo_ops  # noqa: E402
from tvm_interop.models import build_with_reference, get_model, list_models, small_config  # noqa: E402
from zoo_cases import zoo_case  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-4)




def _input(mod, seed: int = 7) -> np.ndarray:
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape)
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def _as_list(y):
    return [np.asarray(v) for v in y] if isinstance(y, (list, tuple)) else [np.asarray(y)]


def run_onnx(mod, x: np.ndarray) -> list:
    ort = pytest.importorskip("onnxruntime")
    model = to_onnx(mod)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})


def run_torch(mod, x: np.ndarray) -> list:
    torch = pytest.importorskip("torch")
    net = to_torch(mod)
    with torch.inference_mode():
        y = net(torch.from_numpy(x))
    return [t.numpy() for t in y] if isinstance(y, (tuple, list)) else [y.numpy()]


def _check(got: list, want: list, what: str) -> None:
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{what} output {i}: shape {g.shape} vs {w.shape}"
        np.testing.assert_allclose(g, w, err_msg=f"{what} output {i}", **TOL)


# ------------------------------------------------------------------------------------------ op coverage
def test_every_zoo_op_is_supported():
    """Enumerate the operators of every zoo model (small config): all supported, and ZOO_OPS is exact."""
    seen: dict = {}
    for name in list_models():
        mod = get_model(name, **small_config(name))
        for op in zoo_ops(mod):
            seen.setdefault(op, []).append(name)
        read_relax(mod)  # attributes of every binding are accepted
    assert set(seen) <= set(SUPPORTED_OPS), {k: v for k, v in seen.items() if k not in SUPPORTED_OPS}
    assert set(seen) == set(ZOO_OPS), (sorted(seen), sorted(ZOO_OPS))


# ------------------------------------------------------------------------------------------ zoo models
@pytest.mark.parametrize("name", list_models())
def test_zoo_export_matches_numpy_probe(name):
    """Every zoo model: ONNX Runtime and torch equal the zoo's independent numpy forward (fast: no TVM build)."""
    mod, x, ref = build_with_reference(name, num_classes=10, **small_config(name))
    _check(run_torch(mod, x), [ref], f"{name} torch")
    _check(run_onnx(mod, x), [ref], f"{name} onnxruntime")


def _check_against_tvm(name: str) -> None:
    mod, x, ref = zoo_case(name)
    ref = _as_list(ref)
    _check(run_onnx(mod, x), ref, f"{name} onnxruntime vs plain TVM")
    _check(run_torch(mod, x), ref, f"{name} torch vs plain TVM")


def test_zoo_export_matches_plain_tvm():
    _check_against_tvm("squeezenet")


@pytest.mark.slow
@pytest.mark.parametrize("name", [m for m in list_models() if m != "squeezenet"])
def test_zoo_export_matches_plain_tvm_slow(name):
    _check_against_tvm(name)


# ------------------------------------------------------------------------------------------ every operator
def make_ops_model(seed: int = 0):
    """One small module using every supported operator, with the awkward attributes: asymmetric and oversized
    pool / conv padding, ceil-mode pools (with an extra trailing window), dilated max pool, grouped / dilated
    convs, both count_include_pad values, strided slices with clamped ends, a tuple output."""
    from tvm import relax

    rng = np.random.default_rng(seed)
    op = relax.op

    def c(*shape, scale=0.3):
        return relax.const((rng.standard_normal(shape) * scale).astype("float32"))

    def s(v):
        return relax.const(np.float32(v))

    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((1, 4, 11, 11), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit
            a = e(op.nn.conv2d(x, c(8, 2, 3, 3), strides=2, padding=(1, 0, 2, 1), groups=2))  # asymmetric
            a = e(op.nn.relu6(op.add(a, c(1, 8, 1, 1))))
            b = e(op.nn.conv2d(x, c(8, 4, 3, 3), padding=2, dilation=2))
            b = e(op.nn.max_pool2d(b, pool_size=3, strides=2, padding=(0, 0, 1, 1), ceil_mode=True))  # 11 -> 6
            b2 = e(op.nn.avg_pool2d(b, pool_size=2, strides=2, padding=(1, 1, 0, 0), count_include_pad=False,
                                    ceil_mode=True))  # 6 -> 4 (floor: 3)
            b3 = e(op.nn.avg_pool2d(b, pool_size=3, strides=1, padding=(2, 1, 0, 1), count_include_pad=True))
            b4 = e(op.nn.avg_pool2d(b, pool_size=3, strides=1, padding=(2, 1, 0, 1), count_include_pad=False))
            b5 = e(op.nn.max_pool2d(b, pool_size=2, strides=1, padding=1, dilation=2))
            b6 = e(op.nn.avg_pool2d(b, pool_size=3, strides=1, padding=1, count_include_pad=False))
            sg, th = e(op.sigmoid(b3)), e(op.tanh(b4))
            g, si = e(op.nn.gelu(b5)), e(op.nn.silu(b6))
            m = e(op.add(op.subtract(sg, th), op.multiply(g, si)))
            m = e(op.divide(m, op.add(op.exp(op.minimum(m, s(1.0))), s(1.0))))
            m = e(op.maximum(m, op.sqrt(op.clip(op.nn.leakyrelu(b3, 0.1), 0.0, 4.0))))
            m = e(op.power(op.nn.relu(op.negative(m)), s(1.5)))
            p = e(op.nn.pad(a, [0, 0, 0, 0, 1, 0, 0, 2]))
            p = e(op.strided_slice(p, axes=[2, 3], begin=[1, 0], end=[100, -1], strides=[2, 1]))
            q = e(op.permute_dims(p, [0, 2, 3, 1]))
            q = e(op.nn.softmax(q, axis=-1))
            q = e(op.mean(q, axis=[1], keepdims=True))
            q = e(op.sum(q, axis=[2], keepdims=False))
            ad = e(op.nn.adaptive_avg_pool2d(m, output_size=(2, 3)))
            f = e(op.squeeze(op.expand_dims(op.flatten(ad), [0]), [0]))
            cat = e(op.concat([op.max(b2, axis=[2, 3]), op.min(b2, axis=[2, 3]), op.mean(b2, axis=[2, 3])], axis=1))
            h = e(op.matmul(op.reshape(cat, (1, 24)), c(24, 5)))
            h = e(op.nn.log_softmax(h, axis=1))
            half = e(op.astype(op.astype(m, "float16"), "float32"))
            out = bb.emit_output(relax.Tuple([h, q, f, half]))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def ops_case():
    mod = make_ops_model()
    x = _input(mod, seed=1)
    return mod, x, _as_list(tvm_interop.run_reference(mod, [x]))


def test_ops_model_covers_supported_ops(ops_case):
    ops = set(read_relax(ops_case[0]).op_counts())
    # nn.relu6 is emitted by Relax as clip; every other supported operator appears
    assert ops == set(SUPPORTED_OPS) - {"relax.nn.relu6"}, sorted(set(SUPPORTED_OPS) - ops)


def test_ops_model_torch_matches_plain_tvm(ops_case):
    mod, x, ref = ops_case
    _check(run_torch(mod, x), ref, "torch vs plain TVM")


def test_ops_model_onnx_matches_plain_tvm(ops_case):
    mod, x, ref = ops_case
    _check(run_onnx(mod, x), ref, "onnxruntime vs plain TVM")


@pytest.mark.parametrize("opset", [13, 18, 21])
def test_ops_model_other_opsets(ops_case, opset):
    """Opset 18 moves the reduction axes to an input; every opset from 13 gives the same outputs."""
    ort = pytest.importorskip("onnxruntime")
    mod, x, ref = ops_case
    model = to_onnx(mod, opset=opset)
    assert model.opset_import[0].version == opset
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _check(sess.run(None, {"data": x}), ref, f"onnxruntime opset {opset}")
    with pytest.raises(ValueError, match="opset 11"):
        to_onnx(mod, opset=11)


# ------------------------------------------------------------------------------------------ weights, files, errors
def test_weights_identical():
    mod = get_model("squeezenet", **small_config("squeezenet"))
    g = read_relax(mod)
    assert len(g.constants) > 10
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in to_onnx(mod).graph.initializer}
    for name, arr in g.constants.items():
        assert inits[name].dtype == arr.dtype and np.array_equal(inits[name], arr), name
    torch = pytest.importorskip("torch")
    bufs = list(to_torch(mod).state_dict().values())
    assert len(bufs) == len(g.constants)
    for buf, arr in zip(bufs, g.constants.values()):
        assert isinstance(buf, torch.Tensor) and np.array_equal(buf.numpy(), arr)


def test_to_onnx_writes_a_loadable_file(tmp_path):
    mod = get_model("resnet50", **small_config("resnet50"))
    path = tmp_path / "m.onnx"
    model = to_onnx(mod, path)
    loaded = onnx.load(str(path))
    onnx.checker.check_model(loaded)
    assert loaded.graph.input[0].name == "data"
    assert [d.dim_value for d in loaded.graph.output[0].type.tensor_type.shape.dim] == [1, 1000]
    assert len(loaded.graph.node) == len(model.graph.node) == len(read_relax(mod).nodes)


def test_torch_module_is_readable_code():
    pytest.importorskip("torch")
    net = to_torch(get_model("squeezenet", **small_config("squeezenet")))
    assert "conv2d" in net.code and "max_pool2d" in net.code and not net.training


def _single_op_module(make, shape=(1, 4, 8, 8)):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(make(x))
        bb.emit_func_output(y)
    return bb.get()


def test_unsupported_operator_is_named():
    from tvm import relax

    ones = relax.const(np.ones(4, "float32"))
    mod = _single_op_module(lambda x: relax.op.nn.layer_norm(x, ones, ones, axes=[1]))
    with pytest.raises(UnsupportedModelError, match=r"relax\.nn\.layer_norm"):
        to_onnx(mod)
    with pytest.raises(UnsupportedModelError, match=r"relax\.nn\.layer_norm"):
        read_relax(mod)
    legalized = relax.transform.LegalizeOps()(get_model("squeezenet", **small_config("squeezenet")))
    with pytest.raises(UnsupportedModelError, match=r"relax\.call_tir.*before LegalizeOps"):
        to_onnx(legalized)


def test_unsupported_attributes_are_named():
    from tvm import relax

    w = relax.const(np.ones((4, 3, 3, 8), "float32"))
    nhwc = _single_op_module(lambda x: relax.op.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="OHWI"))
    with pytest.raises(UnsupportedModelError, match=r"relax\.nn\.conv2d.*layout NHWC"):
        to_onnx(nhwc)
    refl = _single_op_module(lambda x: relax.op.nn.pad(x, [0, 0, 0, 0, 1, 1, 1, 1], pad_mode="reflect"))
    with pytest.raises(UnsupportedModelError, match=r"pad_mode"):
        read_relax(refl)


def test_uneven_adaptive_pool_torch_only():
    from tvm import relax

    mod = _single_op_module(lambda x: relax.op.nn.adaptive_avg_pool2d(x, output_size=(3, 2)), shape=(1, 2, 7, 5))
    with pytest.raises(UnsupportedModelError, match=r"adaptive_avg_pool2d.*uneven"):
        to_onnx(mod)
    x = _input(mod)
    _check(run_torch(mod, x), _as_list(tvm_interop.run_reference(mod, [x])), "torch adaptive pool")


def test_dynamic_shape_is_refused():
    from tvm import relax, tirx

    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((n, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(y)
    with pytest.raises(UnsupportedModelError, match=r"dynamic"):
        to_onnx(bb.get())


def test_bench_ops_compares_operator_classes(tmp_path, capsys):
    """scripts/bench_ops.py: our in-program kernel times and ONNX Runtime's profiled node times of one model,
    grouped into the same operator classes; every kernel of both sides is counted once."""
    import importlib.util
    import json
    import pathlib

    pytest.importorskip("onnxruntime")
    path = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "bench_ops.py"
    spec = importlib.util.spec_from_file_location("bench_ops", path)
    bench_ops = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_ops)
    out = tmp_path / "ops"
    assert bench_ops.main(["squeezenet", "--width", "0.125", "--image-size", "32", "--repeat", "2", "--warmup", "1",
                           "--top", "3", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| conv |" in text and "| **all** |" in text
    res = json.loads((tmp_path / "ops.json").read_text())
    for side in ("ours", "onnxruntime"):
        kernels, classes = res[side], res["classes"][side]
        assert kernels and sum(c["kernels"] for c in classes.values()) == len(kernels)
        assert abs(sum(c["us"] for c in classes.values()) - sum(k["us"] for k in kernels.values())) < 1e-6
        assert classes["conv"]["kernels"] == 26   # SqueezeNet's convolutions, one kernel / node each
    assert all(k["class"] in {"conv", "pool", "concat", "dense", "layout", "other"} for k in res["ours"].values())
