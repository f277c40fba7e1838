"""scripts/pair_probe.py: a schedule of single kernels and chosen pairs, the controlled experiment on sharing."""
from __future__ import annotations

import pytest
from scripts_under_test import load_script

pp = load_script("pair_probe")


def test_kernel_kinds_for_pairing():
    from tvm_interop.passes.graph import Unit

    def conv(cin_per_group, k):
        return Unit(name="c", kind="conv2d", attrs={"weight_shape": [64, cin_per_group, k, k]})

    assert pp.pair_kind(conv(2048, 1)) == "deep_1x1" and pp.pair_kind(conv(672, 1)) == "shallow_1x1"
    assert pp.pair_kind(conv(1, 3)) == "depthwise" and pp.pair_kind(conv(64, 3)) == "spatial"
    assert pp.pair_kind(Unit(name="p", kind="avg_pool2d")) == "pool"
    assert pp.pair_kind(Unit(name="r", kind="relu")) == "other"


@pytest.fixture(scope="module")
def squeezenet():
    from tvm_interop.api import prepare_program
    from tvm_interop.models import get_model
    from tvm_interop.passes.schedulers import schedule_graph

    program = prepare_program(get_model("squeezenet", image_size=32, width=0.125), "llvm", name="squeezenet")
    base = schedule_graph(program.graph, "greedy", "sim:h100", model_name="squeezenet", max_streams=8)
    return program.graph, base


def test_pairs_are_kernels_the_base_schedule_ran_together_and_the_rest_run_alone(squeezenet):
    graph, base = squeezenet
    probe = pp.probe_schedule(graph, base, "squeezenet", per_kind=2)   # validated against the graph inside
    stage_of = {u: i for i, st in enumerate(base.stages) for u in st.units}
    group_of = {u: (i, g) for i, st in enumerate(base.stages) for g, grp in enumerate(st.groups) for u in grp}
    pairs = [st for st in probe.stages if len(st.groups) == 2]
    assert pairs and all(len(g) == 1 for st in probe.stages for g in st.groups)
    for st in pairs:
        a, b = st.units
        assert stage_of[a] == stage_of[b] and group_of[a] != group_of[b]
    made = probe.options["pairs"]
    assert sum(made.values()) == len(pairs) and max(made.values()) <= 2 and probe.options["base"] == base.scheduler
    assert sorted(probe.unit_order()) == sorted(u.name for u in graph.units)


def test_the_cli_writes_a_schedule_gpu_check_build_takes(tmp_path, capsys):
    from tvm_interop.passes.schedule import Schedule

    out = tmp_path / "pairs.json"
    assert pp.main(["squeezenet", "-o", str(out), "--width", "0.125", "--image-size", "32", "--base", "greedy"]) == 0
    assert "pairs in" in capsys.readouterr().out
    sched = Schedule.load(str(out))
    assert sched.scheduler == "pair_probe" and sched.max_concurrency() == 2
