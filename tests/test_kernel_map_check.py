"""scripts/kernel_map_check.py: the program model's isolated -> in-program kernel map checked kernel by kernel."""
from __future__ import annotations

import pytest
from scripts_under_test import load_script

km = load_script("kernel_map_check")
US = 1e-6


def test_kernels_pair_by_function_and_only_with_matching_call_counts():
    timeline = {"by_kernel": {"f_kernel": {"us": 30.0, "calls": 2.0},       # f: 2 units, called twice: 15 us each
                              "g_kernel": {"us": 8.0, "calls": 2.0},        # g: one unit, two calls: another graph
                              "f_kernel_1": {"us": 10.0, "calls": 2.0}}}    # f's second launch counts to f
    units = {"a": 10 * US, "b": 12 * US, "c": 4 * US, "d": 7 * US}
    func_of = {"a": "f", "b": "f", "c": "g", "d": "h"}                     # h never ran in the timeline
    rows = km.pair_kernels(timeline, units, func_of, {"a": "conv", "b": "conv", "c": "pool", "d": "pool"},
                           {"a": True, "b": True})
    assert rows == [{"func": "f", "kind": "conv", "deep": True, "calls": 2, "isolated_us": pytest.approx(11.0),
                     "in_program_us": pytest.approx(20.0)}]


def test_the_affine_fit_recovers_a_known_map_and_kinds_sum_per_call():
    rows = [{"func": f"k{i}", "kind": "long" if i > 2 else "short", "calls": 1 + i % 2, "isolated_us": x,
             "in_program_us": 1.3 * x - 2.0} for i, x in enumerate((5.0, 8.0, 20.0, 60.0, 150.0))]
    a, b = km.fit_affine(rows)
    assert a == pytest.approx(1.3) and b == pytest.approx(-2.0)
    kinds = km.by_kind(rows)
    assert kinds["long"]["kernels"] == 1 + 2 and kinds["short"]["kernels"] == 1 + 2 + 1
    assert kinds["long"]["isolated_us"] == pytest.approx(60.0 * 2 + 150.0)
    assert kinds["short"]["ratio"] == pytest.approx((4.5 + 2 * 8.4 + 24.0) / (5.0 + 2 * 8.0 + 20.0))
    with pytest.raises(SystemExit, match="nothing to fit"):
        km.fit_affine(rows[:1])


def test_the_shipped_map_is_the_simulators_kernel_duration():
    from tvm_interop.passes.cost.program import ProgramCostParams

    p = ProgramCostParams(kernel_scale=1.1, kernel_offset=-1 * US, timing_floor=10 * US, program_scale=1.2,
                          program_offset=-2 * US, kernel_min=1 * US, fill_items=1e9)
    # 1.2 * (1.1 * (50 - 10 / 10) - 1) - 2 = 61.48 us; a tiny kernel stops at the floor 1.2 * kernel_min
    assert km.shipped_map_us(50.0, p, 10) == pytest.approx(61.48)
    assert km.shipped_map_us(1.5, p, 10) == pytest.approx(1.2)
    assert km.shipped_map_us(50.0, p, 0) == pytest.approx(1.2 * (1.1 * 50 - 1) - 2)
    # a deep convolution takes program_deep_factor on top of program_scale
    deep = p.replace(program_deep_factor=1.25)
    assert km.shipped_map_us(50.0, deep, 0, deep=True) == pytest.approx(1.5 * (1.1 * 50 - 1) - 2)
    assert km.shipped_map_us(50.0, deep, 0) == pytest.approx(1.2 * (1.1 * 50 - 1) - 2)


def test_a_run_without_the_reference_timeline_is_refused():
    run = {"models": [{"name": "squeezenet", "timelines": {"greedy + CUDA graph": {"by_kernel": {}}}}]}
    with pytest.raises(SystemExit, match="no 'sequential \\+ CUDA graph' kernel timeline for squeezenet"):
        km.check(run, "squeezenet", "unused.json")
