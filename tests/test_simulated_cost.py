"""The simulated device (passes.cost.simulated): registry, presets, and the properties schedulers rely on."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tvm_interop.passes.cost import get_cost_model
from tvm_interop.passes.cost.conv_geometry import padded_on_both_axes
from tvm_interop.passes.cost.simulated import PRESETS, DeviceSpec, SimulatedDevice
from tvm_interop.passes.graph import TensorInfo, Unit
from tvm_interop.passes.synthetic import inception_like, random_dag
from tvm_interop.runtime.errors import InteropError

TOL = 1e-12


def conv(name: str, cout: int, hw: int, cin: int = 64, k: int = 3, batch: int = 1, data: str = "x") -> Unit:
    out = TensorInfo((batch, cout, hw, hw))
    inp = TensorInfo((batch, cin, hw, hw))
    w = TensorInfo((cout, cin, k, k))
    return Unit(name, "conv2d", [inp, w], [out], flops=2.0 * out.numel * cin * k * k,
                bytes_moved=float(inp.nbytes + w.nbytes + out.nbytes),
                attrs={"data": data, "groups": 1, "weight_shape": [cout, cin, k, k]})


def eltwise(name: str, shape: tuple[int, ...]) -> Unit:
    t = TensorInfo(shape)
    return Unit(name, "add", [t, t], [t], flops=0.0, bytes_moved=3.0 * t.nbytes)


def random_unit(rng: random.Random, name: str) -> Unit:
    if rng.random() < 0.3:
        return eltwise(name, (rng.choice((1, 8, 32)), rng.choice((16, 64, 256)), 14, 14))
    return conv(name, rng.choice((16, 64, 256, 512)), rng.choice((7, 14, 28, 56)), cin=rng.choice((16, 64, 256)),
                k=rng.choice((1, 3)), batch=rng.choice((1, 4, 32)))


@pytest.fixture(params=sorted(PRESETS))
def device(request) -> SimulatedDevice:
    return get_cost_model(f"sim:{request.param}")


# ------------------------------------------------------------------------------------------------ registry
def test_registry_and_fingerprint():
    for name in PRESETS:
        dev = get_cost_model(f"sim:{name}")
        assert isinstance(dev, SimulatedDevice)
        assert dev.device_fingerprint == f"sim:{name}" == dev.name
    assert get_cost_model("sim").device_fingerprint == "sim:h100"  # default preset
    custom = get_cost_model("sim:h100", launch=1e-6)
    assert custom.spec.launch == 1e-6 and custom.device_fingerprint != "sim:h100"
    spec = DeviceSpec("toy", 4, 128, 1e12, 1e11, 1e-6, 2e-6, 1e-6)
    assert SimulatedDevice(spec=spec).device_fingerprint == "sim:toy"


@pytest.mark.parametrize("bad", [lambda: get_cost_model("sim:tpu"),
                                 lambda: get_cost_model("sim:h100", warp_size=32),
                                 lambda: SimulatedDevice("h100", bandwidth=0),
                                 lambda: SimulatedDevice("h100", launch=-1.0),
                                 lambda: SimulatedDevice("h100", reduction_step=-1e-9),
                                 lambda: SimulatedDevice("h100", contention="psychic")])
def test_bad_specs_are_clear_errors(bad):
    with pytest.raises(InteropError):
        bad()


# ------------------------------------------------------------------------------------------------ one kernel
def test_unit_latency_formula(device):
    sp = device.spec
    u = conv("c", 256, 28, batch=32)
    d, f, m = device.kernel(u.flops, u.bytes_moved, u.outputs[0].numel)
    assert f == pytest.approx(min(1.0, u.outputs[0].numel / (sp.compute_units * sp.lanes_per_unit)))
    g = min(1.0, f / sp.bw_fill)
    assert d == pytest.approx(max(u.flops / (sp.peak_flops * f), u.bytes_moved / (sp.bandwidth * g)))
    assert device.unit_latency(u) == pytest.approx(sp.launch + d)


def test_zero_flops_is_memory_bound(device):
    u = eltwise("e", (32, 256, 56, 56))
    sp = device.spec
    f = min(1.0, u.outputs[0].numel / sp.capacity)
    expected = sp.launch + u.bytes_moved / (sp.bandwidth * min(1.0, f / sp.bw_fill))
    assert device.unit_latency(u) == pytest.approx(expected)
    bigger = eltwise("e2", (32, 512, 56, 56))
    assert device.unit_latency(bigger) > device.unit_latency(u)


def test_bytes_default_from_tensor_sizes():
    dev = get_cost_model("sim:h100")
    u = eltwise("e", (1, 64, 14, 14))
    v = Unit("v", "add", u.inputs, u.outputs, flops=0.0, bytes_moved=0.0)
    assert dev.unit_latency(v) == pytest.approx(dev.unit_latency(u))


def test_monotone_in_flops(device):
    rng = random.Random(1)
    for i in range(60):
        u = random_unit(rng, f"u{i}")
        heavier = Unit(u.name + "h", u.kind, u.inputs, u.outputs, flops=u.flops * rng.uniform(1.0, 8.0) + 1.0,
                       bytes_moved=u.bytes_moved, attrs=u.attrs)
        assert device.unit_latency(heavier) >= device.unit_latency(u) - TOL
        others = [[random_unit(rng, f"o{i}_{j}{k}") for k in range(rng.randint(1, 3))] for j in range(rng.randint(1, 4))]
        assert device.stage_latency(others + [[heavier]]) >= device.stage_latency(others + [[u]]) - TOL


def test_cache_follows_mutation():
    dev = get_cost_model("sim:v100")
    u = conv("c", 64, 14)
    before = dev.unit_latency(u)
    u.flops *= 100
    assert dev.unit_latency(u) > before


# ------------------------------------------------------------------------------------------------ stages
@pytest.mark.parametrize("contention", ["aggregate", "fluid"])
def test_stage_never_faster_than_slowest_group(device, contention):
    device = SimulatedDevice(spec=replace(device.spec, contention=contention))
    rng = random.Random(2)
    for t in range(80):
        groups = [[random_unit(rng, f"g{t}_{j}_{k}") for k in range(rng.randint(1, 3))]
                  for j in range(rng.randint(1, 5))]
        alone = max(sum(device.unit_latency(u) for u in g) for g in groups)
        stage = device.stage_latency(groups)
        assert stage >= alone - TOL
        # nor faster than all its work at full device throughput (compute and memory)
        areas = [device.unit_bound_terms(u) for g in groups for u in g]
        assert stage >= device.spec.launch + sum(a[0] for a in areas) - TOL
        assert stage >= device.spec.launch + sum(a[1] for a in areas) - TOL
        # and the lower bound the searches prune with is valid
        if len(groups) >= 2:
            lead, sync, per = device.concurrent_bound_params()
            bound = max(alone, lead + max(sum(a[0] for a in areas), sum(a[1] for a in areas))) + sync \
                + (len(groups) - 1) * per
            assert stage >= bound - TOL


def test_single_group_is_the_sum(device):
    us = [conv(f"c{i}", 64, 14) for i in range(3)]
    assert device.stage_latency([us]) == pytest.approx(sum(device.unit_latency(u) for u in us))
    assert device.stage_latency([]) == 0.0


def test_full_device_kernels_gain_nothing(device):
    # each kernel alone fills every compute unit: running them together cannot beat running them in turn
    big = [conv(f"big{i}", 512, 56, cin=256, batch=64) for i in range(3)]
    for u in big:
        assert device.kernel(u.flops, u.bytes_moved, u.outputs[0].numel)[1] == 1.0
    for k in (2, 3):
        seq = sum(device.unit_latency(u) for u in big[:k])
        assert device.stage_latency([[u] for u in big[:k]]) >= seq - 1e-9


def test_small_kernels_gain():
    for name in ("h100", "h200", "v100"):
        dev = get_cost_model(f"sim:{name}")
        small = [conv(f"s{i}", 64, 14, cin=64) for i in range(4)]
        seq = sum(dev.unit_latency(u) for u in small)
        conc = dev.stage_latency([[u] for u in small])
        assert conc < 0.6 * seq
        assert conc >= max(dev.unit_latency(u) for u in small)


def test_batch_reduces_the_gain():
    dev = get_cost_model("sim:h100")
    ratios = []
    for batch in (1, 32):
        g = inception_like(1, batch=batch)
        heads = [g.unit(n) for n in ("b0_1x1", "b0_3x3_reduce", "b0_dbl_reduce", "b0_pool")]
        ratios.append(dev.stage_latency([[u] for u in heads]) / sum(dev.unit_latency(u) for u in heads))
    assert ratios[0] < 0.7 and ratios[1] > 0.9


def test_merge_is_one_larger_kernel(device):
    us = [conv(f"m{i}", 64, 14, cin=128, k=1) for i in range(3)]
    sp = device.spec
    merged = device.stage_latency([[u] for u in us], "merge")
    flops = sum(u.flops for u in us)
    nbytes = sum(u.bytes_moved for u in us) - 2 * us[0].inputs[0].nbytes
    d, _, _ = device.kernel(flops, nbytes, sum(u.outputs[0].numel for u in us), device.reduction_floor(us[0]))
    assert merged == pytest.approx(sp.launch + d)
    assert merged < sum(device.unit_latency(u) for u in us)
    assert device.stage_latency([[us[0]]], "merge") == pytest.approx(device.unit_latency(us[0]))


def _padded(unit: Unit, pad: list[int]) -> Unit:
    return replace(unit, attrs={**unit.attrs, "conv": {"padding": pad, "groups": 1}})


def test_tvm_presets_time_a_convolution_by_its_serial_reduction():
    """TVM's default CUDA convolution loops over each output's reduction window one step at a time: under the
    ``-tvm`` presets a convolution with fewer outputs than the device has lanes takes ``steps x reduction_step``
    (plus ``boundary_step`` per step when its window is padded along both axes), whatever its FLOPs, as ResNet-50's
    3x3 convolutions of 128 / 256 / 512 channels did on the H100 (104 / 201 / 385-415 us, equal FLOPs); a convolution
    that fills the device is priced by the roofline as before; the datasheet presets have no such floor."""
    tvm, datasheet = get_cost_model("sim:h100-tvm"), get_cost_model("sim:h100")
    sp = tvm.spec
    assert sp.reduction_step > 0 and sp.boundary_step > 0 and datasheet.spec.reduction_step == 0
    # equal FLOPs, the reduction doubling as the outputs halve: the time follows the reduction
    narrow = [_padded(conv(f"c{c}", c, hw, cin=c, k=3), [1, 1, 1, 1]) for c, hw in ((128, 28), (256, 14), (512, 7))]
    assert len({u.flops for u in narrow}) == 1
    for u in narrow:
        steps = u.attrs["weight_shape"][1] * 9
        assert tvm.unit_latency(u) == pytest.approx(sp.launch + steps * (sp.reduction_step + sp.boundary_step))
    assert tvm.unit_latency(narrow[2]) > 3.5 * (tvm.unit_latency(narrow[0]) - sp.launch)
    # padded along one axis only (a 1x7 window), or not at all: no boundary cost
    one_axis = _padded(conv("r", 128, 17, cin=128, k=1), [0, 3, 0, 3])
    assert not padded_on_both_axes(one_axis) and padded_on_both_axes(narrow[0])
    assert tvm.reduction_floor(one_axis) == pytest.approx(128 * sp.reduction_step)
    # the datasheet preset: roofline only
    assert datasheet.reduction_floor(narrow[0]) == 0.0
    big = conv("big", 256, 56, cin=16, k=1, batch=32)   # 25.7M outputs, 16 steps: the roofline decides
    assert tvm._unit_kernel(big)[0] > tvm.reduction_floor(big)
    assert tvm._unit_kernel(big) == tvm.kernel(big.flops, big.bytes_moved, big.outputs[0].numel)


def test_a_merged_convolution_walks_the_largest_padded_window():
    """Merging zero-pads every member's window to the largest one (``passes.merge``), so under the ``-tvm``
    presets each thread of the merged kernel walks in channels x the largest kernel area, with the boundary cost
    when any member's window is padded on both axes."""
    tvm = get_cost_model("sim:h100-tvm")
    sp = tvm.spec
    one, three = conv("a", 64, 7, cin=256, k=1), _padded(conv("b", 64, 7, cin=256, k=3), [1, 1, 1, 1])
    assert tvm._merged_floor([one, three]) == pytest.approx(256 * 9 * (sp.reduction_step + sp.boundary_step))
    assert tvm._merged_floor([one, conv("c", 32, 7, cin=256, k=1)]) == pytest.approx(256 * sp.reduction_step)
    assert tvm.stage_latency([[one], [three]], "merge") >= sp.launch + 256 * 9 * (sp.reduction_step + sp.boundary_step)


def test_tvm_presets_fill_the_device_with_a_matmuls_multiply_adds():
    """A batch-1 matmul (a classifier) runs DLight's GEMV rule, which splits its reduction over threads: under the
    ``-tvm`` presets it fills the device with its multiply-adds (measured 5-10 us on the H100 / H200, where one
    lane per output priced it at 54-206 us), elsewhere with its outputs."""
    x, w, y = TensorInfo((1, 2048)), TensorInfo((1000, 2048)), TensorInfo((1, 1000))
    fc = Unit("fc", "matmul", [x, w], [y], flops=2.0 * 2048 * 1000, bytes_moved=float(x.nbytes + w.nbytes + y.nbytes))
    tvm, datasheet = get_cost_model("sim:h100-tvm"), get_cost_model("sim:h100")
    assert tvm.work_items(fc) == 2048 * 1000 and datasheet.work_items(fc) == 1000
    assert tvm.unit_latency(fc) < 10e-6 < datasheet.unit_latency(fc)


def test_merge_pays_for_padding_smaller_kernels(device):
    """tvm_interop.passes.merge zero-pads a 1x1 kernel to 3x3: the merged kernel does the 1x1's work nine times over."""
    from tvm_interop.passes.cost.simulated import merged_flops

    one, three = conv("a", 64, 28, k=1), conv("b", 64, 28, k=3)
    assert merged_flops([one, three]) == pytest.approx(9 * one.flops + three.flops)
    assert merged_flops([one, conv("c", 32, 28, k=1)]) == pytest.approx(one.flops + 32 / 64 * one.flops)
    padded = device.stage_latency([[one], [three]], "merge")
    as_if_unpadded = device.spec.launch + device.merged_kernel([one, replace(three, attrs={})])[0]
    assert padded >= as_if_unpadded


def test_fluid_sees_colliding_chains():
    # two chains whose large kernels line up: the aggregate bound misses the collision, the simulation not
    big = [conv(f"b{i}", 512, 56, cin=256, batch=64) for i in range(2)]
    small = [conv(f"s{i}", 16, 7, cin=16, batch=1) for i in range(2)]
    groups = [[big[0], small[0]], [big[1], small[1]]]
    agg = get_cost_model("sim:h100")
    fluid = get_cost_model("sim:h100", contention="fluid")
    assert fluid.stage_latency(groups) >= agg.stage_latency(groups) - TOL
    assert fluid.stage_latency([[u] for u in small]) == pytest.approx(agg.stage_latency([[u] for u in small]))


def test_unknown_strategy():
    with pytest.raises(InteropError):
        get_cost_model("sim:h100").stage_latency([[conv("c", 8, 8)]], "pipelined")


def test_cpu_preset_describes_this_machine():
    dev = get_cost_model("sim:cpu")
    assert dev.spec.compute_units == 2
    assert "2 units" in dev.describe()
    g = random_dag(6, 3)
    assert all(dev.unit_latency(u) > 0 for u in g)
