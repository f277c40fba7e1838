"""Constant layout transforms folded with numpy (``passes.fold_layout``): exactly TVM's result, or left alone."""
import numpy as np
import pytest
import tvm
from tvm import relax, tirx

from tvm_interop.passes.fold_layout import fold_constant_layout_transforms, transform_constant


def _tvm_layout_transform(data: np.ndarray, index_map) -> np.ndarray:
    """What TVM's own build computes for ``layout_transform(data)`` (the reference)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(data.shape), str(data.dtype)))
    with bb.function("main", [x]):
        y = bb.emit(relax.op.layout_transform(x, index_map))
        bb.emit_func_output(y)
    mod = relax.transform.LegalizeOps()(bb.get())
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(data)).numpy()


MAPS = {
    "OIHW16i16o": (lambda o, i, h, w: (o // 16, i // 16, h, w, i % 16, o % 16), (32, 48, 3, 3)),
    "NCHW16c": (lambda n, c, h, w: (n, c // 16, h, w, c % 16), (1, 64, 1, 1)),
    "OIHW8o": (lambda o, i, h, w: (o // 8, i, h, w, o % 8), (24, 5, 1, 7)),
    "transpose": (lambda a, b: (b, a), (6, 10)),
}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_folds_exactly_what_tvm_computes(name):
    fn, shape = MAPS[name]
    data = np.random.default_rng(0).standard_normal(shape).astype("float32")
    index_map = tirx.IndexMap.from_func(fn)
    got = transform_constant(index_map, data)
    want = _tvm_layout_transform(data, index_map)
    assert got is not None and got.shape == want.shape and got.dtype == want.dtype
    assert np.array_equal(got, want)


def test_what_is_not_an_exact_permutation_is_left_for_tvm():
    data = np.arange(20 * 3, dtype="float32").reshape(20, 3)
    # 20 channels in blocks of 16: the output is padded, so not every place gets an element
    assert transform_constant(tirx.IndexMap.from_func(lambda c, k: (c // 16, k, c % 16)), data) is None
    # two elements to one place
    assert transform_constant(tirx.IndexMap.from_func(lambda a, b: (b, b)), np.ones((3, 3), "float32")) is None
    # an expression that is not index arithmetic
    odd = tirx.IndexMap.from_func(lambda a, b: (tirx.Select(a > 1, a, b), b))
    assert transform_constant(odd, np.ones((3, 3), "float32")) is None


def test_a_module_keeps_what_it_computes():
    """The module's constant transforms become constants; a transform of a non-constant stays."""
    w = np.random.default_rng(1).standard_normal((32, 16, 1, 1)).astype("float32")
    blocked = tirx.IndexMap.from_func(lambda o, i, h, ww: (o // 16, i // 16, h, ww, i % 16, o % 16))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 16, 4, 4], "float32"))
    with bb.function("main", [x]):
        wt = bb.emit(relax.op.layout_transform(relax.const(w), blocked))
        xt = bb.emit(relax.op.layout_transform(x, lambda n, c, h, ww: (n, c // 16, h, ww, c % 16)))
        out = bb.emit(relax.op.add(relax.op.sum(wt), relax.op.sum(xt)))
        bb.emit_func_output(out)
    mod = bb.get()
    folded, n = fold_constant_layout_transforms(mod)
    assert n == 1
    ops = []
    relax.analysis.post_order_visit(folded["main"].body,
                                    lambda e: ops.append(e.op.name) if isinstance(e, relax.Call) else None)
    assert ops.count("relax.layout_transform") == 1
    xin = np.random.default_rng(2).standard_normal((1, 16, 4, 4)).astype("float32")
    results = []
    for m in (mod, folded):
        vm = relax.VirtualMachine(tvm.compile(relax.transform.LegalizeOps()(m), target="llvm"), tvm.cpu())
        results.append(vm["main"](tvm.runtime.tensor(xin)).numpy())
    assert np.array_equal(results[0], results[1])


@pytest.mark.parametrize("name", ["googlenet", "nasnet_a_mobile"])
def test_prepared_zoo_model_has_the_constants_tvm_folds(name, monkeypatch):
    """What ships: the prepared program's constants (every blocked weight and bias) with the numpy fold equal, bit
    for bit, those TVM's FoldConstant computes when the transforms are left to it, and the units are the same."""
    import tvm_interop.passes.prepare as prepare
    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model, small_config

    mod = get_model(name, **small_config(name))
    ours = prepare_program(mod, "llvm")
    monkeypatch.setattr(prepare, "fold_constant_layout_transforms", lambda m: (m, 0))
    tvms = prepare_program(mod, "llvm")
    assert len(ours.constants) == len(tvms.constants) > 0
    for a, b in zip(ours.constants, tvms.constants):
        assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    assert [u.name for u in ours.graph] == [u.name for u in tvms.graph] and ours.graph.edges == tvms.graph.edges
