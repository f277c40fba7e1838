"""scripts/gpu_check (build here, run / diagnose on a GPU machine with TVM's runtime only), checked on this CPU.

Why these tests: the GPU machine has TVM's runtime and no compiler, and a session there is expensive, so whatever
can fail there for a reason visible here must fail here first:

* the run and diagnose steps import nothing compiler-only (``passes``, the ``tvm_interop`` front door,
  ``tvm.relax``, ...): checked by running them with ``TVM_USE_RUNTIME_LIB=1`` and an import blocker;
* a library that holds CUDA *source* (TVM would compile it at load, which needs the compiler) is refused up front
  with a clear message, not with TVM's ``TargetCurrent`` error from deep inside the loader;
* the PyTorch replay (graph JSON written at build time, rebuilt by ``tvm_interop.export.torch_interp``) computes
  what TVM computes on every zoo model, randwire's scalar constants included;
* the reports carry the environment (driver, nvcc, device, compute capability, SMs, CUDA runtime, TVM, Python);
* the diagnose step classifies variants exact / racy / wrong;
* ``build`` still builds a real CUDA library (fatbin, well-formed manifest): slow, needs nvcc.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "gpu_check.py")
SHELL = os.path.join(REPO, "scripts", "gpu_check.sh")

from runtime_only import assert_runtime_only as _assert_runtime_only  # noqa: E402
from runtime_only import runtime_only_env  # noqa: E402


def _runtime_only_env(tmp_path) -> tuple[dict, str]:
    """The GPU machine's environment (``runtime_only``), with one kernel thread. In the parallel test pass a
    CPU dry run's ``run`` step sometimes took 160 s instead of a few (in four suite runs of 2026-11-27/28, in
    two different tests, one of them with fused variants at 5-6 ms a run instead of 0.06 ms); alone, beside a busy
    core or beside another TVM process it never did, and with one kernel thread no kernel waits for a second
    thread. These tests check the runtime-only environment and the reports, not the CPU's speed."""
    env, log = runtime_only_env(tmp_path)
    env["TVM_NUM_THREADS"] = "1"
    return env, log


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gc = _load_gpu_check()
from gpucheck import device as gcdev  # noqa: E402 - gpu_check puts scripts/ on sys.path
from gpucheck import diagnose as gcdiag  # noqa: E402


def _gc(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def dry_build(tmp_path_factory) -> str:
    """A CPU dry run of the build (target llvm, squeezenet, tiny): the same manifest and libraries as a CUDA
    build, in seconds."""
    d = str(tmp_path_factory.mktemp("gpu_check") / "build")
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--width", "0.125", "--image-size", "32",
            "--dir", d, "--no-kit", "--schedulers", "sequential,greedy,greedy+wave,ios", "--unit-costs", "squeezenet")
    assert r.returncode == 0, r.stderr[-3000:]
    # ios merges SqueezeNet's expand convolutions: built merged, as tvm_interop.compile ships them. On a CPU whose
    # vector (16 lanes with AVX-512) does not divide the narrow config's 24 channels, this dry run pads its two
    # 24-channel 3x3 expand convolutions to 32 and slices them, which leaves 6 of the 8 pairs (8 lanes: all 8)
    from tvm_interop.passes.kernels.cpu_schedule import vector_lanes
    from tvm_interop.passes.target import normalize_target

    merged = 8 if 24 % vector_lanes(normalize_target("llvm")) == 0 else 6
    assert f"squeezenet: ios: {merged} merge stage(s) applied" in r.stderr
    return d


# ------------------------------------------------------------------------------------- 1. runtime only
def test_run_and_diagnose_need_only_tvm_runtime(dry_build, tmp_path):
    """Both GPU-side steps, end to end, with libtvm_runtime alone and every compiler-only import blocked (the
    diagnose step's serialized child process included); the run's report records the environment and the commit
    the carried build was made from."""
    env, log = _runtime_only_env(tmp_path)
    out = str(tmp_path / "out")
    r = _gc("run", "--dir", dry_build, "--out", out, "--repeat", "100", "--warmup", "1", "--pick-rounds", "2",
            env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _gc("diagnose", "--dir", dry_build, "--out", out, "--runs", "2", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    _assert_runtime_only(log, processes=3)   # run, diagnose, diagnose's serialized child
    result = json.load(open(os.path.join(out, "gpu_check.json")))
    assert result["runtime_only"] == {"tvm_compiler_loaded": False, "compiler_modules": []}
    assert all(v["ok"] for v in result["models"][0]["variants"])
    assert {"ios", "ios + CUDA graph"} <= {v["name"] for v in result["models"][0]["variants"]}
    # the unit bundle (--unit-costs), measured with the runtime alone into the table `build --auto` reads
    uc = result["models"][0]["unit_costs"]
    table = json.load(open(os.path.join(out, uc["table"])))
    assert uc["table"] == os.path.join("unit_costs", "squeezenet.json") and table["format"] == "tvm-interop-cost-table"
    assert uc["units"] == len(table["units"]) == result["models"][0]["units"] and uc["all_tvm_us"] > 0
    assert uc["offloadable"] == 0   # a CPU dry run has no library calls to compare with
    assert "Unit table `unit_costs/squeezenet.json`" in open(os.path.join(out, "gpu_check.md")).read()
    # the host-cost probe ran first, with the runtime alone (on a CPU the stream calls are no-ops, no event pool)
    probe = result["probe"]["per_op"]
    assert set(probe) == {"kernel_2", "kernel_4", "kernel_8", "tvm_sync_idle", "tvm_sync_busy", "set_stream",
                          "keepalive_16"}
    assert all(math.isfinite(v["host_us"]) and math.isfinite(v["total_us"]) for v in probe.values())
    assert "Host cost per op (probe)" in open(os.path.join(out, "gpu_check.md")).read()
    assert set(ENV_KEYS) <= set(result["environment"])
    assert result["models"][0]["kernels"] == {"libs/squeezenet.plain.so": [], "libs/squeezenet.sched.so": [],
                                              "bundles/squeezenet/bundle.so": []}
    md = open(os.path.join(out, "gpu_check.md")).read()
    assert "| compute capability |" in md and "| CUDA runtime |" in md
    # the code the carried build holds: the commit it was made from (a build may run on the GPU much later)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    assert result["build"]["built_from"].startswith(rev.strip()) and f"built from {rev.strip()}" in md


def test_torch_replay_needs_only_tvm_runtime(tmp_path):
    """The PyTorch baseline's import chain on the GPU machine: the graph JSON is made here (compiler), replayed
    there with the shared interpreter, loaded without the ``tvm_interop`` package (whose front door is the
    compiler-side API)."""
    pytest.importorskip("torch")
    from tvm_interop.export import graph_to_json, read_relax
    from tvm_interop.models import get_model

    path = tmp_path / "randwire.torch.json"
    path.write_text(json.dumps(graph_to_json(read_relax(get_model("randwire", width=0.125, image_size=32,
                                                                   depth=5)))))
    env, log = _runtime_only_env(tmp_path)
    code = (f"import importlib.util, json, sys\n"
            f"spec = importlib.util.spec_from_file_location('gc', {SCRIPT!r})\n"
            f"gc = importlib.util.module_from_spec(spec); spec.loader.exec_module(gc)\n"
            f"y = gc.torch_runner(json.load(open({str(path)!r})), 'cpu', seed=1)()\n"
            f"assert y.shape[0] == 1 and bool(y.isfinite().all())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    _assert_runtime_only(log, processes=1)


# ------------------------------------------------------------------------------------- CUDA source refused
def _cuda_source_library(path: str) -> None:
    """A tiny Relax program built for CUDA and exported as TVM does without a GPU: CUDA source inside."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(relax.op.add(x, x))
        bb.emit_func_output(y)
    tvm.compile(bb.get(), tvm.target.Target({"kind": "cuda", "arch": "sm_90"})).export_library(path)


def test_kernel_formats_are_read_from_the_library_bytes(tmp_path):
    src = str(tmp_path / "src.so")
    _cuda_source_library(src)
    assert gcdev.cuda_kernel_formats(src) == ["cuda"]
    # a library whose CUDA module holds a fatbin (the layout passes.cuda_compile writes), and one without CUDA
    fake = struct.pack("<Q", 4) + b"cuda" + struct.pack("<Q", 8 + 6 + 8 + 16) + struct.pack("<Q", 6) + b"fatbin"
    (tmp_path / "bin.so").write_bytes(b"\0" * 64 + fake + struct.pack("<Q", 0) + struct.pack("<Q", 8) + b"\x50" * 8)
    assert gcdev.cuda_kernel_formats(str(tmp_path / "bin.so")) == ["fatbin"]
    (tmp_path / "cpu.so").write_bytes(b"\x7fELF" + b"\0" * 100)
    assert gcdev.cuda_kernel_formats(str(tmp_path / "cpu.so")) == []


@pytest.mark.parametrize("step", ["run", "diagnose"])
def test_library_with_cuda_source_is_refused(tmp_path, step):
    """No load-time compile on the GPU machine: a library holding CUDA source stops the step before anything is
    loaded, naming the library and the fix."""
    d = tmp_path / "gc"
    (d / "libs").mkdir(parents=True)
    _cuda_source_library(str(d / "libs" / "m.plain.so"))
    manifest = {"format": "tvm-interop-gpu-check", "version": 1, "device": "cuda", "target": "cuda -arch=sm_90",
                "seed": 0, "width": 1.0, "image_size": None, "batch": 1, "cost": "sim:h100", "max_streams": 8,
                "models": [{"name": "m", "units": 1, "image_size": 4, "inputs": [{"shape": [4, 8],
                                                                                   "dtype": "float32"}],
                            "weights": [], "variants": [{"name": "plain TVM", "library": "libs/m.plain.so",
                                                          "function": "main", "streams": None}]}]}
    (d / "manifest.json").write_text(json.dumps(manifest))
    env, _ = _runtime_only_env(tmp_path)
    args = ["--repeat", "100"] if step == "run" else []
    r = _gc(step, "--dir", str(d), "--out", str(tmp_path / "out"), *args, env=env)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "CUDA source" in r.stderr and "libs/m.plain.so" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------------------------------- 2. PyTorch replay
ZOO = ["googlenet", "inception_v3", "nasnet_a_large", "nasnet_a_mobile", "randwire", "resnet50", "squeezenet"]


def test_zoo_list_is_complete():
    from tvm_interop.models import list_models

    assert sorted(ZOO) == list_models()


@pytest.mark.parametrize("name", ZOO)
def test_torch_replay_matches_plain_tvm(name):
    """The op list written at build time, through JSON, replayed by the GPU check's runner with torch on the CPU
    with the model's own weights, equals a plain TVM llvm build; with random weights (what the device runs) it
    is finite. randwire's scalar constants (shape ()) are what broke the first replay."""
    torch = pytest.importorskip("torch")
    import tvm_interop
    from tvm_interop.models import MODELS, get_model

    spec = MODELS[name]
    kw = {"depth": spec.min_depth} if spec.depth_param is not None else {}
    mod = get_model(name, width=0.25, image_size=max(spec.min_image_size, 32), **kw)
    values: dict = {}
    data = json.loads(json.dumps(gc.torch_program(mod, values)))
    x = np.random.default_rng(0).standard_normal(data["inputs"][0][1]).astype("float32")   # [name, shape, dtype]
    with torch.inference_mode():
        got = gc.torch_runner(data, "cpu", constants=values, inputs=[x])().numpy()
        finite = bool(gc.torch_runner(data, "cpu", seed=1)().isfinite().all())
    np.testing.assert_allclose(got, tvm_interop.run_reference(mod, [x]), rtol=1e-4, atol=1e-4, err_msg=name)
    assert finite, name
    if name == "randwire":
        assert any(c["shape"] == [] for c in data["constants"].values())


# ------------------------------------------------------------------------------------- 3. diagnose
def test_classify():
    tol = 1e-3
    ok = {"max_err": 0.0, "run_to_run": 0.0}
    bad = {"max_err": 0.5, "run_to_run": 0.0}
    unstable = {"max_err": 1e-4, "run_to_run": 0.2}
    assert gcdiag.classify(ok, None, tol) == "exact"
    assert gcdiag.classify(unstable, ok, tol) == "racy"
    assert gcdiag.classify(bad, ok, tol) == "racy"
    assert gcdiag.classify(bad, bad, tol) == "wrong"
    assert gcdiag.classify(bad, None, tol) == "unknown"
    assert gcdiag.classify({"error": "boom"}, None, tol) == "error"


def test_spread_is_pairwise():
    a, b, c = np.zeros(3), np.array([0.0, 1.0, 0.0]), np.array([0.0, -1.0, 0.0])
    s = gcdiag.spread([a, b, c], a)
    assert s["runs"] == 3 and s["run_to_run"] == 2.0 and s["max_err"] == 1.0 and s["max_err_per_run"] == [0, 1, 1]


def test_diagnose_report(dry_build, tmp_path):
    out = str(tmp_path / "out")
    r = _gc("diagnose", "--dir", dry_build, "--out", out, "--runs", "3")
    assert r.returncode == 0, r.stderr[-3000:]
    diag = json.load(open(os.path.join(out, "gpu_check_diagnose.json")))
    variants = diag["models"][0]["variants"]
    # every variant with streams, in the manifest's order (ios has some where it leaves a stage concurrent: with
    # all 8 of its merges built, on an 8-lane CPU; with 6, on AVX-512, it has none)
    manifest = json.load(open(os.path.join(dry_build, "manifest.json")))
    with_streams = [v["name"] for v in manifest["models"][0]["variants"] if v.get("num_streams")]
    assert [v["name"] for v in variants] == with_streams
    assert with_streams[:6] == ["greedy", "greedy + CUDA graph", "greedy (dependency)",
                                "greedy (dependency) + CUDA graph", "greedy (dependency) [waits at consumer]",
                                "greedy (dependency) [waits at consumer] + CUDA graph"]
    for v in variants:
        assert v["verdict"] == "exact" and v["runs"] == 3 and v["serialized"]["runs"] == 3
        assert v["run_to_run"] == 0.0 and len(v["max_err_per_run"]) == 3
    assert diag["runs"] == 3 and diag["environment"]["tvm"]
    md = open(os.path.join(out, "gpu_check_diagnose.md")).read()
    assert "| greedy (dependency) |" in md and "CUDA_LAUNCH_BLOCKING=1" in md and "| nvcc |" in md


# ------------------------------------------------------------------------------------- 4. environment
ENV_KEYS = ("device", "compute_capability", "sm_count", "driver", "cuda_driver_api", "cuda_runtime",
            "tvm_cuda_api", "nvcc", "tvm", "python", "torch")


def test_environment_of_a_cpu_run():
    import tvm

    env = gcdev.environment(tvm.cpu(0), False)
    assert set(ENV_KEYS) <= set(env)
    assert env["tvm"] == tvm.__version__ and env["python"].count(".") == 2
    assert env["nvcc"] == "not found" if shutil.which("nvcc") is None else env["nvcc"].startswith("release ")


class _FakeGpu:
    """A CUDA device whose every attribute query fails, as on a half-working driver."""

    def __getattr__(self, name):
        raise RuntimeError(f"no attribute {name} on this device")


def test_environment_is_robust_when_everything_is_missing(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(gcdev, "_loaded_library", lambda part: None)
    env = gcdev.environment(_FakeGpu(), True)
    assert set(ENV_KEYS) <= set(env)
    for k in ("device", "compute_capability", "sm_count", "driver", "nvcc", "cuda_runtime", "tvm_cuda_api"):
        assert env[k] == "not found", (k, env[k])
    json.dumps(env)


# ------------------------------------------------------------------------------------- 5. build (CUDA)
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the CUDA build needs nvcc")
def test_cuda_build_squeezenet(tmp_path):
    """``scripts/gpu_check.sh build --models squeezenet --width 0.25``: a real CUDA build, fatbins for sm_90 in
    every library, a well-formed manifest, the graph JSON for the PyTorch baseline, every dependency-mode variant
    with streams also with the waits of the builds before 2026-11-27, every scheduled variant also with reused
    events (``--sync tvm,events``), and the entry squeezenet+cudnn (library units) with the native extension
    linked in."""
    from tvm_interop.passes.cuda_compile import fatbin_arches, library_cuda_images

    d = tmp_path / "gc"
    r = subprocess.run(["bash", SHELL, "build", "--models", "squeezenet", "--width", "0.25", "--dir", str(d),
                        "--no-kit", "--sync", "tvm,events"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.load(open(d / "manifest.json"))
    assert m["format"] == "tvm-interop-gpu-check" and m["device"] == "cuda" and m["target"] == "cuda -arch=sm_90"
    entry, cudnn = m["models"]
    assert cudnn["name"] == "squeezenet+cudnn" and cudnn["library_units"] == 26 and not cudnn["left_to_tvm"]
    assert cudnn["variants"][0]["name"] == "plain TVM"   # the reference keeps TVM's own kernels
    assert entry["name"] == "squeezenet" and entry["units"] > 0 and entry["inputs"][0]["shape"] == [1, 3, 224, 224]
    assert all(len(w["shape"]) >= 1 for w in entry["weights"])
    names = [v["name"] for v in entry["variants"]]
    # 6 schedules (sequential, greedy, lios, ios, greedy+wave, lios+wave) x 2 modes x direct / CUDA graph, and
    # every one with streams again with reused events
    consumer = [n for n in names if "[waits at consumer]" in n]
    tvm_sync = [n for n in names[2:] if "[events]" not in n and n not in consumer]
    events = [n for n in names if "[events]" in n and n not in consumer]
    assert names[:2] == ["plain TVM", "plain TVM + CUDA graph"] and len(tvm_sync) == 6 * 2 * 2
    assert consumer and all("(dependency)" in n for n in consumer)
    assert all(n.replace(" [waits at consumer]", "") in names for n in consumer)
    assert events and all(n.replace(" [events]", "") in tvm_sync for n in events)
    assert not any(n.startswith("sequential") for n in events)   # nothing to order
    assert {"greedy+wave", "lios+wave + CUDA graph", "greedy [events] + CUDA graph"} <= set(names)
    for v in entry["variants"][2:]:
        assert v["sync"] == ("events" if "[events]" in v["name"] else "tvm")
        assert v["waits"] == ("consumer" if "[waits at consumer]" in v["name"] else "stage-start")
    assert m["waits"] == "stage-start"
    # every direct stage-mode variant with TVM's sync (not wave-fused, not merged) has a timed twin: in-context
    # stage times, one per stage of its schedule
    timed = {v["name"]: v["stage_times"] for v in entry["variants"] if v.get("stage_times")}
    assert set(timed) == {n for n in ("sequential", "greedy", "lios", "ios") if n in names
                          and not next(v for v in entry["variants"] if v["name"] == n).get("weight_recipe")}
    for n, st in timed.items():
        v = next(v for v in entry["variants"] if v["name"] == n)
        assert len(st["stages"]) == len(st["predicted_ms"]) == v["stages"]
        assert st["function"].endswith("timed____tvm_interop_main") and st["read"].endswith("__tvm_interop_stage_times")
        units = [u for stage in st["stages"] for g in stage for u in g]
        assert len(units) == len(set(units)) == entry["units"]   # every unit once
    assert len(timed) >= 3
    # the host-cost probe: fatbins, with the reused-event probe (the native extension linked in)
    assert m["probe"]["kernel_formats"] == ["fatbin"] and "probe_event_sync_idle" in m["probe"]["functions"]
    assert (d / (m["probe"]["library"] + ".xz")).exists()
    for v in entry["variants"]:
        assert (d / (v["library"] + ".xz")).exists() and v["function"]
        if v["name"] != "plain TVM" and not v["name"].startswith("plain"):
            assert v["streams"] and v["mode"] in ("stage", "dependency")
    assert entry["kernels"] == {lib: ["fatbin"] for lib in {v["library"] for v in entry["variants"]}}
    for lib in entry["kernels"]:
        path = str(tmp_path / os.path.basename(lib))
        import lzma

        with lzma.open(d / (lib + ".xz")) as f, open(path, "wb") as g:
            g.write(f.read())
        assert [fatbin_arches(c) for _, c in library_cuda_images(path)] == [["sm_90"]]
        assert gcdev.cuda_kernel_formats(path) == ["fatbin"]
    graph = json.load(open(d / entry["torch_program"]))
    assert graph["inputs"][0][1] == [1, 3, 224, 224] and graph["nodes"]


def test_build_with_tuned_kernels_adds_an_entry_that_runs(tmp_path):
    """``build --tuned MODEL=DIR``: a second entry MODEL+tuned whose every variant uses the database's kernels;
    the runtime-only run step checks it like any other entry."""
    from tvm_interop.api import load_module, prepare_program
    from tvm_interop.passes.kernels.tuning import tune_program

    mod, name = load_module("squeezenet", batch_size=1, image_size=32, width=0.125)
    db = str(tmp_path / "db")
    tune_program(prepare_program(mod, "llvm", name=name), "llvm", db, trials=2, op_names=["conv2d_add_relu"],
                 num_trials_per_iter=2, quiet=True, baselines=False)
    d = str(tmp_path / "build")
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--width", "0.125", "--image-size", "32",
            "--dir", d, "--no-kit", "--schedulers", "sequential", "--modes", "stage", "--tuned", f"squeezenet={db}")
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.load(open(os.path.join(d, "manifest.json")))
    assert [m["name"] for m in manifest["models"]] == ["squeezenet", "squeezenet+tuned"]
    tuned = manifest["models"][1]
    assert tuned["tuned_kernels"] == ["fused_conv2d_add_relu"] and tuned["torch_program"] is None
    env, _ = _runtime_only_env(tmp_path)
    out = str(tmp_path / "out")
    r = _gc("run", "--dir", d, "--out", out, "--repeat", "100", "--warmup", "1", "--pick-rounds", "2", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.load(open(os.path.join(out, "gpu_check.json")))
    assert [m["name"] for m in result["models"]] == ["squeezenet", "squeezenet+tuned"]
    assert all(v.get("ok") is not False for m in result["models"] for v in m["variants"])
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--dir", d, "--no-kit", "--tuned", "resnet50=" + db)
    assert r.returncode != 0 and "not built" in r.stderr
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--dir", d, "--no-kit", "--unit-costs", "resnet50")
    assert r.returncode != 0 and "--unit-costs names models that are not built" in r.stderr
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--dir", d, "--no-kit", "--auto",
            f"squeezenet={d}/manifest.json")
    assert r.returncode != 0 and "need a CUDA target" in r.stderr
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--dir", d, "--no-kit", "--waits", "early")
    assert r.returncode != 0 and "--waits early: expected stage-start or consumer" in r.stderr
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--dir", d, "--no-kit", "--splitk", "squeezenet")
    assert r.returncode != 0 and "--splitk schedules CUDA kernels: they need a CUDA target" in r.stderr


def test_build_with_a_schedule_file_adds_its_variants(tmp_path):
    """``build --schedule MODEL:LABEL=FILE``: a schedule made elsewhere (here lios's, saved as ``tvm-interop schedule
    -o`` writes it) becomes the variants LABEL of that model and runs like the schedulers' own; a schedule of
    another model is refused by name, a malformed spec too."""
    import tvm_interop
    from tvm_interop.models import get_model
    from tvm_interop.passes.schedulers import schedule_graph

    mod = get_model("squeezenet", batch_size=1, image_size=32, width=0.125)
    program = tvm_interop.api.prepare_program(mod, {"kind": "llvm"}, name="squeezenet")
    path = str(tmp_path / "pick.json")
    schedule_graph(program.graph, "lios", "sim:h100", model_name="squeezenet").save(path)
    d = str(tmp_path / "build")
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--width", "0.125", "--image-size", "32",
            "--dir", d, "--no-kit", "--schedulers", "sequential", "--modes", "stage",
            "--schedule", f"squeezenet:active={path}", "--schedule", f"resnet50:active={path}")
    assert r.returncode == 0, r.stderr[-3000:]
    names = {v["name"] for v in json.load(open(os.path.join(d, "manifest.json")))["models"][0]["variants"]}
    assert {"active", "active + CUDA graph", "sequential"} <= names
    env, _ = _runtime_only_env(tmp_path)
    out = str(tmp_path / "out")
    r = _gc("run", "--dir", d, "--out", out, "--repeat", "100", "--warmup", "1", "--pick-rounds", "0", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.load(open(os.path.join(out, "gpu_check.json")))
    assert [v["ok"] for v in result["models"][0]["variants"] if v["name"] == "active"] == [True]
    other = str(tmp_path / "other.json")
    tiny = tvm_interop.api.prepare_program(get_model("squeezenet", batch_size=1, image_size=32, width=0.25),
                                           {"kind": "llvm"}, name="squeezenet")
    schedule_graph(tiny.graph, "sequential", "sim:h100", model_name="squeezenet").save(other)
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--width", "0.125", "--image-size", "32",
            "--dir", d, "--no-kit", "--schedulers", "sequential", "--schedule", f"squeezenet:active={other}")
    assert r.returncode != 0 and "different model" in r.stderr
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--dir", d, "--no-kit",
            "--schedule", f"squeezenet:my pick={path}")
    assert r.returncode != 0 and "MODEL:LABEL=FILE" in r.stderr


def test_build_with_two_differently_merged_schedules_keeps_each_ones_kernels(tmp_path):
    """Two schedules of one model with different IOS merges (``ios`` and a ``--schedule`` file without its first two
    merges) name their merged kernels alike (``..._merged``, in their own order): the build renames the later
    program's clashing kernels, calls included, instead of failing, and each variant computes plain TVM's output.
    A third with ios's own merges (``same``) makes merged kernels equal to ios's under the same names: its calls
    go to ios's (the build found no definition of them when three merged programs came together)."""
    import dataclasses

    import tvm_interop
    from tvm_interop.models import get_model
    from tvm_interop.passes.schedule import CONCURRENT, Stage
    from tvm_interop.passes.schedulers import schedule_graph

    mod = get_model("squeezenet", batch_size=1, image_size=32, width=0.125)
    program = tvm_interop.api.prepare_program(mod, {"kind": "llvm"}, name="squeezenet")
    ios = schedule_graph(program.graph, "ios", "sim:h100", model_name="squeezenet")
    merges = [k for k, st in enumerate(ios.stages) if st.strategy == "merge"]
    assert len(merges) >= 3
    stages = [Stage(st.groups, CONCURRENT) if k in merges[:2] else st for k, st in enumerate(ios.stages)]
    path = str(tmp_path / "fewer.json")
    dataclasses.replace(ios, stages=stages).save(path)
    same = str(tmp_path / "same.json")
    ios.save(same)
    d = str(tmp_path / "build")
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--width", "0.125", "--image-size", "32",
            "--dir", d, "--no-kit", "--schedulers", "ios", "--modes", "stage", "--no-stage-times",
            "--schedule", f"squeezenet:fewer={path}", "--schedule", f"squeezenet:same={same}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "squeezenet: fewer: %d merge stage(s) applied" % (len(merges) - 2) in r.stderr
    env, _ = _runtime_only_env(tmp_path)
    out = str(tmp_path / "out")
    r = _gc("run", "--dir", d, "--out", out, "--repeat", "100", "--warmup", "1", "--pick-rounds", "0", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    ok = {v["name"]: v["ok"] for v in json.load(open(os.path.join(out, "gpu_check.json")))["models"][0]["variants"]}
    assert ok["ios"] and ok["fewer"] and ok["fewer + CUDA graph"] and ok["same"], ok


def test_merged_module_calls_each_kept_function_through_its_own_global_var():
    """``gpucheck.build._merge`` keeps one function per name: a later module whose function of that name is the
    same (two merged programs that merged the same pair, each with its own GlobalVar) must call the kept one's
    GlobalVar, else the CUDA build finds no definition of what it calls (ios, ios_s2, ios_s4 of Inception-v3 in
    one library); a different function of that name is renamed, calls included."""
    import tvm
    from gpucheck.build import _merge
    from tvm import relax
    from tvm.script import tirx as T

    def kernel(scale: float):
        @T.prim_func(private=True, s_tir=True)
        def k(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
            for i in range(4):
                with T.sblock("b"):
                    vi = T.axis.spatial(4, i)
                    b[vi] = a[vi] * T.float32(scale)
        return k

    def module(main_name: str, scale: float):
        bb = relax.BlockBuilder()
        gv = bb.add_func(kernel(scale), "k_merged")
        x = relax.Var("x", relax.TensorType((4,), "float32"))
        with bb.function(main_name, [x]):
            y = bb.emit(relax.call_tir(gv, [x], relax.TensorType((4,), "float32")))
            bb.emit_func_output(y)
        return bb.get()

    merged = _merge([module("ios", 2.0), module("fewer", 3.0), module("same", 2.0)])
    own = {gv.name_hint: gv for gv in merged.get_global_vars()}
    assert sorted(own) == ["fewer", "ios", "k_merged", "k_merged__v2", "same"]
    for name, want in (("ios", "k_merged"), ("same", "k_merged"), ("fewer", "k_merged__v2")):
        called = [a for b in merged[name].body.blocks for bd in b.bindings for a in bd.value.args
                  if isinstance(a, tvm.ir.GlobalVar)]
        assert [g.name_hint for g in called] == [want] and called[0].same_as(own[want]), name
    ex = tvm.compile(merged, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.arange(4, dtype="float32")
    for name, scale in (("ios", 2.0), ("fewer", 3.0), ("same", 2.0)):
        np.testing.assert_allclose(vm[name](tvm.runtime.tensor(x)).numpy(), x * scale)


def test_report_prices_one_reused_event():
    """The report sets each '[events]' variant against its twin with TVM's per-call event: same program, same
    number of events, so the difference per event is the saving (an illustrative result, not a measurement)."""
    from gpucheck import report as gcreport

    model = {"name": "m", "units": 3, "image_size": 32, "variants": [
        {"name": "plain TVM", "median_ms": 1.0, "ok": True},
        {"name": "greedy (dependency)", "median_ms": 0.50, "ok": True, "syncs": 20, "sync": "tvm"},
        {"name": "greedy (dependency) [events]", "median_ms": 0.40, "ok": True, "syncs": 20, "sync": "events"},
        {"name": "lios [events]", "median_ms": 0.40, "ok": True, "syncs": 4, "sync": "events"}]}   # no twin
    rows = gcreport._events_table(model)
    assert len([r for r in rows if r.startswith("| greedy")]) == 1
    assert "| greedy (dependency) | 20 | 0.500 | 0.400 | 1.25x | +5.00 |" in rows
    assert "Reused events" in gcreport.render_markdown({"models": [model]})


def test_report_merges_the_runs_of_one_build():
    """A full run split into device calls by --models makes one report: the later runs' models appended, a
    probe taken where the first run has none; runs of another device or build, or repeating a model, are refused
    by name (their numbers do not belong in one table)."""
    from gpucheck import report as gcreport

    def run(models, device="NVIDIA H100 80GB HBM3", probe=None, compiler=False):
        return {"device": device, "compute_version": "9.0", "tvm": "0.27.0.post1", "repeat": 100, "warmup": 10,
                "timing": "median", "build": {"built_from": "abc"}, "probe": probe,
                "runtime_only": {"tvm_compiler_loaded": compiler, "compiler_modules": []},
                "models": [{"name": n, "units": 1, "image_size": 8,
                            "variants": [{"name": "plain TVM", "median_ms": 1.0, "ok": True}]} for n in models]}

    first, second = run(["inception_v3", "googlenet"]), run(["randwire"], probe={"launch_us": 2.0})
    merged = gcreport.merge_results([first, second])
    assert [m["name"] for m in merged["models"]] == ["inception_v3", "googlenet", "randwire"]
    assert merged["probe"] == {"launch_us": 2.0} and merged["merged_runs"] == 2
    assert [m["name"] for m in first["models"]] == ["inception_v3", "googlenet"]   # inputs left as they were
    assert "from 2 run calls" in gcreport.render_markdown(merged)
    assert gcreport.merge_results([first]) == first   # one run: the report as before
    assert gcreport.merge_results([first, run(["squeezenet"], compiler=True)])["runtime_only"][
        "tvm_compiler_loaded"] is True
    with pytest.raises(ValueError, match="'device'.*NVIDIA H200"):
        gcreport.merge_results([first, run(["randwire"], device="NVIDIA H200")])
    with pytest.raises(ValueError, match="repeats model 'googlenet'"):
        gcreport.merge_results([first, run(["googlenet"])])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="the CUDA build needs nvcc")
def test_cuda_build_with_split_reduction_kernels(tmp_path):
    """``build --splitk googlenet``: an entry googlenet+splitk whose scheduled variants run the split-reduction
    convolutions (passes.kernels.gpu_splitk), built to sm_90 fatbins and through the as-built memory check, and
    checked against plain TVM's own kernels by the run."""
    d = tmp_path / "gc"
    r = subprocess.run(["bash", SHELL, "build", "--models", "googlenet", "--width", "0.25", "--dir", str(d), "--no-kit",
                        "--cudnn", "", "--schedulers", "sequential,ios", "--splitk", "googlenet", "--unit-costs",
                        "googlenet"], capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.load(open(d / "manifest.json"))
    base, split = m["models"]
    assert split["name"] == "googlenet+splitk" and len(split["splitk_kernels"]) >= 5
    assert len(split["splitk_units"]) >= len(split["splitk_kernels"])   # a kernel may serve several units
    # its units timed with the split kernels too, in a bundle whose name the device tool can return
    assert base["unit_bundle"] == "bundles/googlenet" and split["unit_bundle"] == "bundles/googlenet-splitk"
    assert split["variants"][0]["name"] == "plain TVM"   # the reference: TVM's own kernels, as in every entry
    assert [v["name"] for v in split["variants"]] == [v["name"] for v in base["variants"]]
    assert "split-reduction kernels" in r.stderr


def test_splitk_unit_summary():
    """The units a +splitk entry rescheduled, against the base entry's unit table (made-up numbers)."""
    from gpucheck import report as gcreport
    from gpucheck.run import splitk_summary

    base = {"units": {"a": 98e-6, "b": 58e-6, "c": 10e-6},
            "stages": [{"groups": [["a"]], "strategy": "library", "latency": 94e-6}]}
    split = {"units": {"a": 12e-6, "b": 60e-6, "c": 10e-6}, "stages": []}
    sk = splitk_summary(base, split, ["a", "b", "missing"])
    assert sk["units"] == 2 and sk["splitk_faster"] == 1
    assert round(sk["dlight_us"]) == 156 and round(sk["splitk_us"]) == 72 and round(sk["best_of_three_us"]) == 70
    line = gcreport._splitk_line(sk)
    assert "faster than DLight's for 1" in line[1] and "156 us as DLight's kernels" in line[1]
    assert gcreport._splitk_line(None) == []


def test_report_sets_in_context_stage_costs_against_the_program():
    """The in-context stage table (illustrative numbers, not a measurement): the sum of the stages' in-context
    medians against the measured latency, and the stage the scheduler's own cost misses most."""
    from gpucheck import report as gcreport

    ic = {"stages_ms": [0.010, 0.050, 0.020], "predicted_stages_ms": [0.012, 0.020, 0.021], "sum_ms": 0.080,
          "timed_median_ms": 0.084, "ok": True}
    model = {"name": "m", "units": 3, "image_size": 32, "variants": [
        {"name": "ios", "median_ms": 0.082, "ok": True, "in_context": ic},
        {"name": "lios", "median_ms": 0.1, "ok": True, "in_context": {"error": "no GPU"}},
        {"name": "greedy", "median_ms": 0.1, "ok": True}]}
    rows = gcreport._in_context_table(model)
    assert "| ios | 3 | 0.082 | 0.084 | 0.080 | 0.98 | 0.053 | stage 1: 50 us in context, 20 us predicted |" in rows
    assert rows[-2] == "Not timed: lios: no GPU"
    assert "Stage costs in context" in gcreport.render_markdown({"models": [model]})


def test_report_sets_consumer_waits_against_stage_start():
    """'[waits at consumer]' variants (dependency mode as built before 2026-11-27) against their twins with the
    waits at the stage's start (illustrative numbers, not a measurement)."""
    from gpucheck import report as gcreport

    model = {"name": "m", "units": 3, "image_size": 32, "variants": [
        {"name": "ios (dependency)", "median_ms": 4.40, "ok": True, "waits": "stage-start"},
        {"name": "ios (dependency) [waits at consumer]", "median_ms": 6.38, "ok": True, "waits": "consumer"},
        {"name": "ios (dependency) [waits at consumer] + CUDA graph", "median_ms": 6.1, "ok": True},  # no twin
        {"name": "ios (dependency) [events] [waits at consumer]", "median_ms": 5.0, "ok": True},
        {"name": "ios (dependency) [events]", "median_ms": 4.0, "ok": True}]}
    rows = gcreport._waits_table(model)
    assert "| ios (dependency) | 6.380 | 4.400 | 1.45x |" in rows
    assert "| ios (dependency) [events] | 5.000 | 4.000 | 1.25x |" in rows
    assert len([r for r in rows if r.startswith("| ios")]) == 2
    assert "waits at the stage's start" in gcreport.render_markdown({"models": [model]})


def test_unit_table_summary_and_library_host_time():
    """A unit table's summary: per offloadable unit the faster of TVM kernel and library call (what
    ``build --auto`` would run), and the report's rows of host time per direct library call (made-up numbers)."""
    from gpucheck import report as gcreport
    from gpucheck.run import unit_cost_summary

    table = {"units": {"a": 10e-6, "b": 20e-6, "pool": 5e-6}, "method": "time_evaluator (CUDA events)",
             "stages": [{"groups": [["a"]], "strategy": "library", "latency": 4e-6},
                        {"groups": [["b"]], "strategy": "library", "latency": 30e-6},
                        {"groups": [["a"]], "strategy": "concurrent", "latency": 10e-6}]}
    s = unit_cost_summary(table)
    assert (s["units"], s["offloadable"], s["library_faster"]) == (3, 2, 1)
    assert s["all_tvm_us"] == pytest.approx(35) and s["offloadable_tvm_us"] == pytest.approx(30)
    assert s["offloadable_library_us"] == pytest.approx(34) and s["offloadable_faster_us"] == pytest.approx(24)
    model = {"name": "m+cudnn", "units": 3, "image_size": 32, "unit_costs": {"table": "unit_costs/m.json", **s},
             "variants": [{"name": "sequential", "median_ms": 1.0, "ok": True,
                           "library_host_us": {"conv2d": {"calls": 260, "prepare_us": 1.5, "library_us": 17.25}}}]}
    md = gcreport.render_markdown({"models": [model]})
    assert "| sequential | conv2d | 260 | 1.5 | 17.2 |" in md
    assert "library call measured faster for 1; together they take 30 us as TVM kernels, 34 us" in md


def test_engines_pass_picks_its_variants_and_is_reported_and_counted():
    """The measured-cuDNN-engines pass (``run --no-cudnn-engines`` skips it): it re-times sequential direct and
    with CUDA graph plus the two fastest other correct variants (never plain TVM, a failed one, or a timed twin's
    stage timing); the report sets each against its legacy time and lists the per-shape choices; the issue-13
    target counts its rows. Illustrative numbers, not a measurement."""
    from gpucheck import report as gcreport
    from gpucheck import targets
    from gpucheck.run import ENGINES_SUFFIX, _engine_variants, engine_choice_summary

    names = ["plain TVM", "sequential", "sequential + CUDA graph", "greedy", "lios + CUDA graph", "ios",
             "ios + CUDA graph"]
    entry = {"name": "m+cudnn", "variants": [{"name": n, "function": n, "stage_times": True} for n in names]}
    med = {"plain TVM": 9.0, "sequential": 5.0, "sequential + CUDA graph": 4.9, "greedy": 4.0,
           "lios + CUDA graph": 3.0, "ios": 3.5, "ios + CUDA graph": 2.0}
    legacy = [{"name": n, "median_ms": med[n], "ok": n != "ios + CUDA graph"} for n in names]
    picked = _engine_variants(entry, {"variants": legacy})
    assert [v["name"] for v in picked] == ["sequential", "sequential + CUDA graph", "lios + CUDA graph", "ios"]
    assert not any("stage_times" in v for v in picked)

    choices = {"policy": "measured", "choices": [
        {"shape": "x [1, 64, 35, 35] w [96, 64, 3, 3] stride 1x1 pad 1x1 dilation 1x1 groups 1 +bias relu",
         "chosen": "graph engine 7 (conv only)", "legacy_us": 40.0, "chosen_us": 25.0,
         "tried": [["legacy", 40.0], ["graph engine 7 (conv only)", 25.0], ["graph engine 0 (fused)", -1]],
         "dropped": ["fused: 3 TF32 engine(s), 1 runtime-compiled, 0 not finalized, 0 over the workspace limit"]},
        {"shape": "x [1, 2048, 8, 8] w [320, 2048, 1, 1] stride 1x1 pad 0x0 dilation 1x1 groups 1 +bias relu",
         "chosen": "legacy", "legacy_us": 20.0, "chosen_us": 20.0, "tried": [["legacy", 20.0]], "dropped": []}]}
    summary = engine_choice_summary(choices)
    assert summary["graph_chosen"] == 1 and summary["legacy_us"] == 60 and summary["chosen_us"] == 45
    rows = [{"name": "sequential" + ENGINES_SUFFIX, "median_ms": 4.0, "ok": True, "max_abs_err": 1e-6},
            {"name": "sequential + CUDA graph" + ENGINES_SUFFIX, "median_ms": 3.8, "ok": True, "max_abs_err": 1e-6}]
    model = {"name": "m+cudnn", "units": 3, "image_size": 32, "variants": legacy,
             "cudnn_engines": {"variants": rows, **summary}}
    md = gcreport.render_markdown({"models": [model]})
    assert "| sequential + CUDA graph [measured cuDNN engines] | 4.900 | 3.800 | 1.29x | ok (1.0e-06) |" in md
    assert "2 convolution shapes; a graph engine chosen for 1;" in md and "legacy 60 us, chosen 45 us (1.33x)" in md
    assert "| x [1, 64, 35, 35] w [96, 64, 3, 3]" in md and "3 TF32 engine(s)" in md
    # the measured default (2026-11-27 on): the pass re-times under legacy; the speed-up still reads legacy/measured
    measured_main = [{**v, "first_call_ms": 812.5} if v["name"] == "sequential" else v for v in legacy]
    legacy_rows = [{"name": "sequential [legacy cuDNN engines]", "median_ms": 6.0, "ok": True, "max_abs_err": 0.0}]
    md2 = gcreport.render_markdown({"models": [{**model, "variants": measured_main, "cudnn_engines": {
        "policy": "legacy", "default_policy": "measured", "variants": legacy_rows, **summary}}]})
    assert "Legacy cuDNN engines (`TVM_INTEROP_CUDNN_ENGINES=legacy`" in md2
    assert "| variant | measured ms | legacy ms | measured over legacy | output |" in md2
    assert "| sequential [legacy cuDNN engines] | 5.000 | 6.000 | 1.20x | ok (0.0e+00) |" in md2
    assert "First call of `sequential` (measured engines; handles, workspaces and the engine choice per shape): " \
           "812.5 ms, then 5.000 ms per call." in md2
    failed = gcreport.render_markdown({"models": [{**model, "cudnn_engines": {"error": "RuntimeError: boom"}}]})
    assert "Measured cuDNN engines: the pass failed: RuntimeError: boom" in failed

    torch = {"name": targets.TORCH_GRAPH, "median_ms": 4.0, "ok": None}
    result = {"models": [{"name": "inception_v3", "variants": [torch]},
                         {**model, "name": "inception_v3+cudnn"}]}
    seq = targets.against_pytorch(result)["sequential"]["inception_v3"]
    assert seq["variant"] == "sequential + CUDA graph" + ENGINES_SUFFIX and seq["met"]   # 3.8 / 4.0


@pytest.mark.parametrize("default", ["legacy", "measured"])
def test_engines_pass_runs_under_the_other_policy_and_restores_it(monkeypatch, default):
    """``run_engines`` sets the policy the library does not run by default (measured against a legacy default,
    legacy against the measured default of 2026-11-27) for its variants only, checks each against plain TVM, and
    sets the policy back, also when a variant fails; the per-shape choices come from whichever pass ran measured.
    The programs here are numpy stand-ins for the loaded libraries (the pass's bookkeeping is what is tested; the
    engines themselves need a GPU)."""
    import types

    import numpy as np
    import tvm

    from gpucheck import run as gcrun
    from tvm_interop.runtime import native_libs

    policy = [default]
    other = "legacy" if default == "measured" else "measured"
    seen = []

    def set_policy(p=None):
        old = policy[0]
        if p is not None:
            policy[0] = p
        return old

    class FakeVariants:
        library_units = False

        def __init__(self, *a):
            pass

        def call(self, var):
            def run():
                seen.append((var["name"], policy[0]))
                if var["name"] == "ios":
                    raise RuntimeError("tvm_interop.cudnn.conv2d: cudnnBackendExecute failed")
                value = 2.0 if var["name"] == "sequential + CUDA graph" else 1.0
                return tvm.runtime.tensor(np.full(4, value, "float32"))
            return run

        def close(self):
            seen.append(("closed", policy[0]))

    monkeypatch.setattr(gcrun, "Variants", FakeVariants)
    monkeypatch.setattr(native_libs, "cudnn_engine_policy", set_policy)
    monkeypatch.setattr(native_libs, "cudnn_conv_choices",
                        lambda reset=False: {"policy": policy[0], "choices": []})
    names = ["plain TVM", "sequential", "sequential + CUDA graph", "ios"]
    entry = {"name": "m+cudnn", "variants": [{"name": n} for n in names]}
    main_choices = {"shapes": [{"shape": "x", "chosen": "graph engine 7 (fused)", "legacy_us": 4.0,
                                "chosen_us": 3.0, "tried": [], "dropped": []}],
                    "graph_chosen": 1, "legacy_us": 4.0, "chosen_us": 3.0, "dropped": {}}
    model = {"variants": [{"name": n, "ok": True, "median_ms": 1.0} for n in names],
             **({"cudnn_choices": main_choices} if default == "measured" else {})}
    args = types.SimpleNamespace(dir="unused", warmup=1, repeat=2)
    out = gcrun.run_engines(args, {"seed": 0}, entry, model, types.SimpleNamespace(sync=lambda: None))
    assert {p for n, p in seen if n != "closed"} == {other} and seen[-1] == ("closed", default)
    assert policy == [default] and out["policy"] == other and out["default_policy"] == default
    recs = {r["name"]: r for r in out["variants"]}
    assert recs[f"sequential [{other} cuDNN engines]"]["ok"] is True
    assert recs[f"sequential + CUDA graph [{other} cuDNN engines]"]["ok"] is False      # computed 2, not 1
    assert "cudnnBackendExecute failed" in recs[f"ios [{other} cuDNN engines]"]["error"]
    assert recs[f"sequential [{other} cuDNN engines]"]["first_call_ms"] >= 0
    if default == "legacy":      # the choices of this pass: none made by the stand-ins
        assert out["shapes"] == [] and out["graph_chosen"] == 0
    else:                        # the main pass ran the measured engines: its choices are the report's
        assert out["shapes"] == main_choices["shapes"] and out["graph_chosen"] == 1


def test_kernel_profiles_are_summarised_and_reported():
    """``gpucheck.kernel_profile``: per-run device time by kernel and class from torch.profiler's aggregated
    events (GPU events only: the host op that launched kernels would count them twice), and the report's tables
    for PyTorch eager and our sequential program with the legacy and the measured engines (``run_profiles``, last
    in the run). Illustrative events."""
    import types

    from gpucheck import report as gcreport
    from gpucheck.kernel_profile import kernel_class, summarise

    def ev(key, us, count, device="DeviceType.CUDA"):
        return types.SimpleNamespace(key=key, self_device_time_total=us, count=count, device_type=device)

    events = [ev("sm90_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw", 500.0, 50),
              ev("implicit_convolve_sgemm", 250.0, 25), ev("cudnn::bn_fw_inf_1C11_kernel_NCHW", 100.0, 50),
              ev("fused_max_pool2d_kernel", 25.0, 5), ev("aten::conv2d", 750.0, 75, device="DeviceType.CPU"),
              ev("Memset (Device)", 0.0, 5)]
    p = summarise(events, runs=5)
    assert p["kernels"] == 4 and p["total_us"] == pytest.approx(175.0)
    assert p["classes"] == {"convolution / GEMM": pytest.approx(150.0), "batch norm": pytest.approx(20.0),
                            "pooling": pytest.approx(5.0)}
    assert p["top"][0] == {"name": events[0].key, "us": pytest.approx(100.0), "calls": pytest.approx(10.0)}
    assert kernel_class("at::native::vectorized_elementwise_kernel<relu>") == "other"
    assert kernel_class("fused_concatenate5_kernel") == "copy / concat"

    base = {"name": "m", "units": 3, "image_size": 32, "variants": [],
            "kernel_profiles": {"PyTorch eager (cuDNN)": p}}
    lib = {"name": "m+cudnn", "units": 3, "image_size": 32, "variants": [],
           "kernel_profiles": {"sequential, legacy cuDNN engines": {"error": "RuntimeError: CUPTI unavailable"},
                               "sequential, measured cuDNN engines": p}}
    md = gcreport.render_markdown({"models": [base, lib]})
    assert "**PyTorch eager (cuDNN)**: 175 us in 4 distinct kernels (convolution / GEMM 150 us, batch norm 20 us" \
        in md
    assert "| `sm90_xmma_fprop_implicit_gemm_f32f32_f32f32_f32_nchwkcrs_nchw` | 100.0 | 10 |" in md
    assert "- sequential, legacy cuDNN engines: no profile (RuntimeError: CUPTI unavailable)" in md
    assert "**sequential, measured cuDNN engines**: 175 us" in md


def test_timelines_separate_overlap_from_longer_kernels():
    """``run --timeline VARIANT`` (``kernel_profile.timeline_summary``): per call the kernels' summed device time,
    the union of their intervals (busy) and the concurrency; two programs of the same kernels, one overlapping and
    one serial, differ in busy time, not in device time; and the report's table. Illustrative intervals."""
    from gpucheck import report as gcreport
    from gpucheck.kernel_profile import render_timelines, timeline_summary

    # two calls; each: kernels [0, 10) and [2, 6) overlap, then [12, 15): device 17, busy 13
    overlapping = [(0, 10), (2, 6), (12, 15), (100, 110), (102, 106), (112, 115)]
    serial = [(0, 10), (10, 14), (14, 17), (100, 110), (110, 114), (114, 117)]
    a, b = timeline_summary(overlapping, runs=2), timeline_summary(serial, runs=2)
    assert a["device_us"] == b["device_us"] == pytest.approx(17.0) and a["ops_per_run"] == 3
    assert a["busy_us"] == pytest.approx(13.0) and b["busy_us"] == pytest.approx(17.0)
    assert a["concurrency"] == pytest.approx(17 / 13) and b["concurrency"] == pytest.approx(1.0)
    assert timeline_summary([(0, 5), (1, 2), (3, 9)], runs=1)["busy_us"] == pytest.approx(9.0)   # nested, chained
    a["median_ms"] = 0.020
    lines = render_timelines({"lios (dependency)": a, "lios (dependency) + CUDA graph": {"error": "RuntimeError: x"}})
    assert "| lios (dependency) | 0.020 | 3 | 17 | 13 | 1.31 | 7 |" in lines
    assert any(line.startswith("| lios (dependency) + CUDA graph | no profile: RuntimeError: x") for line in lines)
    md = gcreport.render_markdown({"models": [{"name": "m", "units": 3, "image_size": 32, "variants": [],
                                               "timelines": {"lios (dependency)": a}}]})
    assert "| lios (dependency) | 0.020 | 3 | 17 | 13 | 1.31 | 7 |" in md


def test_timelines_name_the_kernels_that_grew_against_the_sequential_graph():
    """With kernel names, a timeline keeps every kernel's device time per call, and the report lists, per profiled
    program, the kernels that grew most against the same kernels in ``sequential + CUDA graph`` (a kernel called a
    different number of times, e.g. merged away, is not compared). Illustrative intervals."""
    from gpucheck import report as gcreport
    from gpucheck.kernel_profile import kernel_growth, render_timelines, timeline_summary

    # one call each: the sequential graph runs dw (10 us) then pw (5 us) then pool (4 us) one after another
    seq = timeline_summary([(0, 10, "dw"), (10, 15, "pw"), (15, 19, "pool")], runs=1)
    # side by side, dw takes 25 us and pw 6; pool is called twice (another program): not compared
    wide = timeline_summary([(0, 25, "dw"), (0, 6, "pw"), (25, 27, "pool"), (27, 29, "pool")], runs=1)
    assert seq["by_kernel"]["dw"] == {"us": 10.0, "calls": 1.0} and list(seq["by_kernel"]) == ["dw", "pw", "pool"]
    assert wide["by_kernel"]["pool"] == {"us": 4.0, "calls": 2.0}
    grown = kernel_growth(wide, seq)
    assert [g["name"] for g in grown] == ["dw", "pw"] and grown[0]["ratio"] == pytest.approx(2.5)
    assert kernel_growth(wide, timeline_summary([(0, 1)], runs=1)) == []   # no names: nothing to compare
    lines = render_timelines({"sequential + CUDA graph": seq, "ios + CUDA graph": wide})
    assert ("**ios + CUDA graph** against `sequential + CUDA graph`: the 3 kernels both ran take 35 us per call "
            "against 19 us (1.84x); those that grew most:") in lines
    assert "| `dw` | 1 | 25.0 | 10.0 | 2.50x |" in lines
    md = gcreport.render_markdown({"models": [{"name": "m", "units": 3, "image_size": 32, "variants": [],
                                               "timelines": {"sequential + CUDA graph": seq, "ios + CUDA graph": wide}}]})
    assert "| `pw` | 1 | 6.0 | 5.0 | 1.20x |" in md


def test_timelines_keep_the_last_calls_kernels_and_who_ran_beside_each():
    """A named timeline keeps the last profiled call's kernels (start from the call's first kernel, duration, name)
    and ``co_runners`` says, per instance of a kernel, which kernels ran beside it and for how long: what a sharing
    model is fitted on. Two calls of one program, the second one later on the device: only it is kept."""
    from gpucheck.kernel_profile import co_runners, timeline_summary

    call = [(0, 30, "deep"), (2, 8, "pw"), (9, 14, "pw"), (31, 35, "pool")]
    second = [(a + 100, b + 100, n) for a, b, n in call]
    t = timeline_summary(second + call, runs=2)            # the profiler's order need not be the start order
    assert t["spans"]["names"] == ["deep", "pw", "pool"]
    assert t["spans"]["items"] == [[0, 30, 0], [2, 6, 1], [9, 5, 1], [31, 4, 2]]
    (deep,) = co_runners(t, "deep")
    assert deep == {"start_us": 0, "us": 30, "beside": {"pw": 11}}
    assert [c["beside"] for c in co_runners(t, "pw")] == [{"deep": 6}, {"deep": 5}]
    assert co_runners(t, "pool")[0]["beside"] == {}
    assert co_runners(t, "absent") == [] and co_runners(timeline_summary([(0, 1)], runs=1), "deep") == []
    json.dumps(t)   # it goes into the run's JSON


def test_profiles_call_the_program_once_unprofiled_then_runs_times_and_record_failures():
    """``profile_kernels`` and ``profile_timeline`` (one profiling helper): one unprofiled call and a sync, then
    ``runs`` profiled calls and a sync; a program that fails, or a profiler that cannot profile CUDA (a CPU build
    of torch, as here), is recorded as an error, never raised."""
    pytest.importorskip("torch")
    from gpucheck.kernel_profile import profile_kernels, profile_timeline

    for profile in (profile_kernels, profile_timeline):
        log = []
        out = profile(lambda: log.append("call"), lambda: log.append("sync"), runs=3)
        assert log[:2] == ["call", "sync"]
        if "error" in out:   # a torch without CUDA refuses the CUDA activity before the profiled calls
            assert log == ["call", "sync"] and out["error"].startswith(("AssertionError", "RuntimeError"))
        else:
            assert log == ["call", "sync", "call", "call", "call", "sync"]

        def broken():
            raise RuntimeError("kernel launch failed")

        assert profile(broken, lambda: None, runs=2) == {"error": "RuntimeError: kernel launch failed"}


def test_run_takes_models_in_the_order_given_with_their_entries():
    """``run --models b,a``: b's entries first (a run cut off by the device's limit keeps the most wanted), a
    model's name selecting its +cudnn entries too; without --models, the manifest's order."""
    from gpucheck.run import selected_models

    manifest = {"models": [{"name": n} for n in ("a", "a+cudnn", "b", "b+cudnn", "b+cudnn+tf32", "c")]}
    assert [e["name"] for e in selected_models(manifest, "b,a")] == ["b", "b+cudnn", "b+cudnn+tf32", "a", "a+cudnn"]
    assert [e["name"] for e in selected_models(manifest, "a+cudnn")] == ["a+cudnn"]
    assert [e["name"] for e in selected_models(manifest, None)] == [e["name"] for e in manifest["models"]]


def test_pick_per_scheduler_offers_a_wave_library_its_schedule_unfused():
    """What gpu_check says the picker would ship is what the library carries: a wave library (``greedy+wave``)
    also carries greedy's unfused variants (``passes.candidates``), so the faster unfused program is its pick."""
    from gpucheck.run import _pick_per_scheduler

    slow, fast = (lambda: time.sleep(0.004)), (lambda: time.sleep(0.001))
    calls = {"sequential": slow, "sequential + CUDA graph": slow, "greedy (dependency) + CUDA graph": fast,
             "greedy+wave + CUDA graph": slow, "lios": slow}
    picked = _pick_per_scheduler(calls, lambda: None, rounds=5)
    assert picked["greedy+wave"]["choice"] == "greedy (dependency) + CUDA graph"
    assert set(picked["greedy+wave"]["candidates"]) == {"sequential", "sequential + CUDA graph",
                                                        "greedy (dependency) + CUDA graph", "greedy+wave + CUDA graph"}
    assert set(picked["greedy"]["candidates"]) == {"sequential", "sequential + CUDA graph",
                                                   "greedy (dependency) + CUDA graph"}   # no waves in greedy's
    assert "greedy (dependency) + CUDA graph" not in picked["lios"]["candidates"]


def test_wave_diff_checks_every_fused_stage_against_its_members(tmp_path):
    """``scripts/gpu_wave_diff.py`` with CPU wave kernels (what it does with CUDA ones on a GPU): every fused stage
    of a small RandWire built, then each wave kernel run against its members alone, all equal."""
    import gpu_wave_diff

    from tvm_interop.models import small_config

    # at its smallest depth (5) RandWire is a chain, nothing to fuse; at 10 nodes per stage its random graphs
    # branch: 21 fused stages (the paper's 32 gives 71, and takes three times as long here)
    cfg = dict(small_config("randwire"), depth=10)
    gpu_wave_diff.build(["randwire"], str(tmp_path), "llvm", model_kwargs=cfg)
    report = gpu_wave_diff.run(["randwire"], str(tmp_path), str(tmp_path / "out"))
    rows = report["randwire"]["stages"]
    assert len(rows) >= 10 and report["randwire"]["wrong"] == 0
    assert all(r["max_err"] <= gpu_wave_diff.TOL for r in rows)
    assert json.loads((tmp_path / "out" / "wave_diff.json").read_text())["randwire"]["wrong"] == 0


def test_targets_of_the_2026_11_26_h100_run():
    """The issues' targets read off the real H100 result (``docs/gpu_check.json``): ios against the others per
    cell, our programs against PyTorch eager + CUDA graph, and the wave rows of that run (wrong outputs, the
    repack-alignment bug) not counted."""
    from gpucheck import targets

    result = json.load(open(os.path.join(REPO, "docs", "gpu_check.json")))
    cells = {(r["model"], r["mode"], r["cuda_graph"]): r for r in targets.ios_not_slower(result)}
    assert len(cells) == 24
    assert cells[("inception_v3", "stage", False)]["met"] and cells[("inception_v3", "stage", False)]["best_other"] == "lios"
    assert round(cells[("inception_v3", "dependency", False)]["ratio"], 2) == 1.27   # the old wait placement's cost
    pt = targets.against_pytorch(result)
    assert pt["sequential"]["squeezenet"]["met"] and pt["sequential"]["squeezenet"]["entry"] == "squeezenet+cudnn"
    assert not pt["sequential"]["inception_v3"]["met"] and round(pt["sequential"]["inception_v3"]["ratio"], 2) == 1.30
    assert all(r["met"] for r in pt["best"].values()) and "tf32" not in pt["best"]["inception_v3"]["entry"]
    sp = targets.speedups_over_sequential(result)
    assert sp["missing"] == ["nasnet_a_large"] and sp["geomean_best"] is None
    assert "[waits at consumer]" not in sp["models"]["inception_v3"]["best"]
    assert targets.wave_over_streams(result)["randwire"] == {"wrong": True}
    text = "\n".join(targets.render_targets(result))
    assert "in 7 of 24" in text and "no wave-fused variant computed plain TVM's output" in text


def test_targets_geomean_and_wave_when_every_model_ran():
    """Illustrative numbers (not a measurement): the geomean over the four models, and a wave variant that counts."""
    from gpucheck import targets

    def model(name, seq, best, wave=None):
        vs = [{"name": "sequential", "median_ms": seq, "ok": True},
              {"name": "ios", "median_ms": best, "ok": True},
              {"name": "greedy [waits at consumer]", "median_ms": best / 2, "ok": True}]   # never counted
        if wave:
            vs.append({"name": "greedy+wave", "median_ms": wave, "ok": True})
        return {"name": name, "variants": vs}

    result = {"models": [model("inception_v3", 2.0, 1.0), model("randwire", 2.0, 1.0, wave=0.8),
                         model("nasnet_a_large", 1.0, 1.0), model("squeezenet", 1.0, 1.0)]}
    sp = targets.speedups_over_sequential(result)
    # randwire's best scheduled variant is the wave-fused one (2.5x), its ios 2x
    assert sp["geomean_best"] == pytest.approx((2 * 2.5) ** 0.25) and sp["geomean_ios"] == pytest.approx(2 ** 0.5)
    wv = targets.wave_over_streams(result)["randwire"]
    assert wv["speedup"] == pytest.approx(1.25) and wv["met"] and wv["streams"] == "ios"
    assert "Geomean 1.50x (target 1.6x: not met; ios alone 1.41x)" in "\n".join(targets.render_targets(result))


def test_flow_variants_count_as_fused_for_issue_15_and_never_as_streams():
    """Illustrative numbers (not a measurement): a ``greedy+flow`` variant (passes.wave.flow) is a fused variant
    against the best multi-stream one, and the fastest of the fused ones counts; ``greedy+flow (dependency)`` is
    not a multi-stream variant even though its name starts with greedy."""
    from gpucheck import targets
    from gpucheck.common import fusion_of

    vs = [{"name": "sequential", "median_ms": 2.0, "ok": True},
          {"name": "greedy (dependency)", "median_ms": 1.0, "ok": True},
          {"name": "greedy+wave", "median_ms": 0.9, "ok": True},
          {"name": "greedy+flow (dependency)", "median_ms": 0.5, "ok": True},
          {"name": "greedy+flow", "median_ms": 0.4, "ok": False}]   # a wrong output never counts
    wv = targets.wave_over_streams({"models": [{"name": "randwire", "variants": vs}]})["randwire"]
    assert (wv["wave"], wv["streams"]) == ("greedy+flow (dependency)", "greedy (dependency)")
    assert wv["speedup"] == pytest.approx(2.0) and wv["met"]
    # the variant with the device functions kept as calls is a flow variant too
    vs.append({"name": "greedy+flow_noinline", "median_ms": 0.25, "ok": True})
    wv = targets.wave_over_streams({"models": [{"name": "randwire", "variants": vs}]})["randwire"]
    assert (wv["wave"], wv["streams"]) == ("greedy+flow_noinline", "greedy (dependency)")
    assert [fusion_of(s) for s in ("greedy+flow", "greedy+flow_noinline", "greedy+flow_coarse", "lios+wave",
                                   "ios")] == [("greedy", "+flow"), ("greedy", "+flow_noinline"),
                                               ("greedy", "+flow_coarse"), ("lios", "+wave"), ("ios", "")]


def test_flow_variants_are_left_out_of_a_cpu_dry_run(tmp_path):
    """``--schedulers greedy+flow`` on the CPU dry run: flow fusion builds a persistent CUDA launch, so the dry run
    says so and builds the rest."""
    d = str(tmp_path / "build")
    r = _gc("build", "--target", "llvm", "--models", "squeezenet", "--width", "0.125", "--image-size", "32",
            "--dir", d, "--no-kit", "--schedulers", "sequential,greedy+flow,greedy+flow_noinline", "--modes", "stage")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "greedy+flow: flow fusion builds a persistent CUDA launch; not on a CPU dry run, skipped" in r.stderr
    assert "greedy+flow_noinline: flow fusion builds a persistent CUDA launch; not on a CPU dry run" in r.stderr
    names = {v["name"] for v in json.load(open(os.path.join(d, "manifest.json")))["models"][0]["variants"]}
    assert "sequential" in names and not any("flow" in n for n in names)
