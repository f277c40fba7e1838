"""PyTorch frontend: ``from_torch(module, example_inputs) -> tvm.IRModule`` via ``torch.export``."""
from __future__ import annotations

import re
import warnings
from typing import Any

from tvm_interop.runtime.errors import UnsupportedModelError

from ._common import check_static_inputs, for_inference, require


def from_torch(
    module,
    example_inputs: Any,
    *,
    unwrap_unit_return_tuple: bool = True,
    eval_mode: bool = True,
    decompose_for_inference: bool = True,
):
    """Import a ``torch.nn.Module`` as a Relax ``IRModule`` (``torch.export`` + TVM's exported-program importer).

    Parameters
    ----------
    module:
        The PyTorch module (or an already exported ``torch.export.ExportedProgram``).
    example_inputs:
        One tensor or a tuple/list of tensors; their shapes become the static input shapes of ``main``.
    unwrap_unit_return_tuple:
        If the model returns a single tensor, ``main`` returns that tensor rather than a 1-tuple.
    eval_mode:
        Export the module in eval mode (inference semantics for batch norm / dropout). The module's
        training flag is restored afterwards.
    decompose_for_inference:
        Run ``relax.transform.DecomposeOpsForInference`` (batch norm becomes an elementwise scale/shift that
        FuseOps fuses into the convolution before it).

    Returns
    -------
    tvm.IRModule whose ``main`` takes the model inputs and holds the weights as constants.

    Raises
    ------
    ImportError: ``torch`` is missing (``pip install tvm-interop[torch]``).
    runtime.errors.UnsupportedModelError: ``torch.export`` fails, or TVM cannot convert an operator (named
        in the message), or an input ends up with a dynamic dimension.
    """
    torch = require("torch", "torch", "tvm_interop.frontends.from_torch")
    from tvm.relax.frontend.torch import from_exported_program

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)

    source = f"torch module {type(module).__name__}"
    if isinstance(module, torch.export.ExportedProgram):
        exported = module
        source = "torch ExportedProgram"
    else:
        was_training = getattr(module, "training", False)
        try:
            if eval_mode and hasattr(module, "eval"):
                module.eval()
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exported = torch.export.export(module, example_inputs)
        except Exception as err:
            raise UnsupportedModelError(
                f"{source}: torch.export failed: {type(err).__name__}: {err}"
            ) from err
        finally:
            if eval_mode and was_training and hasattr(module, "train"):
                module.train(was_training)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = from_exported_program(
                exported, keep_params_as_input=False, unwrap_unit_return_tuple=unwrap_unit_return_tuple
            )
    except AssertionError as err:
        msg = str(err)
        match = re.search(r"Unsupported function types (\[.*\])", msg)
        if match:
            raise UnsupportedModelError(
                f"{source}: TVM's torch importer cannot convert operator(s): {match.group(1)}"
            ) from err
        raise UnsupportedModelError(f"{source}: TVM's torch importer failed: {msg}") from err
    except Exception as err:
        raise UnsupportedModelError(
            f"{source}: TVM's torch importer failed: {type(err).__name__}: {err}"
        ) from err
    check_static_inputs(mod, source)
    return for_inference(mod) if decompose_for_inference else mod
