"""Run time: executors, streams, export and loading. Depends on TVM's runtime only.

``runtime.load(path)`` runs an exported model; ``TVM_USE_RUNTIME_LIB=1`` is enough for it.
``runtime.read_library(path)`` reads its execution plan from the file alone (no TVM, no device).
"""
import os as _os

# TVM pins every thread that starts a kernel thread pool to one core unless TVM_BIND_THREADS=0; the CPU
# executor runs several such threads at once, which would then share one core. Set before any pool exists.
_os.environ.setdefault("TVM_BIND_THREADS", "0")
# TVM's pool would otherwise take half the hardware threads on x86, assuming SMT; one per physical core instead.
from .cpu_threads import configure as _configure_threads  # noqa: E402

_configure_threads()

from .errors import (DeviceError, ExportError, GraphError, InputError, InteropError, ScheduleError,
                     ScheduleFileError, UnsupportedModelError)
from .library_file import read_library
from .model import ScheduledModel, export_library, load

__all__ = ["load", "read_library", "ScheduledModel", "export_library", "InteropError", "UnsupportedModelError", "GraphError",
           "ScheduleError", "ScheduleFileError", "ExportError", "InputError", "DeviceError"]
