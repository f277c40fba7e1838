"""Channel-blocked activations (``NCHW[c]c``) for CPU builds: the graph-level layout pass.

Why: a model's convolutions in NCHW pay, inside a model, for scattered reads of the input planes and a
transposed write-back of every register tile (see ``passes.kernels.nchwc``); ONNX Runtime and oneDNN run CNNs
in ``NCHW[c]c``. Measured on a 2-core Xeon (AVX-512, ``c`` = 16), sequential programs, same process,
interleaved: ResNet-50 40.2 -> 32.7 ms, Inception-v3 50.3 -> 43.2, SqueezeNet 4.51 -> 4.08, GoogLeNet 14.9 ->
14.2.

How: TVM's ``ConvertLayout`` rewrites every ``relax.nn.conv2d`` whose channels divide by ``c`` to
``NCHW[c]c`` data / ``OIHW[c]i[c]o`` weights, carries the layout through the operators that can follow it
(element-wise, pooling, concatenation of whole blocks, ...) and inserts ``layout_transform`` where it cannot
(grouped convolutions, reshapes before the classifier). ``passes.layout_rewrites`` blocks two kinds it would
leave in NCHW: the stem (3 input channels), which then writes the blocked layout from its NCHW input, and
convolutions whose output channels do not fill whole blocks (zero filters, then a slice). Weights are constants, so
their transforms are folded when the model is prepared (``passes.fold_layout``, with numpy). TOPI does not legalize channel-blocked convolutions:
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
            and stem.group(1) == out.group(1)):   # the stem (passes.layout_rewrites.block_stems)
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
    from .layout_rewrites import block_stems, pad_channel_pairs, pad_channels

    mod, pairs = pad_channel_pairs(mod, block)
    mod, padded = pad_channels(mod, block)
    out = relax.transform.ConvertLayout(desired)(mod)
    out, stems = block_stems(out, block)
    log.info("layout: %d of %d convolutions in NCHW%dc (%d writing it from NCHW input, %d with padded outputs, "
             "%d pairs with padded channels between them)", *blocked_convs(out), block, stems, padded, pairs)
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
