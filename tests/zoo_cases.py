"""One plain-TVM reference per zoo model (small config) for the whole test session.

Many test files check a scheduled / blocked / fused / rewritten build of every zoo model against what a plain
``tvm.compile`` of the same module computes. Building that reference (LLVM codegen, then the JIT when the VM is
created) costs 2-7 s per model, and it is the same module, input and output in every file: computing it once per
session instead of once per file keeps the default suite within its time budget without testing less.
"""
from __future__ import annotations

import functools

import numpy as np

INPUT_SEED = 7


@functools.lru_cache(maxsize=None)
def zoo_case(name: str, **overrides):
    """``(mod, x, ref)`` for zoo model ``name`` in its small config (``overrides`` replace keywords of
    ``small_config``; a value of None removes one, e.g. ``depth=None`` for the model's own depth): the Relax module,
    a seeded standard-normal input and plain TVM's output. The arrays are read-only: they are shared by every test
    that asks for the same case."""
    import tvm_interop
    from tvm_interop.models import get_model, small_config

    cfg = {**small_config(name), **overrides}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    mod = get_model(name, **cfg)
    x = input_for(mod)
    ref = tvm_interop.run_reference(mod, [x])
    for a in [x] + (ref if isinstance(ref, list) else [ref]):
        a.flags.writeable = False
    return mod, x, ref


def input_for(mod, seed: int = INPUT_SEED) -> np.ndarray:
    """A seeded standard-normal array of the shape of ``mod``'s first parameter."""
    shape = tuple(int(d) for d in mod["main"].params[0].ty.shape.values)
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")
