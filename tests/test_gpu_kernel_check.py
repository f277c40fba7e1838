"""scripts/gpu_kernel_check.py: the program model checked kernel by kernel against a run's kernel timelines."""
from __future__ import annotations

import json

import pytest
from scripts_under_test import load_script

kc = load_script("gpu_kernel_check")
BUILD = {"target": "cuda -arch=sm_90", "width": 0.25, "image_size": 64, "batch": 1, "cost": "sim:h100",
         "max_streams": 8, "waits": "stage-start"}


def test_kernels_belong_to_their_tvm_function_and_their_launches_are_summed():
    assert kc.kernel_func("fused_conv2d42_add14_kernel") == "fused_conv2d42_add14"
    assert kc.kernel_func("split_merged1_kernel_1") == "split_merged1"
    assert kc.kernel_func("Memcpy HtoD (Pageable -> Device)") is None
    us, calls = kc.func_times({"by_kernel": {"f_kernel": {"us": 10.0, "calls": 2.0},
                                             "f_kernel_1": {"us": 4.0, "calls": 2.0},
                                             "memcpy": {"us": 1.0, "calls": 1.0}}})
    assert us == {"f": 14.0} and calls == {"f": 2.0}   # two launches per call of f, called twice
    assert kc.split_variant("ios (dependency) + CUDA graph") == ("ios", "dependency", True)
    assert kc.split_variant("ios_s2") == ("ios_s2", "stage", False)


def test_the_order_of_programs_counts_only_pairs_the_device_told_apart():
    progs = [{"variant": "a", "measured_ms": 1.0, "predicted_ms": 2.0},
             {"variant": "b", "measured_ms": 2.0, "predicted_ms": 1.0},     # the model has a and b the wrong way
             {"variant": "c", "measured_ms": 2.04, "predicted_ms": 0.5},    # within 5 % of b: not ordered
             {"variant": "d", "measured_ms": 4.0, "predicted_ms": 3.0}]
    order = kc.program_order(progs)
    assert order["pairs"] == 5 and order["wrong"] == [["a", "b"], ["a", "c"]]


@pytest.fixture(scope="module")
def squeezenet_run():
    """A run of SqueezeNet (small) whose timelines are made up from known kernel times: every kernel 10 us a call
    alone (one function launched twice: 6 + 4 us), and in greedy's program one function measured twice as long."""
    from tvm_interop.passes.schedulers import schedule_graph

    program = kc._program({"build": BUILD}, "squeezenet")
    calls: dict[str, int] = {}
    for u in program.graph:
        calls[u.func_name or u.name] = calls.get(u.func_name or u.name, 0) + 1
    funcs = sorted(calls)
    split = funcs[0]
    ref = {}
    for f in funcs:
        if f == split:
            ref[f + "_kernel"] = {"us": 6.0 * calls[f], "calls": float(calls[f])}
            ref[f + "_kernel_1"] = {"us": 4.0 * calls[f], "calls": float(calls[f])}
        else:
            ref[f + "_kernel"] = {"us": 10.0 * calls[f], "calls": float(calls[f])}
    slow = max(funcs, key=lambda f: calls[f])
    other = next(f for f in funcs if f not in (slow, split))
    greedy_kernels = {k: dict(v) for k, v in ref.items()}
    greedy_kernels[slow + "_kernel"]["us"] *= 2
    # the last call's spans: `other` ran 5 us beside one instance of `slow`, `split`'s second launch 2 us
    greedy_spans = {"names": [slow + "_kernel", other + "_kernel", split + "_kernel_1"],
                    "items": [[0, 20, 0], [5, 5, 1], [18, 4, 2], [30, 20, 0], [60, 12, 1], [62, 6, 0]]}
    seq = schedule_graph(program.graph, "sequential", "sim:h100", model_name="squeezenet")
    greedy = schedule_graph(program.graph, "greedy", "sim:h100", model_name="squeezenet", max_streams=8)

    def variant(name, stages, median):
        return {"name": name, "stages": stages, "median_ms": median, "mode": "stage", "cuda_graph": True}

    entry = {"name": "squeezenet",
             "variants": [variant("sequential + CUDA graph", seq.num_stages, 0.5),
                          variant("greedy + CUDA graph", greedy.num_stages, 0.4),
                          variant("lios + CUDA graph", 3, 0.4), variant("foo + CUDA graph", 3, 0.4)],
             "timelines": {"sequential + CUDA graph": {"by_kernel": ref, "busy_us": 10.0 * len(program.graph)},
                           "greedy + CUDA graph": {"by_kernel": greedy_kernels, "busy_us": 300.0,
                                                   "spans": greedy_spans},
                           "lios + CUDA graph": {"by_kernel": ref}, "foo + CUDA graph": {"by_kernel": ref}}}
    return {"device": "test", "build": BUILD, "models": [entry]}, program, slow, split, other


def test_fed_the_reference_kernel_times_the_sequential_graph_is_exact(squeezenet_run):
    from tvm_interop.passes.cost.program import load_fitted

    run, program, slow, split, other = squeezenet_run
    m = kc.check_model(run, run["models"][0], load_fitted())
    progs = {p["variant"]: p for p in m["programs"]}
    seq = progs["sequential + CUDA graph"]
    assert seq["kernel_sum_simulated_us"] == pytest.approx(10.0 * len(program.graph))
    assert all(k["ratio"] == pytest.approx(1.0) for k in seq["kernels"])
    assert {k["kernel"]: k["reference_us"] for k in seq["kernels"]}[split] == pytest.approx(10.0 * sum(
        (u.func_name or u.name) == split for u in program.graph))
    g = {k["kernel"]: k for k in progs["greedy + CUDA graph"]["kernels"]}
    assert g[slow]["measured_us"] == pytest.approx(2 * g[slow]["reference_us"])
    assert g[slow]["ratio"] == pytest.approx(g[slow]["simulated_us"] / g[slow]["measured_us"])
    # who ran beside the kernels, measured from the spans (a function's second launch counts as the function) and
    # simulated; the sequential graph has no spans, so no neighbours
    near = progs["greedy + CUDA graph"]["neighbours"]
    assert near[slow]["measured"] == {other: 11, split: 2}   # 5 us beside one instance, 6 beside another
    assert all(us > 0 for us in near[slow]["simulated"].values()) and slow not in near[slow]["simulated"]
    assert seq["neighbours"] == {}
    # the one clean pair of the spans (60-72 us and 62-68 us: each beside only the other), against 10 us alone
    pairs = progs["greedy + CUDA graph"]["pairs"]
    assert [(p["kernel"], p["beside"], p["ratio"]) for p in pairs] == [
        (other + "_kernel", slow + "_kernel", pytest.approx(1.2)),
        (slow + "_kernel", other + "_kernel", pytest.approx(0.6))]
    kinds = {f: kc.kernel_kind(next(u for u in program.graph if (u.func_name or u.name) == f))
             for f in (slow, other)}
    summary = m["pair_summary"]
    assert sum(a["kernels"] for a in summary.values()) == 2
    assert summary[f"{kinds[slow]} beside {kinds[other]}"]["min"] == pytest.approx(0.6)
    # a schedule of another build, and a variant that is neither a scheduler nor given: named, not compared
    assert "stages rescheduled here" in m["skipped"]["lios + CUDA graph"]
    assert "--schedule squeezenet:foo=FILE" in m["skipped"]["foo + CUDA graph"]
    assert m["order"]["pairs"] == 1
    md = kc.render_markdown({"run": "r/gpu_check.json", "device": "test", "params": "p.json",
                             "summary": kc.summary([m]), "models": [m]})
    assert "| sequential + CUDA graph | 0.500 |" in md and "**greedy + CUDA graph**, the kernels" in md
    assert f"- beside `{slow}` (us per call): measured `{other}` 11, `{split}` 2; simulated" in md
    assert "| kernel kind beside | kernels | median | min | max |" in md
    json.dumps(m)


def test_a_run_without_a_reference_timeline_is_skipped_with_the_reason():
    from tvm_interop.passes.cost.program import load_fitted

    entry = {"name": "squeezenet", "variants": [], "timelines": {"greedy + CUDA graph": {"by_kernel": {}}}}
    m = kc.check_model({"build": BUILD}, entry, load_fitted())
    assert m["skipped"] == "no per-kernel 'sequential + CUDA graph' timeline"


def test_the_cli_writes_both_reports_and_refuses_a_run_without_timelines(squeezenet_run, tmp_path, capsys):
    run, *_ = squeezenet_run
    path = tmp_path / "gpu_check.json"
    path.write_text(json.dumps(run))
    assert kc.main([str(path), "--out", str(tmp_path / "k")]) == 0
    assert "pairs ordered the other way round" in capsys.readouterr().out
    assert json.loads((tmp_path / "k.json").read_text())["summary"]["programs"] == 2
    assert (tmp_path / "k.md").read_text().startswith("# Program model, kernel by kernel")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"build": BUILD, "models": [{"name": "squeezenet", "variants": []}]}))
    assert kc.main([str(bare)]) == 1


def test_the_block_simulation_runs_beside_the_program_model_on_the_graph_programs(squeezenet_run):
    """``--block-sim``: every CUDA-graph program also simulated block by block from the lowered kernels' launch
    shapes; the sequential graph is its kernels one after another, each taking its reference time."""
    from tvm_interop.passes.cost.program import load_fitted

    run, program, *_ = squeezenet_run
    m = kc.check_model(run, run["models"][0], load_fitted(), block_sim=True)
    progs = {p["variant"]: p for p in m["programs"]}
    assert progs["sequential + CUDA graph"]["block_predicted_ms"] == pytest.approx(10e-3 * len(program.graph))
    assert progs["greedy + CUDA graph"]["block_predicted_ms"] > 0 and m["block_order"]["pairs"] == 1
    assert all(len(shape) == 2 for shape in m["launches"].values())
    s = kc.summary([m])
    assert s["block"]["programs"] == 2
    md = kc.render_markdown({"run": "r", "device": "test", "params": "p", "summary": s, "models": [m]})
    assert "The block simulation on 2 CUDA-graph programs" in md
