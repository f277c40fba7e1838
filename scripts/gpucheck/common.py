"""Settings shared by the GPU check's steps (``scripts/gpu_check.py`` is the command line)."""
from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "gpu_check.py")
DEFAULT_DIR = os.path.join(REPO, ".gpu_check")
SCHEDULERS = ("sequential", "greedy", "lios", "ios", "greedy+wave", "lios+wave")
WAVE = "+wave"   # scheduler suffix: the schedule with every fusable stage fused into one kernel (passes.wave)
FLOW = "+flow"   # scheduler suffix: runs of whole stages in one persistent launch (passes.wave.flow; CUDA only)
FLOW_NOINLINE = "+flow_noinline"   # the same with each run's device functions compiled as calls (not inlined)
FLOW_COARSE = "+flow_coarse"   # the same with one task per block of a repacked member's own (passes.wave.flow)
FLOW_OPTIONS = {FLOW: {}, FLOW_NOINLINE: {"inline": False}, FLOW_COARSE: {"coarsen": True}}   # apply_flow_fusion's
FLOWS = tuple(FLOW_OPTIONS)
FUSIONS = (WAVE, *FLOWS)


def fusion_of(spec: str) -> tuple[str, str]:
    """``(scheduler, fusion suffix or "")`` of a --schedulers item: ``greedy+flow`` -> ``("greedy", "+flow")``."""
    for suffix in FUSIONS:
        if spec.endswith(suffix):
            return spec[: -len(suffix)], suffix
    return spec, ""
CARRY_LIMIT = 60 * 2**20
FUNC = "__tvm_interop_main"


def derive_weights(originals: list, recipe: list[dict]) -> list:
    """The weights of a program whose constants derive from the model's (IOS's merged convolutions), computed from
    the model's own weights (numpy arrays) by ``recipe``, one item per weight (written by the build:
    ``gpucheck.build._weight_recipe``): ``{"from": j}`` the model's weight ``j``; ``{"pad_concat": [[j, row, col],
    ...], "kernel": [KH, KW]}`` the kernels ``j`` zero-padded to ``KH x KW`` at (row, col), concatenated over output
    channels; ``{"concat": [j, ...], "axis": a}`` concatenated along ``a``. The device draws the model's weights
    at random, so a merged program's weights must be derived from those draws, as ``passes.merge`` derives them."""
    import numpy as np

    out = []
    for item in recipe:
        if "from" in item:
            out.append(originals[item["from"]])
        elif "pad_concat" in item:
            kh_all, kw_all = item["kernel"]
            parts = []
            for j, row, col in item["pad_concat"]:
                w = originals[j]
                o, c, kh, kw = w.shape
                padded = np.zeros((o, c, kh_all, kw_all), dtype=w.dtype)
                padded[:, :, row:row + kh, col:col + kw] = w
                parts.append(padded)
            out.append(np.ascontiguousarray(np.concatenate(parts, axis=0)))
        elif "concat" in item:
            out.append(np.ascontiguousarray(np.concatenate([originals[j] for j in item["concat"]], axis=item["axis"])))
        else:
            raise ValueError(f"unknown weight recipe item {item!r}")
    return out
