"""Shared fixtures: small Relax models built here, so core tests do not depend on the zoo."""
from __future__ import annotations

import numpy as np
import pytest


def make_branchy_model(channels: int = 8, size: int = 16, seed: int = 0, batch: int = 1):
    """An inception-like block: 3x3 conv, 1x1 conv, 1x1->3x3 chain and a pool branch, concatenated, then a
    residual add and a dense head. Small enough to build in a second, branchy enough to schedule."""
    from tvm import relax

    rng = np.random.default_rng(seed)

    def w(*shape):
        fan_in = int(np.prod(shape[1:]))
        return relax.const((rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype("float32"))

    def b(n):
        return relax.const((rng.standard_normal((1, n, 1, 1)) * 0.1).astype("float32"))

    c = channels
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((batch, c, size, size), "float32"))
    op = relax.op
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w(c, c, 3, 3), padding=1), b(c))))
            b1 = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w(c, c, 1, 1)), b(c))))
            b2 = bb.emit(op.nn.relu(op.add(op.nn.conv2d(x, w(c, c, 1, 1)), b(c))))
            b2 = bb.emit(op.nn.relu(op.add(op.nn.conv2d(b2, w(c, c, 3, 3), padding=1), b(c))))
            p = bb.emit(op.nn.max_pool2d(x, pool_size=3, strides=1, padding=1))
            p = bb.emit(op.nn.relu(op.add(op.nn.conv2d(p, w(c, c, 1, 1)), b(c))))
            cat = bb.emit(op.concat([a, b1, b2, p], axis=1))
            y = bb.emit(op.nn.relu(op.add(op.nn.conv2d(cat, w(c, 4 * c, 1, 1)), b(c))))
            y = bb.emit(op.add(y, x))
            g = bb.emit(op.mean(y, axis=[2, 3]))
            out = bb.emit(op.matmul(g, relax.const((rng.standard_normal((c, 10)) * 0.3).astype("float32"))))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def refuse_in_wave_fusion(monkeypatch, refused: str) -> None:
    """Make wave fusion refuse unit ``refused`` (``NotFusable`` when it is lowered), as a unit with a nested
    parallel loop would be: it stays beside the fused kernel as a concurrent group."""
    import tvm_interop.passes.wave.kernel as kernel
    from tvm_interop.passes.wave import NotFusable

    real = kernel.lower_unit

    def lower_unit(prog, unit, target):
        if unit == refused:
            raise NotFusable(f"{unit}: refused by the test")
        return real(prog, unit, target)

    monkeypatch.setattr(kernel, "lower_unit", lower_unit)


@pytest.fixture(scope="session")
def branchy_model():
    return make_branchy_model()


@pytest.fixture(scope="session")
def branchy_input():
    return np.random.default_rng(42).standard_normal((1, 8, 16, 16)).astype("float32")


@pytest.fixture(scope="session")
def branchy_reference(branchy_model, branchy_input):
    import tvm_interop

    return tvm_interop.run_reference(branchy_model, [branchy_input])
