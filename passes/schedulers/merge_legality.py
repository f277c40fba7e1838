"""Which units a search may merge into one kernel (IOS's *merge* strategy).

Two questions, asked at two costs: :func:`merge_key` is a cheap key computed once per unit (units with equal
non-None keys are merge candidates), :func:`merge_ok` the final check of a chosen set. For units extracted from
a Relax module both defer to the lowering (:mod:`passes.merge`), so a search never picks a merge the build
cannot make; synthetic graphs (no kernels) follow IOS's rule.
"""
from __future__ import annotations

from typing import Hashable, Sequence

from ..graph import Unit
from ..merge import merge_key as lowering_merge_key
from ..merge import mergeable


def merge_key(unit: Unit) -> Hashable | None:
    """Units with equal non-None keys may be merged into one kernel (``strategy="merge"``).

    Units extracted from a Relax module carry ``attrs["conv"]``: their key is :func:`passes.merge.merge_key`
    (the lowering's own rule: conv2d, same input tensor, strides, dilation, fused epilogue, ``groups == 1``,
    output size). Otherwise (synthetic graphs) a convolution (``kind`` starting with ``conv``, with
    ``attrs["data"]``) merges with convolutions of the same kind reading the same tensor with the same
    strides, dilation, ``groups == 1`` and output size (IOS's rule). Anything else is not mergeable. The
    searches check a chosen set once more with :func:`merge_ok`.
    """
    a = unit.attrs
    if not unit.kind.startswith("conv") or a.get("data") is None:
        return None
    if a.get("conv"):
        k = lowering_merge_key(unit)
        return None if k is None else ("lowering",) + tuple(k)
    if int(a.get("groups", 1) or 1) != 1:
        return None
    out = unit.outputs[0] if unit.outputs else None
    return (unit.kind, str(a["data"]), _as_tuple(a.get("strides")), _as_tuple(a.get("dilation")),
            tuple(out.shape[:1]) + tuple(out.shape[2:]) if out else (), out.dtype if out else "")


def merge_ok(units: Sequence[Unit]) -> bool:
    """Final check of a merge candidate set (same :func:`merge_key`): for extracted units the lowering's
    :func:`passes.merge.mergeable` (kernels can be aligned, etc.); synthetic units need nothing more."""
    if any(u.attrs.get("conv") for u in units):
        return bool(mergeable(list(units)))
    return True


def _as_tuple(v) -> tuple:
    """An attribute (None, a scalar or nested lists) as a hashable tuple."""
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(_as_tuple(x) if isinstance(x, (list, tuple)) else x for x in v)
    return (v,)
