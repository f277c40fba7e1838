"""Linear-operator chains the rules work on: ``conv2d`` / ``matmul`` with a constant weight, optionally
followed by a constant bias ``add`` and a ``relu`` (each read only by the next, so the chain can be consumed
as a whole), and the kernel alignment that lets convolutions of different kernel sizes share one kernel.

Patterns come from TVM's dataflow-pattern language (``tvm.relax.dpl``); the chain walk itself follows the
graph's single-user edges, which the patterns cannot express.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, wildcard

from .graph import DataflowGraph, const_value, op_attrs

__all__ = ["Alignment", "Chain", "align_kernels", "chain_at", "chain_ending_at", "conv_out_size"]

CONV_PATTERN = is_op("relax.nn.conv2d")(wildcard(), is_const())
MATMUL_PATTERN = is_op("relax.matmul")(wildcard(), is_const())
BIAS_PATTERN = is_op("relax.add")(wildcard(), is_const()) | is_op("relax.add")(is_const(), wildcard())
RELU_PATTERN = is_op("relax.nn.relu")(wildcard())


@dataclass
class Chain:
    """``head`` (conv2d or matmul) [-> ``bias`` add] [-> ``relu``]; ``epilogue`` names what follows the head."""

    kind: str                       # "conv2d" | "matmul"
    head: str
    data: str                       # the tensor the head reads
    weight: np.ndarray              # OIHW for conv2d, (K, N) for matmul
    attrs: dict
    bias: str | None = None
    bias_value: np.ndarray | None = None   # flat (C,)
    relu: str | None = None

    @property
    def epilogue(self) -> tuple[str, ...]:
        return (("bias",) if self.bias else ()) + (("relu",) if self.relu else ())

    @property
    def nodes(self) -> list[str]:
        return [n for n in (self.head, self.bias, self.relu) if n]

    @property
    def out(self) -> str:
        return self.nodes[-1]

    @property
    def channels(self) -> int:
        return int(self.weight.shape[0] if self.kind == "conv2d" else self.weight.shape[1])

    def truncated(self, epilogue: tuple[str, ...]) -> Chain:
        """The same chain cut to ``epilogue`` (a prefix of its own)."""
        keep_bias = "bias" in epilogue
        keep_relu = "relu" in epilogue
        return Chain(self.kind, self.head, self.data, self.weight, self.attrs,
                     self.bias if keep_bias else None, self.bias_value if keep_bias else None,
                     self.relu if keep_relu else None)


def _head(g: DataflowGraph, name: str) -> tuple[str, np.ndarray, dict] | None:
    call = g.call(name)
    if call is None or not isinstance(call.args[0], relax.Var):
        return None
    if CONV_PATTERN.match(call):
        a = op_attrs(call)
        if (a.get("data_layout"), a.get("kernel_layout"), a.get("out_layout")) != ("NCHW", "OIHW", "NCHW"):
            return None
        _, dtype = g.sig(name)
        if a.get("out_dtype") not in (None, "", "void", dtype):
            return None
        w = const_value(call.args[1])
        if w is None or w.ndim != 4 or g.shape(name) is None or len(g.shape(name)) != 4:
            return None
        return "conv2d", w, a
    if MATMUL_PATTERN.match(call):
        a = op_attrs(call)
        _, dtype = g.sig(name)
        if a.get("out_dtype") not in (None, "", "void", dtype):
            return None
        w = const_value(call.args[1])
        shape = g.shape(name)
        if w is None or w.ndim != 2 or shape is None or len(shape) < 2:
            return None
        return "matmul", w, a
    return None


def _bias_of(g: DataflowGraph, add: str, src: str, kind: str, channels: int) -> np.ndarray | None:
    call = g.call(add)
    if call is None or not BIAS_PATTERN.match(call):
        return None
    var_args = [a for a in call.args if isinstance(a, relax.Var)]
    if len(var_args) != 1 or g.name(var_args[0]) != src:
        return None
    b = next(const_value(a) for a in call.args if not isinstance(a, relax.Var))
    if g.shape(add) != g.shape(src) or b.dtype != np.dtype(g.sig(src)[1]):
        return None
    ok = (b.shape in ((1, channels, 1, 1), (channels, 1, 1)) if kind == "conv2d"
          else b.shape in ((channels,), (1, channels)))
    return b.reshape(-1) if ok else None


def chain_at(g: DataflowGraph, head: str) -> Chain | None:
    """The longest chain starting at ``head`` (None when ``head`` is not a conv2d/matmul with a constant
    weight in NCHW/OIHW)."""
    h = _head(g, head)
    if h is None:
        return None
    kind, w, a = h
    data = g.name(g.call(head).args[0])
    chain = Chain(kind, head, data, w, a)
    cur = head
    nxt = g.sole_user(cur)
    if nxt is not None:
        b = _bias_of(g, nxt, cur, kind, chain.channels)
        if b is not None:
            chain.bias, chain.bias_value = nxt, b
            cur = nxt
            nxt = g.sole_user(cur)
    if nxt is not None and g.call(nxt) is not None and RELU_PATTERN.match(g.call(nxt)):
        chain.relu = nxt
    return chain


def chain_ending_at(g: DataflowGraph, name: str, epilogues=None) -> Chain | None:
    """The chain whose last node is ``name`` (cut so), or None; ``epilogues`` limits the allowed epilogues."""
    cands = [name]
    for _ in range(2):
        ins = g.inputs.get(cands[-1], ())
        if not ins or ins[0] not in g.var:
            break
        cands.append(ins[0])
    for head in cands:
        c = chain_at(g, head)
        if c is None or name not in c.nodes:
            continue
        c = c.truncated(tuple(e for e, n in (("bias", c.bias), ("relu", c.relu))
                              if n and c.nodes.index(n) <= c.nodes.index(name)))
        if c.out != name:
            continue
        if epilogues is not None and c.epilogue not in epilogues:
            return None
        return c
    return None


def conv_out_size(size: int, k: int, s: int, d: int, lo: int, hi: int) -> int:
    return (size + lo + hi - d * (k - 1) - 1) // s + 1


@dataclass
class Alignment:
    """One kernel for several convolutions over equally sized inputs: each kernel is zero-padded into
    ``kernel`` at ``offsets[i]`` so that its taps read the same input pixels as before."""

    kernel: tuple[int, int]
    padding: tuple[int, int, int, int]      # (top, left, bottom, right)
    offsets: list[tuple[int, int]]

    def place(self, w: np.ndarray, i: int) -> np.ndarray:
        """``w`` (O, I, kh, kw) zero-padded into the common kernel at its offset."""
        out = np.zeros(w.shape[:2] + self.kernel, dtype=w.dtype)
        r, c = self.offsets[i]
        out[:, :, r:r + w.shape[2], c:c + w.shape[3]] = w
        return out


def align_kernels(chains: list[Chain], in_hw: tuple[int, int], out_hw: tuple[int, int]) -> Alignment | str:
    """The common kernel of ``chains`` (conv2d, equal strides and dilation), or the reason there is none.

    Same algebra as ``passes.merge.mergeable``: per axis, the merged top padding is the largest, each kernel
    sits ``(P - p_i) / dilation`` taps in (must be whole), and the bottom padding is what reproduces the
    common output size.
    """
    s = chains[0].attrs["strides"]
    d = chains[0].attrs["dilation"]
    kernel, lo_pad, hi_pad = [], [], []
    offs = [[0, 0] for _ in chains]
    for ax in range(2):
        los = [int(c.attrs["padding"][ax]) for c in chains]
        ks = [int(c.weight.shape[2 + ax]) for c in chains]
        P = max(los)
        K = 0
        for i, c in enumerate(chains):
            if (P - los[i]) % d[ax]:
                return f"{c.head}: padding {los[i]} cannot be aligned with {P} at dilation {d[ax]}"
            offs[i][ax] = (P - los[i]) // d[ax]
            K = max(K, offs[i][ax] + ks[i])
        span = d[ax] * (K - 1) + 1
        hi = max(0, s[ax] * (out_hw[ax] - 1) + span - in_hw[ax] - P)
        if conv_out_size(in_hw[ax], K, s[ax], d[ax], P, hi) != out_hw[ax]:
            return f"the merged {K}-tap kernel would change the output size along {'HW'[ax]}"
        kernel.append(K)
        lo_pad.append(P)
        hi_pad.append(hi)
    return Alignment((kernel[0], kernel[1]), (lo_pad[0], lo_pad[1], hi_pad[0], hi_pad[1]),
                     [(a, b) for a, b in offs])
