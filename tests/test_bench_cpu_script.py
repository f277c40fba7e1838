"""``scripts/bench_cpu.py`` refuses to present a speed-up of a program that computes something else: a row whose
output differs from plain TVM is flagged in the table and fails the run (it once printed RandWire rows off by
0.61 as 1.27x faster)."""
import numpy as np
from scripts_under_test import load_script


def _row(diff: float, match: bool) -> dict:
    return {"stages": 3, "max_groups": 2, "median_ms": 1.0, "iqr_ms": 0.1, "speedup_vs_sequential": 1.0,
            "speedup_vs_default_sequential": 1.0, "optimisation_s": 0.0, "measurements": None, "predicted_ms": None,
            "max_abs_diff": diff, "match": match, "search": {}, "sim_vs_measured": None}


def test_a_mismatching_row_is_flagged_and_named():
    bench = load_script("bench_cpu")
    results = [{"model": "randwire", "config": {"width": 0.5, "image_size": 112}, "tuning_db": None, "skipped": {},
                "rows": {"sequential": _row(0.61, False), "lios": _row(0.61, False)}},
               {"model": "squeezenet", "config": {"width": 1.0, "image_size": 112}, "tuning_db": None, "skipped": {},
                "rows": {"sequential": _row(1e-6, True)}}]
    assert bench.mismatches(results) == ["randwire/sequential", "randwire/lios"]
    md = bench.markdown(results, {"cpu": "x", "cores": 2, "ram_gib": 1, "tvm": "0", "python": "3"}, "cmd")
    assert md.count("**MISMATCH**") == 2
    assert bench.mismatches(results[1:]) == []


def test_the_wave_choice_is_reported_per_row(branchy_model):
    """Each ``+wave`` row says how many stages were priced and chosen, and whether the prices were timed together."""
    import tvm_interop
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.passes.wave import choose_wave_stages, fusable_stages
    from tvm_interop.passes.cost import get_cost_model

    bench = load_script("bench_cpu")
    program = tvm_interop.api.prepare_program(branchy_model, name="branchy")
    sched = schedule_graph(program.graph, "greedy", "sim:cpu")
    assert bench.wave_choice(sched) is None      # no wave fusion asked for
    choose_wave_stages(program.graph, sched, get_cost_model("sim:cpu"))
    choice = bench.wave_choice(sched)
    assert choice["fusable"] == len(fusable_stages(sched)) > 0 and choice["paired"] == 0
    assert choice["chosen"] == len(sched.options["wave_fusion"]["stages"])
    assert set(choice["reasons"]) == {str(i) for i in fusable_stages(sched)}


def test_scheduler_specs_name_the_fusion_and_where_the_groups_left_run():
    bench = load_script("bench_cpu")
    for spec in ("lios+wave", "lios+wave+inorder", "lios+wave+threads", "lios"):
        assert bench._base_spec(spec) == "lios" and bench._cost_of(spec) == ("lios", "measured")
    assert bench._cost_of("greedy+wave+threads") == ("greedy", "sim:cpu")
    assert bench._base_spec("ios:learned+wave+threads") == "ios:learned"


def test_fresh_process_timings_pair_each_ratio_within_its_process():
    """With ``--processes`` the speed-up is the median of each process's own ratio (both rows timed in one
    process), not the ratio of medians taken across processes; the process list is kept and printed."""
    bench = load_script("bench_cpu")
    ms = 1e-3
    runs = [{"sequential": [3 * ms] * 3, "lios+wave": [2 * ms] * 3},      # 1.5x, a quiet process
            {"sequential": [5 * ms] * 3, "lios+wave": [4.5 * ms] * 3},    # 1.11x, a slow one
            {"sequential": [3.2 * ms] * 3, "lios+wave": [2.5 * ms] * 3}]  # 1.28x
    times = {s: [t for r in runs for t in r[s]] for s in runs[0]}
    got = bench.summarize_times(times, runs)
    assert np.allclose(got["lios+wave"]["process_speedups"], [1.5, 5 / 4.5, 3.2 / 2.5])
    assert abs(got["lios+wave"]["speedup_vs_sequential"] - 3.2 / 2.5) < 1e-12
    assert abs(got["lios+wave"]["median_ms"] - 2.5) < 1e-9 and abs(got["sequential"]["median_ms"] - 3.2) < 1e-9
    assert got["sequential"]["speedup_vs_sequential"] == 1.0
    # in one process (no runs): the ratio of the medians, no per-process list
    one = bench.summarize_times({"sequential": [3 * ms], "lios+wave": [2 * ms]})
    assert one["lios+wave"]["speedup_vs_sequential"] == 1.5 and "process_speedups" not in one["lios+wave"]
    result = {"model": "m", "config": {"width": 0.5, "image_size": 112}, "tuning_db": None, "skipped": {},
              "timing": "3 fresh processes (exported libraries)",
              "rows": {s: dict(_row(0.0, True), **got[s]) for s in got}}
    md = bench.markdown([result], {"cpu": "x", "cores": 2, "ram_gib": 1, "tvm": "0", "python": "3"}, "cmd")
    assert "lios+wave 1.50x, 1.11x, 1.28x" in md and "3 fresh processes" in md


def test_libraries_are_timed_in_fresh_processes(tmp_path, branchy_model):
    """The libraries a user would load, each timed in a child process of its own run of the script."""
    import tvm_interop

    bench = load_script("bench_cpu")
    models = {s: tvm_interop.compile(branchy_model, scheduler=s, guard=False, name="branchy")
              for s in ("sequential", "greedy")}
    x = models["sequential"].random_inputs(0)
    ref = tvm_interop.run_reference(branchy_model, x)
    runs, diffs = bench.time_in_fresh_processes(models, x, repeat=3, settle=0, processes=2, workdir=str(tmp_path),
                                                reference=ref)
    # each child ran the library it loaded against plain TVM's output; a wrong reference is caught
    assert all(d[s]["match"] and d[s]["max_abs_diff"] <= 1e-4 for d in diffs for s in models)
    _, wrong = bench.time_in_fresh_processes(models, x, repeat=1, settle=0, processes=1, workdir=str(tmp_path),
                                             reference=np.asarray(ref) + 1.0)
    assert not any(wrong[0][s]["match"] for s in models)
    assert len(runs) == 2 and all(set(r) == {"sequential", "greedy"} and len(r["greedy"]) == 3 for r in runs)
    assert all(t > 0 for r in runs for v in r.values() for t in v)
    assert (tmp_path / "greedy.so").exists() and (tmp_path / "sequential.so").exists()
    for cm in models.values():
        cm.close()
