"""Seeded random multi-branch CNNs, for fuzzing the whole pipeline.

``random_model(seed)`` builds a Relax module whose ``main`` takes one NCHW input and returns one tensor or a
tuple. Its body is a random DAG of conv (1x1 / 3x3, sometimes strided or depthwise), max/avg pooling, add,
concat, relu and a dense head, with random channel counts and spatial sizes. Every seed gives the same model, so a
failing seed printed by a test reproduces exactly: ``python -m tvm_interop.fuzz SEED`` prints it.

``random_cell_model(seed)`` builds Inception/NASNet-like cells instead: branches of convolutions (1x1 / 3x3 / 5x5,
sometimes two in a row) on one cell input, joined by a concat or an add, and a head of dense layers sharing the
pooled features. Such graphs are full of the sites AutoGraph's substitutions rewrite (convs sharing an input,
concatenated or added convs, 1x1 sequences, matmuls sharing an input), which ``random_model`` rarely makes.
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


def random_cell_model(seed: int, max_cells: int = 3):
    """A random multi-branch CNN made of cells (Relax IRModule) and a description of it."""
    from tvm import relax

    rng = np.random.default_rng(seed)
    op = relax.op
    c0 = int(rng.integers(3, 9))
    h0 = int(rng.choice([8, 11, 16]))
    x = relax.Var("data", relax.TensorType((1, c0, h0, h0), "float32"))
    desc: list[str] = []

    def const(shape, scale):
        return relax.const((rng.standard_normal(shape) * scale).astype("float32"))

    def conv(t: _T, co: int, k: int, epilogue: tuple[bool, bool]) -> _T:
        y = op.nn.conv2d(t.expr, const((co, t.c, k, k), np.sqrt(2.0 / (t.c * k * k))), padding=k // 2)
        bias, relu = epilogue
        if bias:
            y = op.add(y, const((1, co, 1, 1), 0.1))
        if relu:
            y = op.nn.relu(y)
        return _T(bb.emit(y), co, t.h, t.w)

    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            cur = _T(x, c0, h0, h0)
            for _ in range(int(rng.integers(1, max_cells + 1))):
                join = "add" if rng.random() < 0.35 else "concat"
                same_co = int(rng.integers(2, 13))
                branches, kinds = [], []
                for _b in range(int(rng.integers(2, 5))):
                    co = same_co if join == "add" else int(rng.integers(2, 13))
                    k = int(rng.choice([1, 1, 3, 3, 5]))
                    epi = (bool(rng.random() < 0.8), bool(rng.random() < 0.7))
                    if rng.random() < 0.3:   # a two-conv branch: a 1x1 reduction, then k x k
                        mid = conv(cur, int(rng.integers(2, 9)), 1, epi)
                        out = conv(mid, co, k, (True, False) if k == 1 else epi)
                        kinds.append(f"1x1>{k}x{k}")
                    else:
                        out = conv(cur, co, k, epi)
                        kinds.append(f"{k}x{k}")
                    branches.append(out)
                if join == "add":
                    acc = branches[0]
                    for b in branches[1:]:
                        acc = _T(bb.emit(op.add(acc.expr, b.expr)), acc.c, acc.h, acc.w)
                    cur = acc
                else:
                    cur = _T(bb.emit(op.concat([b.expr for b in branches], axis=1)), sum(b.c for b in branches),
                             cur.h, cur.w)
                desc.append(f"{join}({', '.join(kinds)})")
                if cur.h >= 8 and rng.random() < 0.4:
                    pooled = op.nn.max_pool2d(cur.expr, pool_size=2, strides=2)
                    cur = _T(bb.emit(pooled), cur.c, cur.h // 2, cur.w // 2)
                    desc.append("pool")
            feat = bb.emit(op.mean(cur.expr, axis=[2, 3]))
            heads = int(rng.integers(1, 4))
            outs = []
            for _h in range(heads):   # dense layers sharing the pooled features
                classes = int(rng.integers(3, 11))
                outs.append(bb.emit(op.add(op.matmul(feat, const((cur.c, classes), np.sqrt(1.0 / cur.c))),
                                           const((classes,), 0.1))))
            out = bb.emit_output(outs[0] if heads == 1 else relax.Tuple(outs))
        bb.emit_func_output(out)
    return bb.get(), f"seed {seed}: input 1x{c0}x{h0}x{h0}, cells {desc}, {heads} dense heads"


def random_schedule(graph, rng: np.random.Generator):
    """A random valid schedule of ``graph``: each stage takes a random subset of the ready units, split into a
    random number of groups (independent units, so the stage is valid), until every unit is placed. For fuzzing
    what the lowering does with any schedule a scheduler could produce (streams, events, keep-alive releases)."""
    from tvm_interop.passes.schedule import Schedule, Stage

    done: set[str] = set()
    remaining = [u.name for u in graph.units]
    stages = []
    while remaining:
        ready = [u for u in remaining if all(p in done for p in graph.pred_names(u))]
        rng.shuffle(ready)
        take = ready[: int(rng.integers(1, len(ready) + 1))]
        k = int(rng.integers(1, len(take) + 1))
        stages.append(Stage([g for g in (take[i::k] for i in range(k)) if g]))
        done.update(take)
        remaining = [u for u in remaining if u not in done]
    sched = Schedule(stages)
    sched.validate(graph)
    return sched


def random_input(mod, seed: int = 0) -> np.ndarray:
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape.values)
    return np.random.default_rng(seed + 12345).standard_normal(shape).astype("float32")


if __name__ == "__main__":  # pragma: no cover - debugging aid
    mod, desc = random_model(int(sys.argv[1]))
    print(desc)
    mod.show()
