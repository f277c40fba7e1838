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
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.kernels.gpu_splitk import (MIN_GEMM_BLOCKS, MIN_REDUCTION, SplitReductionConv,
                                                   apply_split_reduction, gemm_blocks, schedule_split_reduction)

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
        if u.func_name not in taken:
            continue
        _, channels, h, w = u.outputs[0].shape
        assert u.kind == "conv2d" and gemm_blocks(h * w, channels) < MIN_GEMM_BLOCKS
        k = u.inputs[1].shape
        assert k[1] * k[2] * k[3] >= MIN_REDUCTION
    by_name = {u.name: u.func_name for u in g.units}
    assert by_name["lv94"] in taken    # 1x1, 2048 -> 192 channels, 8x8 (98 us as DLight's GEMM tiles on an H100)
    assert by_name["lv42"] in taken    # 1x7, 160 -> 160 channels, 17x17 (padded window)
    assert by_name["lv7"] in taken     # 5x5, 48 -> 64 channels, 35x35: DLight tiles it into 39 blocks
    assert by_name["lv4"] not in taken   # 3x3 on 71x71, 192 channels: 474 GEMM blocks fill the device anyway
    assert gemm_blocks(64, 192) == 6 and gemm_blocks(71 * 71, 192) == 474
    assert not any(g.unit(n).kind != "conv2d" for n in by_name if by_name[n] in taken)
    # nothing for a CPU target, and a scheduled kernel is left alone
    assert SplitReductionConv().apply(_kernel(inception, "lv94"), tvm.target.Target("llvm"), False) is None
    again, names2 = apply_split_reduction(apply_split_reduction(inception.mod, CUDA)[0], CUDA)
    assert names2 == []


def _same_outputs_on_cpu(func) -> None:
    """The schedule without its thread bindings, compiled for this CPU, against the unscheduled kernel."""
    func = func.with_attr("global_symbol", "main")
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


@pytest.mark.parametrize("unit", ["lv94", "lv42", "lv91", "lv48", "lv7"])
def test_loop_structure_computes_the_kernel(inception, unit):
    """Same outputs up to summation order: split, fuse, the padded window (1x7, 3x3, 5x5), the predicate of a
    partial last block of pixels (17x17 = 289, 35x35 = 1225)."""
    _same_outputs_on_cpu(_kernel(inception, unit))


def test_loop_structure_with_a_residual_epilogue():
    """ResNet-50's convolutions that add the shortcut before the ReLU: an epilogue reading a second tensor."""
    program = tvm_interop.api.prepare_program(get_model("resnet50"), {"kind": "cuda", "arch": "sm_90"},
                                              name="resnet50")
    _, names = apply_split_reduction(program.mod, CUDA)
    residual = [n for n in names if n.count("_add") >= 2]
    assert residual
    _same_outputs_on_cpu(program.mod[residual[0]])


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


# ---------------------------------------------------------------------------------------------- workspaces
def _reduce_through_global_memory(func):
    """A GPU schedule of a convolution kernel whose partial sums go through a global buffer (``rfactor`` into
    global memory, a second block summing them): the kind of kernel the ``workspace`` check is for."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline

    sch = s_tir.Schedule(func)
    infos = try_inline(sch, normalize_prim_func(sch))
    conv, last = infos[0].block_rv, infos[-1].block_rv
    n_spatial = len(infos[0].dom_kind().rstrip("R"))
    r_loops = sch.get_loops(conv)[n_spatial:]
    r = sch.fuse(*r_loops) if len(r_loops) > 1 else r_loops[0]
    ko, _ = sch.split(r, factors=[1, None])
    rf = sch.rfactor(ko, factor_axis=0)               # partial sums in a global buffer
    for block in (rf, last):
        bx, tx = sch.split(sch.fuse(*sch.get_loops(block)[:n_spatial + (1 if block == rf else 0)]),
                           factors=[None, 32])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    if last != conv:
        sch.compute_at(conv, sch.get_loops(last)[1])
        sch.set_scope(conv, 0, "local")
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def test_memory_check_refuses_concurrent_kernels_with_global_workspaces(small_inception_ios):
    """Two kernels that each allocate a global buffer get the same memory from TVM's workspace pool; the as-built
    check refuses running them at once on two streams, names both, and accepts the same kernels one after another."""
    import dataclasses

    from tvm_interop.passes.as_built import check_lowered
    from tvm_interop.passes.lower_streams import lower_program
    from tvm_interop.passes.stream_memory import global_workspaces

    program, sched = small_inception_ios
    g = program.graph
    stage = next(st for st in sched.stages if len(st.groups) >= 2 and
                 sum(g.unit(grp[0]).kind == "conv2d" for grp in st.groups) >= 2)
    convs = [grp[0] for grp in stage.groups if g.unit(grp[0]).kind == "conv2d"][:2]
    mod = program.mod
    for u in convs:
        gv = mod.get_global_var(g.unit(u).func_name)
        mod = _replaced(mod, gv, _reduce_through_global_memory(mod[gv]))
        assert global_workspaces(mod[gv])
    patched = dataclasses.replace(program, mod=mod)
    report = check_lowered(lower_program(patched, sched, CUDA, mode="stage").mod, CUDA)
    bad = [v for v in report.violations if v.kind == "workspace"]
    assert bad and {bad[0].first, bad[0].second} <= {g.unit(u).func_name for u in convs}
    assert "workspace pool" in str(bad[0]), str(bad[0])
    seq = schedule_graph(g, "sequential")
    assert check_lowered(lower_program(patched, seq, CUDA, mode="stage").mod, CUDA).ok
    # today's default schedules allocate none (every zoo kernel: checked when the rule was written)
    assert check_lowered(lower_program(program, sched, CUDA, mode="stage").mod, CUDA).ok


def _replaced(mod, gv, func):
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    out[gv] = func
    return out


@pytest.fixture(scope="module")
def small_inception_ios():
    program = tvm_interop.api.prepare_program(get_model("inception_v3", width=0.125, image_size=75, depth=1),
                                              {"kind": "cuda", "arch": "sm_90"}, name="inception_v3")
    return program, schedule_graph(program.graph, "ios", "sim:h100")
