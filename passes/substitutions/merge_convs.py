"""Rules that merge convolutions into one wider convolution (IOS / TASO style operator merging).

* ``merge_shared_input_convs``: k convs (+ the same epilogue) reading one tensor -> one conv over the
  concatenated, centre-aligned kernels + ``split``.
* ``merge_concat_convs``: the same, when the convs' outputs are concatenated in order: the merged conv's
  output *is* (that run of) the concat, so no split is needed.
* ``merge_added_convs``: ``conv(x1, W1) + conv(x2, W2)`` -> ``conv(concat(x1, x2), concat(W1, W2, axis=1))``.

All three are exact up to floating-point summation order: zero taps contribute nothing.
"""
from __future__ import annotations

from collections.abc import Callable
from itertools import combinations
from typing import Any

import numpy as np
from tvm import relax

from .base import Match, Rule, register
from .chains import Alignment, Chain, align_kernels, chain_at
from .graph import DataflowGraph, Emitter, rewrite_main

__all__ = ["MergeSharedInputConvs", "emit_conv_chain"]

#: the most members a shared-input group may have before only the maximal set (no pairs) is offered
MAX_PAIR_GROUP = 8


def _conv_key(g: DataflowGraph, c: Chain) -> tuple:
    """Chains with equal keys read the same tensor the same way and give the same output size."""
    shape, dtype = g.sig(c.head)
    return (c.data, tuple(c.attrs["strides"]), tuple(c.attrs["dilation"]), dtype, (shape[0],) + shape[2:],
            c.epilogue)


def _mergeable_conv(c: Chain | None) -> bool:
    return c is not None and c.kind == "conv2d" and int(c.attrs["groups"]) == 1


def emit_conv_chain(em: Emitter, data, weight: np.ndarray, bias: np.ndarray | None, relu: bool, attrs: dict,
                    padding, last_replaces: str | None = None):
    """Emit conv2d(data, weight) [+ bias] [relu]; the last binding is emitted ``replaces=last_replaces``."""
    steps: list[Callable[[Any], Any]] = []
    steps.append(lambda x: relax.op.nn.conv2d(
        x, relax.const(np.ascontiguousarray(weight)), strides=attrs["strides"], padding=padding,
        dilation=attrs["dilation"], groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW"))
    if bias is not None:
        steps.append(lambda x: relax.op.add(x, relax.const(np.ascontiguousarray(bias.reshape(1, -1, 1, 1)))))
    if relu:
        steps.append(relax.op.nn.relu)
    cur = data
    for k, step in enumerate(steps):
        cur = em.emit(step(cur), replaces=last_replaces if k == len(steps) - 1 else None)
    return cur


def _merged_weights(chains: list[Chain], al: Alignment) -> tuple[np.ndarray, np.ndarray | None]:
    w = np.concatenate([al.place(c.weight, i) for i, c in enumerate(chains)], axis=0)
    b = np.concatenate([c.bias_value for c in chains]) if chains[0].bias else None
    return w, b


def _align(g: DataflowGraph, chains: list[Chain]) -> Alignment | str:
    return align_kernels(chains, tuple(g.shape(chains[0].data)[2:]), tuple(g.shape(chains[0].head)[2:]))


def _chains_of(g: DataflowGraph, match: Match) -> list[Chain]:
    """The member chains of a match, cut to the epilogue the match consumed, in program order."""
    nodes = set(match.nodes)
    out = []
    for n in match.nodes:
        c = chain_at(g, n)
        if c is not None and c.head == n:
            keep = tuple(e for e, m in (("bias", c.bias), ("relu", c.relu)) if m and m in nodes)
            out.append(c.truncated(keep))
    return out


@register
class MergeSharedInputConvs(Rule):
    name = "merge_shared_input_convs"
    operators = ("relax.nn.conv2d", "relax.add", "relax.nn.relu")
    legality = ("two or more conv2d with constant OIHW weights read the same tensor (NCHW), groups == 1, equal "
                "strides, dilation, dtype and output size, the same epilogue (none, constant per-channel bias "
                "add, relu, or bias add + relu, each step read only by the next); kernels may differ in size "
                "if the top/left paddings differ by multiples of the dilation (zero-padded, centre-aligned "
                "kernels reproduce every output); offered: every pair and the maximal set per input tensor "
                "and key (pairs only when the group has at most 8 members)")
    inverse_of = None

    def matches(self, g: DataflowGraph, allowed: set[str] | None) -> list[Match]:
        groups: dict[tuple, list[Chain]] = {}
        for n in g.order:
            c = chain_at(g, n)
            if not _mergeable_conv(c) or (allowed is not None and not set(c.nodes) <= allowed):
                continue
            groups.setdefault(_conv_key(g, c), []).append(c)
        out = []
        for members in groups.values():
            if len(members) < 2:
                continue
            cands = [members]
            if 2 < len(members) <= MAX_PAIR_GROUP:
                cands += [list(p) for p in combinations(members, 2)]
            for cs in cands:
                if isinstance(_align(g, cs), Alignment):
                    out.append(Match(self.name, g.sorted(n for c in cs for n in c.nodes)))
        return out

    def rewrite(self, g: DataflowGraph, match: Match):
        chains = _chains_of(g, match)
        al = _align(g, chains)
        assert isinstance(al, Alignment)
        w, b = _merged_weights(chains, al)
        sizes = [c.channels for c in chains]

        def build(em: Emitter, get):
            y = emit_conv_chain(em, get(chains[0].data), w, b, bool(chains[0].relu), chains[0].attrs, al.padding)
            parts = em.emit(relax.op.split(y, [int(v) for v in np.cumsum(sizes)[:-1]], axis=1))
            return {c.out: em.emit(relax.TupleGetItem(parts, i), replaces=c.out) for i, c in enumerate(chains)}

        return rewrite_main(g.mod, match.nodes, build, rule=self.name, prefix="msic_")
