"""Allocations of 1-2 KiB (AVX-512's register tiles) stay on the stack in the library we build (``stack_tiles``)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm.script import tirx as T

from tvm_interop.passes.kernels import stack_tiles
from tvm_interop.passes.kernels.cpu_schedule import workspace_allocations
from tvm_interop.passes.wave.cpu_pipeline import compile_with_waves


def _scratch_kernel(n: int):
    """b = reversed(a * 2) + 1 through a scratch buffer of ``n`` floats (4n bytes), read in another order than it
    was written, so that a buffer in the wrong place or of the wrong size computes wrong numbers."""

    @T.prim_func(s_tir=True)
    def kernel(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        T.func_attr({"global_symbol": "main"})
        scratch = T.alloc_buffer((n,), "float32")
        for i in range(n):
            with T.sblock("double"):
                vi = T.axis.spatial(n, i)
                scratch[vi] = a[vi] * T.float32(2)
        for i in range(n):
            with T.sblock("reverse"):
                vi = T.axis.spatial(n, i)
                b[vi] = scratch[n - 1 - vi] + T.float32(1)

    return tvm.IRModule({"main": kernel})


def _build_and_run(n: int):
    lib = compile_with_waves(_scratch_kernel(n), tvm.target.Target("llvm"))
    a = np.random.default_rng(n).standard_normal(n).astype("float32")
    b = tvm.runtime.tensor(np.zeros(n, "float32"))
    lib["main"](tvm.runtime.tensor(a), b)
    np.testing.assert_allclose(b.numpy(), a[::-1] * 2 + 1, rtol=1e-6)
    return [s for s in workspace_allocations(lib.mod.inspect_source("ll")) if s is not None]


@pytest.mark.parametrize("n", [256, 384, 512])
def test_allocations_up_to_the_cap_are_stack_arrays_in_the_built_library(n):
    """1 KiB (256 floats: TVM's own limit is *under* 1 KiB), 1.5 KiB and 2 KiB: no heap workspace in the LLVM of
    the library, and the numbers are right."""
    assert n * 4 <= stack_tiles.MAX_STACK_BYTES
    assert _build_and_run(n) == []


def test_without_the_pass_tvm_puts_them_on_the_heap(monkeypatch):
    """What the pass changes (so the test above can fail): TVM alone allocates 1.5 KiB from its workspace."""
    monkeypatch.setattr(stack_tiles, "ENABLED", False)
    assert _build_and_run(384) == [1536]


def test_larger_buffers_stay_on_the_heap():
    """4 KiB is more than any register tile: left to TVM's workspace, as are repacked weights and padded inputs."""
    assert _build_and_run(1024) == [4096]


def test_only_constant_global_cpu_allocations_are_marked():
    buf = tvm.tirx.decl_buffer((416,), "float32", "tile")
    assert stack_tiles.stack_bytes(buf) == 1664
    assert stack_tiles.stack_bytes(tvm.tirx.decl_buffer((26,), "float32x16", "vec")) == 1664
    assert stack_tiles.stack_bytes(tvm.tirx.decl_buffer((tvm.tirx.Var("n", "int32"),), "float32", "dyn")) is None
    marked = stack_tiles._mark(tvm.tirx.stmt.AllocBuffer(buf))
    assert int(marked.annotations[stack_tiles.STACK_ANNOTATION]) == 1
    shared = tvm.tirx.decl_buffer((416,), "float32", "smem", scope="shared")
    unmarked = tvm.tirx.stmt.AllocBuffer(shared)
    assert stack_tiles._mark(unmarked).same_as(unmarked)
