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
from .chains import Alignment, Chain, align_kernels, chain_at, chain_ending_at
from .graph import DataflowGraph, Emitter, op_attrs, rewrite_main

__all__ = ["MergeAddedConvs", "MergeConcatConvs", "MergeSharedInputConvs", "emit_conv_chain"]

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


def _concat_fields(g: DataflowGraph, name: str) -> list[str] | None:
    """The field names of a 4-D ``concat(..., axis=1)`` whose fields are all bindings/params, else None."""
    call = g.call(name)
    if call is None or g.op(name) != "relax.concat" or not isinstance(call.args[0], relax.Tuple):
        return None
    shape = g.shape(name)
    axis = op_attrs(call).get("axis")
    if shape is None or len(shape) != 4 or axis not in (1, -3):
        return None
    fields = [g.name(f) if isinstance(f, relax.Var) else None for f in call.args[0].fields]
    return None if any(f is None for f in fields) else fields


@register
class MergeConcatConvs(Rule):
    name = "merge_concat_convs"
    operators = ("relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.concat")
    legality = ("a run of two or more consecutive fields of a 4-D concat along axis 1 are each the end of a "
                "conv2d chain (constant OIHW weight, groups == 1, optional constant bias add and relu, each step "
                "read only by the next) with the same input tensor, strides, dilation, dtype, output size and "
                "epilogue, kernels alignable as in merge_shared_input_convs, and each field read only by the "
                "concat and only once; offered: each maximal such run. The merged conv's output replaces the run "
                "(the whole concat when the run covers it)")
    inverse_of = "split_conv"

    def matches(self, g: DataflowGraph, allowed: set[str] | None) -> list[Match]:
        out = []
        for n in g.order:
            fields = _concat_fields(g, n)
            if fields is None or (allowed is not None and n not in allowed):
                continue
            runs: list[list[Chain]] = []
            prev_key = None
            for f in fields:
                c = chain_ending_at(g, f) if fields.count(f) == 1 and g.sole_user(f) == n else None
                ok = _mergeable_conv(c) and (allowed is None or set(c.nodes) <= allowed)
                key = _conv_key(g, c) if ok else None
                if ok and key == prev_key:
                    runs[-1].append(c)
                elif ok:
                    runs.append([c])
                prev_key = key
            for run in runs:
                if len(run) >= 2 and isinstance(_align(g, run), Alignment):
                    out.append(Match(self.name, g.sorted([n] + [m for c in run for m in c.nodes])))
        return out

    def rewrite(self, g: DataflowGraph, match: Match):
        cat = next(n for n in match.nodes if g.op(n) == "relax.concat")
        fields = _concat_fields(g, cat)
        chains = sorted(_chains_of(g, match), key=lambda c: fields.index(c.out))  # concat order, not program order
        al = _align(g, chains)
        assert isinstance(al, Alignment)
        w, b = _merged_weights(chains, al)
        first, last = fields.index(chains[0].out), fields.index(chains[-1].out)
        whole = first == 0 and last == len(fields) - 1

        def build(em: Emitter, get):
            y = emit_conv_chain(em, get(chains[0].data), w, b, bool(chains[0].relu), chains[0].attrs, al.padding,
                                last_replaces=cat if whole else None)
            if not whole:
                parts = [get(f) for f in fields[:first]] + [y] + [get(f) for f in fields[last + 1:]]
                y = em.emit(relax.op.concat(parts, axis=1), replaces=cat)
            return {cat: y}

        return rewrite_main(g.mod, match.nodes, build, rule=self.name, prefix="mcc_")


@register
class MergeAddedConvs(Rule):
    name = "merge_added_convs"
    operators = ("relax.nn.conv2d", "relax.add")
    legality = ("add(a, b) of two conv2d chains without relu (constant OIHW weights, groups == 1, optional "
                "constant bias add read only by the conv), each read only by the add, the add not broadcasting; "
                "equal strides, dilation, dtype and output shape; inputs of equal batch and spatial size; kernels "
                "alignable as in merge_shared_input_convs. Result: conv2d(concat(x1, x2, axis=1), "
                "concat(W1, W2, axis=1)) + (b1 + b2)")
    inverse_of = None

    def _pair(self, g: DataflowGraph, n: str) -> list[Chain] | None:
        call = g.call(n)
        if call is None or g.op(n) != "relax.add" or not all(isinstance(a, relax.Var) for a in call.args):
            return None
        a, b = (g.name(v) for v in call.args)
        if a == b or a is None or b is None:
            return None
        chains = [chain_ending_at(g, v, epilogues={(), ("bias",)}) for v in (a, b)]
        if not all(_mergeable_conv(c) for c in chains) or g.sole_user(a) != n or g.sole_user(b) != n:
            return None
        c1, c2 = chains
        if not (g.shape(n) == g.shape(a) == g.shape(b) and g.sig(a)[1] == g.sig(b)[1]):
            return None
        if tuple(c1.attrs["strides"]) != tuple(c2.attrs["strides"]) or \
                tuple(c1.attrs["dilation"]) != tuple(c2.attrs["dilation"]):
            return None
        s1, s2 = g.shape(c1.data), g.shape(c2.data)
        if s1 is None or s2 is None or (s1[0],) + s1[2:] != (s2[0],) + s2[2:]:
            return None
        if not isinstance(_align(g, chains), Alignment):
            return None
        return chains

    def matches(self, g: DataflowGraph, allowed: set[str] | None) -> list[Match]:
        out = []
        for n in g.order:
            chains = self._pair(g, n)
            if chains is None:
                continue
            nodes = [n] + [m for c in chains for m in c.nodes]
            if allowed is None or set(nodes) <= allowed:
                out.append(Match(self.name, g.sorted(nodes)))
        return out

    def rewrite(self, g: DataflowGraph, match: Match):
        add = match.nodes[-1]  # it reads both chains, so it comes last
        chains = self._pair(g, add)
        al = _align(g, chains)
        assert isinstance(al, Alignment)
        w = np.concatenate([al.place(c.weight, i) for i, c in enumerate(chains)], axis=1)
        biases = [c.bias_value for c in chains if c.bias_value is not None]
        b = np.sum(biases, axis=0, dtype=np.float64).astype(biases[0].dtype) if biases else None

        def build(em: Emitter, get):
            x = em.emit(relax.op.concat([get(chains[0].data), get(chains[1].data)], axis=1))
            return {add: emit_conv_chain(em, x, w, b, False, chains[0].attrs, al.padding, last_replaces=add)}

        return rewrite_main(g.mod, match.nodes, build, rule=self.name, prefix="mac_")
