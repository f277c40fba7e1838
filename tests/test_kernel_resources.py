"""scripts/kernel_resources.py: registers, static shared memory and launch bounds read from a cubin's ELF sections
agree with what ptxas says it decided for the same source."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from scripts_under_test import load_script

NVCC = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc")
                                     if os.path.exists(p)), None)
SOURCE = r"""
extern "C" __global__ void __launch_bounds__(128) small(float* __restrict__ a, float* __restrict__ b) {
  __shared__ float tile[300];
  tile[threadIdx.x] = a[blockIdx.x * 128 + threadIdx.x];
  __syncthreads();
  b[blockIdx.x * 128 + threadIdx.x] = tile[(threadIdx.x + 1) % 128] * 2.0f;
}
extern "C" __global__ void __launch_bounds__(256) wide(float* __restrict__ a, float* __restrict__ b, int n) {
  float acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = a[(blockIdx.x * 256 + threadIdx.x) * 16 + i];
  float s = 0.f;
  for (int k = 0; k < n; ++k)
    for (int i = 0; i < 16; ++i) s += acc[i] * acc[(i + k) % 16];
  b[blockIdx.x * 256 + threadIdx.x] = s;
}
"""


@pytest.mark.skipif(NVCC is None, reason="needs nvcc to make a cubin")
def test_resources_match_what_ptxas_reports(tmp_path):
    kr = load_script("kernel_resources")
    src, cubin = tmp_path / "k.cu", tmp_path / "k.cubin"
    src.write_text(SOURCE)
    log = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", str(cubin), str(src)],
                         capture_output=True, text=True, check=True).stderr
    told = {}
    for entry in log.split("Compiling entry function ")[1:]:   # ptxas names smem only where a kernel has some
        smem = re.search(r"(\d+) bytes smem", entry)
        told[entry.split("'")[1]] = (int(re.search(r"Used (\d+) registers", entry).group(1)),
                                     int(smem.group(1)) if smem else 0)
    got = kr.kernel_resources(cubin.read_bytes())
    assert set(got) == {"small", "wide"} == set(told)
    for k, (regs, smem) in told.items():
        assert got[k]["registers"] == regs
        # the section holds what the kernel declares plus the 1 KiB that sm_90 reserves per block
        assert got[k]["shared"] == smem + (1024 if smem else 0)
    assert (got["small"]["threads"], got["wide"]["threads"]) == (128, 256)
    assert got["small"]["shared"] >= 1200 + 1024
    # blocks per SM: the tighter of registers, shared memory, the 32-block and 2048-thread limits
    assert kr.blocks_per_sm({"registers": 64, "threads": 128, "shared": 0}) == 8
    assert kr.blocks_per_sm({"registers": 16, "threads": 128, "shared": 0}) == 16
    assert kr.blocks_per_sm({"registers": 16, "threads": 128, "shared": 60 * 1024}) == 3
    assert kr.blocks_per_sm({"registers": None, "threads": 128, "shared": 0}) is None


CALLS = r"""
extern "C" __device__ __noinline__ void kept(float* x, int i) { x[i] = x[i] * 2.0f + 1.0f; }
extern "C" __device__ void inlined(float* x, int i) { x[i] += 3.0f; }
extern "C" __global__ void __launch_bounds__(128) caller(float* x) {
  kept(x, threadIdx.x);
  inlined(x, threadIdx.x);
  kept(x, threadIdx.x + 128);
}
"""


@pytest.mark.skipif(NVCC is None, reason="needs nvcc to make a cubin")
def test_device_functions_are_those_ptxas_kept_as_calls(tmp_path):
    """A device function nvcc did not inline has a symbol of its own inside its caller's code, whose size the
    kernel's code bytes include; the functions found are the ones ptxas lists beside the kernels."""
    kr = load_script("kernel_resources")
    src, cubin = tmp_path / "c.cu", tmp_path / "c.cubin"
    src.write_text(CALLS)
    log = subprocess.run([NVCC, "-cubin", "-arch=sm_90", "-Xptxas", "-v", "-o", str(cubin), str(src)],
                         capture_output=True, text=True, check=True).stderr
    listed = set(re.findall(r"Function properties for (\w+)", log)) - {"caller"}
    found = kr.device_functions(cubin.read_bytes())
    assert set(found) == listed == {"kept"}
    code = kr.kernel_resources(cubin.read_bytes())["caller"]["code"]
    assert 0 < found["kept"] < code
