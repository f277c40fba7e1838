"""Bounds on what inter-operator concurrency can give, from each kernel's one-core and all-core times."""
from __future__ import annotations

import random

import pytest

from tvm_interop.passes.concurrency_bound import concurrency_bound
from tvm_interop.passes.graph import OpGraph, Unit
from tvm_interop.runtime.errors import InteropError


def _graph(n: int, edges) -> OpGraph:
    return OpGraph([Unit(f"u{i}", "conv2d") for i in range(n)], [(f"u{a}", f"u{b}") for a, b in edges])


def _times(values) -> dict:
    return {f"u{i}": v for i, v in enumerate(values)}


def test_a_chain_cannot_gain_from_concurrency():
    g = _graph(3, [(0, 1), (1, 2)])
    b = concurrency_bound(g, _times([1.8, 1.8, 1.8]), _times([1.0, 1.0, 1.0]), cores=2)
    assert b.sequential_s == pytest.approx(3.0)
    assert b.critical_path_s == pytest.approx(3.0)
    assert b.list_schedule_s == pytest.approx(3.0)
    assert b.speedup_bound == pytest.approx(1.0)


def test_independent_kernels_gain_what_their_cores_leave_idle():
    g = _graph(2, [])
    # each keeps two cores 5/6 busy: one per core, side by side, both finish in 1.0 instead of 1.2 in turn
    b = concurrency_bound(g, _times([1.0, 1.0]), _times([0.6, 0.6]), cores=2)
    assert b.list_schedule_s == pytest.approx(1.0)
    assert b.work_s == pytest.approx(1.0)
    assert b.list_speedup == pytest.approx(1.2)
    # kernels that fill both cores perfectly leave nothing to win
    full = concurrency_bound(g, _times([1.2, 1.2]), _times([0.6, 0.6]), cores=2)
    assert full.list_schedule_s == pytest.approx(1.2)
    assert full.speedup_bound == pytest.approx(1.0)


def test_a_kernel_faster_on_one_core_shortens_the_critical_path():
    g = _graph(2, [(0, 1)])
    b = concurrency_bound(g, _times([0.5, 0.5]), _times([1.0, 1.0]), cores=2)
    assert b.critical_path_s == pytest.approx(1.0)
    assert b.list_schedule_s == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(40))
def test_the_list_schedule_is_never_below_the_lower_bound_nor_above_one_core_in_turn(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 30)
    edges = [(a, b) for b in range(n) for a in range(b) if rng.random() < 0.15]
    cores = rng.choice([2, 3, 4, 8])
    tn = [rng.uniform(0.1, 3.0) for _ in range(n)]
    t1 = [t * rng.uniform(0.5, cores * 1.1) for t in tn]
    b = concurrency_bound(_graph(n, edges), _times(t1), _times(tn), cores)
    assert b.list_schedule_s >= b.lower_bound_s * (1 - 1e-12)
    assert b.list_schedule_s <= sum(max(a, c) for a, c in zip(t1, tn)) * (1 + 1e-12)
    assert b.lower_bound_s <= b.sequential_s * (1 + 1e-12)


def test_timings_of_another_model_are_refused_naming_the_units():
    g = _graph(3, [(0, 1)])
    with pytest.raises(InteropError, match=r"1 unit\(s\) without a time \['u2'\], 1 timed unit\(s\) not in the graph \['lv9'\]"):
        concurrency_bound(g, {"u0": 1.0, "u1": 1.0, "lv9": 1.0}, _times([1.0, 1.0, 1.0]), cores=2)
    with pytest.raises(InteropError, match="cores must be >= 1"):
        concurrency_bound(g, _times([1.0] * 3), _times([1.0] * 3), cores=0)


def test_the_script_times_every_kernel_on_one_core_and_on_all(tmp_path, capsys):
    """scripts/concurrency_bound.py on a small SqueezeNet: every kernel of the sequential program has both times,
    the sequential time is the sum of the all-core ones, and the bounds bracket the list schedule."""
    import json

    from scripts_under_test import load_script

    script = load_script("concurrency_bound")
    out = tmp_path / "bound"
    assert script.main(["--models", "squeezenet", "--width", "0.125", "--image-size", "32", "--cores", "2",
                        "--repeat", "2", "--warmup", "1", "--out", str(out)]) == 0
    (row,) = json.loads((tmp_path / "bound.json").read_text())["models"]
    assert f"| squeezenet | {row['units']} |" in capsys.readouterr().out
    kernels = row["kernels"]
    assert len(kernels) == row["units"] >= 26       # SqueezeNet's 26 convolutions at least
    assert all(k["one_core_us"] > 0 and k["all_cores_us"] > 0 for k in kernels)
    assert row["sequential_s"] == pytest.approx(sum(k["all_cores_us"] for k in kernels) * 1e-6)
    assert row["one_core_s"] == pytest.approx(sum(k["one_core_us"] for k in kernels) * 1e-6)
    assert row["lower_bound_s"] * (1 - 1e-9) <= row["list_schedule_s"] <= (row["sequential_s"] + row["one_core_s"])
