"""Channel-blocked activations (``NCHW[c]c``) for CPU builds: the graph-level layout pass.

Why: a model's convolutions in NCHW pay, inside a model, for scattered reads of the input planes and a
transposed write-back of every register tile (see ``passes.kernels.nchwc``); ONNX Runtime and oneDNN run CNNs
in ``NCHW[c]c``. Measured on a 2-core Xeon (AVX-512, ``c`` = 16), sequential programs, same process,
interleaved: ResNet-50 40.2 -> 32.7 ms, Inception-v3 50.3 -> 43.2, SqueezeNet 4.51 -> 4.08, GoogLeNet 14.9 ->
14.2.

How: TVM's ``ConvertLayout`` rewrites every ``relax.nn.conv2d`` whose channels divide by ``c`` to
``NCHW[c]c`` data / ``OIHW[c]i[c]o`` weights, carries the layout through the operators that can follow it
(element-wise, pooling, concatenation of whole blocks, ...) and inserts ``layout_transform`` where it cannot
(the stem's 3 input channels, grouped convolutions, reshapes before the classifier). Weights are constants, so
their transforms fold at build time. TOPI does not legalize channel-blocked convolutions:
:func:`legalize_conv2d` gives them :func:`passes.kernels.nchwc.conv2d_nchwc`, and every other convolution
TVM's own legalization. What the model computes is unchanged (only the order of the sums: within 1e-4 of
TVM's build on the zoo, tested).

The block ``c`` is the target's fp32 vector width (16 on AVX-512, 8 on AVX2), so a channel block is one vector
register. GPU targets keep NCHW (cuDNN units and the CUDA schedules expect it).
"""
from __future__ import annotations

import logging
import re

import tvm
from tvm import relax

log = logging.getLogger(__name__)

LAYOUTS = ("auto", "nchw", "nchwc")   # and "nchw<N>c": channel-blocked with an explicit block N
_DATA_BLOCKED = re.compile(r"NCHW(\d+)c")
_KERNEL_BLOCKED = re.compile(r"OIHW(\d+)i(\d+)o")
_KERNEL_OUT_BLOCKED = re.compile(r"OIHW(\d+)o")
_EXPLICIT = re.compile(r"nchw(\d+)c")


def check_layout(layout: str) -> str:
    """``layout`` itself, or a ValueError that names the choices."""
    m = _EXPLICIT.fullmatch(str(layout))
    if m is not None:
        if int(m.group(1)) < 1:
            raise ValueError(f"layout {layout!r}: the channel block must be at least 1")
        return layout
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)} (or nchw<N>c for an "
                         "explicit channel block N)")
    return layout


def channel_block(target) -> int:
    """The ``c`` of ``NCHW[c]c`` for ``target``: its fp32 vector width (at least 4)."""
    from .kernels.cpu_schedule import vector_lanes

    return max(4, vector_lanes(target))


def resolve_layout(layout: str, target) -> str:
    """``"nchwc"`` or ``"nchw"``: ``auto`` means channel-blocked on CPU targets, NCHW elsewhere."""
    check_layout(layout)
    blocked = layout == "nchwc" or _EXPLICIT.fullmatch(layout) is not None
    if target is None:   # no target, no CPU to block for: TVM's own layout
        if blocked:
            raise ValueError(f"layout={layout!r} needs a CPU target (its vector width sets the block)")
        return "nchw"
    kind = target.kind.name
    if kind not in ("llvm", "c"):
        if blocked:
            raise ValueError(f"layout={layout!r} is for CPU targets; {kind} builds keep NCHW")
        return "nchw"
    return "nchw" if layout == "nchw" else "nchwc"


def layout_block(layout: str, target) -> int:
    """The channel block of a blocked ``layout``: explicit (``nchw8c``) or the target's vector width."""
    m = _EXPLICIT.fullmatch(layout)
    return int(m.group(1)) if m is not None else channel_block(target)


def legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """Legalization of ``relax.nn.conv2d``: channel-blocked ones by our TE kernel, the rest by TVM's."""
    from tvm.relax.transform.legalize_ops.nn import _nn_conv2d

    from .kernels.nchwc import conv2d_nchw_to_nchwc, conv2d_nchwc

    at = call.attrs
    data = _DATA_BLOCKED.fullmatch(str(at.data_layout))
    kernel = _KERNEL_BLOCKED.fullmatch(str(at.kernel_layout))
    stem = _KERNEL_OUT_BLOCKED.fullmatch(str(at.kernel_layout))
    out = _DATA_BLOCKED.fullmatch(str(at.out_layout))
    if (str(at.data_layout) == "NCHW" and stem is not None and out is not None and int(at.groups) == 1
            and stem.group(1) == out.group(1)):   # the stem (passes.layout.block_stems)
        return bb.call_te(conv2d_nchw_to_nchwc, call.args[0], call.args[1], [int(v) for v in at.strides],
                          [int(v) for v in at.padding], [int(v) for v in at.dilation],
                          primfunc_name_hint="conv2d_NCHWc")
    if data is None and kernel is None and stem is None:
        return _nn_conv2d(bb, call)
    if (data is None or kernel is None or int(at.groups) != 1 or str(at.out_layout) != str(at.data_layout)
            or not data.group(1) == kernel.group(1) == kernel.group(2)):
        raise ValueError(f"conv2d with layouts {at.data_layout}/{at.kernel_layout}/{at.out_layout} and "
                         f"{int(at.groups)} groups has no legalization (tvm-interop blocks ungrouped convs only)")
    return bb.call_te(conv2d_nchwc, call.args[0], call.args[1], [int(v) for v in at.strides],
                      [int(v) for v in at.padding], [int(v) for v in at.dilation],
                      primfunc_name_hint="conv2d_NCHWc")


def legalize_map() -> dict:
    """``LegalizeOps`` overrides every prepare uses (a module already in NCHW is legalized as TVM would)."""
    return {"relax.nn.conv2d": legalize_conv2d}


def to_nchwc(mod: tvm.IRModule, block: int) -> tvm.IRModule:
    """``mod`` with its convolutions (channels divisible by ``block``) in ``NCHW[block]c`` (Relax, not legalized)."""
    desired = {"relax.nn.conv2d": [f"NCHW{block}c", f"OIHW{block}i{block}o"]}
    mod, padded = pad_channels(mod, block)
    out = relax.transform.ConvertLayout(desired)(mod)
    out, stems = block_stems(out, block)
    log.info("layout: %d of %d convolutions in NCHW%dc (%d writing it from NCHW input, %d with padded outputs)",
             *blocked_convs(out), block, stems, padded)
    return out


def blocked_convs(mod: tvm.IRModule) -> tuple[int, int]:
    """(channel-blocked, all) ``relax.nn.conv2d`` calls of a Relax module before legalization."""
    conv = tvm.ir.Op.get("relax.nn.conv2d")
    counts = [0, 0]

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.same_as(conv):
            counts[1] += 1
            counts[0] += bool(_DATA_BLOCKED.fullmatch(str(e.attrs.out_layout)))

    for _gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return counts[0], counts[1]


def program_layout(program) -> dict:
    """What ``prepare`` built a program in: ``{"layout": "nchw"}`` or ``{"layout": "nchwc", "block": c,
    "blocked_convs": k, "convs": n}`` (modules prepared before layouts existed count as NCHW)."""
    import json

    attrs = program.mod.attrs
    if attrs is None or "tvm_interop.layout" not in attrs:
        return {"layout": "nchw"}
    return json.loads(str(attrs["tvm_interop.layout"]))


_CHAIN_OPS = ("relax.add", "relax.nn.relu", "relax.nn.max_pool2d", "relax.nn.avg_pool2d")


def block_stems(mod: tvm.IRModule, block: int) -> tuple[tvm.IRModule, int]:
    """Blocked outputs for the convolutions ``ConvertLayout`` leaves in NCHW because of their *input* (the stem:
    3 channels): ``conv -> [bias add, relu, pooling] -> layout_transform(NCHW -> NCHW[b]c)`` becomes a
    convolution that reads NCHW and writes ``NCHW[b]c`` directly, its epilogue and pooling in ``NCHW[b]c``, and
    no transform.

    Why: a stem's reduction is short (3x3x3 = 27 multiply-adds per output), so writing its register tile back
    transposed into NCHW planes costs as much as computing it (SqueezeNet's stem: 373 us in the model on 2 cores),
    and the NCHW result is then read again by a layout transform. Returns the module and the number rewritten.
    """
    import numpy as np

    func = mod["main"]
    bindings = [b for blk in func.body.blocks for b in blk.bindings if isinstance(blk, relax.DataflowBlock)]
    producer = {b.var: b for b in bindings if isinstance(b, relax.VarBinding)}
    uses: dict = {}

    def count(e):
        if isinstance(e, relax.Var):
            uses[e] = uses.get(e, 0) + 1

    for _gv, f in mod.functions.items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f.body, count)

    def op_name(b):
        v = b.value if b is not None else None
        return v.op.name if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) else None

    # the NCHW -> NCHW[b]c transforms, by the var they transform (ConvertLayout inserts one per consumer)
    transforms: dict = {}
    for b in bindings:
        if op_name(b) == "relax.layout_transform" and _is_nchw_to_blocked(b.value, block):
            transforms.setdefault(b.value.args[0], []).append(b)
    plans: dict = {}   # a layout_transform's var -> (conv binding, [chain bindings, producer first])
    for src, lts in transforms.items():
        if uses.get(src) != len(lts):
            continue   # the NCHW tensor has other consumers
        b = lts[0]
        chain, v = [], b.value.args[0]
        # every tensor of the chain feeds only the next op (src: only the transforms, checked above)
        while (isinstance(v, relax.DataflowVar) and (v.same_as(src) or uses.get(v) == 1)
               and op_name(producer.get(v)) in _CHAIN_OPS):
            chain.append(producer[v])
            v = producer[v].value.args[0]
        ok = isinstance(v, relax.DataflowVar) and (v.same_as(src) or uses.get(v) == 1)
        conv = producer.get(v) if ok else None
        if op_name(conv) != "relax.nn.conv2d" or not _stem_conv(conv.value, block):
            continue
        if all(_chain_op_ok(c.value) for c in chain):
            plans[b.var] = (conv, chain[::-1])
            for other in lts[1:]:
                plans[other.var] = b.var   # the same blocked tensor
    if not plans:
        return mod, 0

    def const_np(e):
        return e.data.numpy() if hasattr(e, "data") else e.value.numpy()

    def blocked_channel_const(arr):   # [1, C, 1, 1] -> [1, C/b, 1, 1, b]
        c = arr.shape[1]
        return relax.const(np.ascontiguousarray(arr.reshape(1, c // block, block, 1, 1).transpose(0, 1, 3, 4, 2)))

    @relax.expr_functor.mutator
    class _Rewrite(relax.PyExprMutator):
        def visit_var_binding_(self, binding):  # noqa: N802 - TVM's visitor name
            if binding.var not in plans:
                return super().visit_var_binding_(binding)
            if isinstance(plans[binding.var], relax.Var):   # a twin of a rewritten transform
                self.set_var_remap(binding.var, self.get_var_remap(plans[binding.var]))
                return
            conv, chain = plans[binding.var]
            at = conv.value.attrs
            w = const_np(conv.value.args[1])
            o = w.shape[0]
            wb = np.ascontiguousarray(w.reshape(o // block, block, *w.shape[1:]).transpose(0, 2, 3, 4, 1))
            cur = self.builder_.emit(relax.op.nn.conv2d(
                self.visit_expr(conv.value.args[0]), relax.const(wb), strides=at.strides, padding=at.padding,
                dilation=at.dilation, groups=1, data_layout="NCHW", kernel_layout=f"OIHW{block}o",
                out_layout=f"NCHW{block}c"))
            lay = f"NCHW{block}c"
            for c in chain:
                call = c.value
                name = call.op.name
                if name == "relax.add":
                    k = 1 if isinstance(call.args[1], tvm.ir.expr.GenericConst) else 0
                    cur = self.builder_.emit(relax.op.add(cur, blocked_channel_const(const_np(call.args[k]))))
                elif name == "relax.nn.relu":
                    cur = self.builder_.emit(relax.op.nn.relu(cur))
                else:
                    a = call.attrs
                    pool = relax.op.nn.max_pool2d if name == "relax.nn.max_pool2d" else relax.op.nn.avg_pool2d
                    cur = self.builder_.emit(pool(cur, pool_size=a.pool_size, strides=a.strides, padding=a.padding,
                                                  dilation=a.dilation, ceil_mode=a.ceil_mode,
                                                  count_include_pad=a.count_include_pad, layout=lay, out_layout=lay))
            self.set_var_remap(binding.var, cur)

    new_main = _Rewrite(mod).visit_expr(func)
    out = tvm.IRModule({gv: (new_main if gv.name_hint == "main" else f) for gv, f in mod.functions.items()},
                       attrs=mod.attrs)
    return relax.transform.DeadCodeElimination()(out), sum(not isinstance(p, relax.Var) for p in plans.values())


def _is_nchw_to_blocked(call: relax.Call, block: int) -> bool:
    """``layout_transform(x: [N, C, H, W]) -> [N, C/b, H, W, b]`` with the NCHW -> NCHW[b]c map, no padding."""
    from tvm_ffi import structural_equal

    at = call.attrs
    if getattr(at, "pad_value", None) is not None:
        return False
    shape = call.args[0].ty.shape if isinstance(call.args[0].ty, relax.TensorType) else None
    if shape is None or len(shape.values) != 4 or int(shape.values[1]) % block:
        return False
    return any(structural_equal(at.index_map, tvm.tirx.IndexMap.from_func(
        lambda n, c, h, w: (n, c // block, h, w, c % block), index_dtype=dt), map_free_vars=True)
        for dt in ("int64", "int32"))


def _stem_conv(call: relax.Call, block: int) -> bool:
    at = call.attrs
    w = call.args[1]
    return (str(at.data_layout) == "NCHW" and str(at.kernel_layout) == "OIHW" and str(at.out_layout) == "NCHW"
            and int(at.groups) == 1 and isinstance(w, tvm.ir.expr.GenericConst)
            and int(w.ty.shape.values[0]) % block == 0)


def _chain_op_ok(call: relax.Call) -> bool:
    """An op of the stem's epilogue that has a blocked form here: a per-channel constant add, relu, NCHW pooling."""
    name = call.op.name
    if name == "relax.add":
        consts = [a for a in call.args if isinstance(a, tvm.ir.expr.GenericConst)]
        if len(consts) != 1:
            return False
        s = [int(d) for d in consts[0].ty.shape.values]
        return len(s) == 4 and s[0] == s[2] == s[3] == 1
    if name == "relax.nn.relu":
        return True
    return str(call.attrs.layout) == "NCHW" and str(call.attrs.out_layout) == "NCHW"


_PAD_CHAIN_OPS = _CHAIN_OPS + ("relax.nn.adaptive_avg_pool2d",)
_MAX_CHANNEL_PADDING = 1.125   # pad a convolution's outputs to a whole block only where it costs <= 12.5 % more


def pad_channels(mod: tvm.IRModule, block: int) -> tuple[tvm.IRModule, int]:
    """Output channels padded with zero filters to a whole number of blocks, so that ``ConvertLayout`` blocks the
    convolution too: ``conv(O) -> [bias add, relu, pooling]`` becomes ``conv(O') -> [same, padded] ->
    strided_slice(:O)`` (``O'`` = O rounded up to the block), the slice after the chain, where it is smallest.

    Why: SqueezeNet's 1000-class 1x1 convolution (1000 = 62.5 x 16) stays NCHW otherwise, vectorised along its
    13-wide rows, a quarter of its model's time. The padded channels compute relu(0 + 0) = 0 and are sliced away:
    same result. Returns the module and the number of convolutions padded.
    """
    import numpy as np

    func = mod["main"]
    bindings = [b for blk in func.body.blocks if isinstance(blk, relax.DataflowBlock) for b in blk.bindings]
    producer = {b.var: b for b in bindings}
    uses: dict = {}

    def count(e):
        if isinstance(e, relax.Var):
            uses[e] = uses.get(e, 0) + 1

    relax.analysis.post_order_visit(func.body, count)
    consumer: dict = {}
    for b in bindings:
        if isinstance(b.value, relax.Call):
            for a in b.value.args:
                if isinstance(a, relax.DataflowVar):
                    consumer.setdefault(a, []).append(b)

    def op_name(b):
        v = b.value if b is not None else None
        return v.op.name if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) else None

    plans: dict = {}   # chain end var -> (conv binding, chain bindings in order, padded channel count)
    for b in bindings:
        if op_name(b) != "relax.nn.conv2d" or not _paddable_conv(b.value, block):
            continue
        o = int(b.value.args[1].ty.shape.values[0])
        padded = -(-o // block) * block
        chain, v = [], b.var
        while (isinstance(v, relax.DataflowVar) and uses.get(v) == 1 and len(consumer.get(v, [])) == 1
               and op_name(consumer[v][0]) in _PAD_CHAIN_OPS and _chain_op_ok(consumer[v][0].value)
               and consumer[v][0].value.args[0].same_as(v)):
            chain.append(consumer[v][0])
            v = consumer[v][0].var
        if chain and padded / o <= _MAX_CHANNEL_PADDING:
            plans[chain[-1].var] = (b, chain, padded)
    if not plans:
        return mod, 0

    def const_np(e):
        return e.data.numpy() if hasattr(e, "data") else e.value.numpy()

    def pad_axis(arr, axis, n):
        width = [(0, 0)] * arr.ndim
        width[axis] = (0, n - arr.shape[axis])
        return relax.const(np.pad(arr, width))

    @relax.expr_functor.mutator
    class _Rewrite(relax.PyExprMutator):
        def visit_var_binding_(self, binding):  # noqa: N802 - TVM's visitor name
            if binding.var not in plans:
                return super().visit_var_binding_(binding)
            conv, chain, padded = plans[binding.var]
            call = conv.value
            w = const_np(call.args[1])
            at = call.attrs
            cur = self.builder_.emit(relax.op.nn.conv2d(
                self.visit_expr(call.args[0]), pad_axis(w, 0, padded), strides=at.strides, padding=at.padding,
                dilation=at.dilation, groups=1, data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW"))
            for c in chain:
                v = c.value
                name = v.op.name
                if name == "relax.add":
                    k = 1 if isinstance(v.args[1], tvm.ir.expr.GenericConst) else 0
                    cur = self.builder_.emit(relax.op.add(cur, pad_axis(const_np(v.args[k]), 1, padded)))
                elif name == "relax.nn.relu":
                    cur = self.builder_.emit(relax.op.nn.relu(cur))
                elif name == "relax.nn.adaptive_avg_pool2d":
                    a = v.attrs
                    cur = self.builder_.emit(relax.op.nn.adaptive_avg_pool2d(cur, a.output_size, layout="NCHW"))
                else:
                    a = v.attrs
                    pool = relax.op.nn.max_pool2d if name == "relax.nn.max_pool2d" else relax.op.nn.avg_pool2d
                    cur = self.builder_.emit(pool(cur, pool_size=a.pool_size, strides=a.strides, padding=a.padding,
                                                  dilation=a.dilation, ceil_mode=a.ceil_mode,
                                                  count_include_pad=a.count_include_pad, layout="NCHW"))
            o = int(call.args[1].ty.shape.values[0])
            cur = self.builder_.emit(relax.op.strided_slice(cur, axes=[1], begin=[0], end=[o]))
            self.set_var_remap(binding.var, cur)

    new_main = _Rewrite(mod).visit_expr(func)
    out = tvm.IRModule({gv: (new_main if gv.name_hint == "main" else f) for gv, f in mod.functions.items()},
                       attrs=mod.attrs)
    return relax.transform.DeadCodeElimination()(out), len(plans)


def _paddable_conv(call: relax.Call, block: int) -> bool:
    """An NCHW, ungrouped convolution with a constant weight whose inputs block and whose outputs do not."""
    at = call.attrs
    w = call.args[1]
    if not (str(at.data_layout) == "NCHW" and str(at.kernel_layout) == "OIHW" and str(at.out_layout) == "NCHW"
            and int(at.groups) == 1 and isinstance(w, tvm.ir.expr.GenericConst)):
        return False
    o, i = (int(d) for d in w.ty.shape.values[:2])
    return o % block != 0 and o > block and i % block == 0
