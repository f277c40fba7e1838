"""In-context stage timing (issue 12, "costs that compose"): a stage-mode CUDA program lowered with
``stage_timing=True`` records a timing event on the caller's stream when each stage begins and after the last, so
the device measures what every stage costs inside the program. Without a GPU: the IR the build compiles records
exactly one event per stage boundary, right before the stage's first kernel and after everything of the stage
before it (its join included); the pool is created, read and freed once; bad requests are refused by name."""
from __future__ import annotations

import pytest

import tvm_interop
from tvm_interop.models import get_model, small_config
from tvm_interop.passes.as_built import as_built_ir
from tvm_interop.passes.lower_streams import TIMING_CREATE, TIMING_FREE, TIMING_READ, TIMING_RECORD, lower_program
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.stream_memory import check_stream_memory_safety
from tvm_interop.runtime.cuda import FREE_STREAMS_FUNC, MAIN_FUNC, STAGE_TIMES_FUNC, STREAMS_FUNC
from tvm_interop.runtime.errors import InteropError

from issued_ops import extern_calls, issued_ops

CUDA = {"kind": "cuda", "arch": "sm_90"}


@pytest.fixture(scope="module")
def googlenet():
    program = tvm_interop.api.prepare_program(get_model("googlenet", **small_config("googlenet")), CUDA,
                                              name="googlenet")
    return program, schedule_graph(program.graph, "greedy", "sim:h100")


@pytest.mark.parametrize("sync", ["tvm", "events"])
def test_the_build_records_one_event_per_stage_boundary(googlenet, sync):
    """Checked on the IR the CUDA build compiles (``passes.as_built``): event k is recorded right before stage
    k's first op, after every op of stage k - 1 (its join into the caller's stream included), and event
    ``num_stages`` after the last stage; so consecutive events span exactly one stage each."""
    program, sched = googlenet
    low = lower_program(program, sched, CUDA, mode="stage", sync=sync, stage_timing=True)
    plain = lower_program(program, sched, CUDA, mode="stage", sync=sync)
    assert low.stage_timing and low.stage_times_function == STAGE_TIMES_FUNC
    n = sched.num_stages
    g = program.graph
    kernels = {u.func_name for u in g.units}
    built = as_built_ir(low.mod, CUDA, graph_funcs=())
    issued = issued_ops(built[MAIN_FUNC], kernels)
    assert [x for x in issued if x[0] != "timed"] == issued_ops(as_built_ir(plain.mod, CUDA, graph_funcs=())[MAIN_FUNC],
                                                             kernels)   # nothing else changed
    assert [x[1] for x in issued if x[0] == "timed"] == list(range(n + 1))
    # between records k and k + 1: exactly stage k's kernels, forks, switches and joins (the i-th issued op is
    # matched with the i-th planned one: several units may share one kernel function)
    planned = [(("kernel", g.unit(o.unit).func_name) if o.kind == "unit" else (o.kind,), o.stage)
               for o in low.programs[MAIN_FUNC].ops if o.kind in ("unit", "sync", "set")]
    current, i = -1, 0
    for x in issued:
        if x[0] == "timed":
            current = x[1]
        else:
            assert planned[i] == (x, current), f"op {i} {x} of stage {planned[i][1]} issued in stage {current}"
            i += 1
    assert i == len(planned) and sum(p[0][0] == "kernel" for p in planned) == len(g.units)
    assert any(p[0] == ("sync",) for p in planned)   # the schedule has joins, so the check above covered them
    assert issued[-1] == ("timed", n)   # the last record comes after the last stage's join
    pools = extern_calls(low.mod[STREAMS_FUNC], TIMING_CREATE)
    assert len(pools) == 1 and int(pools[0].args[1].value) == n + 1
    assert len(extern_calls(low.mod[FREE_STREAMS_FUNC], TIMING_FREE)) == 1
    reads = extern_calls(low.mod[STAGE_TIMES_FUNC], TIMING_READ)
    assert len(reads) == 1 and int(reads[0].args[1].value) == n + 1
    report = check_stream_memory_safety(built)
    assert report.ok, report.summary()


def test_a_sequential_schedule_is_timed_on_the_callers_stream():
    program = tvm_interop.api.prepare_program(get_model("squeezenet", **small_config("squeezenet")), CUDA,
                                              name="squeezenet")
    sched = schedule_graph(program.graph, "sequential", "sim:h100")
    low = lower_program(program, sched, CUDA, mode="stage", stage_timing=True)
    assert low.num_streams == 0
    records = extern_calls(low.mod[MAIN_FUNC], TIMING_RECORD)
    assert [int(c.args[1].value) for c in records] == list(range(sched.num_stages + 1))


@pytest.mark.parametrize("target,kw,why", [
    ("llvm", {}, "it times with CUDA events"),
    (CUDA, {"mode": "dependency"}, "in dependency mode stages overlap"),
    (CUDA, {"cuda_graph": True}, "inside a captured graph"),
])
def test_stage_timing_is_refused_where_it_cannot_measure(googlenet, target, kw, why):
    program, sched = googlenet
    with pytest.raises(InteropError, match=why):
        lower_program(program, sched, target, stage_timing=True, **kw)


# ---- in-context costs into a cost table (passes.cost.in_context) -------------------------------------------------

def test_in_context_costs_replace_isolated_ones_and_compose(tmp_path):
    """A table merged with a timed program's stages (illustrative times, on the real H100 unit table of SqueezeNet
    and a real schedule of it) prices exactly that program at the sum of its in-context stage times, keeps the
    isolated cost beside each replaced one, and adds the stages the bundle never timed alone."""
    import json
    import os

    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.cost.in_context import merge_in_context
    from tvm_interop.passes.lower_streams import stage_groups

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "docs", "unit_costs_h100_2026-11-26", "squeezenet.json")
    table = json.load(open(path))
    program = tvm_interop.api.prepare_program(get_model("squeezenet"), CUDA, name="squeezenet")
    sched = schedule_graph(program.graph, "greedy", "sim:h100")
    stages = [stage_groups(st) for st in sched.stages]
    times = [0.004 + 0.001 * k for k in range(len(stages))]   # ms, made up
    merged = merge_in_context(table, [{"name": "greedy", "stages": stages, "stages_ms": times},
                                      {"name": "again", "stages": stages[:1], "stages_ms": [0.010]}], source="t")
    assert merged["in_context"]["programs"] == 2 and merged["graph_fingerprint"] == table["graph_fingerprint"]
    from tvm_interop.runtime.profile_bundle import stage_key

    first = next(s for s in merged["stages"] if s["key"] == stage_key(stages[0]))
    assert first["latency"] == pytest.approx((0.004 + 0.010) / 2 * 1e-3) and first["in_context_samples"] == 2
    out = tmp_path / "costs.json"
    out.write_text(json.dumps(merged))
    cost = get_cost_model(f"table:{out};fallback=error")
    units = {u.name: u for u in program.graph.units}
    priced = [cost.stage_latency([[units[u] for u in g] for g in groups]) for groups in stages]
    assert sum(priced) == pytest.approx(((0.004 + 0.010) / 2 + sum(times[1:])) * 1e-3)
    assert cost.misses == 0   # every stage of the program was answered by the table
    seen = [s for s in merged["stages"] if "in-context" in s["sources"]]
    assert len(seen) == len({tuple(sorted("|".join(g) for g in st)) for st in stages})
    assert all("isolated_latency" in s for s in seen if s["index"] < len(table["stages"]))


def test_in_context_costs_of_another_model_are_refused():
    import json
    import os

    from tvm_interop.passes.cost.in_context import merge_in_context

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    table = json.load(open(os.path.join(here, "docs", "unit_costs_h100_2026-11-26", "squeezenet.json")))
    with pytest.raises(InteropError, match="does not have: another model"):
        merge_in_context(table, [{"name": "x", "stages": [[["not_a_unit"]]], "stages_ms": [0.01]}])
    with pytest.raises(InteropError, match="2 stages but 1 stage times"):
        merge_in_context(table, [{"name": "x", "stages": [[["lv"]], [["lv3"]]], "stages_ms": [0.01]}])
    with pytest.raises(InteropError, match="not a tvm-interop cost table"):
        merge_in_context({"format": "other"}, [])


def test_in_context_table_script(tmp_path, capsys):
    """``scripts/in_context_table.py`` on a gpu_check result (illustrative in-context times for two of the real
    unit table's stages): writes the merged table, prints measured / in-context / isolated per timed program, and
    leaves out a variant whose timing failed."""
    import json
    import os
    import sys

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(here, "scripts"))
    import in_context_table

    table = os.path.join(here, "docs", "unit_costs_h100_2026-11-26", "squeezenet.json")
    stages = [[["lv"]], [["lv3"]]]
    result = {"models": [{"name": "squeezenet", "variants": [
        {"name": "sequential", "median_ms": 0.03, "in_context": {"stages": stages, "stages_ms": [0.012, 0.007],
                                                                  "sum_ms": 0.019, "ok": True}},
        {"name": "greedy", "median_ms": 0.03, "in_context": {"error": "no GPU"}}]}]}
    (tmp_path / "r.json").write_text(json.dumps(result))
    out = tmp_path / "c.json"
    assert in_context_table.main([str(tmp_path / "r.json"), table, "--model", "squeezenet", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    iso = {s["key"]: s["latency"] for s in json.load(open(table))["stages"]}
    assert f"{(iso['concurrent:lv'] + iso['concurrent:lv3']) * 1e3:9.3f}" in text and "greedy" not in text
    merged = json.load(open(out))
    ratio = sorted([0.012e-3 / iso["concurrent:lv"], 0.007e-3 / iso["concurrent:lv3"]])
    scale = (ratio[0] + ratio[1]) / 2   # the median of two
    assert merged["in_context"] == {"programs": 1, "stages": 2, "source": "r.json", "unseen_scale": pytest.approx(scale)}
    other = next(s for s in merged["stages"] if s["key"] == "concurrent:lv1")   # never timed in a program
    assert other["latency"] == pytest.approx(iso["concurrent:lv1"] * scale) and other["isolated_latency"] == iso[
        "concurrent:lv1"]
    units = json.load(open(table))["units"]
    assert merged["units"]["lv1"] == pytest.approx(units["lv1"] * scale)
    with pytest.raises(SystemExit, match="resnet50: not in the result"):
        in_context_table.main([str(tmp_path / "r.json"), table, "--model", "resnet50", "-o", str(out)])
