"""The two rewrites around TVM's ``ConvertLayout`` that let the convolutions it leaves in NCHW block too.

``ConvertLayout`` blocks a convolution only when both its input and output channels divide the block. Two kinds
of convolution that matter fail that test, and both are rewritten here (``passes.layout.to_nchwc`` runs them):

* :func:`pad_channels` (before ``ConvertLayout``): output channels that do not fill whole blocks (SqueezeNet's
  1000 classes = 62.5 x 16, RandWire's 39 or 78) get zero filters up to the block, and a slice after their
  epilogue and pooling;
  :func:`pad_channel_pairs` pads the channels between two convolutions (GoogLeNet's 24) without a slice;
* :func:`block_stems` (after it): a convolution whose *input* cannot block (the stem: 3 channels) reads NCHW and
  writes ``NCHW[b]c`` itself, with its epilogue and pooling blocked, instead of NCHW plus a layout transform.

Both follow a convolution's single-use chain of per-channel operators (bias add with a ``[1, C, 1, 1]``
constant, relu, pooling) and re-emit it; anything else ends the chain.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

_CHAIN_OPS = ("relax.add", "relax.nn.relu", "relax.nn.max_pool2d", "relax.nn.avg_pool2d")
_PAD_CHAIN_OPS = _CHAIN_OPS + ("relax.nn.adaptive_avg_pool2d",)
_MAX_CHANNEL_PADDING = 1.125   # pad a convolution's outputs to a whole block only where it costs <= 12.5 % more
_MAX_SPATIAL_CHANNEL_PADDING = 1.75   # ... a spatial (k x k > 1) convolution's: unpadded it runs 3-27x slower
_MAX_PAIR_PADDING = 1.5        # ... between two convolutions (no slice, no transform: worth more padding)


# ----------------------------------------------------------------------------------------------- helpers
def _dataflow_bindings(func: relax.Function) -> list:
    return [b for blk in func.body.blocks if isinstance(blk, relax.DataflowBlock) for b in blk.bindings]


def _use_counts(func: relax.Function) -> dict:
    """How many times each var is referenced in ``func``'s body."""
    uses: dict = {}

    def count(e):
        if isinstance(e, relax.Var):
            uses[e] = uses.get(e, 0) + 1

    relax.analysis.post_order_visit(func.body, count)
    return uses


def _op_name(binding) -> str | None:
    v = binding.value if binding is not None else None
    return v.op.name if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) else None


def _const_array(expr) -> np.ndarray:
    return expr.data.numpy() if hasattr(expr, "data") else expr.value.numpy()


def _channel_const_arg(call: relax.Call) -> int:
    """Position of the constant operand of a bias add."""
    return 1 if isinstance(call.args[1], tvm.ir.expr.GenericConst) else 0


def _chain_op_ok(call: relax.Call) -> bool:
    """An op with a blocked and a padded form here: a per-channel constant add, relu, NCHW pooling."""
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


def _emit_chain(builder: relax.BlockBuilder, cur, chain: list, layout: str, channel_const) -> relax.Expr:
    """Re-emit ``chain`` (bindings of :data:`_PAD_CHAIN_OPS`) on ``cur`` in ``layout``; ``channel_const(array)``
    gives the constant a bias add uses in that layout."""
    for c in chain:
        call = c.value
        name = call.op.name
        if name == "relax.add":
            cur = builder.emit(relax.op.add(cur, channel_const(_const_array(call.args[_channel_const_arg(call)]))))
        elif name == "relax.nn.relu":
            cur = builder.emit(relax.op.nn.relu(cur))
        elif name == "relax.nn.adaptive_avg_pool2d":
            cur = builder.emit(relax.op.nn.adaptive_avg_pool2d(cur, call.attrs.output_size, layout=layout,
                                                                out_layout=layout))
        else:
            a = call.attrs
            pool = relax.op.nn.max_pool2d if name == "relax.nn.max_pool2d" else relax.op.nn.avg_pool2d
            cur = builder.emit(pool(cur, pool_size=a.pool_size, strides=a.strides, padding=a.padding,
                                    dilation=a.dilation, ceil_mode=a.ceil_mode,
                                    count_include_pad=a.count_include_pad, layout=layout, out_layout=layout))
    return cur


def _rewrite_main(mod: tvm.IRModule, plans: dict, emit) -> tvm.IRModule:
    """``mod`` with each binding whose var is in ``plans`` replaced by what ``emit(mutator, plan)`` emits (the
    bindings it replaces become dead and are removed)."""

    @relax.expr_functor.mutator
    class _Rewrite(relax.PyExprMutator):
        def visit_var_binding_(self, binding):  # noqa: N802 - TVM's visitor name
            if binding.var not in plans:
                return super().visit_var_binding_(binding)
            self.set_var_remap(binding.var, emit(self, plans[binding.var]))

    new_main = _Rewrite(mod).visit_expr(mod["main"])
    out = tvm.IRModule({gv: (new_main if gv.name_hint == "main" else f) for gv, f in mod.functions.items()},
                       attrs=mod.attrs)
    return relax.transform.DeadCodeElimination()(out)


def _sole_consumer(func: relax.Function):
    """``f(var)``: the binding that uses dataflow var ``var``, when it is its only use in ``func``; else None."""
    uses = _use_counts(func)
    consumers: dict = {}
    for b in _dataflow_bindings(func):
        if isinstance(b.value, relax.Call):
            for a in b.value.args:
                if isinstance(a, relax.DataflowVar):
                    consumers.setdefault(a, []).append(b)

    def only_consumer(v):
        nxt = consumers.get(v, [])
        return nxt[0] if isinstance(v, relax.DataflowVar) and uses.get(v) == 1 and len(nxt) == 1 else None

    return only_consumer


def _pad_axis(arr: np.ndarray, axis: int, n: int) -> relax.Constant:
    """``arr`` zero-padded at the end of ``axis`` to ``n``, as a Relax constant."""
    width = [(0, 0)] * arr.ndim
    width[axis] = (0, n - arr.shape[axis])
    return relax.const(np.pad(arr, width))


def _conv_kwargs(call: relax.Call) -> dict:
    at = call.attrs
    return dict(strides=at.strides, padding=at.padding, dilation=at.dilation, groups=1)


def _plain_conv(call: relax.Call) -> bool:
    """An NCHW, ungrouped ``relax.nn.conv2d`` with a constant weight."""
    at = call.attrs
    return (str(at.data_layout) == "NCHW" and str(at.kernel_layout) == "OIHW" and str(at.out_layout) == "NCHW"
            and int(at.groups) == 1 and isinstance(call.args[1], tvm.ir.expr.GenericConst))


# ----------------------------------------------------------------------------------------------- padding
def _max_channel_padding(in_channels: int, window: int, block: int) -> float:
    """How much more work padding a convolution's outputs to whole blocks may cost (0: never pad it).

    What the unpadded convolution would run as decides. A spatial one (``window`` = kh x kw > 1) stays NCHW with
    a ragged channel count, and NCHW's schedules then vectorise badly (measured alone, 2-core AVX-512, padded
    and sliced vs as is): 20 -> 39 channels, stride 2, 56 px: 1807 -> 67 us (no vector axis at all: scalar);
    3 -> 20 stem, stride 2: 121 -> 57 us at 1.6x the work; 64 -> 39 and 20 -> 39 at 28 px, stride 1: 667 ->
    158 and 221 -> 66 us (vectorised over the width). So those pad up to :data:`_MAX_SPATIAL_CHANNEL_PADDING`,
    whether or not their input blocks. A 1x1 convolution in NCHW is a matrix product that vectorises well
    (64 -> 100 at 14 px: 11 us, 18 padded; 512 -> 1000 at 13 px: 732, 852 padded), so it pads only to block
    (its input must block too) and only by :data:`_MAX_CHANNEL_PADDING`: SqueezeNet's classifier, 764 -> 649
    us in the model, where the blocked layout also spares the layout transforms around it.
    """
    if window > 1:
        return _MAX_SPATIAL_CHANNEL_PADDING
    return 0.0 if in_channels % block else _MAX_CHANNEL_PADDING


def pad_channels(mod: tvm.IRModule, block: int) -> tuple[tvm.IRModule, int]:
    """Output channels padded with zero filters to a whole number of blocks: ``conv(O) -> [bias add, relu,
    pooling]`` becomes ``conv(O') -> [same, padded] -> strided_slice(:O)``, the slice after the chain, where the
    tensor is smallest (``O'`` = O rounded up to the block; how much more work that may cost:
    :func:`_max_channel_padding`). A convolution whose input blocks then blocks too; one whose input does not
    stays NCHW, where whole vectors of output channels still make it vectorise.

    Why: SqueezeNet's 1000-class 1x1 convolution stays NCHW otherwise, vectorised along its 13-wide rows, a
    quarter of its model's time (764 -> 649 us padded, on 2 cores). The padded channels compute relu(0 + 0) = 0
    and are sliced away: the same result. Returns the module and the number of convolutions padded.
    """
    bindings = _dataflow_bindings(mod["main"])
    only_consumer = _sole_consumer(mod["main"])

    def next_in_chain(v):
        b = only_consumer(v)
        ok = b is not None and _op_name(b) in _PAD_CHAIN_OPS and _chain_op_ok(b.value) and b.value.args[0].same_as(v)
        return b if ok else None

    plans: dict = {}   # chain end var -> (conv binding, chain bindings in order, padded channel count)
    for b in bindings:
        if _op_name(b) != "relax.nn.conv2d" or not _plain_conv(b.value):
            continue
        o, i, kh, kw = (int(d) for d in b.value.args[1].ty.shape.values)
        padded = -(-o // block) * block
        if o % block == 0 or o <= block or padded / o > _max_channel_padding(i, kh * kw, block):
            continue
        chain, v = [], b.var
        while (nxt := next_in_chain(v)) is not None:
            chain.append(nxt)
            v = nxt.var
        if chain:
            plans[chain[-1].var] = (b, chain, padded)
    if not plans:
        return mod, 0

    def emit(mut, plan):
        conv, chain, padded = plan
        call = conv.value
        cur = mut.builder_.emit(relax.op.nn.conv2d(
            mut.visit_expr(call.args[0]), _pad_axis(_const_array(call.args[1]), 0, padded), **_conv_kwargs(call),
            data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW"))
        cur = _emit_chain(mut.builder_, cur, chain, "NCHW", lambda arr: _pad_axis(arr, 1, padded))
        o = int(call.args[1].ty.shape.values[0])
        return mut.builder_.emit(relax.op.strided_slice(cur, axes=[1], begin=[0], end=[o]))

    return _rewrite_main(mod, plans, emit), len(plans)


def pad_channel_pairs(mod: tvm.IRModule, block: int) -> tuple[tvm.IRModule, int]:
    """Channels between two convolutions padded to a whole number of blocks, with nothing to slice:
    ``conv_a(O) -> [bias add, relu, pooling] -> conv_b`` (the chain's only use) becomes ``conv_a`` with zero filters
    up to ``O'`` (its chain padded alike) and ``conv_b`` with zero weights on the extra input channels.

    Why: GoogLeNet's inception (4b) and (4c) reduce to 24 channels before their 5x5 convolution. Neither
    convolution can block (24 = 1.5 x 16), so ``ConvertLayout`` kept them in NCHW, and with them the module's
    concatenation: 15 layout transforms per run, the concatenated tensor transformed back once per consumer
    (0.40 ms of 12.5 ms in the model, 2 cores). Padded, both block; the extra channels are exact zeros
    (relu(0 + 0) = 0; pooling of zeros is zero) that meet zero weights, so ``conv_b`` computes the same sums. Up to
    :data:`_MAX_PAIR_PADDING` more channels (24 -> 32: a third more work in two small convolutions). Returns the
    module and the number of pairs padded.
    """
    bindings = _dataflow_bindings(mod["main"])
    only_consumer = _sole_consumer(mod["main"])

    plans: dict = {}   # conv_b's var -> (conv_a binding, chain bindings in order, conv_b binding, padded channels)
    for b in bindings:
        if _op_name(b) != "relax.nn.conv2d" or not _plain_conv(b.value):
            continue
        o, i = (int(d) for d in b.value.args[1].ty.shape.values[:2])
        padded = -(-o // block) * block
        if o % block == 0 or i % block or padded / o > _MAX_PAIR_PADDING:
            continue
        chain, v = [], b.var
        while ((nxt := only_consumer(v)) is not None and _op_name(nxt) in _CHAIN_OPS and _chain_op_ok(nxt.value)
               and nxt.value.args[0].same_as(v)):
            chain.append(nxt)
            v = nxt.var
        conv_b = only_consumer(v)
        if (conv_b is None or _op_name(conv_b) != "relax.nn.conv2d" or not _plain_conv(conv_b.value)
                or not conv_b.value.args[0].same_as(v)):
            continue
        plans[conv_b.var] = (b, chain, conv_b, padded)
    if not plans:
        return mod, 0

    def emit(mut, plan):
        conv_a, chain, conv_b, padded = plan
        a, b = conv_a.value, conv_b.value
        cur = mut.builder_.emit(relax.op.nn.conv2d(
            mut.visit_expr(a.args[0]), _pad_axis(_const_array(a.args[1]), 0, padded), **_conv_kwargs(a),
            data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW"))
        cur = _emit_chain(mut.builder_, cur, chain, "NCHW", lambda arr: _pad_axis(arr, 1, padded))
        return mut.builder_.emit(relax.op.nn.conv2d(
            cur, _pad_axis(_const_array(b.args[1]), 1, padded), **_conv_kwargs(b),
            data_layout="NCHW", kernel_layout="OIHW", out_layout="NCHW"))

    return _rewrite_main(mod, plans, emit), len(plans)


# ----------------------------------------------------------------------------------------------- stems
def block_stems(mod: tvm.IRModule, block: int) -> tuple[tvm.IRModule, int]:
    """Blocked outputs for the convolutions ``ConvertLayout`` leaves in NCHW because of their *input*:
    ``conv -> [bias add, relu, pooling] -> layout_transform(NCHW -> NCHW[b]c)`` becomes a convolution that reads
    NCHW and writes ``NCHW[b]c``, its epilogue and pooling in ``NCHW[b]c``, and no transform.

    Why: a stem's reduction is short (3x3x3 = 27 multiply-adds per output), so writing its register tile back
    transposed into NCHW planes costs as much as computing it (SqueezeNet's stem: 373 -> 150 us in the model on
    2 cores), and the NCHW result is then read again by the transform. Returns the module and the number
    rewritten.
    """
    func = mod["main"]
    bindings = _dataflow_bindings(func)
    producer = {b.var: b for b in bindings}
    uses = _use_counts(func)
    # the NCHW -> NCHW[b]c transforms, by the var they transform (ConvertLayout inserts one per consumer)
    transforms: dict = {}
    for b in bindings:
        if _op_name(b) == "relax.layout_transform" and _is_nchw_to_blocked(b.value, block):
            transforms.setdefault(b.value.args[0], []).append(b)

    def feeds_only_next(v, src) -> bool:   # src feeds only its transforms (checked below)
        return isinstance(v, relax.DataflowVar) and (v.same_as(src) or uses.get(v) == 1)

    plans: dict = {}   # a transform's var -> (conv binding, chain bindings in order) or the twin transform's var
    for src, lts in transforms.items():
        if uses.get(src) != len(lts):
            continue   # the NCHW tensor has other consumers
        chain, v = [], src
        while feeds_only_next(v, src) and _op_name(producer.get(v)) in _CHAIN_OPS:
            chain.append(producer[v])
            v = producer[v].value.args[0]
        conv = producer.get(v) if feeds_only_next(v, src) else None
        if (_op_name(conv) != "relax.nn.conv2d" or not _plain_conv(conv.value)
                or int(conv.value.args[1].ty.shape.values[0]) % block
                or not all(_chain_op_ok(c.value) for c in chain)):
            continue
        plans[lts[0].var] = (conv, chain[::-1])
        for twin in lts[1:]:
            plans[twin.var] = lts[0].var
    if not plans:
        return mod, 0

    def blocked_channel_const(arr):   # [1, C, 1, 1] -> [1, C/b, 1, 1, b]
        c = arr.shape[1]
        return relax.const(np.ascontiguousarray(arr.reshape(1, c // block, block, 1, 1).transpose(0, 1, 3, 4, 2)))

    def emit(mut, plan):
        if isinstance(plan, relax.Var):   # a twin of a rewritten transform: the same blocked tensor
            return mut.get_var_remap(plan)
        conv, chain = plan
        call = conv.value
        w = _const_array(call.args[1])
        o = w.shape[0]
        wb = np.ascontiguousarray(w.reshape(o // block, block, *w.shape[1:]).transpose(0, 2, 3, 4, 1))
        lay = f"NCHW{block}c"
        cur = mut.builder_.emit(relax.op.nn.conv2d(
            mut.visit_expr(call.args[0]), relax.const(wb), **_conv_kwargs(call), data_layout="NCHW",
            kernel_layout=f"OIHW{block}o", out_layout=lay))
        return _emit_chain(mut.builder_, cur, chain, lay, blocked_channel_const)

    return _rewrite_main(mod, plans, emit), sum(not isinstance(p, relax.Var) for p in plans.values())


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
