"""Every zoo model, scheduled, equals plain ``tvm.compile`` — threads and VM executors, stage and dependency
modes. Small configurations (narrow, small images, reduced depth) keep the default suite fast; the ``slow``
test runs the paper-depth structures."""
import numpy as np
import pytest

import tvm_interop
from tvm_interop.passes.partition import cut_points
from tvm_interop.runtime.model import ScheduledModel
from tvm_interop.models import MODELS, get_model, list_models
from zoo_cases import zoo_case as cached_zoo_case, zoo_params

TOL = dict(rtol=1e-4, atol=1e-4)




@pytest.fixture(scope="module", params=zoo_params())
def zoo_case(request):
    name = request.param
    mod, x, ref = cached_zoo_case(name)
    # no memory bound here: this test is about greedy's concurrency (the bound is tested in test_memory_bound)
    cm = tvm_interop.compile(mod, scheduler="greedy", name=name, max_memory_ratio=None, guard=False)
    yield name, cm, x, ref
    cm.close()


@pytest.mark.parametrize("executor,mode", [("threads", "stage"), ("threads", "dependency"), ("vm", "stage")])
def test_zoo_model_matches_plain_tvm(zoo_case, executor, mode):
    name, cm, x, ref = zoo_case
    runner = ScheduledModel(cm.runner.library, executor=executor, mode=mode)
    out = runner.run(x)
    runner.close()
    assert out.shape == ref.shape
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, **TOL, err_msg=f"{name} {executor}/{mode}")


def test_zoo_schedule_is_valid_and_concurrent(zoo_case):
    name, cm, _, _ = zoo_case
    s = cm.schedule
    s.validate(cm.graph)
    assert sorted(s.unit_order()) == sorted(u.name for u in cm.graph.units)
    assert s.num_stages <= len(cm.graph)
    # greedy puts every ready unit in one stage, so it runs two units at once whenever two are independent
    # (i.e. not every unit is a cut point)
    if len(cut_points(cm.graph)) < len(cm.graph):
        assert s.max_concurrency() >= 2, name


@pytest.mark.slow
@pytest.mark.parametrize("name", list_models())
def test_zoo_full_depth_matches_plain_tvm(name):
    """Paper structure (full depth), narrow and small so it still builds in minutes."""
    spec = MODELS[name]
    mod = get_model(name, width=0.125, image_size=max(spec.min_image_size, 64))
    x = np.random.default_rng(3).standard_normal(tuple(int(d) for d in mod["main"].params[0].ty.shape.values)).astype("float32")
    ref = tvm_interop.run_reference(mod, [x])
    cm = tvm_interop.compile(mod, scheduler="greedy", name=name)
    np.testing.assert_allclose(cm.run(x), ref, **TOL)
    cm.close()
