"""Prepare a Relax module for scheduling: checks, then TVM's own legalize + fusion pipeline.

The units the scheduler places are the fused kernels TVM itself would run, so a schedule never changes what
is computed, only when. We run exactly the passes of ``relax.get_pipeline("zero")`` (LegalizeOps,
AnnotateTIROpPattern, FoldConstant, FuseOps, FuseTIR) and check the input first, so that a model we cannot
handle fails here with a message naming the problem, not deep inside TVM.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time

import tvm
from tvm import relax

from tvm_interop.runtime.errors import UnsupportedModelError

from .fold_layout import fold_constant_layout_transforms
from .layout import blocked_convs, layout_block, legalize_map, resolve_layout, to_nchwc
from .target import normalize_target

log = logging.getLogger(__name__)

# Relax operators that are not computation and legitimately survive legalization.
_STRUCTURAL_OPS = {
    "relax.call_tir", "relax.call_tir_inplace", "relax.call_pure_packed", "relax.call_packed",
    "relax.null_value", "relax.shape_of", "relax.print", "relax.assert_op",
}


def check_static_inputs(mod: tvm.IRModule, func_name: str = "main") -> None:
    """Raise UnsupportedModelError naming the first input dimension that is not a compile-time constant."""
    if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise UnsupportedModelError(f"the module has no Relax function {func_name!r}")
    func = mod[func_name]
    if not isinstance(func, relax.Function):
        raise UnsupportedModelError(f"{func_name!r} is not a Relax function")
    for p in func.params:
        _check_static_type(p.ty, p.name)
    _check_static_type(func.ret_ty, "output")


def _check_static_type(sinfo, where: str) -> None:
    if isinstance(sinfo, relax.TupleType):
        for i, f in enumerate(sinfo.fields):
            _check_static_type(f, f"{where}[{i}]")
        return
    if not isinstance(sinfo, relax.TensorType):
        raise UnsupportedModelError(f"{where}: only tensor inputs and outputs are supported, got {sinfo}")
    if sinfo.shape is None or not isinstance(sinfo.shape, relax.ShapeExpr):
        raise UnsupportedModelError(f"{where}: tensor rank/shape unknown ({sinfo}); dynamic shapes are not supported")
    for axis, dim in enumerate(sinfo.shape.values):
        if not isinstance(dim, tvm.tirx.IntImm):
            raise UnsupportedModelError(
                f"{where}: dimension {axis} is dynamic ({dim}); tvm-interop schedules static shapes only — "
                f"bind '{dim}' to a number (e.g. a shape_dict in the frontend) before compiling"
            )
        if int(dim) == 0:
            raise UnsupportedModelError(f"{where}: dimension {axis} has size 0; zero-size tensors are not supported")


def _unlegalized_ops(mod: tvm.IRModule) -> list[str]:
    """Operator names left in Relax functions after LegalizeOps (i.e. TVM has no lowering for them)."""
    found: list[str] = []

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op):
            name = e.op.name
            if name not in _STRUCTURAL_OPS and not name.startswith("relax.builtin.") and name not in found:
                found.append(name)

    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return found


CONV_ATTRS = "tvm_interop.conv_attrs"
LAYOUT_ATTR = "tvm_interop.layout"  # module attribute: JSON {"layout": "nchw"|"nchwc", "block", "blocked_convs", "convs"}
CPU_SCHEDULED = "tvm_interop.cpu_scheduled"  # module attribute: PrimFuncs carry the default CPU schedules


def weight_key(array) -> str:
    """Content key of a weight tensor: how a fused unit finds the convolution it came from."""
    import numpy as np

    a = np.ascontiguousarray(array)
    return hashlib.sha1(a.tobytes() + str(a.shape).encode() + str(a.dtype).encode()).hexdigest()[:20]


def collect_conv_attrs(mod: tvm.IRModule) -> dict[str, dict]:
    """Attributes of every ``relax.nn.conv2d`` whose weight is a constant, keyed by the weight's content.

    Fusion turns convolutions into TIR, where strides and padding are only implicit; the operator merge (and the
    simulated cost of a merged convolution) need them, so we record them before legalization.
    """
    table: dict[str, dict] = {}
    conv_op = tvm.ir.Op.get("relax.nn.conv2d")
    const_type = tvm.ir.expr.GenericConst

    def visit(e):
        if isinstance(e, relax.Call) and e.op.same_as(conv_op) and isinstance(e.args[1], const_type):
            at = e.attrs
            w = e.args[1].value.numpy()
            table[weight_key(w)] = {
                "strides": [int(v) for v in at.strides], "padding": [int(v) for v in at.padding],
                "dilation": [int(v) for v in at.dilation], "groups": int(at.groups),
                "data_layout": str(at.data_layout), "kernel_layout": str(at.kernel_layout),
                "kernel_shape": [int(v) for v in w.shape],
            }

    for _gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return table


def prepare(mod: tvm.IRModule, target: "str | tvm.target.Target | None" = None,
            cpu_schedule: bool = True, layout: str = "auto") -> tvm.IRModule:
    """Check ``mod`` and run legalize + fusion. Returns the fused module (main = call_tir bindings).

    For CPU targets the fused kernels also get the default CPU schedules (``passes.kernels.cpu_schedule``:
    tiling, vectorisation, parallel loops) unless ``cpu_schedule=False``: TVM's untuned CPU kernels are naive, and
    scheduling operators that are 40x slower than they need to be would optimise the wrong thing.

    ``layout``: ``"auto"`` (default: channel-blocked ``NCHW[c]c`` activations on CPU targets, NCHW elsewhere),
    ``"nchw"`` (TVM's layout) or ``"nchwc"`` (``passes.layout``). The result records it in the module attribute
    ``tvm_interop.layout``.
    """
    if not isinstance(mod, tvm.IRModule):
        raise UnsupportedModelError(f"expected a tvm.IRModule, got {type(mod).__name__}")
    check_static_inputs(mod)
    t0 = time.perf_counter()
    conv_table = collect_conv_attrs(mod)
    ctx_target = normalize_target(target) if target is not None else None
    try:
        layout_info = {"layout": resolve_layout(layout, ctx_target)}
    except ValueError as e:
        raise UnsupportedModelError(str(e)) from None
    if layout_info["layout"] == "nchwc":
        block = layout_block(layout, ctx_target)
        try:
            mod = to_nchwc(mod, block)
            layout_info.update(block=block, **dict(zip(("blocked_convs", "convs"), blocked_convs(mod))))
        except Exception as e:  # noqa: BLE001 - TVM's ConvertLayout raises several types
            why = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            if layout != "auto":
                raise UnsupportedModelError(f"TVM's ConvertLayout could not block this model's channels "
                                            f"(layout={layout!r}): {why}; use layout='nchw'") from None
            log.warning("layout: NCHW kept, TVM's ConvertLayout failed on this model: %s", why)
            layout_info = {"layout": "nchw", "fallback": why}
    if layout_info["layout"] == "nchwc":
        # the weights' and biases' new layouts, computed here rather than by one kernel build each in FoldConstant
        mod, _ = fold_constant_layout_transforms(mod)
    passes = [relax.transform.LegalizeOps(legalize_map()), relax.transform.AnnotateTIROpPattern()]
    try:
        if ctx_target is not None:
            with ctx_target:
                legal = tvm.transform.Sequential(passes)(mod)
        else:
            legal = tvm.transform.Sequential(passes)(mod)
    except Exception as e:  # noqa: BLE001 - TVM raises several types here  # pragma: no cover
        raise UnsupportedModelError(f"TVM could not legalize the model: {str(e).splitlines()[-1]}") from None
    left = _unlegalized_ops(legal)
    if left:
        raise UnsupportedModelError(
            f"operator(s) {', '.join(left)} cannot be lowered by TVM's LegalizeOps, so they cannot be built as "
            "kernels; rewrite them or register a legalization"
        )
    fused = tvm.transform.Sequential(
        [relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
    )(legal)
    log.info("prepare: legalize + fuse took %.2f s", time.perf_counter() - t0)
    fused = fused.with_attr(CONV_ATTRS, json.dumps(conv_table)).with_attr(LAYOUT_ATTR, json.dumps(layout_info))
    kind = ctx_target.kind.name if ctx_target is not None else "llvm"
    if cpu_schedule and kind in ("llvm", "c"):
        from .kernels.cpu_schedule import apply_cpu_schedules

        t1 = time.perf_counter()
        # keep the unscheduled kernels: analyses that read the operator structure (merge) look at those
        unscheduled = tvm.IRModule({gv: f for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)})
        # the normalized target: a plain "llvm" means this machine's CPU (passes.target), and the schedules'
        # vector width and register count come from it (generic x86-64 would get SSE's 4 lanes)
        fused = apply_cpu_schedules(fused, ctx_target or normalize_target("llvm")).with_attr(CPU_SCHEDULED,
                                                                                              unscheduled)
        log.info("prepare: default CPU schedules applied in %.2f s", time.perf_counter() - t1)
    return fused
