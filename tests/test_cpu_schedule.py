"""Default CPU schedule: every scheduled build equals the unscheduled build of the same Relax graph."""
from __future__ import annotations

import logging
import re

import numpy as np
import pytest

import tvm
from tvm import relax, tirx

from tvm_interop.passes.kernels.cpu_schedule import (apply_cpu_schedules, schedule_cpu, vector_lanes,
                                                      workspace_allocations)

TARGET = tvm.target.Target("llvm")
RNG = np.random.default_rng(0)


def _const(shape, scale=0.2):
    return relax.const((RNG.standard_normal(shape) * scale).astype("float32"))


def _graph(input_shapes, body):
    """Relax module main(*inputs) = body(bb, *inputs), lowered with the "zero" pipeline."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(input_shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return relax.get_pipeline("zero")(bb.get())


def _conv(x_shape, cout, k, stride=1, pad=0, groups=1, bias=False, relu=False):
    kh, kw = (k, k) if isinstance(k, int) else k

    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, _const((cout, x_shape[1] // groups, kh, kw)), strides=stride,
                                       padding=pad, groups=groups))
        if bias:
            y = bb.emit(relax.op.add(y, _const((1, cout, 1, 1))))
        if relu:
            y = bb.emit(relax.op.nn.relu(y))
        return y

    return _graph([x_shape], body)


def _dense(m, k, n, bias=True, weight_as_input=False):
    if weight_as_input:  # dense with a runtime weight: stays matmul_NT (no constant folding of the transpose)
        def body(bb, x, w):
            return bb.emit(relax.op.matmul(x, relax.op.permute_dims(w)))

        return _graph([(m, k), (n, k)], body)

    def body(bb, x):
        y = bb.emit(relax.op.linear(x, _const((n, k)), _const((n,)) if bias else None))
        return bb.emit(relax.op.nn.relu(y))

    return _graph([(m, k)], body)


def _pool(kind, x_shape, size, stride, pad, **kw):
    def body(bb, x):
        op = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
        return bb.emit(op(x, pool_size=size, strides=stride, padding=pad, **kw))

    return _graph([x_shape], body)


def _global_pool(x_shape):
    return _graph([x_shape], lambda bb, x: bb.emit(relax.op.nn.adaptive_avg_pool2d(x, (1, 1))))


def _concat(shapes):
    def body(bb, *xs):
        y = bb.emit(relax.op.concat(list(xs), axis=1))
        return bb.emit(relax.op.nn.relu(y))

    return _graph(shapes, body)


def _softmax(shape):
    return _graph([shape], lambda bb, x: bb.emit(relax.op.nn.softmax(x, axis=-1)))


def _add_relu(shape):
    return _graph([shape, shape], lambda bb, a, b: bb.emit(relax.op.nn.relu(relax.op.add(a, b))))


CASES = {
    "conv3x3_pad1": lambda: _conv((1, 16, 20, 20), 32, 3, pad=1),
    "conv3x3_odd_width": lambda: _conv((1, 32, 17, 17), 48, 3, pad=1),
    "conv1x1": lambda: _conv((1, 32, 14, 14), 48, 1),
    "conv_strided": lambda: _conv((1, 8, 23, 23), 16, 3, stride=2, pad=1),
    "conv_stem_3ch": lambda: _conv((1, 3, 33, 33), 32, 3, stride=2),
    "conv_1x7": lambda: _conv((1, 16, 17, 17), 24, (1, 7), pad=(0, 3)),
    "conv_depthwise": lambda: _conv((1, 24, 15, 15), 24, 3, pad=1, groups=24),
    "conv_grouped": lambda: _conv((1, 16, 12, 12), 32, 3, pad=1, groups=4),
    "conv_depthwise_7x7_s2_threads": lambda: _conv((1, 16, 61, 61), 16, 7, stride=2, pad=3, groups=16),
    "conv_depthwise_prime_width": lambda: _conv((1, 16, 37, 37), 16, 3, pad=1, groups=16, bias=True),
    "conv_1x1_on_1x1": lambda: _conv((1, 64, 1, 1), 32, 1, bias=True, relu=True),
    "conv_channels_not_multiple_of_8": lambda: _conv((1, 6, 11, 11), 10, 3, pad=1, bias=True),
    "conv1x1_ragged_channels_28_wide": lambda: _conv((1, 13, 28, 28), 13, 1, bias=True),
    "conv_bias_relu_batch2": lambda: _conv((2, 8, 13, 13), 16, 3, pad=1, bias=True, relu=True),
    "dense_bias_relu": lambda: _dense(1, 256, 128),
    "dense_batch8": lambda: _dense(8, 96, 40),
    "matmul_nt_runtime_weight": lambda: _dense(1, 64, 48, weight_as_input=True),
    "matmul_nt_batch16": lambda: _dense(16, 64, 48, weight_as_input=True),
    "max_pool_3x3_s2": lambda: _pool("max", (1, 16, 17, 17), 3, 2, 0),
    "max_pool_pad": lambda: _pool("max", (1, 8, 16, 16), 3, 1, 1),
    "max_pool_prime_width": lambda: _pool("max", (1, 8, 75, 75), 3, 2, 0),
    "avg_pool_3x3_s1_p1": lambda: _pool("avg", (1, 16, 12, 12), 3, 1, 1, count_include_pad=True),
    "avg_pool_exclude_pad": lambda: _pool("avg", (1, 8, 9, 9), 3, 1, 1, count_include_pad=False),
    "global_avg_pool": lambda: _global_pool((1, 64, 8, 8)),
    # channel-blocked pooling (passes.layout), 4-lane blocks for the generic TARGET (SSE: 4 lanes)
    "max_pool_nchw4c_s2_pad": lambda: _pool("max", (1, 3, 17, 17, 4), 3, 2, 1, layout="NCHW4c"),
    "avg_pool_nchw4c_exclude_pad": lambda: _pool("avg", (1, 2, 9, 9, 4), 3, 1, 1, count_include_pad=False,
                                                 layout="NCHW4c"),
    "concat_relu": lambda: _concat([(1, 8, 9, 9), (1, 16, 9, 9), (1, 4, 9, 9)]),
    "add_relu": lambda: _add_relu((1, 32, 28, 28)),
    "softmax": lambda: _softmax((4, 100)),
}

# cases whose heavy kernel must actually be scheduled (not just left alone)
MUST_SCHEDULE = {
    "conv3x3_pad1", "conv3x3_odd_width", "conv1x1", "conv_strided", "conv_stem_3ch", "conv_1x7", "conv_depthwise",
    "conv_grouped", "conv_bias_relu_batch2", "dense_bias_relu", "dense_batch8", "matmul_nt_runtime_weight",
    "matmul_nt_batch16", "max_pool_3x3_s2", "max_pool_pad", "avg_pool_3x3_s1_p1", "global_avg_pool",
    "concat_relu", "add_relu", "conv_depthwise_prime_width", "conv_1x1_on_1x1", "conv_channels_not_multiple_of_8",
    "max_pool_prime_width", "max_pool_nchw4c_s2_pad", "avg_pool_nchw4c_exclude_pad",
}


# the plan the heavy kernel is expected to get (see passes/kernels/cpu_schedule.py)
EXPECTED_PLAN = {
    "conv3x3_pad1": "spatial_vector",
    "conv3x3_odd_width": "spatial_vector",
    "conv1x1": "spatial_vector",
    "conv_strided": "spatial_vector",
    "conv_depthwise": "light_reduction",
    "conv_bias_relu_batch2": "spatial_vector",
    "dense_batch8": "spatial_vector",
    "max_pool_3x3_s2": "light_reduction",
    "avg_pool_3x3_s1_p1": "light_reduction",
    "max_pool_nchw4c_s2_pad": "light_reduction",
    "avg_pool_nchw4c_exclude_pad": "light_reduction",
    "conv_stem_3ch": "spatial_vector",
    "concat_relu": "injective",
    "add_relu": "injective",
}


def _plan_of(func):
    return str(func.attrs["tvm_interop.cpu_plan"]) if "tvm_interop.cpu_plan" in func.attrs else None


def _inputs(mod):
    return [RNG.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32")
            for p in mod["main"].params]


def _run(mod, inputs, target=TARGET):
    vm = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def _run_shipped(mod, inputs, target=TARGET):
    """``_run`` through the TIR pipeline our builds use (``passes.wave.cpu_pipeline``: AVX-512's register tiles of
    1-2 KiB kept on the stack), as the library that ships is compiled."""
    from tvm_interop.passes.wave.cpu_pipeline import compile_with_waves

    vm = relax.VirtualMachine(compile_with_waves(mod, target), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in inputs]).numpy()


def _runnable_here(target):
    """``target`` where this CPU has every instruction-set feature its code may use, else this machine's own
    CPU: a schedule made for an AVX-512 target is still checked for its numbers on a host without AVX-512 (the
    same scheduled TIR, other instructions), instead of dying with SIGILL in the test process."""
    from tvm_interop.passes.target import cpu_isa_features, normalize_target
    from tvm_interop.runtime.cpu_features import host_cpu_flags, missing_features

    flags = host_cpu_flags()
    if flags is not None and missing_features(cpu_isa_features(target), flags):
        return normalize_target("llvm")
    return target


def _prim_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_scheduled_equals_unscheduled(case):
    mod = CASES[case]()
    smod = apply_cpu_schedules(mod, TARGET)
    before, after = _prim_funcs(mod), _prim_funcs(smod)
    assert before.keys() == after.keys()
    plans = {name: _plan_of(after[name]) for name in before if not after[name].same_as(before[name])}
    if case in MUST_SCHEDULE:
        assert plans, f"no PrimFunc of {case} was scheduled"
    if case in EXPECTED_PLAN:
        assert EXPECTED_PLAN[case] in plans.values(), plans
    inputs = _inputs(mod)
    want = _run(mod, inputs)
    got = _run(smod, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_avx2_target_equals_unscheduled():
    """The AVX2 code path (8 lanes, repacked weights) on a few kernels, built for the host CPU when it has AVX2."""
    from tvm.target import codegen

    cpu = codegen.llvm_get_system_cpu()
    target = tvm.target.Target({"kind": "llvm", "mcpu": cpu})
    if not codegen.llvm_cpu_has_features(["avx2"], target):
        pytest.skip(f"host CPU {cpu} has no AVX2")
    assert vector_lanes(target) >= 8
    for case in ("conv3x3_odd_width", "conv_strided", "dense_batch8", "max_pool_3x3_s2"):
        mod = CASES[case]()
        inputs = _inputs(mod)
        want = _run(mod, inputs, target)
        got = _run(apply_cpu_schedules(mod, target), inputs, target)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=case)


def test_avx512_one_axis_reduction_gets_the_bigger_tile():
    """On a 32-register target a 1x1 convolution (a reduction over channels only) gets up to 26 accumulators:
    13 output columns x 2 vectors of output channels at 13x13 (a 3x3 one keeps at most 20: it spills beyond),
    and both, built as the library ships (tiles on the stack), still compute what the unscheduled build computes
    (run where the host has AVX-512)."""
    import re

    from tvm.target import codegen

    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    rows = {}
    for case, mod in {"1x1": _conv((1, 96, 13, 13), 64, 1, bias=True, relu=True),
                      "3x3": _conv((1, 32, 13, 13), 64, 3, pad=1, bias=True, relu=True),
                      "1x1_1000": _conv((1, 64, 13, 13), 1000, 1, bias=True, relu=True)}.items():
        (name, func), = [(n, f) for n, f in _prim_funcs(mod).items() if "conv2d" in n]
        text = schedule_cpu(func, target).script()
        unrolled = [int(n) for n in re.findall(r"T\.unroll\(T\.int64\((\d+)\)\)", text)]
        rows[case] = max(unrolled)
        host = tvm.target.Target({"kind": "llvm", "mcpu": codegen.llvm_get_system_cpu()})
        if codegen.llvm_cpu_has_features(["avx512f"], host):
            inputs = _inputs(mod)
            np.testing.assert_allclose(_run_shipped(apply_cpu_schedules(mod, host), inputs, host),
                                       _run(mod, inputs, host), rtol=1e-4, atol=1e-4, err_msg=case)
    assert rows["1x1"] == 13 and rows["3x3"] <= 10, rows
    assert rows["1x1_1000"] <= 26, rows


def test_vector_tiles_longer_than_a_vector_are_whole_vectors():
    """A row of 28 (or 20, 56) output columns is vectorised in tiles of at most one vector, or of whole vectors:
    LLVM compiles a 28-lane vector 25-30x slower than two 16-lane ones (RandWire's 1x1 convolutions over 78
    channels at 28 px: 1.19 ms -> 42 us alone). Checked on the schedule the build compiles: a 1x1 convolution
    with ragged channels (no channel vector) at 28 px on a 16-lane target."""
    import re

    from tvm_interop.passes.kernels.cpu_schedule import _choose_vec_tile

    for extent in (20, 28, 40, 56, 100):
        tile, _ = _choose_vec_tile(extent, 16)
        assert tile <= 16 or tile % 16 == 0, (extent, tile)
    assert _choose_vec_tile(32, 16) == (32, True) and _choose_vec_tile(14, 16) == (14, True)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    (name, func), = [(n, f) for n, f in _prim_funcs(_conv((1, 78, 28, 28), 78, 1, bias=True)).items()
                     if "conv2d" in n]
    text = schedule_cpu(func, target).script()
    lanes = [int(n) for n in re.findall(r"T\.vectorized\((?:T\.int64\()?(\d+)", text)]
    assert lanes and all(n <= 16 or n % 16 == 0 for n in lanes), lanes


def test_conv_schedule_is_tiled_parallel_and_vectorised():
    mod = _conv((1, 32, 28, 28), 64, 3, pad=1, bias=True, relu=True)  # 14 M multiply-adds: worth threads
    (name, func), = [(n, f) for n, f in _prim_funcs(mod).items() if "conv2d" in n]
    text = schedule_cpu(func, TARGET).script()
    assert "T.parallel" in text and "T.vectorized" in text
    assert "T.unroll" in text  # register tile: unrolled rows of vectors
    # bias add and relu are inlined into the write-back of the accumulator tile: no stage of their own
    assert 'T.sblock("T_add")' not in text and 'T.sblock("compute")' not in text


@pytest.mark.parametrize("mcpu", ["x86-64", "haswell", "skylake-avx512"])
@pytest.mark.parametrize("case", ["1x1 over width", "1x1 over channels", "3x3 padded", "dense", "blocked",
                                  "blocked, cropped"])
def test_register_tiles_are_not_heap_allocations(mcpu, case):
    """Built for real, through the TIR pipeline every build of ours uses (LLVM IR of the compiled kernel, what
    ships): every heap workspace the kernel allocates is larger than a register file (``MAX_STACK_BYTES``).
    TVM's LowerTVMBuiltin puts a CPU allocation on the stack only when its scope is "global" and it is under
    1 KiB; a small register tile allocated as "local" became a TVMBackendAllocWorkspace call, heap memory that
    LLVM does not keep in registers (RandWire's 1x1 convolutions ran 2-3x slower), and so did AVX-512's tiles of
    20-26 vectors (1280-1664 bytes) until ``stack_tiles`` marked them to stay on the stack."""
    from tvm_interop.passes.kernels.stack_tiles import MAX_STACK_BYTES
    from tvm_interop.passes.wave.cpu_pipeline import compile_with_waves

    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    if case.startswith("blocked"):  # the CPU layout's convolution (passes.kernels.nchwc), cropped or not
        from tvm import te

        from tvm_interop.passes.kernels.nchwc import conv2d_nchwc

        blk, width = vector_lanes(target), 17 if case.endswith("cropped") else 14
        data = te.placeholder((1, 4, width, width, blk), name="data")
        weight = te.placeholder((4, 4, 3, 3, blk, blk), name="weight")
        conv = conv2d_nchwc(data, weight, (1, 1), (1, 1, 1, 1), (1, 1))
        smod = tvm.IRModule({"conv": schedule_cpu(te.create_prim_func([data, weight, conv]), target)})
    else:
        mod = {"1x1 over width": lambda: _conv((1, 39, 14, 14), 39, 1, bias=True),    # vector along the width
               "1x1 over channels": lambda: _conv((1, 40, 14, 14), 40, 1, bias=True, relu=True),
               "3x3 padded": lambda: _conv((1, 32, 28, 28), 64, 3, pad=1, bias=True, relu=True),
               "dense": lambda: _dense(4, 256, 64)}[case]()
        smod = apply_cpu_schedules(mod, target)
    funcs = {n: f for n, f in _prim_funcs(smod).items() if _plan_of(f) in ("spatial_vector", "nchwc_conv")}
    assert funcs, {n: _plan_of(f) for n, f in _prim_funcs(smod).items()}
    for name, func in funcs.items():
        lib = compile_with_waves(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
        sizes = [n for n in workspace_allocations(lib.mod.inspect_source("ll")) if n is not None]
        assert all(n > MAX_STACK_BYTES for n in sizes), (name, sizes)


def test_vector_lanes():
    assert vector_lanes(tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})) == 16
    assert vector_lanes(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})) == 8
    assert vector_lanes(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu"})) == 4


def test_unschedulable_function_is_returned_unchanged(caplog):
    """Already scheduled functions, and opaque blocks (dependences hidden from TVM's checks), come back as is."""
    mod = CASES["conv1x1"]()
    func = next(iter(_prim_funcs(mod).values()))
    marked = func.with_attr("tirx.is_scheduled", True)
    assert schedule_cpu(marked, TARGET) is marked

    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def opaque(a: T.Buffer((16,), "float32"), b: T.Buffer((16,), "float32")):
        for i in range(16):
            with T.sblock("opaque"):
                T.reads(a[0:16])
                T.writes(b[i])
                b[i] = a[15 - i] + a[i]

    with caplog.at_level(logging.DEBUG, logger="tvm_interop.passes.kernels.cpu_schedule"):
        out = schedule_cpu(opaque, TARGET)
    assert out is opaque
    assert "opaque block" in caplog.text
    inputs = [np.arange(16, dtype="float32"), np.zeros(16, "float32")]
    a = tvm.runtime.tensor(inputs[0])
    b = tvm.runtime.tensor(inputs[1])
    tvm.compile(out.with_attr("global_symbol", "opaque"), TARGET)["opaque"](a, b)
    np.testing.assert_allclose(b.numpy(), inputs[0][::-1] + inputs[0])


def test_apply_leaves_relax_functions_alone():
    mod = CASES["conv1x1"]()
    smod = apply_cpu_schedules(mod, TARGET)
    tvm.ir.assert_structural_equal(smod["main"], mod["main"])
    # idempotent: a second application changes nothing
    again = apply_cpu_schedules(smod, TARGET)
    for name, func in _prim_funcs(smod).items():
        assert _prim_funcs(again)[name].same_as(func)


def _dense_nt_primfunc(m, n, k):
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def dense(a: T.Buffer((m, k), "float32"), b: T.Buffer((n, k), "float32"), bias: T.Buffer((n,), "float32"),
              c: T.Buffer((m, n), "float32")):
        T.func_attr({"tirx.noalias": True})
        mm = T.sblock_alloc_buffer((m, n))
        for i, j, r in T.grid(m, n, k):
            with T.sblock("T_matmul_NT"):
                vi, vj, vr = T.axis.remap("SSR", [i, j, r])
                with T.init():
                    mm[vi, vj] = T.float32(0)
                mm[vi, vj] = mm[vi, vj] + a[vi, vr] * b[vj, vr]
        for i, j in T.grid(m, n):
            with T.sblock("T_add"):
                vi, vj = T.axis.remap("SS", [i, j])
                c[vi, vj] = mm[vi, vj] + bias[vj]

    return dense


@pytest.mark.parametrize("m,plan", [(1, "reduction_vector"), (16, "spatial_vector")])
def test_dense_nt(m, plan):
    """matmul_NT (weights [N, K]): GEMV gets the rfactor plan, a batch the repacked-weight plan."""
    n, k = 40, 128
    func = _dense_nt_primfunc(m, n, k)
    out = schedule_cpu(func, TARGET)
    assert _plan_of(out) == plan
    a, b, bias = (RNG.standard_normal(s).astype("float32") for s in ((m, k), (n, k), (n,)))
    for f in (func, out):
        c = tvm.runtime.tensor(np.zeros((m, n), "float32"))
        tvm.compile(f.with_attr("global_symbol", "dense"), TARGET)["dense"](
            *[tvm.runtime.tensor(x) for x in (a, b, bias)], c)
        np.testing.assert_allclose(c.numpy(), a @ b.T + bias, rtol=1e-4, atol=1e-4)


def test_dynamic_batch():
    """Symbolic shapes: whatever gets scheduled must still be right (unsupported parts are left alone)."""
    n = tirx.Var("n", "int64")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, 8, 10, 10), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, _const((16, 8, 3, 3)), padding=1))
            y = bb.emit(relax.op.nn.relu(relax.op.add(y, _const((1, 16, 1, 1)))))
            out = bb.emit_output(bb.emit(relax.op.nn.max_pool2d(y, 2, 2)))
        bb.emit_func_output(out)
    mod = relax.get_pipeline("zero")(bb.get())
    smod = apply_cpu_schedules(mod, TARGET)
    plans = {name: _plan_of(f) for name, f in _prim_funcs(smod).items()}
    assert plans == {"fused_conv2d_add_relu": "spatial_vector", "max_pool2d": "light_reduction"}, plans
    for batch in (1, 3):
        inputs = [RNG.standard_normal((batch, 8, 10, 10)).astype("float32")]
        np.testing.assert_allclose(_run(smod, inputs), _run(mod, inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.serial
def test_scheduled_conv_is_much_faster():
    """A loose guard (the machine may be busy): >= 3x over the naive default on a mid-size conv."""
    import time

    mod = _conv((1, 32, 28, 28), 64, 3, pad=1, bias=True, relu=True)
    inputs = [tvm.runtime.tensor(a) for a in _inputs(mod)]

    def best_time(m):
        vm = relax.VirtualMachine(tvm.compile(m, TARGET), tvm.cpu())
        vm["main"](*inputs)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            vm["main"](*inputs)
            best = min(best, time.perf_counter() - t0)
        return best

    assert best_time(mod) > 3 * best_time(apply_cpu_schedules(mod, TARGET))


def test_depthwise_convolution_gets_threads_by_window_reads():
    """A depthwise convolution (NCHW, strided: no lane-contiguous plan) is parallel once its window reads (output
    elements x window) pay for threads, not only past a million output elements: NASNet-A-mobile's 7x7 stride-2
    ones (32 x 56 x 56 outputs, 4.9 M reads) ran on one core. A small one stays single-threaded."""
    from tvm_interop.passes.kernels.cpu_schedule import _MIN_PARALLEL_LIGHT_READS

    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    plans = {}
    for case, shape, k in (("nasnet_7x7", (1, 32, 111, 111), 7), ("small_3x3", (1, 16, 14, 14), 3)):
        (name, func), = [(n, f) for n, f in _prim_funcs(_conv(shape, shape[1], k, stride=2, pad=k // 2,
                                                                 groups=shape[1])).items() if "conv2d" in n]
        sched = schedule_cpu(func, target)
        plans[case] = (_plan_of(sched), "T.parallel" in sched.script())
    assert 32 * 56 * 56 * 49 >= _MIN_PARALLEL_LIGHT_READS > 16 * 7 * 7 * 9
    assert plans == {"nasnet_7x7": ("light_reduction", True), "small_3x3": ("light_reduction", False)}, plans


def test_parallel_false_gives_single_threaded_kernels():
    mod = _conv((1, 32, 28, 28), 64, 3, pad=1, bias=True, relu=True)
    (func,) = _prim_funcs(mod).values()
    assert "T.parallel" in schedule_cpu(func, TARGET).script()
    single = schedule_cpu(func, TARGET, parallel=False)
    assert "T.parallel" not in single.script() and "T.vectorized" in single.script()
    smod = apply_cpu_schedules(mod, TARGET, parallel=False)
    inputs = _inputs(mod)
    np.testing.assert_allclose(_run(smod, inputs), _run(mod, inputs), rtol=1e-4, atol=1e-4)


def test_unknown_plan_name():
    (func,) = _prim_funcs(CASES["conv1x1"]()).values()
    with pytest.raises(ValueError, match="unknown plan"):
        schedule_cpu(func, TARGET, plan="nope")


def test_big_activation_iterates_channel_blocks_innermost():
    """A convolution whose input is bigger than its weights and than a core's L2 (1x1 at 56x56, 1.2 MB) visits
    the output-channel blocks innermost, so the input tile stays in cache across them (ResNet-50 measured 9 %
    faster); a small one keeps the spatial order. Both compute what the unscheduled build computes."""
    import re

    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    orders = {}
    for case, mod in {"big": _conv((1, 96, 56, 56), 64, 1, bias=True, relu=True),
                      "small": _conv((1, 96, 13, 13), 64, 1, bias=True, relu=True)}.items():
        (name, func), = [(n, f) for n, f in _prim_funcs(mod).items() if "conv2d" in n]
        text = schedule_cpu(func, target).script()
        # the outer tile loops of the conv: the output channel tile is ff_0, the width tile xx_0, also as part of
        # a fused parallel loop's name (ff_0_yy_fused)
        tiles = re.findall(r"(?<![A-Za-z0-9])(ff_0|xx_0)(?![0-9])", text.split('T.sblock("conv2d_nchw_init")')[0])
        orders[case] = tiles
        inputs = _inputs(mod)
        np.testing.assert_allclose(_run(apply_cpu_schedules(mod, TARGET), inputs), _run(mod, inputs),
                                   rtol=1e-4, atol=1e-4, err_msg=case)
    assert orders["big"][:2] == ["xx_0", "ff_0"], orders
    assert orders["small"][:2] == ["ff_0", "xx_0"], orders


def test_batch1_dense_streaming_big_weights_gets_threads():
    """A batch-1 dense layer with 4 MB of weights does 1 M multiply-adds, too few for threads by work, but it is
    bound by memory bandwidth, which a second core adds to (GoogLeNet's classifier: 1039 -> 588 us in the model on
    2 cores): it gets a parallel loop; a small one does not."""
    from tvm_interop.passes.kernels import cpu_schedule

    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    for (k, n), parallel in {(1024, 1000): True, (256, 100): False}.items():
        mod = _dense(1, k, n)
        (name, func), = [(nm, f) for nm, f in _prim_funcs(mod).items() if "matmul" in nm or "dense" in nm]
        cfg_threads = cpu_schedule._num_threads()
        text = schedule_cpu(func, target).script()
        assert ("T.parallel" in text) == (parallel and cfg_threads > 1), (k, n, cfg_threads)
        inputs = _inputs(mod)
        np.testing.assert_allclose(_run(apply_cpu_schedules(mod, TARGET), inputs), _run(mod, inputs),
                                   rtol=1e-4, atol=1e-4)


def test_blocked_pooling_vectorises_the_channel_lanes():
    """A pooling over ``NCHW[c]c`` activations reads whole channel vectors: the window is unrolled around one
    vector of lanes accumulated in registers, the padding stage is inlined (no pass over a padded copy) and the
    outer loops are parallel (GoogLeNet's 13 max pools: 1.27 -> 0.46 ms in the model, ONNX Runtime 0.78)."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    mod = _pool("max", (1, 4, 112, 112, 16), 3, 2, 1, layout="NCHW16c")
    (func,) = _prim_funcs(mod).values()
    text = schedule_cpu(func, target).script()
    assert '"tvm_interop.cpu_plan": "light_reduction"' in text
    assert "T.vectorized(T.int64(16))" in text and "pad_temp" not in text
    assert ("T.parallel" in text) == (__import__("tvm_interop.passes.kernels.cpu_schedule",
                                                 fromlist=["_num_threads"])._num_threads() > 1)
    inputs = _inputs(mod)
    np.testing.assert_allclose(_run(apply_cpu_schedules(mod, target), inputs, _runnable_here(target)),
                               _run(mod, inputs), rtol=1e-5, atol=1e-5)


def test_batch1_dense_reads_its_weight_in_column_panels():
    """A batch-1 dense over a big ``[K, N]`` weight repacks it into ``[N / t, K, t]`` panels (marked for the
    build-time prepack), so each column tile streams one contiguous panel instead of one strided line per K
    step; a small dense and a batched one keep the weight as it is."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    for (m, k, n), panels in {(1, 1024, 1000): True, (1, 256, 100): False, (8, 96, 40): False}.items():
        mod = _dense(m, k, n)
        (func,) = [f for nm, f in _prim_funcs(mod).items() if "matmul" in nm or "dense" in nm]
        text = schedule_cpu(func, target).script()
        assert ("meta_schedule.layout_rewrite_preproc" in text) == panels, (m, k, n)
        inputs = _inputs(mod)
        np.testing.assert_allclose(_run(apply_cpu_schedules(mod, target), inputs, _runnable_here(target)),
                                   _run(mod, inputs), rtol=1e-4, atol=1e-4)


def test_a_function_seen_before_gets_its_schedule_back_without_scheduling_again(monkeypatch):
    """schedule_cpu remembers its results by structure: an equal function built anew (another candidate of the
    same model) gets the same scheduled function; another target, parallel flag or function is scheduled anew."""
    from tvm_interop.passes.kernels import cpu_schedule

    def conv_func():
        (f,) = [f for n, f in _prim_funcs(_conv((1, 16, 14, 14), 32, 3, pad=1)).items() if "conv2d" in n]
        return f

    first, again = conv_func(), conv_func()
    assert first is not again
    scheduled = schedule_cpu(first, TARGET)
    calls = []
    monkeypatch.setattr(cpu_schedule, "_schedule_with_plans", lambda *a: calls.append(a) or a[0])
    assert schedule_cpu(again, TARGET) is scheduled and not calls
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    schedule_cpu(again, avx512)
    schedule_cpu(again, TARGET, parallel=False)
    assert len(calls) == 2
    other = [f for n, f in _prim_funcs(_conv((1, 16, 14, 14), 32, 1)).items() if "conv2d" in n][0]
    schedule_cpu(other, TARGET)
    assert len(calls) == 3


def test_conv_layer_benchmark_compares_before_it_times(tmp_path):
    """``scripts/bench_conv_layers.py`` builds a layer both ways, checks the scheduled output against TVM's default
    build, and writes the timed rows; an unknown layer name is refused with the known ones."""
    import json

    from scripts_under_test import load_script

    bench = load_script("bench_conv_layers")
    out = tmp_path / "layers.json"
    rows = bench.main(["--target", "llvm", "--layers", "sqz_1x1_384x13_48", "--repeat", "1", "--min-time", "0.001",
                       "--json", str(out)])
    (row,) = rows
    assert row["layer"] == "sqz_1x1_384x13_48" and row["max_abs_diff"] <= 1e-4
    assert row["scheduled_ms"] > 0 and row["default_ms"] > 0 and row["speedup"] > 0
    assert json.loads(out.read_text())["layers"][0]["flops"] == 2 * 48 * 384 * 13 * 13
    with pytest.raises(SystemExit):
        bench.main(["--layers", "no_such_layer"])


@pytest.mark.parametrize("mcpu", ["haswell", "skylake-avx512"])
def test_cropping_epilogue_on_a_ragged_tile_equals_unscheduled(mcpu):
    """A convolution computed over more channels than its output keeps (a ``strided_slice`` in its epilogue),
    tiled along a width that the tile does not divide: the write-back must keep both bounds tests. Inlining the
    crop into the write-back dropped the width's, and the tile's overhang overwrote the next row (RandWire at
    width 0.5, 112 px, on an AVX2 host: off by up to 55; the AVX-512 tile happened to be exact)."""
    def body(bb, x):
        y = bb.emit(relax.op.nn.conv2d(x, _const((40, 20, 3, 3)), strides=2, padding=1))
        y = bb.emit(relax.op.add(y, _const((1, 40, 1, 1))))
        return bb.emit(relax.op.strided_slice(y, axes=[1], begin=[0], end=[39]))

    mod = _graph([(1, 20, 56, 56)], body)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    smod = apply_cpu_schedules(mod, target)
    (func,) = [f for n, f in _prim_funcs(smod).items() if "conv2d" in n]
    if mcpu == "haswell":      # 8 lanes divide the 40 channels (16 do not: another plan on AVX-512)
        assert _plan_of(func) == "spatial_vector"
    run_on = _runnable_here(target)
    inputs = _inputs(mod)
    np.testing.assert_allclose(_run(smod, inputs, run_on), _run(mod, inputs, run_on), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mcpu", ["haswell", "skylake-avx512"])
def test_random_convolutions_with_epilogues_equal_unscheduled(mcpu):
    """Random convolution geometries (channels, width, kernel, stride, padding), each with a bias and either a
    relu or a channel crop, scheduled for 8- and 16-lane targets: every result equals the unscheduled build.
    Shapes a model's configuration happens to produce are what broke the plans before (see the crop test)."""
    rng = np.random.default_rng(11 if mcpu == "haswell" else 12)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    run_on = _runnable_here(target)
    for case in range(8):
        cin, cout = int(rng.integers(3, 33)), int(rng.choice([8, 16, 24, 40, 48, 17]))
        k, stride = int(rng.choice([1, 3])), int(rng.choice([1, 2]))
        size = int(rng.integers(7, 31))
        crop = bool(rng.integers(0, 2)) and cout > 8

        def body(bb, x, cin=cin, cout=cout, k=k, stride=stride, crop=crop):
            y = bb.emit(relax.op.nn.conv2d(x, _const((cout, cin, k, k)), strides=stride, padding=k // 2))
            y = bb.emit(relax.op.add(y, _const((1, cout, 1, 1))))
            if crop:
                return bb.emit(relax.op.strided_slice(y, axes=[1], begin=[0], end=[cout - 1]))
            return bb.emit(relax.op.nn.relu(y))

        mod = _graph([(1, cin, size, size)], body)
        inputs = _inputs(mod)
        got = _run(apply_cpu_schedules(mod, target), inputs, run_on)
        np.testing.assert_allclose(got, _run(mod, inputs, run_on), rtol=1e-4, atol=1e-4,
                                   err_msg=f"case {case}: cin {cin} cout {cout} k {k} stride {stride} "
                                           f"size {size} crop {crop}")


@pytest.mark.parametrize("mcpu", ["haswell", "skylake-avx512"])
def test_random_pools_and_depthwise_equal_unscheduled(mcpu):
    """Random pooling (max / avg, NCHW and channel-blocked with the target's lanes) and depthwise geometries,
    scheduled for 8- and 16-lane targets: every result equals the unscheduled build."""
    rng = np.random.default_rng(21 if mcpu == "haswell" else 22)
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu})
    lanes = vector_lanes(target)
    run_on = _runnable_here(target)
    for case in range(8):
        size, k = int(rng.integers(5, 30)), int(rng.choice([2, 3, 5]))
        stride, pad = int(rng.choice([1, 2])), int(rng.integers(0, k // 2 + 1))
        kind = ["max", "avg", "depthwise"][case % 3]
        blocked = kind != "depthwise" and bool(rng.integers(0, 2))
        c = int(rng.integers(1, 4)) if blocked else int(rng.integers(3, 40))
        if kind == "depthwise":
            mod = _conv((1, c, size, size), c, k, stride=stride, pad=pad, groups=c, bias=True)
        elif blocked:
            mod = _pool(kind, (1, c, size, size, lanes), k, stride, pad, layout=f"NCHW{lanes}c")
        else:
            mod = _pool(kind, (1, c, size, size), k, stride, pad)
        inputs = _inputs(mod)
        got = _run(apply_cpu_schedules(mod, target), inputs, run_on)
        np.testing.assert_allclose(got, _run(mod, inputs, run_on), rtol=1e-4, atol=1e-4,
                                   err_msg=f"case {case}: {kind} blocked {blocked} c {c} size {size} k {k} "
                                           f"stride {stride} pad {pad}")


def test_compute_bound_kernels_get_threads_from_64k_multiply_adds_per_thread(monkeypatch):
    """A 1x3 convolution of 786 K multiply-adds (Inception-v3's late convolutions are ~1 M) gets a parallel loop
    on two threads (it ran on one core under the old 1 M rule: sequential programs 1.03-1.11x slower, see
    ``_MIN_PARALLEL_MACS_PER_THREAD``), a 49 K one does not, and on 16 threads neither does the 786 K one (64 K per
    thread: a small kernel is not cut into slivers). Both compute what the unscheduled build computes."""
    from tvm_interop.passes.kernels import cpu_schedule

    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    mods = {"786K": _conv((1, 64, 8, 8), 64, (1, 3), pad=(0, 1), bias=True, relu=True),
            "49K": _conv((1, 16, 8, 8), 16, (1, 3), pad=(0, 1), bias=True, relu=True)}

    def parallel(case, threads):
        monkeypatch.setattr(cpu_schedule, "_num_threads", lambda: threads)
        (func,) = [f for n, f in _prim_funcs(mods[case]).items() if "conv2d" in n]
        return "T.parallel" in schedule_cpu(func, target).script()

    assert parallel("786K", 2) and not parallel("49K", 2)
    assert not parallel("786K", 16)
    monkeypatch.setattr(cpu_schedule, "_num_threads", lambda: 2)
    host = _runnable_here(target)
    for case, mod in mods.items():
        inputs = _inputs(mod)
        np.testing.assert_allclose(_run_shipped(apply_cpu_schedules(mod, host), inputs, host),
                                   _run(mod, inputs, host), rtol=1e-4, atol=1e-4, err_msg=case)


@pytest.mark.parametrize("case", ["relu", "bias add", "transpose"])
def test_ragged_rows_walked_contiguously_are_fused_into_whole_vectors(case):
    """NASNet-A-mobile's relu over 132 x 14 x 14 kept its rows of 14 (no whole 16-lane vector) and ran 23 us
    alone, 1.8 us with the trailing loops fused into one contiguous loop of whole vectors (RandWire 1.26-1.27x,
    NASNet-A-mobile 1.19-1.23x end to end). A bias over channels is read at one point per plane, so the planes
    fuse (rows of 196, which LLVM vectorises with a remainder) but not the channels; a transpose walks its input
    across rows, and keeps its loops. Each computes what the unscheduled build computes."""
    import re

    shape = (1, 132, 14, 14)
    mod = {"relu": lambda: _graph([shape], lambda bb, x: bb.emit(relax.op.nn.relu(x))),
           "bias add": lambda: _graph([shape], lambda bb, x: bb.emit(relax.op.add(x, _const((1, 132, 1, 1))))),
           "transpose": lambda: _graph([shape], lambda bb, x: bb.emit(relax.op.permute_dims(x, [0, 1, 3, 2]))),
           }[case]()
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    (func,) = _prim_funcs(mod).values()
    text = schedule_cpu(func, target).script()
    lanes = [int(n) for n in re.findall(r"T\.vectorized\(T\.int64\((\d+)\)\)", text)]
    if case == "transpose":
        assert "fused" not in text and not lanes, text
    elif case == "bias add":
        assert re.search(r"ax2_ax3_fused in .*T\.int64\(196\)", text), text
    else:
        assert lanes and all(n % 16 == 0 for n in lanes), text
    host = _runnable_here(target)
    inputs = _inputs(mod)
    np.testing.assert_allclose(_run_shipped(apply_cpu_schedules(mod, host), inputs, host), _run(mod, inputs, host),
                               rtol=1e-5, atol=1e-5)
