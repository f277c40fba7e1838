"""The native CUDA extension (runtime/native/tvm_interop_cuda.cc): build, cache, registration, and clear errors.

Runs on a machine without a GPU: everything that needs one (a conv or a matmul actually running) is out of reach
here, so these tests check what must hold everywhere — the extension builds with nvcc, links no CUDA library,
registers exactly its globals (from its own .so or linked into an exported model, in a runtime-only process),
refuses malformed calls before touching any library, and fails a real call with a Python exception naming the
missing device or library, never a crash.
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from tvm_interop.runtime import native_libs
from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.native_libs import EXTENSION_FUNCTIONS

from runtime_only import assert_runtime_only, runtime_only_env

native_build = pytest.importorskip("tvm_interop.passes.native_build")

try:
    native_build.include_dirs(native_build.find_nvcc())
    _SKIP = None
except native_build.NativeBuildError as e:
    _SKIP = str(e)
pytestmark = pytest.mark.skipif(_SKIP is not None, reason=f"cannot build the native extension here: {_SKIP}")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def ext(tmp_path_factory):
    return native_build.build_extension(out_dir=tmp_path_factory.mktemp("native-cache"))


@pytest.fixture(scope="module")
def loaded(ext):
    """The extension loaded into this process (it stays: the library pins itself)."""
    native_libs.load_extension(ext.shared_path)
    return ext


def _gpu_present(info: dict) -> bool:
    return info["libraries"]["cudart"].get("device_count", 0) > 0


# ---- build and cache ------------------------------------------------------------------------------------------

@pytest.mark.serial
def test_build_and_cache_hit(ext):
    assert os.path.isfile(ext.object_path) and os.path.isfile(ext.shared_path)
    assert ext.functions == EXTENSION_FUNCTIONS
    t = time.perf_counter()
    again = native_build.build_extension(out_dir=os.path.dirname(os.path.dirname(ext.shared_path)))
    assert time.perf_counter() - t < 2.0          # hashing only, no compile
    assert again == ext
    assert not [p for p in os.listdir(os.path.dirname(os.path.dirname(ext.shared_path))) if ".tmp-" in p]


def test_cache_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TVM_INTEROP_CACHE", str(tmp_path))
    assert native_build.default_cache_dir() == tmp_path / "native"


def test_artifacts_register_and_link_no_cuda(ext):
    for path in (ext.object_path, ext.shared_path):
        data = open(path, "rb").read()
        for name in EXTENSION_FUNCTIONS:
            assert name.encode() in data, (path, name)
    if shutil.which("readelf"):
        dyn = subprocess.run(["readelf", "-d", ext.shared_path], capture_output=True, text=True).stdout
        needed = [line for line in dyn.splitlines() if "NEEDED" in line]
        assert needed and not [n for n in needed if any(k in n for k in ("cuda", "cudnn", "cublas"))], needed
    if shutil.which("nm"):
        undef = subprocess.run(["nm", "-u", ext.object_path], capture_output=True, text=True).stdout.split()
        assert not [s for s in undef if s.startswith(("cuda", "cudnn", "cublas"))], undef


def test_missing_nvcc_and_headers_are_clear(monkeypatch, tmp_path):
    monkeypatch.setattr(native_build.shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(native_build, "DEFAULT_TOOLKIT", str(tmp_path / "no-cuda"))
    with pytest.raises(InteropError, match="nvcc not found.*CUDA_HOME"):
        native_build.build_extension(out_dir=tmp_path)
    monkeypatch.undo()
    monkeypatch.setattr(native_build, "_nvidia_include", lambda sub: [])
    monkeypatch.setattr(native_build, "DEFAULT_TOOLKIT", str(tmp_path / "no-cuda"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "no-cuda"))
    nvcc = native_build.find_nvcc()
    if os.path.isfile(os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include", "cudnn.h")):
        pytest.skip("this toolkit ships cudnn.h")
    with pytest.raises(InteropError, match="cudnn.h not found.*pip install nvidia-cudnn-cu13"):
        native_build.include_dirs(nvcc)


# ---- loading ---------------------------------------------------------------------------------------------------

_CHILD = textwrap.dedent('''
    import json, sys
    from tvm_interop.runtime import native_libs
    for path in sys.argv[2:]:
        if sys.argv[1] == "ext":
            native_libs.load_extension(path)
        else:  # an exported model: TVM's runtime loads it
            import tvm
            tvm.runtime.load_module(path)
    info = native_libs.extension_info()
    print(json.dumps({"functions": native_libs.extension_functions(), "info": info}))
''')


def _run_child(tmp_path, script, *args):
    env, log = runtime_only_env(tmp_path)
    proc = subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), log


def test_runtime_only_load_registers_exactly_the_globals(ext, tmp_path):
    out, log = _run_child(tmp_path, _CHILD, "ext", ext.shared_path)
    assert out["functions"] == sorted(EXTENSION_FUNCTIONS)
    info = out["info"]
    assert info["functions"] == list(EXTENSION_FUNCTIONS)   # the C++ list and the Python list agree
    assert set(info["libraries"]) == {"cudart", "cudnn", "cublasLt"}
    for lib in info["libraries"].values():                  # loaded, or an error saying what to install
        assert lib["loaded"] or ("cannot load" in lib["error"] and "pip install" in lib["error"]), lib
    assert_runtime_only(log, 1)


def test_info_in_process(loaded):
    info = native_libs.extension_info()
    assert info["version"] and info["headers"]["cudnn"] >= 90000 and info["headers"]["cublas"] >= 130000
    if info["libraries"]["cudnn"]["loaded"]:               # every symbol resolved in the real library
        assert info["libraries"]["cudnn"]["version"] // 10000 == 9


def test_call_stats_count_only_calls_that_ran(loaded):
    """``call_stats``: host time per steady-state library call, by phase. Refused calls never reach a library, so
    they are not counted (without a GPU nothing runs: the counts stay zero; the device run fills them)."""
    assert native_libs.library_call_stats(reset=True) is not None
    with pytest.raises(ValueError):
        _fn("tvm_interop.cublas.dense")([1, 0, 1], _t((2, 4)), _t((3, 4)), _t((2, 3)))
    stats = native_libs.library_call_stats()
    assert stats == {"conv2d": {"calls": 0, "prepare_us": 0, "library_us": 0},
                     "dense": {"calls": 0, "prepare_us": 0, "library_us": 0}}


def test_preload_never_raises():
    out = native_libs.preload_cuda_libraries(["libcudnn.so.9", "libdoes-not-exist.so.1"])
    assert out["libdoes-not-exist.so.1"].startswith("error: ")
    assert "libcudnn.so.9" in out


# ---- validation before any library ----------------------------------------------------------------------------

def _t(shape, dtype="float32"):
    import tvm

    return tvm.runtime.tensor(np.zeros(shape, dtype))


def _fn(name):
    import tvm_ffi

    return tvm_ffi.get_global_func(name)


CONV_P = [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0]   # stride 1, pad 1, dilation 1, groups 1, no bias/z/relu, no tf32


@pytest.mark.parametrize("case,args_fn,exc,pattern", [
    ("params length", lambda: (CONV_P[:-1], _t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((1, 4, 8, 8))),
     ValueError, "params must have 11 entries"),
    ("params type", lambda: (_t((11,)), _t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((1, 4, 8, 8))),
     TypeError, "params.*must be a shape"),
    ("flag", lambda: (CONV_P[:7] + [2, 0, 0, 0], _t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((1, 4, 8, 8))),
     ValueError, "has_bias must be 0 or 1"),
    ("stride", lambda: ([0] + CONV_P[1:], _t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((1, 4, 8, 8))),
     ValueError, "strides and dilations must be >= 1"),
    ("arity", lambda: (CONV_P[:7] + [1, 0, 0, 0], _t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((1, 4, 8, 8))),
     ValueError, "expected 5 arguments"),
    ("not a tensor", lambda: (CONV_P, _t((1, 3, 8, 8)), 3, _t((1, 4, 8, 8))),
     TypeError, r"argument 2 \(w\) must be a tensor"),
    ("dtype", lambda: (CONV_P, _t((1, 3, 8, 8), "float64"), _t((4, 3, 3, 3)), _t((1, 4, 8, 8))),
     TypeError, "x must be float32"),
    ("rank", lambda: (CONV_P, _t((3, 8, 8)), _t((4, 3, 3, 3)), _t((1, 4, 8, 8))),
     ValueError, "x.*must be 4-D"),
    ("out shape", lambda: (CONV_P, _t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((1, 4, 6, 6))),
     ValueError, r"gives \[1, 4, 8, 8\]"),
    ("channels", lambda: (CONV_P, _t((1, 3, 8, 8)), _t((4, 2, 3, 3)), _t((1, 4, 8, 8))),
     ValueError, "do not fit groups=1"),
    ("groups", lambda: (CONV_P[:6] + [2] + CONV_P[7:], _t((1, 4, 8, 8)), _t((6, 2, 3, 3)), _t((1, 6, 8, 8))),
     None, None),                            # valid grouped conv: refused only for its CPU device
    ("bias", lambda: (CONV_P[:7] + [1, 0, 1, 0], _t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((5,)), _t((1, 4, 8, 8))),
     ValueError, "bias has shape.*O = 4"),
    ("z", lambda: (CONV_P[:7] + [0, 1, 0, 0], _t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((1, 4, 8, 7)),
                   _t((1, 4, 8, 8))),
     ValueError, "z has shape.*must match out"),
    ("cpu", lambda: (CONV_P[:7] + [1, 1, 1, 1], _t((1, 3, 8, 8)), _t((4, 3, 3, 3)), _t((1, 4, 1, 1)),
                     _t((1, 4, 8, 8)), _t((1, 4, 8, 8))),
     ValueError, "x is on cpu:0; it must be on a CUDA device"),
])
def test_conv2d_refuses_bad_calls(loaded, case, args_fn, exc, pattern):
    if exc is None:
        exc, pattern = ValueError, "on a CUDA device"
    with pytest.raises(exc, match=pattern):
        _fn("tvm_interop.cudnn.conv2d")(*args_fn())


@pytest.mark.parametrize("args_fn,exc,pattern", [
    (lambda: ([1, 0, 1], _t((2, 4)), _t((3, 4)), _t((2, 3))), ValueError, "params must have 4 entries"),
    (lambda: ([0, 0, 1, 0], _t((2, 4)), _t((3, 5)), _t((2, 3))), ValueError, "disagree on K"),
    (lambda: ([0, 0, 0, 0], _t((2, 4)), _t((3, 4)), _t((2, 3))), ValueError, "disagree on K"),  # [K, N] expected
    (lambda: ([0, 0, 1, 0], _t((2, 4)), _t((3, 4)), _t((2, 4))), ValueError, "out has shape"),
    (lambda: ([1, 0, 1, 0], _t((2, 4)), _t((3, 4)), _t((4,)), _t((2, 3))), ValueError, "N = 3 elements"),
    (lambda: ([0, 0, 1, 0], _t((2, 4), "int32"), _t((3, 4)), _t((2, 3))), TypeError, "x must be float32"),
    (lambda: ([0, 1, 1, 0], _t((2, 4)), _t((3, 4)), _t((2, 3)), _t((2, 3))), ValueError, "expected 4 arguments"),
    (lambda: ([1, 1, 0, 1], _t((5, 2, 4)), _t((4, 3)), _t((1, 3)), _t((5, 2, 3))), ValueError,
     "x is on cpu:0; it must be on a CUDA device"),
])
def test_dense_refuses_bad_calls(loaded, args_fn, exc, pattern):
    with pytest.raises(exc, match=pattern):
        _fn("tvm_interop.cublas.dense")(*args_fn())


def test_events_refuse_bad_calls(loaded):
    with pytest.raises(ValueError, match="n must be in"):
        _fn("tvm_interop.cuda.events_create")(0, 0)
    with pytest.raises(ValueError, match="not an event pool handle"):
        _fn("tvm_interop.cuda.event_sync")(0, 0, 0, 0)
    with pytest.raises(ValueError, match="not an event pool handle"):
        _fn("tvm_interop.cuda.event_sync")(0, 0, None, 12345)   # streams may be ints, opaque pointers or None
    with pytest.raises(ValueError, match="not an event pool handle"):
        _fn("tvm_interop.cuda.events_free")(0)



def test_timing_events_refuse_bad_calls(loaded):
    with pytest.raises(ValueError, match="a time needs two events"):
        _fn("tvm_interop.cuda.timing_create")(0, 1)
    for name, args in (("timing_record", (0, 0, None)), ("timing_read", (0, 2)), ("timing_free", (0,))):
        with pytest.raises(ValueError, match="not a timing pool handle"):
            _fn(f"tvm_interop.cuda.{name}")(*args)


def test_stream_holds_refuse_bad_calls(loaded):
    """A hold's arguments are checked before any library is loaded, and a handle that is not a live hold (never
    made, or released already) is refused by name: it is looked up, never dereferenced."""
    hold, release = _fn("tvm_interop.cuda.stream_hold"), _fn("tvm_interop.cuda.stream_release")
    with pytest.raises(ValueError, match="timeout_ms must be in"):
        hold(0, None, 0)
    with pytest.raises(ValueError, match="device_id must be >= 0"):
        hold(-1, None, 100)
    with pytest.raises(TypeError, match="stream must be a stream handle"):
        hold(0, "stream", 100)
    for handle in (0, 12345, 1 << 40):
        with pytest.raises(ValueError, match="is not a held stream .* or it was already released"):
            release(handle)


def test_cudnn_engine_policy_is_validated_and_switchable(loaded):
    """The cuDNN engine policy (``measured`` by default: graph-API engines and the legacy path timed per
    convolution shape; ``legacy``: cudnnFind alone): set and read back, process-wide; anything else refused naming
    both, by the Python helper and by the native function itself. Nothing ran here, so no shape has a choice."""
    initial = native_libs.cudnn_engine_policy()
    assert initial in native_libs.CUDNN_ENGINE_POLICIES
    if not os.environ.get("TVM_INTEROP_CUDNN_ENGINES"):
        assert initial == "measured"
    try:
        assert native_libs.cudnn_engine_policy("measured") == initial
        assert native_libs.cudnn_engine_policy() == "measured"
        assert native_libs.cudnn_engine_policy("legacy") == "measured"
        with pytest.raises(ValueError, match="legacy, measured"):
            native_libs.cudnn_engine_policy("fastest")
        with pytest.raises(ValueError, match="set_engine_policy: unknown cuDNN engine policy 'fastest'.*'legacy'"
                                             ".*'measured'"):
            _fn("tvm_interop.cudnn.set_engine_policy")("fastest")
        assert native_libs.cudnn_engine_policy() == "legacy"
    finally:
        native_libs.cudnn_engine_policy(initial)
    assert native_libs.cudnn_conv_choices() == {"policy": initial, "choices": []}
    assert native_libs.cudnn_conv_choices(reset=True) == {"policy": initial, "choices": []}


# ---- real calls without a GPU ----------------------------------------------------------------------------------

# A child that calls every function with well-formed CUDA tensors (DLPack tensors that claim cuda:0; their data is
# host memory, which nothing may touch: each call must fail at the library or device before any kernel).
_CALLS = textwrap.dedent('''
    import ctypes, json, sys
    import numpy as np, tvm_ffi
    from tvm_interop.runtime import native_libs
    native_libs.load_extension(sys.argv[1], preload=sys.argv[2] == "preload")
    if native_libs.extension_info()["libraries"]["cudart"].get("device_count", 0) > 0:
        print(json.dumps({"gpu": True})); sys.exit(0)

    class DLDevice(ctypes.Structure):
        _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]
    class DLDataType(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                    ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
    class DLManagedTensor(ctypes.Structure):
        _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]
    keep = []
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    def cuda_tensor(*shape):
        arr = np.zeros(shape, "float32")
        dims = (ctypes.c_int64 * len(shape))(*shape)
        m = DLManagedTensor()
        m.dl_tensor.data, m.dl_tensor.device, m.dl_tensor.ndim = arr.ctypes.data, DLDevice(2, 0), len(shape)
        m.dl_tensor.dtype, m.dl_tensor.shape = DLDataType(2, 32, 1), dims
        keep.extend([arr, dims, m])
        return tvm_ffi.from_dlpack(new_capsule(ctypes.addressof(m), b"dltensor", None))

    calls = {
        "events_create": ("tvm_interop.cuda.events_create", (0, 4)),
        "timing_create": ("tvm_interop.cuda.timing_create", (0, 4)),
        "stream_hold": ("tvm_interop.cuda.stream_hold", (0, None, 100)),
        "conv2d": ("tvm_interop.cudnn.conv2d", ([1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0], cuda_tensor(1, 3, 8, 8),
                                                cuda_tensor(4, 3, 3, 3), cuda_tensor(4), cuda_tensor(1, 4, 8, 8))),
        "dense": ("tvm_interop.cublas.dense", ([0, 0, 1, 0], cuda_tensor(2, 4), cuda_tensor(3, 4),
                                               cuda_tensor(2, 3))),
    }
    out = {}
    for key, (name, args) in calls.items():
        try:
            tvm_ffi.get_global_func(name)(*args)
            out[key] = "no error"
        except Exception as e:
            out[key] = type(e).__name__ + ": " + str(e)
    print(json.dumps(out))
''')


_ENGINES_CHILD = _CALLS.split("    calls = {")[0] + textwrap.dedent('''
    import os
    out = {}
    try:
        out["policy"] = native_libs.cudnn_engine_policy()
    except Exception as e:
        out["policy"] = type(e).__name__ + ": " + str(e)
    conv = tvm_ffi.get_global_func("tvm_interop.cudnn.conv2d")
    engines = tvm_ffi.get_global_func("tvm_interop.cudnn.conv_engines")
    args = ([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0], cuda_tensor(1, 3, 8, 8), cuda_tensor(4, 3, 3, 3), cuda_tensor(4),
            cuda_tensor(1, 4, 8, 8), cuda_tensor(1, 4, 8, 8))
    for key, fn in (("conv2d", conv), ("conv_engines", engines)):
        try:
            out[key] = fn(*args)
        except Exception as e:
            out[key] = type(e).__name__ + ": " + str(e)
    print(json.dumps(out))
''')


@pytest.mark.parametrize("policy", ["measured", "fastest"])
def test_engine_policy_from_the_environment(ext, tmp_path, monkeypatch, policy):
    """``TVM_INTEROP_CUDNN_ENGINES`` sets the initial policy; an unknown value is an error naming the variable (at
    the first call that needs the policy, never a crash at load). Without a GPU, a convolution under the measured
    policy fails like any other (the device is missing before any engine is built), and ``conv_engines`` reports
    the graphs it could not build with the reason, for both operation graphs (the convolution alone; fused with
    bias, residual and ReLU), instead of raising."""
    monkeypatch.setenv("TVM_INTEROP_CUDNN_ENGINES", policy)
    out, _ = _run_child(tmp_path, _ENGINES_CHILD, ext.shared_path, "preload")
    if out.get("gpu"):
        pytest.skip("a CUDA device is present: this test is for GPU-less machines")
    if policy == "fastest":
        assert out["policy"].startswith("ValueError: TVM_INTEROP_CUDNN_ENGINES: unknown cuDNN engine policy "
                                        "'fastest'"), out
        return
    assert out["policy"] == "measured"
    assert out["conv2d"].startswith("RuntimeError: tvm_interop.cudnn.conv2d: "), out
    if not native_libs.library_candidates("libcudnn.so.9"):
        assert "libcudnn.so.9" in out["conv_engines"], out   # no cuDNN at all: the error says what to install
        return
    report = json.loads(out["conv_engines"])
    assert report["shape"] == ("x [1, 3, 8, 8] w [4, 3, 3, 3] stride 1x1 pad 1x1 dilation 1x1 groups 1 +bias +z "
                               "relu")
    assert report["handle"] is False and report["candidates"] == []
    assert [d.split(" graph refused: ")[0] for d in report["dropped"]] == ["conv only", "fused"], report
    assert all(len(d.split(" graph refused: ")[1]) > 0 for d in report["dropped"]), report


@pytest.mark.parametrize("preload", ["preload", "no-preload"])
def test_calls_without_gpu_fail_clearly(ext, tmp_path, preload):
    out, log = _run_child(tmp_path, _CALLS, ext.shared_path, preload)
    if out.get("gpu"):
        pytest.skip("a CUDA device is present: this test is for GPU-less machines")
    device = "no usable CUDA device"
    assert out["events_create"].startswith("RuntimeError: tvm_interop.cuda.events_create: ")
    assert device in out["events_create"] or "libcudart.so.13" in out["events_create"], out
    assert out["timing_create"].startswith("RuntimeError: tvm_interop.cuda.timing_create: ")
    assert device in out["timing_create"] or "libcudart.so.13" in out["timing_create"], out
    assert out["stream_hold"].startswith("RuntimeError: tvm_interop.cuda.stream_hold: ")
    assert device in out["stream_hold"] or "libcudart.so.13" in out["stream_hold"], out
    conv, dense = out["conv2d"], out["dense"]
    assert conv.startswith("RuntimeError: tvm_interop.cudnn.conv2d: "), conv
    assert dense.startswith("RuntimeError: tvm_interop.cublas.dense: "), dense
    assert device in conv or ("libcudnn.so.9" in conv and "pip install nvidia-cudnn-cu13" in conv), conv
    assert device in dense or ("libcublasLt.so.13" in dense and "pip install nvidia-cublas" in dense), dense
    if preload == "preload" and native_libs.library_candidates("libcudnn.so.9"):
        assert device in conv, conv        # the pip wheel was found: the failure is the missing GPU
    assert_runtime_only(log, 1)


# ---- linked into an exported model -----------------------------------------------------------------------------

def test_export_library_addon_registers_globals(ext, tmp_path):
    import tvm
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                y = R.add(x, x)
                R.output(y)
            return y

    lib = str(tmp_path / "model.so")
    tvm.compile(Mod, target="llvm").export_library(lib, addons=[ext.object_path])
    out, log = _run_child(tmp_path, _CHILD, "model", lib)
    assert out["functions"] == sorted(EXTENSION_FUNCTIONS)
    assert out["info"]["functions"] == list(EXTENSION_FUNCTIONS)
    assert_runtime_only(log, 1)
    # two copies in one process (the model's and the standalone one): the second overrides, both stay usable
    both = textwrap.dedent(f'''
        import json, tvm
        from tvm_interop.runtime import native_libs
        tvm.runtime.load_module({lib!r})
        native_libs.load_extension({ext.shared_path!r})
        del tvm  # nothing unloads either copy (they pin themselves)
        print(json.dumps({{"functions": native_libs.extension_functions(), "info": native_libs.extension_info()}}))
    ''')
    (tmp_path / "both").mkdir()
    out, _ = _run_child(tmp_path / "both", both)
    assert out["functions"] == sorted(EXTENSION_FUNCTIONS) and out["info"]["version"]
