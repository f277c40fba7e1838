"""Export a zoo-style Relax module to other frameworks, for side-by-side benchmarks and cross-checks.

>>> from tvm_interop.export import to_onnx, to_torch
>>> model = to_onnx(mod, "model.onnx")        # onnx.ModelProto (also written to the path); weights = initializers
>>> net = to_torch(mod)                         # torch.nn.Module (a torch.fx GraphModule); weights = buffers
>>> y = net(torch.from_numpy(x))

Both read the *high-level* Relax ``main`` (before legalization: ``relax.nn.conv2d``, ``relax.add``, ...), i.e.
what :func:`tvm_interop.models.get_model` and the frontends produce, and emit the same operators with the same
weights, in the same order. Nothing is fused or rewritten beyond what the target framework does itself (ONNX
Runtime's graph optimiser, for example, fuses conv + relu), so they are "the same architecture" in ONNX / torch.

:func:`read_relax` is the shared front half: it walks ``main``, checks every operator and its attributes and
returns a :class:`RelaxGraph` (inputs, constants, nodes with plain-Python attributes, outputs). An operator or an
attribute value the exporters cannot reproduce exactly raises :class:`runtime.errors.UnsupportedModelError`
naming it. :data:`SUPPORTED_OPS` lists the operators (every one the zoo emits, plus common elementwise / shape
ops).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tvm_interop.runtime.errors import UnsupportedModelError

__all__ = ["to_onnx", "to_torch", "read_relax", "RelaxGraph", "Node", "SUPPORTED_OPS", "ZOO_OPS"]

# operators the zoo (tvm_interop.models) emits, over every model and config (see tests/test_export_baselines.py)
ZOO_OPS = (
    "relax.nn.conv2d", "relax.add", "relax.multiply", "relax.nn.relu", "relax.nn.max_pool2d",
    "relax.nn.avg_pool2d", "relax.nn.adaptive_avg_pool2d", "relax.concat", "relax.mean", "relax.reshape",
    "relax.matmul", "relax.nn.pad", "relax.strided_slice",
)
_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power")
_UNARY = ("nn.relu", "sigmoid", "tanh", "exp", "sqrt", "negative", "nn.silu", "nn.gelu", "nn.relu6")
_REDUCE = ("mean", "sum", "max", "min")
_RESHAPE = ("reshape", "flatten", "squeeze", "expand_dims")
_OTHER = ("nn.conv2d", "nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d", "concat", "matmul",
          "permute_dims", "strided_slice", "nn.pad", "clip", "nn.leakyrelu", "nn.softmax", "nn.log_softmax",
          "astype")
SUPPORTED_OPS = tuple(sorted("relax." + o for o in _BINARY + _UNARY + _REDUCE + _RESHAPE + _OTHER))


@dataclass
class Node:
    """One operator: ``name`` (its output tensor), ``op`` (Relax name without ``relax.``, e.g. ``nn.conv2d``),
    ``inputs`` (tensor names; for ``concat`` one list), plain-Python ``attrs``, static output ``shape``/``dtype``."""

    name: str
    op: str
    inputs: list
    attrs: dict
    shape: tuple
    dtype: str


@dataclass
class RelaxGraph:
    """``main`` as a flat list of nodes. ``inputs``: ``(name, shape, dtype)``; ``constants``: name -> numpy
    (program order); ``outputs``: tensor names; ``tuple_output``: ``main`` returns a tuple."""

    inputs: list = field(default_factory=list)
    constants: dict = field(default_factory=dict)
    nodes: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    tuple_output: bool = False
    name: str = "model"

    @property
    def tensor_names(self) -> set:
        return {n for n, _, _ in self.inputs} | set(self.constants) | {n.name for n in self.nodes}

    def op_counts(self) -> dict:
        out: dict = {}
        for n in self.nodes:
            out["relax." + n.op] = out.get("relax." + n.op, 0) + 1
        return out


# ------------------------------------------------------------------------------------------------- reading
def _ints(v) -> list[int]:
    return [int(e) for e in v]


def _static_shape(ty, what: str) -> tuple[int, ...]:
    shape = getattr(ty, "shape", None)
    if shape is None:
        raise UnsupportedModelError(f"{what}: tensor without a known shape ({ty}); the exporters need static shapes")
    out = []
    for i, d in enumerate(shape):
        try:
            out.append(int(d))
        except (TypeError, ValueError):
            raise UnsupportedModelError(f"{what}: dimension {i} is dynamic ({d}); the exporters need static "
                                        "shapes") from None
    return tuple(out)


def _dtype(ty) -> str:
    return str(getattr(ty, "dtype", "float32"))


def _pair4(v, what) -> tuple[int, int, int, int]:
    p = _ints(v)
    if len(p) == 1:
        p = p * 4
    elif len(p) == 2:
        p = [p[0], p[1], p[0], p[1]]
    if len(p) != 4:
        raise UnsupportedModelError(f"{what}: padding {p} is not 1, 2 or 4 values")
    return tuple(p)  # (top, left, bottom, right)


class _Reader:
    def __init__(self, mod, func_name: str = "main"):
        import tvm
        from tvm import relax

        self.relax = relax
        self.Op = tvm.ir.Op
        try:
            self.func = mod[func_name]
        except Exception:  # noqa: BLE001
            raise UnsupportedModelError(f"module has no Relax function {func_name!r} to export") from None
        if not isinstance(self.func, relax.Function):
            raise UnsupportedModelError(f"{func_name!r} is not a Relax function ({type(self.func).__name__})")
        self.g = RelaxGraph()
        self.names: dict = {}  # relax Var / const object -> tensor name
        self.used: set = set()
        self.const_objs: dict = {}
        self.tuples: dict = {}  # relax Var bound to a tuple -> its field tensor names

    def _tuple_fields(self, e, where: str) -> list:
        relax = self.relax
        if isinstance(e, relax.Tuple):
            fields = []
            for f in e.fields:
                self._need(not isinstance(f, relax.Tuple) and f not in self.tuples, where, "a nested tuple")
                fields.append(self._ref(f, where))
            return fields
        if isinstance(e, relax.Var) and e in self.tuples:
            return self.tuples[e]
        raise UnsupportedModelError(f"{where}: {type(e).__name__} is not a tuple the exporters can read")

    def _fresh(self, base: str) -> str:
        base = "".join(ch if ch.isalnum() or ch in "_." else "_" for ch in (base or "t")) or "t"
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name

    # a leaf argument: a bound variable or a constant
    def _ref(self, e, where: str) -> str:
        relax = self.relax
        if isinstance(e, relax.Var):
            if e not in self.names:
                raise UnsupportedModelError(f"{where}: variable {e.name!r} is not bound in main's dataflow")
            return self.names[e]
        if hasattr(e, "value") and hasattr(e.value, "numpy") and not isinstance(e, relax.Call):  # a constant
            if e not in self.const_objs:
                arr = np.array(e.value.numpy())  # own copy
                name = self._fresh(f"const{len(self.g.constants)}")
                self.g.constants[name] = arr
                self.const_objs[e] = name
            return self.const_objs[e]
        raise UnsupportedModelError(f"{where}: argument of kind {type(e).__name__} is not supported (expected a "
                                    "variable or a constant; is the module normalized?)")

    def read(self) -> RelaxGraph:
        relax = self.relax
        f = self.func
        for p in f.params:
            shape = _static_shape(p.ty, f"input {p.name!r}")
            name = self._fresh(p.name)
            self.names[p] = name
            self.g.inputs.append((name, shape, _dtype(p.ty)))
        body = f.body
        if not isinstance(body, relax.SeqExpr):
            raise UnsupportedModelError(f"main's body is a {type(body).__name__}, expected a SeqExpr")
        for block in body.blocks:
            for b in block.bindings:
                if not isinstance(b, relax.VarBinding):
                    raise UnsupportedModelError(f"binding {b.var.name!r}: {type(b).__name__} (match_cast) is not "
                                                "supported by the exporters")
                self._binding(b.var, b.value)
        out = body.body
        if isinstance(out, relax.Tuple) or out in self.tuples:
            self.g.tuple_output = True
            self.g.outputs = self._tuple_fields(out, "output")
        else:
            self.g.outputs = [self._ref(out, "output")]
        return self.g

    def _binding(self, var, value) -> None:
        relax = self.relax
        if isinstance(value, relax.Var) or (hasattr(value, "value") and hasattr(value.value, "numpy")
                                            and not isinstance(value, relax.Call)):
            self.names[var] = self._ref(value, f"binding {var.name!r}")  # alias
            return
        if isinstance(value, relax.Tuple):  # a tuple of tensors (e.g. emit_output of several results)
            self.tuples[var] = self._tuple_fields(value, f"binding {var.name!r}")
            return
        if isinstance(value, relax.TupleGetItem):
            fields = self._tuple_fields(value.tuple_value, f"binding {var.name!r}")
            self.names[var] = fields[int(value.index)]
            return
        if not isinstance(value, relax.Call):
            raise UnsupportedModelError(f"binding {var.name!r}: expression {type(value).__name__} is not supported "
                                        "by the exporters")
        op = value.op
        op_name = getattr(op, "name", None)
        if op_name is None or not isinstance(op, self.Op):
            raise UnsupportedModelError(f"binding {var.name!r}: a call to {op} (a function, not a Relax operator) "
                                        "is not supported by the exporters")
        if op_name not in SUPPORTED_OPS:
            hint = (" (export the high-level module, before LegalizeOps / FuseOps)"
                    if op_name in ("relax.call_tir", "relax.call_dps_packed") else "")
            raise UnsupportedModelError(f"operator {op_name!r} (binding {var.name!r}) is not supported by the "
                                        f"ONNX / torch exporters{hint}; supported: {', '.join(SUPPORTED_OPS)}")
        where = f"{op_name} (binding {var.name!r})"
        short = op_name[len("relax."):]
        shape = _static_shape(var.ty, where)
        dtype = _dtype(var.ty)
        args = list(value.args)
        attrs = value.attrs
        name = self._fresh(var.name)
        handler = getattr(self, "_op_" + short.replace(".", "_"), None)
        if handler is not None:
            inputs, a = handler(args, attrs, where, shape)
        else:  # elementwise / reshape-like: tensor arguments, no attributes that matter
            inputs, a = [self._ref(x, where) for x in args], {}
        self.g.nodes.append(Node(name, short, inputs, a, shape, dtype))
        self.names[var] = name

    def _shape_of(self, ref: str) -> tuple:
        for n, s, _ in self.g.inputs:
            if n == ref:
                return s
        if ref in self.g.constants:
            return tuple(self.g.constants[ref].shape)
        for node in reversed(self.g.nodes):
            if node.name == ref:
                return node.shape
        raise KeyError(ref)  # pragma: no cover

    def _dtype_of(self, ref: str) -> str:
        for n, _, d in self.g.inputs:
            if n == ref:
                return d
        if ref in self.g.constants:
            return str(self.g.constants[ref].dtype)
        for node in reversed(self.g.nodes):
            if node.name == ref:
                return node.dtype
        raise KeyError(ref)  # pragma: no cover

    # ---- per-operator attribute checks ----------------------------------------------------------------
    @staticmethod
    def _need(cond: bool, where: str, what: str) -> None:
        if not cond:
            raise UnsupportedModelError(f"{where}: {what} is not supported by the exporters")

    def _op_nn_conv2d(self, args, attrs, where, shape):
        self._need(attrs.data_layout == "NCHW" and attrs.kernel_layout == "OIHW"
                   and attrs.out_layout in ("NCHW", ""), where,
                   f"layout {attrs.data_layout}/{attrs.kernel_layout}/{attrs.out_layout} (only NCHW/OIHW)")
        x, w = (self._ref(a, where) for a in args)
        xd = self._dtype_of(x)
        self._need(attrs.out_dtype is None or str(attrs.out_dtype) in ("", "void", xd), where,
                   f"out_dtype={attrs.out_dtype}")
        self._need(len(self._shape_of(w)) == 4, where, "a kernel that is not 4-D")
        return [x, w], {"strides": _ints(attrs.strides), "padding": _pair4(attrs.padding, where),
                        "dilation": _ints(attrs.dilation), "groups": int(attrs.groups),
                        "kernel": list(self._shape_of(w)[2:])}

    def _pool(self, args, attrs, where, shape, kind):
        self._need(attrs.layout == "NCHW" and attrs.out_layout in ("NCHW", ""), where,
                   f"layout {attrs.layout} (only NCHW)")
        x = self._ref(args[0], where)
        k = _ints(attrs.pool_size)
        s = _ints(attrs.strides)
        d = _ints(attrs.dilation)
        pad = list(_pair4(attrs.padding, where))
        cip = bool(attrs.count_include_pad)
        if kind == "avg":
            self._need(d == [1, 1], where, f"dilation {d} of an average pool")
        xs = self._shape_of(x)
        if bool(attrs.ceil_mode):
            # ceil mode == floor mode with extra trailing padding that makes the (statically known) output size
            # come out; the extra cells are never counted by an average pool without count_include_pad
            self._need(kind == "max" or not cip, where, "ceil_mode with count_include_pad=True")
            for ax, (i, j) in enumerate(((0, 2), (1, 3))):
                need = (shape[2 + ax] - 1) * s[ax] + d[ax] * (k[ax] - 1) + 1 - (xs[2 + ax] + pad[i] + pad[j])
                pad[j] += max(0, need)
        for ax, (i, j) in enumerate(((0, 2), (1, 3))):  # floor mode must give the output shape
            got = (xs[2 + ax] + pad[i] + pad[j] - d[ax] * (k[ax] - 1) - 1) // s[ax] + 1
            self._need(got == shape[2 + ax], where, f"pool output size {shape} (expected {got} on axis {2 + ax})")
        return [x], {"kernel": k, "strides": s, "dilation": d, "padding": tuple(pad), "count_include_pad": cip}

    def _op_nn_max_pool2d(self, args, attrs, where, shape):
        return self._pool(args, attrs, where, shape, "max")

    def _op_nn_avg_pool2d(self, args, attrs, where, shape):
        return self._pool(args, attrs, where, shape, "avg")

    def _op_nn_adaptive_avg_pool2d(self, args, attrs, where, shape):
        self._need(attrs.layout == "NCHW" and attrs.out_layout in ("NCHW", ""), where,
                   f"layout {attrs.layout} (only NCHW)")
        return [self._ref(args[0], where)], {"output_size": list(shape[2:])}

    def _op_concat(self, args, attrs, where, shape):
        (tup,) = args
        self._need(attrs.axis is not None, where, "concat with axis=None")
        axis = int(attrs.axis)
        return [self._tuple_fields(tup, where)], {"axis": axis % len(shape)}

    def _reduce(self, args, attrs, where, shape):
        x = self._ref(args[0], where)
        ndim = len(self._shape_of(x))
        axes = list(range(ndim)) if attrs.axis is None else sorted(a % ndim for a in _ints(attrs.axis))
        return [x], {"axes": axes, "keepdims": bool(attrs.keepdims)}

    _op_mean = _op_sum = _op_max = _op_min = _reduce

    def _op_permute_dims(self, args, attrs, where, shape):
        x = self._ref(args[0], where)
        ndim = len(self._shape_of(x))
        axes = list(reversed(range(ndim))) if attrs.axes is None else [a % ndim for a in _ints(attrs.axes)]
        return [x], {"axes": axes}

    def _reshape_like(self, args, attrs, where, shape):
        return [self._ref(args[0], where)], {"shape": list(shape)}

    _op_reshape = _op_flatten = _op_squeeze = _op_expand_dims = _reshape_like

    def _op_strided_slice(self, args, attrs, where, shape):
        x = self._ref(args[0], where)
        xs = self._shape_of(x)
        relax = self.relax

        def vals(e, what):
            self._need(isinstance(e, relax.Tuple), where, f"non-constant {what}")
            try:
                return [int(getattr(v, "value", v)) for v in e.fields]
            except (TypeError, ValueError):
                raise UnsupportedModelError(f"{where}: non-constant {what} is not supported by the exporters") \
                    from None

        axes = [a % len(xs) for a in vals(args[1], "axes")]
        begin = vals(args[2], "begin")
        end = vals(args[3], "end")
        strides = vals(args[4], "strides") if len(args) > 4 else [1] * len(axes)
        self._need(all(s > 0 for s in strides), where, f"negative / zero strides {strides}")
        # normalise to python slice semantics on the static shape (clamped), check against the output shape
        norm = []
        for a, b, e, s in zip(axes, begin, end, strides):
            n = xs[a]
            b2, e2, s2 = slice(b, e, s).indices(n)
            norm.append((a, b2, e2, s2))
            got = len(range(b2, e2, s2))
            self._need(got == shape[a], where, f"slice {b}:{e}:{s} on axis {a} giving {shape[a]} (expected {got})")
        return [x], {"axes": [n[0] for n in norm], "begin": [n[1] for n in norm], "end": [n[2] for n in norm],
                     "strides": [n[3] for n in norm]}

    def _op_nn_pad(self, args, attrs, where, shape):
        x = self._ref(args[0], where)
        self._need(str(attrs.pad_mode) == "constant", where, f"pad_mode={attrs.pad_mode!r}")
        pw = _ints(attrs.pad_width)
        ndim = len(self._shape_of(x))
        self._need(len(pw) == 2 * ndim and all(p >= 0 for p in pw), where, f"pad_width {pw}")
        value = float(attrs.pad_value)
        if len(args) > 1:  # pad value given as an argument
            v = args[1]
            self._need(hasattr(v, "value"), where, "a non-constant pad value")
            value = float(np.asarray(v.value.numpy() if hasattr(v.value, "numpy") else v.value))
        return [x], {"pad_width": [(pw[2 * i], pw[2 * i + 1]) for i in range(ndim)], "value": value}

    def _op_clip(self, args, attrs, where, shape):
        x = self._ref(args[0], where)

        def scalar(e):
            v = getattr(e, "value", e)
            if hasattr(v, "numpy"):
                return float(np.asarray(v.numpy()))
            try:
                return float(v)
            except (TypeError, ValueError):
                raise UnsupportedModelError(f"{where}: a non-constant clip bound") from None

        return [x], {"min": scalar(args[1]), "max": scalar(args[2])}

    def _op_nn_leakyrelu(self, args, attrs, where, shape):
        return [self._ref(args[0], where)], {"alpha": float(attrs.alpha)}

    def _softmax(self, args, attrs, where, shape):
        return [self._ref(args[0], where)], {"axis": int(attrs.axis) % len(shape)}

    _op_nn_softmax = _op_nn_log_softmax = _softmax

    def _op_astype(self, args, attrs, where, shape):
        return [self._ref(args[0], where)], {"dtype": str(attrs.dtype)}

    def _op_matmul(self, args, attrs, where, shape):
        a, b = (self._ref(x, where) for x in args)
        self._need(len(self._shape_of(a)) >= 1 and len(self._shape_of(b)) >= 1, where, "matmul of scalars")
        self._need(attrs.out_dtype is None or str(attrs.out_dtype) in ("", "void", self._dtype_of(a)), where,
                   f"out_dtype={attrs.out_dtype}")
        return [a, b], {}

    def _op_nn_gelu(self, args, attrs, where, shape):
        return [self._ref(args[0], where)], {}


def read_relax(mod, func_name: str = "main") -> RelaxGraph:
    """Walk ``mod[func_name]`` (high-level Relax, static shapes) into a :class:`RelaxGraph`.

    Raises :class:`runtime.errors.UnsupportedModelError` naming the first operator / construct the exporters
    cannot reproduce.
    """
    g = _Reader(mod, func_name).read()
    attrs = getattr(mod, "attrs", None)
    try:
        name = attrs["name"] if attrs is not None and "name" in attrs else None
    except Exception:  # noqa: BLE001
        name = None
    g.name = str(name) if name else "model"
    return g


GRAPH_JSON_FORMAT = "tvm-interop-relax-graph"


def graph_to_json(g: RelaxGraph) -> dict:
    """A :class:`RelaxGraph` as JSON-ready data, constants by shape only: what a machine without TVM's compiler
    needs to rebuild the network in torch (``graph_from_json`` + ``torch_interp.graph_to_torch``), e.g. the GPU
    check's PyTorch baseline."""
    return {"format": GRAPH_JSON_FORMAT, "version": 1, "name": g.name,
            "inputs": [[n, list(s), d] for n, s, d in g.inputs],
            "constants": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in g.constants.items()},
            "nodes": [{"name": n.name, "op": n.op, "inputs": n.inputs, "attrs": n.attrs, "shape": list(n.shape),
                       "dtype": n.dtype} for n in g.nodes],
            "outputs": list(g.outputs), "tuple_output": g.tuple_output}


def graph_from_json(data: dict, constants: dict | None = None, seed: int = 0) -> RelaxGraph:
    """The graph of :func:`graph_to_json`, with ``constants`` (name -> array) or random ones of the recorded
    shapes (normal, scaled by 1/sqrt(fan-in): activations stay O(1) through deep networks)."""
    if data.get("format") != GRAPH_JSON_FORMAT:
        raise UnsupportedModelError(f"not a {GRAPH_JSON_FORMAT} file (format {data.get('format')!r})")
    rng = np.random.default_rng(seed)
    consts = {}
    for k, spec in data["constants"].items():
        if constants is not None:
            consts[k] = np.asarray(constants[k])
            continue
        shape = tuple(spec["shape"])
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        consts[k] = (rng.standard_normal(shape) / np.sqrt(max(1, fan_in))).astype(spec["dtype"])
    nodes = [Node(n["name"], n["op"], n["inputs"], n["attrs"], tuple(n["shape"]), n["dtype"]) for n in data["nodes"]]
    return RelaxGraph(inputs=[(n, tuple(s), d) for n, s, d in data["inputs"]], constants=consts, nodes=nodes,
                      outputs=list(data["outputs"]), tuple_output=bool(data["tuple_output"]), name=data["name"])


def zoo_ops(mod) -> dict:
    """``{relax op name: count}`` of the calls in ``mod['main']`` (any op, supported or not)."""
    from tvm import relax

    out: dict = {}
    for block in mod["main"].body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.Call):
                name = getattr(v.op, "name", str(v.op))
                out[name] = out.get(name, 0) + 1
    return out


def to_onnx(mod, path=None, *, opset: int = 17, name: str | None = None):
    """Export ``mod['main']`` to ONNX (``onnx.ModelProto``; also saved to ``path`` when given).

    Constants become initializers with identical values. See :mod:`tvm_interop.export.onnx_export`.
    """
    from .onnx_export import to_onnx as _impl

    return _impl(mod, path, opset=opset, name=name)


def to_torch(mod):
    """A ``torch.nn.Module`` computing ``mod['main']`` with ``torch.nn.functional`` (weights as buffers).

    See :mod:`tvm_interop.export.torch_interp`.
    """
    from .torch_interp import to_torch as _impl

    return _impl(mod)
