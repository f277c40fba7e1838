"""One launch per wave on a GPU: the members' thread blocks in one grid (Rammer's rTasks on an rProgram).

Wave ``k`` holds the ``k``-th kernel launch of every member (a member being one kernel or a group's chain of
kernels); the end of a launch is the barrier between waves, so a chain's kernels keep their order. In a wave's
launch the members' grids are laid end to end on ``blockIdx.x`` (:mod:`passes.wave.partition`): a block first
finds its member (a comparison that is the same for every thread of the block), then re-derives the member's own
``blockIdx.{x,y,z}`` and ``threadIdx.{x,y,z}`` from the fused indices, x fastest as CUDA numbers them, so warps
hold the same threads as in the member's own launch. The block size is that of the members whose threads
synchronise (shared memory, which gets ``__syncthreads``; cross-thread reductions and warp operations): they keep
their blocks exactly. The other members are repacked (:func:`partition.repacked_blocks`): their threads, which
never talk to each other, are laid in linear order over blocks of the wave's size, whatever their own block was.
Without a synchronising member the block is the largest member's.

What cannot share a launch is refused (:class:`NotFusable`, the stage keeps that member beside the fused kernel):
synchronising members of different block sizes in one wave (a barrier needs every thread of the block); and
members whose static shared memory together exceeds the 48 KiB a block may declare. TVM's later passes (thread
synchronisation, shared-memory planning, host/device split) then finish the fused kernel like any other.
"""
from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.tirx import stmt as S

from .lowered import LoweredKernel, Nest, NotFusable, flat, is_declaration, work
from .partition import block_offsets, repack_alignment, repacked_blocks, wave_block_size

STATIC_SHARED_LIMIT = 48 * 1024
WARP = 32   # a synchronising member's block under this size is not one the others are repacked into
_BLOCK = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
_THREAD = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
_SYNCING_CALLS = ("tvm_thread_allreduce", "tvm_warp_shuffle", "tvm_storage_sync", "tvm_warp_activemask",
                  "tvm_fill_fragment", "tvm_mma_sync", "ptx_")


def sync_passes() -> list:
    """TVM's barrier insertion and cross-thread reduction lowering, run on each member alone, where its launch
    dimensions are still the ``thread_extent`` attributes these passes read. In the fused kernel a member's body
    sits under the block-index test, where TVM 0.27's ``ThreadSync`` refuses to insert barriers ("Cannot insert
    syncs inside condition"), and its thread indices are values bound from the fused ones, which
    ``LowerThreadAllreduce`` cannot see through; with both done per member, they have nothing left to do there."""
    st = s_tir.transform
    return [st.ThreadSync("shared"), st.ThreadSync("shared.dyn"), st.ThreadSync("warp"), st.InferFragment(),
            st.LowerThreadAllreduce()]


class Launch:
    """One kernel launch of a lowered member: its block and thread dimensions, the member's index variables,
    the attributes to keep (virtual threads) and the body."""

    def __init__(self, stmt, name: str):
        self.block = {}      # tag -> (var, extent)
        self.thread = {}
        self.keep = []       # AttrStmts to re-wrap around the body (virtual threads, pragmas)
        s = stmt
        while isinstance(s, S.AttrStmt) and s.attr_key in ("thread_extent", "virtual_thread"):
            iv = s.node
            tag = str(iv.thread_tag)
            if s.attr_key == "thread_extent" and tag in _BLOCK + _THREAD:
                ext = s.value
                if not isinstance(ext, tirx.IntImm):
                    raise NotFusable(f"{name}: a launch dimension {tag} that is not a constant")
                (self.block if tag in _BLOCK else self.thread)[tag] = (iv.var, int(ext.value))
            else:
                self.keep.append(s)
            s = s.body
        if not self.block and not self.thread:
            raise NotFusable(f"{name}: a top-level statement that is not a kernel launch")
        self.body = s

    def dims(self, tags) -> tuple[int, ...]:
        table = self.block if tags is _BLOCK else self.thread
        return tuple(table[t][1] if t in table else 1 for t in tags)

    @property
    def grid(self) -> int:
        x, y, z = self.dims(_BLOCK)
        return x * y * z

    @property
    def threads(self) -> int:
        x, y, z = self.dims(_THREAD)
        return x * y * z


def split_cuda(name: str, func: tirx.PrimFunc) -> LoweredKernel:
    """Split a lowered CUDA kernel into declarations and launches (each a :class:`Nest` of kind ``launch``
    holding a :class:`Launch`)."""
    out = LoweredKernel(name, func)
    script = func.script()
    syncs = any(c in script for c in _SYNCING_CALLS)
    shared = 0
    try:
        sizes = s_tir.analysis.calculate_allocated_bytes(func)
        for scope, nbytes in dict(sizes.get("main", {})).items():
            if str(scope).startswith("shared"):
                shared += int(nbytes)
    except Exception:  # noqa: BLE001 - no estimate: count nothing, the build still checks the limit
        shared = 0
    out.shared_bytes = shared
    out.syncs = syncs or shared > 0
    for s in flat(func.body):
        if is_declaration(s):
            out.decls.append(s)
            continue
        launch = Launch(s, name)
        out.nests.append(Nest(launch, "launch", max(work(s), 1), launch.grid))
    if not out.nests:
        raise NotFusable(f"{name}: no kernel launch")
    return out


def admit(chains: list[list[LoweredKernel]]) -> tuple[list[int], dict[int, str]]:
    """Which chains can share launches. Wave ``w`` runs the ``w``-th launch of every chain in blocks of the size
    of its synchronising launches (:func:`partition.wave_block_size`), so those must agree on it. While some wave
    has synchronising launches of different sizes (or one under a warp beside a larger launch), the chain in the
    most such conflicts is left out (with the reason). Returns the admitted chain indices and, for the others,
    why not."""
    launches = [[(n.stmt.threads, k.syncs, k.name) for k in chain for n in k.nests] for chain in chains]
    alive = list(range(len(chains)))
    why: dict[int, str] = {}
    while len(alive) >= 2:
        blame: dict[int, list[str]] = {}
        for w in range(max(len(launches[i]) for i in alive)):
            here = [(i, launches[i][w]) for i in alive if w < len(launches[i])]
            for i, (t, syncs, name) in here:
                if not syncs:
                    continue
                for j, (tj, syncs_j, other) in here:
                    # members that do not synchronise are repacked to the block of those that do, unless that block
                    # is under a warp (they would run in partial warps): then the small one stays out, as before
                    if tj > t and (syncs_j or t < WARP):
                        how = "synchronise" if syncs_j else "run"
                        note = (f"{name}: its threads synchronise in blocks of {t} threads, and {other}'s {how} in "
                                f"blocks of {tj}, in the same fused launch (wave {w})")
                        blame.setdefault(i, []).append(note)
                        blame.setdefault(j, []).append(note)
        if not blame:
            break
        worst = max(blame, key=lambda i: (len(blame[i]), i))
        why[worst] = blame[worst][0]
        alive.remove(worst)
    return alive, why


def _bind_dims(table: dict, tags, linear, dtype: str) -> list:
    """``Bind`` statements giving the member's index variables their values from the linear fused index
    (``partition.unflatten`` in TIR: x fastest)."""
    out, stride = [], 1
    dims = [table[t][1] if t in table else 1 for t in tags]
    for tag, d in zip(tags, dims):
        if tag in table:
            var = table[tag][0]
            value = tirx.floormod(tirx.floordiv(linear, tirx.IntImm(dtype, stride)), tirx.IntImm(dtype, d))
            vdtype = str(var.ty.dtype)
            out.append(S.Bind(var, value if vdtype == dtype else tirx.Cast(vdtype, value)))
        stride *= d
    return out


def member_stmt(la: Launch, block: int, local_b, tx, grid: int, idle=None):
    """One member's body in a fused launch of ``block``-thread blocks, as the block ``local_b`` of its ``grid``
    blocks there (``tx``: the fused thread index): its own block and thread indices bound from those (repacked
    when its block differs: linear thread ``L``, guarded ``L < grid x threads``), its attributes re-wrapped, and
    ``idle`` (a condition) guarding the alignment blocks it skips (:func:`partition.repack_alignment`). Shared by
    the wave launches and the flow launch (:mod:`passes.wave.flow`), which differ only in where ``local_b``
    comes from."""
    dtype = "int64"
    c = lambda v: tirx.IntImm(dtype, v)  # noqa: E731
    if la.threads == block:
        member_b, member_t, guard = local_b, tx, None
    else:   # repacked (partition.member_thread): linear thread L, guarded L < grid x threads
        linear = local_b * c(block) + tx
        member_b, member_t = tirx.floordiv(linear, c(la.threads)), tirx.floormod(linear, c(la.threads))
        guard = tirx.LT(linear, c(la.grid * la.threads)) if grid * block != la.grid * la.threads else None
        if idle is not None:   # the idle blocks of its alignment (partition.repack_alignment) skip the body
            guard = idle if guard is None else tirx.And(idle, guard)
    body = [*_bind_dims(la.block, _BLOCK, member_b, dtype), *_bind_dims(la.thread, _THREAD, member_t, dtype)]
    inner = la.body
    for attr in reversed(la.keep):
        inner = S.AttrStmt(attr.node, attr.attr_key, attr.value, inner)
    body.append(inner)
    stmt = S.SeqStmt(body)
    return stmt if guard is None else S.IfThenElse(guard, stmt, None)


def wave_launch(launches: list[tuple[str, Launch, bool]], name: str):
    """One launch running ``launches`` (member name, launch, whether its threads synchronise)."""
    dtype = "int64"
    block = wave_block_size([(la.threads, syncs) for _, la, syncs in launches])
    for member, la, syncs in launches:
        if syncs and la.threads != block:   # admit() keeps such chains out; a direct caller gets the reason
            raise NotFusable(f"{member}: its threads synchronise in blocks of {la.threads} threads, and the wave's "
                             f"block has {block}", unit=member)
    # blocks of each member in the fused grid: its own grid, or its threads repacked into the wave's blocks
    grids = [la.grid if la.threads == block else repacked_blocks(la.grid, la.threads, block)
             for _, la, _ in launches]
    aligns = [1 if la.threads == block else repack_alignment(la.threads, block) for _, la, _ in launches]
    offsets, total = block_offsets(grids, aligns)
    ends = [0] + [o + g for o, g in zip(offsets, grids)]
    bx = tirx.Var(f"{name}_bx", dtype)
    tx = tirx.Var(f"{name}_tx", dtype)
    c = lambda v: tirx.IntImm(dtype, v)  # noqa: E731
    branches = []
    for k, ((member, la, _), offset, grid) in enumerate(zip(launches, offsets, grids)):
        local_b = bx - c(offset) if offset else bx
        stmt = member_stmt(la, block, local_b, tx, grid, idle=tirx.GE(bx, c(offset)) if offset > ends[k] else None)
        branches.append((tirx.LT(bx, c(offset + grid)), stmt))
    # if / else-if chain on the block index: uniform within a block
    chain = branches[-1][1]
    for cond, stmt in reversed(branches[:-1]):
        chain = S.IfThenElse(cond, stmt, chain)
    tx_iv = tirx.IterVar(tvm.ir.Range(tirx.IntImm(dtype, 0), tirx.IntImm(dtype, block)), tx,
                         tirx.IterVar.ThreadIndex, "threadIdx.x")
    bx_iv = tirx.IterVar(tvm.ir.Range(tirx.IntImm(dtype, 0), tirx.IntImm(dtype, total)), bx,
                         tirx.IterVar.ThreadIndex, "blockIdx.x")
    return S.AttrStmt(bx_iv, "thread_extent", tirx.IntImm(dtype, total),
                      S.AttrStmt(tx_iv, "thread_extent", tirx.IntImm(dtype, block), chain))


def fuse_cuda(members: list[list[LoweredKernel]], prologue: list, params: list,
              attrs: dict) -> tuple[tirx.PrimFunc, int]:
    """The fused PrimFunc (see the module docstring) and its number of waves (launches)."""
    chains = [[(k, n.stmt) for k in chain for n in k.nests] for chain in members]
    decls = [d for chain in members for k in chain for d in k.decls]
    waves = []
    for w in range(max(len(c) for c in chains)):
        here = [c[w] for c in chains if w < len(c)]
        # each wave is a kernel of its own: it declares the shared memory of the members it runs (a member
        # kernel's whole declaration with each of its launches: an upper bound)
        shared = sum(k.shared_bytes for k, _ in here)
        if shared > STATIC_SHARED_LIMIT:
            biggest = max((k for k, _ in here), key=lambda k: k.shared_bytes)
            raise NotFusable(f"the members of wave {w} declare {shared} bytes of shared memory together, over the "
                             f"{STATIC_SHARED_LIMIT} a block may declare (largest: {biggest.name})", unit=biggest.name)
        waves.append(wave_launch([(k.name, la, k.syncs) for k, la in here], f"wave{w}"))
    body = S.SeqStmt(list(prologue) + decls + waves)
    return tirx.PrimFunc(params, body, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs)), len(waves)
