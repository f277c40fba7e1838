"""Error types shared by every layer.

They live in ``runtime`` (the lowest layer) so that compile-time code in ``passes`` and the front door in
``tvm_interop`` can raise and catch the same classes, and a deployed model needs nothing else.
"""
from __future__ import annotations


class InteropError(Exception):
    """Base class: every error tvm-interop raises on purpose derives from it."""


class UnsupportedModelError(InteropError):
    """The model uses something we cannot schedule (an operator TVM cannot legalize, a dynamic shape, ...)."""


class GraphError(InteropError):
    """An operator graph is malformed (cycle, dangling edge, disconnected where that is not allowed)."""


class ScheduleError(InteropError):
    """A schedule is invalid, or does not belong to the model it is applied to."""


class ScheduleFileError(ScheduleError):
    """A schedule file cannot be read: truncated, not JSON, wrong version, wrong kind of file."""


class ExportError(InteropError):
    """An exported model cannot be written or loaded."""


class MissingFileError(InteropError, FileNotFoundError):
    """A file the caller named (a model file, ...) does not exist. Also a ``FileNotFoundError``, so callers that
    catch the built-in keep working, while the CLI reports it as a clear error instead of a traceback."""


class MissingDependencyError(InteropError, ImportError):
    """An optional package a feature needs is not installed (the message names the extra to install). Also an
    ``ImportError``, for callers that catch the built-in."""


class InputError(InteropError):
    """Inputs given at run time do not match what the model was compiled for."""


class DeviceError(InteropError):
    """The requested device is missing or unusable (for example: target cuda, no CUDA device)."""
