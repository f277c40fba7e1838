"""Tests of the model zoo (tvm_interop.models).

Fast tests build every model at a small configuration (narrow, small image, reduced depth) and check the
interface; a few small models are compiled with TVM and checked against the builder's independent numpy
reference. Full-size and the slower compile checks are marked ``slow``.
"""

from __future__ import annotations

import math
from collections import Counter, deque

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_interop.models import (
    MODELS,
    ModelSpec,
    build_with_reference,
    get_model,
    input_shape,
    list_models,
)
from tvm_interop.models.randwire import random_graph, watts_strogatz_edges

EXPECTED = {"inception_v3", "randwire", "nasnet_a_large", "nasnet_a_mobile", "squeezenet", "resnet50", "googlenet"}

# small configurations: (image_size, width, depth)
SMALL = {
    "inception_v3": dict(image_size=75, width=0.125, depth=1),
    "randwire": dict(image_size=16, width=0.0625, depth=5),
    "nasnet_a_large": dict(image_size=32, width=0.0625, depth=1),
    "nasnet_a_mobile": dict(image_size=32, width=0.125, depth=1),
    "squeezenet": dict(image_size=32, width=0.25),
    "resnet50": dict(image_size=32, width=0.125, depth=1),
    "googlenet": dict(image_size=64, width=0.125),
}

CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _bindings(mod):
    for block in mod["main"].body.blocks:
        yield from block.bindings


def _op_counts(mod) -> Counter:
    return Counter(b.value.op.name for b in _bindings(mod) if isinstance(b.value, relax.Call))


def _constants(mod) -> list[np.ndarray]:
    out = []
    for b in _bindings(mod):
        if isinstance(b.value, relax.Call):
            out += [a.value.numpy() for a in b.value.args if isinstance(a, tvm.ir.GenericConst)]
    return out


def _run(mod, x: np.ndarray) -> np.ndarray:
    ex = tvm.compile(relax.get_pipeline("zero")(mod), "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x)).numpy()


def _check_logits(out: np.ndarray, shape) -> None:
    assert out.shape == shape
    assert np.all(np.isfinite(out))
    assert 1e-3 < float(out.std()) < 1e3, out.std()
    assert float(np.abs(out).max()) < 1e3


# ---------------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------------


def test_registry():
    assert set(list_models()) == EXPECTED
    assert list_models() == sorted(list_models())
    from zoo_cases import ZOO_TIER, zoo_params   # the test tier names real models, and leaves some in the default

    assert set(ZOO_TIER) < set(list_models())
    assert [p.values[0] for p in zoo_params() if not p.marks] == [m for m in list_models() if m not in ZOO_TIER]
    for name, spec in MODELS.items():
        assert isinstance(spec, ModelSpec) and spec.name == name
        assert callable(spec.build)
        assert spec.default_image_size >= spec.min_image_size >= 1
        assert spec.description and spec.source
        assert "arXiv" in spec.source or "20" in spec.source
    assert MODELS["inception_v3"].default_image_size == 299
    assert MODELS["nasnet_a_large"].default_image_size == 331
    assert MODELS["squeezenet"].depth_param is None and MODELS["googlenet"].depth_param is None
    for name in ("inception_v3", "randwire", "nasnet_a_large", "nasnet_a_mobile", "resnet50"):
        assert MODELS[name].depth_param


def test_input_shape():
    assert input_shape("resnet50") == (1, 3, 224, 224)
    assert input_shape("inception_v3", batch_size=4) == (4, 3, 299, 299)
    assert input_shape("nasnet_a_large", 2, 64) == (2, 3, 64, 64)
    with pytest.raises(ValueError):
        input_shape("nope")
    with pytest.raises(ValueError):
        input_shape("inception_v3", image_size=74)
    with pytest.raises(ValueError):
        input_shape("resnet50", batch_size=0)


# ---------------------------------------------------------------------------------------------------
# every model at a small configuration
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_small_build_interface(name):
    cfg = SMALL[name]
    mod = get_model(name, batch_size=2, num_classes=10, **cfg)
    assert isinstance(mod, tvm.IRModule)
    main = mod["main"]
    assert len(main.params) == 1
    (data,) = main.params
    assert data.name == "data"
    assert tuple(int(v) for v in data.ty.shape) == (2, 3, cfg["image_size"], cfg["image_size"])
    assert data.ty.dtype == "float32"
    assert input_shape(name, 2, cfg["image_size"]) == (2, 3, cfg["image_size"], cfg["image_size"])
    assert isinstance(main.ret_ty, relax.TensorType)  # a single tensor, not a tuple
    assert tuple(int(v) for v in main.ret_ty.shape) == (2, 10)
    # one dataflow block holding everything
    assert len(main.body.blocks) == 1 and isinstance(main.body.blocks[0], relax.DataflowBlock)
    # every weight is a constant: the only Var inputs are data and earlier bindings
    consts = _constants(mod)
    assert consts and all(c.dtype == np.float32 for c in consts)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_small_probe_magnitude(name):
    """The builder's numpy reference forward (batch 1) gives O(1) logits at any size."""
    _, x, ref = build_with_reference(name, num_classes=10, **SMALL[name])
    assert x.shape == (1, 3, SMALL[name]["image_size"], SMALL[name]["image_size"])
    _check_logits(ref, (1, 10))


def _check_tvm_against_reference(name):
    """Batch 2 through TVM: row 0 (the probe image) equals the numpy reference, row 1 differs."""
    cfg = SMALL[name]
    _, x, ref = build_with_reference(name, num_classes=10, **cfg)
    mod = get_model(name, batch_size=2, num_classes=10, **cfg)
    out = _run(mod, np.concatenate([x, -0.5 * x]))
    _check_logits(out, (2, 10))
    np.testing.assert_allclose(out[:1], ref, rtol=1e-4, atol=1e-4)
    assert not np.allclose(out[0], out[1])


@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "randwire"])
def test_small_numeric_tvm(name):
    _check_tvm_against_reference(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["googlenet", "inception_v3", "nasnet_a_mobile", "nasnet_a_large"])
def test_small_numeric_tvm_slow(name):
    _check_tvm_against_reference(name)


def test_default_logits_magnitude_deep():
    """The deepest default stacks stay O(1) (numpy reference only, tiny width and image)."""
    _, _, ref = build_with_reference("nasnet_a_large", image_size=16, width=0.02, num_classes=10)
    _check_logits(ref, (1, 10))
    _, _, ref = build_with_reference("resnet50", image_size=16, width=0.0625, num_classes=10)
    _check_logits(ref, (1, 10))


# ---------------------------------------------------------------------------------------------------
# structure
# ---------------------------------------------------------------------------------------------------


def test_layer_counts():
    small = dict(image_size=16, width=0.0625)
    assert _op_counts(get_model("resnet50", **small))["relax.nn.conv2d"] == 1 + 16 * 3 + 4
    assert _op_counts(get_model("resnet50", depth=1, **small))["relax.nn.conv2d"] == 1 + 4 * 3 + 4
    assert _op_counts(get_model("resnet50", depth=2, **small))["relax.nn.conv2d"] == 1 + 8 * 3 + 4
    inc = _op_counts(get_model("inception_v3", image_size=75, width=0.0625))
    assert inc["relax.nn.conv2d"] == 94  # torchvision's BasicConv2d count without the aux head
    assert _op_counts(get_model("inception_v3", image_size=75, width=0.0625, depth=1))["relax.nn.conv2d"] == 5 + 7 + 4 + 10 + 6 + 9
    assert _op_counts(get_model("googlenet", image_size=64, width=0.0625))["relax.nn.conv2d"] == 3 + 9 * 6
    sq = _op_counts(get_model("squeezenet", image_size=32, width=0.125))
    assert sq["relax.nn.conv2d"] == 1 + 8 * 3 + 1 and sq["relax.nn.max_pool2d"] == 3
    rw = _op_counts(get_model("randwire", depth=6, **small))
    assert rw["relax.nn.conv2d"] == 2 + 3 * 6 * 2 + 1  # conv1, conv2, (dw + pw) per node, 1x1 to 1280
    # NASNet: one concat per cell (2 stem + 3N normal + 2 reduction) + 4 factorized reductions
    # (64 px keeps every stage at a distinct resolution, so each stage's first cell reduces its h input)
    for name, depth, n in (("nasnet_a_mobile", None, 4), ("nasnet_a_large", 2, 2), ("nasnet_a_large", 1, 1)):
        ops = _op_counts(get_model(name, depth=depth, image_size=64, width=0.02))
        assert ops["relax.concat"] == 2 + 3 * n + 2 + 4, (name, depth)


def test_width_scales_channels():
    w1 = get_model("resnet50", image_size=16, width=0.25, depth=1)
    w2 = get_model("resnet50", image_size=16, width=0.5, depth=1)
    c1, c2 = _constants(w1)[0], _constants(w2)[0]
    assert c1.shape == (16, 3, 7, 7) and c2.shape == (32, 3, 7, 7)
    tiny = get_model("squeezenet", image_size=32, width=1e-3, num_classes=3)
    assert min(c.shape[0] for c in _constants(tiny) if c.ndim == 4) >= 1


def test_min_image_size():
    for name, spec in MODELS.items():
        kw = dict(width=0.03, num_classes=4)
        if spec.depth_param:
            kw["depth"] = spec.min_depth
        get_model(name, image_size=spec.min_image_size, **kw)
        if spec.min_image_size > 1:
            with pytest.raises(ValueError, match="too small"):
                get_model(name, image_size=spec.min_image_size - 1, **kw)
    assert MODELS["inception_v3"].min_image_size == 75


# ---------------------------------------------------------------------------------------------------
# determinism
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["randwire", "nasnet_a_mobile", "googlenet"])
def test_seed_determinism(name):
    cfg = SMALL[name]
    a = _constants(get_model(name, seed=3, **cfg))
    b = _constants(get_model(name, seed=3, **cfg))
    c = _constants(get_model(name, seed=4, **cfg))
    assert len(a) == len(b)
    assert all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))
    if name == "randwire":  # a different seed also draws different graphs
        assert len(a) != len(c) or any(x.shape != y.shape or not np.array_equal(x, y) for x, y in zip(a, c))
    else:
        assert len(a) == len(c)
        assert all(x.shape == y.shape for x, y in zip(a, c))
        assert not any(np.array_equal(x, y) for x, y in zip(a, c) if x.size > 8)


# ---------------------------------------------------------------------------------------------------
# argument checking
# ---------------------------------------------------------------------------------------------------


def test_unknown_model():
    with pytest.raises(ValueError, match="resnet50"):
        get_model("resnet5O")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=0),
        dict(batch_size=-1),
        dict(batch_size=1.5),
        dict(batch_size=True),
        dict(width=0),
        dict(width=-0.5),
        dict(width=float("nan")),
        dict(width=float("inf")),
        dict(num_classes=0),
        dict(image_size=0),
        dict(image_size=24),  # squeezenet needs >= 25
        dict(image_size=32.0),
        dict(depth=2),  # squeezenet has no repeat count
        dict(seed=-1),
    ],
)
def test_bad_arguments(kwargs):
    args = dict(image_size=32, width=0.125)
    args.update(kwargs)
    with pytest.raises(ValueError):
        get_model("squeezenet", **args)


def test_bad_depth():
    with pytest.raises(ValueError):
        get_model("resnet50", image_size=16, width=0.1, depth=0)
    with pytest.raises(ValueError):
        get_model("randwire", image_size=16, width=0.1, depth=4)  # needs N > K = 4
    with pytest.raises(ValueError):
        get_model("googlenet", depth=1)
    with pytest.raises(ValueError, match="too small"):
        get_model("inception_v3", image_size=74)


# ---------------------------------------------------------------------------------------------------
# the RandWire graph generator
# ---------------------------------------------------------------------------------------------------


def _reachable(start: list[int], nbrs) -> set[int]:
    seen, todo = set(start), deque(start)
    while todo:
        u = todo.popleft()
        for v in nbrs[u]:
            if v not in seen:
                seen.add(v)
                todo.append(v)
    return seen


@pytest.mark.parametrize("seed", [0, 1, 2, 12345])
def test_randwire_graph_structure(seed):
    n, k, p = 32, 4, 0.75
    g = random_graph(n, k, p, seed=seed)
    assert g.n == n
    assert len(g.edges) == n * k // 2  # rewiring keeps the edge count
    assert len(set(g.edges)) == len(g.edges)
    assert all(0 <= u < v < n for u, v in g.edges)  # index-ordered: a DAG, no self-loops
    degree = Counter()
    for u, v in g.edges:
        degree[u] += 1
        degree[v] += 1
    assert all(degree[i] >= k // 2 for i in range(n))  # each node keeps its own K/2 edge ends
    # rewiring with P=0.75 leaves far fewer than all ring-lattice edges in place
    lattice = {tuple(sorted((u, (u + j) % n))) for u in range(n) for j in range(1, k // 2 + 1)}
    assert sum(e in lattice for e in g.edges) < 0.6 * len(g.edges)
    # unique input / output nodes: everything reachable from the input, everything reaches the output
    assert 0 in g.input_nodes and (n - 1) in g.output_nodes
    assert _reachable(g.input_nodes, g.succs) == set(range(n))
    assert _reachable(g.output_nodes, g.preds) == set(range(n))
    for v in range(n):
        assert all(u < v for u in g.preds[v]) and all(w > v for w in g.succs[v])


def test_randwire_graph_determinism():
    a = random_graph(32, 4, 0.75, seed=7)
    b = random_graph(32, 4, 0.75, seed=7)
    c = random_graph(32, 4, 0.75, seed=8)
    assert a.edges == b.edges
    assert a.edges != c.edges
    assert random_graph(32, 4, 0.75, seed=[0, 1]).edges != random_graph(32, 4, 0.75, seed=[0, 2]).edges


def test_watts_strogatz_limits():
    rng = np.random.default_rng(0)
    ring = watts_strogatz_edges(10, 4, 0.0, rng)  # P = 0: the ring lattice
    assert ring == sorted({tuple(sorted((u, (u + j) % 10))) for u in range(10) for j in (1, 2)})
    full = watts_strogatz_edges(5, 4, 1.0, rng)  # complete graph: no rewiring possible
    assert len(full) == 10
    for bad in [(4, 4, 0.5), (10, 3, 0.5), (10, 4, 1.5)]:
        with pytest.raises(ValueError):
            watts_strogatz_edges(*bad, rng)


def test_randwire_uses_graph():
    """The stage graphs are wired as drawn: one weighted-sum multiply per DAG edge and stage input."""
    depth = 8
    mod = get_model("randwire", image_size=16, width=0.0625, depth=depth, seed=5)
    graphs = [random_graph(depth, 4, 0.75, seed=[5, s]) for s in range(3)]
    n_mult = sum(len(g.edges) for g in graphs)
    n_avg = sum(1 for g in graphs if len(g.output_nodes) > 1)  # 1/k scale of the output average
    assert _op_counts(mod)["relax.multiply"] == n_mult + n_avg


# ---------------------------------------------------------------------------------------------------
# full-size models (slow)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED - {"nasnet_a_large"}))
def test_default_config_builds(name):
    mod = get_model(name)
    s = MODELS[name].default_image_size
    assert tuple(int(v) for v in mod["main"].params[0].ty.shape) == (1, 3, s, s)
    fused = relax.get_pipeline("zero")(mod)
    units = sum(1 for b in _bindings(fused) if isinstance(b.value, relax.Call) and b.value.op.same_as(CALL_TIR))
    assert units > 30
    assert math.isfinite(units)
