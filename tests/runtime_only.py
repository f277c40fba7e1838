"""A runtime-only child environment for tests: ``TVM_USE_RUNTIME_LIB=1`` and an import blocker.

Used by the tests of everything that runs on a device machine (scripts/gpu_check's run and diagnose steps, the
fleet's device server): there only TVM's runtime is installed, so whatever imports a compiler-only module must
fail here first. ``runtime_only_env(tmp_path)`` returns the environment and the folder where each child process
writes, at exit, the modules it tried to import and the native TVM libraries it loaded.
"""
from __future__ import annotations

import json
import os
import textwrap

# modules that only TVM's compiler side provides or needs; the run path must import none of them. Allowed: the
# package ``tvm_interop`` itself (a lazy front door) and the ALLOWED trees (its runtime), which the run path needs
ALLOWED = ("tvm_interop.runtime",)
BLOCKED = ("passes", "tvm_interop", "tvm.relax", "tvm.s_tir", "tvm.topi", "tvm.meta_schedule", "tvm.dlight",
           "tvm.contrib.nvcc")

# sitecustomize for the child processes (the diagnose step starts its own child, which inherits PYTHONPATH): an
# import of a blocked module fails, and is recorded even when the caller swallows the ImportError; at exit the
# record says which native TVM libraries were loaded.
_BLOCKER = textwrap.dedent('''
    import atexit, importlib.abc, json, os, sys
    BLOCKED = {blocked!r}
    ALLOWED = {allowed!r}
    attempts = []

    def blocked(name):
        if name == "tvm_interop" or any(name == a or name.startswith(a + ".") for a in ALLOWED):
            return False
        return any(name == b or name.startswith(b + ".") for b in BLOCKED)

    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if blocked(name):
                attempts.append(name)
                raise ImportError("compiler-only module " + name + " imported on the runtime-only path")
            return None

    sys.meta_path.insert(0, _Block())

    @atexit.register
    def _report():
        base = sys.modules.get("tvm.base")
        libs = sorted(getattr(base, "_LOADED_LIBS", {{}})) if base else []
        loaded = sorted(m for m in sys.modules if blocked(m))
        path = os.path.join(os.environ["GPU_CHECK_IMPORT_LOG"], "imports.%d.json" % os.getpid())
        with open(path, "w") as f:
            json.dump({{"argv": sys.argv, "blocked": attempts, "loaded": loaded, "libs": libs}}, f)
''')


def runtime_only_env(tmp_path) -> tuple[dict, str]:
    """Environment of the GPU machine's steps: TVM's runtime library only, compiler-only modules blocked."""
    site = tmp_path / "blocker"
    log = tmp_path / "import_log"
    site.mkdir(exist_ok=True)
    log.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_BLOCKER.format(blocked=BLOCKED, allowed=ALLOWED))
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", GPU_CHECK_IMPORT_LOG=str(log),
               PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env, str(log)


def import_records(log: str) -> list[dict]:
    return [json.load(open(os.path.join(log, f))) for f in sorted(os.listdir(log))]


def assert_runtime_only(log: str, processes: int) -> None:
    recs = import_records(log)
    assert len(recs) >= processes, recs
    for r in recs:
        assert r["blocked"] == [] and r["loaded"] == [], r
        assert "tvm_compiler" not in r["libs"], r   # libtvm_compiler.so never loaded (TVM itself may not be)
