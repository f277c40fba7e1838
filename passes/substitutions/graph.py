"""A read-only dataflow view of a high-level Relax ``main`` and the one primitive that rewrites it.

Substitution rules work on the module *before* legalization: ``main(params)`` whose body is a single dataflow
block of ``relax.op`` calls (plus, after a rule has run, ``TupleGetItem`` bindings reading a ``split``).
Every binding is addressed by its variable's ``name_hint``; that is why :func:`ensure_unique_names` must run
first: the search keeps matches and node sets as names across rewrites, so names must be unique and stable
(a rewrite keeps the names of every binding it does not consume).

:func:`rewrite_main` is the only place that builds a new ``main``: it drops the consumed bindings, lets the
rule emit its replacement at one point of the block, and re-emits everything else with the same names, in
a stable topological order (the replacement may have to move past bindings that do not depend on it).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from tvm_interop.runtime.errors import InteropError

__all__ = [
    "DataflowGraph",
    "Emitter",
    "FrozenAttrs",
    "Node",
    "SubstitutionError",
    "const_value",
    "dataflow_nodes",
    "ensure_unique_names",
    "fold_constants",
    "output_signature",
    "rewrite_main",
    "tensor_sig",
]

#: the pseudo-op name of a ``TupleGetItem`` binding (reading one output of a ``split``)
TUPLE_GET_ITEM = "TupleGetItem"


class SubstitutionError(InteropError):
    """A substitution cannot be found, applied or proved (the message names the rule and the nodes)."""


class FrozenAttrs(Mapping):
    """An immutable, hashable mapping of operator attributes (values are ints, floats, strings, tuples, None),
    so that :class:`Node` stays hashable and two nodes with equal attributes compare equal."""

    __slots__ = ("_d", "_h")

    def __init__(self, d: Mapping[str, Any] | None = None):
        self._d = dict(d or {})
        self._h = hash(tuple(sorted((k, _hashable(v)) for k, v in self._d.items())))

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __hash__(self) -> int:
        return self._h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._d) == dict(other)

    def __repr__(self) -> str:
        return f"FrozenAttrs({self._d!r})"


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    return v


def _py(v: Any) -> Any:
    """TVM attribute value -> plain Python (Arrays become tuples, IntImm ints, String str)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)) or type(v).__name__ == "Array":
        return tuple(_py(x) for x in v)
    if hasattr(v, "value") and isinstance(v.value, (int, float, bool)):
        return v.value
    return str(v)


def op_attrs(call: relax.Call) -> dict[str, Any]:
    """The attributes of an op call as a plain dict (empty when the op has none)."""
    a = call.attrs
    if a is None:
        return {}
    out = {}
    for k in dir(a):
        if k.startswith("_") or k == "id_":
            continue
        try:
            v = getattr(a, k)
        except Exception:  # noqa: BLE001, S112 - an attribute TVM cannot convert is not one a rule reads
            continue
        if callable(v):
            continue
        out[k] = _py(v)
    return out


@dataclass(frozen=True)
class Node:
    """One op-call binding of ``main`` (see the package docstring).

    ``inputs``: names of the bindings / main params the call reads (constants left out), in argument order;
    ``shape``: the output shape (``None`` for a tuple-valued op such as ``split``); ``flops``: 2 x multiply-adds
    for conv2d / matmul, elements read x window for pools, output elements for everything else (0 for a
    ``TupleGetItem``, which is no kernel)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    shape: tuple[int, ...] | None
    dtype: str
    attrs: FrozenAttrs = field(default_factory=FrozenAttrs)
    flops: int = 0


def tensor_sig(ty) -> tuple[tuple[int, ...] | None, str]:
    """(static shape or None, dtype) of a tensor type; (None, "") for anything else."""
    if isinstance(ty, relax.TensorType):
        shape = ty.shape
        try:
            dims = tuple(int(d) for d in shape) if shape is not None else None
        except (TypeError, ValueError):  # symbolic dimension
            dims = None
        return dims, str(ty.dtype)
    return None, ""


def _ty_sig(ty) -> Any:
    if isinstance(ty, tvm.ir.TupleType):
        return tuple(_ty_sig(f) for f in ty.fields)
    return tensor_sig(ty)


def output_signature(mod: tvm.IRModule) -> Any:
    """Shapes and dtypes of main's result (nested tuples for a tuple result)."""
    return _ty_sig(mod["main"].body.body.ty)


def _vars_in(expr) -> list:
    """Variables an expression reads, in order (constants, shapes and prim values read none)."""
    if isinstance(expr, relax.Var):
        return [expr]
    if isinstance(expr, relax.Call):
        return [v for a in expr.args for v in _vars_in(a)]
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in _vars_in(f)]
    if isinstance(expr, relax.TupleGetItem):
        return _vars_in(expr.tuple_value)
    return []


def substitute_vars(expr, vmap: dict):
    """``expr`` with its variables replaced by ``vmap`` (keyed by the old Var objects)."""
    if isinstance(expr, relax.Var):
        return vmap.get(expr, expr)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [substitute_vars(a, vmap) for a in expr.args], expr.attrs, expr.ty_args)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([substitute_vars(f, vmap) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(substitute_vars(expr.tuple_value, vmap), expr.index)
    return expr


def _main_parts(mod: tvm.IRModule):
    """(main, its bindings) — main must be one dataflow block followed by the result."""
    if not any(gv.name_hint == "main" for gv in mod.get_global_vars()):
        raise SubstitutionError("the module has no function 'main'")
    func = mod["main"]
    body = func.body
    if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1 or not isinstance(
        body.blocks[0], relax.DataflowBlock
    ):
        raise SubstitutionError("substitutions need main to be a single dataflow block (high-level Relax, "
                                "before legalization)")
    bindings = list(body.blocks[0].bindings)
    for b in bindings:
        if not isinstance(b, relax.VarBinding):
            raise SubstitutionError(f"binding {b.var.name} is a match_cast; not supported")
    return func, bindings


def const_value(expr) -> np.ndarray | None:
    """The numpy value of a constant argument, or None when it is not a constant."""
    if isinstance(expr, tvm.ir.GenericConst):
        return expr.value.numpy()
    return None


def _flops(value, ty, arg_tys: list) -> int:
    shape, _ = tensor_sig(ty)
    if isinstance(value, relax.TupleGetItem):
        return 0
    if shape is None:  # tuple-valued op (split): elements written
        if isinstance(ty, tvm.ir.TupleType):
            return int(sum(np.prod(tensor_sig(f)[0] or (0,)) for f in ty.fields))
        return 0
    out = int(np.prod(shape)) if shape else 1
    name = value.op.name if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) else ""
    if name == "relax.nn.conv2d" and len(arg_tys) >= 2:
        wshape, _ = tensor_sig(arg_tys[1])
        if wshape is not None:
            return 2 * out * int(np.prod(wshape[1:]))
    if name == "relax.matmul" and arg_tys:
        ashape, _ = tensor_sig(arg_tys[0])
        if ashape:
            return 2 * out * int(ashape[-1])
    if name in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d"):
        k = op_attrs(value).get("pool_size", (1, 1))
        return out * int(np.prod(k))
    return out


class DataflowGraph:
    """Names, producers and consumers of main's bindings (requires unique names, see ensure_unique_names)."""

    def __init__(self, mod: tvm.IRModule):
        func, bindings = _main_parts(mod)
        self.mod = mod
        self.func = func
        self.params: dict[str, relax.Var] = {}
        for p in func.params:
            if p.name in self.params:
                raise SubstitutionError(f"main has two parameters named {p.name!r}")
            self.params[p.name] = p
        self.order: list[str] = []
        self.var: dict[str, relax.Var] = {}
        self.value: dict[str, Any] = {}
        self.index: dict[str, int] = {}
        self.is_output: dict[str, bool] = {}
        name_of: dict = {v: n for n, v in self.params.items()}
        for i, b in enumerate(bindings):
            n = b.var.name
            if n in self.var or n in self.params:
                raise SubstitutionError(f"two variables of main are named {n!r}: run ensure_unique_names first")
            self.order.append(n)
            self.var[n] = b.var
            self.value[n] = b.value
            self.index[n] = i
            self.is_output[n] = not isinstance(b.var, relax.DataflowVar)
            name_of[b.var] = n
        self._name_of = name_of
        self.inputs: dict[str, tuple[str, ...]] = {}
        self.users: dict[str, list[str]] = {n: [] for n in list(self.params) + self.order}
        for n in self.order:
            ins = tuple(name_of[v] for v in _vars_in(self.value[n]) if v in name_of)
            self.inputs[n] = ins
            for i in dict.fromkeys(ins):
                self.users[i].append(n)
        self.returned: set[str] = {name_of[v] for v in _vars_in(func.body.body) if v in name_of}

    # ---- queries ---------------------------------------------------------------------------------
    def name(self, var) -> str | None:
        return self._name_of.get(var)

    def op(self, name: str) -> str:
        v = self.value.get(name)
        if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
            return v.op.name
        if isinstance(v, relax.TupleGetItem):
            return TUPLE_GET_ITEM
        return ""

    def call(self, name: str) -> relax.Call | None:
        v = self.value.get(name)
        return v if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) else None

    def sig(self, name: str) -> tuple[tuple[int, ...] | None, str]:
        v = self.var.get(name, self.params.get(name))
        return tensor_sig(v.ty)

    def shape(self, name: str) -> tuple[int, ...] | None:
        return self.sig(name)[0]

    def external(self, name: str) -> bool:
        """Read by the function result (so a rewrite may not drop it without a replacement)."""
        return name in self.returned

    def sole_user(self, name: str) -> str | None:
        """The one binding that reads ``name`` (once or more), if exactly one does and main does not return it."""
        us = self.users.get(name, [])
        if len(us) != 1 or self.external(name):
            return None
        return us[0]

    def needed_outside(self, names: set[str]) -> list[str]:
        """Members of ``names`` read by a binding outside ``names`` or returned, in program order."""
        return [n for n in sorted(names, key=self.index.__getitem__)
                if self.external(n) or any(u not in names for u in self.users[n])]

    def region_inputs(self, names: set[str]) -> list[str]:
        """Bindings / params read by ``names`` from outside, in first-use order."""
        out: dict[str, None] = {}
        for n in sorted(names, key=self.index.__getitem__):
            for i in self.inputs[n]:
                if i not in names:
                    out[i] = None
        return list(out)

    def sorted(self, names) -> tuple[str, ...]:
        return tuple(sorted(names, key=self.index.__getitem__))

    def is_convex(self, names: set[str]) -> bool:
        """No path leaves ``names`` and comes back (else the region cannot be replaced at one point)."""
        outside_reach: set[str] = set()
        lo = min(self.index[n] for n in names)
        hi = max(self.index[n] for n in names)
        for n in self.order[lo:hi + 1]:
            if n in names:
                if any(i in outside_reach for i in self.inputs[n]):
                    return False
                continue
            if any(i in names or i in outside_reach for i in self.inputs[n]):
                outside_reach.add(n)
        return True

    def node(self, name: str) -> Node:
        value = self.value[name]
        op = self.op(name)
        if not op:
            raise SubstitutionError(f"binding {name} is not an op call")
        arg_tys = []
        if isinstance(value, relax.Call):
            arg_tys = [a.ty for a in value.args]
        shape, dtype = self.sig(name)
        if isinstance(value, relax.TupleGetItem):
            attrs = {"index": int(value.index)}
        else:
            attrs = op_attrs(value)
        if shape is None and isinstance(self.var[name].ty, tvm.ir.TupleType):
            fields = self.var[name].ty.fields
            dtype = tensor_sig(fields[0])[1] if len(fields) else ""
        return Node(name=name, op=op, inputs=self.inputs[name], shape=shape, dtype=dtype,
                    attrs=FrozenAttrs(attrs), flops=_flops(value, self.var[name].ty, arg_tys))


def dataflow_nodes(mod: tvm.IRModule) -> list[Node]:
    """main's op-call bindings (and ``TupleGetItem`` bindings, op ``"TupleGetItem"``) in program order."""
    g = DataflowGraph(mod)
    return [g.node(n) for n in g.order if g.op(n)]


# --------------------------------------------------------------------------------------------- rebuild
class Emitter:
    """What a rule's region builder emits its replacement through: fresh unique names, and output vars
    where the binding it replaces was one (so main's result stays a non-dataflow variable)."""

    def __init__(self, bb: relax.BlockBuilder, prefix: str, taken: set[str], outputs: set[str]):
        self._bb = bb
        self._prefix = prefix
        self._taken = taken
        self._outputs = outputs
        self._n = 0

    def fresh(self) -> str:
        while True:
            name = f"{self._prefix}{self._n}"
            self._n += 1
            if name not in self._taken:
                self._taken.add(name)
                return name

    def emit(self, expr, replaces: str | None = None) -> relax.Var:
        name = self.fresh()
        if replaces is not None and replaces in self._outputs:
            return self._bb.emit_output(expr, name_hint=name)
        return self._bb.emit(expr, name_hint=name)


RegionBuilder = Callable[[Emitter, Callable[[str], Any]], Mapping[str, Any]]


def _rebuild(mod: tvm.IRModule, bindings: list, order: list, names: list[str], emit_region) -> tvm.IRModule:
    """Emit ``main`` again: ``order`` lists binding indices and, once, ``-1`` for the region."""
    func = mod["main"]
    attrs = {k: v for k, v in (func.attrs.items() if func.attrs is not None else []) if k != "global_symbol"}
    bb = relax.BlockBuilder()
    vmap: dict = {}
    with bb.function("main", list(func.params), attrs=attrs or None):
        with bb.dataflow():
            for i in order:
                if i == -1:
                    vmap.update(emit_region(bb, vmap))
                    continue
                b = bindings[i]
                value = substitute_vars(b.value, vmap)
                if isinstance(b.var, relax.DataflowVar):
                    vmap[b.var] = bb.emit(value, name_hint=names[i])
                else:
                    vmap[b.var] = bb.emit_output(value, name_hint=names[i])
        bb.emit_func_output(substitute_vars(func.body.body, vmap))
    new_main = bb.get()["main"]
    out = mod.clone()
    out["main"] = new_main
    return out


def fold_constants(mod: tvm.IRModule) -> tvm.IRModule:
    """``FoldConstant`` then :func:`ensure_unique_names`: frontends emit weights as ``reshape`` /
    ``permute_dims`` of constants (ONNX ``Conv`` bias, ``Gemm`` with ``transB``); the rules need the folded
    constant as the operator's argument to recognise a conv / dense layer."""
    return ensure_unique_names(relax.transform.FoldConstant()(mod))


def ensure_unique_names(mod: tvm.IRModule) -> tvm.IRModule:
    """The same module with every variable of main's dataflow block uniquely named (only duplicates are
    renamed, to ``<name>_<k>``); returns ``mod`` itself when the names are unique already."""
    func, bindings = _main_parts(mod)
    seen = {p.name for p in func.params}
    if len(seen) != len(func.params):
        raise SubstitutionError("main has two parameters with the same name")
    all_names = seen | {b.var.name for b in bindings}
    names, dup = [], False
    for b in bindings:
        n = b.var.name
        if n in seen:
            dup = True
            k = 1
            while f"{n}_{k}" in all_names:
                k += 1
            n = f"{n}_{k}"
            all_names.add(n)
        seen.add(n)
        names.append(n)
    if not dup:
        return mod
    return _rebuild(mod, bindings, list(range(len(bindings))), names, lambda bb, vmap: {})


def rewrite_main(mod: tvm.IRModule, consumed: Sequence[str], build: RegionBuilder, *, rule: str,
                 prefix: str | None = None) -> tvm.IRModule:
    """Replace the bindings ``consumed`` by what ``build`` emits.

    ``build(em, get)`` emits the replacement with ``em.emit(expr, replaces=old_name)`` (``get(name)`` is the
    new expression of an outside binding or param the region reads) and returns ``{old name: new var}`` for
    every consumed binding still needed outside the region; each must keep its shape and dtype. Every other
    binding keeps its name; the region is emitted as early as its inputs allow, the rest in program order.
    """
    g = DataflowGraph(mod)
    cons = set(consumed)
    missing = [n for n in cons if n not in g.var]
    if missing:
        raise SubstitutionError(f"{rule}: nodes {sorted(missing)} are not bindings of main")
    if not cons:
        raise SubstitutionError(f"{rule}: an empty match")
    _, bindings = _main_parts(mod)
    needed = g.needed_outside(cons)
    region_ins = [i for i in g.region_inputs(cons) if i in g.var]
    region_pos = min(g.index[n] for n in cons)

    # stable topological order with the region collapsed into one item (-1)
    deps: dict[int, set[int]] = {}
    for n in g.order:
        if n in cons:
            continue
        deps[g.index[n]] = {(-1 if i in cons else g.index[i]) for i in g.inputs[n] if i in g.var}
    deps[-1] = {g.index[i] for i in region_ins}
    users: dict[int, list[int]] = {k: [] for k in deps}
    for k, ds in deps.items():
        for d in ds:
            users[d].append(k)
    missing_deps = {k: len(ds) for k, ds in deps.items()}
    prio = {k: (region_pos if k == -1 else k) for k in deps}
    heap = [(prio[k], k) for k, c in missing_deps.items() if c == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, k = heapq.heappop(heap)
        order.append(k)
        for u in users[k]:
            missing_deps[u] -= 1
            if missing_deps[u] == 0:
                heapq.heappush(heap, (prio[u], u))
    if len(order) != len(deps):
        raise SubstitutionError(f"{rule}: nodes {g.sorted(cons)} are not a convex region (a path leaves it and "
                                "comes back)")

    taken = set(g.params) | set(g.order)
    outputs = {n for n in cons if g.is_output[n]}
    names = [b.var.name for b in bindings]

    def emit_region(bb, vmap):
        em = Emitter(bb, prefix or f"{rule}_", taken, outputs)

        def get(name: str):
            if name in g.params:
                return g.params[name]
            if name in cons or name not in g.var:
                raise SubstitutionError(f"{rule}: the replacement reads {name!r}, which is not an input of the "
                                        "region")
            return vmap[g.var[name]]

        repl = dict(build(em, get))
        out = {}
        for n in needed:
            if n not in repl:
                raise SubstitutionError(f"{rule}: the replacement of {g.sorted(cons)} gives no value for {n}, "
                                        "which is used outside the match")
            new = repl[n]
            if _ty_sig(new.ty) != _ty_sig(g.var[n].ty):
                raise SubstitutionError(f"{rule}: the replacement of {n} has type {_ty_sig(new.ty)}, expected "
                                        f"{_ty_sig(g.var[n].ty)}")
            if g.is_output[n] and isinstance(new, relax.DataflowVar):
                raise SubstitutionError(f"{rule}: {n} is an output of main; its replacement must be emitted "
                                        "with replaces=")
            out[g.var[n]] = new
        return out

    return _rebuild(mod, bindings, order, names, emit_region)
