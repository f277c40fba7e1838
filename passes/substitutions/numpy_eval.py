"""Evaluate a small Relax region with numpy: the fast oracle of the substitution proofs.

Why: a substitution is proved by running its region before and after the rewrite (:mod:`.check`). Building
both with TVM costs about 0.2 s a region (compile, VM setup, untuned loops), which was three quarters of the
AutoGraph search's time on NASNet. The rules only ever match and emit a handful of operators -- ``conv2d``,
``matmul``, ``add``, ``relu``, ``concat``, ``split`` -- so an interpreter of exactly those, in float32 numpy
(convolutions as one BLAS matmul over im2col patches), evaluates a region in milliseconds. A region with any
other operator or attribute is not guessed at: :func:`evaluate` raises :class:`Unsupported` and the proof
falls back to the TVM build. The shipped model is still TVM's build of the rewritten graph, compared with
plain TVM end to end by the tests; this oracle only decides whether a rewrite is algebraically right.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm import relax

from .graph import const_value, op_attrs

__all__ = ["Unsupported", "evaluate"]


class Unsupported(Exception):
    """The region uses an operator (or an attribute value) this interpreter does not implement."""


def evaluate(mod: tvm.IRModule, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs of ``mod["main"]`` on ``inputs`` (a tuple result flattened one level, like the VM's)."""
    fn = mod["main"]
    env: dict = {p: np.asarray(x) for p, x in zip(fn.params, inputs)}
    body = fn.body
    for block in body.blocks:
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding):
                raise Unsupported(f"binding {type(b).__name__}")
            env[b.var] = _value(b.value, env)
    out = _value(body.body, env)
    return [np.asarray(o) for o in out] if isinstance(out, tuple) else [np.asarray(out)]


def _value(e, env: dict):
    if isinstance(e, relax.Var):
        return env[e]
    value = const_value(e)
    if value is not None:
        return value
    if isinstance(e, relax.Tuple):
        return tuple(_value(f, env) for f in e.fields)
    if isinstance(e, relax.TupleGetItem):
        return _value(e.tuple_value, env)[int(e.index)]
    if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
        fn = _OPS.get(e.op.name)
        if fn is None:
            raise Unsupported(e.op.name)
        return fn([_value(a, env) for a in e.args], op_attrs(e))
    raise Unsupported(type(e).__name__)


def _ints(v) -> list[int]:
    return [int(x) for x in (v if isinstance(v, (list, tuple)) else [v])]


def _conv2d(args, a: dict) -> np.ndarray:
    x, w = args
    layouts = (a.get("data_layout", "NCHW"), a.get("kernel_layout", "OIHW"), a.get("out_layout", "NCHW"))
    if layouts != ("NCHW", "OIHW", "NCHW") or a.get("out_dtype") not in (None, "", "void", str(x.dtype)):
        raise Unsupported(f"conv2d {layouts} out_dtype={a.get('out_dtype')}")
    sh, sw = (_ints(a.get("strides", [1, 1])) * 2)[:2]
    dh, dw = (_ints(a.get("dilation", [1, 1])) * 2)[:2]
    pad = _ints(a.get("padding", [0, 0]))
    top, left, bottom, right = {1: pad * 4, 2: pad * 2, 4: pad}.get(len(pad), pad)[:4]
    groups = int(a.get("groups", 1))
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    ho = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    wo = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    # im2col: (n, c, kh, kw, ho, wo) views of the padded input
    cols = np.empty((n, c, kh, kw, ho, wo), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = xp[:, :, i * dh: i * dh + sh * (ho - 1) + 1: sh, j * dw: j * dw + sw * (wo - 1) + 1: sw]
    og = o // groups
    out = np.empty((n, o, ho, wo), dtype=x.dtype)
    for g in range(groups):
        patch = cols[:, g * cg:(g + 1) * cg].reshape(n, cg * kh * kw, ho * wo)
        wg = w[g * og:(g + 1) * og].reshape(og, cg * kh * kw)
        out[:, g * og:(g + 1) * og] = np.matmul(wg, patch).reshape(n, og, ho, wo)
    return out


def _split(args, a: dict):
    x, = args
    ind = a.get("indices_or_sections")
    axis = int(a.get("axis", 0))
    return tuple(np.split(x, ind if isinstance(ind, int) else _ints(ind), axis=axis))


def _concat(args, a: dict) -> np.ndarray:
    return np.concatenate(list(args[0]), axis=int(a.get("axis", 0)))


def _matmul(args, a: dict) -> np.ndarray:
    x, w = args
    if a.get("out_dtype") not in (None, "", "void", str(x.dtype)):
        raise Unsupported(f"matmul out_dtype={a.get('out_dtype')}")
    return np.matmul(x, w)


def _relu(args, a: dict) -> np.ndarray:
    return np.maximum(args[0], np.zeros((), dtype=args[0].dtype))


_OPS = {
    "relax.nn.conv2d": _conv2d,
    "relax.matmul": _matmul,
    "relax.add": lambda args, a: np.add(args[0], args[1]),
    "relax.nn.relu": _relu,
    "relax.concat": _concat,
    "relax.split": _split,
}
