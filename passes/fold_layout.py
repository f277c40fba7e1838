"""Layout transforms of constants folded with numpy, before TVM's ``FoldConstant`` compiles a kernel for each.

Why: the channel-blocked layout (``passes.layout``) turns every blocked convolution's weight and bias into
``relax.layout_transform(constant)``. TVM's ``FoldConstant`` folds each one by legalizing it, compiling the
kernel with LLVM and running it, one build per distinct shape: NASNet-A-large's 362 transforms took 20.6 s of
its 30 s ``prepare`` on the 2-core build machine. A layout transform of a constant only moves its elements, and
numpy moves them with one scattered assignment. (``IndexMap.map_tensor``, TVM's own evaluator, maps element by
element: 489 s for the same 362.)

How: the index map's output indices — ``floordiv``, ``floormod``, ``+``, ``-``, ``*`` of the input's indices and
integers, which is what ``ConvertLayout`` writes (``OIHW -> OIHW16i16o``, ``NCHW -> NCHW16c``) — are evaluated on
numpy index grids of the input's shape, and every element is written to its place. A transform whose map has
another expression, a pad value, or does not place the input's elements one to one onto the output's (padding)
is left as it is, for ``FoldConstant``: nothing is folded that is not an exact permutation.
"""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax, tirx

_LAYOUT_TRANSFORM = "relax.layout_transform"


def _evaluate(expr, grids: dict):
    """A PrimExpr of the index variables on numpy grids, or None for what is not index arithmetic."""
    if isinstance(expr, tirx.Var):
        return grids.get(expr.name)
    if isinstance(expr, tirx.IntImm):
        return np.int64(expr.value)
    ops = {tirx.FloorDiv: np.floor_divide, tirx.FloorMod: np.mod, tirx.Add: np.add, tirx.Sub: np.subtract,
           tirx.Mul: np.multiply}
    fn = next((f for cls, f in ops.items() if isinstance(expr, cls)), None)
    if fn is None:
        return None
    a, b = _evaluate(expr.a, grids), _evaluate(expr.b, grids)
    return None if a is None or b is None else fn(a, b)


def transform_constant(index_map: "tirx.IndexMap", data: np.ndarray) -> np.ndarray | None:
    """``data`` laid out by ``index_map``, or None when the map is not an exact permutation of its elements."""
    names = [v.name for v in index_map.initial_indices]
    if len(names) != data.ndim or len(set(names)) != len(names):
        return None
    out_shape = tuple(int(d) for d in index_map.map_shape(list(data.shape)))
    if math.prod(out_shape) != data.size or data.size == 0:
        return None
    grids = dict(zip(names, np.indices(data.shape, dtype=np.int64, sparse=True)))
    places = []
    for expr, extent in zip(index_map.final_indices, out_shape):
        idx = _evaluate(expr, grids)
        if idx is None:
            return None
        idx = np.broadcast_to(idx, data.shape)
        if idx.min() < 0 or idx.max() >= extent:
            return None
        places.append(idx)
    flat = np.ravel_multi_index(tuple(p.ravel() for p in places), out_shape)
    if np.bincount(flat, minlength=data.size).max() != 1:   # two elements to one place: not a permutation
        return None
    out = np.empty(data.size, dtype=data.dtype)
    out[flat] = data.ravel()
    return out.reshape(out_shape)


def fold_constant_layout_transforms(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """``mod`` with every exact layout transform of a constant replaced by its result; and how many there were."""
    op = tvm.ir.Op.get(_LAYOUT_TRANSFORM)
    const_type = tvm.ir.expr.GenericConst
    folded = [0]

    @relax.expr_functor.mutator
    class _Fold(relax.PyExprMutator):
        def visit_call_(self, call):  # noqa: N802 - TVM's visitor name
            call = super().visit_call_(call)
            if not (isinstance(call, relax.Call) and call.op.same_as(op) and isinstance(call.args[0], const_type)
                    and call.attrs.pad_value is None):
                return call
            out = transform_constant(call.attrs.index_map, call.args[0].value.numpy())
            if out is None:
                return call
            folded[0] += 1
            return relax.const(out, str(out.dtype))

    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            body = _Fold().visit_expr(func.body)
            new = relax.Function(list(func.params), body, func.ret_ty, func.is_pure)
            out[gv] = new.with_attrs(dict(func.attrs)) if func.attrs else new
    return out, folded[0]
