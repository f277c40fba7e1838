"""The GPU check's PyTorch baseline on the device: the network's graph JSON (written at build time by
``tvm_interop.export.graph_to_json``) rebuilt by the project's one Relax->torch interpreter
(``tvm_interop.export.torch_interp.graph_to_torch``) and run eagerly.

The device has TVM's runtime only, and ``import tvm_interop.export`` would first run ``tvm_interop/__init__.py``:
the compile front door (``tvm_interop.api``, which reaches ``passes`` and ``tvm.relax``). The export package itself
imports only numpy and ``runtime.errors`` (its TVM-reading half imports TVM lazily), so it is loaded here from its
directory under a private package name, without its parent package. ``tests/test_gpu_check_script.py`` runs this
with the compiler-only modules blocked.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any, Callable, Sequence

from .common import REPO

_PRIVATE = "_gpu_check_tvm_interop_export"


def export_package() -> ModuleType:
    """``tvm_interop.export`` without ``tvm_interop``: the already imported one in a compile-side process, else the
    same files loaded under a private name (its relative imports, ``.torch_interp``, resolve inside it)."""
    if "tvm_interop.export" in sys.modules:
        return sys.modules["tvm_interop.export"]
    if _PRIVATE in sys.modules:
        return sys.modules[_PRIVATE]
    pkg_dir = os.path.join(REPO, "tvm_interop", "export")
    spec = importlib.util.spec_from_file_location(_PRIVATE, os.path.join(pkg_dir, "__init__.py"),
                                                  submodule_search_locations=[pkg_dir])
    module = importlib.util.module_from_spec(spec)
    sys.modules[_PRIVATE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_PRIVATE]
        raise
    return module


def torch_runner(data: dict, device: str, seed: int = 0, constants: dict | None = None,
                 inputs: Sequence[Any] | None = None) -> Callable[[], Any]:
    """A callable running the network of ``data`` once on ``device`` with eager PyTorch. Weights and inputs are
    random of the recorded shapes (seeded; the device times it only) unless given: ``constants`` by name (as
    ``gpucheck.build.torch_program`` returns them) and ``inputs`` as arrays (the tests compare with TVM)."""
    import numpy as np
    import torch

    export = export_package()
    interp = importlib.import_module(export.__name__ + ".torch_interp")
    graph = export.graph_from_json(data, constants=constants, seed=seed)
    module = interp.graph_to_torch(graph).to(device).eval()
    if inputs is None:
        gen = torch.Generator().manual_seed(seed)
        xs = [torch.randn(tuple(shape), generator=gen) for _, shape, _ in graph.inputs]
    else:
        xs = [torch.as_tensor(np.asarray(x)) for x in inputs]
    xs = [x.to(device) for x in xs]
    return lambda: module(*xs)
