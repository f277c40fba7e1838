"""The cheap ``inspect.stack`` used while TVMScript intrinsics are imported (passes/kernels/tvmscript_frames.py):
it must return what ``inspect.stack`` returns, and the intrinsics TVM parses under it must be the same."""
from __future__ import annotations

import inspect
import json
import subprocess
import sys

from tvm_interop.passes.kernels.tvmscript_frames import cheap_stack, cheap_stack_inspection


def _both(context: int):
    return inspect.stack(context), cheap_stack(context)   # one line: the same caller line in both


def _fields(frames):
    return [(f.filename, f.lineno, f.function, f.code_context, f.index) for f in frames]


def test_cheap_stack_returns_what_inspect_stack_returns():
    for context in (0, 1, 3):
        real, cheap = _both(context)
        assert _fields(cheap) == _fields(real)
        assert all(a.frame is b.frame for a, b in zip(real, cheap))
    # a frame of an import (no source file: importlib's frozen modules) has no code context in either
    assert any(f.filename.startswith("<frozen") or f.code_context for f in cheap)


def test_the_swap_is_undone_even_after_an_error():
    original = inspect.stack
    try:
        with cheap_stack_inspection():
            assert inspect.stack is cheap_stack
            raise KeyError("inside")
    except KeyError:
        pass
    assert inspect.stack is original


CHILD = r'''
import contextlib, hashlib, importlib, inspect, json, sys, types
import tvm
from tvm.s_tir import TensorIntrin
from tvm_interop.passes.kernels import fast_builder
stacks = []   # which inspect.stack each intrinsic module was imported under


def import_module(name):
    stacks.append(inspect.stack.__module__ + "." + inspect.stack.__name__)
    return importlib.import_module(name)


fast_builder.importlib = types.SimpleNamespace(import_module=import_module)
if sys.argv[1] == "inspect":
    fast_builder.cheap_stack_inspection = contextlib.nullcontext
with fast_builder.tensor_intrinsics_for(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})):
    m = sys.modules["tvm.s_tir.tensor_intrin.arm_cpu"]
names = sorted(v for k, v in vars(m).items() if k.endswith("_INTRIN") and isinstance(v, str))
h = hashlib.sha256()
for n in names:
    ti = TensorIntrin.get(n)
    h.update((ti.desc.script() + ti.impl.script()).encode())
print(json.dumps([names, h.hexdigest(), stacks]))
'''


def test_intrinsics_parsed_with_the_cheap_stack_are_the_same():
    """ARM's tensor intrinsics (desc and impl of each) parsed in two processes, with and without the swap."""
    out = {}
    for how in ("inspect", "cheap"):
        r = subprocess.run([sys.executable, "-c", CHILD, how], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        out[how] = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["cheap"][2] == ["tvm_interop.passes.kernels.tvmscript_frames.cheap_stack"]
    assert out["inspect"][2] == ["inspect.stack"]
    assert len(out["cheap"][0]) >= 4 and out["cheap"][:2] == out["inspect"][:2]
