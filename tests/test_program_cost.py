"""The whole-program GPU latency model (passes.cost.program) and its fitter (passes.cost.program_fit).

Hand-built issued programs check the timeline arithmetic the module docstring documents; the fitter has to recover
parameters from samples the simulator generated itself; the shipped fit (docs/gpu_cost_model.json) has to load.
No GPU needed.
"""
from __future__ import annotations

import json
import math

import pytest

from tvm_interop.passes.cost.program import (
    CALL,
    KERNEL,
    MAIN,
    RELEASE,
    SET,
    SYNC,
    IssuedOp,
    IssuedProgram,
    ProgramCostModel,
    ProgramCostParams,
    from_stream_program,
    issued_program,
    load_fitted,
    simulate,
    table_protocol_program,
)
from tvm_interop.passes.cost.program_fit import (
    DEFAULT_FIT,
    DEFAULT_PRIORS,
    FIXED_AT,
    FIXED_INTERFERENCE,
    Sample,
    fit,
    table_stage_samples,
)
from tvm_interop.runtime.errors import InteropError

US = 1e-6
FILL = 1000.0  # work items that fill the device in these tests
SMALL = 10.0   # a kernel that fills 1 % of it
FULL = 5000.0  # a kernel that fills all of it


def quiet(**kw) -> ProgramCostParams:
    """Every cost zero except those given; the kernel map is the identity (in-program time = isolated time)."""
    base = {"kernel_scale": 1.0, "kernel_offset": 0.0, "kernel_min": 0.0, "fill_items": FILL, "call_overhead": 0.0,
            "tail": 0.0, "host_kernel": 0.0, "host_sync": 0.0, "host_set": 0.0, "host_keepalive": 0.0,
            "launch_latency": 0.0, "kernel_gap": 0.0, "event_latency": 0.0, "graph_launch": 0.0,
            "graph_node_gap": 0.0, "graph_event_latency": 0.0, "program_scale": 1.0}
    base.update(kw)
    return ProgramCostParams(**base)


def chain(n: int, cuda_graph: bool = False) -> IssuedProgram:
    return IssuedProgram([IssuedOp(KERNEL, unit=f"k{i}") for i in range(n)], cuda_graph=cuda_graph)


def units(lat: dict[str, float], work: float = SMALL) -> dict[str, tuple]:
    return {k: (v, work) for k, v in lat.items()}


# ---------------------------------------------------------------------------------------------- the simulator
def test_device_bound_chain_is_the_documented_sum():
    """Host ahead of the device: call_overhead + first issue + launch_latency + sum(gap + kernel) + tail, with
    kernel = kernel_scale * isolated + kernel_offset."""
    p = quiet(call_overhead=20 * US, tail=5 * US, host_kernel=1 * US, launch_latency=3 * US, kernel_gap=0.5 * US,
              kernel_scale=1.2, kernel_offset=-2 * US)
    lat = {"k0": 50 * US, "k1": 80 * US, "k2": 30 * US}
    t = simulate(chain(3), units(lat), p)
    kern = sum(0.5 * US + 1.2 * u - 2 * US for u in lat.values())
    assert t.latency == pytest.approx(20 * US + 1 * US + 3 * US + kern + 5 * US, rel=1e-9)
    assert not t.host_bound
    assert t.host_end == pytest.approx(20 * US + 3 * US)


def test_host_bound_chain_is_the_host_sum():
    """Tiny kernels: the device waits for the host; latency = host issue of every kernel + the last kernel."""
    p = quiet(call_overhead=10 * US, tail=2 * US, host_kernel=6 * US, launch_latency=1 * US)
    n = 40
    t = simulate(chain(n), units({f"k{i}": 2 * US for i in range(n)}), p)
    assert t.host_bound is False  # the last kernel ends after the host is done
    assert t.host_end == pytest.approx(10 * US + n * 6 * US)
    assert t.latency == pytest.approx(10 * US + n * 6 * US + 1 * US + 2 * US + 2 * US, rel=1e-9)


def test_kernel_min_floors_the_map():
    p = quiet(kernel_scale=1.0, kernel_offset=-5 * US, kernel_min=1.5 * US)
    t = simulate(chain(2), units({"k0": 3 * US, "k1": 20 * US}), p)
    assert t.latency == pytest.approx(1.5 * US + 15 * US)


def test_timing_floor_makes_tables_of_two_protocols_agree():
    """A kernel timed with number 5 reads timing_floor * (1/5 - 1/10) higher than timed with number 10: both
    readings map to the same device time; a unit without a number (a simulated cost) is not corrected."""
    p = quiet(kernel_scale=1.1, kernel_offset=-1 * US, timing_floor=20 * US)
    five = {"k0": (30 * US + 4 * US, SMALL, "other", False, 5)}
    ten = {"k0": (30 * US + 2 * US, SMALL, "other", False, 10)}
    want = 1.1 * 30 * US - 1 * US
    assert simulate(chain(1), five, p).latency == pytest.approx(want)
    assert simulate(chain(1), ten, p).latency == pytest.approx(want)
    plain = {"k0": (30 * US, SMALL, "other", False, 0)}
    assert simulate(chain(1), plain, p).latency == pytest.approx(1.1 * 30 * US - 1 * US)


def test_keepalive_cost_follows_the_build_that_issued_it():
    """Today's keep-alive (one ffi.Array call per chunk) costs host_keepalive; the builds of the 2026-11-22 data
    (a VM function per chunk) host_keepalive_v1; a kind the model does not know is refused."""
    p = quiet(host_keepalive=1 * US, host_keepalive_v1=10 * US)
    ops = [IssuedOp(KERNEL, unit="k0"), IssuedOp(RELEASE, calls=3)]
    lat = units({"k0": 1 * US})
    assert simulate(IssuedProgram(ops), lat, p).host_end == pytest.approx(3 * US)
    assert simulate(IssuedProgram(ops, keepalive="v1"), lat, p).host_end == pytest.approx(30 * US)

    class _SP:
        ops, num_streams, mode = [], 0, "stage"

    with pytest.raises(InteropError, match="keep-alive kind"):
        from_stream_program(_SP(), keepalive="python")


def test_program_model_reads_the_protocol_of_its_table(tmp_path, small_squeezenet):
    """Given a cost table, the model takes its ``number`` (the protocol its latencies were timed with); a whole
    table dict is refused (its units and its number belong together), so is a number below 1."""
    from tvm_interop.passes.cost.table import TableCostModel

    graph = small_squeezenet.graph
    t = {"format": "tvm-interop-cost-table", "version": 1, "number": 10, "repeat": 20,
         "units": {u.name: 10 * US for u in graph.units}, "stages": []}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(t))
    model = ProgramCostModel(TableCostModel(str(path)), quiet())
    assert model.timing_number == 10
    assert {v[4] for v in model.unit_inputs(graph).values()} == {10}
    assert ProgramCostModel(t["units"], quiet()).timing_number is None
    with pytest.raises(InteropError, match="number"):
        ProgramCostModel(t, quiet())
    with pytest.raises(InteropError, match="timing_number"):
        ProgramCostModel(t["units"], quiet(), timing_number=-1)
    # with a timing floor in the parameters, bare latencies must say how they were timed
    floor = quiet(timing_floor=10 * US)
    with pytest.raises(InteropError, match="timing_number"):
        ProgramCostModel(t["units"], floor)
    assert ProgramCostModel(t["units"], floor, timing_number=0).timing_number is None
    assert ProgramCostModel(t["units"], floor, timing_number=5).timing_number == 5


def two_streams(sync: bool) -> IssuedProgram:
    ops = [IssuedOp(SET, 0), IssuedOp(KERNEL, unit="a")]
    if sync:
        ops.append(IssuedOp(SYNC, 0, 1))
    ops += [IssuedOp(SET, 1), IssuedOp(KERNEL, unit="b"), IssuedOp(SET, MAIN)]
    return IssuedProgram(ops, num_streams=2)


def test_independent_small_kernels_overlap():
    p = quiet()
    t = simulate(two_streams(sync=False), units({"a": 40 * US, "b": 30 * US}, SMALL), p, trace=True)
    assert t.latency == pytest.approx(40 * US)
    (sa, a0, a1), (sb, b0, b1) = t.kernels["a"], t.kernels["b"]
    assert sa != sb and a0 == b0 == 0.0
    assert (a1, b1) == (pytest.approx(40 * US), pytest.approx(30 * US))


def test_kernels_that_fill_the_device_serialise():
    """Two kernels that each fill the GPU share it: work is conserved, both end at the sum."""
    p = quiet()
    t = simulate(two_streams(sync=False), units({"a": 40 * US, "b": 40 * US}, FULL), p)
    assert t.latency == pytest.approx(80 * US)
    # half-filling kernels still fit side by side
    t = simulate(two_streams(sync=False), units({"a": 40 * US, "b": 40 * US}, FILL / 2), p)
    assert t.latency == pytest.approx(40 * US)


def test_sync_adds_event_latency_and_orders_the_streams():
    lat = units({"a": 40 * US, "b": 30 * US}, SMALL)
    p = quiet(event_latency=3 * US, host_sync=2 * US)
    t = simulate(two_streams(sync=True), lat, p, trace=True)
    assert t.latency == pytest.approx(40 * US + 3 * US + 30 * US)
    assert t.kernels["b"][1] == pytest.approx(43 * US)  # b waits for a's event
    assert simulate(two_streams(sync=True), lat, quiet()).latency == pytest.approx(70 * US)


def test_unknown_units_and_ops_are_refused():
    with pytest.raises(InteropError, match="no isolated latency"):
        simulate(IssuedProgram([IssuedOp(SET, 1), IssuedOp(KERNEL, unit="b")], num_streams=1), {}, quiet())
    with pytest.raises(InteropError, match="unknown issued op"):
        simulate(IssuedProgram([IssuedOp("jump")]), {}, quiet())


def test_cuda_graph_removes_the_host_per_kernel_cost():
    n = 30
    lat = units({f"k{i}": 2 * US for i in range(n)})
    p = quiet(host_kernel=6 * US, graph_launch=10 * US, graph_node_gap=0.5 * US)
    direct = simulate(chain(n), lat, p)
    graph = simulate(chain(n, cuda_graph=True), lat, p)
    assert direct.latency == pytest.approx(n * 6 * US + 2 * US)
    assert graph.host_end == pytest.approx(10 * US)
    assert graph.latency == pytest.approx(10 * US + n * (0.5 * US + 2 * US))
    assert graph.latency < direct.latency / 2


def test_cuda_graph_copies_are_launched_directly():
    ops = [IssuedOp(KERNEL, unit="__in0"), IssuedOp(KERNEL, unit="k0"), IssuedOp(KERNEL, unit="__out0")]
    prog = IssuedProgram(ops, cuda_graph=True, copy_bytes={"__in0": 0.0, "__out0": 0.0})
    p = quiet(host_kernel=5 * US, graph_launch=7 * US, kernel_min=1 * US)
    t = simulate(prog, units({"k0": 50 * US}), p)
    assert t.host_end == pytest.approx(5 * US + 7 * US + 5 * US)   # two copies direct, one graph launch
    # k0 starts when the graph is launched (the input copy ran meanwhile); the output copy follows it
    assert t.latency == pytest.approx(5 * US + 7 * US + 50 * US + 1 * US)


def test_program_scale_stretches_program_kernels_not_table_stages():
    """program_scale multiplies the device time of every kernel of a whole program (the floor included), never of
    a stage replayed as the table protocol (isolated)."""
    p = quiet(program_scale=1.25, kernel_scale=1.0, kernel_offset=-2 * US, kernel_min=1 * US)
    lat = units({"k0": 42 * US, "k1": 2 * US})
    assert simulate(chain(2), lat, p).latency == pytest.approx(1.25 * (40 * US + 1 * US))
    iso = IssuedProgram(chain(2).ops, isolated=True)
    assert simulate(iso, lat, p).latency == pytest.approx(40 * US + 1 * US)
    # given kernel times (sim units x factor) bypass the map and the scale
    given = {"k0": (42 * US, SMALL, "other", True), "k1": (2 * US, SMALL, "other", True)}
    assert simulate(chain(2), given, p).latency == pytest.approx(44 * US)


def test_program_offset_adds_to_program_kernels_not_table_stages():
    """program_offset is added to every kernel of a whole program after program_scale (the floor rho * kernel_min
    still holds), never to a stage replayed as the table protocol, nor to given kernel times."""
    p = quiet(program_scale=1.25, program_offset=-3 * US, kernel_scale=1.0, kernel_offset=-2 * US, kernel_min=1 * US)
    lat = units({"k0": 42 * US, "k1": 4 * US})
    # k0: 1.25 * 40 - 3 = 47 us; k1: 1.25 * 2 - 3 < 1.25 * 1, so the floor 1.25 us
    assert simulate(chain(2), lat, p).latency == pytest.approx(47 * US + 1.25 * US)
    iso = IssuedProgram(chain(2).ops, isolated=True)
    assert simulate(iso, lat, p).latency == pytest.approx(40 * US + 2 * US)
    given = {"k0": (42 * US, SMALL, "other", True), "k1": (4 * US, SMALL, "other", True)}
    assert simulate(chain(2), given, p).latency == pytest.approx(46 * US)


def test_program_deep_factor_stretches_deep_convolutions_in_programs_only():
    """A unit flagged deep (the tuple's sixth entry) takes program_scale x program_deep_factor inside a whole
    program, the others program_scale; the table protocol and given kernel times take neither."""
    p = quiet(program_scale=1.1, program_deep_factor=1.5 / 1.1, program_offset=-1 * US, kernel_min=1 * US)
    lat = {"k0": (40 * US, SMALL, "conv_1x1", False, 0, True), "k1": (20 * US, SMALL, "conv_1x1", False, 0, False)}
    assert simulate(chain(2), lat, p).latency == pytest.approx((1.5 * 40 - 1) * US + (1.1 * 20 - 1) * US)
    # without the flag (an older tuple) both take program_scale
    plain = {k: v[:5] for k, v in lat.items()}
    assert simulate(chain(2), plain, p).latency == pytest.approx((1.1 * 40 - 1) * US + (1.1 * 20 - 1) * US)
    iso = IssuedProgram(chain(2).ops, isolated=True)
    assert simulate(iso, lat, p).latency == pytest.approx(60 * US)
    given = {k: v[:3] + (True,) + v[4:] for k, v in lat.items()}
    assert simulate(chain(2), given, p).latency == pytest.approx(60 * US)
    # the floor scales with the unit's own factor
    tiny = {"k0": (0.5 * US, SMALL, "conv_1x1", False, 0, True), "k1": (0.5 * US, SMALL, "conv_1x1", False, 0, False)}
    assert simulate(chain(2), tiny, p).latency == pytest.approx(1.5 * US + 1.1 * US)


def test_deep_convolutions_are_those_summing_over_1024_inputs(small_squeezenet):
    """``is_deep`` reads the reduction depth (in channels per group x kernel area) of a convolution; the model's
    unit inputs carry it, and the graph's convolutions record the weight shape the reduction depth reads."""
    from tvm_interop.passes.cost.program import DEEP_REDUCTION, is_deep, reduction_depth
    from tvm_interop.passes.graph import OpGraph, TensorInfo, Unit

    def conv(name, w):
        out = TensorInfo((1, w[0], 8, 8))
        return Unit(name, "conv2d", [TensorInfo((1, w[1], 8, 8)), TensorInfo(w)], [out], attrs={"weight_shape": w})

    convs = [conv("deep1x1", (64, 1024, 1, 1)), conv("deep3x3", (64, 128, 3, 3)), conv("shallow", (64, 1023, 1, 1)),
             conv("depthwise", (512, 1, 3, 3))]
    pool = Unit("pool", "avg_pool2d", [TensorInfo((1, 64, 8, 8))], [TensorInfo((1, 64, 8, 8))])
    assert DEEP_REDUCTION == 1024
    assert [reduction_depth(u) for u in convs + [pool]] == [1024, 1152, 1023, 9, None]
    assert [is_deep(u) for u in convs + [pool]] == [True, True, False, False, False]
    graph = OpGraph(convs + [pool], [], name="g")
    got = ProgramCostModel({u.name: 5 * US for u in graph.units}, quiet(), timing_number=0).unit_inputs(graph)
    assert {k: v[5] for k, v in got.items()} == {"deep1x1": True, "deep3x3": True, "shallow": False,
                                                 "depthwise": False, "pool": False}
    # a prepared model's convolutions: the recorded weight shape is the weight tensor the kernel reads
    real = [u for u in small_squeezenet.graph.units if u.kind == "conv2d"]
    assert real and all(reduction_depth(u) == math.prod(u.inputs[1].shape[1:]) for u in real)


def test_table_protocol_replays_time_evaluator():
    """A single-unit stage, 5 calls back to back: host-bound at call_overhead + host_kernel per call when the
    kernel is shorter, device-bound at the kernel otherwise; a two-group stage forks and joins with events."""
    p = quiet(call_overhead=4 * US, host_kernel=2 * US)
    tiny = table_protocol_program([["k0"]], number=5)
    assert tiny.isolated and tiny.count(CALL) == 4 and tiny.count(SYNC) == 0
    t = simulate(tiny, units({"k0": 1 * US}), p)
    assert t.latency == pytest.approx(5 * 6 * US + 1 * US)
    t = simulate(tiny, units({"k0": 30 * US}), p)
    assert t.latency == pytest.approx(6 * US + 5 * 30 * US)
    pair = table_protocol_program([["a"], ["b"]], number=2)
    assert pair.count(SYNC) == 2 * 4 and pair.num_streams == 2
    q = quiet(event_latency=1 * US)
    t = simulate(pair, units({"a": 40 * US, "b": 30 * US}), q)
    # per call: fork wait (1 us) + the longer group (40 us) + the two join waits, one after the other on the
    # caller's stream (1 us each); the next call's fork waits for the joins
    assert t.latency == pytest.approx(2 * (1 * US + 40 * US + 2 * 1 * US))
    with pytest.raises(InteropError, match="non-empty group"):
        table_protocol_program([[]])


def test_conv_beside_avg_pool_does_not_overlap():
    """The shipped interference: a spatial conv makes (almost) no progress while an avg_pool runs beside it, so the
    pair takes about the sum; without it the two small kernels overlap fully."""
    lat = {"a": (40 * US, SMALL, "conv_spatial"), "b": (30 * US, SMALL, "avg_pool")}
    free = simulate(two_streams(sync=False), lat, quiet())
    assert free.latency == pytest.approx(40 * US)
    p = quiet()
    p.interference.update(FIXED_INTERFERENCE)
    t = simulate(two_streams(sync=False), lat, p)
    assert t.latency == pytest.approx(70 * US, rel=0.02)
    # the pool is not slowed, and two convs still overlap
    conv2 = {"a": (40 * US, SMALL, "conv_spatial"), "b": (30 * US, SMALL, "conv_spatial")}
    assert simulate(two_streams(sync=False), conv2, p).latency == pytest.approx(40 * US)


# ---------------------------------------------------------------------------------------------- parameter files
def test_params_json_round_trip(tmp_path):
    p = ProgramCostParams(host_kernel=4.2e-6, fill_items=1.5e5).with_interference(conv_spatial__avg_pool=3.0)
    p.meta["note"] = "test"
    path = tmp_path / "p.json"
    p.save(str(path))
    q = ProgramCostParams.load(str(path))
    assert q == p
    assert q.interference == {"conv_spatial<-avg_pool": 3.0}
    assert q.meta == {"note": "test"}
    # the report layout (parameters under "model") loads too
    (tmp_path / "r.json").write_text(json.dumps({"format": "some-report", "model": p.to_json()}))
    assert ProgramCostParams.load(str(tmp_path / "r.json")) == p


@pytest.mark.parametrize("content, match", [
    ('{"format": "tvm-interop-cost-table", "version": 1}', "not a tvm-interop program-cost parameter file"),
    ("[1, 2, 3]", "not a tvm-interop program-cost parameter file"),
    ('{"format": "tvm-interop-program-cost", "version": 1, "params": {"host_kernel": 1e-6', "not valid JSON"),
    ('{"format": "tvm-interop-program-cost", "version": 99, "params": {}}', "newer than this code"),
    ('{"format": "tvm-interop-program-cost", "version": 1, "params": {"warp_speed": 9}}', "unknown program-cost"),
    ('{"format": "tvm-interop-program-cost", "version": 1, "params": {}, "interference": {"a": 1}}',
     "victim<-aggressor"),
])
def test_params_refuses_foreign_corrupt_and_newer_files(tmp_path, content, match):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InteropError, match=match):
        ProgramCostParams.load(str(path))


def test_params_of_an_older_fit_load_without_the_newer_parameters(tmp_path):
    """A version-2 file (the fits before program_offset, e.g. ``gpu_cost_transfer.py --params`` of version 4)
    loads with program_offset 0, and a version-3 file (before program_deep_factor) with program_deep_factor 1, so
    each predicts what it predicted then; the current version round-trips both."""
    old = {"format": "tvm-interop-program-cost", "version": 2,
           "params": {"kernel_scale": 1.03, "program_scale": 1.1, "host_kernel": 4e-6}}
    (tmp_path / "v2.json").write_text(json.dumps(old))
    p = ProgramCostParams.load(str(tmp_path / "v2.json"))
    assert p.program_offset == 0.0 and p.program_scale == pytest.approx(1.1)
    assert p.program_deep_factor == 1.0
    v3 = dict(old, version=3, params=dict(old["params"], program_offset=-2e-6, program_scale=1.2))
    (tmp_path / "v3.json").write_text(json.dumps(v3))
    p3 = ProgramCostParams.load(str(tmp_path / "v3.json"))
    assert p3.program_deep_factor == 1.0 and p3.program_offset == pytest.approx(-2e-6)
    q = p.replace(program_offset=-1.5 * US, program_deep_factor=1.3)
    assert q.to_json()["version"] == 4
    back = ProgramCostParams.from_json(q.to_json())
    assert back.program_offset == pytest.approx(-1.5 * US) and back.program_deep_factor == pytest.approx(1.3)


def test_params_missing_file_and_unknown_replace(tmp_path):
    with pytest.raises(InteropError, match="cannot read"):
        ProgramCostParams.load(str(tmp_path / "absent.json"))
    with pytest.raises(InteropError, match="unknown program-cost parameter"):
        ProgramCostParams().replace(warp_speed=1.0)


# ---------------------------------------------------------------------------------------------- the fitter
def _synthetic_programs() -> tuple[list[IssuedProgram], dict[str, tuple]]:
    """A host-bound chain, a device-bound chain of mixed sizes, a fork/join over two streams with events, and
    their CUDA-graph twins."""
    lat: dict[str, tuple] = {}
    progs = []
    small = [f"s{i}" for i in range(25)]
    for i, k in enumerate(small):
        lat[k] = (3 * US + 0.1 * US * i, SMALL)
    big = [f"b{i}" for i in range(8)]
    for i, k in enumerate(big):
        lat[k] = ((20 + 15 * i) * US, SMALL)
    for names in (small, big):
        for cg in (False, True):
            progs.append(IssuedProgram([IssuedOp(KERNEL, unit=k) for k in names], cuda_graph=cg))
    for a, b in ((big[:4], big[4:]), (small[:10], small[10:20])):
        ops = []
        for x, y in zip(a, b):   # fork/joins: x on stream 0 and y on stream 1, joined on MAIN
            ops += [IssuedOp(SYNC, MAIN, 0), IssuedOp(SYNC, MAIN, 1), IssuedOp(SET, 0), IssuedOp(KERNEL, unit=x),
                    IssuedOp(SET, 1), IssuedOp(KERNEL, unit=y), IssuedOp(SYNC, 0, MAIN),
                    IssuedOp(SYNC, 1, MAIN), IssuedOp(SET, MAIN)]
        for cg in (False, True):
            progs.append(IssuedProgram(list(ops), num_streams=2, cuda_graph=cg))
    return progs, lat


def test_fitter_recovers_parameters_from_simulated_samples():
    truth = quiet(kernel_scale=1.2, kernel_offset=-2 * US, host_kernel=5 * US, host_sync=1.5 * US,
                  event_latency=3 * US, graph_event_latency=1 * US, kernel_min=1 * US)
    progs, lat = _synthetic_programs()
    samples = [Sample(p, "g", simulate(p, lat, truth).latency) for p in progs]
    names = ["kernel_scale", "kernel_offset", "host_kernel", "host_sync", "event_latency", "graph_event_latency"]
    start = truth.replace(kernel_scale=1.0, kernel_offset=0.0, host_kernel=3 * US, host_sync=3 * US,
                          event_latency=1 * US, graph_event_latency=2 * US)
    res = fit(samples, {"g": lat}, base=start, names=names, iters=60)
    got, want = res.params.values(), truth.values()
    for k in names:
        assert got[k] == pytest.approx(want[k], rel=0.03, abs=0.05 * US), k
    assert res.loss < 1e-6
    # the fixed parameters stay where the base put them
    assert got["kernel_min"] == want["kernel_min"] and got["tail"] == 0.0


def test_prior_holds_an_unidentified_slope():
    """Samples whose kernels all sit at kernel_min say nothing about kernel_scale: without a prior it stays
    wherever it started, with one it goes to the prior's centre; host_kernel is recovered either way."""
    truth = quiet(host_kernel=5 * US, kernel_offset=-10 * US, kernel_min=1 * US)
    lat = {f"k{i}": (2 * US, SMALL) for i in range(20)}
    progs = [IssuedProgram([IssuedOp(KERNEL, unit=f"k{i}") for i in range(n)]) for n in (5, 10, 20)]
    samples = [Sample(p, "g", simulate(p, lat, truth).latency) for p in progs]
    start = truth.replace(host_kernel=2 * US, kernel_scale=0.7)
    names = ["kernel_scale", "host_kernel"]
    free = fit(samples, {"g": lat}, base=start, names=names, iters=40)
    held = fit(samples, {"g": lat}, base=start, names=names, iters=40, priors={"kernel_scale": (1.0, 0.25)})
    for res in (free, held):
        assert res.params.host_kernel == pytest.approx(5 * US, rel=0.01)
    assert free.params.kernel_scale == pytest.approx(0.7)
    assert held.params.kernel_scale == pytest.approx(1.0, abs=0.01)


def test_table_stage_samples_stratify_and_scale():
    """Stages of a cost table become table-protocol samples (measured = latency x number), at most per_stratum per
    (groups, chain length, classes); stages naming unknown units or without a latency are skipped."""
    u = {"c0": (50 * US, SMALL, "conv_spatial"), "c1": (60 * US, SMALL, "conv_spatial"),
         "p0": (20 * US, SMALL, "avg_pool")}
    stages = [{"groups": [["c0"], ["p0"]], "latency": 90 * US}, {"groups": [["c1"], ["p0"]], "latency": 95 * US},
              {"groups": [["c0"], ["c1"]], "latency": 70 * US}, {"groups": [["c0", "c1"]], "latency": 108 * US},
              {"groups": [["zz"], ["c0"]], "latency": 1e-3}, {"groups": [["c0"], ["c1"]], "latency": 0.0},
              {"groups": [["c0"]], "latency": 9 * US, "strategy": "library"}]
    table = {"number": 3, "stages": stages}
    got = table_stage_samples(table, u, "g", per_stratum=1)
    assert len(got) == 3   # (2 groups, conv+pool) x1, (2 groups, conv) x1, (chain of 2, conv) x1
    assert all(s.prog.isolated and s.group == "g" and s.prog.count(CALL) == 2 for s in got)
    chain2 = [s for s in got if s.prog.num_streams == 0]
    assert len(chain2) == 1 and chain2[0].measured == pytest.approx(3 * 108 * US)
    assert len(table_stage_samples(table, u, "g", per_stratum=5)) == 4


def test_fitter_separates_program_scale_with_table_stages():
    """Whole programs alone cannot tell kernel_scale from program_scale; with stages replayed as the table protocol
    (isolated, program_scale not applied) the fit recovers both, and call_overhead from the host-bound stages."""
    truth = quiet(kernel_scale=1.0, kernel_offset=-1 * US, program_scale=1.2, call_overhead=4 * US,
                  host_kernel=2 * US, kernel_min=1 * US)
    lat = {f"k{i}": ((5 + 12 * i) * US, SMALL) for i in range(8)}
    progs = [IssuedProgram([IssuedOp(KERNEL, unit=f"k{i}") for i in idx]) for idx in (range(8), [1, 3, 5])]
    stages = [table_protocol_program([[f"k{i}"]], 5) for i in range(8)]
    stages += [table_protocol_program([["k0", "k1"]], 5), table_protocol_program([["k2"], ["k5"]], 5)]
    samples = [Sample(p, "g", simulate(p, lat, truth).latency) for p in progs + stages]
    names = ["kernel_scale", "kernel_offset", "program_scale", "call_overhead", "host_kernel"]
    start = truth.replace(kernel_scale=1.2, kernel_offset=0.0, program_scale=1.0, call_overhead=1 * US,
                          host_kernel=4 * US)
    res = fit(samples, {"g": lat}, base=start, names=names, iters=60)
    got, want = res.params.values(), truth.values()
    for k in names:
        assert got[k] == pytest.approx(want[k], rel=0.03, abs=0.05 * US), k
    assert res.loss < 1e-6


def test_fitter_separates_program_offset_from_program_scale():
    """A factor and a per-kernel offset on program kernels are told apart by programs of long and of short kernels
    (what version 5 of the shipped fit relies on); table stages pin the isolated map, which neither touches."""
    truth = quiet(kernel_scale=1.0, kernel_offset=-1 * US, program_scale=1.2, program_offset=-0.8 * US,
                  call_overhead=4 * US, host_kernel=0.5 * US, kernel_min=1 * US)
    long = {f"L{i}": ((40 + 15 * i) * US, SMALL) for i in range(6)}
    short = {f"s{i}": ((6 + i) * US, SMALL) for i in range(6)}
    lat = {**long, **short}
    progs = [IssuedProgram([IssuedOp(KERNEL, unit=u) for u in us]) for us in (list(long), list(short),
                                                                               ["L0", "s1", "s2", "s3"])]
    stages = [table_protocol_program([[u]], 5) for u in lat]
    samples = [Sample(p, "g", simulate(p, lat, truth).latency) for p in progs + stages]
    names = ["kernel_offset", "program_scale", "program_offset"]
    res = fit(samples, {"g": lat}, base=truth.replace(kernel_offset=0.0, program_scale=1.0, program_offset=0.0),
              names=names, iters=80)
    got, want = res.params.values(), truth.values()
    for k in names:
        assert got[k] == pytest.approx(want[k], rel=0.03, abs=0.03 * US), k
    assert res.loss < 1e-6


def test_fitter_separates_program_deep_factor_from_program_scale():
    """Programs of deep and of shallow convolutions (and a mix) tell the two in-program factors apart; the table
    stages pin the isolated map, which neither touches."""
    truth = quiet(kernel_scale=1.0, kernel_offset=-1 * US, program_scale=1.1, program_deep_factor=1.25,
                  program_offset=-0.8 * US, call_overhead=4 * US, host_kernel=0.5 * US, kernel_min=1 * US)
    deep = {f"D{i}": ((30 + 12 * i) * US, SMALL, "conv_1x1", False, 0, True) for i in range(5)}
    shallow = {f"s{i}": ((8 + 9 * i) * US, SMALL, "conv_1x1", False, 0, False) for i in range(5)}
    lat = {**deep, **shallow}
    progs = [IssuedProgram([IssuedOp(KERNEL, unit=u) for u in us]) for us in (list(deep), list(shallow),
                                                                               ["D0", "s1", "s4", "D3"])]
    stages = [table_protocol_program([[u]], 5) for u in lat]
    samples = [Sample(p, "g", simulate(p, lat, truth).latency) for p in progs + stages]
    names = ["kernel_offset", "program_scale", "program_deep_factor", "program_offset"]
    res = fit(samples, {"g": lat}, base=truth.replace(kernel_offset=0.0, program_scale=1.0, program_deep_factor=1.0,
                                                      program_offset=0.0), names=names, iters=80)
    got, want = res.params.values(), truth.values()
    for k in names:
        assert got[k] == pytest.approx(want[k], rel=0.03, abs=0.03 * US), k
    assert res.loss < 1e-6


def test_fitter_recovers_the_timing_floor_from_two_protocols():
    """One set of kernels timed with number 5 and with number 10 (table-protocol stages of each) and whole programs
    of the number-10 table: the fit separates timing_floor from kernel_offset, which one protocol cannot."""
    truth = quiet(kernel_scale=1.0, kernel_offset=-1 * US, timing_floor=15 * US, call_overhead=3 * US,
                  host_kernel=2 * US, kernel_min=0.5 * US)
    dev = {f"k{i}": (4 + 9 * i) * US for i in range(8)}
    # isolated readings: device time + the floor amortised over each protocol (what the affine map inverts)
    t5 = {k: (d + 1 * US + 15 * US / 5, SMALL, "other", False, 5) for k, d in dev.items()}
    t10 = {k: (d + 1 * US + 15 * US / 10, SMALL, "other", False, 10) for k, d in dev.items()}
    progs = [IssuedProgram([IssuedOp(KERNEL, unit=f"k{i}") for i in idx]) for idx in (range(8), [0, 2, 4])]
    samples = [Sample(p, "g10", simulate(p, t10, truth).latency) for p in progs]
    for g, lat, n in (("g5", t5, 5), ("g10", t10, 10)):
        samples += [Sample(table_protocol_program([[k]], n), g, simulate(table_protocol_program([[k]], n), lat,
                                                                         truth).latency) for k in dev]
    names = ["kernel_offset", "timing_floor"]
    res = fit(samples, {"g5": t5, "g10": t10}, base=truth.replace(kernel_offset=-4 * US, timing_floor=2 * US),
              names=names, iters=60)
    assert res.params.kernel_offset == pytest.approx(-1 * US, abs=0.05 * US)
    assert res.params.timing_floor == pytest.approx(15 * US, rel=0.02)
    assert res.loss < 1e-6


def test_fitter_refuses_bad_input():
    prog = chain(1)
    with pytest.raises(InteropError, match="nothing to fit"):
        fit([], {"g": {}})
    with pytest.raises(InteropError, match="cannot fit"):
        fit([Sample(prog, "g", 1e-3)], {"g": units({"k0": US})}, names=["warp_speed"])
    with pytest.raises(InteropError, match="> 0"):
        fit([Sample(prog, "g", 0.0)], {"g": units({"k0": US})}, names=["host_kernel"])


# ---------------------------------------------------------------------------------------------- real programs
CUDA = {"kind": "cuda", "arch": "sm_90"}


@pytest.fixture(scope="module")
def small_squeezenet():
    import tvm_interop
    from tvm_interop.models import get_model, small_config

    return tvm_interop.api.prepare_program(get_model("squeezenet", **small_config("squeezenet")), CUDA,
                                           name="squeezenet")


@pytest.mark.parametrize("scheduler", ["sequential", "greedy"])
@pytest.mark.parametrize("mode", ["stage", "dependency"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_issued_program_has_one_kernel_per_unit(small_squeezenet, scheduler, mode, cuda_graph):
    from tvm_interop.passes.schedulers import schedule_graph

    program = small_squeezenet
    graph = program.graph
    sched = schedule_graph(graph, scheduler, "sim:h100")
    prog = issued_program(program, sched, mode=mode, cuda_graph=cuda_graph)
    s = prog.summary()
    assert s["kernels"] == len(graph.units)
    body = [k for k in prog.kernels() if k not in prog.copy_bytes]
    assert sorted(body) == sorted(u.name for u in graph.units)
    if cuda_graph:
        assert s["copies"] == len(program.input_infos) + len(program.output_refs())
    else:
        assert s["copies"] == 0
    if scheduler == "sequential":
        assert s["syncs"] == 0
    elif sched.max_concurrency() > 1:
        assert s["syncs"] > 0 and s["streams"] >= 2
    # the model predicts it, from a mapping of isolated latencies
    model = ProgramCostModel({u.name: 10 * US for u in graph.units}, quiet(host_kernel=5 * US, kernel_min=1 * US))
    t = model.simulate(program, sched, mode, cuda_graph)
    assert math.isfinite(t.latency) and t.latency > 10 * US
    if scheduler == "sequential" and not cuda_graph:   # device-bound chain: first issue + every kernel
        assert t.latency == pytest.approx(5 * US + len(graph.units) * 10 * US)


def test_unit_inputs_refuse_a_missing_unit(small_squeezenet):
    graph = small_squeezenet.graph
    model = ProgramCostModel({}, quiet())
    with pytest.raises(InteropError, match="no isolated latency"):
        model.unit_inputs(graph)


# ---------------------------------------------------------------------------------------------- shipped fit
def test_shipped_fit_loads():
    p = load_fitted()
    v = p.values()
    assert all(math.isfinite(x) for x in v.values())
    assert all(x >= 0 for k, x in v.items() if k not in ("kernel_offset", "program_offset"))
    assert -5 * US < p.program_offset < 5 * US
    assert 0.5 < p.kernel_scale < 2.0
    assert 0.7 < p.program_scale < 1.6
    assert p.interference == FIXED_INTERFERENCE
    assert set(DEFAULT_PRIORS) <= set(DEFAULT_FIT)
    assert 1 * US < p.host_kernel < 20 * US
    # the shipped file comes from the current fitter: the parameters it fixes have the fixed values
    for k, x in FIXED_AT.items():
        assert v[k] == pytest.approx(x), k
    assert set(DEFAULT_FIT).isdisjoint(FIXED_AT)
    assert p.meta.get("fitted_on")


def test_transfer_reads_the_wait_placement_of_a_build_of_both():
    """``scripts/gpu_cost_transfer.py`` predicts a run's unsuffixed dependency-mode variants with the build's
    first wait placement: a build of both (``waits: "stage-start,consumer"``, whose consumer twins carry a suffix)
    predicts exactly what a stage-start-only build does, and differently from the consumer placement (the H100
    SqueezeNet of 2026-11-26 and its unit table, shipped in docs/)."""
    import copy
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "scripts"))
    try:
        import gpu_cost_transfer
    finally:
        sys.path.pop(0)
    with open(os.path.join(root, "docs", "gpu_check.json"), encoding="utf-8") as f:
        run = json.load(f)
    run["models"] = [m for m in run["models"] if m["name"] == "squeezenet"]
    units = os.path.join(root, "docs", "unit_costs_h100_2026-11-26")

    def predictions(waits: str) -> dict:
        r = copy.deepcopy(run)
        r["build"]["waits"] = waits
        return {row["variant"]: row["predicted_ms"] for row in gpu_cost_transfer.transfer_rows(r, units)}

    both, start, consumer = predictions("stage-start,consumer"), predictions("stage-start"), predictions("consumer")
    assert both == start and len(both) >= 8
    assert any(both[v] != consumer[v] for v in both if "(dependency)" in v)


def test_transfer_on_the_device_clock_reads_the_held_stream_unit_times(tmp_path, capsys):
    """``gpu_cost_transfer.py --clock device``: each unit's device-clock latency from the table's single-unit stages
    (read by the product's ``TableCostModel``), as latencies that are not timings; a table measured without the
    device clock is refused naming it, and so is a table whose units lack a time (the H200 RandWire unit table of
    the active search of 2026-11-27, shipped in docs/)."""
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "scripts"))
    try:
        import gpu_cost_transfer
    finally:
        sys.path.pop(0)
    path = os.path.join(root, "docs", "unit_costs_h200_2026-11-27_active", "randwire.json")
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    issue, n_issue = gpu_cost_transfer.unit_latencies(path, "issue")
    device, n_device = gpu_cost_transfer.unit_latencies(path, "device")
    assert (n_issue, n_device) == (table["number"], 0) and set(issue) == set(device) == set(table["units"])
    assert issue == table["units"]
    one = next(st for st in table["stages"] if len(st["groups"]) == 1 and len(st["groups"][0]) == 1)
    assert device[one["groups"][0][0]] == one["device_latency"]
    # RandWire's tiny kernels: the issue clock times the host's launch rate, the device clock the kernels
    assert sum(device.values()) < 0.8 * sum(issue.values())

    def write(name: str, t: dict) -> str:
        out = tmp_path / name
        out.write_text(json.dumps(t), encoding="utf-8")
        return str(out)

    bare = write("bare.json", {k: v for k, v in table.items() if k != "device_clock"})
    with pytest.raises(SystemExit, match="bare.json has no device-clock times"):
        gpu_cost_transfer.unit_latencies(bare, "device")
    rows = [st for st in table["stages"] if not (len(st["groups"]) == 1 and len(st["groups"][0]) == 1)]
    no_units = write("no_units.json", dict(table, stages=rows))
    with pytest.raises(SystemExit, match="randwire table has no device-clock time for 276 of its 276 units"):
        gpu_cost_transfer.unit_latencies(no_units, "device")
    # a unit the device clock could not time: priced at its issue time, as the product does, and said
    stages = [dict(st, device_latency=None) if st is one else st for st in table["stages"]]
    partial, _ = gpu_cost_transfer.unit_latencies(write("partial.json", dict(table, stages=stages)), "device")
    assert partial[one["groups"][0][0]] == one["latency"]
    assert "1 rows of" in capsys.readouterr().err
