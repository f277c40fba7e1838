"""Compile time: Relax passes, kernels, cost models and schedulers.

Importing this package is cheap; modules that need TVM's compiler import it themselves.
"""
from .graph import OpGraph, TensorInfo, Unit
from .schedule import Schedule, Stage
from .pipeline import pipeline  # noqa: E402  (the function shadows the submodule name on purpose)


__all__ = ["OpGraph", "TensorInfo", "Unit", "Schedule", "Stage", "pipeline"]
