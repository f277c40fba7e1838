"""``merge_shared_input_matmuls``: dense layers reading one tensor become one wider dense layer + ``split``
(the matmul analogue of ``merge_shared_input_convs``):

    y_i = epi(matmul(x, W_i) [+ b_i])  ==>  (y_1, ..., y_k) = split(epi(matmul(x, [W_1 ... W_k]) [+ [b_1 ... b_k]]), -1)

The frontends' dense layers are ``matmul(x, W)`` with a constant ``(K, N)`` weight and an ``add`` of a ``(N,)``
or ``(1, N)`` bias (the zoo's ``NetBuilder.dense``; ONNX ``Gemm`` after ``FoldConstant`` folds its
``permute_dims`` of the weight). ``relax.linear`` is not an operator of its own: it is emitted as these.
"""
from __future__ import annotations

from itertools import combinations

import numpy as np
from tvm import relax

from .base import Match, Rule, register
from .chains import Chain, chain_at
from .graph import DataflowGraph, Emitter, rewrite_main

__all__ = ["MergeSharedInputMatmuls", "emit_matmul_chain", "matmul_chains_of"]

MAX_PAIR_GROUP = 8


def emit_matmul_chain(em: Emitter, data, weight: np.ndarray, bias: np.ndarray | None, relu: bool,
                      last_replaces: str | None = None):
    """Emit matmul(data, weight) [+ bias] [relu]; the last binding ``replaces=last_replaces``."""
    steps = [lambda x: relax.op.matmul(x, relax.const(np.ascontiguousarray(weight)))]
    if bias is not None:
        steps.append(lambda x: relax.op.add(x, relax.const(np.ascontiguousarray(bias.reshape(-1)))))
    if relu:
        steps.append(relax.op.nn.relu)
    cur = data
    for k, step in enumerate(steps):
        cur = em.emit(step(cur), replaces=last_replaces if k == len(steps) - 1 else None)
    return cur


def _key(g: DataflowGraph, c: Chain) -> tuple:
    shape, dtype = g.sig(c.head)
    return (c.data, dtype, shape[:-1], c.epilogue)


def matmul_chains_of(g: DataflowGraph, match: Match) -> list[Chain]:
    nodes = set(match.nodes)
    out = []
    for n in match.nodes:
        c = chain_at(g, n)
        if c is not None and c.head == n and c.kind == "matmul":
            out.append(c.truncated(tuple(e for e, m in (("bias", c.bias), ("relu", c.relu)) if m and m in nodes)))
    return out


@register
class MergeSharedInputMatmuls(Rule):
    name = "merge_shared_input_matmuls"
    operators = ("relax.matmul", "relax.add", "relax.nn.relu")
    legality = ("two or more matmul(x, W) with the same data x and constant 2-D weights (K, N_i), the same dtype "
                "and epilogue (none, constant (N,) / (1, N) bias add, relu, or both; each step read only by the "
                "next); offered: every pair and the maximal set per input tensor (pairs only up to 8 members)")
    inverse_of = None

    def matches(self, g: DataflowGraph, allowed: set[str] | None) -> list[Match]:
        groups: dict[tuple, list[Chain]] = {}
        for n in g.order:
            c = chain_at(g, n)
            if c is None or c.kind != "matmul" or (allowed is not None and not set(c.nodes) <= allowed):
                continue
            groups.setdefault(_key(g, c), []).append(c)
        out = []
        for members in groups.values():
            if len(members) < 2:
                continue
            cands = [members]
            if 2 < len(members) <= MAX_PAIR_GROUP:
                cands += [list(p) for p in combinations(members, 2)]
            out += [Match(self.name, g.sorted(n for c in cs for n in c.nodes)) for cs in cands]
        return out

    def rewrite(self, g: DataflowGraph, match: Match):
        chains = matmul_chains_of(g, match)
        w = np.concatenate([c.weight for c in chains], axis=1)
        b = np.concatenate([c.bias_value for c in chains]) if chains[0].bias else None
        sizes = [c.channels for c in chains]
        axis = len(g.shape(chains[0].head)) - 1

        def build(em: Emitter, get):
            y = emit_matmul_chain(em, get(chains[0].data), w, b, bool(chains[0].relu))
            parts = em.emit(relax.op.split(y, [int(v) for v in np.cumsum(sizes)[:-1]], axis=axis))
            return {c.out: em.emit(relax.TupleGetItem(parts, i), replaces=c.out) for i, c in enumerate(chains)}

        return rewrite_main(g.mod, match.nodes, build, rule=self.name, prefix="msim_")
