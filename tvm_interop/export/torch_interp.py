"""Relax (high-level, static shapes) -> a ``torch.nn.Module`` running the same graph with ``torch.nn.functional``.

The module is a ``torch.fx.GraphModule``: its ``forward`` is straight-line generated code, one torch call per Relax
operator (``print(module.code)`` shows it), with the Relax constants registered as buffers (bit-identical copies:
``module.state_dict()``). It is "the same architecture in torch": eager PyTorch runs exactly these operators, with
its own kernels, and nothing is fused.

Where torch's functional API cannot express a Relax attribute directly, the call is preceded by an explicit pad:

* ``nn.conv2d`` with asymmetric padding: ``F.pad`` (zeros) then ``F.conv2d(padding=0)``;
* ``nn.max_pool2d`` with asymmetric padding or padding > kernel // 2: ``F.pad`` with ``-inf`` then
  ``F.max_pool2d(padding=0)``;
* ``nn.avg_pool2d`` with such padding: ``count_include_pad=True`` -> ``F.pad`` (zeros) then ``F.avg_pool2d``;
  ``count_include_pad=False`` -> ``F.avg_pool2d(F.pad(x))`` times a constant buffer ``k*k / valid-cells`` per
  output position.

This module and its package's ``__init__`` import nothing from TVM or from the ``tvm_interop`` package at module
level (reading a Relax module imports TVM lazily): the GPU check replays a model's graph JSON
(``graph_from_json``) with :func:`graph_to_torch` on a machine that has TVM's runtime only, loading
``tvm_interop/export`` on its own (``scripts/gpucheck/torch_replay.py``; ``tests/test_gpu_check_script.py`` blocks
the compiler-only modules while it does). Keep new imports here function-local or relative.
"""
from __future__ import annotations

import operator

import numpy as np

from tvm_interop.runtime.errors import UnsupportedModelError

from . import RelaxGraph, read_relax

__all__ = ["to_torch", "graph_to_torch"]


def _torch_dtype(torch, dtype: str):
    try:
        return getattr(torch, np.dtype(dtype).name)
    except (AttributeError, TypeError):
        raise UnsupportedModelError(f"dtype {dtype!r} has no torch equivalent") from None


def graph_to_torch(g: RelaxGraph):
    """A :class:`~tvm_interop.export.RelaxGraph` as a ``torch.fx.GraphModule``."""
    import torch
    import torch.fx as fx
    import torch.nn.functional as F

    root = torch.nn.Module()
    graph = fx.Graph()
    env: dict = {}
    for name, _, _ in g.inputs:
        env[name] = graph.placeholder(_py_name(name))
    n_buf = [0]

    def buffer(arr, base: str):
        """Register ``arr`` as a buffer and return the get_attr node."""
        bname = _py_name(base)
        while hasattr(root, bname):
            n_buf[0] += 1
            bname = f"{_py_name(base)}_{n_buf[0]}"
        root.register_buffer(bname, torch.from_numpy(np.array(arr, copy=True)))
        return graph.get_attr(bname)

    for cname, arr in g.constants.items():
        env[cname] = buffer(arr, cname)

    shapes = {n: s for n, s, _ in g.inputs}
    shapes.update({k: v.shape for k, v in g.constants.items()})

    def call(fn, *args, **kwargs):
        return graph.call_function(fn, args, kwargs)

    binary = {"add": torch.add, "subtract": torch.sub, "multiply": torch.mul, "divide": torch.div,
              "maximum": torch.maximum, "minimum": torch.minimum, "power": torch.pow}
    unary = {"nn.relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
             "sqrt": torch.sqrt, "negative": torch.neg, "nn.silu": F.silu, "nn.gelu": F.gelu, "nn.relu6": F.relu6}
    reduce = {"mean": torch.mean, "sum": torch.sum, "max": torch.amax, "min": torch.amin}

    for n in g.nodes:
        op, a = n.op, n.attrs
        x = [env[i] for i in n.inputs] if op != "concat" else [[env[i] for i in n.inputs[0]]]
        if op in binary:
            y = call(binary[op], x[0], x[1])
        elif op in unary:
            y = call(unary[op], x[0])
        elif op == "clip":
            y = call(torch.clamp, x[0], a["min"], a["max"])
        elif op == "nn.leakyrelu":
            y = call(F.leaky_relu, x[0], a["alpha"])
        elif op == "nn.softmax":
            y = call(F.softmax, x[0], dim=a["axis"])
        elif op == "nn.log_softmax":
            y = call(F.log_softmax, x[0], dim=a["axis"])
        elif op == "astype":
            y = graph.call_method("to", (x[0], _torch_dtype(torch, a["dtype"])))
        elif op == "nn.conv2d":
            t, l, b, r = a["padding"]
            inp = x[0]
            if t == b and l == r:
                pad = (t, l)
            else:
                inp, pad = call(F.pad, inp, [l, r, t, b]), (0, 0)
            y = call(F.conv2d, inp, x[1], None, tuple(a["strides"]), pad, tuple(a["dilation"]), a["groups"])
        elif op in ("nn.max_pool2d", "nn.avg_pool2d"):
            y = _pool(torch, F, call, buffer, n, x[0], shapes[n.inputs[0]])
        elif op == "nn.adaptive_avg_pool2d":
            y = call(F.adaptive_avg_pool2d, x[0], tuple(a["output_size"]))
        elif op == "concat":
            y = call(torch.cat, x[0], dim=a["axis"])
        elif op in reduce:
            y = call(reduce[op], x[0], dim=tuple(a["axes"]), keepdim=a["keepdims"])
        elif op in ("reshape", "flatten", "squeeze", "expand_dims"):
            y = call(torch.reshape, x[0], tuple(a["shape"]))
        elif op == "matmul":
            y = call(torch.matmul, x[0], x[1])
        elif op == "permute_dims":
            y = call(torch.permute, x[0], tuple(a["axes"]))
        elif op == "strided_slice":
            idx = [slice(None)] * len(shapes[n.inputs[0]])
            for ax, b, e, s in zip(a["axes"], a["begin"], a["end"], a["strides"]):
                idx[ax] = slice(b, e, s)
            y = call(operator.getitem, x[0], tuple(idx))
        elif op == "nn.pad":
            flat = []
            for before, after in reversed(a["pad_width"]):
                flat += [before, after]
            y = call(F.pad, x[0], flat, "constant", a["value"])
        else:  # pragma: no cover - read_relax only lets supported ops through
            raise UnsupportedModelError(f"operator 'relax.{op}' (binding {n.name!r}) has no torch mapping")
        env[n.name] = y
        shapes[n.name] = n.shape

    outs = [env[o] for o in g.outputs]
    graph.output(tuple(outs) if g.tuple_output else outs[0])
    gm = fx.GraphModule(root, graph, class_name=_py_name(g.name).capitalize() or "Model")
    gm.eval()
    return gm


def _pool(torch, F, call, buffer, n, x, in_shape):
    a = n.attrs
    k, s, d = tuple(a["kernel"]), tuple(a["strides"]), tuple(a["dilation"])
    t, l, b, r = a["padding"]
    eff = (d[0] * (k[0] - 1) + 1, d[1] * (k[1] - 1) + 1)
    native = t == b and l == r and t <= eff[0] // 2 and l <= eff[1] // 2
    if n.op == "nn.max_pool2d":
        if native:
            return call(F.max_pool2d, x, k, s, (t, l), d)
        return call(F.max_pool2d, call(F.pad, x, [l, r, t, b], "constant", float("-inf")), k, s, 0, d)
    cip = a["count_include_pad"]
    if native and (t, l) == (0, 0):
        return call(F.avg_pool2d, x, k, s, 0)
    if native:
        return call(F.avg_pool2d, x, k, s, (t, l), False, cip)
    y = call(F.avg_pool2d, call(F.pad, x, [l, r, t, b]), k, s, 0)
    if cip:
        return y
    # divide by the number of valid (non-padding) cells instead of k*k
    ones = torch.ones((1, 1) + tuple(in_shape[2:]), dtype=torch.float64)
    frac = torch.nn.functional.avg_pool2d(torch.nn.functional.pad(ones, [l, r, t, b]), k, s, 0)
    scale = (1.0 / frac).to(_torch_dtype(torch, n.dtype))
    return call(torch.mul, y, buffer(scale.numpy(), f"{n.name}_valid_scale"))


def _py_name(name: str) -> str:
    out = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in str(name))
    if not out or out[0].isdigit():
        out = "t_" + out
    return out


def to_torch(mod):
    """``torch.nn.Module`` (``torch.fx.GraphModule``, eval mode) computing ``mod['main']``; weights as buffers.

    Raises :class:`runtime.errors.UnsupportedModelError` naming an operator it cannot reproduce.
    """
    return graph_to_torch(read_relax(mod))
