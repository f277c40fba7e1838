"""The CPU worker-thread executor with fewer workers than a stage has groups: no more workers than cores by
default, every group run exactly once in a valid order, the same numbers as sequential, and a failing kernel
reported instead of a hang."""
import threading

import numpy as np
import pytest
import tvm

import tvm_interop
from tvm_interop.passes.lower import make_plan
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.model import CONSTANTS_FUNC, kernel_library, lookup_kernel
from tvm_interop.runtime.thread_executor import ThreadExecutor


@pytest.fixture(scope="module")
def greedy(branchy_model):
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", guard=False)
    lib = kernel_library(cm.runner.library)
    consts = list(tvm.runtime.vm.VirtualMachine(cm.runner.library, tvm.cpu())[CONSTANTS_FUNC]())
    yield cm, lib, consts
    cm.close()


def _executor(greedy, mode="stage", lookup=None, **kw) -> ThreadExecutor:
    cm, lib, consts = greedy
    plan = make_plan(cm.program, cm.schedule, mode=mode)
    return ThreadExecutor(plan, lookup or (lambda n: lookup_kernel(lib, n)), consts, mode=mode, **kw)


def test_no_more_workers_than_cores_unless_asked(greedy):
    wide = _executor(greedy, cores=2)
    assert wide.plan.max_concurrency() >= 3
    assert wide.num_workers == 2
    asked = _executor(greedy, cores=2, num_workers=3)
    assert asked.num_workers == 3
    many = _executor(greedy, cores=64)
    assert many.num_workers == many.plan.max_concurrency()


@pytest.mark.parametrize("mode", ["stage", "dependency"])
@pytest.mark.parametrize("workers", [2, 3])
def test_fewer_workers_than_groups_run_every_call_once_in_order(greedy, branchy_input, mode, workers):
    cm, lib, consts = greedy
    seq = ThreadExecutor(make_plan(cm.program, schedule_graph(cm.graph, "sequential")),
                         lambda n: lookup_kernel(lib, n), consts)
    ex = _executor(greedy, mode=mode, cores=2, num_workers=workers)
    try:
        events = ex.run_traced(branchy_input)
        assert sorted(e["call"] for e in events) == list(range(len(ex.plan.calls)))
        assert {e["thread"] for e in events} - {threading.current_thread().name}
        assert len({e["thread"] for e in events}) <= workers + 1      # the workers, and the caller's own stages
        end = {e["call"]: e["end"] for e in events}
        for e in events:
            assert all(end[d] <= e["start"] for d in ex.plan.deps[e["call"]]), "a call ran before its producer"
        for _ in range(50):
            assert np.array_equal(ex.run(branchy_input), seq.run(branchy_input))
    finally:
        ex.close()
        seq.close()


@pytest.mark.parametrize("mode", ["stage", "dependency"])
def test_a_failing_kernel_in_a_pulled_group_is_raised_not_hung(greedy, branchy_input, mode):
    cm, lib, consts = greedy
    plan = make_plan(cm.program, cm.schedule, mode=mode)
    wide = next(st for st in plan.stages if len(st) >= 3)
    victim = plan.calls[wide[-1][0]].func

    def lookup(name):
        f = lookup_kernel(lib, name)
        if name != victim:
            return f

        def broken(*args):
            raise RuntimeError(f"{name} failed on purpose")
        return broken

    ex = ThreadExecutor(plan, lookup, consts, mode=mode, cores=2)
    try:
        with pytest.raises((RuntimeError, InteropError), match="failed on purpose|another group failed"):
            ex.run(branchy_input)
    finally:
        ex.close()
