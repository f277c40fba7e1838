"""Real inputs and outputs for ``tvm-interop run``: ``.npy`` / ``.npz`` files checked against the model.

Why a module: a model's inputs come from a file the user made elsewhere (numpy, a torch export, another
runtime); a wrong shape or dtype must be reported before anything runs, naming the input and what it expects,
not as an error from deep inside TVM. Outputs are written atomically so a crash never leaves half a file.
"""
from __future__ import annotations

import io
import os
from typing import Sequence

import numpy as np

from tvm_interop.runtime.errors import InteropError


def _describe(sig: dict) -> str:
    return f"{tuple(int(d) for d in sig['shape'])} {sig['dtype']}"


def _load(path: str):
    if not os.path.exists(path):
        raise InteropError(f"input file {path!r} does not exist")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InteropError(f"cannot read input file {path!r} as .npy/.npz: {e}") from None


def read_inputs(spec: str, signature: Sequence[dict]) -> list[np.ndarray]:
    """The model's inputs from ``spec``: ``x.npy[,y.npy...]`` (one file per input, in order) or one ``.npz``
    (arrays by input name, else ``arr_0, arr_1...`` in order). Shapes and dtypes must match ``signature``."""
    paths = [p.strip() for p in spec.split(",") if p.strip()]
    if not paths:
        raise InteropError("--input names no file")
    arrays: list[tuple[str, np.ndarray]] = []
    if len(paths) == 1 and paths[0].endswith(".npz"):
        with _load(paths[0]) as npz:
            names = [s.get("name") or f"input {i}" for i, s in enumerate(signature)]
            if all(s.get("name") in npz.files for s in signature):
                arrays = [(f"{paths[0]}[{s['name']}]", npz[s["name"]]) for s in signature]
            else:
                keys = [f"arr_{i}" for i in range(len(npz.files))]
                if sorted(npz.files) != sorted(keys):
                    raise InteropError(f"{paths[0]} holds {sorted(npz.files)}; expected the model's inputs by name "
                                       f"({', '.join(names)}) or positional arrays arr_0...")
                arrays = [(f"{paths[0]}[{k}]", npz[k]) for k in keys]
    else:
        arrays = [(p, _load(p)) for p in paths]
        for p, a in arrays:
            if not isinstance(a, np.ndarray):
                raise InteropError(f"{p} is an .npz archive; give it alone (--input {p}) or one .npy per input")
    if len(arrays) != len(signature):
        want = ", ".join(f"{s.get('name') or i}: {_describe(s)}" for i, s in enumerate(signature))
        raise InteropError(f"the model takes {len(signature)} input(s) ({want}); got {len(arrays)} array(s)")
    out = []
    for i, ((where, a), sig) in enumerate(zip(arrays, signature)):
        name = sig.get("name") or f"input {i}"
        if tuple(a.shape) != tuple(int(d) for d in sig["shape"]) or str(a.dtype) != sig["dtype"]:
            raise InteropError(f"input {name!r} must be {_describe(sig)}; {where} holds {tuple(a.shape)} {a.dtype}")
        out.append(np.ascontiguousarray(a))
    return out


def write_outputs(path: str, outputs: Sequence[np.ndarray]) -> None:
    """``.npy`` (a model with exactly one output) or ``.npz`` (``output_0, output_1...``), written atomically."""
    from tvm_interop.runtime import atomic

    buf = io.BytesIO()
    if path.endswith(".npz"):
        np.savez(buf, **{f"output_{i}": np.asarray(o) for i, o in enumerate(outputs)})
    elif path.endswith(".npy"):
        if len(outputs) != 1:
            raise InteropError(f"the model has {len(outputs)} outputs; write them to an .npz, not {path!r}")
        np.save(buf, np.asarray(outputs[0]))
    else:
        raise InteropError(f"--output must end in .npy or .npz, got {path!r}")
    atomic.write_bytes(path, buf.getvalue())
