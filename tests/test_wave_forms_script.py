"""``scripts/wave_forms_cpu.py`` times every CPU form of every fused stage together with the stage's groups in
order, and builds the schedule in the default forms (outlined chains and inline ones) and in forced ones; here on
a small branchy model."""
import numpy as np

from scripts_under_test import load_script
from tvm_interop.api import prepare_program
from tvm_interop.passes.cost.measured import MeasuredCostModel
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.wave import fusable_stages


def test_every_form_of_every_stage_is_timed_and_the_forced_forms_are_built(branchy_model, branchy_input,
                                                                           branchy_reference, tmp_path):
    script = load_script("wave_forms_cpu")
    program = prepare_program(branchy_model, name="branchy")
    sched = schedule_graph(program.graph, "greedy", "sim:cpu")
    cost = MeasuredCostModel(program, cache=tmp_path / "c.json", repeat=2)
    try:
        stages = script.stage_forms(cost, sched, rounds=3)
    finally:
        cost.close()
    assert [st["stage"] for st in stages] == fusable_stages(sched)
    for st in stages:
        assert st["best"] in st["forms_s"] and st["forms_s"][st["best"]] == min(st["forms_s"].values())
        assert "waves" in st["forms_s"] and st["in_order_s"] > 0 and all(t > 0 for t in st["forms_s"].values())
    forced = {st["stage"]: "waves" for st in stages}
    built = script.programs(program, sched, forced, cost.target)
    try:
        assert set(built) == {"default forms", "fastest alone", "default, inline chains", "sequential"}
        for name, model in built.items():
            np.testing.assert_allclose(model.run(branchy_input), branchy_reference, rtol=1e-4, atol=1e-4,
                                       err_msg=name)
    finally:
        for model in built.values():
            model.close()
