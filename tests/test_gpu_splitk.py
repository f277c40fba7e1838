"""The split-reduction convolution schedule (``passes.kernels.gpu_splitk``): which kernels it takes, that its loop
structure computes what the kernel computes (run on this CPU with the thread bindings left out), and that the
CUDA kernel builds with a cross-thread reduction and no global workspace. Speed and GPU numerics: gpu_check."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import tvm

import tvm_interop
from tvm_interop.models import get_model
from tvm_interop.passes.kernels.gpu_splitk import (MAX_OUTPUTS, MIN_REDUCTION, SplitReductionConv,
                                                   apply_split_reduction, schedule_split_reduction)

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


@pytest.fixture(scope="module")
def inception():
    return tvm_interop.api.prepare_program(get_model("inception_v3"), {"kind": "cuda", "arch": "sm_90"},
                                           name="inception_v3")


def _kernel(program, unit_name):
    return program.mod[program.graph.unit(unit_name).func_name]


def test_takes_the_small_deep_convolutions_only(inception):
    g = inception.graph
    _, names = apply_split_reduction(inception.mod, CUDA)
    taken = set(names)
    assert len(taken) >= 20
    for u in g.units:
        outputs = int(np.prod(u.outputs[0].shape))
        if u.func_name not in taken:
            continue
        assert u.kind == "conv2d" and outputs <= MAX_OUTPUTS
        w = u.inputs[1].shape
        assert w[1] * w[2] * w[3] >= MIN_REDUCTION
    by_name = {u.name: u.func_name for u in g.units}
    assert by_name["lv94"] in taken    # 1x1, 2048 -> 192 channels, 8x8 (98 us as DLight's GEMM tiles on an H100)
    assert by_name["lv42"] in taken    # 1x7, 160 -> 160 channels, 17x17 (padded window)
    assert by_name["lv4"] not in taken   # 3x3 on 71x71: 968 K outputs fill the device anyway
    assert not any(g.unit(n).kind != "conv2d" for n in by_name if by_name[n] in taken)
    # nothing for a CPU target, and a scheduled kernel is left alone
    assert SplitReductionConv().apply(_kernel(inception, "lv94"), tvm.target.Target("llvm"), False) is None
    again, names2 = apply_split_reduction(apply_split_reduction(inception.mod, CUDA)[0], CUDA)
    assert names2 == []


@pytest.mark.parametrize("unit", ["lv94", "lv42", "lv91", "lv48"])
def test_loop_structure_computes_the_kernel(inception, unit):
    """The schedule without its thread bindings, compiled for this CPU, against the unscheduled kernel: the same
    outputs up to summation order (split, fuse, the padded window, the predicate of a partial last block)."""
    func = _kernel(inception, unit).with_attr("global_symbol", "main")
    sch = schedule_split_reduction(func, bind_threads=False)
    assert sch is not None
    ref = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    got = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target="llvm")
    rng = np.random.default_rng(3)
    args = [rng.standard_normal([int(d) for d in p.shape]).astype("float32") for p in func.params]
    outs = []
    for lib in (ref, got):
        tensors = [tvm.runtime.tensor(a) for a in args]
        lib["main"](*tensors)
        outs.append(tensors[-1].numpy())
    scale = np.abs(outs[0]).max()
    assert scale > 0 and np.abs(outs[0] - outs[1]).max() <= 1e-5 * scale


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the CUDA build needs nvcc")
def test_cuda_kernel_reduces_across_threads_in_shared_memory(inception):
    sch = SplitReductionConv().apply(_kernel(inception, "lv42"), CUDA, False)
    mod = tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main").with_attr("tirx.is_scheduled", True)})
    ex = tvm.compile(mod, target=CUDA)
    imports = getattr(ex.mod, "imports", None) or getattr(ex.mod, "imported_modules", [])
    src = imports[0].inspect_source()
    assert src.count("__global__ void") == 2    # one kernel (declaration + definition): no second launch
    assert "__shared__" in src and "threadIdx.y" in src
    # the single store of each output: after the reduction, by one thread of the group, inside the 17x17 map
    assert "(((int)threadIdx.y) == 0) && " in src and "< 289" in src
    assert "TVMBackendAllocWorkspace" not in src
