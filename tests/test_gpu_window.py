"""The GPU default schedule for small-window reductions (``passes.kernels.gpu_window``): which kernels it takes,
the launch it gives them, and that DLight's own rules stay available for the plain-TVM reference. No GPU needed;
the numbers (against TVM's own kernels) come from ``scripts/gpu_check.sh`` on a GPU."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from tvm_interop.passes.cuda_build import robust_default_schedule
from tvm_interop.passes.kernels.gpu_window import MIN_OUTPUTS, THREADS_PER_BLOCK, WindowReduction
from tvm_interop.passes.target import normalize_target

TARGET = normalize_target("cuda -arch=sm_90")


def _kernel(shape, op) -> tvm.tirx.PrimFunc:
    """The fused PrimFunc of ``op(x)`` for an input of ``shape``, as TVM's legalization and fusion make it."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(op(x, shape[1])))
        bb.emit_func_output(out)
    mod = bb.get()
    for p in (relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps(),
              relax.transform.FuseTIR()):
        mod = p(mod)
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert len(funcs) == 1
    return funcs[0]


def avg_pool(x, channels):
    return relax.op.nn.avg_pool2d(x, pool_size=(3, 3), strides=(1, 1), padding=(1, 1), count_include_pad=False)


def max_pool(x, channels):
    return relax.op.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2))


def depthwise_relu(x, channels):
    w = relax.const(np.ones((channels, 1, 5, 5), "float32"))
    return relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=2, groups=channels))


def global_mean(x, channels):
    return relax.op.mean(x, axis=[2, 3])


def conv3x3(x, channels):
    return relax.op.nn.conv2d(x, relax.const(np.ones((channels, channels, 3, 3), "float32")), padding=1)


@pytest.mark.parametrize("op,shape", [(avg_pool, (1, 288, 35, 35)), (max_pool, (1, 64, 147, 147)),
                                      (depthwise_relu, (1, 96, 28, 28))],
                         ids=["avg_pool", "max_pool", "depthwise_conv_relu"])
def test_window_reductions_get_a_thread_per_output(op, shape):
    """Pooling and depthwise convolution: one launch, a thread per output (blocks of THREADS_PER_BLOCK), the window
    summed in a register (local scope), the epilogue fused, nothing in shared memory."""
    func = _kernel(shape, op)
    sch = WindowReduction().apply(func, TARGET, False)
    assert sch is not None
    text = sch.mod["main"].script()
    assert f'T.thread_binding(T.int64({THREADS_PER_BLOCK}), thread="threadIdx.x")' in text
    assert text.count('thread="blockIdx.x"') == 1, "one launch: the epilogue runs in the reduction's threads"
    assert 'scope="local"' in text and 'scope="shared"' not in text


def test_the_block_count_covers_every_output_once():
    func = _kernel((1, 288, 35, 35), avg_pool)
    text = WindowReduction().apply(func, TARGET, False).mod["main"].script()
    blocks = -(-288 * 35 * 35 // THREADS_PER_BLOCK)
    assert f'T.thread_binding(T.int64({blocks}), thread="blockIdx.x")' in text
    assert f"< T.int64({288 * 35 * 35})" in text   # the last block's extra threads are guarded


@pytest.mark.parametrize("op,shape,why", [
    (global_mean, (1, 2048, 8, 8), "too few outputs for a thread each"),
    (conv3x3, (1, 64, 28, 28), "576 terms per output is not a window"),
    (avg_pool, (1, 4, 16, 16), "too few outputs"),
])
def test_other_reductions_are_left_to_dlight(op, shape, why):
    func = _kernel(shape, op)
    assert WindowReduction().apply(func, TARGET, False) is None, why


def test_elementwise_kernels_are_left_to_dlight():
    func = _kernel((1, 64, 32, 32), lambda x, _: relax.op.nn.relu(x))
    assert WindowReduction().apply(func, TARGET, False) is None


def test_default_schedule_uses_the_rule_and_the_reference_can_leave_it_out():
    """``robust_default_schedule`` takes WindowReduction for an average pool; with ``window_rule=False`` (the
    plain-TVM reference of gpu_check) the pool keeps DLight's block per output."""
    func = _kernel((1, 288, 35, 35), avg_pool)
    with TARGET:
        ours = robust_default_schedule(TARGET)(tvm.IRModule({"pool": func}))["pool"].script()
        dlight = robust_default_schedule(TARGET, window_rule=False)(tvm.IRModule({"pool": func}))["pool"].script()
    assert f'T.thread_binding(T.int64({THREADS_PER_BLOCK}), thread="threadIdx.x")' in ours
    assert f'T.thread_binding(T.int64({288 * 35 * 35}), thread="blockIdx.x")' in dlight
    assert MIN_OUTPUTS <= 288 * 35 * 35


def test_scheduled_pool_compiles_for_cuda():
    """The kernel goes through TVM's CUDA code generation (no GPU needed for the source)."""
    func = _kernel((1, 288, 35, 35), avg_pool)
    sch = WindowReduction().apply(func, TARGET, False)
    mod = tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")})
    with TARGET:
        lib = tvm.tirx.build(mod, target=TARGET)
    src = lib.imports[0].inspect_source()
    assert "__launch_bounds__(256)" in src and "__shared__" not in src
