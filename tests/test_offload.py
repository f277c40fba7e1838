"""Library units (passes.offload): convolutions and dense layers as cuDNN / cuBLAS calls.

Without a GPU we check everything but cuDNN's own arithmetic:
- every convolution / matmul unit of every zoo model is offloaded or named with its reason;
- the offloaded program, with the library functions' contract (``tests/library_reference.py``) registered in
  their place, computes what plain TVM computes: unit recognition, extracted parameters and emitted calls are
  right (child process, TVM's VM on the CPU, plain and scheduled programs);
- the CUDA lowering with library units passes the stream memory check on the IR the build compiles;
- bad input is refused clearly.
The build with the real extension and the exported library: ``tests/test_native_ext.py`` and the slow test below.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tvm_interop
from tvm_interop.models import get_model, list_models, small_config
from tvm_interop.passes.as_built import as_built_ir
from tvm_interop.passes.lower_streams import lower_program
from tvm_interop.passes.merge import mergeable
from tvm_interop.passes.offload import CONV2D_FUNC, DENSE_FUNC, is_candidate, match_unit, offload, plan_offload
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.stream_memory import check_stream_memory_safety
from tvm_interop.runtime.errors import InteropError
from zoo_cases import zoo_params

CUDA = {"kind": "cuda", "arch": "sm_90"}
HERE = os.path.dirname(os.path.abspath(__file__))

# what each zoo model leaves to TVM, and why (everything else is offloaded)
EXPECTED_REFUSALS = {
    "nasnet_a_large": "asymmetric padding",      # TF-style 'SAME' padding of stride-2 reductions
    "nasnet_a_mobile": "asymmetric padding",
    "randwire": "T_multiply",                    # the weighted sum of a node's inputs, fused after its conv
}


@pytest.fixture(scope="module", params=zoo_params())
def zoo_cuda_program(request):
    name = request.param
    return name, tvm_interop.api.prepare_program(get_model(name, **small_config(name)), CUDA, name=name)


def test_every_conv_and_dense_unit_is_offloaded_or_named(zoo_cuda_program):
    name, program = zoo_cuda_program
    report = plan_offload(program, "cudnn")
    candidates = {u for u, c in program.calls.items() if is_candidate(c.func_name)}
    assert candidates == set(report.offloaded) | set(report.refused), name
    assert not set(report.offloaded) & set(report.refused)
    assert report.offloaded, f"{name}: nothing offloaded"
    if name != "squeezenet":   # (SqueezeNet's classifier is a 1x1 convolution)
        assert any(c.func == DENSE_FUNC for c in report.offloaded.values()), f"{name}: the classifier stays in TVM"
    for unit, why in report.refused.items():
        assert EXPECTED_REFUSALS.get(name, "<none expected>") in why, f"{name} {unit}: {why}"
    for unit, call in report.offloaded.items():   # the parameters agree with the unit's shapes
        u = program.graph.unit(unit)
        if call.func == CONV2D_FUNC:
            p = call.named_params()
            assert u.inputs[1].shape[0] == u.outputs[0].shape[1]
            assert p["groups"] * u.inputs[1].shape[1] == u.inputs[0].shape[1]
            assert len(call.arg_index) == 2 + p["has_bias"] + p["has_z"]


def test_offloaded_program_is_a_program_of_units(zoo_cuda_program):
    name, program = zoo_cuda_program
    new, report = offload(program, "cudnn")
    assert len(new.graph) == len(program.graph)
    assert [u.name for u in new.graph.units] == [u.name for u in program.graph.units]
    assert len(new.constants) == len(program.constants)   # weights keep their indices (passed by position)
    assert all(np.array_equal(a, b) for a, b in zip(new.constants, program.constants))
    lib = {u for u, c in new.calls.items() if c.is_library}
    assert lib == set(report.offloaded)
    # same units, kinds, signatures and edges: schedules and cost tables of the model apply to its offloaded form
    assert new.graph.fingerprint() == program.graph.fingerprint()
    for u in lib:
        unit = new.graph.unit(u)
        assert unit.attrs["library"] in ("cudnn", "cublas")
        assert unit.flops == pytest.approx(report.offloaded[u].flops)


CHILD = textwrap.dedent('''
    import json, sys
    import numpy as np, tvm
    from tvm import relax
    sys.path.insert(0, {here!r})
    import library_reference
    library_reference.register()
    from tvm_interop.models import get_model, list_models, small_config
    from tvm_interop.api import prepare_program
    from tvm_interop.passes.offload import offload
    from tvm_interop.passes.lower_streams import lower_program
    from tvm_interop.passes.schedulers import schedule_graph

    def run(mod, x, fn="main"):
        vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
        return vm[fn](tvm.runtime.tensor(x)).numpy()

    out = {{}}
    for name in {models!r}:
        program = prepare_program(get_model(name, **small_config(name)), "llvm", name=name, cpu_schedule=False)
        new, report = offload(program, "cudnn")
        x = np.random.default_rng(0).standard_normal(program.input_infos[0].shape).astype("float32")
        ref = run(program.mod, x)
        plain = run(new.mod, x)
        sched = schedule_graph(new.graph, "greedy", "sim:h100")
        low = lower_program(new, sched, "llvm", mode="dependency")
        scheduled = run(low.mod, x)
        scale = float(np.abs(ref).max())
        out[name] = {{"offloaded": len(report.offloaded), "plain": float(np.abs(plain - ref).max()) / scale,
                     "scheduled": float(np.abs(scheduled - ref).max()) / scale}}
    print(json.dumps(out))
''')


def _check_contract(models: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD.format(here=HERE, models=list(models))], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) == set(models)
    for name, r in result.items():
        assert r["offloaded"] > 0, name
        assert r["plain"] < 1e-5, (name, r)       # relative to the output's scale (the contract sums in fp64)
        assert r["scheduled"] < 1e-5, (name, r)


@pytest.mark.parametrize("models", [pytest.param(["resnet50"], id="resnet50"),
                                    pytest.param(["inception_v3"], marks=pytest.mark.ci, id="inception_v3"),
                                    pytest.param(["nasnet_a_mobile"], marks=pytest.mark.zoo, id="nasnet_a_mobile")])
def test_library_contract_reproduces_tvm(models):
    """The offloaded programs with the library functions' contract in place equal plain TVM (plain and scheduled),
    so recognition and parameters are right: residuals and a [K, N] dense weight (resnet50, 11 s alone); 1x7 / 7x1
    kernels and 1x1 outputs (inception_v3, 20 s: CI's tier); depthwise and grouped convolutions, dilation
    (nasnet_a_mobile: 43 s of the three models' 82, so in the zoo tier)."""
    _check_contract(models)


@pytest.mark.slow
def test_library_contract_reproduces_tvm_on_every_zoo_model():
    _check_contract(list_models())


@pytest.mark.parametrize("scheduler,mode", [("greedy", "stage"), ("lios", "dependency")])
def test_library_units_pass_the_as_built_memory_check(zoo_cuda_program, scheduler, mode):
    name, program = zoo_cuda_program
    new, report = offload(program, "cudnn")
    sched = schedule_graph(new.graph, scheduler, "sim:h100")
    low = lower_program(new, sched, CUDA, mode=mode, cuda_graph=True)
    built = as_built_ir(low.mod, CUDA)
    check = check_stream_memory_safety(built)
    assert check.ok, f"{name}: {check.summary()}"
    # the checker saw the library calls as device work: every unit of the direct program is a kernel it checked
    assert check.functions["__tvm_interop_main"]["kernels"] >= len(new.graph), name


def test_unoffloadable_patterns_are_named():
    program = tvm_interop.api.prepare_program(get_model("randwire", **small_config("randwire")), CUDA,
                                              name="randwire")
    weighted = [u for u, c in program.calls.items() if "multiply" in c.func_name and is_candidate(c.func_name)]
    assert weighted
    why = match_unit(program, weighted[0])
    assert isinstance(why, str) and "T_multiply" in why
    for u, c in program.calls.items():   # no other kernel is mistaken for a convolution / matmul
        if not is_candidate(c.func_name):
            assert isinstance(match_unit(program, u), str), c.func_name


def test_library_units_stay_out_of_merges_and_waves():
    from tvm_interop.passes.target import normalize_target
    from tvm_interop.passes.wave.kernel import lower_unit
    from tvm_interop.passes.wave.lowered import NotFusable

    program = tvm_interop.api.prepare_program(get_model("googlenet", **small_config("googlenet")), CUDA,
                                              name="googlenet")
    new, _ = offload(program, "cudnn")
    convs = [u for u, c in new.calls.items() if c.func_name == CONV2D_FUNC]
    check = mergeable(convs[:2], new)
    assert not check.ok and "library call" in check.reason
    with pytest.raises(NotFusable, match="library call"):
        lower_unit(new, convs[0], normalize_target(CUDA))


def test_bad_units_choices_are_refused():
    with pytest.raises(InteropError, match="CUDA target"):
        tvm_interop.compile("squeezenet", target="llvm", units="cudnn", **small_config("squeezenet"))
    with pytest.raises(InteropError, match="unknown units"):
        tvm_interop.compile("squeezenet", target="cuda", units="cublas-only", **small_config("squeezenet"))
    program = tvm_interop.api.prepare_program(get_model("squeezenet", **small_config("squeezenet")), CUDA,
                                              name="squeezenet")
    assert not plan_offload(program, "tvm").offloaded
    with pytest.raises(InteropError, match="unknown units"):
        plan_offload(program, "fast")


def test_auto_follows_device_measurements():
    program = tvm_interop.api.prepare_program(get_model("squeezenet", **small_config("squeezenet")), CUDA,
                                              name="squeezenet")
    every = plan_offload(program, "cudnn").offloaded
    a, b = sorted(every)[:2]
    report = plan_offload(program, "auto", measured={a: (1e-5, 2e-5), b: (3e-5, 1e-5)})
    assert a not in report.offloaded and "TVM kernel measured faster" in report.refused[a]
    assert b in report.offloaded and "measured faster" in report.chosen_by[b]
    others = set(every) - {a, b}
    assert others <= set(report.offloaded)
    assert all("no device measurement" in report.chosen_by[u] for u in others)


def _extension_missing() -> str | None:
    from tvm_interop.passes import native_build

    try:
        native_build.include_dirs(native_build.find_nvcc())
        return None
    except native_build.NativeBuildError as e:
        return str(e)


def test_exported_cudnn_model_carries_the_extension(tmp_path):
    """The thing that ships: a CUDA compile with units='cudnn' (graph variant captured whole, memory checked as
    built) exported to a .so that, in a runtime-only process, registers the library functions on load and
    refuses to run here with a clear 'no CUDA device'."""
    from runtime_only import assert_runtime_only, runtime_only_env

    missing = _extension_missing()
    if missing:
        pytest.skip(f"cannot build the native extension here: {missing}")
    cm = tvm_interop.compile("squeezenet", target="cuda", scheduler="greedy", units="cudnn",
                             **small_config("squeezenet"))
    meta = cm.plan.meta
    assert len(meta["library_units"]) == len(cm.offload.offloaded) > 0
    assert meta["cuda_graph"] and meta["memory_check"].startswith("as-built")
    assert set(meta["native_extension"]["functions"]) >= {CONV2D_FUNC, "tvm_interop.cuda.event_sync"}
    path = str(tmp_path / "sq.so")
    cm.export(path)
    env, log = runtime_only_env(tmp_path)
    child = textwrap.dedent(f'''
        import json, tvm, tvm_ffi
        try:
            tvm.runtime.load_module({path!r})   # no CUDA driver here: fails after the library was loaded
        except Exception:
            pass
        found = [n for n in {[CONV2D_FUNC, "tvm_interop.cuda.event_sync"]!r}
                 if tvm_ffi.get_global_func(n, allow_missing=True) is not None]
        from tvm_interop import runtime
        try:
            runtime.load({path!r})
            error = None
        except Exception as e:
            error = type(e).__name__ + ": " + str(e)
        print(json.dumps({{"found": found, "error": error}}))
    ''')
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["found"] == [CONV2D_FUNC, "tvm_interop.cuda.event_sync"]
    assert out["error"].startswith("DeviceError") and "no CUDA device" in out["error"]
    assert_runtime_only(log, 1)


def test_library_stages_in_a_bundle_and_auto_by_the_table(tmp_path):
    """``profile-bundle --library-units``: every offloadable unit also as its library call (a ``library`` stage)
    in a CUDA bundle that links the extension; a table with those measurements makes ``units="auto"`` choose per
    unit, and prices library units with their own times. The device's timings are stood in by made-up numbers
    (no GPU here): what is tested is the plumbing from bundle to table to choice, not the timings."""
    missing = _extension_missing()
    if missing:
        pytest.skip(f"cannot build the native extension here: {missing}")
    from tvm_interop.passes.cost.table import TableCostModel
    from tvm_interop.passes.profile_bundle import BundleOptions, build_profile_bundle
    from tvm_interop.runtime.profile_bundle import stage_key

    program = tvm_interop.api.prepare_program(get_model("squeezenet", **small_config("squeezenet")), CUDA,
                                              name="squeezenet")
    bundle = build_profile_bundle(program, CUDA, str(tmp_path / "b"),
                                  BundleOptions(ios=False, lios=False, library=True))
    plan = bundle.plan
    lib_stages = [st for st in plan["stages"] if st.get("strategy") == "library"]
    offloadable = plan_offload(program, "cudnn").offloaded
    assert {st["groups"][0][0] for st in lib_stages} == set(offloadable)
    for st in lib_stages:
        (run,) = st["run"]
        spec = plan["units"][run[0]]
        assert spec["func"] == CONV2D_FUNC and spec["params"] == list(offloadable[st["groups"][0][0]].params)
    assert b"tvm_interop.cudnn.conv2d" in open(tmp_path / "b" / plan["library"], "rb").read()
    # what the device loads with TVM's runtime alone: kernels as binaries for the recorded arch, no CUDA source
    from tvm_interop.passes.cuda_compile import fatbin_arches, library_cuda_images

    images = library_cuda_images(str(tmp_path / "b" / plan["library"]))
    assert images and [fatbin_arches(c) for _, c in images] == [["sm_90"]] and plan["cuda_arches"] == ["sm_90"]

    names = sorted(offloadable)
    faster_in_tvm = set(names[::3])            # stand-in: every third unit's TVM kernel is the faster one
    # The stand-in table has both clocks, like a GPU table: on the issue clock every library call sits at a
    # host-bound 40 us (slower than every TVM kernel), on the device clock the pattern above. A compile that builds
    # a CUDA graph (the default) must choose by the device clock; one without a graph by the issue clock.
    unit_rows = [{"key": stage_key([[u.name]]), "groups": [[u.name]], "strategy": "concurrent", "latency": 20e-6,
                  "device_latency": 18e-6} for u in program.graph.units]
    table = {"format": "tvm-interop-cost-table", "version": 1, "model": plan["model"],
             "graph_fingerprint": plan["graph_fingerprint"], "target": plan["target"], "device_kind": "cuda",
             "device": "cuda:stand-in:sm_90", "tvm_version": __import__("tvm").__version__,
             "units": {u.name: 20e-6 for u in program.graph.units},
             "device_clock": {"held": 1, "not_held": 0, "stages_without": 0, "programs_without": 0},
             "stages": unit_rows + [
                 {"key": stage_key(st["groups"], "library"), "groups": st["groups"], "strategy": "library",
                  "latency": 40e-6, "device_latency": 30e-6 if st["groups"][0][0] in faster_in_tvm else 10e-6}
                 for st in lib_stages]}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(table))
    cm = tvm_interop.compile("squeezenet", target="cuda", scheduler="lios", units="auto", cost=f"table:{path}",
                             **small_config("squeezenet"))
    assert set(cm.offload.offloaded) == set(names) - faster_in_tvm
    assert all("TVM kernel measured faster" in cm.offload.refused[u] for u in faster_in_tvm)
    assert cm.offload.clock == "device" and "chosen by device-clock times" in cm.offload.summary()
    model = TableCostModel(str(path), clock="device")
    lib_unit = next(u for u in cm.program.graph.units if u.attrs.get("library"))
    tvm_unit = next(u for u in cm.program.graph.units if u.name in faster_in_tvm)
    assert model.unit_latency(lib_unit) == pytest.approx(10e-6)
    assert model.unit_latency(tvm_unit) == pytest.approx(18e-6)
    issue = TableCostModel(str(path))            # the issue clock: what a direct program pays
    assert issue.unit_latency(lib_unit) == pytest.approx(40e-6) and issue.unit_latency(tvm_unit) == pytest.approx(20e-6)
    times, clock = tvm_interop.api._implementation_times(f"table:{path}")
    direct = plan_offload(program, "auto", measured=times, clock=clock)
    assert clock == "issue" and not direct.offloaded   # host-bound library calls lose every unit without a graph


def test_cli_compile_with_library_units_and_reused_events(capsys):
    """``tvm-interop compile --target cuda --units cudnn --sync events``: the summary says what runs as a library
    call and what stays in TVM, and the JSON carries the same."""
    from tvm_interop.cli import main

    missing = _extension_missing()
    if missing:
        pytest.skip(f"cannot build the native extension here: {missing}")
    assert main(["compile", "randwire", "--target", "cuda", "--width", "0.125", "--image-size", "32",
                 "--scheduler", "greedy", "--units", "cudnn", "--sync", "events", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "library units:" in out and "cudnn" in out and "left to TVM" in out and "T_multiply" in out
    assert main(["compile", "squeezenet", "--target", "cuda", "--width", "0.125", "--image-size", "32",
                 "--units", "cudnn", "--json", "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["library_units"]["units"] == "cudnn" and len(summary["library_units"]["offloaded"]) == 26
