"""Extract the operator graph from a prepared (legalized + fused) Relax module.

Every ``call_tir`` binding of ``main`` becomes a unit, and so does every ``call_dps_packed`` of one of our
library functions (``passes.offload``: a convolution or dense layer run by cuDNN / cuBLAS). Besides the OpGraph (what schedulers see) we keep a
``Program``: for each unit, where each argument comes from (a model input, a constant, or an output of another
unit), and where the model outputs come from. Lowering and the executors are built from the Program.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from tvm_interop.runtime.errors import UnsupportedModelError
from tvm_interop.runtime.plan import Ref

from .graph import OpGraph, TensorInfo, Unit

_GenericConst = tvm.ir.expr.GenericConst


@dataclass
class UnitCall:
    """How to call one unit's kernel: ``func_name(*args, *outputs)`` (destination-passing style)."""

    name: str
    func_name: str
    args: list[Ref]
    outputs: list[TensorInfo]
    binding_var: relax.Var = field(repr=False, default=None)
    params: tuple[int, ...] | None = None   # a library call's integer parameters (``passes.offload``), else None

    @property
    def is_library(self) -> bool:
        return self.params is not None


@dataclass
class Program:
    """A prepared module, its graph, and the data flow between units, inputs, constants and outputs."""

    mod: tvm.IRModule
    graph: OpGraph
    calls: dict[str, UnitCall]
    input_names: list[str]
    input_infos: list[TensorInfo]
    constants: list[np.ndarray]
    output: Ref
    const_exprs: list = field(default_factory=list, repr=False)  # the relax constants, same order

    def output_refs(self) -> list[Ref]:
        return self.output.flatten()

    def info_of(self, ref: Ref) -> TensorInfo:
        """Shape and dtype of a kernel argument (an input, a constant or a unit's output)."""
        return _ref_info(ref, self.input_infos, self.constants, self.calls)


_KIND_TRAILING_INDEX = re.compile(r"(\d+)$")


def kind_of(func_name: str) -> str:
    """``fused_conv2d1_add_relu`` -> ``conv2d``; ``max_pool2d`` -> ``max_pool2d``; ``add3`` -> ``add``."""
    name = func_name[len("fused_"):] if func_name.startswith("fused_") else func_name
    first = name.split("_")[0] if not name.startswith(("max_pool", "avg_pool", "adaptive_avg")) else "_".join(name.split("_")[:2])
    # Strip the dedup index TVM appends (conv2d1 -> conv2d) but keep names that end in a dimension (conv2d).
    m = _KIND_TRAILING_INDEX.search(first)
    if m and not re.search(r"[123]d$", first):
        first = first[: m.start()]
    elif m and re.search(r"[123]d\d+$", first):
        first = re.sub(r"(\d+)$", "", first)
    return first or func_name


def _tensor_info(sinfo, where: str) -> TensorInfo:
    if not isinstance(sinfo, relax.TensorType) or not isinstance(sinfo.shape, relax.ShapeExpr):
        raise UnsupportedModelError(f"{where}: expected a tensor with a static shape, got {sinfo}")
    dims = []
    for d in sinfo.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            raise UnsupportedModelError(f"{where}: dimension {d} is dynamic; static shapes only")
        dims.append(int(d))
    return TensorInfo(tuple(dims), str(sinfo.dtype))


def _output_infos(sinfo, where: str) -> list[TensorInfo]:
    if isinstance(sinfo, relax.TupleType):
        return [_tensor_info(f, f"{where}[{i}]") for i, f in enumerate(sinfo.fields)]
    return [_tensor_info(sinfo, where)]


def prim_func_flops(func: tvm.tirx.PrimFunc) -> float:
    try:
        from tvm.s_tir.analysis import estimate_tir_flops  # type: ignore
    except ImportError:  # pragma: no cover
        try:
            from tvm.tirx.analysis import estimate_tir_flops  # type: ignore
        except ImportError:
            return 0.0
    try:
        return float(estimate_tir_flops(tvm.IRModule({"main": func})))
    except Exception:  # noqa: BLE001 - FLOP estimation is advisory; 0 means "memory bound"
        return 0.0


def extract(mod: tvm.IRModule, name: str = "model", known_constants=None) -> Program:
    """Build the Program (and its OpGraph) from a module prepared by ``passes.prepare``. ``known_constants``:
    constants (Relax constant nodes) that keep their indices, in this order (a rewrite of a program that is
    given its weights by position, e.g. ``lift_constants``, must not renumber them); others follow."""
    import json

    from .prepare import CONV_ATTRS, weight_key

    conv_table = json.loads(str(mod.attrs[CONV_ATTRS])) if mod.attrs and CONV_ATTRS in mod.attrs else {}
    main = mod["main"]
    params = list(main.params)
    input_names = [p.name for p in params]
    input_infos = [_tensor_info(p.ty, f"input {p.name!r}") for p in params]
    env: dict[relax.Var, Ref] = {p: Ref.input(i) for i, p in enumerate(params)}
    constants: list[np.ndarray] = []
    const_exprs: list = []
    const_ids: dict[int, int] = {}
    calls: dict[str, UnitCall] = {}
    units: list[Unit] = []
    edges: set[tuple[str, str]] = set()
    used_names: set[str] = set()
    flops_cache: dict[str, float] = {}

    def const_ref(c) -> Ref:
        key = c.__chandle__() if hasattr(c, "__chandle__") else id(c)  # the IR node, not the Python wrapper
        if key not in const_ids:
            const_ids[key] = len(constants)
            constants.append(c.value.numpy())
            const_exprs.append(c)
        return Ref.const(const_ids[key])

    def ref_of(e, where: str) -> Ref:
        if isinstance(e, relax.Var):
            if e not in env:
                raise UnsupportedModelError(f"{where}: variable {e.name} is not defined by a supported binding")
            return env[e]
        if isinstance(e, _GenericConst):
            return const_ref(e)
        if isinstance(e, relax.Tuple):
            return Ref.tuple([ref_of(f, where) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            base = ref_of(e.tuple_value, where)
            return base.item(int(e.index))
        raise UnsupportedModelError(f"{where}: unsupported expression {type(e).__name__} in main")

    for c in known_constants or ():
        const_ref(c)
    body = main.body
    if not isinstance(body, relax.SeqExpr):
        raise UnsupportedModelError("main's body is not a sequence of bindings")
    call_tir_op = tvm.ir.Op.get("relax.call_tir")
    call_dps_op = tvm.ir.Op.get("relax.call_dps_packed")
    for block in body.blocks:
        for binding in block.bindings:
            if not isinstance(binding, relax.VarBinding):
                raise UnsupportedModelError(
                    f"binding {binding.var.name}: {type(binding).__name__} (match_cast) is not supported; "
                    "static shapes only"
                )
            var, value = binding.var, binding.value
            where = f"binding {var.name}"
            library = _library_call(value, call_dps_op)
            if (isinstance(value, relax.Call) and value.op.same_as(call_tir_op)) or library is not None:
                lib_params = None
                if library is not None:
                    func_name, lib_params, lib_args = library
                    args = [ref_of(a, where) for a in lib_args]
                else:
                    gv = value.args[0]
                    func_name = gv.name_hint
                    if len(value.args) > 2:
                        raise UnsupportedModelError(f"{where}: call_tir with symbolic shape arguments (dynamic shapes)")
                    args = [ref_of(a, where) for a in value.args[1].fields]
                outs = _output_infos(value.ty if hasattr(value, "ty") else var.ty, where)
                uname = var.name
                k = 1
                while uname in used_names:
                    uname = f"{var.name}_{k}"
                    k += 1
                used_names.add(uname)
                if library is None and func_name not in flops_cache:
                    flops_cache[func_name] = prim_func_flops(mod[gv])
                in_infos = []
                attrs: dict = {}
                for i, a in enumerate(args):
                    info = _ref_info(a, input_infos, constants, calls)
                    in_infos.append(info)
                    for src in a.flatten():
                        if src.kind == "unit":
                            edges.add((src.unit, uname))
                kind = kind_of(func_name) if library is None else _LIBRARY_KINDS[func_name]
                if args and args[0].kind in ("unit", "input"):
                    attrs["data"] = args[0].describe()
                if kind in ("conv2d", "conv1d", "conv3d") and len(args) > 1 and args[1].kind == "const":
                    weight = constants[args[1].index]
                    attrs["weight_shape"] = list(weight.shape)
                    conv = conv_table.get(weight_key(weight)) if kind == "conv2d" else None
                    if conv is not None:
                        attrs["conv"] = conv
                flops = flops_cache[func_name] if library is None else _library_flops(func_name, in_infos, outs)
                if library is not None:
                    attrs["library"] = _LIBRARY_NAMES[func_name]
                    attrs["library_params"] = list(lib_params)
                bytes_moved = float(sum(t.nbytes for t in in_infos) + sum(t.nbytes for t in outs))
                unit = Unit(name=uname, kind=kind, inputs=in_infos, outputs=outs, flops=flops,
                            bytes_moved=bytes_moved, func_name=func_name, attrs=attrs)
                units.append(unit)
                calls[uname] = UnitCall(uname, func_name, args, outs, var, params=lib_params)
                env[var] = Ref.unit(uname) if len(outs) == 1 and not isinstance(var.ty, relax.TupleType) \
                    else Ref.tuple([Ref.unit(uname, i) for i in range(len(outs))])
            elif isinstance(value, relax.Call):
                op = value.op.name if isinstance(value.op, tvm.ir.Op) else str(value.op)
                raise UnsupportedModelError(
                    f"{where}: operator {op} is not a TVM-built kernel (call_tir); tvm-interop cannot schedule it"
                )
            else:
                env[var] = ref_of(value, where)
    output = ref_of(body.body, "main's return value")
    graph = OpGraph(units, edges, name=name)
    return Program(mod=mod, graph=graph, calls=calls, input_names=input_names, input_infos=input_infos,
                   constants=constants, output=output, const_exprs=const_exprs)


# The library functions of ``passes.offload`` (kept here as names so that extract needs nothing from offload).
# A library unit keeps the kind of the TVM kernel it replaces (a legalized dense layer is a ``matmul``), so the
# graph fingerprint stays the model's: schedules and cost tables made for the model apply to its offloaded form.
_LIBRARY_KINDS = {"tvm_interop.cudnn.conv2d": "conv2d", "tvm_interop.cublas.dense": "matmul"}
_LIBRARY_NAMES = {"tvm_interop.cudnn.conv2d": "cudnn", "tvm_interop.cublas.dense": "cublas"}


def _library_call(value, call_dps_op):
    """``(function, params, tensor args)`` of a ``call_dps_packed`` of one of our library functions, else None.
    Other packed calls in ``main`` are not units (and are refused below)."""
    if not (isinstance(value, relax.Call) and value.op.same_as(call_dps_op)):
        return None
    func = value.args[0]
    if not isinstance(func, relax.ExternFunc) or str(func.global_symbol) not in _LIBRARY_KINDS:
        return None
    fields = list(value.args[1].fields)
    if not fields or not isinstance(fields[0], relax.ShapeExpr):
        raise UnsupportedModelError(f"library call {func.global_symbol} without its integer parameters")
    params = tuple(int(v) for v in fields[0].values)
    return str(func.global_symbol), params, fields[1:]


def _library_flops(func_name: str, inputs: list[TensorInfo], outputs: list[TensorInfo]) -> float:
    """Multiply-adds x 2 of a library convolution / dense call, from its shapes."""
    out = outputs[0].shape
    w = inputs[1].shape
    if _LIBRARY_KINDS[func_name] == "conv2d":   # out [N, O, OH, OW], w [O, C/g, KH, KW]
        return 2.0 * float(np.prod(out)) * float(np.prod(w[1:]))
    k = inputs[0].shape[-1]
    return 2.0 * float(np.prod(out)) * float(k)


def _ref_info(ref: Ref, input_infos, constants, calls) -> TensorInfo:
    if ref.kind == "input":
        return input_infos[ref.index]
    if ref.kind == "const":
        c = constants[ref.index]
        return TensorInfo(tuple(int(x) for x in c.shape), str(c.dtype))
    if ref.kind == "unit":
        return calls[ref.unit].outputs[ref.index]
    raise UnsupportedModelError("a kernel argument is a tuple; only tensors can be passed to call_tir")
