"""Load a script of ``scripts/`` as a module, so that its functions are tested in-process (no interpreter start,
no re-import of TVM per call)."""
from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name: str):
    """``scripts/<name>.py`` as a fresh module named ``name``, registered as such (dataclasses look their module up
    while the class is made)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
