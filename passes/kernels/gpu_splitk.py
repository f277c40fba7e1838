"""GPU schedule for convolutions with few outputs and a long reduction: the reduction split across a block's threads.

Why: at batch 1 the late convolutions of a CNN have small feature maps and many input channels (Inception-v3's
8x8 blocks: a 1x1 convolution 2048 -> 192 channels has 12,288 outputs, each a sum of 2,048 products). DLight's
``Matmul`` rule tiles such a convolution as a GEMM of 64 x 192 x 2048 into 32 x 64 tiles: 6 thread blocks on a
132-SM H100, each looping over the whole reduction. Measured on an H100 (``docs/unit_costs_h100_2026-11-26``),
Inception-v3's 66 convolutions with at most 17x17 outputs take 4.28 ms as TVM kernels (3.48 ms with cuDNN where
that is faster): 1.9 TFLOP/s, against 14 TFLOP/s for its convolutions on large maps; the 8x8 one above takes 98 us.
Its 35x35 convolutions with 32-96 output channels fare no better (39-78 blocks, 1.3-2.7 TFLOP/s as TVM kernels).

This rule gives every output a group of 8-16 threads that each sum a strided part of the reduction, then
reduce their partial sums in shared memory (TVM's cross-thread reduction), one block per output channel and 32
neighbouring output pixels (``threadIdx.x``: consecutive input addresses, so loads coalesce; the weight is the
same for the warp). The example gets 384 blocks of 512 threads, 128 products per thread. No global intermediate
buffer: a kernel's workspace would be shared by kernels running at once on other streams. The epilogue (bias,
residual, ReLU) is applied by one thread per output before the single store.

Not measured yet, so opt-in: :func:`apply_split_reduction` schedules a module's kernels with it before a build
(the build's default rules leave scheduled kernels alone); ``scripts/gpu_check.sh build --splitk MODELS`` builds an
entry MODEL+splitk that way, and with ``--unit-costs`` times every unit with it, so a GPU run shows per kernel
where it beats DLight's ``Matmul`` schedule.
"""

from __future__ import annotations

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

# DLight's Matmul rule tiles a convolution's GEMM into blocks of 32 output pixels x 64 output channels; below this
# many blocks (two per SM of a 132-SM H100) it leaves the device mostly idle, and this rule takes the kernel
# (Inception-v3: its 8x8 and 17x17 convolutions, 6-60 blocks, and its 35x35 ones with 32-96 channels, 39-78)
GEMM_TILE = (32, 64)
MIN_GEMM_BLOCKS = 264
# at least this many terms per output: shorter reductions leave a group of threads too little to sum
MIN_REDUCTION = 128
PIXELS_PER_BLOCK = 32            # threadIdx.x: neighbouring output pixels of one channel (one warp)
SPLIT_LONG, SPLIT_SHORT = 16, 8  # threadIdx.y: threads per output, 16 from 1024 terms on (at least 64 terms each)


def _int_extent(sch: s_tir.Schedule, loop) -> int | None:
    ext = sch.get(loop).extent
    return int(ext) if isinstance(ext, tirx.IntImm) else None


def gemm_blocks(pixels: int, channels: int) -> int:
    """Thread blocks DLight's Matmul rule launches for a convolution with these output pixels and channels."""
    return -(-pixels // GEMM_TILE[0]) * -(-channels // GEMM_TILE[1])


def split_for(reduction: int) -> int:
    """Threads per output for a reduction of ``reduction`` terms."""
    return SPLIT_LONG if reduction >= 1024 else SPLIT_SHORT


class SplitReductionConv(GPUScheduleRule):
    """Convolutions (NCHW, ``conv2d`` blocks) that DLight would tile into fewer than ``MIN_GEMM_BLOCKS`` blocks,
    with at least ``MIN_REDUCTION`` terms per output, followed by at most an elementwise epilogue; anything else
    returns None (the next rule)."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:  # noqa: D102
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        return schedule_split_reduction(func)


def schedule_split_reduction(func: tirx.PrimFunc, bind_threads: bool = True) -> s_tir.Schedule | None:
    """The schedule of :class:`SplitReductionConv`, or None where it does not apply. ``bind_threads=False``: the
    same loop structure with no GPU thread bound (it runs on a CPU: how tests check its index arithmetic)."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if not infos:
        return None
    infos = try_inline(sch, infos)
    kinds = infos[0].dom_kind()
    n_spatial = len(kinds.rstrip("R"))
    # the output channel and pixels (the batch of 1 folded away), then the reduction (channels x window)
    if len(infos) not in (1, 2) or kinds[:n_spatial] != "S" * n_spatial or n_spatial < 2 or n_spatial == len(kinds):
        return None
    conv = infos[0].block_rv
    if not sch.get(conv).name_hint.startswith("conv2d_nchw"):
        return None
    epilogue = infos[1].block_rv if len(infos) == 2 else None
    if epilogue is not None and (not infos[1].is_injective() or infos[1].dom_kind() != "S" * n_spatial):
        return None
    loops = sch.get_loops(conv)
    if len(loops) != len(kinds):
        return None
    extents = [_int_extent(sch, lp) for lp in loops]
    if any(e is None for e in extents):
        return None
    pixels = reduction = 1
    for e in extents[1:n_spatial]:
        pixels *= e
    for e in extents[n_spatial:]:
        reduction *= e
    if gemm_blocks(pixels, extents[0]) >= MIN_GEMM_BLOCKS or reduction < MIN_REDUCTION:
        return None
    split = split_for(reduction)
    bind = sch.bind if bind_threads else (lambda loop, thread: None)
    try:
        # anchor: the block that stores the kernel's output (the epilogue, else the convolution itself); a block per
        # channel and PIXELS_PER_BLOCK consecutive output pixels, a thread (x) per pixel
        anchor = epilogue if epilogue is not None else conv
        channel, *pixels = sch.get_loops(anchor)[:n_spatial]
        pix = sch.fuse(*pixels) if len(pixels) > 1 else pixels[0]
        pix_outer, pix_inner = sch.split(pix, factors=[None, PIXELS_PER_BLOCK])
        bx = sch.fuse(channel, pix_outer)
        bind(bx, "blockIdx.x")
        bind(pix_inner, "threadIdx.x")
        if epilogue is not None:
            # the convolution of each thread's output, its result in a register
            sch.compute_at(conv, pix_inner, preserve_unit_loops=True)
            sch.set_scope(conv, 0, "local")
        # the reduction: threadIdx.y sums every split-th term, then the partial sums meet in shared memory (TVM's
        # cross-thread reduction; the epilogue then runs on threadIdx.y == 0)
        r_loops = sch.get_loops(conv)[-(len(kinds) - n_spatial):]
        r = sch.fuse(*r_loops) if len(r_loops) > 1 else r_loops[0]
        r_serial, r_thread = sch.split(r, factors=[None, split])
        sch.reorder(r_thread, r_serial)
        bind(r_thread, "threadIdx.y")
    except s_tir.ScheduleError:
        return None
    return sch


def apply_split_reduction(mod, target: Target) -> tuple[object, list[str]]:
    """``mod`` with every kernel the rule takes scheduled by it (marked scheduled, so the build's default rules
    leave it): ``(module, names of those kernels)``. How ``scripts/gpu_check.sh build --splitk`` makes its entry."""
    import tvm

    updated, names = {}, []
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        if func.attrs is not None and "tirx.is_scheduled" in func.attrs and int(func.attrs["tirx.is_scheduled"]):
            continue
        sch = SplitReductionConv().apply(func, target, False)
        if sch is not None:
            updated[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
            names.append(gv.name_hint)
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs)
    for gv, func in updated.items():
        out[gv] = func
    return out, sorted(names)
