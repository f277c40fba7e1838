"""How a wave's work is divided: pure integer arithmetic, shared by the code generators and their tests.

Why a module of its own: the fused kernels compute these ranges *inside* the kernel (from the thread or block
index), so the formula is emitted as TIR; the same formula in plain Python is what the tests check on random
shapes (every iteration owned by exactly one execution unit, ranges contiguous, work balanced).

CPU (Rammer's rTasks on virtual execution units): the parallel region has ``veus`` iterations, one per worker
thread. A member's serial nest cannot be split: serial nests go whole to units, longest first onto the least
loaded (LPT). The members' parallel loops are then laid end to end as one space of weighted iterations
(member ``m``: ``n_m`` iterations of weight ``w_m``, from weight ``start_m``), and each unit takes one contiguous
slice of that space, sized so that every unit ends with the same total load where the serial nests allow
("water filling"): unit ``t`` owns the iterations whose start lies in ``[bound_t, bound_{t+1})``, i.e.
``[ceil((bound_t - start_m) / w_m), ceil((bound_{t+1} - start_m) / w_m))`` clipped to ``[0, n_m)``. Splitting each
member evenly instead would give the same unit every member's odd iteration (measured: 3-iteration loops split
1 + 2, twice, put 4 of 6 on one thread).

CUDA: the fused launch's block indices are the members' grids laid end to end (each member's grid flattened
x-fastest, as CUDA linearises it): block ``b`` belongs to the member whose range ``[offset_m, offset_m + g_m)``
contains it, at local block ``b - offset_m``. The block size is that of the members whose threads synchronise
(they keep their blocks exactly); a member whose threads do not synchronise is *repacked* into blocks of that
size (its ``grid x threads`` threads in linear order, x fastest), so a wave of 128-thread convolutions can also
hold 1024-thread elementwise kernels, and a small-block member fills whole blocks instead of idling the rest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

def _ceildiv(a: int, b: int) -> int:
    return -((-a) // b)


@dataclass(frozen=True)
class Share:
    """A parallel loop's place in the wave's iteration space: ``n`` iterations of weight ``w`` from ``start``."""

    n: int
    w: int
    start: int


@dataclass
class WavePlan:
    """Who runs what in one wave: ``owners[i]`` for serial nest ``i``, and per parallel loop its ``shares`` in a
    space cut at ``bounds`` (``veus + 1`` cut points, unit ``t`` owning ``[bounds[t], bounds[t + 1])``)."""

    owners: list[int]
    shares: list[Share]
    bounds: list[int]


def plan_wave(parallel: list[tuple[int, int]], serial: list[int], veus: int) -> WavePlan:
    """Place ``serial`` nests (their works) by LPT, then cut the parallel loops (``(iterations, weight per
    iteration)``) so that the units' total loads are as equal as the serial nests allow."""
    if veus < 1:
        raise ValueError("a wave needs at least one execution unit")
    loads = [0] * veus
    owners = [0] * len(serial)
    for i in sorted(range(len(serial)), key=lambda i: (-serial[i], i)):
        t = min(range(veus), key=lambda u: (loads[u], u))
        owners[i] = t
        loads[t] += serial[i]
    shares, start = [], 0
    for n, w in parallel:
        if n < 1 or w < 1:
            raise ValueError(f"a parallel loop needs at least one iteration of positive weight, got n={n}, w={w}")
        shares.append(Share(n, w, start))
        start += n * w
    total = start
    # water filling: the level L where sum(max(0, L - load)) = total; each unit's capacity is L - its load
    order = sorted(loads)
    level, filled = 0.0, 0
    for k in range(veus):
        below = order[: k + 1]
        cand = (total + sum(below)) / (k + 1)
        if k + 1 == veus or cand <= order[k + 1]:
            level, filled = cand, k + 1
            break
    caps = [max(0.0, level - x) for x in loads]
    bounds, acc = [0], 0.0
    for t in range(veus):
        acc += caps[t]
        bounds.append(min(total, int(round(acc))))
    bounds[-1] = total
    return WavePlan(owners, shares, bounds)


def share_range(share: Share, lo_bound: int, hi_bound: int) -> tuple[int, int]:
    """The iterations ``[lo, hi)`` of ``share`` whose start lies in ``[lo_bound, hi_bound)``."""
    def first_at_or_after(b: int) -> int:
        return min(max(_ceildiv(b - share.start, share.w), 0), share.n)

    return first_at_or_after(lo_bound), first_at_or_after(hi_bound)


def unit_loads(plan: WavePlan, serial: list[int]) -> list[int]:
    """Work of each unit under ``plan`` (for tests and reports)."""
    veus = len(plan.bounds) - 1
    loads = [0] * veus
    for i, t in enumerate(plan.owners):
        loads[t] += serial[i]
    for t in range(veus):
        for s in plan.shares:
            lo, hi = share_range(s, plan.bounds[t], plan.bounds[t + 1])
            loads[t] += (hi - lo) * s.w
    return loads


def block_offsets(grids: list[int], aligns: list[int] | None = None) -> tuple[list[int], int]:
    """Each member's first block in the fused grid, and the fused grid size. ``aligns[i]``: member ``i`` starts at
    a multiple of that many blocks (idle blocks before it, which its guard skips; see :func:`repack_alignment`)."""
    offsets, k = [], 0
    for i, g in enumerate(grids):
        if g < 1:
            raise ValueError(f"a member grid needs at least one block, got {g}")
        a = aligns[i] if aligns else 1
        k = _ceildiv(k, a) * a
        offsets.append(k)
        k += g
    return offsets, k


def repack_alignment(threads: int, block: int) -> int:
    """Blocks of ``block`` threads by which a repacked member's first block is aligned, so that its first fused
    thread is a multiple of its own block (``threads``): its linear thread then starts at a whole member block.
    Why: with an offset that is not, TVM 0.27's FlattenBuffer simplified a depthwise convolution's weight index
    ``(L // 256 * 256 + L % 256) // 196`` (L = member thread, 2688 fused threads in) to a wrong value (found on an
    H100 and reproduced by emulating the launch on the CPU: tests/test_wave.py)."""
    return threads // math.gcd(threads, block)


def wave_block_size(launches: list[tuple[int, bool]]) -> int:
    """Threads per block of a fused launch over ``launches`` (``(threads, synchronises)`` each): the block of the
    members whose threads synchronise (they must all have it: ``cuda.admit``), else the largest member's."""
    syncing = [t for t, syncs in launches if syncs]
    return max(syncing) if syncing else max(t for t, _ in launches)


def repacked_blocks(grid: int, threads: int, block: int) -> int:
    """Blocks of ``block`` threads that hold a member's ``grid`` x ``threads`` threads, which do not synchronise:
    its linear thread ``L = local_block * block + tx`` (x fastest) is its own block ``L // threads``, thread
    ``L % threads``, and threads with ``L >= grid * threads`` skip the body."""
    return _ceildiv(grid * threads, block)


def member_thread(local_block: int, tx: int, block: int, threads: int) -> tuple[int, int]:
    """(member block, member thread) that fused thread ``tx`` of the member's local block runs (repacked)."""
    linear = local_block * block + tx
    return linear // threads, linear % threads


def owner_of_block(offsets: list[int], grids: list[int], b: int) -> tuple[int, int]:
    """(member, local block) of fused block ``b``."""
    for m, (o, g) in enumerate(zip(offsets, grids)):
        if o <= b < o + g:
            return m, b - o
    raise IndexError(f"block {b} is outside the fused grid of {sum(grids)} blocks")


def unflatten(index: int, dims: tuple[int, ...]) -> tuple[int, ...]:
    """x-fastest unflattening of a linear block or thread index (CUDA's order)."""
    out = []
    for d in dims:
        out.append(index % d)
        index //= d
    return tuple(out)
