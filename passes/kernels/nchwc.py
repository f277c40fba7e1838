"""Convolutions on channel-blocked activations (``NCHW[c]c``): the kernel.

Why: with NCHW activations a vectorised convolution either broadcasts inputs from many planes and writes its
register tile back transposed (one output plane per vector lane: scattered stores), or vectorises the output
width (ragged widths, unaligned loads). Both are fast when every operand sits in L1/L2 (kernels timed alone)
and slow inside a model, where each kernel's input was just written by another kernel and its output lines are
cold: on a 2-core Xeon, GoogLeNet's kernels took 10.4 ms timed one by one and 14.3 ms in the model, while ONNX
Runtime (NCHWc, like oneDNN) runs the whole model in 11.5 ms. With ``c`` channels innermost (``c`` = the vector
width), a convolution reads ``c`` input channels as one contiguous vector-sized run, loads weights as whole
vectors and writes whole output lines: no transposition, no gathers, prefetch-friendly.

``passes.layout`` rewrites a model's convolutions to ``NCHW[c]c`` / ``OIHW[c]i[c]o`` (TVM's ``ConvertLayout``,
which also carries the layout through element-wise ops, pooling and concatenation); TOPI cannot legalize
channel-blocked convolutions, so :func:`conv2d_nchwc` is the TE definition used for them, and
:func:`cpu_schedule`'s ``nchwc_conv`` plan (tried first; it finds the reduction by :data:`NCHWC_CONV`) schedules it: a register tile of
``co_t`` output-channel blocks x ``ow_t`` output columns, each one vector of ``c`` channels, accumulated over
(input-channel block, kh, kw, input channel in block), written back with the epilogue (bias, residual, relu)
as whole vectors.
"""
from __future__ import annotations

from tvm import te, topi

# block annotation that marks the reduction of :func:`conv2d_nchwc` (what :func:`plan_nchwc_conv` schedules)
NCHWC_CONV = "tvm_interop.nchwc_conv"


def _padded_window(data: te.Tensor, kh: int, kw: int, strides, padding, dilation):
    """``(padded data, oh, ow, (sh, sw), (dh, dw))`` of a convolution over ``data``'s axes 2 and 3 (H, W), for
    NCHW and NCHW[c]c alike (a blocked input keeps its channel-in-block axis unpadded)."""
    ih, iw = int(data.shape[2]), int(data.shape[3])
    sh, sw = (int(v) for v in strides)
    dh, dw = (int(v) for v in dilation)
    pt, pl, pb, pr = (int(v) for v in padding)
    if pt or pl or pb or pr:
        extra = [0] * (len(data.shape) - 4)
        data = topi.nn.pad(data, [0, 0, pt, pl, *extra], [0, 0, pb, pr, *extra], name="pad_conv")
    oh = (ih + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (iw + pl + pr - (kw - 1) * dw - 1) // sw + 1
    return data, oh, ow, (sh, sw), (dh, dw)


def conv2d_nchwc(data: te.Tensor, weight: te.Tensor, strides, padding, dilation) -> te.Tensor:
    """``out[n, co, y, x, ci] = sum(pad(data)[n, k, y*sh + ry*dh, x*sw + rx*dw, ki] * weight[co, k, ry, rx, ki, ci])``.

    ``data``: ``[N, C/c, H, W, c]``; ``weight``: ``[O/c, C/c, KH, KW, c(in), c(out)]`` (``OIHW[c]i[c]o``);
    ``padding``: (top, left, bottom, right). Groups are not supported (the layout pass keeps grouped
    convolutions in NCHW).
    """
    n, ico, _, _, ici = (int(v) for v in data.shape)
    oco, ico2, kh, kw, ici2, oci = (int(v) for v in weight.shape)
    if (ico, ici) != (ico2, ici2):
        raise ValueError(f"conv2d_nchwc: data {list(data.shape)} and weight {list(weight.shape)} disagree on "
                         "the input channels")
    data, oh, ow, (sh, sw), (dh, dw) = _padded_window(data, kh, kw, strides, padding, dilation)
    rco = te.reduce_axis((0, ico), "rco")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    rci = te.reduce_axis((0, ici), "rci")
    return te.compute(
        (n, oco, oh, ow, oci),
        lambda b, co, y, x, ci: te.sum(
            data[b, rco, y * sh + ry * dh, x * sw + rx * dw, rci] * weight[co, rco, ry, rx, rci, ci],
            axis=[rco, ry, rx, rci]),
        name="conv2d_NCHWc", attrs={NCHWC_CONV: 1})


def conv2d_nchw_to_nchwc(data: te.Tensor, weight: te.Tensor, strides, padding, dilation) -> te.Tensor:
    """A convolution that reads NCHW and writes ``NCHW[c]c``: ``weight`` ``[O/c, C, KH, KW, c]`` (``OIHW[c]o``).

    For the stem (3 input channels: nothing to block on the input side), whose short reduction makes a
    transposed NCHW write-back as costly as the arithmetic (``passes.layout_rewrites.block_stems``).
    """
    n, ic, _, _ = (int(v) for v in data.shape)
    oco, ic2, kh, kw, oci = (int(v) for v in weight.shape)
    if ic != ic2:
        raise ValueError(f"conv2d_nchw_to_nchwc: data {list(data.shape)} and weight {list(weight.shape)} disagree "
                         "on the input channels")
    data, oh, ow, (sh, sw), (dh, dw) = _padded_window(data, kh, kw, strides, padding, dilation)
    rc = te.reduce_axis((0, ic), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    return te.compute(
        (n, oco, oh, ow, oci),
        lambda b, co, y, x, ci: te.sum(
            data[b, rc, y * sh + ry * dh, x * sw + rx * dw] * weight[co, rc, ry, rx, ci], axis=[rc, ry, rx]),
        name="conv2d_NCHWc", attrs={NCHWC_CONV: 1})
