"""Fuzzing the whole pipeline: random multi-branch CNNs through prepare -> every scheduler -> lower -> both
executors (threads in stage and dependency mode, and the stream-lowered Relax VM) must equal plain TVM.

The default suite runs 12 seeds; ``-m slow`` runs 200 more. A failure names its seed:
``python -m tvm_interop.fuzz SEED`` prints that model.
"""
import numpy as np
import pytest

import tvm_interop
from tvm_interop.passes.lower import make_plan
from tvm_interop.passes.schedulers import available_schedulers, schedule_graph
from tvm_interop.runtime.model import CONSTANTS_FUNC, ScheduledModel, kernel_library, lookup_kernel
from tvm_interop.runtime.thread_executor import ThreadExecutor
from tvm_interop.fuzz import random_input, random_model

TOL = dict(rtol=1e-4, atol=1e-4)


def _close(out, ref, msg):
    if isinstance(ref, list):
        assert isinstance(out, list) and len(out) == len(ref), msg
        for o, r in zip(out, ref):
            np.testing.assert_allclose(o, r, **TOL, err_msg=msg)
    else:
        np.testing.assert_allclose(out, ref, **TOL, err_msg=msg)


def check_seed(seed: int) -> None:
    import tvm

    mod, desc = random_model(seed)
    x = random_input(mod, seed)
    ref = tvm_interop.run_reference(mod, [x])
    schedulers = [s for s in available_schedulers()]
    vm_scheduler = schedulers[seed % len(schedulers)]
    try:
        cm = tvm_interop.compile(mod, scheduler=vm_scheduler if vm_scheduler != "exhaustive" else "greedy",
                                 name=f"fuzz{seed}")
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"compile failed for {desc}: {e}") from e
    graph = cm.graph
    _close(ScheduledModel(cm.runner.library, executor="vm").run(x), ref, f"vm/{vm_scheduler} {desc}")
    lib = kernel_library(cm.runner.library)
    constants = list(tvm.runtime.vm.VirtualMachine(cm.runner.library, tvm.cpu())[CONSTANTS_FUNC]())
    for name in schedulers:
        if name == "exhaustive" and len(graph) > 8:
            continue
        sched = schedule_graph(graph, name, "sim:cpu" if "sim" in _cost_kinds() else "unit")
        sched.validate(graph)
        for mode in ("stage", "dependency"):
            plan = make_plan(cm.program, sched, mode=mode)
            ex = ThreadExecutor(plan, lambda n: lookup_kernel(lib, n), constants, mode=mode)
            try:
                _close(ex.run(x), ref, f"threads/{name}/{mode} {desc}")
            finally:
                ex.close()
    cm.close()


def _cost_kinds():
    from tvm_interop.passes.cost import registry

    return registry.known()


@pytest.mark.parametrize("seed", range(12))
def test_fuzz_pipeline(seed):
    check_seed(seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12, 212))
def test_fuzz_pipeline_more(seed):
    check_seed(seed)
