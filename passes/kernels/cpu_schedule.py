"""A default CPU schedule for the PrimFuncs that ``relax.get_pipeline("zero")`` produces.

TVM's default CPU build of an unscheduled PrimFunc is a naive loop nest: no tiling, no vectorisation, no threads
(Inception-v3: 6.2 s vs 193 ms in PyTorch). This module gives every heavy kernel a reasonable hand-written
schedule so untuned builds are usable. It is generic: it inspects the blocks of a PrimFunc (iterator kinds,
buffer access patterns) instead of matching one model, and handles

* one reduction block (conv2d NCHW incl. grouped/depthwise/strided, matmul NN / dense NT, pooling, reductions)
  with its injective prologue (padding) and epilogue (bias, relu, ...), and
* injective-only functions (elementwise, concat, pad, reshape, ...).

The plans, tried in order until one applies (each on a fresh schedule):

``spatial_vector``
    register tile ``[u_i x v_i]`` of the output, where ``v`` is the spatial axis that indexes the output's
    innermost dimension (vectorised: output width for conv, columns for matmul) and ``u`` is a spatial axis the
    main input does not depend on (output channels for conv, rows for matmul), so one vector load of the input
    feeds ``u_i`` FMAs. Loop order: outer spatial tiles (the leading ones fused and parallel), the reduction loops,
    then ``u_i`` (unrolled) and ``v_i`` (vectorised). The accumulator is a local (register) tile
    (``cache_write``) written back, with the epilogue inlined into the write-back.
``reduction_vector``
    for dense / ``matmul_NT`` where the output's innermost axis is strided in the weights but the reduction axis
    is contiguous in every input: ``rfactor`` the reduction by the vector width, vectorise the partial sums.
``simple``
    parallel outer spatial loops, reduction inside, no vectorisation.

Every plan is checked by TVM's schedule primitives (which refuse illegal transformations); any error makes
:func:`schedule_cpu` return the input function unchanged (logged at debug level), so a kernel is never worse than
unscheduled and never wrong.

Run ``python -m passes.kernels.cpu_schedule`` for a small benchmark of the default vs this schedule.
"""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable

import tvm
from tvm import s_tir, tirx

log = logging.getLogger(__name__)

__all__ = ["schedule_cpu", "apply_cpu_schedules", "vector_lanes"]

_MIN_PARALLEL_WORK = 1 << 15  # multiply-adds (or elements) below which threads cost more than they give
_MAX_VEC_REGS = 4  # at most this many vector registers per accumulator row


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

    Note: the plain ``"llvm"`` target compiles for generic x86-64 (SSE2, 4 x fp32); give the CPU, e.g.
    ``{"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()}``, to get AVX2 / AVX-512 code.
    """
    return max(1, _simd_bits(target) // dtype_bits)


def _num_threads() -> int:
    env = os.environ.get("TVM_NUM_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return os.cpu_count() or 1


# ----------------------------------------------------------------------------------------------- helpers
def _int(x) -> int | None:
    try:
        return int(x)
    except Exception:
        return None


def _extent(sch: s_tir.Schedule, loop) -> int | None:
    return _int(sch.get(loop).extent)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _best_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in _divisors(n) if d <= max(1, cap))


def _iter_kind(iv) -> str:
    return {tirx.IterVar.DataPar: "S", tirx.IterVar.CommReduce: "R"}.get(iv.iter_type, "O")


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


def _uses(expr, var) -> bool:
    from tvm.tirx.analysis import undefined_vars

    return any(v.same_as(var) for v in undefined_vars(expr))


def _region_uses(region, var) -> bool:
    return any(_uses(r.min, var) or _uses(r.extent, var) for r in region.region)


def _choose_vec_tile(extent: int, lanes: int) -> tuple[int, bool]:
    """Tile of the vectorised axis: (size, divides extent). Prefer full use of the vector registers."""
    best, best_score = 1, (-1.0, 0)
    for d in _divisors(extent):
        if d > _MAX_VEC_REGS * lanes:
            continue
        regs = math.ceil(d / lanes)
        score = (d / (regs * lanes), d)
        if score > best_score:
            best, best_score = d, score
    if best_score[0] >= 0.5 or extent <= lanes:
        return best, True
    # e.g. a prime width: split by a multiple of the vector width and let the tail be predicated
    return min(2 * lanes, extent), False


def _parallel_outer(sch: s_tir.Schedule, loops: list, work: int) -> None:
    """Fuse a prefix of ``loops`` (perfectly nested, outermost first) to enough iterations, make it parallel."""
    if work < _MIN_PARALLEL_WORK or not loops:
        return
    want = 4 * _num_threads()
    prefix, total = [], 1
    for loop in loops:
        ext = _extent(sch, loop)
        if ext is None:
            break
        prefix.append(loop)
        total *= ext
        if total >= want:
            break
    prefix = prefix if total > 1 else []
    # drop leading unit loops (they add nothing) but keep at least one loop
    while len(prefix) > 1 and _extent(sch, prefix[0]) == 1:
        prefix = prefix[1:]
    if not prefix or total < 2:
        return
    fused = sch.fuse(*prefix) if len(prefix) > 1 else prefix[0]
    sch.parallel(fused)


def _schedule_spatial(sch: s_tir.Schedule, block, lanes: int) -> None:
    """Parallel + vectorised schedule for an injective block at the root (pad, add, concat, relu, ...)."""
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = [_extent(sch, lp) for lp in loops]
    if any(e is None for e in extents):
        return
    total = math.prod(extents)
    inner = loops[-1]
    outer = list(loops[:-1])
    vec = None
    if extents[-1] >= lanes:
        if extents[-1] % lanes == 0 or extents[-1] > 4 * lanes:
            factor = lanes * 2 if extents[-1] % (2 * lanes) == 0 else lanes
            lo, vec = sch.split(inner, factors=[None, factor])
            outer.append(lo)
        else:
            vec = inner
    elif extents[-1] > 1 and extents[-1] * 2 >= lanes:
        vec = inner
    else:
        outer.append(inner)
    _parallel_outer(sch, outer, total)
    if vec is not None:
        sch.vectorize(vec)


def _block_infos(sch: s_tir.Schedule):
    root = sch.get_sblock("root")
    blocks = sch.get_child_blocks(root)
    infos = []
    for b in blocks:
        stmt = sch.get(b)
        kinds = "".join(_iter_kind(iv) for iv in stmt.iter_vars)
        infos.append((b, stmt, kinds))
    return infos


def _output_buffers(func: tirx.PrimFunc) -> list:
    """Buffers visible outside the function (in this TVM the parameters are the buffers themselves)."""
    return list(func.params) + [func.buffer_map[p] for p in getattr(func, "buffer_map", {}) or {}]


def _is_output_block(sch, block, func_outputs) -> bool:
    return any(_buf(w).same_as(o) for w in sch.get(block).writes for o in func_outputs)


def _buf(region):
    """The buffer of a read/write region (``.source`` in TVM 0.27, ``.buffer`` before)."""
    return region.source if hasattr(region, "source") else region.buffer


# ----------------------------------------------------------------------------------------------- plans
class _Skip(Exception):
    """This plan does not apply to the function."""


def _prepare(sch: s_tir.Schedule):
    """Common analysis: returns (reduction block, prologue blocks, epilogue block or None) after inlining."""
    func = sch.mod["main"]
    outputs = _output_buffers(func)
    infos = _block_infos(sch)
    if any("O" in kinds for _, _, kinds in infos):
        raise _Skip("opaque iterators")
    reds = [b for b, _, kinds in infos if "R" in kinds]
    if len(reds) != 1:
        raise _Skip(f"{len(reds)} reduction blocks")
    red = reds[0]
    names = [s.name_hint for _, s, _ in infos]
    idx = names.index(sch.get(red).name_hint)
    prologue = [b for b, _, _ in infos[:idx]]
    after = [b for b, _, _ in infos[idx + 1:]]
    # inline the epilogue chain into its last block (bias add into relu, ...)
    for b in after[:-1]:
        if _is_output_block(sch, b, outputs):
            raise _Skip("several outputs")
        sch.compute_inline(b)
    epilogue = after[-1] if after else None
    if epilogue is not None:
        consumers = sch.get_consumers(red)
        if len(consumers) != 1 or not sch.get(consumers[0]).same_as(sch.get(epilogue)):
            raise _Skip("epilogue is not a single chain")
    if epilogue is None and not _is_output_block(sch, red, outputs):
        raise _Skip("reduction is not the output")
    return red, prologue, epilogue


def _spatial_and_reduction_loops(sch, block):
    """Loops of ``block`` as (spatial [(loop, itervar)], reduction [(loop, itervar)]); 1:1 loop/iter binding."""
    stmt = sch.get(block)
    loops = sch.get_loops(block)
    if len(loops) != len(stmt.iter_vars):
        raise _Skip("loops do not map 1:1 to block iterators")
    realize_bindings = _bindings(sch, block)
    sp, rd = [], []
    for lp, iv, bind in zip(loops, stmt.iter_vars, realize_bindings):
        loop_var = sch.get(lp).loop_var
        if not (isinstance(bind, tirx.Var) and bind.same_as(loop_var)):
            raise _Skip("non-trivial block binding")
        ext = _int(iv.dom.extent)
        if ext is None or _int(iv.dom.min) != 0:
            raise _Skip("dynamic or offset iterator")
        (sp if _iter_kind(iv) == "S" else rd).append((lp, iv))
    return sp, rd


def _bindings(sch, block):
    realize = tvm.get_global_func("s_tir.schedule.GetSBlockRealize")(sch, block)
    return list(realize.iter_values)


def _vector_axis(stmt, spatial):
    """The spatial iterator that indexes the innermost non-unit dimension of the output (or None)."""
    write = stmt.writes[0]
    for r in reversed(write.region):
        ext = _int(r.extent)
        if ext != 1:
            return None
        for _, iv in spatial:
            if isinstance(r.min, tirx.Var) and r.min.same_as(iv.var):
                if _int(iv.dom.extent) == 1:
                    break  # unit dimension: look further out
                return iv
        else:
            if _int(r.min) is not None:
                continue  # constant index (unit dim)
            return None
    return None


class _VecChoice:
    """How to vectorise along one spatial axis of a reduction block."""

    def __init__(self, iv, score, tile, exact, deps, repack, transpose_acc):
        self.iv = iv  # the block iterator
        self.score = score
        self.tile = tile  # vector tile (elements)
        self.exact = exact  # tile divides the extent
        self.deps = deps  # indices of the reads that depend on the axis
        self.repack = repack  # indices of the reads to repack with the axis innermost
        self.transpose_acc = transpose_acc  # the accumulator tile needs the axis moved innermost


def _dims_using(region, var) -> list[int]:
    return [d for d, r in enumerate(region.region) if _uses(r.min, var)]


def _analyse_vec_axis(stmt, iv, v_out, lanes, work) -> _VecChoice | None:
    ext = _int(iv.dom.extent)
    deps, repack, strided = [], [], False
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
                and rd.region[dims[0]].min.same_as(iv.var) and 0 < size * 8 <= work):
            repack.append(idx)  # e.g. conv weights [F, C, KH, KW] -> [F/16, C, KH, KW, 16]
        elif abs(c) <= 4 and iv.same_as(v_out):
            strided = True  # e.g. the input of a strided conv / pooling: gathers
        else:
            return None
    if not deps:
        return None
    if iv.same_as(v_out):
        tile, exact = _choose_vec_tile(ext, lanes)
    else:
        # the accumulator gets transposed, so use whole vectors only
        tile = next((t for t in (2 * lanes, lanes) if ext % t == 0), None)
        if tile is None:
            return None
        exact = True
    util = tile / (math.ceil(tile / lanes) * lanes)
    score = util * (0.5 if strided else 1.0) * (0.97 if repack else 1.0) * (1.0 if exact else 0.6)
    if not iv.same_as(v_out):
        score *= 0.99
    return _VecChoice(iv, score, tile, exact, deps, repack, not iv.same_as(v_out))


def _choose_row_tile(extent: int, max_rows: int) -> tuple[int, bool]:
    """Rows of the register tile: a divisor of ``extent`` if a good one exists, else a predicated split."""
    max_rows = max(1, min(max_rows, extent))
    d = _best_divisor_at_most(extent, max_rows)
    if 2 * d >= max_rows or d == extent:
        return d, True
    # no good divisor (a prime like 17): the fewest tiles, then the least waste
    best = min(range((max_rows + 1) // 2, max_rows + 1), key=lambda t: (math.ceil(extent / t), t * math.ceil(extent / t)))
    return best, False


def _index_dtype(region) -> str:
    shape = _buf(region).shape
    if not len(shape):
        return "int64"
    dim = shape[0]
    dtype = getattr(dim, "dtype", None) or getattr(getattr(dim, "ty", None), "dtype", None)
    return str(dtype) if dtype is not None else "int64"


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


def _plan_spatial_vector(sch: s_tir.Schedule, lanes: int, acc_regs: int = 12) -> None:
    red, prologue, epilogue = _prepare(sch)
    stmt = sch.get(red)
    spatial, reduction = _spatial_and_reduction_loops(sch, red)
    red_extent = math.prod(_int(iv.dom.extent) for _, iv in reduction) if reduction else 1
    work = math.prod(_int(iv.dom.extent) for _, iv in spatial) * red_extent
    v_out = _vector_axis(stmt, spatial)

    choices = []
    for _, iv in spatial:
        if _int(iv.dom.extent) > 1:
            ch = _analyse_vec_axis(stmt, iv, v_out, lanes, work)
            if ch is not None:
                choices.append(ch)
    if not choices:
        raise _Skip("no vectorisable axis")
    vc = max(choices, key=lambda c: c.score)
    v = vc.iv
    dep_reads = [stmt.reads[i] for i in vc.deps]

    # u: a spatial axis some v-dependent read does not depend on: one vector load then feeds u_t FMAs.
    u, u_key = None, None
    for pos, (_, iv) in enumerate(spatial):
        ext = _int(iv.dom.extent)
        if iv.same_as(v) or ext <= 1:
            continue
        if any(not _region_uses(rd, iv.var) for rd in dep_reads):
            key = (min(ext, 64), pos)  # big enough extent, then the innermost
            if u_key is None or key > u_key:
                u, u_key = iv, key
    regs = math.ceil(vc.tile / lanes)
    ut, _ = _choose_row_tile(_int(u.dom.extent), acc_regs // regs) if u is not None else (1, True)

    # repack the reads that are strided along v (weights) so that v is their innermost dimension
    repack_blocks = []
    for idx in vc.repack:
        rd = sch.get(red).reads[idx]
        ndim = len(rd.region)
        (dim,) = _dims_using(rd, v.var)
        repack_blocks.append(sch.cache_read(red, idx, "global"))
        imap = tirx.IndexMap.from_func(_repack_map(dim, vc.tile), ndim=ndim, index_dtype=_index_dtype(rd))
        sch.transform_layout(red, ("read", idx), imap)

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
    inner = ([ui] if ui is not None else []) + [vi]
    sch.reorder(*outer, *red_loops, *inner)

    # accumulate in a local (register) tile, written back (with the epilogue) after the reduction
    write_back = sch.cache_write(red, 0, "local")
    if vc.transpose_acc:
        wr = sch.get(red).writes[0]
        (dim,) = _dims_using(wr, v.var)
        ndim = len(wr.region)
        imap = tirx.IndexMap.from_func(_innermost_map(dim), ndim=ndim, index_dtype=_index_dtype(wr))
        sch.transform_layout(red, ("write", 0), imap)
    sch.reverse_compute_at(write_back, outer[-1], preserve_unit_loops=True)
    fused_epilogue = False
    if epilogue is not None:
        try:
            sch.reverse_compute_inline(epilogue)
            fused_epilogue = True
        except Exception as err:  # keep it as its own stage
            log.debug("reverse_compute_inline of the epilogue failed: %s", err)
    # annotate before decompose_reduction: the update block alone is neither complete nor a reduction block
    if ui is not None and _extent(sch, ui) > 1:
        sch.unroll(ui)
    sch.vectorize(vi)
    wb_loops = sch.get_loops(write_back)[len(outer):]
    if wb_loops and not vc.transpose_acc and _extent(sch, wb_loops[-1]) > 1:
        sch.vectorize(wb_loops[-1])
    _parallel_outer(sch, outer, work)
    if red_loops:
        init = sch.decompose_reduction(red, red_loops[0])
        init_last = sch.get_loops(init)[-1]
        if sch.get(init_last).kind != tirx.ForKind.VECTORIZED and _extent(sch, init_last) > 1:
            sch.vectorize(init_last)
    if epilogue is not None and not fused_epilogue:
        _schedule_spatial(sch, epilogue, lanes)
    for b in prologue + repack_blocks:
        _schedule_spatial(sch, b, lanes)


def _plan_reduction_vector(sch: s_tir.Schedule, lanes: int, acc_regs: int = 12) -> None:
    red, prologue, epilogue = _prepare(sch)
    stmt = sch.get(red)
    spatial, reduction = _spatial_and_reduction_loops(sch, red)
    if not reduction:
        raise _Skip("no reduction")
    k_loop, k = reduction[-1]
    k_ext = _int(k.dom.extent)
    if k_ext % lanes != 0 or k_ext < 2 * lanes:
        raise _Skip("reduction extent is not a multiple of the vector width")
    k_reads = [rd for rd in stmt.reads if _coeff(_flat_offset(rd), k.var) != 0]
    if not k_reads or any(_coeff(_flat_offset(rd), k.var) != 1 for rd in k_reads):
        raise _Skip("the reduction axis is not contiguous in the inputs")
    work = math.prod(_int(iv.dom.extent) for _, iv in spatial) * math.prod(
        _int(iv.dom.extent) for _, iv in reduction)
    ko, ki = sch.split(k_loop, factors=[None, lanes])
    rf = sch.rfactor(ki, factor_axis=len(_buf(stmt.writes[0]).shape))
    # rf block: spatial iters + ki (now spatial), reduction over the other reductions and ko
    rf_loops = sch.get_loops(rf)
    n_sp = len(spatial)
    sp_loops = rf_loops[:n_sp]
    # register tile: tile the innermost spatial axis by 4 so one vector of the shared input feeds 4 rows
    last_ext = _extent(sch, sp_loops[-1])
    jt = _best_divisor_at_most(last_ext, 4) if last_ext else 1
    if jt > 1:
        jo, ji = sch.split(sp_loops[-1], factors=[None, jt])
        outer = list(sp_loops[:-1]) + [jo]
    else:
        ji = None
        outer = list(sp_loops)
    red_loops = [lp for lp in sch.get_loops(rf)[len(outer) + (1 if ji is not None else 0):]]
    # red_loops = other reductions..., ko, ki ; put ji just before ki
    ki_loop = red_loops[-1]
    rest = red_loops[:-1]
    sch.reorder(*outer, *rest, *([ji] if ji is not None else []), ki_loop)
    # annotate before decompose_reduction (the update block alone is neither complete nor a reduction)
    if ji is not None:
        sch.unroll(ji)
    sch.vectorize(ki_loop)
    _parallel_outer(sch, outer, work)
    if rest:
        init = sch.decompose_reduction(rf, rest[0])
        init_last = sch.get_loops(init)[-1]
        if sch.get(init_last).kind != tirx.ForKind.VECTORIZED:
            sch.vectorize(init_last)
    # final reduction over the lanes: keep at root, parallel over its spatial loops
    fin_loops = sch.get_loops(red)
    _parallel_outer(sch, fin_loops[:n_sp], math.prod(_extent(sch, lp) for lp in fin_loops[:n_sp]) * lanes * 64)
    if epilogue is not None:
        try:
            sch.reverse_compute_inline(epilogue)
        except Exception:
            _schedule_spatial(sch, epilogue, lanes)
    for b in prologue:
        _schedule_spatial(sch, b, lanes)


def _plan_simple(sch: s_tir.Schedule, lanes: int, acc_regs: int = 12) -> None:
    red, prologue, epilogue = _prepare(sch)
    spatial, reduction = _spatial_and_reduction_loops(sch, red)
    sp_loops = [lp for lp, _ in spatial]
    red_loops = [lp for lp, _ in reduction]
    sch.reorder(*sp_loops, *red_loops)
    work = math.prod(_int(iv.dom.extent) for _, iv in spatial + reduction)
    if epilogue is not None:
        try:
            sch.reverse_compute_at(epilogue, sp_loops[-1], preserve_unit_loops=True)
        except Exception:
            _schedule_spatial(sch, epilogue, lanes)
    _parallel_outer(sch, sp_loops, work)
    for b in prologue:
        _schedule_spatial(sch, b, lanes)


def _plan_injective(sch: s_tir.Schedule, lanes: int, acc_regs: int = 12) -> None:
    func = sch.mod["main"]
    outputs = _output_buffers(func)
    infos = _block_infos(sch)
    if not infos or any(kinds.replace("S", "") for _, _, kinds in infos):
        raise _Skip("not an injective function")
    remaining = []
    for b, _, _ in infos:
        if not _is_output_block(sch, b, outputs):
            try:
                sch.compute_inline(b)
                continue
            except Exception:
                pass
        remaining.append(b)
    for b in remaining:
        _schedule_spatial(sch, b, lanes)


def _plan_each_block(sch: s_tir.Schedule, lanes: int, acc_regs: int = 12) -> None:
    """Several reductions (softmax, layer norm, ...): parallelise each block on its own at the root."""
    infos = _block_infos(sch)
    if any("O" in kinds for _, _, kinds in infos):
        raise _Skip("opaque iterators")
    for b, _, kinds in infos:
        if "R" in kinds:
            spatial, reduction = _spatial_and_reduction_loops(sch, b)
            sp_loops = [lp for lp, _ in spatial]
            if not sp_loops:
                continue
            sch.reorder(*sp_loops, *[lp for lp, _ in reduction])
            _parallel_outer(sch, sp_loops, math.prod(_int(iv.dom.extent) for _, iv in spatial + reduction))
        else:
            _schedule_spatial(sch, b, lanes)


_PLANS: list[tuple[str, Callable]] = [
    ("spatial_vector", _plan_spatial_vector),
    ("reduction_vector", _plan_reduction_vector),
    ("simple", _plan_simple),
    ("injective", _plan_injective),
    ("each_block", _plan_each_block),
]


# ----------------------------------------------------------------------------------------------- API
def schedule_cpu(func: tirx.PrimFunc, target=None, *, plan: str | None = None) -> tirx.PrimFunc:
    """Return ``func`` with a default CPU schedule applied, or ``func`` itself if no plan applies.

    ``target`` (a ``tvm.target.Target``, dict or string) only chooses the vector width; ``plan`` forces one plan
    by name (for tests and benchmarks).
    """
    if not isinstance(func, tirx.PrimFunc):
        return func
    if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
        return func  # already scheduled (dlight, MetaSchedule, a previous call)
    lanes = vector_lanes(target)
    # accumulator tile: 3/4 of the vector registers (16 on SSE/AVX2, 32 on AVX-512/NEON)
    acc_regs = (_num_vector_regs(target) * 3) // 4
    name = str(func.attrs["global_symbol"]) if func.attrs is not None and "global_symbol" in func.attrs else "?"
    for plan_name, plan_fn in _PLANS:
        if plan is not None and plan_name != plan:
            continue
        try:
            sch = s_tir.Schedule(func)
            plan_fn(sch, lanes, acc_regs)
            out = sch.mod["main"].with_attrs({"tirx.is_scheduled": True, "tvm_interop.cpu_plan": plan_name})
            log.debug("cpu_schedule: %s scheduled with plan %s", name, plan_name)
            return out
        except _Skip as why:
            log.debug("cpu_schedule: %s: plan %s does not apply (%s)", name, plan_name, why)
        except Exception as err:  # any schedule error: try the next plan
            log.debug("cpu_schedule: %s: plan %s failed: %s: %s", name, plan_name, type(err).__name__, err)
    return func


def apply_cpu_schedules(mod: tvm.IRModule, target=None) -> tvm.IRModule:
    """Apply :func:`schedule_cpu` to every PrimFunc of ``mod``; functions no plan handles are left unchanged."""
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            new = schedule_cpu(func, target)
            if new is not func:
                updates[gvar] = new
    if not updates:
        return mod
    mod = mod.clone()
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


# ----------------------------------------------------------------------------------------------- benchmark
_BENCH_LAYERS = {
    # name: (N, C, H, W, F, (KH, KW), stride, (pad_h, pad_w))
    "resnet_3x3_64x56": (1, 64, 56, 56, 64, (3, 3), 1, (1, 1)),
    "incv3_3x3_192x35": (1, 192, 35, 35, 192, (3, 3), 1, (1, 1)),
    "incv3_stem_3x3_s2": (1, 3, 299, 299, 32, (3, 3), 2, (0, 0)),
    "incv3_1x1_768x17": (1, 768, 17, 17, 192, (1, 1), 1, (0, 0)),
    "incv3_1x7_160x17": (1, 160, 17, 17, 160, (1, 7), 1, (0, 3)),
}


def _bench_module(layer):
    import numpy as np
    from tvm import relax

    n, c, h, w, f, (kh, kw), stride, pad = layer
    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n, c, h, w), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            wt = relax.const((rng.standard_normal((f, c, kh, kw)) * 0.1).astype("float32"))
            y = bb.emit(relax.op.nn.conv2d(x, wt, strides=stride, padding=pad))
            y = bb.emit(relax.op.add(y, relax.const(rng.standard_normal((1, f, 1, 1)).astype("float32"))))
            gv = bb.emit_output(bb.emit(relax.op.nn.relu(y)))
        bb.emit_func_output(gv)
    mod = relax.get_pipeline("zero")(bb.get())
    oh = (h + 2 * pad[0] - kh) // stride + 1
    ow = (w + 2 * pad[1] - kw) // stride + 1
    return mod, 2 * n * f * c * kh * kw * oh * ow


def _median_time(vm, args, repeat: int, min_time: float) -> float:
    import statistics
    import time

    vm["main"](*args)
    t0 = time.perf_counter()
    vm["main"](*args)
    number = max(1, int(min_time / max(time.perf_counter() - t0, 1e-7)))
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            vm["main"](*args)
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def _bench(argv=None) -> None:
    import argparse
    import json

    import numpy as np
    from tvm import relax

    ap = argparse.ArgumentParser(description="default TVM CPU build vs schedule_cpu on conv layers")
    ap.add_argument("--target", default="host",
                    help='"llvm", "host" (llvm with -mcpu of this machine) or a JSON target dict')
    ap.add_argument("--layers", default="resnet_3x3_64x56,incv3_3x3_192x35",
                    help=f"comma-separated subset of {sorted(_BENCH_LAYERS)} or 'all'")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--no-default", action="store_true", help="skip timing the (slow) unscheduled build")
    args = ap.parse_args(argv)
    if args.target == "host":
        target = tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
    elif args.target.startswith("{"):
        target = tvm.target.Target(json.loads(args.target))
    else:
        target = tvm.target.Target(args.target)
    names = sorted(_BENCH_LAYERS) if args.layers == "all" else args.layers.split(",")
    print(f"target {target}  lanes {vector_lanes(target)}  threads {_num_threads()}")
    for name in names:
        mod, flops = _bench_module(_BENCH_LAYERS[name])
        shape = [int(d) for d in mod["main"].params[0].ty.shape.values]
        x = [tvm.runtime.tensor(np.random.default_rng(1).standard_normal(shape).astype("float32"))]
        smod = apply_cpu_schedules(mod, target)
        vm_s = relax.VirtualMachine(tvm.compile(smod, target), tvm.cpu())
        t_s = _median_time(vm_s, x, args.repeat, 0.2)
        line = f"{name:22s} scheduled {t_s * 1e3:8.2f} ms ({flops / t_s / 1e9:5.1f} GFLOP/s)"
        if not args.no_default:
            vm_d = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
            np.testing.assert_allclose(vm_s["main"](*x).numpy(), vm_d["main"](*x).numpy(), rtol=1e-4, atol=1e-4)
            t_d = _median_time(vm_d, x, max(3, args.repeat // 2), 0.1)
            line += f"  default {t_d * 1e3:8.2f} ms ({flops / t_d / 1e9:5.1f} GFLOP/s)  speedup {t_d / t_s:5.1f}x"
        print(line, flush=True)


if __name__ == "__main__":
    _bench()
