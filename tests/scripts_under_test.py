"""Load a script of ``scripts/`` as a module, so that its functions are tested in-process (no interpreter start,
no re-import of TVM per call)."""
from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(name: str):
    """``scripts/<name>.py`` as a fresh module named ``name``."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "scripts", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
