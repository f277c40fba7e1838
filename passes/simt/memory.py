"""Memory and launch state of an emulation: allocations with the bookkeeping of who wrote and read each element,
and the race and bounds checks every load and store goes through.

Why here, apart from the interpreter: these checks are what makes an emulation worth more than a GPU run (a race can
pass on the device by luck); keeping them in one place keeps their rules readable: shared memory between barriers
is per warp, global memory across blocks is ordered only by counters (happens-before as bit sets of blocks).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm

from .errors import EmulationError, Unsupported

WARP = 32


NP = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int32": np.int32, "int64": np.int64,
       "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint32": np.uint32, "bool": np.bool_}


def scalar_dtype(dtype) -> str:
    return str(tvm.DataType(str(dtype)).with_lanes(1)) if str(dtype) != "bool" else "bool"


def dtype_lanes(dtype) -> int:
    return tvm.DataType(str(dtype)).lanes


@dataclass
class Storage:
    """One allocation. ``global``/``shared``: ``data`` is 1-D; ``local``: ``data`` is (threads, n).
    ``writer``: per element, the block that last wrote it (global) or the warp and barrier epoch of the last
    write and read (shared), for the race checks."""

    name: str
    scope: str
    data: np.ndarray
    writer: np.ndarray | None = None
    w_epoch: np.ndarray | None = None
    w_warp: np.ndarray | None = None
    r_epoch: np.ndarray | None = None
    r_warp: np.ndarray | None = None

    @staticmethod
    def make(name: str, scope: str, data: np.ndarray) -> "Storage":
        s = Storage(name, scope, data)
        n = data.shape[-1]
        if scope == "global":
            s.writer = np.full(n, -1, np.int64)
        elif scope == "shared":
            s.w_epoch = np.full(n, -1, np.int64)
            s.w_warp = np.full(n, -1, np.int64)
            s.r_epoch = np.full(n, -1, np.int64)
            s.r_warp = np.full(n, -1, np.int64)
        return s


@dataclass(frozen=True)
class Pointer:
    """A pointer value: an allocation and an offset into it, in scalars of its data type."""

    storage: Storage
    offset: int


# ------------------------------------------------------------------------------------------------ launch state
@dataclass
class Block:
    """What one running block knows: its index, its threads, the barrier epoch, what it may read (the blocks that
    happened before it, as a bit set)."""

    index: int
    threads: int
    lane: np.ndarray
    epoch: int = 0
    before: int = 0


@dataclass
class Launch:
    """A launch of one kernel: grid and block shape, and the happens-before sets carried by counters."""

    grid: tuple
    block: tuple
    counter_before: dict = field(default_factory=dict)   # (storage id, index) -> bit set of blocks counted there


class Ctx:
    """What a compiled statement runs in: the variables (by ``hash`` of the IR variable), the block, the launch."""

    __slots__ = ("env", "blk", "launch")

    def __init__(self, env, blk, launch):
        self.env, self.blk, self.launch = env, blk, launch


def any_active(mask) -> bool:
    return bool(np.any(mask))


def full_mask(mask, n):
    return mask if isinstance(mask, np.ndarray) else np.full(n, bool(mask))



def global_pointer(a: np.ndarray, name: str = "arg") -> Pointer:
    """A pointer to a global array; writes go to ``a`` (which must be contiguous)."""
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: a launch writes through a flat view; pass a contiguous array")
    return Pointer(Storage.make(name, "global", a.reshape(-1)), 0)


def per_thread(ctx, v):
    """``v`` as one value per thread (a uniform scalar broadcast)."""
    return v if isinstance(v, np.ndarray) and v.ndim >= 1 else np.full(ctx.blk.threads, v)


def per_lane(ctx, v):
    """``v`` as (threads, lanes): a scalar per thread gets a lane axis of 1."""
    v = per_thread(ctx, v)
    return v[:, None] if v.ndim == 1 else v


def cast_value(v, dt):
    sd = scalar_dtype(dt)
    t = NP[sd]
    if isinstance(v, np.ndarray):
        if np.issubdtype(t, np.integer) and np.issubdtype(v.dtype, np.floating):
            return np.trunc(v).astype(t)
        return v.astype(t)
    if sd == "bool":
        return bool(v)
    if np.issubdtype(t, np.integer):
        return int(v)
    return t(v)


def select_value(c, t, f):
    if not isinstance(c, np.ndarray):
        return t if c else f
    if np.ndim(t) > np.ndim(c) or np.ndim(f) > np.ndim(c):
        c = c[..., None]
    return np.where(c, t, f)



def access(ctx: Ctx, st: Storage, i: np.ndarray, mask, value, name: str, fname: str):
    """Load (``value is None``) or store ``i`` of ``st`` for the active lanes, with the bounds and race checks.

    Most accesses have every thread of the block active (masks come only from ``if``/``while``), so that case
    skips the masking: the same checks on the whole index array, without the boolean selections."""
    blk = ctx.blk
    n = st.data.shape[-1]
    if mask is True or (isinstance(mask, np.ndarray) and mask.all()):
        return _access_all(blk, st, i, n, value, name, fname)
    mask = full_mask(mask, blk.threads)
    m2 = mask[:, None] if i.ndim == 2 else mask
    active = np.broadcast_to(m2, i.shape)
    bad = active & ((i < 0) | (i >= n))
    if bad.any():
        _out_of_bounds(bad, i, n, name, fname, blk)
    safe = np.where(active, i, 0)
    if st.scope == "local":
        rows = _rows(blk, i)
        if value is None:
            return st.data[rows, safe]
        v = np.broadcast_to(np.asarray(value, st.data.dtype), i.shape)
        st.data[rows[active], safe[active]] = v[active]
        return None
    warp = blk.lane // WARP
    warps = np.broadcast_to(warp[:, None] if i.ndim == 2 else warp, i.shape)[active]
    idx = safe[active]
    if st.scope == "shared":
        _shared_race(st, idx, warps, blk.epoch, value is None, name, fname, blk)
    else:
        _global_race(st, idx, value is None, name, fname, blk)
    if value is None:
        return st.data[safe]
    v = np.broadcast_to(np.asarray(value, st.data.dtype), i.shape)
    st.data[idx] = v[active]
    return None


def _access_all(blk: Block, st: Storage, i: np.ndarray, n: int, value, name: str, fname: str):
    """:func:`access` with every thread active: the index array as it is, flattened in thread order."""
    if i.size and (i.min() < 0 or i.max() >= n):
        _out_of_bounds((i < 0) | (i >= n), i, n, name, fname, blk)
    if st.scope == "local":
        rows = _rows(blk, i)
        if value is None:
            return st.data[rows, i]
        st.data[rows, i] = value
        return None
    idx = i.reshape(-1)
    if st.scope == "shared":
        warp = blk.lane // WARP
        warps = (np.repeat(warp, i.shape[1]) if i.ndim == 2 else warp)
        _shared_race(st, idx, warps, blk.epoch, value is None, name, fname, blk)
    else:
        _global_race(st, idx, value is None, name, fname, blk)
    if value is None:
        return st.data[i]
    st.data[idx] = np.broadcast_to(np.asarray(value, st.data.dtype), i.shape).reshape(-1)
    return None


_ROWS: dict[tuple, np.ndarray] = {}


def _rows(blk: Block, i: np.ndarray) -> np.ndarray:
    """The thread (row of a ``local`` allocation) of every element of the index array ``i`` (read-only; one array
    per shape, since every block numbers its threads alike)."""
    rows = _ROWS.get(i.shape)
    if rows is None:
        rows = _ROWS[i.shape] = np.broadcast_to(blk.lane[:, None] if i.ndim == 2 else blk.lane, i.shape)
    return rows


def _out_of_bounds(bad, i, n, name, fname, blk):
    lane = int(np.argwhere(bad)[0][0])
    raise EmulationError(f"{fname}: thread {lane} of block {blk.index} accesses {name}[{int(i[bad][0])}], "
                         f"outside its {n} elements")


def _missing_barrier(clash, warps, idx, verb: str, other: str, name, fname, blk):
    if clash.any():
        raise EmulationError(f"{fname}: block {blk.index}: a thread of warp {int(warps[clash][0])} {verb} "
                             f"{name}[{int(idx[clash][0])}], {other} since the last barrier (a missing __syncthreads)")


def _shared_race(st, idx, warps, epoch, is_read, name, fname, blk):
    """Shared memory between two barriers: a warp reads what another wrote, or writes what another read."""
    if is_read:
        clash = (st.w_epoch[idx] == epoch) & (st.w_warp[idx] != warps)
        _missing_barrier(clash, warps, idx, "reads", "written by another warp", name, fname, blk)
        # readers of this epoch: one warp, or -2 when several (per element read, not per element of the buffer)
        new = _readers(idx, warps)
        prev = st.r_warp[idx]
        st.r_warp[idx] = np.where((st.r_epoch[idx] == epoch) & (prev != new), -2, new)
        st.r_epoch[idx] = epoch
    else:
        clash = (st.r_epoch[idx] == epoch) & (st.r_warp[idx] != warps)
        _missing_barrier(clash, warps, idx, "writes", "read by another warp", name, fname, blk)
        st.w_epoch[idx] = epoch
        st.w_warp[idx] = warps


def _readers(idx: np.ndarray, warps: np.ndarray):
    """For every element of ``idx``: the one warp that reads it in this access, or -2 when several do (when its
    smallest and largest reader differ). ``warps`` never decreases along ``idx`` (index arrays are in thread
    order), so when its ends agree a single warp made the whole access, the common case of small blocks."""
    if not len(warps) or warps[0] == warps[-1]:
        return warps[0] if len(warps) else warps
    lo = np.full(int(idx.max()) + 1, np.iinfo(np.int64).max)
    hi = np.full(len(lo), -1)
    np.minimum.at(lo, idx, warps)
    np.maximum.at(hi, idx, warps)
    lo, hi = lo[idx], hi[idx]
    return np.where(lo == hi, lo, -2)


def _global_race(st, idx, is_read, name, fname, blk):
    writers = st.writer[idx]
    other = (writers >= 0) & (writers != blk.index)
    if other.any():
        for w in np.unique(writers[other]):
            if not (blk.before >> int(w)) & 1:
                what = "reads" if is_read else "writes"
                raise EmulationError(f"{fname}: block {blk.index} {what} {name}[{int(idx[other][0])}], written by "
                                     f"block {int(w)} of the same launch, without waiting for it")
    if not is_read:
        st.writer[idx] = blk.index



def uniform_value(ctx, i, mask, fname, what) -> int:
    """The one value of ``i`` over the active threads."""
    vals = np.unique(np.asarray(i)[full_mask(mask, ctx.blk.threads)]) if np.ndim(i) else [i]
    if len(vals) != 1:
        raise Unsupported(f"{fname}: {what} that differs between threads")
    return int(vals[0])


def lookup(var, unbound: str):
    """A variable's (or buffer's) value in the running context."""
    key = hash(var)

    def run(ctx, mask):
        try:
            return ctx.env[key]
        except KeyError:
            raise Unsupported(unbound) from None
    return run
