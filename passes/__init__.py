"""Compile time: Relax passes, kernels, cost models and schedulers.

Importing this package is cheap; modules that need TVM's compiler import it themselves.
"""
from .graph import OpGraph, TensorInfo, Unit
from .schedule import Schedule, Stage


def pipeline(*args, **kwargs):
    """The tvm-interop pass for ``tvm.compile(..., relax_pipeline=...)``; see ``passes.pipeline``."""
    from .pipeline import pipeline as make

    return make(*args, **kwargs)


__all__ = ["OpGraph", "TensorInfo", "Unit", "Schedule", "Stage", "pipeline"]
