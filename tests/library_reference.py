"""The library functions' contract, in numpy: what ``tvm_interop.cudnn.conv2d`` and ``tvm_interop.cublas.dense``
compute for a given ``params`` layout (``passes.offload``'s docstring). The offload tests register these under
the library names in a child process and run the offloaded program in TVM's VM on the CPU: the unit recognition,
the parameters it extracts and the Relax calls it emits are then checked against plain TVM, on every zoo model,
without a GPU. (cuDNN's own numerics are checked on a GPU by ``scripts/gpu_check.sh``.)"""
from __future__ import annotations

import numpy as np


def conv2d(params, x, w, *rest):
    sh, sw, ph, pw, dh, dw, groups, has_bias, has_z, relu, _tf32 = (int(p) for p in params)
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n, _, hh, ww = x.shape
    o, cg, kh, kw = w.shape
    oh = (hh - dh * (kh - 1) - 1) // sh + 1
    ow = (ww - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs, ws = x[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    k = 0
    if has_bias:
        out += rest[k].reshape(1, o, 1, 1)
        k += 1
    if has_z:
        out += rest[k]
    if relu:
        out = np.maximum(out, 0.0)
    return out.astype(np.float32)


def dense(params, x, w, *rest):
    has_bias, relu, w_transposed, _tf32 = (int(p) for p in params)
    out = x.astype(np.float64) @ (w.T if w_transposed else w).astype(np.float64)
    if has_bias:
        out = out + rest[0].reshape(1, -1)
    if relu:
        out = np.maximum(out, 0.0)
    return out.astype(np.float32)


def register() -> None:
    """Register both under the library names (override), in this process."""
    import tvm_ffi

    def packed(ref):
        def call(params, *tensors):
            tensors[-1].copyfrom(ref(tuple(params), *[t.numpy() for t in tensors[:-1]]))
        return call

    tvm_ffi.register_global_func("tvm_interop.cudnn.conv2d", packed(conv2d), override=True)
    tvm_ffi.register_global_func("tvm_interop.cublas.dense", packed(dense), override=True)
