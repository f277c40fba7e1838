"""Seeded random multi-branch CNNs, for fuzzing the whole pipeline.

``random_model(seed)`` builds a Relax module whose ``main`` takes one NCHW input and returns one tensor or a
tuple. Its body is a random DAG of conv (1x1 / 3x3, sometimes strided or depthwise), max/avg pooling, add,
concat, relu and a dense head, with random channel counts and spatial sizes. Every seed gives the same model, so a
failing seed printed by a test reproduces exactly: ``python -m tvm_interop.fuzz SEED`` prints it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np


@dataclass
class _T:
    expr: object
    c: int
    h: int
    w: int
    used: bool = False


def random_model(seed: int, max_nodes: int = 12):
    """A random multi-branch CNN (Relax IRModule) and a description of it."""
    from tvm import relax

    rng = np.random.default_rng(seed)
    op = relax.op
    c0 = int(rng.integers(2, 9))
    h0 = int(rng.choice([6, 8, 11, 16]))
    batch = int(rng.choice([1, 1, 1, 2]))
    x = relax.Var("data", relax.TensorType((batch, c0, h0, h0), "float32"))
    ops_used: list[str] = []

    def const(shape, scale):
        return relax.const((rng.standard_normal(shape) * scale).astype("float32"))

    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            tensors = [_T(x, c0, h0, h0)]
            n_nodes = int(rng.integers(3, max_nodes + 1))
            for _ in range(n_nodes):
                kind = rng.choice(["conv", "conv", "conv", "pool", "add", "concat", "relu", "dwconv"])
                src = tensors[int(rng.integers(0, len(tensors)))]
                if kind == "conv":
                    k = int(rng.choice([1, 3]))
                    stride = 2 if (src.h >= 8 and rng.random() < 0.2) else 1
                    co = int(rng.integers(2, 13))
                    y = op.nn.conv2d(src.expr, const((co, src.c, k, k), np.sqrt(2.0 / (src.c * k * k))),
                                     strides=stride, padding=k // 2)
                    if rng.random() < 0.7:
                        y = op.add(y, const((1, co, 1, 1), 0.1))
                    if rng.random() < 0.6:
                        y = op.nn.relu(y)
                    h = (src.h + 2 * (k // 2) - k) // stride + 1
                    new = _T(bb.emit(y), co, h, h)
                elif kind == "dwconv":
                    y = op.nn.conv2d(src.expr, const((src.c, 1, 3, 3), np.sqrt(2.0 / 9)), padding=1, groups=src.c)
                    new = _T(bb.emit(y), src.c, src.h, src.w)
                elif kind == "pool":
                    pool = op.nn.max_pool2d if rng.random() < 0.5 else op.nn.avg_pool2d
                    new = _T(bb.emit(pool(src.expr, pool_size=3, strides=1, padding=1)), src.c, src.h, src.w)
                elif kind == "relu":
                    new = _T(bb.emit(op.nn.relu(src.expr)), src.c, src.h, src.w)
                elif kind == "add":
                    mates = [t for t in tensors if (t.c, t.h, t.w) == (src.c, src.h, src.w) and t is not src]
                    if not mates:
                        continue
                    other = mates[int(rng.integers(0, len(mates)))]
                    other.used = True
                    new = _T(bb.emit(op.add(src.expr, other.expr)), src.c, src.h, src.w)
                else:  # concat of 2-3 tensors with the same spatial size
                    mates = [t for t in tensors if (t.h, t.w) == (src.h, src.w) and t is not src]
                    if not mates:
                        continue
                    picks = [src] + [mates[int(i)] for i in rng.choice(len(mates), size=min(len(mates),
                                                                        int(rng.integers(1, 3))), replace=False)]
                    for t in picks:
                        t.used = True
                    new = _T(bb.emit(op.concat([t.expr for t in picks], axis=1)), sum(t.c for t in picks),
                             src.h, src.w)
                src.used = True
                ops_used.append(str(kind))
                tensors.append(new)
            leaves = [t for t in tensors[1:] if not t.used] or [tensors[-1]]
            pooled = [bb.emit(op.mean(t.expr, axis=[2, 3])) for t in leaves]
            feat = pooled[0] if len(pooled) == 1 else bb.emit(op.concat(pooled, axis=1))
            width = sum(t.c for t in leaves)
            classes = int(rng.integers(3, 11))
            logits = bb.emit(op.add(op.matmul(feat, const((width, classes), np.sqrt(1.0 / width))),
                                    const((classes,), 0.1)))
            if rng.random() < 0.25:  # tuple output: logits and the first pooled feature
                out = bb.emit_output(relax.Tuple([logits, pooled[0]]))
            else:
                out = bb.emit_output(logits)
        bb.emit_func_output(out)
    desc = f"seed {seed}: input {batch}x{c0}x{h0}x{h0}, ops {ops_used}"
    return bb.get(), desc


def random_input(mod, seed: int = 0) -> np.ndarray:
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape.values)
    return np.random.default_rng(seed + 12345).standard_normal(shape).astype("float32")


if __name__ == "__main__":  # pragma: no cover - debugging aid
    mod, desc = random_model(int(sys.argv[1]))
    print(desc)
    mod.show()
