"""A region of ``main`` as a module of its own, so that substitutions can be searched on it alone.

Why: AutoGraph searches substitution sequences per subgraph. Rewriting the whole model for every state of that
search would rebuild a 1,000-binding function thousands of times; a region of a few dozen bindings, cut out with
its inputs as parameters and every value the rest of the model reads as an output, rewrites in milliseconds.
Outputs matter for legality: a value used outside the region is an output of the region's function, so a rule
that requires "used only by ..." sees that use too, and a match legal in the region is legal in the model --
provided the region does not cut a conv/matmul chain between its head and its bias or ReLU (the chain would be
shorter here than in the model); the partition keeps chains whole (``search.partition_keeping_chains``).
Bound variables keep their names, so a match found in the region names the same nodes in the model.
"""
from __future__ import annotations

from typing import Iterable

import tvm
from tvm import relax

from tvm_interop.runtime.errors import InteropError

from ..substitutions.graph import substitute_vars


def main_bindings(mod: tvm.IRModule) -> list:
    """The bindings of ``main``'s body, in program order (all blocks)."""
    return [b for block in mod["main"].body.blocks for b in block.bindings]


def region_bindings(mod: tvm.IRModule, names: Iterable[str]) -> list:
    """The bindings of ``names`` plus the tuple / tuple-item bindings that only read them (a split's parts go with
    the split), in program order."""
    names = set(names)
    out, inside = [], set()
    for b in main_bindings(mod):
        name = b.var.name
        if name in names:
            out.append(b)
            inside.add(name)
        elif isinstance(b.value, (relax.Tuple, relax.TupleGetItem)):
            used = {v.name for v in relax.analysis.free_vars(b.value)}
            if used and used <= inside:
                out.append(b)
                inside.add(name)
    missing = names - inside
    if missing:
        raise InteropError(f"region names {sorted(missing)[:5]} are not bindings of main")
    return out


def extract_region(mod: tvm.IRModule, names: Iterable[str]) -> tvm.IRModule:
    """``main(inputs...) -> outputs`` holding exactly the bindings of ``names`` (see :func:`region_bindings`):
    parameters are the values it reads from outside (constants stay inline), outputs every value it defines that
    the rest of ``main`` (or ``main``'s result) reads."""
    region = region_bindings(mod, names)
    defined = {b.var for b in region}
    reads_outside: set = set()
    for b in main_bindings(mod):
        if b.var not in defined:
            reads_outside |= set(relax.analysis.free_vars(b.value))
    body = mod["main"].body
    reads_outside |= set(relax.analysis.free_vars(body.body))
    externals: list = []
    for b in region:
        for v in relax.analysis.free_vars(b.value):
            if v not in defined and v not in externals:
                externals.append(v)
    outputs = [b.var for b in region if b.var in reads_outside]
    if not outputs:   # a region nothing reads (dead code): keep its last value so the function is well formed
        outputs = [region[-1].var]
    bb = relax.BlockBuilder()
    params = [relax.Var(v.name, v.ty) for v in externals]
    vmap = dict(zip(externals, params))
    with bb.function("main", params):
        with bb.dataflow():
            for b in region:
                vmap[b.var] = bb.emit(substitute_vars(b.value, vmap), name_hint=b.var.name)
            outs = [vmap[v] for v in outputs]
            result = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
        bb.emit_func_output(result)
    return bb.get()
