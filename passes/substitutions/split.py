"""The inverses of merging, for a device the graph under-fills: one operator becomes two independent halves
over the same input (which a parallel schedule can run side by side), concatenated again.

* ``split_conv``: a conv2d chain (with its bias add / relu) -> two chains on the two halves of the output
  channels + ``concat(axis=1)``; exactly undone by ``merge_concat_convs``.
* ``split_matmul``: a matmul chain -> two chains on the two halves of the output features + ``concat`` on the
  last axis (``merge_shared_input_matmuls`` merges the halves again, leaving a split + concat).

Only halves are offered (``params = (N/2, N/2)``) to keep the search space small, and only for at least
``2 * MIN_SPLIT_CHANNELS`` output channels: a half narrower than that is too small a kernel to be worth a
launch.
"""
from __future__ import annotations

from tvm import relax

from .base import Match, Rule, register
from .chains import Chain, chain_at
from .graph import DataflowGraph, Emitter, rewrite_main
from .matmuls import emit_matmul_chain
from .merge_convs import emit_conv_chain

__all__ = ["MIN_SPLIT_CHANNELS", "SplitConv", "SplitMatmul"]

#: the narrowest half a split may produce
MIN_SPLIT_CHANNELS = 16


class _Split(Rule):
    kind = ""

    def _chain(self, g: DataflowGraph, n: str) -> Chain | None:
        c = chain_at(g, n)
        if c is None or c.kind != self.kind or c.channels % 2 or c.channels < 2 * MIN_SPLIT_CHANNELS:
            return None
        if self.kind == "conv2d" and int(c.attrs["groups"]) != 1:
            return None
        return c

    def matches(self, g: DataflowGraph, allowed: set[str] | None) -> list[Match]:
        out = []
        for n in g.order:
            c = self._chain(g, n)
            if c is not None and (allowed is None or set(c.nodes) <= allowed):
                out.append(Match(self.name, g.sorted(c.nodes), (c.channels // 2, c.channels // 2)))
        return out

    def rewrite(self, g: DataflowGraph, match: Match):
        c = self._chain(g, match.nodes[0])
        half = match.params[0]
        if self.kind == "conv2d":
            ws = [c.weight[:half], c.weight[half:]]
        else:
            ws = [c.weight[:, :half], c.weight[:, half:]]
        bs = [c.bias_value[:half], c.bias_value[half:]] if c.bias else [None, None]
        axis = 1 if self.kind == "conv2d" else len(g.shape(c.head)) - 1

        def build(em: Emitter, get):
            x = get(c.data)
            if self.kind == "conv2d":
                parts = [emit_conv_chain(em, x, w, b, bool(c.relu), c.attrs, c.attrs["padding"])
                         for w, b in zip(ws, bs)]
            else:
                parts = [emit_matmul_chain(em, x, w, b, bool(c.relu)) for w, b in zip(ws, bs)]
            return {c.out: em.emit(relax.op.concat(parts, axis=axis), replaces=c.out)}

        return rewrite_main(g.mod, match.nodes, build, rule=self.name, prefix=f"{self.name}_")


@register
class SplitConv(_Split):
    name = "split_conv"
    kind = "conv2d"
    operators = ("relax.nn.conv2d", "relax.add", "relax.nn.relu")
    legality = (f"a conv2d chain (constant OIHW weight, groups == 1, optional constant bias add and relu, each "
                f"read only by the next) with an even number of output channels, at least "
                f"{2 * MIN_SPLIT_CHANNELS}; params = the two halves")
    inverse_of = "merge_concat_convs"


@register
class SplitMatmul(_Split):
    name = "split_matmul"
    kind = "matmul"
    operators = ("relax.matmul", "relax.add", "relax.nn.relu")
    legality = (f"a matmul chain (constant 2-D weight, optional constant bias add and relu, each read only by "
                f"the next) with an even number of output features, at least {2 * MIN_SPLIT_CHANNELS}; params = "
                f"the two halves")
    inverse_of = None

