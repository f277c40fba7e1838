"""The memory check of the program that is built (passes.as_built), across the zoo and the fuzz models.

Every zoo model (small config) x {greedy, lios, ios} x {stage, dependency} x {direct, CUDA graph}, lowered for
CUDA and taken through the CUDA build's own passes up to KillAfterLastUse: 0 violations, and every keep-alive
call that the lowering emitted is still there (the H100 race was TVM's pipeline deleting them). No GPU needed.
The fuzz part (random models x schedulers) is slow-marked.
"""
from __future__ import annotations

import pytest
from tvm import relax

import tvm_interop
from tvm_interop.passes.as_built import as_built_ir, check_lowered
from tvm_interop.passes.lower_streams import lower_program
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.stream_memory import check_stream_memory_safety
from tvm_interop.runtime.cuda import KEEPALIVE_FUNC, MAIN_FUNC, MAIN_GRAPH_FUNC
from tvm_interop.models import get_model, small_config
from zoo_cases import zoo_params

CUDA = {"kind": "cuda", "arch": "sm_90"}
SCHEDULERS = ("greedy", "lios", "ios")




def count_keepalive(func: relax.Function) -> int:
    n = 0

    def visit(e):
        nonlocal n
        if isinstance(e, relax.Call) and isinstance(e.op, relax.ExternFunc) and str(e.op.global_symbol) == KEEPALIVE_FUNC:
            n += 1

    relax.analysis.post_order_visit(func.body, visit)
    return n


def _check_program(program, scheduler: str, mode: str, label: str) -> None:
    sched = schedule_graph(program.graph, scheduler, "sim:h100")
    low = lower_program(program, sched, CUDA, mode=mode, cuda_graph=True)
    built = as_built_ir(low.mod, CUDA)
    report = check_stream_memory_safety(built)
    assert report.ok, f"{label} {scheduler} {mode}: {report.summary()}"
    # the direct function keeps every keep-alive the lowering emitted
    assert count_keepalive(built[MAIN_FUNC]) == count_keepalive(low.mod[MAIN_FUNC]), label
    if low.cuda_graph:
        # the captured region is replayed inline by the check: the graph variant's kernels are all seen
        # (the scheduled ones plus the input and output copies)
        assert report.functions[MAIN_GRAPH_FUNC]["kernels"] >= report.functions[MAIN_FUNC]["kernels"] + 2, label


@pytest.fixture(scope="module", params=zoo_params())
def zoo_program(request):
    name = request.param
    return name, tvm_interop.api.prepare_program(get_model(name, **small_config(name)), CUDA, name=name)


@pytest.mark.parametrize("mode", ["stage", "dependency"])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_zoo_as_built_cuda_is_memory_safe(zoo_program, scheduler, mode):
    name, program = zoo_program
    _check_program(program, scheduler, mode, name)


def test_cpu_build_checks_the_ir_it_compiles(branchy_model, branchy_input, branchy_reference):
    """The CPU build runs the check inside TVM's LLVM pipeline too, and the keep-alive calls survive it."""
    import numpy as np

    program = tvm_interop.api.prepare_program(branchy_model, "llvm")
    sched = schedule_graph(program.graph, "greedy")
    low = lower_program(program, sched, "llvm")
    built = as_built_ir(low.mod, "llvm")
    assert count_keepalive(built[MAIN_FUNC]) == count_keepalive(low.mod[MAIN_FUNC]) > 0
    assert check_lowered(low.mod, "llvm").ok
    cm = tvm_interop.compile(branchy_model, target="llvm", scheduler="greedy", executor="vm")
    assert cm.plan.meta["memory_check"].startswith("as-built")
    np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, rtol=1e-4, atol=1e-4)
    cm.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(12))
def test_fuzz_as_built_cuda_is_memory_safe(seed):
    from tvm_interop.fuzz import random_model

    mod, _ = random_model(seed)
    program = tvm_interop.api.prepare_program(mod, CUDA)
    for scheduler in SCHEDULERS:
        for mode in ("stage", "dependency"):
            _check_program(program, scheduler, mode, f"fuzz seed {seed}")


def test_pipeline_pass_refuses_an_unsafe_program(branchy_model, monkeypatch):
    """``tvm.compile(mod, relax_pipeline=passes.pipeline(...))`` runs the same in-pipeline check."""
    import tvm

    import tvm_interop.passes.lower_streams as ls
    from tvm_interop.passes import pipeline

    real = ls.lower_to_relax
    monkeypatch.setattr(ls, "lower_to_relax", lambda *a, **k: real(*a, **{**k, "keep_alive": False}))
    with pytest.raises(Exception, match="not memory-safe"):
        tvm.compile(branchy_model, "llvm", relax_pipeline=pipeline(scheduler="greedy"))
    monkeypatch.setattr(ls, "lower_to_relax", real)
    tvm.compile(branchy_model, "llvm", relax_pipeline=pipeline(scheduler="greedy"))


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="CUDA builds need nvcc")
def test_cuda_build_with_the_check_refuses_an_unsafe_program(branchy_model):
    """``build_cuda(..., after_kill=[memory_check_pass()])`` (the GPU check's libraries) names the violation."""
    from tvm_interop.passes.as_built import memory_check_pass
    from tvm_interop.passes.cuda_build import build_cuda
    from tvm_interop.runtime.errors import InteropError

    program = tvm_interop.api.prepare_program(branchy_model, CUDA)
    low = lower_program(program, schedule_graph(program.graph, "greedy"), CUDA, keep_alive=False)
    with pytest.raises(InteropError, match=r"not memory-safe \(\d+ violation\(s\)\):\n  \[storage\]"):
        build_cuda(low.mod, CUDA, cuda_graph=False, after_kill=[memory_check_pass()])
