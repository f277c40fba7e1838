"""The deployable CUDA artifact: kernels as fatbins (one cubin per requested arch), no CUDA source, loadable
with TVM's runtime alone; the runtime's arch check. No GPU needed (nvcc is)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import tvm_interop
from passes.target import parse_arches
from passes.cuda_compile import (fatbin_arches, fatbin_entries, library_cuda_images,
                                 split_library_blob, join_library_blob)
from runtime.cuda import arch_mismatch, check_arch
from runtime.errors import DeviceError, InteropError

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
    out = {}
    d = tmp_path_factory.mktemp("cuda_artifact")
    for label, arch in (("default", None), ("two", "sm_80,sm_90")):
        cm = tvm_interop.compile(branchy_model, target="cuda", scheduler="greedy", cuda_arch=arch)
        path = str(d / f"{label}.so")
        cm.export(path)
        out[label] = (path, cm.plan.meta)
        cm.close()
    return out


@needs_nvcc
def test_library_holds_a_binary_per_arch_and_no_source(exported):
    for label, want in (("default", ["sm_90"]), ("two", ["sm_80", "sm_90"])):
        path, meta = exported[label]
        assert meta["cuda_arches"] == want
        images = library_cuda_images(path)
        assert images, label
        for fmt, code in images:
            assert fmt == "fatbin"
            assert fatbin_arches(code) == want
            assert {k for k, _ in fatbin_entries(code)} == {"sass"}   # no PTX: nothing is compiled at load
        data = open(path, "rb").read()
        assert b"__global__" not in data and b"extern \"C\"" not in data  # no CUDA source anywhere


@needs_nvcc
def test_multi_arch_code_is_generated_for_the_oldest(exported):
    assert exported["two"][1]["target"] == "cuda -arch=sm_80,sm_90"


@needs_nvcc
def test_runtime_only_load_without_a_gpu_is_a_clear_error(exported):
    """TVM's runtime alone (no compiler library), no nvcc on PATH: the loader must not try to compile."""
    path, _ = exported["default"]
    code = ("import runtime, tvm\n"
            "try:\n    runtime.load(%r)\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
            "print('libs', sorted(tvm.base._LOADED_LIBS))\n" % path)
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", PATH="/usr/bin:/bin", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "DeviceError no CUDA device" in out.stdout, out.stdout + out.stderr
    assert "tvm_compiler" not in out.stdout


def test_blob_round_trip():
    import struct

    # import tree: module 0 imports 1, 1 imports 2 (row pointers, then child indices)
    header = struct.pack("<Q4Q", 4, 0, 1, 2, 2) + struct.pack("<Q2Q", 2, 1, 2)
    mods = [("relax.VMExecutable", b"abc"), ("_lib", None), ("cuda", b"\x00" * 5)]
    blob = join_library_blob(header, mods)
    assert split_library_blob(blob) == (header, mods)


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
