"""One plain-TVM reference per zoo model (small config) for the whole test session.

Many test files check a scheduled / blocked / fused / rewritten build of every zoo model against what a plain
``tvm.compile`` of the same module computes. Building that reference (LLVM codegen, then the JIT when the VM is
created) costs 2-7 s per model, and it is the same module, input and output in every file: computing it once per
session instead of once per file keeps the default suite within its time budget without testing less.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

INPUT_SEED = 7

# The zoo models whose every-model checks cost the most: on the 2-core dev machine their cases took 69% of the
# summed time of the zoo-wide tests (the --durations=0 run of 2026-11-27). Their cases are marked `zoo`:
# `scripts/test.sh` (the development loop) leaves them out, `scripts/test.sh --zoo` adds them, and CI runs that,
# so every model of the zoo is still checked against plain TVM before anything lands.
ZOO_TIER = ("googlenet", "nasnet_a_large", "nasnet_a_mobile")


def zoo_param(name: str, *values, id: str | None = None, marks=()):   # noqa: A002 - pytest's own keyword
    """``pytest.param(name, *values)``, marked ``zoo`` when ``name`` is one of :data:`ZOO_TIER`."""
    marks = list(marks) if isinstance(marks, (list, tuple)) else [marks]
    if name in ZOO_TIER:
        marks.append(pytest.mark.zoo)
    return pytest.param(name, *values, id=id, marks=marks)


def zoo_params(names=None) -> list:
    """One :func:`zoo_param` per zoo model (default: every model of the zoo), for ``parametrize`` or a fixture's
    ``params``."""
    if names is None:
        from tvm_interop.models import list_models

        names = list_models()
    return [zoo_param(n) for n in names]


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
