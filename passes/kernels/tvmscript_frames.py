"""A cheap ``inspect.stack`` while TVMScript modules are imported.

Why: TVM's TVMScript decorators (``T.prim_func``, ``I.ir_module``) call ``inspect.stack()`` once per decorated
function, to find the caller's variables. ``inspect.stack`` resolves every frame's source file through
``inspect.getmodule``, and for a frame without a file on disk (``<frozen importlib._bootstrap>``: every import
is one) that scans all of ``sys.modules``, once per frame, per call. Measured on the 2-core dev machine
(2026-11-28): CUDA's tensor intrinsics alone, as ``passes.kernels.fast_builder.tensor_intrinsics_for`` registers
them for a CUDA tuning target, 13.8 s that way and 3.3 s with the frames read as below; the whole
``tvm.s_tir.tensor_intrin`` package (every target's, which a bare ``TuneContext`` imports) 42.9 s and 4.4 s.

:func:`cheap_stack_inspection` swaps in a stack walk that reads each frame's file name from its code object and
its source line from ``linecache``, which is what ``inspect.stack`` returns for frames with a source file and the
``code_context=None`` it returns for those without. The parsed functions are the same (tested on x86's
intrinsics, in two processes). It is meant for one import at a time; ``inspect.stack`` is restored on exit.
"""
from __future__ import annotations

import contextlib
import inspect
import linecache
import sys
import threading

_LOCK = threading.Lock()


def cheap_stack(context: int = 1) -> list[inspect.FrameInfo]:
    """``inspect.stack(context)`` of the caller, without resolving modules: the same fields, the ``context``
    lines around each frame's line chosen as ``inspect.getframeinfo`` chooses them."""
    frame = sys._getframe(1)
    out = []
    while frame is not None:
        filename, lineno = frame.f_code.co_filename, frame.f_lineno
        lines = index = None
        source = linecache.getlines(filename) if context > 0 else []
        if source:
            start = max(0, min(lineno - 1 - context // 2, len(source) - context))
            lines, index = source[start:start + context], lineno - 1 - start
        out.append(inspect.FrameInfo(frame, filename, lineno, frame.f_code.co_name, lines, index))
        frame = frame.f_back
    return out


@contextlib.contextmanager
def cheap_stack_inspection():
    """Within this context ``inspect.stack`` is :func:`cheap_stack` (one context at a time, process-wide)."""
    with _LOCK:
        original = inspect.stack
        inspect.stack = cheap_stack
        try:
            yield
        finally:
            inspect.stack = original
