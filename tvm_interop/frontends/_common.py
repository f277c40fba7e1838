"""Helpers shared by the frontends."""
from __future__ import annotations

import importlib
from typing import Any

from tvm_interop.runtime.errors import MissingDependencyError, UnsupportedModelError


def require(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or raise a ``MissingDependencyError`` (an ImportError) that names the extra
    to install."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"{what} needs the optional package '{module}', which is not installed "
            f"({err}). Install it with: pip install tvm-interop[{extra}]"
        ) from err


def check_static_inputs(mod, source: str) -> None:
    """Raise UnsupportedModelError if an input of ``main`` has a symbolic or unknown shape."""
    from tvm import relax, tirx

    func = mod["main"]
    for param in func.params:
        # TVM 0.27 Relax: a Var's type is ``.ty`` (older releases: ``.struct_info``).
        ty = getattr(param, "ty", None)
        if ty is None:
            ty = getattr(param, "struct_info", None)
        name = getattr(param, "name_hint", None) or getattr(param, "name", "?")
        if type(ty).__name__ not in ("TensorType", "TensorStructInfo"):
            continue
        shape = getattr(ty, "shape", None)
        if shape is None or not isinstance(shape, relax.ShapeExpr):
            raise UnsupportedModelError(
                f"{source}: input '{name}' has an unknown shape; give its shape explicitly"
            )
        for axis, dim in enumerate(shape.values):
            if not isinstance(dim, tirx.IntImm):
                raise UnsupportedModelError(
                    f"{source}: input '{name}' has dynamic dimension '{dim}' (axis {axis}); "
                    "give a static shape for it"
                )


def for_inference(mod):
    """Decompose composite inference ops (batch_norm -> scale/shift, ...) so that the "zero" pipeline can fuse
    them into the producing convolution as an elementwise epilogue instead of running them as separate kernels."""
    from tvm import relax

    return relax.transform.DecomposeOpsForInference()(mod)
