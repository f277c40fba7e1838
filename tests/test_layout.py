"""Channel-blocked activations on CPU (``passes.layout``, ``passes.kernels.nchwc``): same numbers as TVM's build."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tvm
from tvm import relax, te, topi

import tvm_interop
from tvm_interop.models import get_model, small_config
from tvm_interop.passes.kernels.cpu_schedule import schedule_cpu, vector_lanes
from tvm_interop.passes.kernels.nchwc import conv2d_nchwc
from tvm_interop.passes.layout import (blocked_convs, channel_block, resolve_layout, to_nchwc)
from tvm_interop.passes.target import normalize_target
from tvm_interop.runtime.errors import InteropError
from zoo_cases import zoo_case, zoo_params

TOL = dict(rtol=1e-4, atol=1e-4)
HOST = normalize_target("llvm")


def _input(mod, seed=0):
    shape = [int(v) for v in mod["main"].params[0].ty.shape]
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


@pytest.mark.parametrize("name", zoo_params())
def test_zoo_blocked_equals_plain_tvm(name):
    """Every zoo model (small config) with 4-channel blocks (so the narrow configs block most convolutions; the
    kernel is the same at any block) computes what a plain TVM build of the NCHW model computes, on a
    concurrent schedule."""
    mod, x, ref = zoo_case(name)
    cm = tvm_interop.compile(mod, target="llvm", scheduler="greedy", guard=False, layout="nchw4c")
    assert cm.layout["layout"] == "nchwc" and cm.layout["block"] == 4
    assert cm.plan.meta["layout"] == cm.layout
    np.testing.assert_allclose(cm.run(x), ref, **TOL)


def test_blocked_convs_per_model():
    """Which convolutions get blocked: channels that divide the block, ungrouped (depthwise stays NCHW)."""
    got = {n: to_nchwc(get_model(n, **small_config(n)), 4) for n in ("resnet50", "nasnet_a_mobile")}
    assert blocked_convs(got["resnet50"]) == (17, 17)   # the stem too: it reads NCHW (3 channels), writes blocks
    blocked, total = blocked_convs(got["nasnet_a_mobile"])
    assert 0 < blocked < total
    grouped_blocked = []

    def visit(e):
        if (isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.nn.conv2d"
                and int(e.attrs.groups) > 1 and str(e.attrs.out_layout) != "NCHW"):
            grouped_blocked.append(e)

    relax.analysis.post_order_visit(got["nasnet_a_mobile"]["main"].body, visit)
    assert not grouped_blocked                  # depthwise / grouped convolutions stay NCHW


def test_default_layout_on_cpu_is_blocked_and_matches():
    """``layout="auto"`` (the default) blocks by the CPU's vector width; ``nchw`` keeps TVM's layout; both compute
    the same numbers as TVM."""
    mod, x, ref = zoo_case("resnet50")   # plain TVM's output, built once per session for every file that asks
    auto = tvm_interop.compile(mod, target="llvm", scheduler="sequential", guard=False)
    plain = tvm_interop.compile(mod, target="llvm", scheduler="sequential", guard=False, layout="nchw")
    assert auto.layout["layout"] == "nchwc" and auto.layout["block"] == channel_block(HOST)
    assert plain.layout == {"layout": "nchw"}
    assert not any("NCHWc" in u.func_name for u in plain.program.calls.values())
    np.testing.assert_allclose(auto.run(x), ref, **TOL)
    np.testing.assert_allclose(plain.run(x), ref, **TOL)


@pytest.mark.parametrize("shape", [
    # (C, H, W, O, k, stride, pad, dilation)
    (32, 14, 14, 32, 3, 1, 1, 1),
    (16, 15, 13, 48, 3, 2, 1, 1),
    (32, 9, 9, 16, 1, 1, 0, 1),
    (16, 12, 12, 32, (1, 7), 1, (0, 3), 1),
    (16, 11, 11, 16, 3, 1, 2, 2),
    (64, 7, 7, 160, 1, 1, 0, 1),
    (32, 40, 40, 32, 3, 1, 1, 1),   # padding big enough to run on the conv's threads
    (16, 19, 19, 32, 3, 1, 0, 1),   # ragged widths (17, 19 columns: computed over 18 / 20, cropped) ...
    (32, 17, 17, 32, (1, 7), 1, (0, 3), 1),   # ... with padding
    (16, 39, 39, 16, 3, 2, 0, 1),   # ... with a stride
])
def test_nchwc_kernel_scheduled_equals_topi(shape):
    """The blocked convolution, scheduled by its plan with a block of the host's vector width, equals TOPI's
    NCHW convolution on random shapes (strides, asymmetric kernels, padding, dilation, ragged widths)."""
    c, h, w, o, k, s, p, d = shape
    kh, kw = (k, k) if isinstance(k, int) else k
    ph, pw = (p, p) if isinstance(p, int) else p
    lanes = vector_lanes(HOST)
    blk = lanes if c % lanes == 0 and o % lanes == 0 else 4
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, c, h, w)).astype("float32")
    wt = rng.standard_normal((o, c, kh, kw)).astype("float32")
    xb = x.reshape(1, c // blk, blk, h, w).transpose(0, 1, 3, 4, 2)
    wb = wt.reshape(o // blk, blk, c // blk, blk, kh, kw).transpose(0, 2, 4, 5, 3, 1)
    data = te.placeholder(xb.shape, name="data")
    weight = te.placeholder(wb.shape, name="weight")
    out = conv2d_nchwc(data, weight, (s, s), (ph, pw, ph, pw), (d, d))
    func = te.create_prim_func([data, weight, out])
    sched = schedule_cpu(func, HOST)
    if blk % lanes == 0:
        assert str(sched.attrs["tvm_interop.cpu_plan"]) == "nchwc_conv"
    lib = tvm.compile(tvm.IRModule({"main": sched.with_attr("global_symbol", "main")}), target=HOST)
    res = tvm.runtime.tensor(np.zeros([int(v) for v in out.shape], "float32"))
    lib["main"](tvm.runtime.tensor(xb), tvm.runtime.tensor(wb), res)
    got = res.numpy().transpose(0, 1, 4, 2, 3).reshape(1, o, *res.shape[2:4])
    ref = topi.nn.conv2d_nchw
    xd, wd = te.placeholder(x.shape, name="x"), te.placeholder(wt.shape, name="w")
    rf = te.create_prim_func([xd, wd, ref(xd, wd, (s, s), (ph, pw, ph, pw), (d, d))])
    rlib = tvm.compile(tvm.IRModule({"main": rf.with_attr("global_symbol", "main")}), target=HOST)
    want = tvm.runtime.tensor(np.zeros(got.shape, "float32"))
    rlib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(wt), want)
    np.testing.assert_allclose(got, want.numpy(), **TOL)


def test_padding_of_a_parallel_convolution_runs_on_its_threads():
    """A blocked convolution whose nest runs on the thread pool copies its padded input on the same threads (the
    threads are awake anyway); a convolution too small for threads keeps a serial padding copy."""
    from tvm_interop.runtime.cpu_threads import kernel_threads

    def pad_loops(c, hw):
        data = te.placeholder((1, c // 16, hw, hw, 16), name="data")
        weight = te.placeholder((c // 16, c // 16, 3, 3, 16, 16), name="weight")
        func = te.create_prim_func([data, weight, conv2d_nchwc(data, weight, (1, 1), (1, 1, 1, 1), (1, 1))])
        text = schedule_cpu(func, HOST).script()
        return text.split('T.sblock("pad')[0].split("\n")[-6:]

    big, small = pad_loops(64, 56), pad_loops(16, 6)
    if kernel_threads() > 1:
        assert any("T.parallel" in line for line in big), big
    assert not any("T.parallel" in line for line in small), small


def test_ragged_width_is_computed_in_whole_tiles_and_cropped():
    """A width without a divisor in the tile range is computed over the next width that has one: no register tile
    of the reduction carries a bounds test; the write-back alone tests the columns."""
    from tvm_interop.passes.kernels.nchwc import MAX_TILE, MIN_TILE, tileable_width

    assert [tileable_width(w) for w in (7, 13, 14, 16, 17, 35, 71, 73, 147, 149)] == \
        [7, 13, 14, 16, 18, 35, 72, 75, 147, 150]
    for w in range(MAX_TILE + 1, 300):
        full = tileable_width(w)
        assert (full - w) / w <= 0.06 and any(full % t == 0 for t in range(MIN_TILE, MAX_TILE + 1)), w
    data = te.placeholder((1, 5, 73, 73, 16), name="data")
    weight = te.placeholder((12, 5, 3, 3, 16, 16), name="weight")
    out = conv2d_nchwc(data, weight, (1, 1), (0, 0, 0, 0), (1, 1))
    assert [int(v) for v in out.shape] == [1, 12, 71, 71, 16]
    text = schedule_cpu(te.create_prim_func([data, weight, out]), HOST).script()
    update = text.split('T.sblock("conv2d_NCHWc_update")')[1].split("T.sblock(")[0]
    assert "T.where" not in update
    assert "T.where" in text.split('T.sblock("conv2d_NCHWc_update")')[1]     # the write-back's


def test_layout_choices_and_refusals():
    assert resolve_layout("auto", HOST) == "nchwc"
    assert resolve_layout("nchw", HOST) == "nchw"
    assert resolve_layout("auto", normalize_target("cuda")) == "nchw"
    assert resolve_layout("auto", None) == "nchw"
    with pytest.raises(ValueError, match="CPU"):
        resolve_layout("nchwc", normalize_target("cuda"))
    with pytest.raises(InteropError, match="unknown layout .nhwc.; choose one of auto, nchw, nchwc"):
        tvm_interop.compile("squeezenet", target="llvm", layout="nhwc", **small_config("squeezenet"))
    with pytest.raises(InteropError, match="CPU"):
        tvm_interop.compile("squeezenet", target="cuda", layout="nchwc", **small_config("squeezenet"))
    with pytest.raises(InteropError, match="block"):
        tvm_interop.compile("squeezenet", target="llvm", layout="nchw0c", **small_config("squeezenet"))


def test_exported_blocked_model_loads_and_matches(tmp_path):
    """The deployable library of a blocked model runs with the same numbers after a reload."""
    mod = get_model("resnet50", **small_config("resnet50"))
    x = _input(mod)
    cm = tvm_interop.compile(mod, target="llvm", scheduler="sequential", guard=False, layout="nchw4c")
    path = str(tmp_path / "r.so")
    cm.export(path)
    loaded = tvm_interop.load(path)
    np.testing.assert_allclose(loaded.run(x), cm.run(x), rtol=1e-6, atol=1e-6)
    assert loaded.plan.meta["layout"]["layout"] == "nchwc"


def test_cli_compile_reports_layout(capsys):
    from tvm_interop.cli import main

    assert main(["compile", "resnet50", "--width", "0.125", "--image-size", "32", "--scheduler", "sequential",
                 "--layout", "nchw8c", "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["layout"]["layout"] == "nchwc" and summary["layout"]["block"] == 8
    assert summary["layout"]["blocked_convs"] >= 1


@pytest.mark.parametrize("seeds,min_blocked", [pytest.param(range(3), 2, id="seeds0-2"),
                                               pytest.param(range(3, 6), 1, id="seeds3-5", marks=pytest.mark.ci)])
def test_fuzz_models_blocked_equal_plain_tvm(seeds, min_blocked):
    """Random multi-branch CNNs and Inception/NASNet-like cells (6 seeds each; the development suite runs the first
    three, CI all), blocked by 2 or 4 channels (their widths are 2-16, so some convolutions block): each equals plain
    TVM, or, where TVM's ConvertLayout itself fails (a channel split it mis-infers), an explicit layout is refused by
    name and ``auto`` falls back to NCHW."""
    from tvm_interop.fuzz import random_cell_model, random_input, random_model
    from tvm_interop.runtime.errors import UnsupportedModelError

    blocked, refused = 0, []
    for seed in seeds:
        for make in (random_model, random_cell_model):
            mod, desc = make(seed)
            x = random_input(mod, seed)
            ref = tvm_interop.run_reference(mod, [x])
            layout = f"nchw{2 + 2 * (seed % 2)}c"
            try:
                cm = tvm_interop.compile(mod, target="llvm", scheduler="greedy", guard=False, layout=layout)
            except UnsupportedModelError as e:
                assert "ConvertLayout" in str(e) and "layout='nchw'" in str(e), str(e)
                refused.append(desc)
                auto = tvm_interop.compile(mod, target="llvm", scheduler="greedy", guard=False)
                assert auto.layout["layout"] == "nchw" and auto.layout["fallback"]
                cm = auto
            else:
                blocked += cm.layout["blocked_convs"] > 0
            out, want = cm.run(x), ref
            for o, r in zip(out if isinstance(out, list) else [out], want if isinstance(want, list) else [want]):
                np.testing.assert_allclose(o, r, **TOL, err_msg=f"{layout} {desc}")
    # the cell models of seeds 0, 1, 2 and 4 block a convolution, the random models of seeds 0-5 none (measured)
    assert blocked >= min_blocked, (blocked, refused)


@pytest.mark.parametrize("shape", [(3, 23, 23, 32, 3, 2, 0), (3, 20, 20, 16, 7, 2, 3), (3, 39, 39, 16, 3, 2, 0)])
def test_stem_kernel_reads_nchw_writes_blocks(shape):
    """The stem's convolution (3 input channels: read as NCHW, written as NCHW[c]c), scheduled by the blocked
    plan, equals TOPI's NCHW convolution."""
    from tvm_interop.passes.kernels.nchwc import conv2d_nchw_to_nchwc

    c, h, w, o, k, s, p = shape
    blk = vector_lanes(HOST) if o % vector_lanes(HOST) == 0 else 4
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, c, h, w)).astype("float32")
    wt = rng.standard_normal((o, c, k, k)).astype("float32")
    wb = np.ascontiguousarray(wt.reshape(o // blk, blk, c, k, k).transpose(0, 2, 3, 4, 1))
    data, weight = te.placeholder(x.shape, name="data"), te.placeholder(wb.shape, name="weight")
    out = conv2d_nchw_to_nchwc(data, weight, (s, s), (p, p, p, p), (1, 1))
    sched = schedule_cpu(te.create_prim_func([data, weight, out]), HOST)
    if blk % vector_lanes(HOST) == 0:
        assert str(sched.attrs["tvm_interop.cpu_plan"]) == "nchwc_conv"
    lib = tvm.compile(tvm.IRModule({"main": sched.with_attr("global_symbol", "main")}), target=HOST)
    res = tvm.runtime.tensor(np.zeros([int(v) for v in out.shape], "float32"))
    lib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(wb), res)
    got = res.numpy().transpose(0, 1, 4, 2, 3).reshape(1, o, *res.shape[2:4])
    xd, wd = te.placeholder(x.shape, name="x"), te.placeholder(wt.shape, name="w")
    rf = te.create_prim_func([xd, wd, topi.nn.conv2d_nchw(xd, wd, (s, s), (p, p, p, p), (1, 1))])
    rlib = tvm.compile(tvm.IRModule({"main": rf.with_attr("global_symbol", "main")}), target=HOST)
    want = tvm.runtime.tensor(np.zeros(got.shape, "float32"))
    rlib["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(wt), want)
    np.testing.assert_allclose(got, want.numpy(), **TOL)


def test_classifier_with_unblockable_channels_is_padded():
    """SqueezeNet's 1000-class convolution (1000 = 62.5 x 16) gets 8 zero filters so that it blocks too, then a
    slice after its relu and pooling: the same output as plain TVM."""
    from tvm_interop.passes.layout_rewrites import pad_channels

    mod = get_model("squeezenet", **small_config("squeezenet"))
    _, padded = pad_channels(mod, 16)
    assert padded == 3   # the classifier, and the narrow config's two 3x3 expand convolutions of 24 channels
    x = _input(mod)
    cm = tvm_interop.compile(mod, target="llvm", scheduler="sequential", guard=False, layout="nchw16c")
    assert cm.layout["blocked_convs"] >= 1   # the classifier (the narrow config's others have 8-channel widths)
    np.testing.assert_allclose(cm.run(x), tvm_interop.run_reference(mod, [x]), **TOL)


def test_spatial_convolution_with_ragged_channels_is_padded_even_unblocked():
    """RandWire's second stem convolution (20 -> 39 channels, 3x3, stride 2 at width 0.5) blocks neither its input
    nor its output, and as it was no schedule vectorised it (the plain ``simple`` plan: 1.8 ms of a 3.9 ms model).
    Padded to 48 zero filters and sliced, the kernel the build compiles vectorises over output channels, and the
    model computes what plain TVM computes. A 1x1 convolution with an unblockable input is left alone (NCHW
    vectorises it well)."""
    from tvm_interop.passes.layout_rewrites import pad_channels

    rng = np.random.default_rng(5)

    def model(k: int):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((1, 20, 24, 24), "float32"))
        w = lambda *s: relax.const((rng.standard_normal(s) * 0.2).astype("float32"))  # noqa: E731
        with bb.function("main", [x]):
            with bb.dataflow():
                a = bb.emit(relax.op.nn.conv2d(x, w(39, 20, k, k), strides=2, padding=k // 2))
                a = bb.emit(relax.op.nn.relu(relax.op.add(a, w(1, 39, 1, 1))))
                gv = bb.emit_output(a)
            bb.emit_func_output(gv)
        return bb.get()

    mod = model(3)
    assert pad_channels(mod, 16)[1] == 1
    assert pad_channels(model(1), 16)[1] == 0
    cm = tvm_interop.compile(mod, target="llvm", scheduler="sequential", guard=False, layout="nchw16c")
    convs = [f for gv, f in cm.program.mod.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint]
    assert convs and all(str(f.attrs["tvm_interop.cpu_plan"]) == "spatial_vector" for f in convs), \
        [(f.attrs or {}).get("tvm_interop.cpu_plan") for f in convs]
    x = _input(mod)
    np.testing.assert_allclose(cm.run(x), tvm_interop.run_reference(mod, [x]), **TOL)


def test_channels_between_two_convolutions_are_padded_to_block_both():
    """A 24-channel tensor between two convolutions (GoogLeNet's 5x5 reduce, 24 = 1.5 x 16): the first gets zero
    filters, its bias and relu pad alike, the second zero weights on the extra inputs; both block, no slice, the
    same numbers as plain TVM. A tensor with another consumer is left alone."""
    from tvm_interop.passes.layout_rewrites import pad_channel_pairs

    rng = np.random.default_rng(3)

    def model(extra_use: bool):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((1, 16, 10, 10), "float32"))
        w = lambda *s: relax.const((rng.standard_normal(s) * 0.2).astype("float32"))  # noqa: E731
        with bb.function("main", [x]):
            with bb.dataflow():
                a = bb.emit(relax.op.nn.conv2d(x, w(24, 16, 1, 1)))
                a = bb.emit(relax.op.nn.relu(relax.op.add(a, w(1, 24, 1, 1))))
                b = bb.emit(relax.op.nn.conv2d(a, w(32, 24, 5, 5), padding=2))
                out = bb.emit(relax.op.concat([b, a], axis=1) if extra_use else relax.op.nn.relu(b))
                gv = bb.emit_output(out)
            bb.emit_func_output(gv)
        return bb.get()

    mod = model(False)
    padded_mod, pairs = pad_channel_pairs(mod, 16)
    assert pairs == 1
    assert blocked_convs(to_nchwc(mod, 16)) == (2, 2)
    x = _input(mod)
    cm = tvm_interop.compile(mod, target="llvm", scheduler="sequential", guard=False, layout="nchw16c")
    assert cm.layout["blocked_convs"] == 2
    np.testing.assert_allclose(cm.run(x), tvm_interop.run_reference(mod, [x]), **TOL)
    assert pad_channel_pairs(model(True), 16)[1] == 0


def test_cli_schedule_searches_the_graph_of_the_build_it_is_for(tmp_path, capsys):
    """``tvm-interop schedule`` under a GPU cost (the default sim:h100) searches the NCHW graph a CUDA build
    prepares; under sim:cpu the blocked graph a CPU build prepares: each schedule validates against its build."""
    from tvm_interop.api import load_module, prepare_program
    from tvm_interop.cli import main
    from tvm_interop.cli.schedule_cmd import graph_layout_for_cost
    from tvm_interop.passes.schedule import Schedule

    assert [graph_layout_for_cost(c) for c in ("sim:h100", "table:t.json", "sim:cpu", "measured", "unit")] == \
        ["nchw", "nchw", "auto", "auto", "auto"]
    kw = dict(width=0.25, image_size=32)
    mod, name = load_module("resnet50", **kw)
    builds = {"sim:h100": prepare_program(mod, "cuda", name=name).graph,   # NCHW
              "sim:cpu": prepare_program(mod, "llvm", name=name).graph}    # blocked by this CPU's width
    assert len(builds["sim:h100"]) != len(builds["sim:cpu"])              # (layout transforms are units)
    for cost, graph in builds.items():
        out = tmp_path / f"{cost.replace(':', '_')}.json"
        args = ["schedule", "resnet50", "--width", "0.25", "--image-size", "32", "--scheduler", "greedy",
                "--cost", cost, "-o", str(out), "--quiet"]
        assert main(args) == 0
        capsys.readouterr()
        Schedule.load(str(out)).validate(graph)


def test_cli_schedule_target_picks_the_builds_graph_and_default_cost(tmp_path, capsys):
    """``schedule --target cuda`` searches the graph a CUDA build prepares under sim:h100, ``--target llvm`` the CPU
    build's under sim:cpu, each schedule validating against its build; a cost model of the other kind of device,
    or a CPU-timed cost for a CUDA build, is refused naming both."""
    from tvm_interop.api import load_module, prepare_program
    from tvm_interop.cli import main
    from tvm_interop.passes.schedule import Schedule

    mod, name = load_module("resnet50", width=0.25, image_size=32)
    base = ["schedule", "resnet50", "--width", "0.25", "--image-size", "32", "--scheduler", "greedy", "--json"]
    for target, cost, prep in (("cuda", "sim:h100", "cuda"), ("llvm", "sim:cpu", "llvm")):
        out = tmp_path / f"{target}.json"
        assert main([*base, "--target", target, "-o", str(out)]) == 0
        assert json.loads(capsys.readouterr().out)["cost"] == cost
        Schedule.load(str(out)).validate(prepare_program(mod, prep, name=name).graph)
    for target, cost, words in (("llvm", "sim:h100", "prices a GPU, but --target llvm builds for a CPU"),
                                ("cuda", "sim:cpu", "prices a CPU, but --target cuda builds for a GPU"),
                                ("cuda", "measured", "times stages on this CPU"),
                                ("vulkan", "unit", "a cuda or an llvm build")):
        assert main([*base, "--target", target, "--cost", cost]) == 1
        assert words in capsys.readouterr().err


def test_cli_schedule_layout_option_overrides_the_cost_default(tmp_path, capsys):
    """``schedule --layout nchw`` under a CPU cost searches the NCHW graph (what ``compile --layout nchw`` builds);
    a bad layout is refused by argparse with the choices named; ``tune`` takes the same option."""
    from tvm_interop.api import load_module, prepare_program
    from tvm_interop.cli import main
    from tvm_interop.passes.schedule import Schedule

    mod, name = load_module("resnet50", width=0.25, image_size=32)
    nchw = prepare_program(mod, "llvm", name=name, layout="nchw").graph
    out = tmp_path / "s.json"
    assert main(["schedule", "resnet50", "--width", "0.25", "--image-size", "32", "--scheduler", "greedy",
                 "--cost", "sim:cpu", "--layout", "nchw", "-o", str(out), "--quiet"]) == 0
    capsys.readouterr()
    Schedule.load(str(out)).validate(nchw)
    for cmd in (["schedule", "resnet50"], ["tune", "resnet50", "--db", str(tmp_path / "db")]):
        with pytest.raises(SystemExit):
            main(cmd + ["--layout", "nhwc"])
        assert "nchw" in capsys.readouterr().err


def test_register_tiles_prefer_more_accumulators_over_fewer_loads():
    """The blocked convolution's register tile: 2x7 / 2x9 over 4x3 (measured faster on AVX-512, see
    cpu_schedule._nchwc_tile), exact tiles where the width has a divisor, and within the accumulator budget."""
    from tvm_interop.passes.kernels.cpu_schedule import _nchwc_tile

    assert _nchwc_tile(4, 147, 20) == (2, 7)
    assert _nchwc_tile(8, 27, 20) == (2, 9)
    assert _nchwc_tile(16, 14, 20) == (2, 7)
    assert _nchwc_tile(4, 56, 20) == (4, 4)
    for co, ow, acc in [(12, 18, 20), (24, 8, 20), (12, 17, 26), (6, 35, 20), (32, 7, 26)]:
        co_t, ow_t = _nchwc_tile(co, ow, acc)
        assert co % co_t == 0 and co_t * ow_t <= acc, (co, ow, acc)
