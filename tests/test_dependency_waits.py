"""Dependency mode's cross-stream waits: issued at the start of their stage, never ordering more than stage mode.

`Device_StreamSyncFromTo(src, dst)` records its event on ``src`` *when it is issued*: issued right before the group
that needs it (the builds before 2026-11-27), the event also waited for every group of the same stage queued on
``src`` after the producer, so the groups of a stage ran one after another (Inception-v3 ios on an H100: 6.38 ms in
dependency mode against 4.40 ms in stage mode). These tests check the ordering each placement guarantees, with the
vector clocks the keep-alive analysis uses, and what the fitted H100 program model predicts of it.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import tvm_interop
from tvm_interop.passes.lower_streams import WAIT_PLACEMENTS, lower_program, plan_streams, simulate
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.runtime.errors import InteropError

from issued_ops import issued_ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H100_UNITS = os.path.join(ROOT, "docs", "unit_costs_h100_2026-11-26", "inception_v3.json")


def ordered_before(sp) -> dict[str, set[str]]:
    """unit -> the units guaranteed complete when it starts (stream order and events), from the vector clocks."""
    issued = simulate(sp.ops)
    on_stream: dict[int, list[str]] = {}
    for name, it in sorted(issued.items(), key=lambda kv: kv[1].pos):
        on_stream.setdefault(it.stream, []).append(name)
    return {name: {u for s, k in it.vc.items() for u in on_stream.get(s, [])[:k]} for name, it in issued.items()}


def extra_orderings(program, schedule, n: int, waits: str) -> list[tuple[str, str]]:
    """Pairs (x, y): dependency mode makes y wait for x although stage mode does not."""
    stage = ordered_before(plan_streams(program, schedule, "stage", n, keep_alive=False))
    dep = ordered_before(plan_streams(program, schedule, "dependency", n, keep_alive=False, waits=waits))
    return [(x, y) for y, xs in dep.items() for x in sorted(xs - stage[y])]


def test_stage_start_waits_order_nothing_stage_mode_does_not():
    """Random DAGs x random schedules (a stream per group): every ordering dependency mode guarantees, stage
    mode guarantees too, so on the device dependency mode can only start a kernel earlier."""
    from tvm_interop.fuzz import random_model, random_schedule

    rng = np.random.default_rng(11)
    checked = 0
    for seed in range(8):
        mod, _ = random_model(seed)
        program = tvm_interop.api.prepare_program(mod, "llvm")
        for _ in range(4):
            sched = random_schedule(program.graph, rng)
            n = sched.max_concurrency()
            if n < 2:
                continue
            assert extra_orderings(program, sched, n, "stage-start") == [], f"seed {seed}"
            checked += 1
    assert checked >= 16


@pytest.fixture(scope="module")
def small_inception():
    from tvm_interop.models import get_model

    program = tvm_interop.api.prepare_program(get_model("inception_v3", width=0.125, image_size=75, depth=1),
                                              "llvm", name="inception_v3")
    return program, schedule_graph(program.graph, "ios", "sim:h100")


def test_consumer_waits_serialised_the_groups_of_a_stage(small_inception):
    """The builds before 2026-11-27: in an Inception block the first branch continues on the stream of the concat
    it reads, and the other branches' events, recorded after it was queued, waited for it."""
    program, sched = small_inception
    n = sched.max_concurrency()
    assert n >= 2
    extra = extra_orderings(program, sched, n, "consumer")
    assert extra, "the consumer placement should order groups of one stage"
    stage_of = {u: i for i, st in enumerate(sched.stages) for g in st.groups for u in g}
    assert any(stage_of[x] == stage_of[y] for x, y in extra)   # two groups of one stage, one after the other
    assert extra_orderings(program, sched, n, "stage-start") == []


def test_stage_start_is_the_default_and_recorded(small_inception):
    program, sched = small_inception
    low = lower_program(program, sched, "cuda -arch=sm_90", mode="dependency")
    assert low.waits == "stage-start" and WAIT_PLACEMENTS[0] == "stage-start"
    old = lower_program(program, sched, "cuda -arch=sm_90", mode="dependency", waits="consumer")
    assert old.waits == "consumer"
    # stage mode has one placement: the option changes nothing and is recorded as the default
    assert lower_program(program, sched, "cuda -arch=sm_90", waits="consumer").waits == "stage-start"
    with pytest.raises(InteropError, match="wait placement"):
        plan_streams(program, sched, "dependency", 2, waits="early")


@pytest.mark.skipif(not os.path.exists(H100_UNITS), reason="H100 unit table not in the checkout")
def test_program_model_prices_the_h100_inception_ios_dependency_program():
    """The fitted H100 model (held-out median 8 %) on the 2026-11-26 unit table: the measured slowdown of
    dependency mode is in the model, and the stage-start placement removes it."""
    from tvm_interop.models import get_model
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.cost.program import ProgramCostModel, load_fitted

    program = tvm_interop.api.prepare_program(get_model("inception_v3"), {"kind": "cuda", "arch": "sm_90"},
                                              name="inception_v3")
    sched = schedule_graph(program.graph, "ios", "sim:h100", model_name="inception_v3")
    model = ProgramCostModel(get_cost_model("table:" + H100_UNITS), load_fitted())
    stage = model.predict(program, sched, "stage")
    consumer = model.predict(program, sched, "dependency", waits="consumer")
    hoisted = model.predict(program, sched, "dependency")
    # measured on the H100 (2026-11-26): stage 4.404 ms, dependency (consumer waits) 6.382 ms
    assert consumer > 1.3 * stage
    assert hoisted <= 1.01 * stage


@pytest.mark.parametrize("waits", WAIT_PLACEMENTS)
def test_the_build_issues_the_planned_waits(small_inception, waits):
    """The IR the CUDA build compiles (its pipeline up to KillAfterLastUse, ``passes.as_built``) issues the
    planned syncs, stream switches and kernels in the planned order: the placement the tests above reason about
    is the one that ships."""
    from tvm_interop.passes.as_built import as_built_ir
    from tvm_interop.runtime.cuda import MAIN_FUNC

    program, sched = small_inception
    low = lower_program(program, sched, "cuda -arch=sm_90", mode="dependency", waits=waits)
    g = program.graph
    kernels = {u.func_name for u in g.units}
    planned = [("kernel", g.unit(o.unit).func_name) if o.kind == "unit" else (o.kind,)
               for o in low.programs[MAIN_FUNC].ops if o.kind in ("unit", "sync", "set")]
    assert sum(k[0] == "kernel" for k in planned) == len(g.units) and ("sync",) in planned
    built = as_built_ir(low.mod, "cuda -arch=sm_90", graph_funcs=())
    assert issued_ops(built[MAIN_FUNC], kernels) == planned
    other = "consumer" if waits == "stage-start" else "stage-start"
    other_ops = lower_program(program, sched, "cuda -arch=sm_90", mode="dependency", waits=other).programs[MAIN_FUNC]
    assert planned != [("kernel", g.unit(o.unit).func_name) if o.kind == "unit" else (o.kind,)
                       for o in other_ops.ops if o.kind in ("unit", "sync", "set")]   # the placements differ
