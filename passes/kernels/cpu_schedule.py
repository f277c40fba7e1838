"""A default CPU schedule for the PrimFuncs that ``relax.get_pipeline("zero")`` produces.

TVM's default CPU build of an unscheduled PrimFunc is a naive loop nest: no tiling, no explicit vectorisation,
no threads (Inception-v3: 6.2 s vs 193 ms in PyTorch). This module gives the heavy kernels a reasonable
hand-written schedule so that untuned builds are usable. It is generic: it inspects the blocks of a PrimFunc
(iterator kinds, buffer access patterns) instead of matching names or one model.

Plans, tried in order until one applies (each on a fresh ``tvm.s_tir.Schedule``):

``nchwc_conv``
    only the channel-blocked convolution of ``passes.kernels.nchwc`` (the CPU default layout, ``passes.layout``),
    found by its block annotation: a register tile of ``co_t`` output-channel blocks x ``ow_t`` output columns,
    one vector of ``c`` channels each, written back as whole vectors with the epilogue inlined.
``light_reduction``
    one reduction block with a small reduction (<= 64) and no operand reused across an output axis: pooling,
    depthwise conv. Memory bound. Where every read is contiguous along the output's innermost axis and it holds
    whole vectors (the channel lanes of ``NCHW[c]c``, the width of a stride-1 pooling): one vector tile
    accumulated in registers under the unrolled window, padding inlined, threads by elements read. Otherwise
    (strided NCHW pooling, depthwise conv): unroll the window, keep LLVM's vectoriser in charge, threads from
    :data:`_MIN_PARALLEL_LIGHT_READS` window reads (measured: explicit vectorisation with gathers is slower).
``spatial_vector``
    one reduction block with a compute-bound reuse pattern (conv2d NCHW incl. grouped/strided/1xk, matmul,
    dense with a batch), with its injective prologue (padding) and epilogue (bias, batch-norm scale/shift,
    relu, ...). Chooses a vector axis ``v`` among the output axes: either the output's innermost axis when every
    input is contiguous (or invariant) along it, or an axis along which a *weight* is strided, that weight then
    being repacked with ``v`` innermost (conv: OIHW -> O/16 I H W 16; the copy is marked as layout-rewrite
    preprocessing, so a built library does it once per constant weight: ``passes.kernels.prepack``); a batch-1
    dense streaming a big ``[K, N]`` weight gets it repacked into ``[N/t, K, t]`` column panels the same way,
    so each tile reads one contiguous run (:func:`_streamed_panels`). A second axis ``u`` that some ``v``-dependent input does not depend on (output width for conv
    over channels) gives the register tile ``[u_t x v_t]``: each vector load of the weights feeds ``u_t`` FMAs and
    each broadcast of an input element feeds ``v_t / lanes`` FMAs. Loop order: outer tiles (the leading ones fused
    and parallel), the reduction loops, ``u_t`` (unrolled), ``v_t`` (vectorised). The accumulator tile lives in a
    small buffer allocated inside the loop nest (a stack array, registers after LLVM's SROA: see ``_ACC_SCOPE``
    for why its scope is ``global``), written back once per tile with the epilogue inlined into
    the write-back; the padding stage stays a separate, parallel stage, except where it pads nothing (1x1
    convolutions): that plain copy of the input is inlined (:func:`_inline_identity_copy`).
``reduction_vector``
    dense / ``matmul_NT`` without enough reuse to repack the weights (GEMV, batch 1): ``rfactor`` the reduction
    by the vector width, vectorise the partial sums (contiguous loads of both operands).
``simple``
    any other single reduction: parallel outer spatial loops, reduction inside, epilogue computed at the tile.
``injective``
    no reduction (elementwise, concat, pad, reshape, ...): inline producers, exact-tile vectorisation of the
    innermost loop, threads only for big outputs.
``each_block``
    several reductions (softmax, norms): each block parallelised on its own.

Every transformation goes through TVM's schedule primitives, which refuse illegal ones; any error makes
:func:`schedule_cpu` move on to the next plan and finally return the input unchanged (logged at debug level), so
a kernel is never wrong. The plans were tuned on a 2-core AMD EPYC (AVX2) with ``mcpu`` set; note that the plain
``"llvm"`` target compiles for generic x86-64 (SSE2), about 2.5x slower on convs than
``{"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()}``.

``schedule_cpu(..., parallel=False)`` produces single-threaded kernels, for an executor that runs several
kernels at the same time on its own worker threads (TVM's thread pool inside each kernel would compete).

Run ``python -m tvm_interop.passes.kernels.cpu_schedule --help`` for the benchmark of the default build vs this schedule.
"""
from __future__ import annotations

import collections
import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from .nchwc import NCHWC_CONV

log = logging.getLogger(__name__)

__all__ = ["schedule_cpu", "apply_cpu_schedules", "vector_lanes"]

# compute-bound kernels: multiply-adds per thread below which threads cost more than they give. Was 1 << 20 for
# the kernel whatever the threads; on 2 cores (EPYC znver4, sequential programs, interleaved rounds) 1 << 17 for
# the kernel ran Inception-v3 1.04x, SqueezeNet 1.03-1.04x, RandWire 1.10x faster in two runs, GoogLeNet
# 0.93x in one run and 1.08-1.12x in five (Inception-v3's 1x3 / 3x1 / 1x7 convolutions of ~1 M multiply-adds had
# run on one core); 1 << 15 and 0 measured the same as 1 << 17 (docs/bench_parallel_threshold_2026-11-30.md).
# Per thread, so that a many-core machine does not cut a small kernel into slivers: 2 threads -> 1 << 17.
_MIN_PARALLEL_MACS_PER_THREAD = 1 << 16
_MIN_PARALLEL_ELEMS = 1 << 20  # memory-bound kernels: output elements below which threads do not pay
# a light reduction read by strided or NCHW windows (depthwise convolution, NCHW pooling): window reads (output
# elements x window) from which threads pay. Counted by elements alone (1 << 20), every depthwise convolution of
# RandWire and NASNet ran on one core, a 7x7 one in 0.8 ms; end to end (2 cores, interleaved A/B) 1 << 18 reads:
# RandWire 0.90x, NASNet-A-mobile 0.87x of the time, RandWire at width 0.5 unchanged; 1 << 16: 1.05x there
_MIN_PARALLEL_LIGHT_READS = 1 << 18
_MIN_PARALLEL_BESIDE = 1 << 15  # ... for a stage beside a parallel nest of the same kernel (threads already awake)
_MAX_VEC_REGS = 4  # at most this many vector registers per accumulator row
_MIN_REPACK_REUSE = 16  # repack a weight only if each element is then used this many times (conv: OH*OW)
_REPACK_IN_DEST_ORDER = True
_ACC_REGS = (5, 8)  # fraction of the vector registers that hold the accumulator tile
_ACC_REGS_1X1 = (13, 16)  # ... for a reduction over one axis, with 32 registers (AVX-512): 26 (13 rows x 2)
# an injective block whose innermost rows do not fill whole vectors has its trailing loops fused where every
# buffer walks them contiguously (``_contiguous_suffix``): NASNet-A-mobile's relu over 132 x 14 x 14, alone,
# 23.3 -> 1.8 us (docs/bench_contiguous_rows_2026-11-30.md). False: as before (A/B measurements)
_FUSE_CONTIGUOUS_ROWS = True
_MIN_PARALLEL_BYTES = 1 << 21  # ... or bytes of its biggest operand above which threads pay (memory bound)
_REORDER_MIN_INPUT_BYTES = 1 << 20  # an activation up to a typical per-core L2 is re-read from cache anyway
_LIGHT_REDUCTION = 64  # reduction extent up to which a reduction without operand reuse is memory bound
# Storage scope of the register tiles (accumulators). Not "local": TVM's LowerTVMBuiltin leaves a CPU allocation
# on the stack only when its scope is "global" and it is under 1 KiB (runtime::kMaxStackAlloca), and turns every
# other one into a TVMBackendAllocWorkspace call, heap memory that LLVM cannot keep in registers, so a "local"
# tile was loaded and stored around every multiply-add. The tile is allocated inside the loop nest (inside the
# parallel loop's body: one per thread), so "global" gives an alloca that LLVM's SROA puts in registers. Measured
# (2-core EPYC, AVX2): RandWire's 1x1 convolution 39 -> 39 at 14x14 45 -> 19 us, 78 -> 78 at 7x7 45 -> 16 us
# (each alone); sequential programs, same process, two runs: RandWire 1.31x / 1.35x, Inception-v3 1.02x / 1.04x,
# SqueezeNet 1.04x, GoogLeNet 1.00x (scripts/bench_register_tiles.py, docs/bench_cpu_register_tiles_2026-11-30.md).
# A tile of 1 KiB or more (AVX-512's 20-26 accumulator registers) TVM would still put on the heap; our TIR
# pipeline marks allocations of 1-2 KiB to stay on the stack (passes.kernels.stack_tiles).
_ACC_SCOPE = "global"
# a TVMBackendAllocWorkspace call in a built kernel's LLVM IR (device type 1: CPU), its byte count
_WORKSPACE_CALL = re.compile(r"call ptr %\w+\(i32 1, i32 %\w+, i64 (\w+), i32 \d+, i32 \d+\)")


def workspace_allocations(llvm_ir: str) -> list[int | None]:
    """Bytes of each heap workspace allocation in the LLVM IR of a built CPU library (None: a size known only at
    run time). What the register tiles must not be (``_ACC_SCOPE``): tests and ``scripts/bench_register_tiles.py``
    read the library that was built, not the schedule."""
    return [int(n) if n.isdigit() else None for n in _WORKSPACE_CALL.findall(llvm_ir)]


@dataclass(frozen=True)
class _Cfg:
    lanes: int  # fp32 lanes of one vector register
    acc_regs: int  # vector registers for the accumulator tile
    threads: int  # threads a parallel loop gets (1: no parallel loops)
    acc_regs_1x1: int = 0  # ... when the reduction runs over one axis only (1x1 conv, matmul): simpler loop body


# ----------------------------------------------------------------------------------------------- target
def _as_target(target):
    if target is None:
        return tvm.target.Target("llvm")
    if isinstance(target, tvm.target.Target):
        return target
    return tvm.target.Target(target)


def _simd_bits(target) -> int:
    """Width of one SIMD register of ``target`` in bits (plain "llvm" on x86 is generic x86-64: SSE2)."""
    try:
        from tvm.target import codegen

        tgt = _as_target(target)
        if tgt.kind.name != "llvm":
            return 128
        if codegen.llvm_cpu_has_features(["avx512f"], tgt):
            return 512
        if codegen.llvm_cpu_has_features(["avx"], tgt):
            return 256
        triple = str(dict(tgt.attrs).get("mtriple", "") or codegen.llvm_get_system_triple()).lower()
        if triple.startswith(("x86", "i686", "i386")):
            return 128
        width = int(codegen.llvm_get_vector_width(tgt))
        return min(max(width, 128), 512) if width > 0 else 128
    except Exception:  # pragma: no cover - a strange target is not a reason to fail
        return 128


def _num_vector_regs(target) -> int:
    try:
        tgt = _as_target(target)
        triple = str(dict(tgt.attrs).get("mtriple", "")).lower()
        if _simd_bits(tgt) == 512 or triple.startswith(("aarch64", "arm64")):
            return 32
    except Exception:  # pragma: no cover
        pass
    return 16


def vector_lanes(target=None, dtype_bits: int = 32) -> int:
    """Number of ``dtype_bits`` lanes in one SIMD register of ``target``.

    The plain ``"llvm"`` target compiles for generic x86-64 (SSE2, 4 x fp32); give the CPU, e.g.
    ``{"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()}``, to get AVX2 / AVX-512 code.
    """
    return max(1, _simd_bits(target) // dtype_bits)


def _num_threads() -> int:
    from tvm_interop.runtime.cpu_threads import kernel_threads

    return kernel_threads()


# ----------------------------------------------------------------------------------------------- helpers
class _Skip(Exception):
    """This plan does not apply to the function."""


def _int(x) -> int | None:
    try:
        return int(x)
    except Exception:
        return None


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    return _int(sch.get(loop).extent)


def _work(ivs) -> int:
    """Product of the static extents of block iterators (a dynamic one, e.g. the batch, counts as 1)."""
    return math.prod(_int(iv.dom.extent) or 1 for iv in ivs)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _best_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in _divisors(n) if d <= max(1, cap))


def _iter_kind(iv) -> str:
    return {tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}.get(iv.iter_type, "O")


def _buf(region):
    """The buffer of a read/write region (``.source`` in TVM 0.27, ``.buffer`` before)."""
    return region.source if hasattr(region, "source") else region.buffer


def _coeff(expr, var) -> int | None:
    """Integer coefficient of ``var`` in the (linear) index ``expr``; None if not linear with a constant."""
    from tvm import sym

    res = sym.detect_linear_equation(expr, [var])
    if len(res) != 2:
        return None
    return _int(res[0])


def _flat_offset(region):
    """Flattened element offset of the first point of a buffer region."""
    (off,) = _buf(region).offset_of([r.min for r in region.region])
    return off


def _is_point(region) -> bool:
    return all(_int(r.extent) == 1 for r in region.region)


def _uses(expr, var) -> bool:
    from tvm.tirx.analysis import undefined_vars

    return any(v.same_as(var) for v in undefined_vars(expr))


def _region_uses(region, var) -> bool:
    return any(_uses(r.min, var) or _uses(r.extent, var) for r in region.region)


def _dims_using(region, var) -> list[int]:
    return [d for d, r in enumerate(region.region) if _uses(r.min, var)]


def _index_dtype(region) -> str:
    shape = _buf(region).shape
    if not len(shape):
        return "int64"
    dim = shape[0]
    dtype = getattr(dim, "dtype", None) or getattr(getattr(dim, "ty", None), "dtype", None)
    return str(dtype) if dtype is not None else "int64"


def _choose_vec_tile(extent: int, lanes: int) -> tuple[int, bool]:
    """Tile of a vectorised axis: (size, divides extent), preferring full use of the vector registers.

    A tile that does not divide the extent puts a predicate into the vectorised loop, which TVM scalarises:
    callers do not vectorise then (``divides extent`` False).

    A tile longer than one vector is whole vectors: LLVM compiles a ``<28 x float>`` (or 20, 56 lanes) into
    code 25-30x slower than two whole vectors (measured alone, 2-core AVX-512, NCHW 1x1 convolutions vectorised
    along a 28-wide row: 78 -> 78 channels 1193 -> 42 us, 100 -> 100 at 20 px 987 -> 38 us; RandWire's ragged
    channel counts put 25 such kernels in its model). A tile within one vector (14 of 16 lanes) is fine.
    """
    best, best_score = 1, (-1.0, 0)
    for d in _divisors(extent):
        if d > _MAX_VEC_REGS * lanes or (d > lanes and d % lanes):
            continue
        regs = math.ceil(d / lanes)
        score = (d / (regs * lanes), d)
        if score > best_score:
            best, best_score = d, score
    if best_score[0] >= 0.5 or extent <= lanes:
        return best, True
    return min(2 * lanes, extent), False


def _choose_row_tile(extent: int, max_rows: int, regs_per_row: int) -> tuple[int, bool]:
    """Rows of the register tile: (rows, divides extent).

    Throughput model: an FMA has ~4 cycles latency and two issue ports, so about 8 independent accumulator
    registers keep the FMA units busy; rows that do not divide the extent waste the padded part and pay for a
    predicate (on an unrolled, not vectorised, loop: cheap).
    """
    max_rows = max(1, min(max_rows, extent))
    best, best_score = 1, -1.0
    for t in range(1, max_rows + 1):
        tiles = math.ceil(extent / t)
        exact = tiles * t == extent
        score = min(1.0, t * regs_per_row / 8) * extent / (tiles * t) * (1.0 if exact else 0.95)
        if score > best_score + 1e-9 or (abs(score - best_score) <= 1e-9 and exact):
            best, best_score = t, score
    return best, extent % best == 0


def _min_parallel_macs(cfg: _Cfg) -> int:
    """Multiply-adds from which a compute-bound kernel gets a parallel loop (``_MIN_PARALLEL_MACS_PER_THREAD``)."""
    return _MIN_PARALLEL_MACS_PER_THREAD * max(cfg.threads, 1)


def _parallel_outer(sch: s_tir.Schedule, loops: list, work: int, cfg: _Cfg, min_work: int) -> None:
    """Fuse a prefix of ``loops`` (perfectly nested, outermost first) to enough iterations, make it parallel."""
    if cfg.threads <= 1 or work < min_work or not loops:
        return
    want = 4 * cfg.threads
    prefix, total, dynamic = [], 1, False
    for loop in loops:
        ext = _extent(sch, loop)
        prefix.append(loop)
        if ext is None:
            dynamic = True  # e.g. a symbolic batch: fuse it, count it as 1
        else:
            total *= ext
        if total >= want:
            break
    while len(prefix) > 1 and _extent(sch, prefix[0]) == 1:  # leading unit loops add nothing
        prefix = prefix[1:]
    if not prefix or (total < 2 and not dynamic):
        return
    fused = sch.fuse(*prefix) if len(prefix) > 1 else prefix[0]
    sch.parallel(fused)


def _schedule_spatial(sch: s_tir.Schedule, block, cfg: _Cfg, min_parallel: int | None = None) -> None:
    """An injective block at the root (pad, add, concat, relu, weight repack, ...): memory bound.

    Vectorise the innermost loop with an exact tile (a predicated tile would be scalarised; without one, LLVM's
    loop vectoriser handles the loop, remainder included), threads only for outputs of ``min_parallel`` elements
    or more (default :data:`_MIN_PARALLEL_ELEMS`).
    """
    if min_parallel is None:
        min_parallel = _MIN_PARALLEL_ELEMS
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = [_extent(sch, lp) for lp in loops]
    k = _contiguous_suffix(sch, block, loops) if _FUSE_CONTIGUOUS_ROWS else 0
    if k >= 2 and extents[-1] is not None and extents[-1] % cfg.lanes:
        # the innermost rows are short and ragged (NASNet-A-mobile's relu over 132 x 14 x 14: rows of 14), but the
        # trailing loops walk every buffer contiguously: one loop over them has whole vectors
        loops = loops[:-k] + [sch.fuse(*loops[-k:])]
        extents = [_extent(sch, lp) for lp in loops]
    total = math.prod(e or 1 for e in extents)
    outer, vec = list(loops[:-1]), None
    if extents[-1] is not None:
        tile, exact = _choose_vec_tile(extents[-1], cfg.lanes)
        # whole vectors only: odd vector lengths (e.g. 7 of 8 lanes) measured slower than LLVM's own
        # vectorisation with a scalar remainder
        if exact and tile % cfg.lanes == 0:
            if tile < extents[-1]:
                lo, vec = sch.split(loops[-1], factors=[None, tile])
                outer.append(lo)
            else:
                vec = loops[-1]
        else:
            outer.append(loops[-1])
    else:
        outer.append(loops[-1])
    _parallel_outer(sch, outer, total, cfg, min_parallel)
    if vec is not None:
        sch.vectorize(vec)


def _contiguous_suffix(sch: s_tir.Schedule, block, loops: list) -> int:
    """How many of the innermost ``loops`` (each bound to one spatial iterator of ``block``) every buffer the block
    reads or writes walks contiguously: its last dimensions indexed by exactly those iterators, in order, over
    its whole extent of them, or (a broadcast operand, a bias) at one point of extent 1. Fusing that many loops
    into one keeps every access a contiguous run (TVM simplifies the fused index back to a linear one)."""
    stmt = sch.get(block)
    bindings = _bindings(sch, block)
    by_loop = []
    for lp in loops:
        lv = sch.get(lp).loop_var
        match = [iv for iv, value in zip(stmt.iter_vars, bindings) if value.same_as(lv)]
        by_loop.append(match[0] if len(match) == 1 else None)
    regions = list(stmt.reads) + list(stmt.writes)
    for k in range(1, len(loops) + 1):
        ivs = by_loop[-k:]
        if any(iv is None or _iter_kind(iv) != "S" for iv in ivs) or \
                not all(_walks_contiguously(region, ivs) for region in regions):
            return k - 1
    return len(loops)


def _walks_contiguously(region, ivs) -> bool:
    """Whether ``region``'s last ``len(ivs)`` dimensions are indexed by exactly ``ivs`` in order over the buffer's
    whole extent in each (contiguous), or are all single points of extent-1 dimensions that no iterator of
    ``ivs`` indexes (a broadcast)."""
    if len(region.region) < len(ivs):
        return False
    dims = list(region.region)[-len(ivs):]
    shape = list(_buf(region).shape)[-len(ivs):]
    if all(_int(r.extent) == 1 and _int(n) == 1 and not any(_uses(r.min, iv.var) for iv in ivs)
           for r, n in zip(dims, shape)):
        return True
    return all(_int(r.extent) == 1 and r.min.same_as(iv.var) and _int(n) == _int(iv.dom.extent)
               and _int(iv.dom.min) == 0 for r, n, iv in zip(dims, shape, ivs))


def _block_infos(sch: s_tir.Schedule):
    """(block, stmt, iterator kinds) of the blocks under the root; _Skip for anything opaque.

    A block without iterators under loops (or with nested blocks) hides its dependences from TVM's checks,
    which would then let a loop over it be parallelised or vectorised: such functions are not touched.
    """
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    infos = []
    for b in blocks:
        stmt = sch.get(b)
        kinds = "".join(_iter_kind(iv) for iv in stmt.iter_vars)
        if "O" in kinds or (sch.get_loops(b) and not kinds) or sch.get_child_blocks(b):
            raise _Skip(f"opaque block {stmt.name_hint}")
        infos.append((b, stmt, kinds))
    return infos


def _output_buffers(func: tirx.PrimFunc) -> list:
    """Buffers visible outside the function (in this TVM the parameters are the buffers themselves)."""
    return list(func.params) + [func.buffer_map[p] for p in getattr(func, "buffer_map", {}) or {}]


def _is_output_block(sch, block, func_outputs) -> bool:
    return any(_buf(w).same_as(o) for w in sch.get(block).writes for o in func_outputs)


def _bindings(sch, block):
    return list(tvm.get_global_func("s_tir.schedule.GetSBlockRealize")(sch, block).iter_values)


# ----------------------------------------------------------------------------------------------- analysis
def _prepare(sch: s_tir.Schedule):
    """Single-reduction functions: (reduction block, prologue blocks, epilogue block or None).

    The epilogue chain (bias add, batch-norm scale/shift, relu, ...) is inlined into its last block.
    """
    outputs = _output_buffers(sch.mod["main"])
    infos = _block_infos(sch)
    reds = [b for b, _, kinds in infos if "R" in kinds]
    if len(reds) != 1:
        raise _Skip(f"{len(reds)} reduction blocks")
    red = reds[0]
    if len(sch.get(red).writes) != 1:
        raise _Skip("the reduction writes several buffers")
    idx = [s.name_hint for _, s, _ in infos].index(sch.get(red).name_hint)
    prologue = [b for b, _, _ in infos[:idx] if not _inline_identity_copy(sch, b)]
    after = [b for b, _, _ in infos[idx + 1:]]
    for b in after[:-1]:
        if _is_output_block(sch, b, outputs):
            raise _Skip("several outputs")
        sch.compute_inline(b)
    epilogue = after[-1] if after else None
    if epilogue is not None:
        consumers = sch.get_consumers(red)
        if len(consumers) != 1 or not sch.get(consumers[0]).same_as(sch.get(epilogue)):
            raise _Skip("the epilogue is not a single chain")
    elif not _is_output_block(sch, red, outputs):
        raise _Skip("the reduction is not the output")
    return red, prologue, epilogue


def _inline_identity_copy(sch: s_tir.Schedule, block) -> bool:
    """Inline a prologue block that reads one buffer at the very point it writes (TVM's ``pad_temp`` of a
    convolution without padding: a plain copy): as a stage of its own it reads and writes the whole input once
    more per call. A padded ``pad_temp`` reads at shifted points and is kept (inlined, its bounds test would sit
    in the convolution's inner loop). True when inlined."""
    from tvm_ffi import structural_equal

    stmt = sch.get(block)
    if len(stmt.reads) != 1 or len(stmt.writes) != 1:
        return False
    rd, wr = stmt.reads[0], stmt.writes[0]
    if not (_is_point(rd) and _is_point(wr)) or len(rd.region) != len(wr.region):
        return False
    if [_int(d) for d in _buf(rd).shape] != [_int(d) for d in _buf(wr).shape]:
        return False
    if any(not structural_equal(a.min, b.min) for a, b in zip(rd.region, wr.region)):
        return False
    try:
        sch.compute_inline(block)
        return True
    except Exception as err:  # noqa: BLE001 - keep it as a stage
        log.debug("identity copy %s not inlined: %s", stmt.name_hint, err)
        return False


def _spatial_and_reduction_loops(sch, block):
    """Loops of ``block`` as (spatial [(loop, itervar)], reduction [(loop, itervar)]); 1:1 loop/iter binding."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    if len(loops) != len(stmt.iter_vars):
        raise _Skip("loops do not map 1:1 to block iterators")
    sp, rd = [], []
    for lp, iv, bind in zip(loops, stmt.iter_vars, _bindings(sch, block)):
        if not (isinstance(bind, tirx.Var) and bind.same_as(sch.get(lp).loop_var)):
            raise _Skip("non-trivial block binding")
        if _int(iv.dom.min) != 0:
            raise _Skip("offset iterator")
        if _int(iv.dom.extent) is None and _iter_kind(iv) != "S":
            raise _Skip("dynamic reduction extent")  # a dynamic spatial extent (the batch) is fine
        (sp if _iter_kind(iv) == "S" else rd).append((lp, iv))
    return sp, rd


def _vector_axis(stmt, spatial):
    """The spatial iterator that indexes the innermost non-unit dimension of the output (or None)."""
    for r in reversed(stmt.writes[0].region):
        if _int(r.extent) != 1:
            return None
        for _, iv in spatial:
            if isinstance(r.min, tirx.Var) and r.min.same_as(iv.var):
                if _int(iv.dom.extent) == 1:
                    break  # unit dimension: look further out
                return iv
        else:
            if _int(r.min) is not None:
                continue  # constant index (unit dimension)
            return None
    return None


def _reuse_axes(spatial, reads):
    """Spatial iterators (static extent > 1) that some of ``reads`` does not depend on."""
    out = []
    for pos, (_, iv) in enumerate(spatial):
        ext = _int(iv.dom.extent)
        if ext is not None and ext > 1 and any(not _region_uses(rd, iv.var) for rd in reads):
            out.append((pos, iv))
    return out


@dataclass
class _VecChoice:
    """How to vectorise along one spatial axis of a reduction block."""

    iv: object  # the block iterator
    score: float
    tile: int  # vector tile (elements)
    deps: list  # indices of the reads that depend on the axis
    repack: list  # indices of the reads (weights) to repack with the axis innermost
    transpose_acc: bool  # the accumulator tile needs the axis moved innermost


def _analyse_vec_axis(stmt, iv, v_out, lanes: int, work: int, params) -> _VecChoice | None:
    ext = _int(iv.dom.extent)
    deps, repack = [], []
    for idx, rd in enumerate(stmt.reads):
        c = _coeff(_flat_offset(rd), iv.var)
        if c is None:
            return None
        if c == 0:
            continue
        deps.append(idx)
        if c == 1:
            continue
        dims = _dims_using(rd, iv.var)
        buf = _buf(rd)
        size = math.prod(_int(d) or 0 for d in buf.shape)
        if (len(dims) == 1 and isinstance(rd.region[dims[0]].min, tirx.Var)
                and rd.region[dims[0]].min.same_as(iv.var) and any(buf.same_as(p) for p in params)
                and 0 < size * _MIN_REPACK_REUSE <= work):
            repack.append(idx)  # e.g. conv weights [F, C, KH, KW] -> [F/16, C, KH, KW, 16]
        else:
            return None  # strided (a strided conv's input, pooling): gathers, slower than other choices
    if not deps:
        return None
    if iv.same_as(v_out):
        tile, exact = _choose_vec_tile(ext, lanes)
        if not exact:
            return None
    else:  # the accumulator gets transposed: whole vectors only
        tile = next((t for t in (2 * lanes, lanes) if ext % t == 0), None)
        if tile is None:
            return None
    score = tile / (math.ceil(tile / lanes) * lanes)
    if iv.same_as(v_out):
        # measured on conv2d: vectorising output channels over repacked weights (2 aligned vector loads and
        # u_t broadcasts per u_t x 2 FMAs) beats vectorising the output width (unaligned input loads, one
        # broadcast per FMA row) on every layer tried: 80 vs 70 GFLOP/s at 64x56x56, 83 vs 44 at 192x35x35
        score *= 0.9
    return _VecChoice(iv, score, tile, deps, repack, not iv.same_as(v_out))


def _repack_map(dim: int, tile: int):
    """Index map [.., d, ..] -> [d // tile, .., .., d % tile] (e.g. OIHW -> O/16, I, H, W, 16)."""

    def fmap(*idx):
        rest = [x for d, x in enumerate(idx) if d != dim]
        return [idx[dim] // tile, *rest, idx[dim] % tile]

    return fmap


def _innermost_map(dim: int):
    """Index map moving dimension ``dim`` innermost (e.g. NCHW -> NHWC for an accumulator tile)."""

    def fmap(*idx):
        return [x for d, x in enumerate(idx) if d != dim] + [idx[dim]]

    return fmap


def _epilogue_and_prologue(sch, epilogue, prologue, cfg, *, inline_into_write_back: bool,
                           beside_parallel: bool = False) -> None:
    """Schedule what the main nest leaves as stages of their own: the epilogue (inlined into the write-back where
    it can be) and the prologue (padding, repacks).

    ``beside_parallel``: the main nest runs on the thread pool. Its threads are awake for that nest anyway, so a
    stage beside it pays one more fork-join (~2 us), not a wake-up, and threads pay from far smaller sizes than
    for a kernel of its own: a convolution's padding copy (256-860 KB in ResNet-50) ran single-threaded before
    its parallel nest and took 2-6 % of the kernel (measured alone, weights cold: 3x3 64ch 56x56 852 -> 807 us,
    256ch 14x14 867 -> 811 us).
    """
    min_parallel = _MIN_PARALLEL_BESIDE if beside_parallel else _MIN_PARALLEL_ELEMS
    if epilogue is not None:
        if inline_into_write_back:
            try:
                sch.reverse_compute_inline(epilogue)
                epilogue = None
            except Exception as err:  # keep it as its own stage
                log.debug("reverse_compute_inline of the epilogue failed: %s", err)
        if epilogue is not None:
            _schedule_spatial(sch, epilogue, cfg, min_parallel)
    for b in prologue:
        _schedule_spatial(sch, b, cfg, min_parallel)


# ----------------------------------------------------------------------------------------------- plans
def _plan_light_reduction(sch: s_tir.Schedule, cfg: _Cfg) -> None:
    red, prologue, epilogue = _prepare(sch)
    stmt = sch.get(red)
    spatial, reduction = _spatial_and_reduction_loops(sch, red)
    red_ext = _work(iv for _, iv in reduction)
    if not reduction or red_ext > _LIGHT_REDUCTION:
        raise _Skip("not a light reduction")
    if not all(_is_point(rd) for rd in stmt.reads):
        raise _Skip("reads are not point accesses")
    # memory bound if the biggest operand (pooling / depthwise input) is not reused across any output axis;
    # a conv's input is reused across output channels: compute bound, left to spatial_vector
    biggest = max(stmt.reads, key=lambda rd: math.prod(_int(d) or 1 for d in _buf(rd).shape))
    if _reuse_axes(spatial, [biggest]):
        raise _Skip("the biggest operand is reused across an output axis")
    tile = _lane_contiguous_tile(stmt, spatial, cfg)
    if tile:
        _light_reduction_over_lanes(sch, red, spatial, reduction, prologue, epilogue, tile, cfg)
        return
    sp_loops = [lp for lp, _ in spatial]
    sch.reorder(*sp_loops, *[lp for lp, _ in reduction])
    for lp, _ in reduction:
        sch.unroll(lp)
    reads = _work(iv for _, iv in spatial) * red_ext
    _parallel_outer(sch, sp_loops, reads, cfg, _MIN_PARALLEL_LIGHT_READS)
    _epilogue_and_prologue(sch, epilogue, prologue, cfg, inline_into_write_back=False,
                           beside_parallel=cfg.threads > 1 and reads >= _MIN_PARALLEL_LIGHT_READS)


def _lane_contiguous_tile(stmt, spatial, cfg: _Cfg) -> int | None:
    """The vector tile of the innermost output axis when every read of the reduction is contiguous along it
    (or does not depend on it) and it holds whole vectors: the channel lanes of a pooling in ``NCHW[c]c``, or
    the width of a stride-1 pooling. None otherwise (a stride-2 NCHW pooling would gather)."""
    _, last = spatial[-1]
    ext = _int(last.dom.extent)
    if not ext or ext % cfg.lanes:
        return None
    for rd in stmt.reads:
        if _coeff(_flat_offset(rd), last.var) not in (0, 1):
            return None
    tile, exact = _choose_vec_tile(ext, cfg.lanes)
    return tile if exact and tile % cfg.lanes == 0 else None


def _light_reduction_over_lanes(sch, red, spatial, reduction, prologue, epilogue, tile: int, cfg: _Cfg) -> None:
    """Pooling over contiguous lanes: outer output loops (parallel), the window (unrolled), one vector tile of
    the innermost axis accumulated in registers and written back once with the epilogue (avg pooling's
    division) inlined. The padding stage is inlined too (its bounds test does not depend on the lane, so it is
    a branch per window element, not per lane), saving a pass over the input."""
    kept = []
    for b in prologue:
        try:
            sch.compute_inline(b)
        except Exception as err:  # noqa: BLE001 - keep it as its own (parallel, vectorised) stage
            log.debug("pooling prologue %s not inlined: %s", sch.get(b).name_hint, err)
            kept.append(b)
    last_lp, last_iv = spatial[-1]
    outer = [lp for lp, _ in spatial[:-1]]
    if tile < _int(last_iv.dom.extent):
        lo, vi = sch.split(last_lp, factors=[None, tile])
        outer.append(lo)
    else:
        vi = last_lp
    red_loops = [lp for lp, _ in reduction]
    sch.reorder(*outer, *red_loops, vi)
    write_back = sch.cache_write(red, 0, _ACC_SCOPE)
    sch.reverse_compute_at(write_back, outer[-1], preserve_unit_loops=True)
    _epilogue_and_prologue(sch, epilogue, kept, cfg, inline_into_write_back=True)
    for lp in red_loops:
        sch.unroll(lp)
    sch.vectorize(vi)
    wb_loops = sch.get_loops(write_back)[len(outer):]
    if wb_loops:
        sch.vectorize(wb_loops[-1])
    # memory bound: threads by the elements read (outputs x window), not by the outputs alone
    _parallel_outer(sch, outer, _work(iv for _, iv in spatial + reduction), cfg, _MIN_PARALLEL_ELEMS)
    init = sch.decompose_reduction(red, red_loops[0])
    init_last = sch.get_loops(init)[-1]
    if sch.get(init_last).kind != tirx.ForKind.VECTORIZED and _extent(sch, init_last) > 1:
        sch.vectorize(init_last)


def _nbytes(region) -> int:
    """Bytes of the buffer that ``region`` reads (its whole buffer, not the region)."""
    buf = _buf(region)
    return math.prod(_int(d) or 1 for d in buf.shape) * (tvm.DataType(buf.dtype).bits // 8)


def _order_outer_for_reuse(sch, stmt, spatial, outer: list, v, vc) -> list:
    """Outer tile loops reordered so that the biggest operand is read from cache, not memory.

    Spatial order puts the vector axis's tile loop (output channels) outermost, so a convolution sweeps its
    whole input once per block of output channels. When the activation is bigger than the (repacked) weights
    (early layers: 1x1 convs at 56x56 read 3 MB of input against 64-256 KB of weights), that re-reads the input
    from L3/DRAM for every channel block; iterating the channel blocks innermost instead keeps the input tile in
    L1 and the weights in L2. Where the weights are bigger (late layers), the spatial order already reuses them.
    Measured (2-core Xeon, AVX-512, one process, interleaved): ResNet-50 40.6 -> 36.9 ms; GoogLeNet, SqueezeNet
    and Inception-v3 unchanged. ``TVM_INTEROP_OUTER_ORDER=spatial`` restores the old order (for A/B runs).
    """
    if os.environ.get("TVM_INTEROP_OUTER_ORDER", "reuse") == "spatial":
        return outer
    pos_v = next((i for i, (_, iv) in enumerate(spatial) if iv.same_as(v)), None)
    if pos_v is None:
        return outer

    indep = [rd for rd in stmt.reads if not _region_uses(rd, v.var)]  # the activation, for a conv over channels
    dep = [stmt.reads[i] for i in vc.deps]                            # the weights
    if not indep or not dep:
        return outer
    big = max(map(_nbytes, indep))
    if big <= max(map(_nbytes, dep)) or big <= _REORDER_MIN_INPUT_BYTES:
        return outer
    return [lp for i, lp in enumerate(outer) if i != pos_v] + [outer[pos_v]]


def _plan_spatial_vector(sch: s_tir.Schedule, cfg: _Cfg) -> None:
    red, prologue, epilogue = _prepare(sch)
    crops = _epilogue_crops(sch, red, epilogue)
    stmt = sch.get(red)
    spatial, reduction = _spatial_and_reduction_loops(sch, red)
    if not all(_is_point(rd) for rd in stmt.reads):
        raise _Skip("reads are not point accesses")  # e.g. one buffer read at two places
    work = _work(iv for _, iv in spatial + reduction)
    v_out = _vector_axis(stmt, spatial)
    params = sch.mod["main"].params
    choices = [
        ch for _, iv in spatial if (_int(iv.dom.extent) or 0) > 1
        for ch in [_analyse_vec_axis(stmt, iv, v_out, cfg.lanes, work, params)] if ch is not None
    ]
    if not choices:
        raise _Skip("no vectorisable axis")
    vc = max(choices, key=lambda c: c.score)
    v = vc.iv
    # u: an axis some v-dependent read does not depend on (one vector load then feeds u_t FMAs); prefer a big
    # enough extent, then the innermost
    reuse = _reuse_axes([sp for sp in spatial if not sp[1].same_as(v)], [stmt.reads[i] for i in vc.deps])
    u = max(reuse, key=lambda pi: (min(_int(pi[1].dom.extent), 64), pi[0]))[1] if reuse else None
    regs = math.ceil(vc.tile / cfg.lanes)
    # a reduction over one axis (1x1 convolution, matmul) leaves registers free for a bigger tile; a 3x3 one
    # needs them for its addressing (measured: 26 accumulators spill there)
    one_axis = sum((_int(iv.dom.extent) or 2) > 1 for _, iv in reduction) <= 1
    acc = max(cfg.acc_regs, cfg.acc_regs_1x1) if one_axis else cfg.acc_regs
    ut = _choose_row_tile(_int(u.dom.extent), acc // regs, regs)[0] if u is not None else 1
    if u is None and not vc.transpose_acc:
        vc.repack.extend(_streamed_panels(stmt, v, params, set(vc.repack)))

    # repack the weights that are strided along v so that v is their innermost dimension
    repack_blocks = []
    for idx in vc.repack:
        rd = sch.get(red).reads[idx]
        (dim,) = _dims_using(rd, v.var)
        copy = sch.cache_read(red, idx, "global")
        # a constant weight is repacked once when the model is built instead (passes.kernels.prepack)
        sch.annotate(copy, "meta_schedule.layout_rewrite_preproc", 1)
        imap = tirx.IndexMap.from_func(_repack_map(dim, vc.tile), ndim=len(rd.region),
                                       index_dtype=_index_dtype(rd))
        sch.transform_layout(red, ("read", idx), imap)
        # iterate the copy in the order of the repacked layout: contiguous (vectorised) writes
        loops = sch.get_loops(copy)
        if _REPACK_IN_DEST_ORDER and len(loops) == len(rd.region):
            o, i = sch.split(loops[dim], factors=[None, vc.tile])
            sch.reorder(o, *[lp for d, lp in enumerate(loops) if d != dim], i)
        repack_blocks.append(copy)

    outer, ui, vi = [], None, None
    for lp, iv in spatial:
        if iv.same_as(v):
            vo, vi = sch.split(lp, factors=[None, vc.tile])
            outer.append(vo)
        elif u is not None and iv.same_as(u) and ut > 1:
            uo, ui = sch.split(lp, factors=[None, ut])
            outer.append(uo)
        else:
            outer.append(lp)
    red_loops = [lp for lp, _ in reduction]
    outer = _order_outer_for_reuse(sch, stmt, spatial, outer, v, vc)
    sch.reorder(*outer, *red_loops, *([ui] if ui is not None else []), vi)

    # accumulate in a register tile (_ACC_SCOPE), written back (with the epilogue) after the reduction
    write_back = sch.cache_write(red, 0, _ACC_SCOPE)
    if vc.transpose_acc:
        wr = sch.get(red).writes[0]
        (dim,) = _dims_using(wr, v.var)
        imap = tirx.IndexMap.from_func(_innermost_map(dim), ndim=len(wr.region), index_dtype=_index_dtype(wr))
        sch.transform_layout(red, ("write", 0), imap)
    sch.reverse_compute_at(write_back, outer[-1], preserve_unit_loops=True)
    _epilogue_and_prologue(sch, epilogue, prologue + repack_blocks, cfg, inline_into_write_back=not crops)
    # annotate before decompose_reduction: the update block alone is neither complete nor a reduction block
    if ui is not None:
        sch.unroll(ui)
    sch.vectorize(vi)
    wb_loops = sch.get_loops(write_back)[len(outer):]
    if wb_loops and not vc.transpose_acc and _extent(sch, wb_loops[-1]) > 1:
        sch.vectorize(wb_loops[-1])
    # a kernel that streams a big operand (batch-1 dense: 4 MB of weights for 1 M multiply-adds) is bound by
    # memory bandwidth, which a second core adds to: threads by bytes as well as by multiply-adds
    streamed = max(_nbytes(rd) for rd in stmt.reads)
    _parallel_outer(sch, outer, work, cfg, 0 if streamed >= _MIN_PARALLEL_BYTES else _min_parallel_macs(cfg))
    if red_loops:
        init = sch.decompose_reduction(red, red_loops[0])
        init_last = sch.get_loops(init)[-1]
        if sch.get(init_last).kind != tirx.ForKind.VECTORIZED and _extent(sch, init_last) > 1:
            sch.vectorize(init_last)


def _streamed_panels(stmt, v, params, taken: set) -> list[int]:
    """Reads to repack into column panels for a batch-1 dense over a ``[K, N]`` weight (GEMV): nothing is
    reused, the weight (megabytes) is streamed once per call, and tile by tile along N it would be walked with
    a stride of one row (4 KB for 1000 classes) per K step, which the hardware prefetchers do not follow: out of
    L2 every step waits on a miss (GoogLeNet's 1024 x 1000 classifier: 145 us with its weight in L2, 425 us in
    the model, 100 us in ONNX Runtime). Repacked to ``[N / tile, K, tile]`` (done once per constant weight at
    build time, ``passes.kernels.prepack``) each tile reads one contiguous panel."""
    out = []
    for idx, rd in enumerate(stmt.reads):
        if idx in taken or _nbytes(rd) < _MIN_PARALLEL_BYTES or len(rd.region) < 2:
            continue
        buf = _buf(rd)
        if not any(buf.same_as(p) for p in params):
            continue
        dims = _dims_using(rd, v.var)
        if dims == [len(rd.region) - 1] and isinstance(rd.region[-1].min, tirx.Var) \
                and rd.region[-1].min.same_as(v.var):
            out.append(idx)
    return out


_BUSY_ACCUMULATORS = 14  # register-tile size from which a larger tile scores no better (see _nchwc_tile)


def _nchwc_tile(co_ext: int, ow_ext: int, acc_regs: int) -> tuple[int, int]:
    """Register tile ``(co_t, ow_t)``: ``co_t * ow_t`` accumulator vectors, at most ``acc_regs``.

    Each reduction step loads ``co_t`` weight vectors and broadcasts ``ow_t`` inputs for ``co_t * ow_t`` FMAs;
    the score is the tile's size (FMA units busy, operands reused) discounted by the columns a ragged width
    tile computes for nothing and preferring exact tiles (an overhanging tile predicates its multiply-adds, which
    LLVM compiles unevenly; convolutions are therefore computed over a width with a divisor in the tile range,
    ``passes.kernels.nchwc.tileable_width``, wherever that costs no extra copy).

    The size term saturates at :data:`_BUSY_ACCUMULATORS`: with 8 (two FMA ports x 4 cycles of latency, in
    theory enough) a 4x3 tile (12 accumulators, 4 weight vectors per step) beat 2x7 / 2x9 on loads per FMA, and
    measured slower every time (AVX-512, timed alone, weights cold, interleaved medians: 147 columns 2675 ->
    2418 us, 27 columns 185 -> 161 and 697 -> 599 us, 3x4 -> 2x7 at 28 columns 283 -> 267 us).
    """
    best, best_score = (1, 1), -1.0
    for co_t in (d for d in range(1, min(co_ext, 4) + 1) if co_ext % d == 0):
        ow_t, exact = _choose_row_tile(ow_ext, max(1, acc_regs // co_t), co_t)
        waste = ow_ext / (math.ceil(ow_ext / ow_t) * ow_t)
        # loads per FMA: (co_t + ow_t) / (co_t * ow_t); fewer is better, more accumulators hide FMA latency
        score = (min(1.0, co_t * ow_t / _BUSY_ACCUMULATORS) * waste * (1.0 if exact else 0.95)
                 / ((co_t + ow_t) / (co_t * ow_t)))
        if score > best_score:
            best, best_score = (co_t, ow_t), score
    return best


def _plan_nchwc_conv(sch: s_tir.Schedule, cfg: _Cfg) -> None:
    """The reduction of ``passes.kernels.nchwc.conv2d_nchwc`` (recognised by its block annotation): a register
    tile of ``co_t`` output-channel blocks x ``ow_t`` output columns, one vector of ``c`` channels each,
    accumulated over (input-channel block, kh, kw, channel in block) and written back, with the epilogue, as
    whole vectors (no transposition: the channels are innermost in the output too)."""
    red, prologue, epilogue = _prepare(sch)
    stmt = sch.get(red)
    if NCHWC_CONV not in stmt.annotations:
        raise _Skip("not a channel-blocked convolution")
    spatial, reduction = _spatial_and_reduction_loops(sch, red)
    if len(spatial) != 5 or len(reduction) not in (3, 4):   # 3: the stem's NCHW input (conv2d_nchw_to_nchwc)
        raise _Skip("unexpected loop nest")
    (l_n, _), (l_co, iv_co), (l_oh, _), (l_ow, iv_ow), (l_ci, iv_ci) = spatial
    lanes_blk = _int(iv_ci.dom.extent)
    if not lanes_blk or lanes_blk % cfg.lanes:
        raise _Skip(f"channel block {lanes_blk} is not a multiple of the vector width {cfg.lanes}")
    one_by_one = all((_int(iv.dom.extent) or 2) == 1 for _, iv in reduction[1:3])
    acc = max(cfg.acc_regs, cfg.acc_regs_1x1) if one_by_one else cfg.acc_regs
    regs_per_vec = lanes_blk // cfg.lanes
    co_t, ow_t = _nchwc_tile(_int(iv_co.dom.extent), _int(iv_ow.dom.extent), max(1, acc // regs_per_vec))

    co_o, co_i = sch.split(l_co, factors=[None, co_t])
    ow_o, ow_i = sch.split(l_ow, factors=[None, ow_t])
    red_loops = [lp for lp, _ in reduction]
    # input bigger than the weights and than L2 (early layers): channel blocks innermost among the tile loops, so
    # the input tile stays in cache across them (see cpu_schedule._order_outer_for_reuse)
    data_rd, w_rd = stmt.reads[0], stmt.reads[1]
    if _nbytes(data_rd) > max(_nbytes(w_rd), _REORDER_MIN_INPUT_BYTES):
        outer = [l_n, l_oh, ow_o, co_o]
    else:
        outer = [l_n, co_o, l_oh, ow_o]
    sch.reorder(*outer, *red_loops, co_i, ow_i, l_ci)

    work = _work(iv for _, iv in spatial + reduction)
    beside_parallel = cfg.threads > 1 and work >= _min_parallel_macs(cfg)
    if _crops_its_reduction(sch, red, epilogue):
        # computed over more columns than the output has (passes.kernels.nchwc.tileable_width): the reduction
        # accumulates in a per-tile register buffer (_ACC_SCOPE), and the epilogue, which crops, writes the tile's
        # columns that exist (its bounds test sits in the write-back, not among the multiply-adds)
        sch.set_scope(red, 0, _ACC_SCOPE)
        write_back = epilogue
        sch.reverse_compute_at(write_back, outer[-1], preserve_unit_loops=True)
        _epilogue_and_prologue(sch, None, prologue, cfg, inline_into_write_back=False,
                               beside_parallel=beside_parallel)
    else:
        crops = _epilogue_crops(sch, red, epilogue)     # along another axis: not inlined (see there)
        write_back = sch.cache_write(red, 0, _ACC_SCOPE)
        sch.reverse_compute_at(write_back, outer[-1], preserve_unit_loops=True)
        _epilogue_and_prologue(sch, epilogue, prologue, cfg, inline_into_write_back=not crops,
                               beside_parallel=beside_parallel)
    sch.unroll(co_i)
    sch.unroll(ow_i)
    sch.vectorize(l_ci)
    wb_loops = sch.get_loops(write_back)[len(outer):]
    if wb_loops:
        sch.vectorize(wb_loops[-1])
    _parallel_outer(sch, outer, work, cfg, _min_parallel_macs(cfg))
    init = sch.decompose_reduction(red, red_loops[0])
    init_last = sch.get_loops(init)[-1]
    if sch.get(init_last).kind != tirx.ForKind.VECTORIZED and _extent(sch, init_last) > 1:
        sch.vectorize(init_last)


def _epilogue_crops(sch: s_tir.Schedule, red, epilogue) -> bool:
    """The epilogue writes fewer elements than the reduction computes (a ``strided_slice`` of a convolution
    computed over padded channels, say), along any axis.

    Why it matters: such an epilogue must not be inlined into a write-back computed at a ragged tile.
    ``reverse_compute_inline`` gives the write-back the epilogue's bounds test in place of its own, and the
    tile's overhang is then written: RandWire (width 0.5, 112 px) on AVX2 has a 3x3 convolution to 40 channels
    cropped to 39, tiled 8 channels x 10 of 28 columns; its write-back kept ``channel < 39`` and lost
    ``column < 28``, wrote two columns past each row and the output was off by up to 55 (the tile differs on
    AVX-512, where the same model was right)."""
    if epilogue is None:
        return False
    computed = _buf(sch.get(red).writes[0]).shape
    written = _buf(sch.get(epilogue).writes[0]).shape
    n_computed, n_written = _product(computed), _product(written)
    return n_computed is not None and n_written is not None and n_written < n_computed


def _product(shape) -> int | None:
    n = 1
    for d in shape:
        d = _int(d)
        if d is None:
            return None
        n *= d
    return n


def _crops_its_reduction(sch: s_tir.Schedule, red, epilogue) -> bool:
    """The epilogue writes fewer output columns (axis 3) than the reduction computes."""
    if epilogue is None:
        return False
    computed = _int(_buf(sch.get(red).writes[0]).shape[3])
    written = _int(_buf(sch.get(epilogue).writes[0]).shape[3])
    return computed is not None and written is not None and written < computed


def _plan_reduction_vector(sch: s_tir.Schedule, cfg: _Cfg) -> None:
    red, prologue, epilogue = _prepare(sch)
    stmt = sch.get(red)
    spatial, reduction = _spatial_and_reduction_loops(sch, red)
    lanes = cfg.lanes
    big = [(lp, iv) for lp, iv in reduction if (_int(iv.dom.extent) or 0) > 1]
    if not big:
        raise _Skip("no reduction")
    k_loop, k = big[-1]  # the innermost non-unit reduction (input channels of a 1x1 conv, K of a matmul)
    k_ext = _int(k.dom.extent)
    if k_ext % lanes != 0 or k_ext < 2 * lanes:
        raise _Skip("reduction extent is not a multiple of the vector width")
    if not all(_is_point(rd) for rd in stmt.reads):
        raise _Skip("reads are not point accesses")
    k_reads = [rd for rd in stmt.reads if _coeff(_flat_offset(rd), k.var) != 0]
    if not k_reads or any(_coeff(_flat_offset(rd), k.var) != 1 for rd in k_reads):
        raise _Skip("the reduction axis is not contiguous in the inputs")
    work = _work(iv for _, iv in spatial + reduction)
    n_sp = len(spatial)
    # j: the axis along which a k-read is shared (the activations of a GEMV): tile it by 4, unrolled
    reuse = _reuse_axes(spatial, k_reads)
    j_pos, j_ext = max(((p, _int(iv.dom.extent)) for p, iv in reuse), key=lambda pe: pe[1], default=(None, 1))

    sch.reorder(*[lp for lp, _ in spatial], *[lp for lp, _ in reduction])
    _ko, ki = sch.split(k_loop, factors=[None, lanes])
    rf = sch.rfactor(ki, factor_axis=len(_buf(stmt.writes[0]).shape))
    # the rf block keeps the loop order: spatial..., reductions with ko, ki (now a spatial iterator of rf);
    # the ``ki`` LoopRV may name the final block's copy of the loop, so take rf's by position
    rf_loops = sch.get_loops(rf)
    sp_loops = list(rf_loops[:n_sp])
    ki_pos = n_sp + [iv.same_as(k) for _, iv in reduction].index(True) + 1
    ki = rf_loops[ki_pos]
    rest = [lp for pos, lp in enumerate(rf_loops) if pos >= n_sp and pos != ki_pos]
    ji = None
    jt = _best_divisor_at_most(j_ext, 4) if j_pos is not None else 1
    if jt > 1:
        jo, ji = sch.split(sp_loops[j_pos], factors=[None, jt])
        sp_loops[j_pos] = jo
    sch.reorder(*sp_loops, *rest, *([ji] if ji is not None else []), ki)
    # (the final block is a reduction over the lanes: the epilogue cannot be inlined into it)
    _epilogue_and_prologue(sch, epilogue, prologue, cfg, inline_into_write_back=False)
    # annotate before decompose_reduction (the update block alone is neither complete nor a reduction)
    if ji is not None:
        sch.unroll(ji)
    sch.vectorize(ki)
    _parallel_outer(sch, sp_loops, work, cfg, _min_parallel_macs(cfg))
    if rest:
        init = sch.decompose_reduction(rf, rest[0])
        init_last = sch.get_loops(init)[-1]
        if sch.get(init_last).kind != tirx.ForKind.VECTORIZED:
            sch.vectorize(init_last)
    # the final sum over the lanes stays at the root: memory bound
    fin_loops = sch.get_loops(red)
    _parallel_outer(sch, fin_loops[:n_sp], _work(iv for _, iv in spatial), cfg, _MIN_PARALLEL_ELEMS)


def _plan_simple(sch: s_tir.Schedule, cfg: _Cfg) -> None:
    red, prologue, epilogue = _prepare(sch)
    spatial, reduction = _spatial_and_reduction_loops(sch, red)
    sp_loops = [lp for lp, _ in spatial]
    if not sp_loops:
        raise _Skip("a full reduction")
    sch.reorder(*sp_loops, *[lp for lp, _ in reduction])
    if epilogue is not None:
        try:
            sch.reverse_compute_at(epilogue, sp_loops[-1], preserve_unit_loops=True)
            epilogue = None
        except Exception as err:
            log.debug("reverse_compute_at of the epilogue failed: %s", err)
    _parallel_outer(sch, sp_loops, _work(iv for _, iv in spatial + reduction), cfg, _min_parallel_macs(cfg))
    _epilogue_and_prologue(sch, epilogue, prologue, cfg, inline_into_write_back=False)


def _plan_injective(sch: s_tir.Schedule, cfg: _Cfg) -> None:
    outputs = _output_buffers(sch.mod["main"])
    infos = _block_infos(sch)
    if not infos or any(kinds.replace("S", "") for _, _, kinds in infos):
        raise _Skip("not an injective function")
    remaining = []
    for b, _, _ in infos:
        if not _is_output_block(sch, b, outputs):
            try:
                sch.compute_inline(b)
                continue
            except Exception:  # e.g. read at several places by a consumer that cannot take it: keep the stage
                pass
        remaining.append(b)
    for b in remaining:
        _iterate_in_output_order(sch, b)
        _schedule_spatial(sch, b, cfg)


def _iterate_in_output_order(sch: s_tir.Schedule, block) -> None:
    """Make a block that writes through computed indices iterate over its output instead.

    A layout transform (NCHW -> NCHW16c: ``out[n, c // 16, h, w, c % 16] = in[n, c, h, w]``) iterates over its
    input, so its stores are scattered 64 bytes apart and nothing vectorises: 229 us for SqueezeNet's 64x55x55
    in a model. Iterating over the output (when the index map is a bijection, which TVM checks) gives contiguous
    stores of whole vectors; the reads become a 16-lane gather from 16 planes, each line of which the next 15
    columns reuse. Blocks whose innermost store index is an iterator already store contiguously: left alone.
    """
    stmt = sch.get(block)
    if len(stmt.writes) != 1:
        return
    region = stmt.writes[0].region
    ivars = [iv.var for iv in stmt.iter_vars]
    if isinstance(region[-1].min, tirx.Var) or len(region) < len(ivars):
        return   # the innermost store index is an iterator: stores already contiguous (NCHWc -> NCHW: 24 us)
    try:
        sch.transform_block_layout(block, tirx.IndexMap(ivars, [r.min for r in region], None))
    except Exception as err:  # noqa: BLE001 - not a bijection (a pad, a slice): keep the input order
        log.debug("transform_block_layout of %s failed: %s", stmt.name_hint, err)


def _plan_each_block(sch: s_tir.Schedule, cfg: _Cfg) -> None:
    """Several reductions (softmax, norms, ...): each block on its own at the root."""
    infos = _block_infos(sch)
    for b, _, kinds in infos:
        if "R" in kinds:
            spatial, reduction = _spatial_and_reduction_loops(sch, b)
            sp_loops = [lp for lp, _ in spatial]
            if sp_loops:
                sch.reorder(*sp_loops, *[lp for lp, _ in reduction])
                _parallel_outer(sch, sp_loops, _work(iv for _, iv in spatial + reduction), cfg,
                                _MIN_PARALLEL_ELEMS)
        else:
            _schedule_spatial(sch, b, cfg)


_PLANS: list[tuple[str, Callable]] = [
    ("nchwc_conv", _plan_nchwc_conv),   # only passes.kernels.nchwc's channel-blocked convolution
    ("light_reduction", _plan_light_reduction),
    ("spatial_vector", _plan_spatial_vector),
    ("reduction_vector", _plan_reduction_vector),
    ("simple", _plan_simple),
    ("injective", _plan_injective),
    ("each_block", _plan_each_block),
]
PLAN_NAMES = tuple(name for name, _ in _PLANS)


# ----------------------------------------------------------------------------------------------- API
def schedule_cpu(
    func: tirx.PrimFunc,
    target=None,
    *,
    parallel: bool = True,
    plan: str | None = None,
    name: str | None = None,
) -> tirx.PrimFunc:
    """Return ``func`` with a default CPU schedule, or ``func`` itself (the same object) if no plan applies.

    Parameters
    ----------
    func: a PrimFunc as ``relax.get_pipeline("zero")`` leaves it (functions already marked
        ``tirx.is_scheduled``, e.g. by MetaSchedule or dlight, are returned unchanged).
    target: ``tvm.target.Target``, dict or string; chooses the vector width and register count (default
        ``"llvm"``: generic x86-64, SSE2).
    parallel: use TVM's thread pool inside the kernel (False: single-threaded kernels, for an executor that
        runs kernels concurrently on its own threads).
    plan: force one plan by name (``PLAN_NAMES``; for tests and benchmarks).
    name: the function's name, for the debug log.

    The result carries the attributes ``tirx.is_scheduled`` and ``tvm_interop.cpu_plan`` (the plan's name).
    """
    if not isinstance(func, tirx.PrimFunc):
        return func
    if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
        return func
    if plan is not None and plan not in PLAN_NAMES:
        raise ValueError(f"unknown plan {plan!r}; plans: {PLAN_NAMES}")
    cfg = _Cfg(
        lanes=vector_lanes(target),
        # accumulators: 5/8 of the vector registers (10 of 16 on AVX2), the rest for operands; measured on
        # AVX2 convs: 4-5 rows x 2 registers run at 80 GFLOP/s where 6-7 rows (12-14 registers) spill (20)
        acc_regs=(_num_vector_regs(target) * _ACC_REGS[0]) // _ACC_REGS[1],
        # a reduction over one axis (1x1 conv) with 32 registers: 26 accumulators measured faster on AVX-512
        # (13 rows x 2 registers fit a 13x13 output exactly); with 16 registers (AVX2) not measured: unchanged
        acc_regs_1x1=((_num_vector_regs(target) * _ACC_REGS_1X1[0]) // _ACC_REGS_1X1[1]
                      if _num_vector_regs(target) >= 32 else 0),
        threads=_num_threads() if parallel else 1,
    )
    if name is None:
        has_symbol = func.attrs is not None and "global_symbol" in func.attrs
        name = str(func.attrs["global_symbol"]) if has_symbol else "<prim_func>"
    key = (tvm_ffi.structural_hash(func), cfg, plan, os.environ.get("TVM_INTEROP_OUTER_ORDER", "reuse"))
    for seen, scheduled in _SCHEDULED.get(key, ()):
        if tvm_ffi.structural_equal(seen, func):
            _SCHEDULED.move_to_end(key)
            return func if scheduled is seen else scheduled
    out = _schedule_with_plans(func, cfg, plan, name)
    _SCHEDULED.setdefault(key, []).append((func, out))
    while len(_SCHEDULED) > _SCHEDULED_MAX:
        _SCHEDULED.popitem(last=False)
    return out


# Scheduling is deterministic in (function, configuration, plan), and the same PrimFuncs come back again and again:
# AutoGraph prepares every candidate of a model (a substitution changes a few operators, the other ~100 functions
# are the ones the last candidate had), the guard and the candidate programs rebuild the model, and a session
# compiles one model for several schedulers. Remembering the result took a repeated NASNet-A-large (small config)
# preparation from 1.70 to 1.18 s. Keys hold the structural hash; the stored function is compared structurally, so a hash collision
# cannot hand back another function's schedule.
_SCHEDULED: "collections.OrderedDict[tuple, list[tuple[tirx.PrimFunc, tirx.PrimFunc]]]" = collections.OrderedDict()
_SCHEDULED_MAX = 4096


def _schedule_with_plans(func: tirx.PrimFunc, cfg: "_Cfg", plan: str | None, name: str) -> tirx.PrimFunc:
    """The first plan (in ``_PLANS`` order, or only ``plan``) that schedules ``func``; ``func`` if none does."""
    for plan_name, plan_fn in _PLANS:
        if plan is not None and plan_name != plan:
            continue
        try:
            sch = s_tir.Schedule(func)
            plan_fn(sch, cfg)
            out = sch.mod["main"].with_attrs({"tirx.is_scheduled": True, "tvm_interop.cpu_plan": plan_name})
            log.debug("cpu_schedule: %s scheduled with plan %s", name, plan_name)
            return out
        except _Skip as why:
            log.debug("cpu_schedule: %s: plan %s does not apply (%s)", name, plan_name, why)
        except Exception as err:  # any schedule error: try the next plan
            log.debug("cpu_schedule: %s: plan %s failed: %s: %s", name, plan_name, type(err).__name__, err)
    return func


def apply_cpu_schedules(mod: tvm.IRModule, target=None, *, parallel: bool = True) -> tvm.IRModule:
    """Apply :func:`schedule_cpu` to every PrimFunc of ``mod`` (a new module; Relax functions untouched).

    PrimFuncs that no plan handles, or that are already scheduled, are left unchanged.
    """
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            new = schedule_cpu(func, target, parallel=parallel, name=gvar.name_hint)
            if new is not func:
                updates[gvar] = new
    if not updates:
        return mod
    mod = mod.clone()
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod
