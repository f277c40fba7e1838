"""The numeric proof of a match: rewrite the matched region alone, build both versions with TVM, compare.

The region is the match's bindings with the values they read from outside turned into parameters (constants
stay), returning every member still needed outside the match. The rule is applied to that small module with
the *same* match (names are kept), so the proof exercises the rule's real ``apply``.

Verdicts are cached per (rule, structural signature of the region): op names, attributes, shapes, dtypes,
the wiring inside the region, the shapes of its constants and the match params — not the weight values.
The proof is of the rewrite's algebra (zero-padded kernels, concatenated weights, folded products), which
does not depend on the values; a model with a hundred identical inception branches compiles the proof once.
The weights used are the region's own constants, the inputs seeded standard-normal. Both versions run on the
numpy oracle of :mod:`.numpy_eval` when it implements every operator of the region (the rules' own operators:
milliseconds instead of two TVM builds), else through TVM.
"""
from __future__ import annotations

import threading

import numpy as np
import tvm
from tvm import relax

from .base import Match, Rule, rule_of
from .numpy_eval import Unsupported, evaluate
from .graph import (
    DataflowGraph,
    SubstitutionError,
    substitute_vars,
    _ty_sig,
    op_attrs,
    output_signature,
)

__all__ = ["check_match", "clear_check_cache", "extract_region"]

_CACHE: dict[tuple, str | None] = {}
_LOCK = threading.Lock()


def clear_check_cache() -> None:
    with _LOCK:
        _CACHE.clear()


def extract_region(mod: tvm.IRModule, nodes) -> tvm.IRModule:
    """``main(inputs of the region) -> tuple(members needed outside)`` with the members' names kept."""
    g = DataflowGraph(mod)
    names = set(nodes)
    unknown = sorted(n for n in names if n not in g.var)
    if unknown:
        raise SubstitutionError(f"nodes {unknown} are not bindings of main")
    ins = g.region_inputs(names)
    outs = g.needed_outside(names)
    if not outs:
        raise SubstitutionError(f"the region {g.sorted(names)} produces nothing used outside it")
    params = []
    vmap: dict = {}
    for i in ins:
        old = g.params.get(i, g.var.get(i))
        if not isinstance(old.ty, relax.TensorType):
            raise SubstitutionError(f"region {g.sorted(names)} reads {i}, which is not a tensor")
        p = relax.Var(i, old.ty)
        params.append(p)
        vmap[old] = p
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            for n in g.sorted(names):
                value = substitute_vars(g.value[n], vmap)
                vmap[g.var[n]] = bb.emit_output(value, name_hint=n) if n in outs else bb.emit(value, name_hint=n)
        bb.emit_func_output(relax.Tuple([vmap[g.var[n]] for n in outs]))
    return bb.get()


def _signature(mod: tvm.IRModule, match: Match) -> tuple:
    g = DataflowGraph(mod)
    local = {n: f"p{k}" for k, n in enumerate(g.params)}
    parts = []
    for k, n in enumerate(g.order):
        local[n] = f"v{k}"
        value = g.value[n]
        args = []
        if isinstance(value, relax.Call):
            for a in value.args:
                if isinstance(a, relax.Var):
                    args.append(local[g.name(a)])
                elif isinstance(a, relax.Tuple):
                    args.append(tuple(local[g.name(f)] if isinstance(f, relax.Var) else str(_ty_sig(f.ty))
                                      for f in a.fields))
                else:
                    args.append(("const", str(_ty_sig(a.ty)), str(a) if isinstance(a, relax.ShapeExpr) else ""))
            parts.append((g.op(n), tuple(sorted((k2, repr(v)) for k2, v in op_attrs(value).items())),
                          tuple(args), str(_ty_sig(g.var[n].ty))))
        else:
            parts.append((g.op(n), local[g.name(value.tuple_value)], int(value.index)))
    ins = tuple(str(_ty_sig(p.ty)) for p in g.params.values())
    outs = tuple(local[n] for n in g.order if n in g.returned)
    return (match.rule, ins, tuple(parts), outs, tuple(match.params),
            tuple(f"v{g.index[n]}" for n in match.nodes))


def _run(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The region's outputs: the numpy oracle (:mod:`.numpy_eval`) when it knows every operator, else TVM."""
    try:
        return evaluate(mod, inputs)
    except Unsupported:
        return _run_tvm(mod, inputs)


def _run_tvm(mod: tvm.IRModule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    ex = tvm.compile(relax.get_pipeline("zero")(mod), target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(x) for x in inputs])
    if hasattr(out, "numpy"):
        return [out.numpy()]
    return [o.numpy() for o in out]


def check_match(mod: tvm.IRModule, match: Match, rtol: float = 1e-5, atol: float = 1e-5, *,
                rule: Rule | None = None, seed: int = 0) -> None:
    """Prove ``match`` numerically on its region (see the module docstring); raise SubstitutionError naming
    the rule when the rewrite fails, changes the region's result types, or its numerics beyond
    ``atol + rtol * |reference|``. ``rule`` (an addition) checks an unregistered Rule object."""
    r = rule if rule is not None else rule_of(match)
    where = f"{r.name} on {list(match.nodes)}"
    try:
        region = extract_region(mod, match.nodes)
    except SubstitutionError as err:
        raise SubstitutionError(f"{where}: {err}") from err
    key = (_signature(region, match), float(rtol), float(atol), type(r).__module__, type(r).__qualname__, r.name)
    with _LOCK:
        if key in _CACHE:
            verdict = _CACHE[key]
            if verdict is not None:
                raise SubstitutionError(f"{where}: {verdict} (cached verdict for this region structure)")
            return
    verdict = _prove(r, region, match, rtol, atol, seed)
    with _LOCK:
        _CACHE[key] = verdict
    if verdict is not None:
        raise SubstitutionError(f"{where}: {verdict}")


def _prove(r: Rule, region: tvm.IRModule, match: Match, rtol: float, atol: float, seed: int) -> str | None:
    try:
        new = r.apply(region, match)
    except SubstitutionError as err:
        return f"the rewrite of the region failed: {err}"
    except Exception as err:  # noqa: BLE001
        return f"the rewrite of the region failed: {type(err).__name__}: {err}"
    if output_signature(new) != output_signature(region):
        return f"the region's results changed from {output_signature(region)} to {output_signature(new)}"
    rng = np.random.default_rng(seed)
    inputs = []
    for p in region["main"].params:
        shape = tuple(int(d) for d in p.ty.shape)
        inputs.append(rng.standard_normal(shape).astype(str(p.ty.dtype)))
    try:
        ref = _run(region, inputs)
        got = _run(new, inputs)
    except Exception as err:  # noqa: BLE001
        return f"building or running the region failed: {type(err).__name__}: {err}"
    for k, (a, b) in enumerate(zip(got, ref)):
        if a.shape != b.shape:
            return f"result {k} has shape {a.shape}, expected {b.shape}"
        if not np.allclose(a, b, rtol=rtol, atol=atol):
            err = float(np.max(np.abs(a - b) - rtol * np.abs(b)))
            return f"result {k} differs from the original by up to {err:.3g} beyond atol={atol}, rtol={rtol}"
    return None
