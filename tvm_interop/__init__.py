"""tvm-interop: inter-operator scheduling for Apache TVM Relax.

``tvm_interop.compile(model, target="llvm", scheduler="greedy")`` returns a model you can ``run``, inspect
(``.schedule``) and ``export`` to a deployable ``.so`` (loaded back with ``runtime.load``).
"""
from runtime import load
from runtime.errors import InteropError

from .api import CompiledModel, compile, load_module, model_graph, run_reference

__version__ = "0.1.0"
__all__ = ["compile", "CompiledModel", "load", "load_module", "model_graph", "run_reference", "InteropError",
           "__version__"]
