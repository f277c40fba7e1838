"""Relax (high-level, static shapes) -> ONNX, with ``onnx.helper``.

One ONNX node per Relax operator (a few decompose into 2-5 nodes: ``nn.silu``, ``nn.gelu``), tensors named after
the Relax variables, weights as initializers (bit-identical). Opset 17 by default (ONNX Runtime >= 1.13).

Mapping (``tvm_interop.export.read_relax`` has already normalised the attributes and refused what it cannot map):

- ``nn.conv2d`` -> ``Conv``: Relax padding (top, left, bottom, right) is ONNX's ``[x1_begin, x2_begin, x1_end,
  x2_end]`` order; ``strides``, ``dilations``, ``group``.
- ``nn.max_pool2d`` -> ``MaxPool`` (``dilations``; ``ceil_mode`` already turned into explicit trailing padding);
  ``nn.avg_pool2d`` -> ``AveragePool`` (``count_include_pad``).
- ``nn.adaptive_avg_pool2d`` -> ``GlobalAveragePool`` for a 1x1 output, ``AveragePool`` (kernel = stride = in / out)
  when the output divides the input, ``Identity`` for output = input; uneven windows are refused.
- ``mean`` / ``max`` / ``min`` -> ``ReduceMean`` / ``ReduceMax`` / ``ReduceMin`` (``axes`` attribute below opset 18,
  input from 18); ``sum`` -> ``ReduceSum`` (``axes`` input).
- ``reshape`` / ``flatten`` / ``squeeze`` / ``expand_dims`` -> ``Reshape`` to the static output shape.
- ``strided_slice`` -> ``Slice`` (starts / ends / axes / steps initializers, clamped on the static shape);
  ``nn.pad`` -> ``Pad`` (constant mode); ``concat`` -> ``Concat``; ``matmul`` -> ``MatMul``;
  ``permute_dims`` -> ``Transpose``; ``astype`` -> ``Cast``.
- elementwise: ``Add Sub Mul Div Max Min Pow``, ``Relu Sigmoid Tanh Exp Sqrt Neg``, ``clip`` / ``nn.relu6`` ->
  ``Clip``, ``LeakyRelu``, ``Softmax``, ``LogSoftmax``; ``nn.silu`` = x * Sigmoid(x); ``nn.gelu`` =
  0.5 x (1 + Erf(x / sqrt 2)).
"""
from __future__ import annotations

import math

import numpy as np

from tvm_interop.runtime.errors import UnsupportedModelError

from . import RelaxGraph, read_relax

__all__ = ["to_onnx", "graph_to_onnx"]

_BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "maximum": "Max",
           "minimum": "Min", "power": "Pow"}
_UNARY = {"nn.relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "exp": "Exp", "sqrt": "Sqrt",
          "negative": "Neg"}
_REDUCE = {"mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "sum": "ReduceSum"}


class _Emitter:
    def __init__(self, g: RelaxGraph, opset: int):
        from onnx import helper, numpy_helper

        self.helper = helper
        self.numpy_helper = numpy_helper
        self.g = g
        self.opset = opset
        self.nodes: list = []
        self.inits: list = []
        self.used = set(g.tensor_names)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name

    def init(self, base: str, arr) -> str:
        name = self.fresh(base)
        self.inits.append(self.numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(self, op: str, inputs, outputs, name: str, **attrs) -> None:
        self.nodes.append(self.helper.make_node(op, list(inputs), list(outputs), name=name, **attrs))

    def emit(self, n) -> None:
        op, x, out, nm = n.op, n.inputs, n.name, n.name
        a = n.attrs
        if op in _BINARY:
            self.node(_BINARY[op], x, [out], nm)
        elif op in _UNARY:
            self.node(_UNARY[op], x, [out], nm)
        elif op == "nn.relu6":
            lo = self.init(f"{nm}_min", np.array(0.0, dtype=n.dtype))
            hi = self.init(f"{nm}_max", np.array(6.0, dtype=n.dtype))
            self.node("Clip", [x[0], lo, hi], [out], nm)
        elif op == "clip":
            lo = self.init(f"{nm}_min", np.array(a["min"], dtype=n.dtype))
            hi = self.init(f"{nm}_max", np.array(a["max"], dtype=n.dtype))
            self.node("Clip", [x[0], lo, hi], [out], nm)
        elif op == "nn.silu":
            s = self.fresh(f"{nm}_sigmoid")
            self.node("Sigmoid", x, [s], s)
            self.node("Mul", [x[0], s], [out], nm)
        elif op == "nn.gelu":
            c = self.init(f"{nm}_sqrt2", np.array(math.sqrt(2.0), dtype=n.dtype))
            one = self.init(f"{nm}_one", np.array(1.0, dtype=n.dtype))
            half = self.init(f"{nm}_half", np.array(0.5, dtype=n.dtype))
            t = [self.fresh(f"{nm}_{s}") for s in ("div", "erf", "add", "mul")]
            self.node("Div", [x[0], c], [t[0]], t[0])
            self.node("Erf", [t[0]], [t[1]], t[1])
            self.node("Add", [t[1], one], [t[2]], t[2])
            self.node("Mul", [x[0], t[2]], [t[3]], t[3])
            self.node("Mul", [t[3], half], [out], nm)
        elif op == "nn.leakyrelu":
            self.node("LeakyRelu", x, [out], nm, alpha=a["alpha"])
        elif op in ("nn.softmax", "nn.log_softmax"):
            self.node("Softmax" if op == "nn.softmax" else "LogSoftmax", x, [out], nm, axis=a["axis"])
        elif op == "astype":
            self.node("Cast", x, [out], nm, to=self.helper.np_dtype_to_tensor_dtype(np.dtype(a["dtype"])))
        elif op == "nn.conv2d":
            self.node("Conv", x, [out], nm, kernel_shape=a["kernel"], strides=a["strides"],
                      pads=list(a["padding"]), dilations=a["dilation"], group=a["groups"])
        elif op == "nn.max_pool2d":
            self.node("MaxPool", x, [out], nm, kernel_shape=a["kernel"], strides=a["strides"],
                      pads=list(a["padding"]), dilations=a["dilation"])
        elif op == "nn.avg_pool2d":
            self.node("AveragePool", x, [out], nm, kernel_shape=a["kernel"], strides=a["strides"],
                      pads=list(a["padding"]), count_include_pad=int(a["count_include_pad"]))
        elif op == "nn.adaptive_avg_pool2d":
            self._adaptive(n)
        elif op == "concat":
            self.node("Concat", x[0], [out], nm, axis=a["axis"])
        elif op in _REDUCE:
            keep = int(a["keepdims"])
            if op == "sum":
                axes = self.init(f"{nm}_axes", np.array(a["axes"], dtype=np.int64))
                self.node("ReduceSum", [x[0], axes], [out], nm, keepdims=keep)
            elif self.opset >= 18:
                axes = self.init(f"{nm}_axes", np.array(a["axes"], dtype=np.int64))
                self.node(_REDUCE[op], [x[0], axes], [out], nm, keepdims=keep)
            else:
                self.node(_REDUCE[op], x, [out], nm, axes=a["axes"], keepdims=keep)
        elif op in ("reshape", "flatten", "squeeze", "expand_dims"):
            shape = self.init(f"{nm}_shape", np.array(a["shape"], dtype=np.int64))
            self.node("Reshape", [x[0], shape], [out], nm)
        elif op == "matmul":
            self.node("MatMul", x, [out], nm)
        elif op == "permute_dims":
            self.node("Transpose", x, [out], nm, perm=a["axes"])
        elif op == "strided_slice":
            ins = [x[0]] + [self.init(f"{nm}_{k}", np.array(a[k], dtype=np.int64))
                            for k in ("begin", "end", "axes", "strides")]
            self.node("Slice", ins, [out], nm)
        elif op == "nn.pad":
            pw = a["pad_width"]
            pads = self.init(f"{nm}_pads", np.array([p[0] for p in pw] + [p[1] for p in pw], dtype=np.int64))
            val = self.init(f"{nm}_value", np.array(a["value"], dtype=n.dtype))
            self.node("Pad", [x[0], pads, val], [out], nm, mode="constant")
        else:  # pragma: no cover - read_relax only lets supported ops through
            raise UnsupportedModelError(f"operator 'relax.{op}' (binding {nm!r}) has no ONNX mapping")

    def _adaptive(self, n) -> None:
        x, out, nm = n.inputs[0], n.name, n.name
        oh, ow = n.attrs["output_size"]
        ih, iw = self._in_shape(x)[2:]
        if (oh, ow) == (1, 1):
            self.node("GlobalAveragePool", [x], [out], nm)
        elif (oh, ow) == (ih, iw):
            self.node("Identity", [x], [out], nm)
        elif ih % oh == 0 and iw % ow == 0:
            k = [ih // oh, iw // ow]
            self.node("AveragePool", [x], [out], nm, kernel_shape=k, strides=k)
        else:
            raise UnsupportedModelError(
                f"relax.nn.adaptive_avg_pool2d (binding {nm!r}): output {oh}x{ow} of a {ih}x{iw} input (uneven "
                "windows) has no ONNX equivalent")

    def _in_shape(self, ref: str):
        for n, s, _ in self.g.inputs:
            if n == ref:
                return s
        if ref in self.g.constants:
            return self.g.constants[ref].shape
        for node in self.g.nodes:
            if node.name == ref:
                return node.shape
        raise KeyError(ref)  # pragma: no cover


def graph_to_onnx(g: RelaxGraph, *, opset: int = 17, name: str | None = None):
    """A :class:`~tvm_interop.export.RelaxGraph` as an ``onnx.ModelProto`` (checked with ``onnx.checker``)."""
    import onnx
    from onnx import helper

    if not 13 <= int(opset) <= onnx.defs.onnx_opset_version():
        raise ValueError(f"opset {opset} is not supported: use 13 .. {onnx.defs.onnx_opset_version()} (Softmax and "
                         "ReduceSum take their opset-13 forms)")
    em = _Emitter(g, opset)
    for c_name, arr in g.constants.items():
        em.inits.append(em.numpy_helper.from_array(np.ascontiguousarray(arr), c_name))
    for n in g.nodes:
        em.emit(n)
    produced = {n.name: n for n in g.nodes}
    dtypes = {n: d for n, _, d in g.inputs}
    dtypes.update({n.name: n.dtype for n in g.nodes})
    dtypes.update({k: str(v.dtype) for k, v in g.constants.items()})
    shapes = {n: s for n, s, _ in g.inputs}
    shapes.update({n.name: n.shape for n in g.nodes})
    shapes.update({k: v.shape for k, v in g.constants.items()})
    # graph outputs: a node output used once as an output keeps its name; anything else (an input, a constant,
    # the same tensor twice) goes through an Identity
    out_names, seen = [], set()
    for i, o in enumerate(g.outputs):
        if o in produced and o not in seen:
            out_names.append(o)
        else:
            new = em.fresh(f"output{i}")
            em.node("Identity", [o], [new], new)
            dtypes[new], shapes[new] = dtypes[o], shapes[o]
            out_names.append(new)
        seen.add(o)

    def vi(nm):
        return helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(np.dtype(dtypes[nm])),
                                             list(shapes[nm]))

    inputs = [vi(n) for n, _, _ in g.inputs]
    outputs = [vi(n) for n in out_names]
    value_info = [vi(n.name) for n in g.nodes if n.name not in set(out_names)]
    graph = helper.make_graph(em.nodes, name or g.name, inputs, outputs, initializer=em.inits,
                              value_info=value_info)
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, producer_name="tvm-interop", opset_imports=opsets)
    # the lowest IR version that carries this opset: what the widest range of runtimes accepts
    model.ir_version = helper.find_min_ir_version_for(opsets)
    onnx.checker.check_model(model)
    return model


def to_onnx(mod, path=None, *, opset: int = 17, name: str | None = None):
    """Export ``mod['main']`` to ONNX; returns the ``onnx.ModelProto`` and saves it to ``path`` when given.

    Raises :class:`runtime.errors.UnsupportedModelError` naming an operator that has no exact ONNX mapping.
    """
    import onnx

    model = graph_to_onnx(read_relax(mod), opset=opset, name=name)
    if path is not None:
        onnx.save(model, str(path))
    return model
