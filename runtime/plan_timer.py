"""Time whole execution plans against each other on this machine: what the never-slower guard measures.

It lives in ``runtime`` because both sides need it: the compiler's guard (``passes.guard``) runs it in process, and
a device server (``runtime.rpc_server``) runs it for a guard that measures on a remote device, where only TVM's
runtime is installed.
"""
from __future__ import annotations

import time

import numpy as np


def time_plans(runs: dict, repeat: int = 15, warmup: int = 2, seed: int = 0) -> dict[str, list[float]]:
    """``runs`` maps a name to ``(library, plan)``; every plan runs on the same random inputs, interleaved, so
    machine noise hits all alike. Plans may live in different libraries (a merged program and the original
    sequential one share no constants). Returns seconds per run per name."""
    import tvm
    from tvm.runtime import vm as rvm   # imported by name: a runtime-only process has not loaded it yet

    from .model import CONSTANTS_FUNC, ScheduledModel, _default_cpu_executor, kernel_library, lookup_kernel
    from .thread_executor import ThreadExecutor

    any_plan = next(iter(runs.values()))[1]
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(s["shape"]).astype(s["dtype"]) for s in any_plan.inputs]
    times: dict[str, list[float]] = {k: [] for k in runs}
    calls, closers = {}, []
    constants_of: dict[int, list] = {}
    try:
        for k, (library, plan) in runs.items():
            # each plan on the executor it ships with: a plan without concurrent groups on the Relax VM (the CPU
            # default, runtime.model._default_cpu_executor), which runs the library's program one kernel after
            # another; timing it on worker threads instead would charge it their per-kernel dispatch
            if _default_cpu_executor(plan) == "vm":
                model = ScheduledModel(library, device_kind="cpu", plan=plan)
                args = [tvm.runtime.tensor(x, tvm.cpu(0)) for x in inputs]
                calls[k] = lambda model=model, args=args: model.run(*args, numpy=False)
                closers.append(model.close)
                continue
            if id(library) not in constants_of:
                constants_of[id(library)] = list(rvm.VirtualMachine(library, tvm.cpu(0))[CONSTANTS_FUNC]())
            lib = kernel_library(library)
            ex = ThreadExecutor(plan, lambda n, lib=lib: lookup_kernel(lib, n), constants_of[id(library)],
                                tvm.cpu(0))
            closers.append(ex.close)
            ex._inputs = ex._check_inputs(inputs)
            calls[k] = ex.run_raw
        for call in calls.values():
            for _ in range(warmup):
                call()
        for _ in range(repeat):
            for k, call in calls.items():
                t0 = time.perf_counter()
                call()
                times[k].append(time.perf_counter() - t0)
    finally:
        for close in closers:
            close()
    return times
