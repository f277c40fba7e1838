"""A compile is reproducible: the same model, scheduler and cost model give the same schedule, the same wave-fusion
decisions and the same as-built IR in another process, whatever Python's string hashing (``PYTHONHASHSEED``)
makes of set and dict orders there, so a schedule file or a library built twice is the same thing. (The
nondeterminism that TVM's FuseOps had, by object address, is covered by ``test_keep_kernels``.)"""
import json
import os
import subprocess
import sys

SCRIPT = r"""
import hashlib, json, tvm_ffi, tvm_interop
from tvm_interop.models import get_model, small_config
from tvm_interop.passes.as_built import as_built_ir
from tvm_interop.passes.lower_streams import lower_program
mod = get_model("inception_v3", **small_config("inception_v3"))
cm = tvm_interop.compile(mod, scheduler="lios", cost="sim:cpu", guard=False, name="inception_v3",
                         max_memory_ratio=None, fusion="wave")
s = json.loads(cm.schedule.dumps())
low = lower_program(cm.built_program, cm.built_schedule, cm.target, max_streams=8, mode="stage").mod
print(json.dumps({"stages": s["stages"], "waves": s["options"]["waves"],
                  "wave_fusion": s["options"]["wave_fusion"]["stages"],
                  "as_built": str(tvm_ffi.structural_hash(as_built_ir(low, cm.target)))}))
"""


def _run(seed: str) -> dict:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_same_compile_in_two_processes_builds_the_same_program():
    a, b = _run("1"), _run("2")
    assert a["wave_fusion"], "the test needs fused stages"
    assert a == b
