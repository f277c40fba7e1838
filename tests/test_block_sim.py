"""scripts/block_sim.py: a CUDA-graph program simulated thread block by thread block (an experiment)."""
from __future__ import annotations

import pytest
from scripts_under_test import load_script

from tvm_interop.passes.cost.program import KERNEL, MAIN, SET, SYNC, IssuedOp, IssuedProgram
from tvm_interop.runtime.errors import InteropError

bs = load_script("block_sim")
DEV = bs.BlockDevice(event_latency=0.0)


def _pair(a: str, b: str, graph: bool = True) -> IssuedProgram:
    """``a`` on stream 0 beside ``b`` on stream 1, forked from and joined to the caller's stream."""
    ops = [IssuedOp(SYNC, a=MAIN, b=0), IssuedOp(SYNC, a=MAIN, b=1), IssuedOp(SET, a=0), IssuedOp(KERNEL, unit=a),
           IssuedOp(SET, a=1), IssuedOp(KERNEL, unit=b), IssuedOp(SYNC, a=0, b=MAIN), IssuedOp(SYNC, a=1, b=MAIN)]
    return IssuedProgram(ops=ops, cuda_graph=graph)


def test_kernels_that_fit_the_sms_together_do_not_slow_each_other():
    # two 44-block kernels of 271 us (NASNet-A-large's 4032 -> 672 1x1 convolution): 88 blocks, one SM each
    k = bs.Kernel(271e-6, 44, 128)
    end, spans = bs.simulate_blocks(_pair("a", "b"), {"a": k, "b": k}, DEV)
    assert end == pytest.approx(271e-6) and spans["a"] == pytest.approx((0.0, 271e-6))


def test_blocks_that_share_an_sm_share_its_throughput_and_the_slowest_block_ends_the_kernel():
    # two 84-block kernels: 36 SMs hold a block of each; two 4-warp blocks deliver 2 ** 0.31 of one, so those
    # blocks, and with them both kernels, take 2 / 2 ** 0.31 = 1.61x (the H200 table stage the exponent came from)
    k = bs.Kernel(97e-6, 84, 128)
    end, _ = bs.simulate_blocks(_pair("a", "b"), {"a": k, "b": k}, DEV)
    assert end == pytest.approx(97e-6 * 2 / 2 ** 0.31)
    # alone, a kernel's measured time is what it takes, however many waves and blocks per SM it has
    for blocks, threads in ((44, 128), (300, 128), (1737, 1024)):
        prog = IssuedProgram(ops=[IssuedOp(KERNEL, unit="k")], cuda_graph=True)
        assert bs.simulate_blocks(prog, {"k": bs.Kernel(5e-6, blocks, threads)}, DEV)[0] == pytest.approx(5e-6)
    assert bs.alone_time(264, 128, DEV) == pytest.approx(2 / 2 ** 0.31)   # two blocks on every SM


def test_a_stream_runs_its_kernels_in_order_and_waits_for_its_events():
    dev = bs.BlockDevice(event_latency=2e-6)
    ops = [IssuedOp(KERNEL, unit="a"), IssuedOp(SYNC, a=MAIN, b=0), IssuedOp(SET, a=0), IssuedOp(KERNEL, unit="b"),
           IssuedOp(KERNEL, unit="c")]
    k = {u: bs.Kernel(10e-6, 8, 128) for u in "abc"}
    end, spans = bs.simulate_blocks(IssuedProgram(ops=ops, cuda_graph=True), k, dev)
    assert spans["b"][0] == pytest.approx(12e-6) and spans["c"] == pytest.approx((22e-6, 32e-6))
    assert end == pytest.approx(32e-6)


def test_direct_launches_and_missing_kernels_are_refused():
    k = bs.Kernel(1e-6, 1, 32)
    with pytest.raises(InteropError, match="CUDA-graph programs only"):
        bs.simulate_blocks(_pair("a", "b", graph=False), {"a": k, "b": k})
    with pytest.raises(InteropError, match="no time or launch shape for 1 kernel"):
        bs.simulate_blocks(_pair("a", "b"), {"a": k})
