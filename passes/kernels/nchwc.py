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

Ragged widths: an output width without a divisor between :data:`MIN_TILE` and :data:`MAX_TILE` (Inception-v3's
17, 71, 73 and 149 are prime) is computed over the next width that has one, into an intermediate that the
epilogue crops (:func:`tileable_width`): every register tile is then whole. A tile that overhangs the width
carries a predicate on each of its multiply-adds instead, and LLVM compiles that unevenly: on 71 columns one
accumulator of a 2x9 tile stayed in memory (a load, FMA and store per step), and the tile chooser, which
discounts overhanging tiles, settled for 3x3 tiles (9 accumulators): 5.3 ms where 2x8 took 4.4 ms (timed alone,
weights cold). In the model (2-core Xeon, AVX-512) that layer went from 5.35 to 4.30 ms with whole tiles, its
17-column 1x7 / 7x1 / strided 3x3 layers 5-12 % faster, Inception-v3 1.6-2.3 % faster end to end (two runs).
"""
from __future__ import annotations

from tvm import te, topi

# block annotation that marks the reduction of :func:`conv2d_nchwc` (what :func:`plan_nchwc_conv` schedules)
NCHWC_CONV = "tvm_interop.nchwc_conv"


# the register tile's width (output columns) is chosen among the divisors of the computed width in this range
MIN_TILE, MAX_TILE = 6, 16


def tileable_width(ow: int) -> int:
    """The width to compute an output of ``ow`` columns over: ``ow`` itself when it has a divisor in
    [MIN_TILE, MAX_TILE] or is at most MAX_TILE (one tile), else the next width that has one (17 -> 18, 71 -> 72,
    73 -> 75, 149 -> 150: at most a few percent of extra columns)."""
    if ow <= MAX_TILE:
        return ow
    w = ow
    while not any(w % t == 0 for t in range(MIN_TILE, MAX_TILE + 1)):
        w += 1
    return w


def _padded_window(data: te.Tensor, kh: int, kw: int, strides, padding, dilation):
    """``(padded data, oh, ow, ow_full, (sh, sw), (dh, dw))`` of a convolution over ``data``'s axes 2 and 3 (H, W),
    for NCHW and NCHW[c]c alike (a blocked input keeps its channel-in-block axis unpadded). ``ow_full`` is
    :func:`tileable_width` of ``ow`` (``ow`` for an unpadded 1x1 convolution); the data gets the extra zero
    columns on the right that it reads."""
    ih, iw = int(data.shape[2]), int(data.shape[3])
    sh, sw = (int(v) for v in strides)
    dh, dw = (int(v) for v in dilation)
    pt, pl, pb, pr = (int(v) for v in padding)
    oh = (ih + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (iw + pl + pr - (kw - 1) * dw - 1) // sw + 1
    # A 1x1 convolution without padding would need a padded copy of its input for the extra columns. Measured in
    # Inception-v3 (17 columns, 768 channels in, in the model): 12 layers 4684 -> 4299 us, but 4 layers 1123 -> 1336
    # and 2 layers 454 -> 574 us, and 80x73x73 250 -> 348 us: no clear gain, so it keeps its width
    ow_full = tileable_width(ow) if (pt or pl or pb or pr or kh * kw > 1) else ow
    # the last computed column reads up to (ow_full - 1) * sw + (kw - 1) * dw of the padded row
    pr_full = max(pr, (ow_full - 1) * sw + (kw - 1) * dw + 1 - iw - pl)
    if pt or pl or pb or pr_full:
        extra = [0] * (len(data.shape) - 4)
        data = topi.nn.pad(data, [0, 0, pt, pl, *extra], [0, 0, pb, pr_full, *extra], name="pad_conv")
    return data, oh, ow, ow_full, (sh, sw), (dh, dw)


def _cropped(full: te.Tensor, ow: int) -> te.Tensor:
    """``full`` itself, or its first ``ow`` columns when it was computed over more (see :func:`tileable_width`)."""
    if int(full.shape[3]) == ow:
        return full
    return te.compute((*full.shape[:3], ow, *full.shape[4:]), lambda *i: full(*i), name="conv2d_NCHWc_crop")


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
    data, oh, ow, ow_full, (sh, sw), (dh, dw) = _padded_window(data, kh, kw, strides, padding, dilation)
    rco = te.reduce_axis((0, ico), "rco")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    rci = te.reduce_axis((0, ici), "rci")
    return _cropped(te.compute(
        (n, oco, oh, ow_full, oci),
        lambda b, co, y, x, ci: te.sum(
            data[b, rco, y * sh + ry * dh, x * sw + rx * dw, rci] * weight[co, rco, ry, rx, rci, ci],
            axis=[rco, ry, rx, rci]),
        name="conv2d_NCHWc", attrs={NCHWC_CONV: 1}), ow)


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
    data, oh, ow, ow_full, (sh, sw), (dh, dw) = _padded_window(data, kh, kw, strides, padding, dilation)
    rc = te.reduce_axis((0, ic), "rc")
    ry = te.reduce_axis((0, kh), "ry")
    rx = te.reduce_axis((0, kw), "rx")
    return _cropped(te.compute(
        (n, oco, oh, ow_full, oci),
        lambda b, co, y, x, ci: te.sum(
            data[b, rc, y * sh + ry * dh, x * sw + rx * dw] * weight[co, rc, ry, rx, ci], axis=[rc, ry, rx]),
        name="conv2d_NCHWc", attrs={NCHWC_CONV: 1}), ow)
