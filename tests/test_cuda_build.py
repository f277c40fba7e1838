"""CUDA builds on a machine without a GPU (nvcc + DLight), the clear "no CUDA device" error, and profiling bundles
(built here, measured on the CPU end to end: bundle -> measurement -> cost table -> schedule).

The whole-zoo CUDA build is @pytest.mark.slow (about 2-3 minutes on 2 cores); one model builds in the default suite.
"""
from __future__ import annotations

import json
import logging
import os
import shutil

import numpy as np
import pytest
import tvm

from tvm_interop import runtime
import tvm_interop
from tvm_interop.passes.cuda_build import ensure_nvcc
from tvm_interop.passes.target import normalize_target
from tvm_interop.runtime.errors import DeviceError, InteropError

TOL = dict(rtol=1e-4, atol=1e-4)

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/bin/nvcc")
                                and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                                reason="CUDA builds need nvcc (the CUDA toolkit)")
no_gpu = pytest.mark.skipif(tvm.cuda(0).exist, reason="checks the behaviour on a machine without a GPU")


# ---------------------------------------------------------------------------------------------- targets
def test_target_spellings():
    for spec in ("cuda", "cuda -arch=sm_90", {"kind": "cuda"}, {"kind": "cuda", "arch": "sm_90"}):
        t = normalize_target(spec)
        assert t.kind.name == "cuda" and t.attrs["arch"] == "sm_90"
        assert int(t.attrs["max_shared_memory_per_block"]) == 49152
    assert normalize_target("cuda -arch=sm_80").attrs["arch"] == "sm_80"
    assert normalize_target("llvm").kind.name == "llvm"
    with pytest.raises(InteropError, match="cannot read target option"):
        normalize_target("cuda sm_90")
    with pytest.raises(InteropError, match="invalid target"):
        normalize_target("nosuchkind")


def test_default_arch_is_configurable(monkeypatch):
    monkeypatch.setenv("TVM_INTEROP_CUDA_ARCH", "sm_80")
    assert normalize_target("cuda").attrs["arch"] == "sm_80"


@needs_nvcc
def test_nvcc_is_selected_when_unset(monkeypatch):
    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE", raising=False)
    assert os.path.basename(ensure_nvcc()) == "nvcc"
    assert os.environ["TVM_CUDA_COMPILE_MODE"] == "nvcc"
    monkeypatch.setenv("TVM_CUDA_COMPILE_MODE", "nvrtc")
    assert ensure_nvcc() == "nvrtc"  # the user's choice is kept


# ---------------------------------------------------------------------------------------------- builds
@pytest.fixture(scope="module")
def cuda_branchy(branchy_model):
    cm = tvm_interop.compile(branchy_model, target="cuda", scheduler="greedy", name="branchy")
    yield cm
    cm.close()


@needs_nvcc
def test_cuda_build_records_its_decisions(cuda_branchy):
    meta = cuda_branchy.plan.meta
    assert meta["device"] == "cuda" and meta["target"] == "cuda -arch=sm_90"
    assert meta["num_streams"] == 4 and meta["cuda_graph"] is True and meta["cuda_graph_reason"] is None
    assert cuda_branchy.runner.cuda_graph is True


@needs_nvcc
@no_gpu
def test_cuda_run_without_a_gpu_is_a_clear_error(cuda_branchy, branchy_input, tmp_path):
    with pytest.raises(DeviceError, match="no CUDA device"):
        cuda_branchy.run(branchy_input)
    path = tmp_path / "m_cuda.so"
    cuda_branchy.export(str(path))
    assert path.stat().st_size > 10_000
    with pytest.raises(DeviceError, match="no CUDA device"):
        runtime.load(str(path))


@needs_nvcc
def test_cuda_build_without_graph(branchy_model):
    cm = tvm_interop.compile(branchy_model, target={"kind": "cuda", "arch": "sm_90"}, scheduler="greedy",
                             mode="dependency", cuda_graph=False)
    assert cm.plan.meta["cuda_graph"] is False and cm.plan.meta["mode"] == "dependency"
    cm.close()


@needs_nvcc
def test_fast_zoo_cuda_build(tmp_path):
    """The default suite's representative of the zoo CUDA build."""
    from tvm_interop.models import get_model

    cm = tvm_interop.compile(get_model("squeezenet", width=0.125, image_size=32), target="cuda",
                             scheduler="greedy", name="squeezenet")
    assert cm.plan.meta["cuda_graph"] is True
    cm.export(str(tmp_path / "squeezenet_cuda.so"))
    cm.close()


def _tiny(name):
    from tvm_interop.models import MODELS

    spec = MODELS[name]
    return dict(width=0.125, image_size=max(spec.min_image_size, 32),
                depth=spec.min_depth if spec.depth_param else None)


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("name", __import__("tvm_interop.models", fromlist=["list_models"]).list_models())
def test_zoo_cuda_build(name, tmp_path):
    from tvm_interop.models import get_model

    mod = get_model(name, **_tiny(name))
    cm = tvm_interop.compile(mod, target="cuda", scheduler="greedy", name=name)
    assert cm.plan.meta["cuda_graph"] is True, cm.plan.meta.get("cuda_graph_reason")
    cm.export(str(tmp_path / f"{name}.so"))
    cm.close()


@needs_nvcc
def test_reference_cuda_build(branchy_model, tmp_path):
    ex = tvm_interop.api.reference_build(branchy_model, "cuda")
    ex.export_library(str(tmp_path / "plain.so"))
    assert (tmp_path / "plain.so").stat().st_size > 10_000


# ---------------------------------------------------------------------------------------------- profile bundles
def test_a_cuda_bundle_must_carry_binaries_for_the_gpu():
    """The measuring machine has TVM's runtime only: a CUDA bundle without recorded fatbin arches (CUDA source,
    as bundles were exported before) is refused with the remedy, and one built for another arch names both."""
    from types import SimpleNamespace

    from tvm_interop.runtime.errors import ExportError
    from tvm_interop.runtime.profile_bundle import _check_cuda_binaries

    h100 = SimpleNamespace(compute_version="9.0", device_name="NVIDIA H100")
    with pytest.raises(ExportError, match="CUDA source.*rebuild it"):
        _check_cuda_binaries({"device": "cuda"}, "b/bundle.so", h100)
    with pytest.raises(DeviceError, match="sm_80"):
        _check_cuda_binaries({"device": "cuda", "cuda_arches": ["sm_80"]}, "b/bundle.so", h100)
    _check_cuda_binaries({"device": "cuda", "cuda_arches": ["sm_90"]}, "b/bundle.so", h100)


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory, branchy_model):
    from tvm_interop.passes.profile_bundle import build_profile_bundle

    # NCHW: the test below relies on greedy never having more units ready than streams, which the layout
    # transforms of a channel-blocked build (an 8-lane CPU blocks this model's 8 channels) would break
    program = tvm_interop.api.prepare_program(branchy_model, "llvm", name="branchy", layout="nchw")
    d = str(tmp_path_factory.mktemp("bundle"))
    b = build_profile_bundle(program, "llvm", d)
    return d, b, program


def test_bundle_holds_every_candidate_stage(bundle_dir):
    d, b, program = bundle_dir
    assert sorted(os.listdir(d)) == ["bundle.json", "bundle.so"]
    plan = json.load(open(os.path.join(d, "bundle.json")))
    assert plan["graph_fingerprint"] == program.graph.fingerprint()
    singles = [st for st in plan["stages"] if len(st["groups"]) == 1 and len(st["groups"][0]) == 1]
    assert sorted(st["groups"][0][0] for st in singles) == sorted(u.name for u in program.graph.units)
    sources = {s for st in plan["stages"] for s in st["sources"]}
    assert {"unit", "greedy", "ios"} <= sources
    assert all(st["function"].startswith("__tvm_interop_stage") for st in plan["stages"])
    keys = {json.dumps(sorted(map(tuple, st["groups"]))) for st in plan["stages"]}
    assert len(keys) == len(plan["stages"])  # no stage twice


@pytest.mark.parametrize("method", ["threads", "vm"])
def test_bundle_measure_and_schedule_on_cpu(bundle_dir, method, tmp_path):
    """The whole flow on this machine: bundle -> measured cost table -> schedulers asking only for stages in it."""
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.runtime.profile_bundle import measure_bundle

    d, b, program = bundle_dir
    out = str(tmp_path / "costs.json")
    table = measure_bundle(d, method=method, repeat=3, number=2, warmup=1, out=out)
    assert len(table["stages"]) == b.num_stages and os.path.exists(out)
    assert table["device"].startswith("cpu:") and table["graph_fingerprint"] == program.graph.fingerprint()
    assert all(st["latency"] > 0 for st in table["stages"])
    assert set(table["units"]) == {u.name for u in program.graph.units}
    cost = get_cost_model(f"table:{out};fallback=error")
    cost.check_graph(program.graph)
    # IOS's DP (and sequential, and greedy while no more units are ready than streams) ask for the same stages
    # whatever the costs: every one of them is in the table
    from tvm_interop.passes.profile_bundle import ios_options

    for name, opts in (("sequential", {}), ("greedy", {"max_block_size": 8}), ("ios", ios_options())):
        s = schedule_graph(program.graph, name, cost, **opts)
        s.validate(program.graph)
        assert s.predicted_latency > 0
    assert cost.misses == 0 and cost.hits > 100
    # LIOS places units by their (measured) latencies, so its stages may differ from the recorded ones: the
    # default fallback composes those from the measured units
    lenient = get_cost_model(f"table:{out}")
    s = schedule_graph(program.graph, "lios", lenient, streams=8)
    s.validate(program.graph)
    assert lenient.hits > 0


def test_table_fallbacks(bundle_dir, tmp_path, caplog):
    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.graph import Unit
    from tvm_interop.runtime.profile_bundle import measure_bundle

    d, b, program = bundle_dir
    out = str(tmp_path / "costs.json")
    measure_bundle(d, repeat=2, warmup=1, out=out)
    units = {u.name: u for u in program.graph.units}
    odd = [[units["lv"], units["lv1"], units["lv2"]], [units["lv12"]]]  # a chain of 3: never built (r = 2)
    with pytest.raises(InteropError, match="not in the cost table"):
        get_cost_model(f"table:{out};fallback=error").stage_latency(odd)
    cost = get_cost_model(f"table:{out}")
    with caplog.at_level(logging.WARNING, logger="tvm_interop.passes.cost.table"):
        est = cost.stage_latency(odd)
    assert est == pytest.approx(max(sum(cost.units[n] for n in ("lv", "lv1", "lv2")), cost.units["lv12"]))
    assert cost.misses == 1 and "lacks some stages" in caplog.text
    sim = get_cost_model(f"table:{out};fallback=sim:cpu")
    assert sim.stage_latency(odd) > 0
    with pytest.raises(InteropError, match="not in the cost table"):
        cost.unit_latency(Unit("stranger", "conv2d"))
    from conftest import make_branchy_model

    other = tvm_interop.api.prepare_program(make_branchy_model(channels=4), "llvm").graph
    with pytest.raises(InteropError, match="another model"):
        cost.check_graph(other)
    with pytest.raises(InteropError, match="not a tvm-interop cost table"):
        bad = tmp_path / "bad.json"
        bad.write_text("{}")
        get_cost_model(f"table:{bad}")
    with pytest.raises(InteropError, match="unknown cost table option"):
        get_cost_model(f"table:{out};nope=1")


def test_compile_with_a_measured_table(bundle_dir, tmp_path, branchy_model, branchy_input, branchy_reference):
    from tvm_interop.runtime.profile_bundle import measure_bundle

    d, _, _ = bundle_dir
    out = str(tmp_path / "costs.json")
    measure_bundle(d, repeat=2, warmup=1, out=out)
    cm = tvm_interop.compile(branchy_model, scheduler="ios", cost=f"table:{out}", max_block_size=8,
                             scheduler_options=dict(r=2, s=3, merge=False), name="branchy", guard=False,
                             layout="nchw")   # the bundle's graph
    np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, **TOL)
    assert cm.schedule.device.startswith("cpu:")
    cm.close()


def test_profile_cli(tmp_path, capsys):
    from tvm_interop.cli import main

    d = str(tmp_path / "b")
    assert main(["profile-bundle", "squeezenet", "--width", "0.125", "--image-size", "32", "-o", d, "--no-ios",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["stages"] >= summary["units"] and "ios" not in summary["sources"]
    assert main(["profile-measure", d, "--repeat", "2", "--warmup", "1", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["stages"] == summary["stages"] and os.path.exists(m["output"])


@needs_nvcc
@no_gpu
def test_cuda_bundle_builds_and_refuses_to_measure_without_gpu(tmp_path, branchy_model):
    from tvm_interop.passes.profile_bundle import BundleOptions, build_profile_bundle
    from tvm_interop.runtime.profile_bundle import measure_bundle

    program = tvm_interop.api.prepare_program(branchy_model, normalize_target("cuda"), name="branchy")
    b = build_profile_bundle(program, "cuda", str(tmp_path), BundleOptions(ios=False))
    assert b.plan["device"] == "cuda" and b.plan["target"] == "cuda -arch=sm_90"
    # the device clock's functions ship in the bundle (the native extension is linked in), or a note says why not
    if any("no device clock" in n for n in b.build_notes):
        from tvm_interop.passes import native_build

        with pytest.raises(native_build.NativeBuildError):
            native_build.build_extension()
    else:
        assert b"tvm_interop.cuda.stream_hold" in open(os.path.join(tmp_path, b.plan["library"]), "rb").read()
    with pytest.raises(DeviceError, match="no CUDA device"):
        measure_bundle(str(tmp_path))
    with pytest.raises(DeviceError, match="no CUDA device"):
        measure_bundle(str(tmp_path), device_clock=True)


# ---------------------------------------------------------------------------------------------- GPU check script
def test_gpu_check_dry_run_on_cpu(tmp_path):
    """scripts/gpu_check.py end to end with target llvm: build (weights as parameters), run, report."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    d, out = str(tmp_path / "gc"), str(tmp_path / "out")
    script = os.path.join(repo, "scripts", "gpu_check.py")
    subprocess.run([sys.executable, script, "build", "--target", "llvm", "--models", "squeezenet", "--width", "0.125",
                    "--image-size", "32", "--dir", d, "--no-kit", "--schedulers", "sequential,greedy"], check=True,
                   capture_output=True)
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    libs = os.listdir(os.path.join(d, "libs"))
    # the model's libraries, and the host-cost probe (gpucheck/probe.py)
    assert sorted(libs) == ["probe.so.xz", "squeezenet.plain.so.xz", "squeezenet.sched.so.xz", "squeezenet.torch.json"]
    assert manifest["probe"]["library"] == "libs/probe.so" and manifest["probe"]["device"] == "cpu"
    total = sum(os.path.getsize(os.path.join(d, "libs", f)) for f in libs)
    assert total < 2 * 2**20  # weights are not in the libraries
    # plain x2, (sequential, greedy) x (stage, dep) x 2, and greedy (dependency) with the old wait placement x 2
    assert len(manifest["models"][0]["variants"]) == 12
    # the run and diagnose steps need TVM's runtime only (no compiler library), as on the GPU machine
    runtime_only = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    r = subprocess.run([sys.executable, script, "run", "--dir", d, "--out", out, "--repeat", "100", "--warmup", "2"],
                       capture_output=True, text=True, env=runtime_only)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.load(open(os.path.join(out, "gpu_check.json")))
    variants = result["models"][0]["variants"]
    assert all(v["ok"] for v in variants) and all(v["repeat"] == 100 for v in variants)
    md = open(os.path.join(out, "gpu_check.md")).read()
    assert "| greedy |" in md and "plain TVM" in md
    picked = result["models"][0]["picked"]["greedy"]
    assert picked["never_slower"] and picked["choice"] in picked["candidates"]
    assert not any("[waits at consumer]" in c for c in picked["candidates"])   # a comparison, not a candidate
    assert result["environment"]["tvm"] and result["environment"]["nvcc"]
    # the race check (on a CPU: every variant exact, serialized run included)
    r = subprocess.run([sys.executable, script, "diagnose", "--dir", d, "--out", out, "--runs", "2"],
                       capture_output=True, text=True, env=runtime_only)
    assert r.returncode == 0, r.stderr[-2000:]
    diag = json.load(open(os.path.join(out, "gpu_check_diagnose.json")))
    verdicts = [v["verdict"] for v in diag["models"][0]["variants"]]
    assert verdicts == ["exact"] * 6 and all(v["serialized"] for v in diag["models"][0]["variants"])


@needs_nvcc
def test_cuda_bundle_times_a_program_in_both_lowerings(tmp_path, branchy_model):
    """A bundle's whole program in dependency mode (``mode: "dependency"``, what the active search adds for each
    GPU pick) issues exactly the waits, stream switches and kernels of the dependency-mode lowering
    (``plan_streams``) in its built function, where the stage-mode twin forks and joins at every stage; the CUDA
    build succeeds with both; an unknown mode is refused."""
    from tvm_interop.passes.lower_streams import plan_streams
    from tvm_interop.passes.profile_bundle import (BundleOptions, _build_stage_module, _tensor_table,
                                                   build_profile_bundle)
    from tvm_interop.passes.schedulers import schedule_graph

    program = tvm_interop.api.prepare_program(branchy_model, normalize_target("cuda"), name="branchy")
    sched = schedule_graph(program.graph, "greedy", "sim:h100", model_name="branchy")
    assert any(len(st.groups) > 1 for st in sched.stages)
    stages = [st.groups for st in sched.stages]
    programs = [{"name": "p", "stages": stages}, {"name": "p [dependency]", "stages": stages, "mode": "dependency"}]
    tensors, units, _ = _tensor_table(program)
    n = max(len(g) for g in stages)
    mod = _build_stage_module(program, [], units, tensors, "cuda", n, [dict(p) for p in programs])

    def calls(fn) -> list[str]:
        out = []
        for b in mod[fn].body.blocks:
            for binding in b.bindings:
                v = binding.value
                if isinstance(v, tvm.relax.Call) and isinstance(v.op, tvm.relax.ExternFunc):
                    out.append(str(v.op.global_symbol))
        return out

    kinds = {"runtime.Device_StreamSyncFromTo": "sync", "runtime.Device_SetStream": "set"}
    unit_funcs = {spec["func"] for spec in units.values()}

    def issued(fn) -> list[str]:   # the function's waits, switches and kernels, in order
        out = []
        for b in fn.body.blocks:
            for binding in b.bindings:
                v = binding.value
                if isinstance(v, tvm.relax.Call) and isinstance(v.op, tvm.relax.ExternFunc):
                    if str(v.op.global_symbol) in kinds:
                        out.append(kinds[str(v.op.global_symbol)])
                elif isinstance(v, tvm.relax.Call) and isinstance(v.op, tvm.ir.GlobalVar) \
                        and v.op.name_hint in unit_funcs:
                    out.append("unit")
        return out

    plan = plan_streams(program, sched, mode="dependency", num_streams=n, keep_alive=False)
    stage_plan = plan_streams(program, sched, mode="stage", num_streams=n, keep_alive=False)
    assert issued(mod["__tvm_interop_program1"]) == [op.kind for op in plan.ops]
    assert issued(mod["__tvm_interop_program0"]) == [op.kind for op in stage_plan.ops]
    assert stage_plan.count("sync") != plan.count("sync")
    # a stage function forks and joins its stage as the stage-mode lowering does
    wide = max(range(len(stages)), key=lambda k: len(stages[k]))
    one = _build_stage_module(program, [{"groups": stages[wide]}], units, tensors, "cuda", n)
    assert issued(one["__tvm_interop_stage0"]) == [op.kind for op in stage_plan.ops if op.stage == wide]
    b = build_profile_bundle(program, "cuda", str(tmp_path / "b"), BundleOptions(ios=False),
                             stages=[{"groups": [[u.name]]} for u in program.graph.units], programs=programs)
    assert [(p["name"], p["mode"]) for p in b.plan["programs"]] == [("p", "stage"), ("p [dependency]", "dependency")]
    with pytest.raises(InteropError, match="unknown program mode 'graph'"):
        build_profile_bundle(program, "cuda", str(tmp_path / "c"), BundleOptions(ios=False),
                             stages=[], programs=[{"name": "q", "stages": stages, "mode": "graph"}])
