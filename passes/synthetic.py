"""Synthetic operator graphs for tests and scheduler benchmarks (no TVM needed).

Every generator is seeded and deterministic, and builds an :class:`~passes.graph.OpGraph` whose units look like
what ``passes.extract`` produces from a fused Relax module: a ``kind`` (``conv2d``, ``add``, ``max_pool2d``,
``concat``, ...), NCHW float32 input/output ``TensorInfo`` shapes, FLOPs, bytes moved, and for convolutions the
``attrs`` the merge strategy compares (``data`` — the name of the tensor read —, ``weight_shape``,
``strides``, ``padding``, ``dilation``, ``groups``). Several convolutions read the same tensor, so the merge
strategy has something to do.

* :func:`random_dag` — a random DAG of ``n`` units (edge probability, locality), for property tests.
* :func:`inception_like`, :func:`nasnet_like`, :func:`randwire_like`, :func:`squeezenet_like` — structured
  graphs with the fan-out / fan-in shapes of the zoo models, at roughly the same unit granularity, used by
  ``scripts/bench_schedulers.py --synthetic`` and by the scale tests.

A tensor is named after the unit that produces it (``"<unit>.out"``); the model input is ``"input"``.
"""
from __future__ import annotations

import random
from typing import Sequence

from tvm_interop.runtime.errors import InteropError

from .graph import OpGraph, TensorInfo, Unit

DEFAULT_KINDS = ("conv2d", "conv2d", "conv2d", "conv2d", "add", "relu", "max_pool2d", "concat")


def _nbytes(shape: Sequence[int]) -> int:
    n = 4
    for d in shape:
        n *= int(d)
    return n


class _Builder:
    """Accumulates units and edges; computes FLOPs and bytes from shapes."""

    def __init__(self, name: str, batch: int = 1):
        self.name = name
        self.batch = batch
        self.units: list[Unit] = []
        self.edges: list[tuple[str, str]] = []
        self.shape: dict[str, tuple[int, ...]] = {"input": ()}

    def tensor(self, unit_or_input: str) -> str:
        return "input" if unit_or_input == "input" else f"{unit_or_input}.out"

    def out_shape(self, src: str) -> tuple[int, ...]:
        return self.shape[src]

    def _add(self, unit: Unit, srcs: Sequence[str]) -> str:
        self.units.append(unit)
        for s in dict.fromkeys(srcs):
            if s != "input":
                self.edges.append((s, unit.name))
        self.shape[unit.name] = unit.outputs[0].shape
        return unit.name

    def input(self, channels: int, size: int) -> str:
        self.shape["input"] = (self.batch, channels, size, size)
        return "input"

    def conv(self, name: str, src: str, cout: int, k: int = 1, stride: int = 1, groups: int = 1,
             extra: Sequence[str] = (), kind: str = "conv2d") -> str:
        n, cin, h, w = self.shape[src]
        pad = k // 2
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        if groups == -1:  # depthwise
            groups, cout = cin, cin
        wshape = (cout, cin // groups, k, k)
        out = (n, cout, ho, wo)
        flops = 2.0 * n * cout * ho * wo * (cin // groups) * k * k
        ins = [TensorInfo(self.shape[src]), TensorInfo(wshape)] + [TensorInfo(self.shape[e]) for e in extra]
        unit = Unit(
            name=name, kind=kind, inputs=ins, outputs=[TensorInfo(out)], flops=flops,
            bytes_moved=float(sum(t.nbytes for t in ins) + _nbytes(out)),
            func_name=f"fused_{kind}_{cin}_{cout}_{k}x{k}_s{stride}_g{groups}_{h}",
            attrs={"data": self.tensor(src), "weight_shape": list(wshape), "strides": [stride, stride],
                   "padding": [pad, pad, pad, pad], "dilation": [1, 1], "groups": groups},
        )
        return self._add(unit, [src, *extra])

    def pool(self, name: str, src: str, k: int = 3, stride: int = 1, kind: str = "max_pool2d") -> str:
        n, c, h, w = self.shape[src]
        pad = k // 2
        ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
        out = (n, c, ho, wo)
        unit = Unit(name=name, kind=kind, inputs=[TensorInfo(self.shape[src])], outputs=[TensorInfo(out)],
                    flops=float(n * c * ho * wo * k * k), bytes_moved=float(_nbytes(self.shape[src]) + _nbytes(out)),
                    func_name=f"fused_{kind}_{c}_{h}_{k}_s{stride}",
                    attrs={"pool_size": [k, k], "strides": [stride, stride]})
        return self._add(unit, [src])

    def elementwise(self, name: str, srcs: Sequence[str], kind: str = "add") -> str:
        shape = self.shape[srcs[0]]
        ins = [TensorInfo(self.shape[s]) for s in srcs]
        unit = Unit(name=name, kind=kind, inputs=ins, outputs=[TensorInfo(shape)],
                    flops=float(max(1, len(srcs) - 1) * _nbytes(shape) // 4),
                    bytes_moved=float(sum(t.nbytes for t in ins) + _nbytes(shape)),
                    func_name=f"fused_{kind}_{len(srcs)}_{'x'.join(map(str, shape))}")
        return self._add(unit, srcs)

    def concat(self, name: str, srcs: Sequence[str]) -> str:
        n, _, h, w = self.shape[srcs[0]]
        c = sum(self.shape[s][1] for s in srcs)
        out = (n, c, h, w)
        ins = [TensorInfo(self.shape[s]) for s in srcs]
        unit = Unit(name=name, kind="concatenate", inputs=ins, outputs=[TensorInfo(out)], flops=0.0,
                    bytes_moved=float(2 * _nbytes(out)), func_name=f"fused_concatenate_{len(srcs)}_{c}_{h}",
                    attrs={"axis": 1})
        return self._add(unit, srcs)

    def graph(self) -> OpGraph:
        return OpGraph(self.units, self.edges, name=self.name)


# ---------------------------------------------------------------------------------------------- random DAGs
def random_dag(n: int, seed: int = 0, edge_prob: float = 0.3, kinds: Sequence[str] | None = None,
               batch: int = 1, size: int = 14, locality: int | None = None, connected: bool = True,
               name: str | None = None) -> OpGraph:
    """A random DAG of ``n`` units: unit ``j`` reads unit ``i < j`` with probability ``edge_prob``.

    ``locality`` (when given) only allows edges between units at most that far apart in the generation order,
    which keeps wide graphs wide. ``connected`` adds edges until the graph is weakly connected. Convolutions
    read their first producer's tensor (or the model input), so convolutions with the same producer are merge
    candidates. All tensors are ``batch x C x size x size``; channels are drawn from a few plausible values.
    """
    if n < 1:
        raise InteropError(f"random_dag needs n >= 1, got {n}")
    if not 0.0 <= edge_prob <= 1.0:
        raise InteropError(f"edge_prob must be in [0, 1], got {edge_prob}")
    rng = random.Random(seed)
    kinds = tuple(kinds or DEFAULT_KINDS)
    preds: list[list[int]] = []
    for j in range(n):
        lo = 0 if locality is None else max(0, j - locality)
        preds.append([i for i in range(lo, j) if rng.random() < edge_prob])
    if connected and n > 1:
        parent = list(range(n))

        def find(a: int) -> int:
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            return a

        for j in range(n):
            for i in preds[j]:
                parent[find(i)] = find(j)
        for j in range(1, n):
            if find(j) != find(0):
                lo = 0 if locality is None else max(0, j - locality)
                i = rng.randrange(lo, j)
                preds[j].append(i)
                parent[find(i)] = find(j)
    b = _Builder(name or f"random{n}_s{seed}", batch=batch)
    b.input(rng.choice((32, 64)), size)
    names = [f"u{j}" for j in range(n)]
    for j in range(n):
        srcs = [names[i] for i in sorted(set(preds[j]))] or ["input"]
        kind = rng.choice(kinds)
        if kind == "concat" and len(srcs) >= 2:
            b.concat(names[j], srcs)
        elif kind in ("add", "relu") or (kind == "concat" and len(srcs) < 2):
            if len(srcs) >= 2:
                # an add needs equal shapes: project the extra inputs' channels away by reading only the first;
                # the others stay dependencies (like a fused residual add)
                c = b.shape[srcs[0]][1]
                if all(b.shape[s][1] == c for s in srcs):
                    b.elementwise(names[j], srcs, kind="add")
                else:
                    b.conv(names[j], srcs[0], c, k=1, extra=srcs[1:], kind="conv2d")
            else:
                b.elementwise(names[j], srcs, kind="relu" if kind == "relu" else "add")
        elif kind.endswith("pool2d"):
            if len(srcs) == 1:
                b.pool(names[j], srcs[0], k=3, kind=kind)
            else:
                b.conv(names[j], srcs[0], b.shape[srcs[0]][1], k=1, extra=srcs[1:])
        else:  # convolution (also the fallback for unknown kinds)
            cout = rng.choice((32, 64, 96, 128, 192))
            k = rng.choice((1, 1, 3, 3, 5))
            b.conv(names[j], srcs[0], cout, k=k, extra=srcs[1:],
                   kind=kind if kind.startswith("conv") else "conv2d")
    return b.graph()


# ---------------------------------------------------------------------------------------------- structured graphs
def inception_like(blocks: int = 3, batch: int = 1, size: int = 17, channels: int = 768, seed: int = 0) -> OpGraph:
    """Inception-v3-style blocks: four branches (1x1 / 1x1-3x3 / 1x1-3x3-3x3 / pool-1x1) joined by a concat.

    The three 1x1 convolutions at the head of each block read the same tensor (merge candidates).
    """
    rng = random.Random(seed)
    b = _Builder(f"inception_like{blocks}_b{batch}", batch=batch)
    x = b.conv("stem", b.input(3, size * 4), channels // 4, k=3, stride=4)
    x = b.conv("stem2", x, channels, k=1)
    for i in range(blocks):
        p = f"b{i}_"
        c = rng.choice((128, 160, 192))
        a = b.conv(p + "1x1", x, 192)
        m = b.conv(p + "3x3_reduce", x, c)
        m = b.conv(p + "3x3a", m, c, k=3)
        m = b.conv(p + "3x3b", m, 192, k=3)
        d = b.conv(p + "dbl_reduce", x, c)
        d = b.conv(p + "dbl_a", d, c, k=3)
        d = b.conv(p + "dbl_b", d, c, k=3)
        d = b.conv(p + "dbl_c", d, 192, k=3)
        q = b.pool(p + "pool", x, k=3, kind="avg_pool2d")
        q = b.conv(p + "pool_proj", q, 192)
        x = b.concat(p + "concat", [a, m, d, q])
    return b.graph()


def squeezenet_like(fires: int = 8, batch: int = 1, size: int = 56, seed: int = 0) -> OpGraph:
    """SqueezeNet fire modules: squeeze 1x1, then expand 1x1 and expand 3x3 side by side, then a concat."""
    b = _Builder(f"squeezenet_like{fires}_b{batch}", batch=batch)
    x = b.conv("conv1", b.input(3, size * 2), 64, k=3, stride=2)
    widths = [16, 16, 32, 32, 48, 48, 64, 64]
    for i in range(fires):
        s = widths[i % len(widths)]
        p = f"fire{i}_"
        sq = b.conv(p + "squeeze", x, s)
        e1 = b.conv(p + "expand1x1", sq, 4 * s)
        e3 = b.conv(p + "expand3x3", sq, 4 * s, k=3)
        x = b.concat(p + "concat", [e1, e3])
        if i in (1, 3):
            x = b.pool(f"pool{i}", x, k=3, stride=2)
    b.conv("conv10", x, 1000)
    return b.graph()


def nasnet_like(cells: int = 6, batch: int = 1, size: int = 21, channels: int = 168, seed: int = 0) -> OpGraph:
    """NASNet-A normal cells: each reads the two previous cells' outputs (so cell outputs are not cut points).

    A separable convolution is four units (relu+depthwise, pointwise, depthwise, pointwise); each cell has two
    1x1 "adjust" convolutions, five combine nodes of two branches each (separable 3x3/5x5, average pools,
    identities) and a concat: about 35 units and up to ten parallel chains per cell.
    """
    b = _Builder(f"nasnet_like{cells}_b{batch}", batch=batch)
    c = channels
    stem = b.conv("stem", b.input(3, size * 2), c, k=3, stride=2)
    prev_prev, prev = stem, b.conv("stem2", stem, c, k=1)

    def sep(name: str, src: str, k: int) -> str:
        x = b.conv(name + "_dw1", src, c, k=k, groups=-1)
        x = b.conv(name + "_pw1", x, c, k=1)
        x = b.conv(name + "_dw2", x, c, k=k, groups=-1)
        return b.conv(name + "_pw2", x, c, k=1)

    for i in range(cells):
        p = f"cell{i}_"
        h = b.conv(p + "adj_h", prev, c, k=1)
        hp = b.conv(p + "adj_hp", prev_prev, c, k=1)
        c0 = b.elementwise(p + "comb0", [sep(p + "sep3_h", h, 3), h])
        c1 = b.elementwise(p + "comb1", [sep(p + "sep3_hp", hp, 3), sep(p + "sep5_h", h, 5)])
        c2 = b.elementwise(p + "comb2", [b.pool(p + "avg_h", h, kind="avg_pool2d"), hp])
        c3 = b.elementwise(p + "comb3", [b.pool(p + "avg_hp1", hp, kind="avg_pool2d"),
                                         b.pool(p + "avg_hp2", hp, kind="avg_pool2d")])
        c4 = b.elementwise(p + "comb4", [sep(p + "sep5_hp", hp, 5), sep(p + "sep3_hp2", hp, 3)])
        out = b.concat(p + "concat", [hp, c0, c1, c2, c3, c4])
        prev_prev, prev = prev, b.conv(p + "proj", out, c, k=1)
    return b.graph()


def randwire_like(nodes: int = 32, k: int = 4, p: float = 0.75, stages: int = 2, batch: int = 1, size: int = 28,
                  channels: int = 78, seed: int = 0) -> OpGraph:
    """RandWire stages: a Watts-Strogatz(nodes, k, p) graph oriented by node index; each node sums its inputs
    (an ``add`` unit when it has several) and applies relu-separable-conv-bn (a depthwise and a pointwise unit)."""
    rng = random.Random(seed)
    b = _Builder(f"randwire_like{nodes}x{stages}_b{batch}", batch=batch)
    x = b.conv("stem", b.input(3, size * 2), channels, k=3, stride=2)
    for st in range(stages):
        # Watts-Strogatz ring lattice with rewiring
        edges = set()
        for i in range(nodes):
            for j in range(1, k // 2 + 1):
                edges.add((i, (i + j) % nodes))
        rewired = set()
        for (i, j) in sorted(edges):
            if rng.random() < p:
                choices = [t for t in range(nodes) if t != i and (i, t) not in rewired and (t, i) not in rewired]
                j = rng.choice(choices)
            rewired.add((i, j))
        dag = {(min(i, j), max(i, j)) for (i, j) in rewired if i != j}
        preds = {v: sorted(a for (a, bb) in dag if bb == v) for v in range(nodes)}
        succs = {v: [bb for (a, bb) in dag if a == v] for v in range(nodes)}
        outs: dict[int, str] = {}
        pre = f"s{st}_"
        for v in range(nodes):
            srcs = [outs[u] for u in preds[v]] or [x]
            agg = srcs[0] if len(srcs) == 1 else b.elementwise(pre + f"n{v}_sum", srcs)
            d = b.conv(pre + f"n{v}_dw", agg, channels, k=3, groups=-1)
            outs[v] = b.conv(pre + f"n{v}_pw", d, channels, k=1)
        sinks = [outs[v] for v in range(nodes) if not succs[v]]
        x = sinks[0] if len(sinks) == 1 else b.elementwise(pre + "out", sinks)
    return b.graph()


SYNTHETIC_MODELS = {
    # name -> (generator, kwargs): synthetic stand-ins with roughly the zoo models' unit counts and shapes
    "inception_v3": (inception_like, {"blocks": 11}),
    "randwire": (randwire_like, {"nodes": 32, "stages": 3}),
    "nasnet_a_large": (nasnet_like, {"cells": 28}),
    "squeezenet": (squeezenet_like, {"fires": 8}),
}


def synthetic_model(name: str, batch: int = 1) -> OpGraph:
    """A synthetic stand-in for a zoo model (``inception_v3``, ``randwire``, ``nasnet_a_large``, ``squeezenet``)."""
    key = name.replace("-", "_")
    if key not in SYNTHETIC_MODELS:
        raise InteropError(f"no synthetic stand-in for {name!r}; known: {', '.join(sorted(SYNTHETIC_MODELS))}")
    fn, kw = SYNTHETIC_MODELS[key]
    g = fn(batch=batch, **kw)
    g.name = f"synthetic_{key}_b{batch}"
    return g
