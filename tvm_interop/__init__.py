"""tvm-interop: inter-operator scheduling for Apache TVM Relax.

``tvm_interop.compile(model, target="llvm", scheduler="greedy")`` returns a model you can ``run``, inspect
(``.schedule``) and ``export`` to a deployable ``.so`` (loaded back with ``tvm_interop.runtime.load``).

Packages: ``tvm_interop`` (this front door), ``tvm_interop.passes`` (compile time) and ``tvm_interop.runtime``
(run time, TVM's runtime only). In the repository they are the folders ``tvm_interop/``, ``passes/`` and
``runtime/``; the wheel installs them under this one name, so a user's environment gets no top-level
``passes`` or ``runtime``.

Why the front door is lazy: a deployed model imports ``tvm_interop.runtime``, which imports this package first;
importing the compile API here would pull in TVM's compiler, which a runtime-only machine does not have. Names
below are imported on first use (PEP 562).
"""
from __future__ import annotations

import os as _os

__version__ = "0.1.0"

# From a source checkout (tests, scripts, an editable install) ``passes/`` and ``runtime/`` sit beside this folder
# rather than inside it: make them this package's ``passes`` and ``runtime`` subpackages. An installed wheel has
# them inside, and this does nothing.
_HERE = _os.path.dirname(_os.path.abspath(__file__))
_REPO = _os.path.dirname(_HERE)
if not _os.path.isdir(_os.path.join(_HERE, "runtime")) and all(
        _os.path.isfile(_os.path.join(_REPO, sub, "__init__.py")) for sub in ("passes", "runtime")):
    __path__.append(_REPO)  # noqa: F821 - a package's __path__

_LAZY = {
    "compile": ("api", "compile"),
    "CompiledModel": ("api", "CompiledModel"),
    "load_module": ("api", "load_module"),
    "model_graph": ("api", "model_graph"),
    "run_reference": ("api", "run_reference"),
    "load": ("runtime", "load"),
    "InteropError": ("runtime.errors", "InteropError"),
}

__all__ = ["compile", "CompiledModel", "load", "load_module", "model_graph", "run_reference", "InteropError",
           "__version__"]


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value
        return value
    if not name.startswith("_"):   # a submodule used as an attribute (``tvm_interop.api.prepare_program``)
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{name}":
                raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
