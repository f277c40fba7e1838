"""MetaSchedule tuning (passes.kernels.tuning, fast_builder): database, resume, interrupt, apply, compile hook.

Tiny on purpose (one 3x3 conv + relu, 8 -> 8 channels at 14x14, 2-4 trials): the machine running the suite may have
two busy cores. The whole file takes about a minute.
"""
import json
import os
import shutil
import signal
import sys

import numpy as np
import pytest
import tvm

import tvm_interop
from tvm_interop.passes.kernels import tuning
from tvm_interop.passes.kernels.fast_builder import InProcessBuilder, InProcessRunner, tensor_intrinsics_for
from tvm_interop.passes.kernels.tuning import TuningError, apply_database, tune_program, tuned_functions

FUNC = "fused_conv2d_relu"
# the tests name the conv's kernel: NCHW everywhere (on a CPU whose vector divides the 8 channels, the default
# layout blocks them, and the kernel becomes fused_conv2d_NCHWc_relu between two layout transforms)
LAYOUT = "nchw"


def make_conv_model(c: int = 8, size: int = 14):
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, c, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = relax.const((rng.standard_normal((c, c, 3, 3)) * 0.2).astype("float32"))
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=1)))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def conv_model():
    return make_conv_model()


@pytest.fixture(scope="module")
def conv_input():
    return np.random.default_rng(1).standard_normal((1, 8, 14, 14)).astype("float32")


@pytest.fixture(scope="module")
def program(conv_model):
    return tvm_interop.api.prepare_program(conv_model, "llvm", name="conv", layout=LAYOUT)


@pytest.fixture(scope="module")
def tuned_db(program, tmp_path_factory):
    """A database with 2 trials of the conv (XGBoost cost model, in-process builder and runner)."""
    work_dir = str(tmp_path_factory.mktemp("tuning") / "db")
    report = tune_program(program, "llvm", work_dir, trials=2, num_trials_per_iter=2, seed=0)
    return work_dir, report


def _records(work_dir) -> int:
    with open(os.path.join(work_dir, tuning.RECORD_FILE)) as f:
        return sum(1 for ln in f if ln.strip())


def test_tune_writes_database(tuned_db):
    work_dir, rep = tuned_db
    assert [t.name for t in rep.tasks] == [FUNC]
    task = rep.tasks[0]
    assert task.trials == 2 and task.new_trials == 2 and task.status == "tuned"
    assert task.best_ms is not None and task.best_ms > 0
    assert task.untuned_ms is not None and task.untuned_ms > 0 and task.default_ms is not None
    assert _records(work_dir) == 2
    for name in (tuning.WORKLOAD_FILE, tuning.STATE_FILE):
        assert os.path.exists(os.path.join(work_dir, name))
    state = json.loads(open(os.path.join(work_dir, tuning.STATE_FILE)).read())
    assert json.loads(state["target"])["kind"] == "llvm" and len(state["tasks"]) == 1
    assert rep.stats["builds"] == 2 and rep.stats["build_errors"] == 0 and rep.stats["run_errors"] == 0
    assert FUNC in rep.table() and rep.to_dict()["new_trials"] == 2


def test_rerun_resumes_from_the_database(tuned_db, program, tmp_path):
    work_dir = str(tmp_path / "db")
    shutil.copytree(tuned_db[0], work_dir)
    again = tune_program(program, "llvm", work_dir, trials=2, num_trials_per_iter=2)
    assert again.tasks[0].status == "done" and again.tasks[0].new_trials == 0 and again.tasks[0].trials == 2
    assert again.stats["builds"] == 0 and _records(work_dir) == 2  # baselines come from the state file
    more = tune_program(program, "llvm", work_dir, trials=3, num_trials_per_iter=2)
    assert more.tasks[0].trials == 3 and more.tasks[0].new_trials == 1 and _records(work_dir) == 3
    assert more.tasks[0].best_ms <= tuned_db[1].tasks[0].best_ms * 1.0001


def test_interrupt_leaves_a_consistent_database(tuned_db, program, tmp_path, monkeypatch):
    work_dir = str(tmp_path / "db")
    shutil.copytree(tuned_db[0], work_dir)
    cls = tuning._ProgressCallback._cls
    original = cls.apply

    def apply_then_ctrl_c(self, *args):  # Ctrl-C right after the first batch was recorded
        original(self, *args)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(cls, "apply", apply_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt) as info:
        tune_program(program, "llvm", work_dir, trials=4, num_trials_per_iter=1)
    partial = info.value.args[1]
    assert partial.interrupted and partial.tasks[0].status == "interrupted" and partial.tasks[0].trials == 3
    assert _records(work_dir) == 3
    monkeypatch.setattr(cls, "apply", original)
    resumed = tune_program(program, "llvm", work_dir, trials=4, num_trials_per_iter=1)
    assert resumed.tasks[0].new_trials == 1 and resumed.tasks[0].trials == 4 and _records(work_dir) == 4


def test_apply_database_substitutes_tuned_kernel(tuned_db, program, conv_model, conv_input):
    from tvm import relax

    work_dir, rep = tuned_db
    mod = apply_database(program.mod, "llvm", work_dir, prefer_faster=False)
    assert tuned_functions(mod) == [FUNC]
    assert sorted(gv.name_hint for gv in mod.get_global_vars()) == sorted(
        gv.name_hint for gv in program.mod.get_global_vars())
    assert mod["main"].same_as(program.mod["main"])
    assert set(program.mod.attrs.keys()) <= set(mod.attrs.keys())  # conv attrs, unscheduled originals kept
    assert not mod[FUNC].same_as(program.mod[FUNC])
    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(conv_input)).numpy()
    ref = tvm_interop.run_reference(conv_model, [conv_input])
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    # prefer_faster keeps the default CPU schedule where it measured faster than the tuned kernel
    chosen = apply_database(program.mod, "llvm", work_dir)
    assert tuned_functions(chosen) == ([FUNC] if rep.tasks[0].uses == "tuned" else [])


def test_compile_uses_the_tuning_database(tuned_db, conv_model, conv_input, tmp_path):
    work_dir, rep = tuned_db
    ref = tvm_interop.run_reference(conv_model, [conv_input])
    # without default CPU schedules the prepared kernel is TVM's naive one: the tuned kernel always replaces it;
    # the database is applied before the (measured) cost model sees the program
    cm = tvm_interop.compile(conv_model, "llvm", scheduler="greedy", cost="measured", guard=False,
                             cost_cache=str(tmp_path / "cost.json"), cpu_schedule=False, tuning_db=work_dir,
                             layout=LAYOUT)
    assert tuned_functions(cm.program.mod) == [FUNC] and "tuning_db" in cm.timings
    np.testing.assert_allclose(cm.run(conv_input), ref, rtol=1e-4, atol=1e-4)
    cm.close()
    cm = tvm_interop.compile(conv_model, "llvm", scheduler="sequential", tuning_db=work_dir, layout=LAYOUT)
    assert tuned_functions(cm.program.mod) == ([FUNC] if rep.tasks[0].uses == "tuned" else [])
    np.testing.assert_allclose(cm.run(conv_input), ref, rtol=1e-4, atol=1e-4)
    cm.close()


def test_missing_foreign_and_torn_databases(tuned_db, program, tmp_path):
    with pytest.raises(TuningError, match="no tuning database"):
        apply_database(program.mod, "llvm", str(tmp_path / "nothing"))
    foreign = str(tmp_path / "foreign")
    shutil.copytree(tuned_db[0], foreign)
    path = os.path.join(foreign, tuning.STATE_FILE)
    state = json.loads(open(path).read())
    state["target"] = json.dumps({"kind": "cuda", "arch": "sm_90"})
    open(path, "w").write(json.dumps(state))
    with pytest.raises(TuningError, match="target kind 'cuda'"):
        apply_database(program.mod, "llvm", foreign)
    torn = str(tmp_path / "torn")
    shutil.copytree(tuned_db[0], torn)
    with open(os.path.join(torn, tuning.RECORD_FILE), "a") as f:
        f.write('[0, [[["SampleCategorical", [], [[1, 2]')  # what a kill during a write would leave
    mod = apply_database(program.mod, "llvm", torn, prefer_faster=False)
    assert tuned_functions(mod) == [FUNC] and _records(torn) == 2


def test_in_process_builder_and_runner(program, tmp_path):
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    func = tuning._tuning_source(program.mod)[FUNC]
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    target = tuning.tuning_target("llvm")
    runner = InProcessRunner()
    for export in (False, True):  # in memory, or a real .so loaded by path
        (res,) = InProcessBuilder(export=export).build([ms.builder.BuilderInput(mod, target)])
        assert res.error_msg is None and os.path.exists(res.artifact_path)
        (fut,) = runner.run([ms.runner.RunnerInput(res.artifact_path, "cpu", ArgInfo.from_prim_func(func))])
        out = fut.result()
        assert out.error_msg is None and 0 < float(out.run_secs[0]) < 1.0
        shutil.rmtree(os.path.dirname(res.artifact_path))
    params = {"p": tvm.runtime.tensor(np.zeros(1, "float32"))}  # a failed build is a result, not an exception
    (res,) = InProcessBuilder().build([ms.builder.BuilderInput(mod, target, params)])
    assert res.artifact_path is None and "not supported" in res.error_msg


def test_tensor_intrinsics_placeholder_is_removed():
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        pytest.skip("the full tensor intrinsic package is already imported in this process")
    cuda_before = "tvm.s_tir.tensor_intrin.cuda" in sys.modules   # a CUDA tuning test in this process
    with tensor_intrinsics_for(tuning.tuning_target("llvm")):
        import tvm.s_tir.tensor_intrin  # noqa: F401 - what TuneContext does: a no-op here
        assert "tvm.s_tir.tensor_intrin.x86" in sys.modules
        assert ("tvm.s_tir.tensor_intrin.cuda" in sys.modules) == cuda_before
    assert "tvm.s_tir.tensor_intrin" not in sys.modules


def test_cli_tune_json(tuned_db, tmp_path, capsys):
    from tvm_interop.cli import main

    rc = main(["tune", "squeezenet", "--image-size", "32", "--width", "0.25", "--trials", "0", "--ops",
               "conv2d_add_relu", "--no-baselines", "--db", str(tmp_path / "sq"), "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "squeezenet" and out["new_trials"] == 0 and out["tasks"]
    assert all(t["status"] == "done" and t["trials"] == 0 for t in out["tasks"])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="CUDA builds need nvcc")
def test_cuda_candidate_exported_for_another_machine_holds_binaries(tmp_path):
    """A candidate measured elsewhere (a fleet device) is loaded there with TVM's runtime only: its CUDA kernels
    must be a fatbin for the target's arch, not source that needs nvcc at load."""
    from tvm import relax
    from tvm.s_tir import dlight as dl

    from tvm_interop.passes.cuda_compile import inspect_cuda_library
    from tvm_interop.passes.kernels.fast_builder import build_candidate, export_candidate
    from tvm_interop.passes.target import normalize_target

    target = normalize_target("cuda -arch=sm_80")
    x = relax.Var("x", relax.TensorType((1, 8, 16, 16), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit_te(tvm.topi.nn.relu, x))
        bb.emit_func_output(out)
    prim = [f for f in bb.get().functions.values() if isinstance(f, tvm.tirx.PrimFunc)][0]
    mod = tvm.IRModule({"main": prim.with_attr("global_symbol", "main")})
    with target:
        mod = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)
    path = str(tmp_path / "cand.so")
    export_candidate(build_candidate(mod, target), path, target)
    info = inspect_cuda_library(path)
    assert info["formats"] == ["fatbin"] and info["arches"] == ["sm_80"] and not info["source_left"], info


def test_tuning_benchmark_reports_the_convolution_task(tmp_path):
    """``scripts/bench_tuning.py`` tunes one layer and reports the convolution's task with seconds per trial."""
    import json

    from scripts_under_test import load_script

    out = tmp_path / "tune.json"
    summary = load_script("bench_tuning").main(["--channels", "8", "--size", "8", "--trials", "2", "--per-iter", "2",
                                                "--db", str(tmp_path / "db"), "--json", str(out)])
    assert summary["flops"] > 0 and "conv2d" in summary["name"]
    assert summary["new_trials"] >= 1 and summary["seconds_per_trial"] > 0
    assert json.loads(out.read_text())["name"] == summary["name"]
