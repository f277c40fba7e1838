"""GPU default schedule for small-window reductions (pooling, depthwise convolution): one thread per output.

Why: DLight's ``Reduction`` / ``GeneralReduction`` rules spread a reduction over the threads of a block, one
block per output element. That suits long reductions (a softmax row, a mean over a feature map), but a 3x3
average pool sums 9 terms: 247 of each block's 256 threads idle, and a block is launched for every one of the
~350 K outputs. On an H100 (``shared/gpu-data/h100-2026-11-22/costs_inception_v3_r2s3b8.json``) Inception-v3's
nine average pools took 1.58 ms of the 7.35 ms its 120 kernels take alone; with cuDNN convolutions they are a
quarter of the program. DLight's ``Fallback`` (which max pools and depthwise convolutions get) does assign one
thread per output, but writes the window's sum to a global buffer and reads it back in a second launch.

This rule computes whole outputs per thread: padding inlined, the window summed serially in a register, the
elementwise epilogue (the average's division, a fused bias or ReLU) applied before the single store. It takes
only kernels whose every reduction is a small window (``MAX_WINDOW`` terms) over enough outputs to fill the
device (``MIN_OUTPUTS``); anything else is left to DLight's rules (``passes.cuda_build.robust_default_schedule``
tries this rule after ``Matmul`` and ``GEMV``, before the reduction rules).
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

# a window of at most this many terms per output (7x7 pooling / depthwise: 49): longer reductions keep DLight's
# block-per-output rules, which then have enough terms to give every thread work
MAX_WINDOW = 64
# fewer outputs than this keep DLight's rules: a global mean (1-2 K channels of 7x7 or 8x8) has too few outputs
# to fill 16 blocks of threads, and enough terms per output for DLight's block-per-output reduction
MIN_OUTPUTS = 1 << 12
THREADS_PER_BLOCK = 256


def _extent(sch: s_tir.Schedule, loops) -> int | None:
    n = 1
    for loop in loops:
        ext = sch.get(loop).extent
        if not isinstance(ext, tirx.IntImm):
            return None
        n *= int(ext)
    return n


class WindowReduction(GPUScheduleRule):
    """One thread per output element for kernels made of small-window reductions and elementwise epilogues."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:  # noqa: D102
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if not infos:
            return None
        infos = try_inline(sch, infos)
        if any("O" in info.dom_kind() for info in infos):
            return None
        reductions = []
        for info in infos:
            kinds = info.dom_kind()
            if "R" not in kinds:
                continue
            window = _extent(sch, [lp for lp, k in zip(sch.get_loops(info.block_rv), kinds) if k == "R"])
            if window is None or window > MAX_WINDOW:
                return None
            reductions.append(info.block_rv)
        if not reductions:
            return None
        blocks = [info.block_rv for info in infos]
        if "R" in infos[-1].dom_kind():
            # the last block reduces into the output: accumulate in a register (cache_write makes its buffer
            # local), store once from a write-back block
            anchor, inner, local = sch.cache_write(blocks[-1], 0, "local"), blocks, blocks[:-1]
        else:
            anchor, inner, local = blocks[-1], blocks[:-1], blocks[:-1]
        outputs = _extent(sch, sch.get_loops(anchor))
        if outputs is None or outputs < MIN_OUTPUTS:
            return None
        try:
            bx, tx = sch.split(sch.fuse(*sch.get_loops(anchor)), factors=[None, THREADS_PER_BLOCK])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            for block in reversed(inner):
                sch.compute_at(block, tx, preserve_unit_loops=True)
            for block in local:
                sch.set_scope(block, 0, "local")
            for block in reductions:
                loops = sch.get_loops(block)
                if len(loops) > 2:   # below blockIdx.x, threadIdx.x: the zero store goes before the window
                    sch.decompose_reduction(block, loops[2])
        except s_tir.ScheduleError:
            return None
        return sch
