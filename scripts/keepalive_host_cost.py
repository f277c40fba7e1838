"""Host time of one keep-alive call (``ffi.Array`` on k tensor handles, as ``passes.lower_streams`` issues them),
measured in the Relax VM on this machine's CPU: the scale of the ``host_keepalive`` prior of the GPU program
model (``passes.cost.program_fit.DEFAULT_PRIORS``). The call touches no device, so its cost is host work only.

    .venv/bin/python scripts/keepalive_host_cost.py        # prints us per call for 1, 4 and 16 tensors

Method: two VM functions per k, one with 400 keep-alive calls of the same k tensors and one without; the difference
of their medians over 200 interleaved calls, divided by 400.
"""
from __future__ import annotations

import time

import numpy as np

CALLS = 400


def measure(ks=(1, 4, 16), repeat: int = 200) -> dict[int, float]:
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    for k in ks:
        for with_calls in (True, False):
            x = relax.Var("x", relax.TensorType([4], "float32"))
            with bb.function(f"{'f' if with_calls else 'g'}{k}", [x], pure=False):
                ts = [bb.emit(relax.op.add(x, relax.const(np.float32(i)))) for i in range(k)]
                for _ in range(CALLS if with_calls else 0):
                    bb.emit(relax.Call(relax.ExternFunc("ffi.Array"), ts, ty_args=[relax.ObjectType()]))
                bb.emit_func_output(x)
    vm = relax.VirtualMachine(tvm.compile(bb.get(), target="llvm"), tvm.cpu())
    a = tvm.runtime.tensor(np.zeros(4, "float32"))
    out = {}
    for k in ks:
        f, g = vm[f"f{k}"], vm[f"g{k}"]
        for _ in range(20):
            f(a), g(a)
        tf, tg = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            f(a)
            tf.append(time.perf_counter() - t)
            t = time.perf_counter()
            g(a)
            tg.append(time.perf_counter() - t)
        out[k] = (float(np.median(tf)) - float(np.median(tg))) / CALLS * 1e6
    return out


if __name__ == "__main__":
    for k, us in measure().items():
        print(f"keep-alive call on {k:2d} tensors: {us:.2f} us")
