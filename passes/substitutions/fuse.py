"""``fuse_1x1_sequence``: two pointwise convolutions in a row with nothing nonlinear between them are one
pointwise convolution (a product of two linear maps is linear):

    conv1x1(conv1x1(x, W1) [+ b1], W2) [+ b2]  ==>  conv1x1(x, W2 W1) [+ (W2 b1 + b2)]

This removes a kernel and an intermediate tensor (fewer, larger operators — the opposite trade of the merge
rules, which the search weighs). The product is formed in float64 and rounded once.
"""
from __future__ import annotations

import numpy as np

from .base import Match, Rule, register
from .chains import Chain, _head, chain_at
from .graph import DataflowGraph, Emitter, rewrite_main
from .merge_convs import emit_conv_chain

__all__ = ["Fuse1x1Sequence"]


def _pointwise(c: Chain | None) -> bool:
    return (c is not None and c.kind == "conv2d" and int(c.attrs["groups"]) == 1
            and c.weight.shape[2:] == (1, 1) and not any(int(p) for p in c.attrs["padding"]))


@register
class Fuse1x1Sequence(Rule):
    name = "fuse_1x1_sequence"
    operators = ("relax.nn.conv2d", "relax.add")
    legality = ("an inner 1x1 conv2d (constant OIHW weight, groups == 1, no padding, optionally followed by a "
                "constant per-channel bias add read only by it) whose result is read only by an outer 1x1 "
                "conv2d (constant weight, groups == 1, no padding — padding would add W2 b1 at the border) as its "
                "data, same dtype; strides multiply (floor((floor((H-1)/s1))/s2) = floor((H-1)/(s1 s2))). The "
                "outer conv's bias add, if any, is folded too; its relu stays")
    inverse_of = None

    def _pair(self, g: DataflowGraph, inner_head: str) -> tuple[Chain, Chain] | None:
        inner = chain_at(g, inner_head)
        if not _pointwise(inner):
            return None
        inner = inner.truncated(("bias",) if inner.bias else ())
        outer_name = g.sole_user(inner.out)
        if outer_name is None or _head(g, outer_name) is None:
            return None
        outer = chain_at(g, outer_name)
        if not _pointwise(outer) or outer.data != inner.out or g.sig(outer.head)[1] != g.sig(inner.head)[1]:
            return None
        return inner, outer.truncated(("bias",) if outer.bias else ())

    def matches(self, g: DataflowGraph, allowed: set[str] | None) -> list[Match]:
        out = []
        for n in g.order:
            pair = self._pair(g, n)
            if pair is None:
                continue
            nodes = [m for c in pair for m in c.nodes]
            if allowed is None or set(nodes) <= allowed:
                out.append(Match(self.name, g.sorted(nodes)))
        return out

    def rewrite(self, g: DataflowGraph, match: Match):
        inner, outer = self._pair(g, match.nodes[0])
        w1 = inner.weight[:, :, 0, 0].astype(np.float64)
        w2 = outer.weight[:, :, 0, 0].astype(np.float64)
        dtype = outer.weight.dtype
        w = (w2 @ w1).astype(dtype)[:, :, None, None]
        b = None
        if inner.bias or outer.bias:
            b64 = np.zeros(w.shape[0])
            if inner.bias:
                b64 += w2 @ inner.bias_value.astype(np.float64)
            if outer.bias:
                b64 += outer.bias_value.astype(np.float64)
            b = b64.astype(dtype)
        s1, s2 = inner.attrs["strides"], outer.attrs["strides"]
        attrs = dict(outer.attrs, strides=(int(s1[0]) * int(s2[0]), int(s1[1]) * int(s2[1])), dilation=(1, 1))

        def build(em: Emitter, get):
            return {outer.out: emit_conv_chain(em, get(inner.data), w, b, False, attrs, (0, 0, 0, 0),
                                               last_replaces=outer.out)}

        return rewrite_main(g.mod, match.nodes, build, rule=self.name, prefix="f1x1_")

