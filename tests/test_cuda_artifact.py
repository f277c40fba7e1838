"""The deployable CUDA artifact: kernels as fatbins (one cubin per requested arch), no CUDA source, loadable
with TVM's runtime alone; the runtime's arch check. No GPU needed (nvcc is)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import tvm_interop
from tvm_interop.passes import cuda_compile
from tvm_interop.passes.target import normalize_target, parse_arches, requested_arches
from tvm_interop.passes.cuda_compile import (cubin_arch, fatbin_arches, fatbin_cubins, fatbin_entries, inspect_cuda_library,
                                 library_cuda_images, nvcc_flags)
from tvm_interop.runtime.cuda import arch_mismatch, check_arch
from tvm_interop.runtime.errors import DeviceError, InteropError
from tvm_interop.runtime.library_file import elf_symbol_data, join_library_blob, split_library_blob

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="CUDA builds need nvcc (the CUDA toolkit)")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_arch_names():
    assert parse_arches("sm_90") == ["sm_90"]
    assert parse_arches("sm_90, sm_80,sm_90") == ["sm_80", "sm_90"]
    assert parse_arches(["sm_86"]) == ["sm_86"]
    with pytest.raises(InteropError, match="invalid CUDA arch 'compute_90'"):
        parse_arches("compute_90")
    with pytest.raises(InteropError, match="invalid CUDA arch"):
        parse_arches("sm_90,")


def test_arch_choice_and_env_override(monkeypatch):
    monkeypatch.delenv("TVM_INTEROP_CUDA_ARCH", raising=False)
    assert requested_arches("cuda") == ["sm_90"]
    assert requested_arches("cuda -arch=sm_80,sm_90") == ["sm_80", "sm_90"]
    assert requested_arches("cuda", "sm_86") == ["sm_86"]
    assert requested_arches('{"kind": "cuda", "arch": "sm_75"}') == ["sm_75"]
    monkeypatch.setenv("TVM_INTEROP_CUDA_ARCH", "sm_90,sm_80")
    assert requested_arches("cuda") == ["sm_80", "sm_90"]          # every arch of the override, not just one
    assert requested_arches({"kind": "cuda"}) == ["sm_80", "sm_90"]
    assert normalize_target("cuda").attrs["arch"] == "sm_80"       # code generated for the oldest
    assert requested_arches("cuda -arch=sm_86") == ["sm_86"]       # an explicit arch beats the override


def test_nvcc_flags_are_tvms_with_one_cubin_per_arch(monkeypatch):
    for var in ("TVM_CUDA_NVCC_NO_FAST_MATH", "TVM_CUDA_PTXAS_REG_LEVEL", "TVM_CUDA_PTXAS_EXTRA_OPTS"):
        monkeypatch.delenv(var, raising=False)
    flags = nvcc_flags(["sm_80", "sm_90"])
    assert flags[0] == "--fatbin" and "-O3" in flags and "--use_fast_math" in flags
    gencode = [flags[i + 1] for i, f in enumerate(flags) if f == "-gencode"]
    assert gencode == ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"]   # SASS only, no PTX
    assert "--ptxas-options=--register-usage-level=10,--warn-on-local-memory-usage" in flags
    monkeypatch.setenv("TVM_CUDA_NVCC_NO_FAST_MATH", "1")
    monkeypatch.setenv("TVM_CUDA_PTXAS_EXTRA_OPTS", "-O2")
    flags = nvcc_flags(["sm_90"])
    assert "--use_fast_math" not in flags and flags[-3].endswith(",-O2")


def test_arch_compatibility_rule():
    assert arch_mismatch(["sm_90"], "9.0") is None
    assert arch_mismatch(["sm_80"], "8.6") is None          # same major, newer minor: the cubin runs
    assert arch_mismatch(["sm_80", "sm_90"], "9.0") is None
    why = arch_mismatch(["sm_90"], "8.0", "this GPU (NVIDIA A100)")
    assert "built for sm_90" in why and "NVIDIA A100" in why and "is sm_80" in why and "--arch sm_80" in why
    assert arch_mismatch(["sm_86"], "8.0") is not None      # older minor than built
    assert arch_mismatch(["sm_80"], "9.0") is not None      # no SASS crosses majors

    class FakeGPU:
        compute_version = "8.0"
        device_name = "NVIDIA A100-SXM4-80GB"

    with pytest.raises(DeviceError, match="built for sm_90, but this GPU \\(NVIDIA A100-SXM4-80GB\\) is sm_80"):
        check_arch(["sm_90"], FakeGPU())


@pytest.fixture(scope="module")
def exported(branchy_model, tmp_path_factory):
    """The model built with the default arch and with sm_80,sm_90, exported; plus TVM's own export of the first
    (which keeps the CUDA source) as the negative control of the inspection."""
    if shutil.which("nvcc") is None:
        pytest.skip("CUDA builds need nvcc (the CUDA toolkit)")
    out = {}
    d = tmp_path_factory.mktemp("cuda_artifact")
    for label, arch in (("default", None), ("two", "sm_80,sm_90")):
        cm = tvm_interop.compile(branchy_model, target="cuda", scheduler="greedy", cuda_arch=arch)
        path = str(d / f"{label}.so")
        compiled = len(cuda_compile._compiled)
        cm.export(path)
        out[f"{label}_export_compiles"] = len(cuda_compile._compiled) - compiled
        out[label] = (path, cm.plan.meta)
        out[f"{label}_plan"] = cm.plan.to_json()
        if label == "default":
            out["tvm_export"] = str(d / "tvm_export.so")
            cm.runner.library.export_library(out["tvm_export"])
        cm.close()
    return out


@needs_nvcc
def test_library_holds_a_binary_per_arch_and_no_source(exported):
    for label, want in (("default", ["sm_90"]), ("two", ["sm_80", "sm_90"])):
        path, meta = exported[label]
        assert meta["cuda_arches"] == want
        info = inspect_cuda_library(path)
        assert info == {"modules": 1, "formats": ["fatbin"], "arches": want, "ptx": [], "source_left": False}, label
        for fmt, code in library_cuda_images(path):
            assert {k for k, _ in fatbin_entries(code)} == {"sass"}   # no PTX: nothing is compiled at load
            # each entry is a CUDA ELF whose own header names the arch (the check cuobjdump --list-elf makes)
            assert [(a, cubin_arch(c)) for a, c in fatbin_cubins(code)] == [(a, a) for a in want]
        data = open(path, "rb").read()
        assert b"__global__" not in data and b"extern \"C\"" not in data  # no CUDA source anywhere


@needs_nvcc
def test_export_reuses_the_build_binaries(exported):
    """nvcc runs when the model is compiled (errors show there); the export ships those binaries."""
    assert exported["default_export_compiles"] == 0 and exported["two_export_compiles"] == 0


@needs_nvcc
def test_inspection_sees_source_in_tvms_own_export(exported):
    info = inspect_cuda_library(exported["tvm_export"])
    assert info["source_left"] and info["formats"] == ["cuda"] and info["arches"] == []


@needs_nvcc
def test_multi_arch_code_is_generated_for_the_oldest(exported):
    assert exported["two"][1]["target"] == "cuda -arch=sm_80,sm_90"


@needs_nvcc
def test_runtime_only_load_without_a_gpu_is_a_clear_error(exported):
    """TVM's runtime alone (no compiler library), no nvcc on PATH, TVM's load-time compile callback replaced by
    one that reports a call: the loader must not try to compile. Without a GPU: the clear "no CUDA device"; on a
    GPU (this test also runs there) the model loads and runs, or is refused for its arch."""
    path, _ = exported["default"]
    code = ("import sys, numpy as np, tvm, tvm_ffi\nfrom tvm_interop import runtime\n"
            "@tvm_ffi.register_global_func('tvm_callback_cuda_compile', override=True)\n"
            "def _compile(*a):\n    print('COMPILE CALLED'); raise RuntimeError('no compile at load')\n"
            "try:\n    m = runtime.load(%r)\n    m.run(*[np.zeros(i['shape'], i['dtype']) for i in m.inputs])\n    print('RAN')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n"
            "print('libs', sorted(tvm.base._LOADED_LIBS))\n"
            "print('modules', sorted(n for n in sys.modules if n.split('.')[0] in ('passes', 'tvm_interop') and\n"
            "      n != 'tvm_interop' and not n.startswith('tvm_interop.runtime')))\n"
            % path)
    nvcc_free_path = os.pathsep.join(p for p in ("/usr/bin", "/bin") if not os.path.exists(os.path.join(p, "nvcc")))
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PATH=nvcc_free_path, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    text = out.stdout + out.stderr
    assert "COMPILE CALLED" not in text, text
    assert ("DeviceError no CUDA device" in out.stdout or "RAN" in out.stdout
            or "rebuild with --arch" in out.stdout), text
    assert "tvm_compiler" not in out.stdout and "modules []" in out.stdout, text


@needs_nvcc
def test_show_reads_a_cuda_library_without_tvm_or_a_gpu(exported, tmp_path, capsys):
    """``tvm-interop show m.so`` where the CUDA library was built (no GPU: it cannot be loaded there): what it holds
    is read from the file's bytes, in a process that never imports TVM, and is exactly the compiled plan."""
    import json

    from tvm_interop.cli import main
    from tvm_interop.runtime.picker import PickReport, save_pick

    path, meta = exported["two"]
    code = ("import json, sys\nfrom tvm_interop.library_info import library_summary\n"
            f"summary, plan = library_summary({path!r})\n"
            "print(json.dumps([summary, plan.to_json(), sorted(m for m in sys.modules if m.split('.')[0] == 'tvm')]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr
    summary, plan, tvm_modules = json.loads(out.stdout)
    assert tvm_modules == []
    assert plan == exported["two_plan"]
    assert summary["device"] == "cuda" and summary["cuda_arches"] == ["sm_80", "sm_90"]
    assert summary["candidates"] == [c["name"] for c in meta["candidates"]]
    assert summary["default_candidate"] == meta["default_candidate"] and summary["pick"] is None
    assert summary["units"] == len(plan["calls"]) and summary["stages"] == len(plan["stages"])

    assert main(["show", path]) == 0
    text = capsys.readouterr().out
    assert "(binaries: sm_80, sm_90)" in text and all(c in text for c in summary["candidates"])
    assert len([ln for ln in text.splitlines() if ln[:6].strip().isdigit()]) == summary["stages"]
    assert main(["show", path, "--png", str(tmp_path / "x.png")]) == 1
    assert "CUDA library is timed as a whole" in capsys.readouterr().err
    if main(["run", path, "--repeat", "1"]) == 1:   # no GPU here: `run` points at `show`
        err = capsys.readouterr().err
        assert "no CUDA device" not in err or f"`tvm-interop show {path}` says what the library holds" in err

    # the pick file beside the library: reported, and flagged when it was written for another build
    choice = summary["candidates"][-1]
    report = PickReport(choice=choice, default=summary["default_candidate"], device="NVIDIA H100 80GB HBM3",
                        rounds=3, timings={choice: {"median_ms": 1.0, "min_ms": 0.9, "runs": 3}})
    pick_file = save_pick(report, path)
    try:
        assert main(["show", path]) == 0
        text = capsys.readouterr().out
        assert f"on NVIDIA H100 80GB HBM3, picked {choice}" in text and "another build" not in text
        with open(pick_file) as f:
            data = json.load(f)
        data["library_sha256"] = "0" * 64
        with open(pick_file, "w") as f:
            json.dump(data, f)
        assert main(["show", path, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["pick"]["current"] is False
    finally:
        os.remove(pick_file)


def test_blob_round_trip():
    import struct

    # import tree: module 0 imports 1, 1 imports 2 (row pointers, then child indices)
    header = struct.pack("<Q4Q", 4, 0, 1, 2, 2) + struct.pack("<Q2Q", 2, 1, 2)
    mods = [("relax.VMExecutable", b"abc"), ("_lib", None), ("cuda", b"\x00" * 5)]
    blob = join_library_blob(header, mods)
    assert split_library_blob(blob) == (header, mods)


@pytest.mark.parametrize("how", ["object", "c"])
def test_packed_blob_links_into_the_library_byte_for_byte(tmp_path, monkeypatch, how):
    """The library's ``__tvm_ffi__library_bin`` (the program, the kernels' fatbins and the weights) is written as an
    object by TVM's LLVM blob codegen (seconds), or as a C array where LLVM is missing (gcc took 341 s on
    Inception-v3's 96 MB); either way the linked library holds exactly the blob."""
    from tvm.support import cc

    if how == "c":
        monkeypatch.setattr(cuda_compile, "_host_triple", lambda: None)
    blob = bytes(range(256)) * 512 + b"end"
    path = cuda_compile.write_blob(blob, str(tmp_path))
    assert path.endswith(".o" if how == "object" else ".c")
    so = str(tmp_path / "blob.so")
    cc.create_shared(so, [path])
    with open(so, "rb") as f:
        assert elf_symbol_data(f.read(), b"__tvm_ffi__library_bin") == blob


@needs_nvcc
def test_compile_cli_arch_option(tmp_path, capsys):
    from tvm_interop.cli import main

    out = tmp_path / "m.so"
    rc = main(["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--target", "cuda",
               "--arch", "sm_80,sm_90", "--scheduler", "greedy", "-o", str(out), "--json"])
    assert rc == 0
    assert [fatbin_arches(c) for _, c in library_cuda_images(str(out))] == [["sm_80", "sm_90"]]
    assert main(["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--target", "cuda",
                 "--arch", "ampere"]) == 1
    assert "invalid CUDA arch 'ampere'" in capsys.readouterr().err
