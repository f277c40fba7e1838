"""Model frontends: turn an ONNX model or a PyTorch module into a Relax ``IRModule``.

Both frontends return a module whose Relax ``main`` takes only the model inputs (static shapes) and holds the
weights as constants, ready for ``relax.get_pipeline("zero")`` (FoldConstant can fold the weights).

The heavy dependencies are optional extras and are imported only when a frontend is called:
``pip install tvm-interop[onnx]`` for :func:`from_onnx`, ``pip install tvm-interop[torch]`` for
:func:`from_torch`.
"""
from __future__ import annotations

from .onnx_import import from_onnx
from .torch_import import from_torch

__all__ = ["from_onnx", "from_torch"]
