"""Weights repacked once, when the model is built, instead of on every call.

``cpu_schedule``'s convolution plan copies each weight into a vector-friendly layout (``OIHW`` -> ``O/16 I H W
16``) inside the kernel, so every inference re-reads and re-writes every weight: ResNet-50 moves its 100 MB of
weights twice per call. The copy is marked as a layout-rewrite preprocessing block (MetaSchedule's annotation,
:data:`PREPACK_ANNOTATION`); here, at build time, each such kernel is split by TVM's own
``relax.transform.SplitLayoutRewritePreproc`` into the copy and the compute, the copy is run once on each
weight constant, and the library gets the compute kernel (under the original name, so plans and programs refer
to it unchanged) and the repacked constants.

Only the built library changes: the prepared program that the schedulers, cost models, merge and tuning see is
untouched (:func:`prepack_weights` returns a copy). A kernel is left as it is (and the reason logged) when its
weight is not a constant or a constant is shared with another use.

Measured with ``scripts/bench.py squeezenet resnet50 --schedulers sequential --repeat 10 --no-torch`` on the 2-core
EPYC dev machine, medians: ResNet-50 sequential 108.1 ms before, 89.3 ms after (ONNX Runtime 38.5 ms in the same
run); SqueezeNet 10.9 -> 10.8 ms (its weights are small). Every output matched plain TVM.

The measured cost model (``passes.cost.measured``) times what ships: :func:`shipped_kernels` names the same
kernels, and it builds their compute part and feeds it a weight of the repacked shape (its cache keys hash the
compute kernel, so entries timed with the in-kernel repack are not reused). Profiling bundles still build the
prepared program as it is.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import tvm
from tvm import relax

log = logging.getLogger(__name__)

PREPACK_ANNOTATION = "meta_schedule.layout_rewrite_preproc"


def _has_prepack_block(func) -> bool:
    """True when a top-level block of the kernel is marked as weight preprocessing."""
    try:
        sch = tvm.s_tir.Schedule(func)
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
    except Exception:  # noqa: BLE001 - a kernel without the usual root block is not ours to split
        return False
    return any(PREPACK_ANNOTATION in sch.get(b).annotations for b in blocks)


def _split(name: str, func, num_outputs: int):
    """``(prepack PrimFunc, compute PrimFunc, rewritten parameter index)`` of one kernel, or None when TVM's pass
    does not split it into exactly one rewritten parameter."""
    params = [p for p in func.params]   # TVM 0.27: each parameter is the buffer itself (shape, dtype)
    shapes = [[int(d) for d in p.shape] for p in params]
    dtypes = [str(p.dtype) for p in params]
    n_in = len(params) - num_outputs
    bb = relax.BlockBuilder()
    gv = bb.add_func(func, name)   # typed GlobalVar: call_tir checks its callee is a TIR function
    args = [relax.Var(f"a{i}", relax.TensorType(shapes[i], dtypes[i])) for i in range(n_in)]
    out_sinfo = [relax.TensorType(shapes[i], dtypes[i]) for i in range(n_in, len(params))]
    with bb.function("main", args):
        out = bb.emit(relax.call_tir(gv, args, out_sinfo if len(out_sinfo) > 1 else out_sinfo[0]))
        bb.emit_func_output(out)
    split = relax.transform.SplitLayoutRewritePreproc()(bb.get())
    pre = [f for g, f in split.functions.items() if g.name_hint.endswith("_weight_prepack")]
    comp = [f for g, f in split.functions.items() if g.name_hint.endswith("_prepacked")]
    if len(pre) != 1 or len(comp) != 1:
        return None
    comp_shapes = [[int(d) for d in p.shape] for p in comp[0].params]
    changed = [i for i, (a, b) in enumerate(zip(shapes, comp_shapes)) if a != b]
    if len(changed) != 1 or changed[0] >= n_in or len(pre[0].params) != 2:
        return None
    return pre[0], comp[0], changed[0]


@dataclasses.dataclass(frozen=True)
class ShippedKernel:
    """A kernel that the built library runs without its weight repack: ``compute`` (the PrimFunc that ships, under
    the kernel's name), ``prepack`` (the copy run once per weight at build time), ``pos`` (the repacked parameter)
    and ``shape`` (the repacked weight's shape)."""

    prepack: object
    compute: object
    pos: int
    shape: tuple


def split_kernel(name: str, func, num_outputs: int) -> ShippedKernel | None:
    """``func`` split into its weight repack and its compute part, or None when it has no repack block or TVM's
    pass does not split it into exactly one rewritten parameter."""
    if not _has_prepack_block(func):
        return None
    got = _split(name, func, num_outputs)
    if got is None:
        return None
    pre, comp, pos = got
    return ShippedKernel(pre, comp, pos, tuple(int(d) for d in comp.params[pos].shape))


def shipped_kernels(program, target=None) -> dict[str, ShippedKernel]:
    """The kernels of ``program`` that :func:`prepack_weights` (the build) replaces by their compute part: name ->
    :class:`ShippedKernel`. Every other kernel ships as it is. ``target`` is accepted for symmetry (the split
    does not depend on it)."""
    uses: dict[int, list[tuple[str, int]]] = {}   # constant index -> [(kernel, parameter position)]
    outputs_of: dict[str, int] = {}
    for call in program.calls.values():
        outputs_of[call.func_name] = len(call.outputs)
        for pos, ref in enumerate(call.args):
            if ref.kind == "const":
                uses.setdefault(ref.index, []).append((call.func_name, pos))
    candidates = {gv.name_hint: f for gv, f in program.mod.functions.items()
                  if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None
                  and "tvm_interop.cpu_plan" in f.attrs and _has_prepack_block(f)}
    out: dict[str, ShippedKernel] = {}
    for name, func in sorted(candidates.items()):
        if name not in outputs_of:
            continue
        got = split_kernel(name, func, outputs_of[name])
        if got is None:
            log.debug("prepack: %s not split by SplitLayoutRewritePreproc; kept as it is", name)
            continue
        refs = [c.args[got.pos] for c in program.calls.values() if c.func_name == name]
        if any(r.kind != "const" for r in refs):
            log.info("prepack: %s takes a weight that is not a constant; it repacks at run time", name)
            continue
        if any(uses[r.index] != [(name, got.pos)] for r in refs):   # each weight used by this call only
            log.info("prepack: a weight of %s has other uses; it repacks at run time", name)
            continue
        out[name] = got
    return out


def prepack_weights(program, target):
    """A copy of ``program`` whose prepacking kernels read their weights already repacked (see the module)."""
    from ..extract import Program  # noqa: F401 - the type this works on

    shipped = shipped_kernels(program, target)
    if not shipped:
        return program
    constants = list(program.constants)
    exprs = list(program.const_exprs)
    packed: dict = {}
    for name, sk in shipped.items():
        pre, comp, pos = sk.prepack, sk.compute, sk.pos
        func = program.mod[name]
        refs = [c.args[pos] for c in program.calls.values() if c.func_name == name]
        fn = tvm.tirx.build(tvm.IRModule({"main": pre.with_attr("global_symbol", "main")}), target=target)
        out_buf = pre.params[1]
        for r in refs:
            src = tvm.runtime.tensor(np.ascontiguousarray(constants[r.index]))
            dst = tvm.runtime.empty([int(d) for d in out_buf.shape], str(out_buf.dtype))
            fn["main"](src, dst)
            arr = dst.numpy()
            constants[r.index] = arr
            exprs[r.index] = relax.const(arr)
        attrs = {k: v for k, v in func.attrs.items()} if func.attrs is not None else {}
        attrs["tvm_interop.prepacked"] = True
        packed[name] = comp.with_attrs(attrs)
    if not packed:
        return program
    log.info("prepack: %d kernel(s) read weights repacked at build time", len(packed))
    return dataclasses.replace(program, mod=_rebuild(program.mod, packed, {
        c: exprs[i] for i, c in enumerate(program.const_exprs) if exprs[i] is not c}),
        constants=constants, const_exprs=exprs)


def _rebuild(mod, packed: dict, replace: dict):
    """``mod`` with each kernel of ``packed`` (name -> compute PrimFunc) in place of the old one, under the same
    name and a GlobalVar typed for its new signature, and ``main`` calling it with the repacked constants of
    ``replace`` (old constant -> new one). The stream lowering rebuilds its calls from ``main``'s bindings,
    constants included, and matches constants by identity, so ``main`` holds the very objects of
    ``const_exprs``."""
    from ..lower_streams import _const_key

    base = tvm.IRModule({g: f for g, f in mod.functions.items() if g.name_hint not in packed}, attrs=mod.attrs)
    bb = relax.BlockBuilder(base)
    new_gv = {name: bb.add_func(func, name) for name, func in packed.items()}
    assert all(g.name_hint == n for n, g in new_gv.items()), "kernel renamed on insertion"
    by_key = {_const_key(old): new for old, new in replace.items()}

    @relax.expr_functor.mutator
    class _Swap(relax.PyExprMutator):
        def visit_generic_const_(self, op):  # noqa: N802 - TVM's visitor name
            return by_key.get(_const_key(op), op)

        def visit_global_var_(self, op):  # noqa: N802
            return new_gv.get(op.name_hint, op)

    out = bb.get()
    main = out["main"]
    body = _Swap().visit_expr(main.body)
    func = relax.Function(list(main.params), body, main.ret_ty, main.is_pure)
    out["main"] = func.with_attrs(dict(main.attrs)) if main.attrs else func
    return out
