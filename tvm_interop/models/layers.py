"""Shared layer helpers for the model zoo.

Every network of :mod:`tvm_interop.models` is written against :class:`NetBuilder`, a thin layer over
``tvm.relax.BlockBuilder`` that

* emits one Relax operator per call (``conv2d``, ``add`` for the bias, ``relu``, pools, ``concat`` ...)
  inside a single ``bb.dataflow()`` block of the function ``main(data)``; all weights are
  ``relax.const(numpy array)`` so that TVM's ``FoldConstant`` can fold them;
* draws every weight from one ``numpy.random.default_rng(seed)`` stream, in program order, so the same
  arguments give bit-identical weights;
* runs a numpy *probe* forward pass alongside the graph (batch 1, one seeded standard-normal image at the
  requested resolution). The probe is used to put each network into a numerically sane inference form:

  - ``norm="bn"``: a convolution followed by BatchNorm in the paper. The BN is folded into the conv
    (scaled weights + a bias), with running statistics taken from the probe, i.e. the conv output is
    ~N(beta, gamma^2) per channel, with gamma ~ U(0.9, 1.1) and beta ~ N(0, 0.05). This is exactly the
    inference form of a BN network whose running statistics match its input distribution.
  - ``norm="lsuv"``: a convolution with a bias and no BN (GoogLeNet, SqueezeNet). Fan-in scaled Gaussian
    weights, then one scalar rescale so the output has unit second moment on the probe (LSUV init,
    Mishkin & Matas 2016), plus a small bias.
  - ``norm=None``: a plain fan-in scaled conv without bias (e.g. the depthwise half of a separable conv,
    whose following pointwise conv carries the BN).

  Because of this, the logits are O(1) at any depth / width / resolution, and the probe output doubles as
  an independent numpy reference of the whole network (see ``NetBuilder.probe_output``).

Spatial sizes are checked at every op: a network run on too small an image raises :class:`ImageTooSmall`
(a ``ValueError``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import tvm
from tvm import relax

__all__ = [
    "T",
    "NetBuilder",
    "ImageTooSmall",
    "pool_out_size",
    "same_padding",
    "ceil_mode_padding",
]

_BN_MIN_SAMPLES = 16  # per-channel BN statistics need at least this many probe values per channel
_EPS = 1e-3  # BatchNorm epsilon used by the Inception / NASNet family (torchvision, Cadene)


class ImageTooSmall(ValueError):
    """The input image is too small: some layer would produce an empty feature map."""


@dataclass
class T:
    """A tensor of the network being built: the Relax variable and its numpy probe value (batch 1)."""

    expr: relax.Expr
    ref: np.ndarray

    @property
    def channels(self) -> int:
        return int(self.ref.shape[1])

    @property
    def hw(self) -> tuple[int, int]:
        return int(self.ref.shape[2]), int(self.ref.shape[3])


def _pair(v) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"expected 2 values, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _pad4(padding, kernel: tuple[int, int], dilation=(1, 1)) -> tuple[int, int, int, int]:
    """Normalise a padding spec to (top, left, bottom, right).

    ``None`` means symmetric "same" padding for odd kernels (k // 2), an int or a pair are symmetric,
    a 4-tuple is (top, left, bottom, right) as in Relax.
    """
    if padding is None:
        ph = dilation[0] * (kernel[0] - 1) // 2
        pw = dilation[1] * (kernel[1] - 1) // 2
        return ph, pw, ph, pw
    if isinstance(padding, (tuple, list)):
        if len(padding) == 4:
            return tuple(int(p) for p in padding)  # type: ignore[return-value]
        ph, pw = _pair(padding)
        return ph, pw, ph, pw
    p = int(padding)
    return p, p, p, p


def pool_out_size(n: int, k: int, s: int, before: int, after: int, dilation: int = 1) -> int:
    """Output length of a conv / pool window (floor mode)."""
    return (n + before + after - dilation * (k - 1) - 1) // s + 1


def same_padding(n: int, k: int, s: int) -> tuple[int, int]:
    """TensorFlow 'SAME' padding (before, after) for one axis: output = ceil(n / s)."""
    out = -(-n // s)
    total = max((out - 1) * s + k - n, 0)
    return total // 2, total - total // 2


def ceil_mode_padding(n: int, k: int, s: int, p: int) -> tuple[int, int]:
    """(before, after) padding reproducing PyTorch's ``ceil_mode=True`` pooling with symmetric padding p.

    Returns ``(p, p + extra)``: the extra trailing padding makes a floor-mode pool produce the ceil-mode
    output size (the last window is kept only if it starts inside the input or the left padding, as in
    PyTorch). For max pooling the padded cells are -inf, so the result is identical to PyTorch.
    """
    if n + 2 * p < k:
        raise ImageTooSmall(f"pool window {k} larger than the padded input {n + 2 * p}")
    out = -(-(n + 2 * p - k) // s) + 1
    if (out - 1) * s >= n + p:
        out -= 1
    extra = max(0, (out - 1) * s + k - (n + 2 * p))
    return p, p + extra


# --------------------------------------------------------------------------------------------------
# numpy reference ops (batch-1 probe; also used by the tests as an independent reference)
# --------------------------------------------------------------------------------------------------


def _windows(xp: np.ndarray, i: int, j: int, ho: int, wo: int, s: tuple[int, int], d=(1, 1)):
    return xp[:, :, i * d[0] : i * d[0] + s[0] * (ho - 1) + 1 : s[0], j * d[1] : j * d[1] + s[1] * (wo - 1) + 1 : s[1]]


def np_conv2d(x: np.ndarray, w: np.ndarray, stride, pad4, dilation=(1, 1), groups: int = 1) -> np.ndarray:
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    t, l, b, r = pad4
    ho = pool_out_size(h, kh, stride[0], t, b, dilation[0])
    wo = pool_out_size(wd, kw, stride[1], l, r, dilation[1])
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r))) if any(pad4) else x
    if groups == 1:
        if kh == kw == 1 and stride == (1, 1):
            cols = xp.reshape(n, c, h * wd)
        else:
            cols = np.empty((n, c, kh, kw, ho, wo), dtype=np.float32)
            for i in range(kh):
                for j in range(kw):
                    cols[:, :, i, j] = _windows(xp, i, j, ho, wo, stride, dilation)
            cols = cols.reshape(n, c * kh * kw, ho * wo)
        w2 = w.reshape(o, -1)
        out = w2 @ cols[0] if n == 1 else np.matmul(w2, cols)
        return out.reshape(n, o, ho, wo)
    if groups == c and cg == 1:  # depthwise (optionally with a channel multiplier)
        mult = o // c
        src = np.repeat(xp, mult, axis=1) if mult > 1 else xp
        out = np.zeros((n, o, ho, wo), dtype=np.float32)
        for i in range(kh):
            for j in range(kw):
                out += w[:, 0, i, j][None, :, None, None] * _windows(src, i, j, ho, wo, stride, dilation)
        return out
    og = o // groups
    parts = [
        np_conv2d(x[:, g * cg : (g + 1) * cg], w[g * og : (g + 1) * og], stride, pad4, dilation, 1) for g in range(groups)
    ]
    return np.concatenate(parts, axis=1)


def np_pool2d(x: np.ndarray, kind: str, k, s, pad4, count_include_pad: bool = False) -> np.ndarray:
    n, c, h, w = x.shape
    t, l, b, r = pad4
    ho = pool_out_size(h, k[0], s[0], t, b)
    wo = pool_out_size(w, k[1], s[1], l, r)
    fill = -np.inf if kind == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)), constant_values=fill) if any(pad4) else x
    acc = None
    for i in range(k[0]):
        for j in range(k[1]):
            win = _windows(xp, i, j, ho, wo, s)
            if acc is None:
                acc = win.copy()
            elif kind == "max":
                np.maximum(acc, win, out=acc)
            else:
                acc += win
    if kind == "max":
        return acc
    if count_include_pad or not any(pad4):
        return acc / np.float32(k[0] * k[1])
    ones = np.pad(np.ones((1, 1, h, w), np.float32), ((0, 0), (0, 0), (t, b), (l, r)))
    cnt = np.zeros((1, 1, ho, wo), np.float32)
    for i in range(k[0]):
        for j in range(k[1]):
            cnt += _windows(ones, i, j, ho, wo, s)
    return acc / cnt


# --------------------------------------------------------------------------------------------------
# the builder
# --------------------------------------------------------------------------------------------------


class NetBuilder:
    """Builds one Relax ``main(data)`` function; see the module docstring."""

    def __init__(
        self,
        model: str,
        *,
        batch_size: int,
        image_size: int,
        width: float,
        num_classes: int,
        seed: int,
    ):
        self.model = model
        self.batch_size = int(batch_size)
        self.image_size = int(image_size)
        self.width = float(width)
        self.num_classes = int(num_classes)
        self.seed = int(seed)
        self.rng = np.random.default_rng(self.seed)
        self.bb = relax.BlockBuilder()
        self.probe_input: np.ndarray | None = None
        self.probe_output: np.ndarray | None = None
        self.num_params = 0

    # ---- helpers -------------------------------------------------------------------------------
    def ch(self, c: float) -> int:
        """Scale a paper channel count by ``width`` (at least 1)."""
        return max(1, int(round(c * self.width)))

    def _const(self, arr: np.ndarray) -> relax.Expr:
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        self.num_params += arr.size
        return relax.const(arr, "float32")

    def _emit(self, expr: relax.Expr, ref: np.ndarray) -> T:
        var = self.bb.emit(expr)
        ref = np.ascontiguousarray(ref, dtype=np.float32)
        shape = tuple(int(v) for v in var.ty.shape)
        want = (self.batch_size,) + tuple(ref.shape[1:])
        if shape != want:  # pragma: no cover - internal consistency check
            raise RuntimeError(f"{self.model}: Relax inferred shape {shape} but the probe has {want}")
        return T(var, ref)

    def _check_out(self, what: str, ho: int, wo: int, x: T) -> None:
        if ho < 1 or wo < 1:
            raise ImageTooSmall(
                f"{self.model}: image_size={self.image_size} is too small for this network: the {what} "
                f"on a {x.hw[0]}x{x.hw[1]} feature map would give an empty {ho}x{wo} output"
            )

    # ---- convolutions ------------------------------------------------------------------------------
    def conv(
        self,
        x: T,
        out_channels: int,
        kernel=1,
        stride=1,
        padding=None,
        *,
        groups: int = 1,
        dilation=1,
        norm: str | None = "bn",
        relu: bool = False,
    ) -> T:
        """conv2d (+ folded BN / bias) (+ ReLU). ``out_channels`` is absolute (already width-scaled).

        ``groups=-1`` means depthwise (groups = input channels).
        """
        k = _pair(kernel)
        s = _pair(stride)
        d = _pair(dilation)
        pad = _pad4(padding, k, d)
        cin = x.channels
        if groups == -1:
            groups = cin
        if cin % groups or out_channels % groups:
            raise ValueError(f"channels {cin}->{out_channels} not divisible by groups={groups}")
        ho = pool_out_size(x.hw[0], k[0], s[0], pad[0], pad[2], d[0])
        wo = pool_out_size(x.hw[1], k[1], s[1], pad[1], pad[3], d[1])
        self._check_out(f"{k[0]}x{k[1]} conv (stride {s[0]})", ho, wo, x)
        fan_in = (cin // groups) * k[0] * k[1]
        w = self.rng.standard_normal((out_channels, cin // groups, k[0], k[1]), dtype=np.float32)
        w *= np.float32(math.sqrt(1.0 / fan_in))
        y = np_conv2d(x.ref, w, s, pad, d, groups)
        bias = None
        if norm == "bn":
            gamma = self.rng.uniform(0.9, 1.1, out_channels).astype(np.float32)
            beta = (0.05 * self.rng.standard_normal(out_channels)).astype(np.float32)
            yc = y.transpose(1, 0, 2, 3).reshape(out_channels, -1)  # a view for batch 1
            if yc.shape[1] >= _BN_MIN_SAMPLES:
                mean = yc.mean(axis=1)
                var = np.square(yc - mean[:, None]).mean(axis=1)
            else:  # too few probe values per channel: layer-wide statistics
                mean = np.full(out_channels, yc.mean(), dtype=np.float32)
                var = np.full(out_channels, yc.var(), dtype=np.float32)
            scale = (gamma / np.sqrt(var.astype(np.float64) + _EPS)).astype(np.float32)
            w *= scale[:, None, None, None]
            bias = (beta - mean * scale).astype(np.float32)
            y *= scale[None, :, None, None]
            y += bias[None, :, None, None]
        elif norm == "lsuv":
            rms = float(np.sqrt(np.mean(np.square(y))))
            scale = np.float32(1.0 / rms) if rms > 1e-12 else np.float32(1.0)
            w *= scale
            bias = (0.05 * self.rng.standard_normal(out_channels)).astype(np.float32)
            y *= scale
            y += bias[None, :, None, None]
        elif norm is not None:
            raise ValueError(f"unknown norm {norm!r}")
        out = self._emit(
            relax.op.nn.conv2d(x.expr, self._const(w), strides=s, padding=pad, dilation=d, groups=groups), y
        )
        if bias is not None:
            out = self._emit(relax.op.add(out.expr, self._const(bias.reshape(1, -1, 1, 1))), y)
        if relu:
            out = self.relu(out)
        return out

    def sep_conv(self, x: T, out_channels: int, kernel, stride=1, padding=None, *, norm: str | None = "bn") -> T:
        """Separable conv: depthwise kxk (no bias) then pointwise 1x1 carrying the (folded) norm."""
        y = self.conv(x, x.channels, kernel, stride, padding, groups=-1, norm=None)
        return self.conv(y, out_channels, 1, norm=norm)

    # ---- elementwise ---------------------------------------------------------------------------------
    def relu(self, x: T) -> T:
        return self._emit(relax.op.nn.relu(x.expr), np.maximum(x.ref, 0))

    def add(self, a: T, b: T) -> T:
        return self._emit(relax.op.add(a.expr, b.expr), a.ref + b.ref)

    def scale(self, x: T, factor: float) -> T:
        f = np.float32(factor)
        return self._emit(relax.op.multiply(x.expr, relax.const(f, "float32")), x.ref * f)

    def weighted_sum(self, xs: Sequence[T], weights: Sequence[float]) -> T:
        """sum_i w_i * x_i with constant scalar weights."""
        acc = None
        for x, wt in zip(xs, weights):
            term = self.scale(x, wt)
            acc = term if acc is None else self.add(acc, term)
        assert acc is not None
        return acc

    def mean_of(self, xs: Sequence[T]) -> T:
        """Unweighted average (identity for a single input)."""
        if len(xs) == 1:
            return xs[0]
        acc = xs[0]
        for x in xs[1:]:
            acc = self.add(acc, x)
        return self.scale(acc, 1.0 / len(xs))

    # ---- pooling / shape ops --------------------------------------------------------------------------
    def _pool(self, x: T, kind: str, kernel, stride, padding, count_include_pad: bool) -> T:
        k = _pair(kernel)
        s = _pair(stride)
        pad = _pad4(padding if padding is not None else 0, k)
        ho = pool_out_size(x.hw[0], k[0], s[0], pad[0], pad[2])
        wo = pool_out_size(x.hw[1], k[1], s[1], pad[1], pad[3])
        self._check_out(f"{k[0]}x{k[1]} {kind} pool (stride {s[0]})", ho, wo, x)
        if max(pad[0], pad[2]) >= k[0] or max(pad[1], pad[3]) >= k[1]:
            raise ImageTooSmall(
                f"{self.model}: image_size={self.image_size} is too small: a {kind} pool window on a "
                f"{x.hw[0]}x{x.hw[1]} map would lie entirely in the padding"
            )
        ref = np_pool2d(x.ref, kind, k, s, pad, count_include_pad)
        if kind == "max":
            expr = relax.op.nn.max_pool2d(x.expr, pool_size=k, strides=s, padding=pad)
        else:
            expr = relax.op.nn.avg_pool2d(
                x.expr, pool_size=k, strides=s, padding=pad, count_include_pad=count_include_pad
            )
        return self._emit(expr, ref)

    def max_pool(self, x: T, kernel, stride=1, padding=None) -> T:
        return self._pool(x, "max", kernel, stride, padding, False)

    def avg_pool(self, x: T, kernel, stride=1, padding=None, *, count_include_pad: bool = False) -> T:
        return self._pool(x, "avg", kernel, stride, padding, count_include_pad)

    def max_pool_ceil(self, x: T, kernel: int, stride: int, padding: int = 0) -> T:
        """PyTorch ``MaxPool2d(kernel, stride, padding, ceil_mode=True)`` via explicit trailing padding."""
        try:
            ph = ceil_mode_padding(x.hw[0], kernel, stride, padding)
            pw = ceil_mode_padding(x.hw[1], kernel, stride, padding)
        except ImageTooSmall:
            raise ImageTooSmall(
                f"{self.model}: image_size={self.image_size} is too small for this network: a {kernel}x{kernel} "
                f"ceil-mode max pool on a {x.hw[0]}x{x.hw[1]} feature map"
            ) from None
        return self.max_pool(x, kernel, stride, (ph[0], pw[0], ph[1], pw[1]))

    def concat(self, xs: Sequence[T]) -> T:
        if len(xs) == 1:
            return xs[0]
        ref = np.concatenate([x.ref for x in xs], axis=1)
        return self._emit(relax.op.concat([x.expr for x in xs], axis=1), ref)

    def pad(self, x: T, top: int, left: int, bottom: int, right: int) -> T:
        """Zero padding of the spatial axes."""
        ref = np.pad(x.ref, ((0, 0), (0, 0), (top, bottom), (left, right)))
        return self._emit(relax.op.nn.pad(x.expr, [0, 0, 0, 0, top, bottom, left, right]), ref)

    def slice_hw(self, x: T, begin: tuple[int, int], stride: tuple[int, int]) -> T:
        """x[:, :, begin[0]::stride[0], begin[1]::stride[1]]."""
        h, w = x.hw
        ref = x.ref[:, :, begin[0] :: stride[0], begin[1] :: stride[1]]
        if ref.shape[2] < 1 or ref.shape[3] < 1:
            self._check_out("strided slice", ref.shape[2], ref.shape[3], x)
        expr = relax.op.strided_slice(x.expr, axes=[2, 3], begin=list(begin), end=[h, w], strides=list(stride))
        return self._emit(expr, ref)

    def global_avg_pool(self, x: T) -> T:
        """Global average pool to (B, C): one ``mean`` over H, W."""
        return self._emit(relax.op.mean(x.expr, axis=[2, 3], keepdims=False), x.ref.mean(axis=(2, 3)))

    def global_avg_pool_2d(self, x: T) -> T:
        """``adaptive_avg_pool2d(output_size=1)`` -> (B, C, 1, 1) (use :meth:`flatten` after it)."""
        return self._emit(relax.op.nn.adaptive_avg_pool2d(x.expr, output_size=1), x.ref.mean(axis=(2, 3), keepdims=True))

    def flatten(self, x: T) -> T:
        feat = int(np.prod(x.ref.shape[1:]))
        return self._emit(relax.op.reshape(x.expr, (self.batch_size, feat)), x.ref.reshape(1, feat))

    def dense(self, x: T, out_features: int) -> T:
        """Fully connected layer on (B, F): matmul with a (F, out) constant + bias.

        Fan-in scaled weights, rescaled (one scalar) so the probe output has unit RMS; small bias.
        """
        if x.ref.ndim != 2:
            raise ValueError(f"dense expects a 2-D input, got shape {x.ref.shape}")
        fin = x.ref.shape[1]
        w = self.rng.standard_normal((fin, out_features), dtype=np.float32) * np.float32(math.sqrt(1.0 / fin))
        y = x.ref @ w
        rms = float(np.sqrt(np.mean(np.square(y, dtype=np.float64))))
        if rms > 1e-12:
            w *= np.float32(1.0 / rms)
            y = y * np.float32(1.0 / rms)
        b = (0.05 * self.rng.standard_normal(out_features)).astype(np.float32)
        out = self._emit(relax.op.matmul(x.expr, self._const(w)), y)
        return self._emit(relax.op.add(out.expr, self._const(b.reshape(1, -1))), y + b[None, :])

    # ---- driver ---------------------------------------------------------------------------------------
    def run(self, body: Callable[["NetBuilder", T], T]) -> tvm.IRModule:
        """Build ``main(data)`` with ``body(builder, data) -> logits`` and return the IRModule."""
        b, s = self.batch_size, self.image_size
        data = relax.Var("data", relax.TensorType((b, 3, s, s), "float32"))
        probe_rng = np.random.default_rng([self.seed, 0x5EED])
        self.probe_input = probe_rng.standard_normal((1, 3, s, s), dtype=np.float32)
        try:
            with self.bb.function("main", [data]):
                with self.bb.dataflow():
                    logits = body(self, T(data, self.probe_input))
                    if logits.ref.shape != (1, self.num_classes):  # pragma: no cover
                        raise RuntimeError(f"{self.model}: logits shape {logits.ref.shape}")
                    out = self.bb.emit_output(logits.expr)
                self.bb.emit_func_output(out)
        except BaseException:
            # the Python scopes unwind on an exception but the C++ builder keeps its open binding block
            # and variable scope (and warns when destroyed): close them.
            try:
                self.bb._end_block()
                self.bb.end_scope()
            except Exception:  # pragma: no cover
                pass
            raise
        self.probe_output = logits.ref
        return self.bb.get()
