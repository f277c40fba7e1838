"""Race test: a concurrent schedule, run 1000 times with fresh inputs, gives bit-identical outputs to the
sequential run of the same kernels (TVM's CPU kernels are deterministic), in stage and dependency mode.

A buffer reused while another worker still reads it, or a missing wait, shows up here as a mismatch."""
import numpy as np
import pytest
import tvm

import tvm_interop
from tvm_interop.passes.lower import make_plan
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.runtime.model import CONSTANTS_FUNC, kernel_library, lookup_kernel
from tvm_interop.runtime.thread_executor import ThreadExecutor


@pytest.mark.parametrize("mode", ["stage", "dependency"])
def test_concurrent_runs_are_bit_identical_to_sequential(branchy_model, mode):
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", mode=mode, guard=False)
    lib = kernel_library(cm.runner.library)
    consts = list(tvm.runtime.vm.VirtualMachine(cm.runner.library, tvm.cpu())[CONSTANTS_FUNC]())
    seq_plan = make_plan(cm.program, schedule_graph(cm.graph, "sequential"))
    conc_plan = make_plan(cm.program, cm.schedule, mode=mode)
    assert conc_plan.max_concurrency() >= 3
    seq = ThreadExecutor(seq_plan, lambda n: lookup_kernel(lib, n), consts)
    conc = ThreadExecutor(conc_plan, lambda n: lookup_kernel(lib, n), consts, mode=mode)
    rng = np.random.default_rng(0)
    try:
        for i in range(1000):
            x = rng.standard_normal((1, 8, 16, 16)).astype("float32")
            a, b = seq.run(x), conc.run(x)
            assert np.array_equal(a, b), f"run {i}: concurrent output differs from sequential"
    finally:
        seq.close()
        conc.close()
        cm.close()
