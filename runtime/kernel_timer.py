"""Time one built kernel (a tuning candidate) the way MetaSchedule's runners do, with TVM's runtime only.

Shared by the device server (``runtime.rpc_server``: a candidate sent by a fleet) and the tuning-bundle
measurer (``runtime.tuning_bundle``: a batch of candidates carried to the device by hand): random arguments
allocated on the device from MetaSchedule's argument description (``["TENSOR", dtype, shape]``), the module's
entry function timed by ``time_evaluator`` with ``number`` / ``repeat`` / ``min_repeat_ms``; seconds per repeat.
"""
from __future__ import annotations

import numpy as np


def random_tensor(shape, dtype: str, dev, rng):
    import tvm

    if "float" in dtype:
        data = rng.uniform(-1, 1, size=tuple(shape)).astype(dtype)
    elif dtype == "bool":
        data = rng.integers(0, 2, size=tuple(shape)).astype(dtype)
    else:
        data = rng.integers(0, 8, size=tuple(shape)).astype(dtype)
    return tvm.runtime.tensor(data, dev)


def time_kernel(mod, args_info, dev, number: int = 3, repeat: int = 1, min_repeat_ms: int = 100,
                seed: int = 0) -> list[float]:
    """Seconds per repeat of ``mod``'s entry function on ``dev`` (random arguments from ``args_info``)."""
    rng = np.random.default_rng(seed)
    args = []
    for info in args_info:
        if info[0] != "TENSOR":
            raise ValueError(f"cannot allocate argument {info!r}")
        args.append(random_tensor(info[2], info[1], dev, rng))
    f = mod.time_evaluator(mod.entry_name, dev, number=int(number), repeat=int(repeat),
                           min_repeat_ms=int(min_repeat_ms))
    dev.sync()
    return [float(x) for x in f(*args).results]
