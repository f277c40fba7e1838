"""Weights repacked at build time (passes/kernels/prepack.py) instead of on every call.

What must hold: the convolution kernels that repack a constant weight are replaced, in the built library only,
by their compute part reading the weight already repacked; the program the schedulers and cost models see is
not touched; the library computes what plain TVM computes (the zoo numerics tests check every model; here one
model through export and a runtime-only load).
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_interop.passes.kernels.prepack import PREPACK_ANNOTATION, prepack_weights

TINY = dict(batch_size=1, image_size=64, width=0.5)


@pytest.fixture(scope="module")
def program():
    from tvm_interop.api import load_module, prepare_program

    mod, name = load_module("resnet50", **TINY)
    # NCHW convolutions repack their weights (blocked ones read them in their layout: nothing to repack)
    return prepare_program(mod, "llvm", name=name, layout="nchw")


def test_prepacked_copy_leaves_the_program_alone(program):
    before = {gv.name_hint: f for gv, f in program.mod.functions.items()}
    shapes = [c.shape for c in program.constants]
    packed = prepack_weights(program, "llvm")
    assert packed is not program
    assert [c.shape for c in program.constants] == shapes                      # the original is untouched
    assert all(program.mod[n].same_as(f) for n, f in before.items())
    kernels = [gv.name_hint for gv, f in packed.mod.functions.items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "tvm_interop.prepacked" in f.attrs]
    convs = {c.func_name for c in program.calls.values() if "conv2d" in c.func_name}
    dense = {c.func_name for c in program.calls.values() if "matmul" in c.func_name}
    assert kernels and set(kernels) <= convs | dense and set(kernels) & convs
    changed = [i for i, (a, b) in enumerate(zip(program.constants, packed.constants)) if a.shape != b.shape]
    # conv weights O/16 I H W 16; a batch-1 classifier's [K, N] weight in column panels N/t K t
    assert changed and all(packed.constants[i].ndim in (5, 3) for i in changed)
    assert any(packed.constants[i].ndim == 5 for i in changed)
    for i in changed:   # a repacked weight holds the same numbers, rearranged
        assert np.isclose(np.sort(packed.constants[i].ravel()), np.sort(program.constants[i].ravel())).all()
    # the compute kernels carry no preprocessing block any more
    for n in kernels:
        sch = tvm.s_tir.Schedule(packed.mod[n])
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        assert not any(PREPACK_ANNOTATION in sch.get(b).annotations for b in blocks)


def test_prepacked_library_matches_plain_tvm_after_export(tmp_path):
    import tvm_interop
    from tvm_interop.api import load_module, reference_build
    from tvm_interop.runtime.model import load

    cm = tvm_interop.compile("resnet50", scheduler="greedy", guard=False, layout="nchw", **TINY)
    path = str(tmp_path / "r.so")
    cm.export(path)
    x = np.random.default_rng(0).standard_normal(cm.plan.inputs[0]["shape"]).astype("float32")
    mod, _ = load_module("resnet50", **TINY)
    vm = tvm.relax.VirtualMachine(reference_build(mod), tvm.cpu())
    ref = vm["main"](tvm.runtime.tensor(x)).numpy()
    got = load(path).run(x)
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-4, atol=1e-4)
