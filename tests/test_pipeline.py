"""End to end on a small branchy model: every scheduler x executor x mode equals plain TVM."""
import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_interop
from tvm_interop.passes.schedule import Schedule, Stage
from tvm_interop.runtime import load
from tvm_interop.runtime.errors import InputError, ScheduleError, UnsupportedModelError
from tvm_interop.runtime.model import ScheduledModel

TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def compiled(branchy_model):
    out = {}
    for sch in ("sequential", "greedy"):
        for mode in ("stage", "dependency"):
            out[(sch, mode)] = tvm_interop.compile(branchy_model, scheduler=sch, mode=mode, name="branchy",
                                                     guard=False)
    yield out
    for cm in out.values():
        cm.close()


@pytest.mark.parametrize("scheduler", ["sequential", "greedy"])
@pytest.mark.parametrize("mode", ["stage", "dependency"])
@pytest.mark.parametrize("executor", ["threads", "vm"])
def test_matches_plain_tvm(compiled, branchy_input, branchy_reference, scheduler, mode, executor):
    cm = compiled[(scheduler, mode)]
    runner = ScheduledModel(cm.runner.library, executor=executor, mode=mode)
    out = runner.run(branchy_input)
    np.testing.assert_allclose(out, branchy_reference, **TOL)
    # run again: buffers are reused between runs, results must not drift
    np.testing.assert_allclose(runner.run(branchy_input), branchy_reference, **TOL)
    runner.close()


def test_greedy_is_concurrent_and_valid(compiled):
    cm = compiled[("greedy", "stage")]
    assert cm.schedule.max_concurrency() >= 3
    cm.schedule.validate(cm.graph)
    assert sorted(cm.schedule.unit_order()) == sorted(u.name for u in cm.graph.units)


def test_stage_memory_reuse_is_concurrency_safe(compiled):
    plan = compiled[("greedy", "stage")].plan
    stage_of = {}
    for si, st in enumerate(plan.stages):
        for g in st:
            for c in g:
                stage_of[c] = si
    # every buffer's live interval in stages
    first, last = {}, {}
    for ci, call in enumerate(plan.calls):
        for o in call.outs:
            first[o] = last[o] = stage_of[ci]
    for ci, call in enumerate(plan.calls):
        for a in call.args:
            if a[0] == "b":
                last[a[1]] = max(last[a[1]], stage_of[ci])
    by_storage = {}
    for b, info in enumerate(plan.buffers):
        by_storage.setdefault(info["storage"], []).append(b)
    for sid, bufs in by_storage.items():
        spans = sorted((first[b], last[b]) for b in bufs)
        for (s1, e1), (s2, e2) in zip(spans, spans[1:]):
            assert e1 < s2, f"storage {sid} shared by overlapping buffers {spans}"


def test_export_and_load(compiled, tmp_path, branchy_input, branchy_reference):
    cm = compiled[("greedy", "stage")]
    path = tmp_path / "m.so"
    cm.export(str(path))
    for executor in (None, "vm"):
        m = load(str(path), executor=executor)
        np.testing.assert_allclose(m.run(branchy_input), branchy_reference, **TOL)
        assert m.plan.meta["scheduler"] == "greedy"
        m.close()


def test_failed_export_keeps_previous_file(compiled, tmp_path):
    path = tmp_path / "m.so"
    path.write_bytes(b"previous good output")
    cm = compiled[("greedy", "stage")]

    class Broken:
        def export_library(self, p):
            with open(p, "wb") as f:
                f.write(b"partial")
            raise RuntimeError("disk full")

    from tvm_interop.runtime.errors import ExportError
    from tvm_interop.runtime.model import export_library

    with pytest.raises(ExportError, match="disk full"):
        export_library(Broken(), str(path))
    assert path.read_bytes() == b"previous good output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.so"]
    assert cm is not None


def test_wrong_inputs_are_refused(compiled):
    cm = compiled[("greedy", "stage")]
    with pytest.raises(InputError, match=r"float32\[1, 8, 16, 16\]"):
        cm.run(np.zeros((2, 8, 16, 16), "float32"))
    with pytest.raises(InputError, match="takes 1 input"):
        cm.run()
    vm = ScheduledModel(cm.runner.library, executor="vm")
    with pytest.raises(InputError):
        vm.run(np.zeros((1, 8, 16, 16), "float64"))
    # a list of arrays where the arrays belong: named, with the fix (both executors share the check)
    good = np.zeros((1, 8, 16, 16), "float32")
    for model in (cm, vm):
        with pytest.raises(InputError, match=r"'data' must be a numpy array or a TVM tensor, got list.*run\(\*arrays\)"):
            model.run([good])
    with pytest.raises(InputError, match="repeat >= 1"):
        vm.benchmark(good, repeat=0)
    assert vm.benchmark(good, repeat=np.int64(2), warmup=np.int64(0))["repeat"] == 2   # numpy counts are counts
    vm.close()


def test_vm_benchmark_copies_numpy_inputs_to_the_device_once(compiled, monkeypatch):
    """The VM executor's benchmark times the model with its input in place: a numpy input becomes a device tensor
    once, before the timed runs (as the candidate picker and gpu_check time it), not once per run; the result is
    the same program's (run afterwards gives plain numbers)."""
    import tvm

    cm = compiled[("greedy", "stage")]
    vm = ScheduledModel(cm.runner.library, executor="vm")
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype("float32")
    copies = []
    real = tvm.runtime.tensor

    def counting(arr, *a, **k):
        copies.append(np.shape(arr))
        return real(arr, *a, **k)

    monkeypatch.setattr(tvm.runtime, "tensor", counting)
    stats = vm.benchmark(x, repeat=5, warmup=2)
    assert stats["repeat"] == 5 and copies == [(1, 8, 16, 16)]
    monkeypatch.setattr(tvm.runtime, "tensor", real)
    np.testing.assert_allclose(vm.run(x), cm.run(x), rtol=1e-5, atol=1e-5)
    vm.close()


def test_export_to_a_directory_is_refused_by_name(compiled, tmp_path):
    from tvm_interop.runtime.errors import ExportError

    with pytest.raises(ExportError, match=f"{tmp_path}: it is a directory.*model.so"):
        compiled[("greedy", "stage")].export(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_schedule_file_applies_to_its_model_only(compiled, branchy_model, tmp_path, branchy_input,
                                                 branchy_reference):
    cm = compiled[("greedy", "stage")]
    p = tmp_path / "s.json"
    cm.schedule.save(p)
    again = tvm_interop.compile(branchy_model, schedule=str(p))
    np.testing.assert_allclose(again.run(branchy_input), branchy_reference, **TOL)
    from conftest import make_branchy_model

    other = make_branchy_model(channels=4)
    with pytest.raises(ScheduleError, match="different model"):
        tvm_interop.compile(other, schedule=str(p))


def test_hand_written_invalid_schedule_is_refused(branchy_model):
    program = tvm_interop.api.prepare_program(branchy_model)
    names = [u.name for u in program.graph.units]
    bad = Schedule([Stage([[n] for n in names])])  # everything at once: consumers beside producers
    with pytest.raises(ScheduleError, match="producer"):
        tvm_interop.compile(branchy_model, schedule=bad)


def test_dynamic_dimension_is_named():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("batch", "int64")
    x = relax.Var("data", relax.TensorType((n, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(y)
    with pytest.raises(UnsupportedModelError, match=r"data: dimension 0 is dynamic \(batch\)"):
        tvm_interop.compile(bb.get())


def test_unsupported_operator_is_named():
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((4, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            # relax.ewise_fma has no LegalizeOps lowering in TVM 0.27
            y = bb.emit_output(relax.op.ewise_fma(x, x, x))
        bb.emit_func_output(y)
    with pytest.raises(UnsupportedModelError, match="relax.ewise_fma"):
        tvm_interop.compile(bb.get())


def test_zero_size_tensor_is_refused():
    bb = relax.BlockBuilder()
    x = relax.Var("data", relax.TensorType((0, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.nn.relu(x))
        bb.emit_func_output(y)
    with pytest.raises(UnsupportedModelError, match="size 0"):
        tvm_interop.compile(bb.get())


def test_cpu_default_executor_is_the_vm_for_a_program_without_concurrency(compiled, branchy_input,
                                                                          branchy_reference, tmp_path):
    """Without an explicit executor, a CPU model whose plan never runs two groups at once runs on the Relax VM (no
    per-kernel dispatch from Python); a concurrent one on worker threads; a loaded .so decides the same way."""
    seq, greedy = compiled[("sequential", "stage")], compiled[("greedy", "stage")]
    assert seq.plan.max_concurrency() == 1 and greedy.plan.max_concurrency() > 1
    assert seq.runner.executor == "vm" and greedy.runner.executor == "threads"
    np.testing.assert_allclose(seq.run(branchy_input), branchy_reference, **TOL)
    path = str(tmp_path / "seq.so")
    seq.export(path)
    m = load(path)
    assert m.executor == "vm"
    np.testing.assert_allclose(m.run(branchy_input), branchy_reference, **TOL)
    m.close()
    forced = load(path, executor="threads")
    assert forced.executor == "threads"
    np.testing.assert_allclose(forced.run(branchy_input), branchy_reference, **TOL)
    forced.close()


def test_the_guard_times_each_plan_on_the_executor_it_ships_with(compiled, monkeypatch):
    """runtime.plan_timer (the never-slower guard's clock): a plan without concurrent groups runs on the Relax
    VM, as it ships; a concurrent plan on worker threads."""
    from tvm_interop.runtime import plan_timer, thread_executor

    built = []

    class Recording(thread_executor.ThreadExecutor):
        def __init__(self, plan, *a, **k):
            built.append(plan)
            super().__init__(plan, *a, **k)

    monkeypatch.setattr(thread_executor, "ThreadExecutor", Recording)
    seq, greedy = compiled[("sequential", "stage")], compiled[("greedy", "stage")]
    times = plan_timer.time_plans({"scheduled": (greedy.runner.library, greedy.plan),
                                   "sequential": (greedy.runner.library, seq.plan)}, repeat=3, warmup=1)
    assert [len(t) for t in times.values()] == [3, 3] and all(x > 0 for t in times.values() for x in t)
    assert built == [greedy.plan]
