"""ONNX frontend: ``from_onnx(model_or_path, shape_dict=None) -> tvm.IRModule``."""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from tvm_interop.runtime.errors import InputError, MissingFileError, UnsupportedModelError

from ._common import check_static_inputs, for_inference, require

_DIM_HELP = "pass shape_dict={{'{inp}': [...]}} with a static shape"


def _check_file(path: str) -> None:
    if not os.path.isfile(path):
        raise MissingFileError(f"ONNX model file not found: {path}")


def _load(onnx, model_or_path) -> tuple[Any, str]:
    """Return (ModelProto, a name for messages)."""
    if isinstance(model_or_path, onnx.ModelProto):
        name = model_or_path.graph.name or "<onnx model>"
        return model_or_path, f"ONNX model '{name}'"
    if isinstance(model_or_path, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model_or_path)), "ONNX model <bytes>"
        except Exception as err:  # protobuf DecodeError and friends
            raise UnsupportedModelError(f"the given bytes are not a valid ONNX model: {err}") from err
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        _check_file(path)
        try:
            model = onnx.load(path)
        except Exception as err:
            raise UnsupportedModelError(
                f"cannot read ONNX model file '{path}': it does not parse as an ONNX model ({err})"
            ) from err
        if not isinstance(model, onnx.ModelProto) or len(model.graph.node) == 0:
            raise UnsupportedModelError(
                f"cannot read ONNX model file '{path}': it holds no ONNX graph (empty or not an ONNX file)"
            )
        return model, f"ONNX model file '{path}'"
    raise TypeError(
        f"from_onnx expects an onnx.ModelProto, a path or bytes, got {type(model_or_path).__name__}"
    )


def _graph_inputs(model) -> list:
    """Graph inputs that are real inputs (older exporters also list the initializers as inputs)."""
    inits = {init.name for init in model.graph.initializer}
    return [inp for inp in model.graph.input if inp.name not in inits]


def _resolve_shapes(model, shape_dict: Mapping[str, Sequence[int]] | None, source: str) -> dict:
    """Check every input ends up with a static shape; return the shape dict to hand to TVM."""
    shape_dict = {k: [int(d) for d in v] for k, v in (shape_dict or {}).items()}
    inputs = _graph_inputs(model)
    names = [inp.name for inp in inputs]
    unknown = sorted(set(shape_dict) - set(names))
    if unknown:
        raise InputError(f"{source}: shape_dict names {unknown}, which are not model inputs (inputs: {names})")
    for inp in inputs:
        if inp.name in shape_dict:
            if any(d <= 0 for d in shape_dict[inp.name]):
                raise InputError(f"{source}: shape_dict['{inp.name}'] = {shape_dict[inp.name]} is not static")
            continue
        ttype = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedModelError(f"{source}: input '{inp.name}' is not a tensor")
        if not ttype.HasField("shape"):
            raise UnsupportedModelError(
                f"{source}: input '{inp.name}' has unknown rank; " + _DIM_HELP.format(inp=inp.name)
            )
        for axis, dim in enumerate(ttype.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            label = dim.dim_param or "?"
            raise UnsupportedModelError(
                f"{source}: input '{inp.name}' has dynamic dimension '{label}' (axis {axis}); "
                + _DIM_HELP.format(inp=inp.name)
            )
    return shape_dict


def _check_ops(model, source: str) -> None:
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    supported = set(_get_convert_map()) | {"If", "Constant"}
    missing: dict[str, str] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in supported:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            missing.setdefault(key, node.name or "<unnamed>")
    if missing:
        ops = ", ".join(f"{op} (node '{n}')" for op, n in sorted(missing.items()))
        raise UnsupportedModelError(f"{source}: TVM's ONNX importer cannot convert operator(s): {ops}")


def from_onnx(
    model_or_path,
    shape_dict: Mapping[str, Sequence[int]] | None = None,
    dtype_dict: str | Mapping[str, str] | None = "float32",
    opset: int | None = None,
    decompose_for_inference: bool = True,
):
    """Import an ONNX model as a Relax ``IRModule``.

    Parameters
    ----------
    model_or_path:
        An ``onnx.ModelProto``, a path to a ``.onnx`` file, or the serialized bytes of one.
    shape_dict:
        Static shapes for inputs, by ONNX input name. Required for every input that has a dynamic
        dimension (for example a symbolic batch ``'N'``); otherwise optional (overrides the model's shape).
    dtype_dict:
        Input dtypes (one dtype for all inputs, or by name).
    opset:
        Override the opset recorded in the model.
    decompose_for_inference:
        Run ``relax.transform.DecomposeOpsForInference`` (batch norm becomes an elementwise scale/shift that
        FuseOps fuses into the convolution before it).

    Returns
    -------
    tvm.IRModule whose ``main`` takes the model inputs (static shapes) and holds the weights as constants.

    Raises
    ------
    MissingDependencyError: the ``onnx`` package is missing (``pip install tvm-interop[onnx]``; an ImportError).
    MissingFileError: the path does not exist (a ``FileNotFoundError`` and an ``InteropError``).
    runtime.errors.UnsupportedModelError: the file does not parse, an operator cannot be converted, an input
        has a dynamic dimension that ``shape_dict`` does not fix, or TVM's importer fails.
    runtime.errors.InputError: ``shape_dict`` names something that is not a model input.
    """
    if isinstance(model_or_path, (str, os.PathLike)):
        _check_file(os.fspath(model_or_path))       # a missing file is named even where onnx is not installed
    onnx = require("onnx", "onnx", "tvm_interop.frontends.from_onnx")
    model, source = _load(onnx, model_or_path)
    shapes = _resolve_shapes(model, shape_dict, source)
    _check_ops(model, source)

    import tvm
    from tvm.relax.frontend.onnx import from_onnx as _tvm_from_onnx

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the onnx checker and importer warn loudly about harmless things
            mod = _tvm_from_onnx(
                model, shape_dict=shapes, dtype_dict=dtype_dict, opset=opset, keep_params_in_input=False
            )
    except tvm.error.OpNotImplemented as err:
        raise UnsupportedModelError(f"{source}: {err}") from err
    except Exception as err:
        raise UnsupportedModelError(
            f"{source}: TVM's ONNX importer failed: {type(err).__name__}: {err}"
        ) from err
    check_static_inputs(mod, source)
    return for_inference(mod) if decompose_for_inference else mod
