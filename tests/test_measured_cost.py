"""Measured cost model (real kernels, worker threads), its persistent cache, and the never-slower guard."""
import json
import multiprocessing as mp

import numpy as np
import pytest

import tvm_interop
from tvm_interop.passes.cost.cache import CostCache, CostCacheError
from tvm_interop.passes.cost.measured import MeasuredCostModel


@pytest.fixture(scope="module")
def program(branchy_model):
    return tvm_interop.api.prepare_program(branchy_model, name="branchy")


@pytest.fixture(scope="module")
def repacked_program():
    """A program whose NCHW convolutions get their weights repacked by the build: 32 channels fill whole vectors
    on this CPU (the 8 channels of ``branchy_model`` do not: those convolutions vectorise another axis)."""
    from conftest import make_branchy_model

    return tvm_interop.api.prepare_program(make_branchy_model(channels=32), name="branchy32", layout="nchw")


def test_measures_units_and_stages_and_caches(program, tmp_path):
    cache = tmp_path / "cc.json"
    cost = MeasuredCostModel(program, cache=cache, repeat=3)
    units = program.graph.units
    lat = [cost.unit_latency(u) for u in units]
    assert all(t > 0 for t in lat)
    convs = [u for u in units if u.kind == "conv2d"][:2]
    both = cost.stage_latency([[convs[0]], [convs[1]]])
    chain = cost.stage_latency([[convs[0], convs[1]]])
    assert both > 0 and chain > 0
    measured = cost.measurements
    assert measured >= len({u.func_name for u in units})
    assert cost.stage_latency([[convs[1]], [convs[0]]]) == both  # same stage, other order: memoised
    assert cost.measurements == measured
    cost.close()
    data = json.loads(cache.read_text())
    assert data["device"] == cost.device_fingerprint and len(data["entries"]) >= 3
    again = MeasuredCostModel(program, cache=cache, repeat=3)
    assert again.stage_latency([[convs[0]], [convs[1]]]) == both
    assert again.measurements == 0 and again.cache_hits == 1
    again.close()


def test_long_measurement_reports_progress(program, tmp_path, caplog):
    import logging

    cost = MeasuredCostModel(program, cache=tmp_path / "cc.json", repeat=2)
    cost.PROGRESS_SECONDS = 0.0  # report after every timing
    with caplog.at_level(logging.INFO, logger="tvm_interop.passes.cost.measured"):
        for u in program.graph.units[:3]:
            cost.unit_latency(u)
    cost.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "tvm_interop.passes.cost.measured"]
    assert lines and "stages timed in" in lines[-1]


def test_foreign_cache_is_refused(tmp_path):
    p = tmp_path / "cc.json"
    p.write_text(json.dumps({"format": "tvm-interop-cost-cache", "version": 1, "device": "cpu:Other CPU:64cores",
                             "tvm_version": "0.27.0.post1", "entries": {"k": 1.0}}))
    with pytest.raises(CostCacheError, match="measured on 'cpu:Other CPU:64cores'"):
        CostCache(p, device="cpu:This:2cores", tvm_version="0.27.0.post1")
    p.write_text(json.dumps({"format": "tvm-interop-cost-cache", "version": 1, "device": "d",
                             "tvm_version": "0.1", "entries": {}}))
    with pytest.raises(CostCacheError, match="TVM 0.1"):
        CostCache(p, device="d", tvm_version="0.27.0.post1")


def test_corrupt_cache_is_reported_and_rebuilt(tmp_path, caplog):
    p = tmp_path / "cc.json"
    p.write_text('{"format": "tvm-interop-cost-cache", "entr')
    c = CostCache(p, device="d", tvm_version="v")
    assert c.entries == {} and "corrupt" in c.rebuilt_reason
    assert any("corrupt" in r.message for r in caplog.records)
    c.put("a", 1.5)
    c.flush()
    assert CostCache(p, device="d", tvm_version="v").get("a") == 1.5


def _writer(path, prefix, n):
    c = CostCache(path, device="d", tvm_version="v")
    for i in range(n):
        c.put(f"{prefix}{i}", float(i))
        if i % 7 == 0:
            c.flush()
    c.flush()


def test_concurrent_writers_merge(tmp_path):
    p = str(tmp_path / "cc.json")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(p, f"w{k}-", 50)) for k in range(2)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(60)
        assert pr.exitcode == 0
    c = CostCache(p, device="d", tvm_version="v")
    assert len(c.entries) == 100


def test_compile_with_measured_cost_and_guard(branchy_model, branchy_input, branchy_reference, tmp_path):
    cm = tvm_interop.compile(branchy_model, scheduler="greedy", cost="measured", cost_cache=tmp_path / "cc.json",
                             guard_repeat=5)
    assert cm.guard is not None and cm.guard.repeat == 5
    assert cm.guard.scheduled_ms > 0 and cm.guard.sequential_ms > 0
    # whichever schedule shipped, it is the one the guard kept, and it computes the same numbers
    assert cm.schedule.scheduler == ("greedy" if cm.guard.keep_schedule else "sequential")
    np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, rtol=1e-4, atol=1e-4)
    cm.close()


def test_guard_ships_the_faster_median():
    from tvm_interop.passes.guard import decide

    seq = [10.0, 10.5, 11.0, 12.0, 9.5]
    slower_within_noise = decide({"scheduled": [x * 1.03 for x in seq], "sequential": seq})
    assert not slower_within_noise.keep_schedule and slower_within_noise.noise > 0.03
    faster = decide({"scheduled": [x * 0.97 for x in seq], "sequential": seq})
    assert faster.keep_schedule and faster.scheduled_ms < faster.sequential_ms
    assert decide({"scheduled": seq, "sequential": seq}).keep_schedule  # a tie keeps the schedule


def test_times_the_kernels_that_ship(repacked_program, tmp_path):
    """Convolutions whose weight the build repacks (passes.kernels.prepack) are timed as they ship: the compute
    part, fed a weight of the repacked shape; the cache key hashes that kernel, so an entry timed with the
    in-kernel repack (the prepared kernel's hash) is not reused."""
    from tvm_interop.passes.cost.measured import _structural_hash
    from tvm_interop.passes.kernels.prepack import prepack_weights, shipped_kernels

    cost = MeasuredCostModel(repacked_program, cache=tmp_path / "cc.json", repeat=2)
    shipped = cost.shipped()
    assert shipped and set(shipped) == set(shipped_kernels(repacked_program))
    # exactly the kernels the build replaces, with the same compute part and repacked weight shape
    built = prepack_weights(repacked_program, "llvm")
    for name, sk in shipped.items():
        assert built.mod[name].attrs["tvm_interop.prepacked"]
        assert [tuple(int(d) for d in p.shape) for p in built.mod[name].params][sk.pos] == sk.shape
    unit = next(u for u in repacked_program.graph.units if u.func_name in shipped)
    sk = shipped[unit.func_name]
    call = cost._call(unit)
    assert call.args[sk.pos][0] == sk.shape and len(sk.shape) == 5            # O/16 I H W 16
    assert tuple(unit.inputs[sk.pos].shape) != sk.shape
    # the hash in the cache key is the compute kernel's, not the prepared kernel's (with its repack)
    assert cost._kernel_hash(unit.func_name) == f"{_structural_hash(sk.compute) & 0xFFFFFFFFFFFF:012x}"
    old_hash = f"{_structural_hash(repacked_program.mod[unit.func_name]) & 0xFFFFFFFFFFFF:012x}"
    assert cost._kernel_hash(unit.func_name) != old_hash
    # the timed library holds the compute kernel: it takes the repacked weight (TVM checks argument shapes)
    assert cost.unit_latency(unit) > 0 and cost.measurements == 1
    cost.close()
    # an entry keyed with the old hash (timed with the in-kernel repack) is not a hit
    shapes = ";".join(f"{'x'.join(map(str, t.shape))}{t.dtype}" for t in unit.inputs + unit.outputs)
    stale = CostCache(tmp_path / "old.json", device=cost.device_fingerprint, tvm_version=cost.cache.tvm_version)
    stale.put(f"concurrent|{old_hash}[{shapes}]|bNone", 1e-9)
    stale.flush()
    again = MeasuredCostModel(repacked_program, cache=tmp_path / "old.json", repeat=2)
    assert again.unit_latency(unit) > 1e-9 and again.measurements == 1 and again.cache_hits == 0
    again.close()


def test_wave_stage_is_built_from_the_repacked_program(repacked_program, tmp_path):
    """A wave-fused stage is timed as passes.wave builds it on a CPU: from the program whose weights the build
    repacked (its member kernels are the compute parts)."""
    cost = MeasuredCostModel(repacked_program, cache=tmp_path / "cc.json", repeat=2)
    convs = [u for u in repacked_program.graph.units if u.func_name in cost.shipped()][:2]
    assert len(convs) == 2
    assert cost.stage_latency([[convs[0]], [convs[1]]], strategy="wave") > 0
    src = cost._wave_source()
    assert src is not repacked_program
    assert all(src.mod[u.func_name].attrs["tvm_interop.prepacked"] for u in convs)
    cost.close()


def test_wave_comparison_times_the_three_forms_together_and_caches_them(repacked_program, tmp_path):
    """Wave fusion's choice on a timed cost model: the fused stage, the stage as scheduled and its groups in order,
    timed in one interleaved measurement (their host phase the same), cached as one."""
    cost = MeasuredCostModel(repacked_program, cache=tmp_path / "cc.json", repeat=3)
    convs = [u for u in repacked_program.graph.units if u.func_name in cost.shipped()][:2]
    v = cost.wave_comparison([[convs[0]], [convs[1]]], "concurrent")
    assert set(v) == {"wave", "concurrent", "in_order"} and all(x > 0 for x in v.values())
    assert cost.measurements == 3
    cost.close()
    again = MeasuredCostModel(repacked_program, cache=tmp_path / "cc.json", repeat=3)
    assert again.wave_comparison([[convs[0]], [convs[1]]], "concurrent") == v
    assert again.measurements == 0 and again.cache_hits == 1
    # the unpaired price of the fused stage is another entry: timed on its own
    assert again.stage_latency([[convs[0]], [convs[1]]], strategy="wave") > 0 and again.measurements == 1
    again.close()


def test_time_stages_interleaves_the_forms(program):
    """Each form runs once per round (so a slow phase of the host hits every form alike) and gets its own median:
    a chain of four convolutions takes longer than one."""
    from tvm_interop.runtime.model import kernel_library, lookup_kernel
    from tvm_interop.runtime.stage_timer import StageTimer

    cost = MeasuredCostModel(program, use_cache=False, repeat=3)
    units = program.graph.units
    conv = next(u for u in units if u.kind == "conv2d")
    other = next(u for u in units if u.func_name != conv.func_name)
    lib = kernel_library(cost._build_shipped_kernels())
    order = []

    def lookup(name):
        f = lookup_kernel(lib, name)

        def traced(*args):
            order.append(name)
            return f(*args)
        return traced

    timer = StageTimer(lookup, warmup=0, repeat=4)
    c, o = cost._call(conv), cost._call(other)
    one, four, alone = timer.time_stages([[[c]], [[c, c, c, c]], [[o]]])
    assert order == ([conv.func_name] * 5 + [other.func_name]) * 4
    assert 0 < one < four and alone > 0 and timer.measurements == 3
    order.clear()
    timer.time_stages([[[c]], [[o]]], repeat=6)      # more rounds than the timer's default
    timer.close()
    assert order == [conv.func_name, other.func_name] * 6
    cost.close()


def test_wave_choice_on_measured_costs_beats_both_unfused_forms(program, tmp_path):
    """With a timed cost model, a stage is fused only when the fused kernel beat the stage as scheduled *and* its
    groups in order, all three timed together; the decision records the three."""
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.passes.wave import choose_wave_stages, fusable_stages

    sched = schedule_graph(program.graph, "greedy", "sim:cpu")
    assert fusable_stages(sched)
    cost = MeasuredCostModel(program, cache=tmp_path / "cc.json", repeat=3)
    choose_wave_stages(program.graph, sched, cost)
    cost.close()
    wf = sched.options["wave_fusion"]
    assert len(wf["decisions"]) == len(fusable_stages(sched))
    for d in wf["decisions"]:
        assert d["paired"] and d["in_order_s"] > 0 and d["scheduled_s"] > 0 and d["fused_s"] > 0
        wins = d["fused_s"] < min(d["scheduled_s"], d["in_order_s"])
        assert (d["stage"] in wf["stages"]) == wins, d


def test_learned_cost_takes_the_wave_choice_from_its_measurements(repacked_program, tmp_path):
    """ios:learned + wave: the fusion choice is the measuring model's paired timing, not a prediction."""
    from tvm_interop.passes.cost.learned import LearnedCostModel

    measured = MeasuredCostModel(repacked_program, cache=tmp_path / "cc.json", repeat=3)
    learned = LearnedCostModel(measured, repacked_program.graph)
    convs = [u for u in repacked_program.graph.units if u.func_name in measured.shipped()][:2]
    v = learned.wave_comparison([[convs[0]], [convs[1]]], "concurrent")
    assert set(v) == {"wave", "concurrent", "in_order"} and measured.measurements == 3
    assert learned.predictions == 0
    learned.close()
