"""What a cost model needs to know about a convolution beyond its FLOPs and bytes: its weight shape, how many inputs
each output sums over, and whether its window is padded.

Why a module of its own: both the simulated device (``passes.cost.simulated``: TVM's default CUDA convolution
loops over the reduction serially, per output) and the whole-program model (``passes.cost.program``: deep
convolutions stretch more inside a program) price a convolution by these, and the one must not import the
other.
"""
from __future__ import annotations


def conv_weight_shape(unit) -> tuple[int, int, int, int] | None:
    """A convolution's weight shape (out channels, in channels per group, kernel height, width); None for any
    other unit."""
    ws = (getattr(unit, "attrs", {}) or {}).get("weight_shape")
    if getattr(unit, "kind", "") == "conv2d" and isinstance(ws, (list, tuple)) and len(ws) == 4:
        return tuple(int(x) for x in ws)
    return None


def reduction_depth(unit) -> int | None:
    """How many inputs a convolution's output sums over (in channels per group x kernel area); None otherwise."""
    ws = conv_weight_shape(unit)
    return ws[1] * ws[2] * ws[3] if ws else None


def padded_on_both_axes(unit) -> bool:
    """Whether a convolution's window is padded along the height and along the width (``attrs["conv"]["padding"]``:
    top, left, bottom, right). Then every step of its reduction tests both bounds of the padded input (TVM inlines
    the padding into the convolution); a 1x7 or 7x1 window is padded along one axis only."""
    conv = (getattr(unit, "attrs", {}) or {}).get("conv")
    pad = conv.get("padding") if isinstance(conv, dict) else None
    if conv_weight_shape(unit) is None or not isinstance(pad, (list, tuple)) or len(pad) != 4:
        return False
    top, left, bottom, right = (int(p) for p in pad)
    return (top > 0 or bottom > 0) and (left > 0 or right > 0)
