"""Partition an OpGraph into blocks between cut points.

A cut point is a unit that every path from an input to an output passes through: every other unit is either
its ancestor or its descendant. No schedule can run anything beside a cut point's ancestors and descendants at
the same time across it, so searching each block separately loses nothing (IOS does the same). Blocks larger
than ``max_block_size`` are split in topological order, which bounds the cost of exponential searches.
"""
from __future__ import annotations

from dataclasses import dataclass

from runtime.errors import InteropError

from .graph import OpGraph


def cut_points(graph: OpGraph) -> list[int]:
    """Indices (topological) of the units comparable with every other unit."""
    n = len(graph)
    full = (1 << n) - 1
    anc, desc = graph.ancestor_masks(), graph.descendant_masks()
    return [i for i in range(n) if (anc[i] | desc[i] | (1 << i)) == full]


def partition(graph: OpGraph, max_block_size: int | None = None) -> list[list[str]]:
    """Blocks as lists of unit names, in execution order; each block ends at a cut point (or the graph end)."""
    if max_block_size is not None and max_block_size < 1:
        raise InteropError(f"max_block_size must be >= 1, got {max_block_size}")
    cuts = set(cut_points(graph))
    blocks: list[list[str]] = []
    current: list[str] = []
    for i, unit in enumerate(graph.units):
        current.append(unit.name)
        if i in cuts:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    if max_block_size:
        split: list[list[str]] = []
        for b in blocks:
            for k in range(0, len(b), max_block_size):
                split.append(b[k:k + max_block_size])
        blocks = split
    return blocks


# ---------------------------------------------------------------------------------------------- frontier blocks
DEFAULT_MAX_FRONTIER = 2
DEFAULT_BLOCK_STATES = 4096


def frontier_sizes(graph: OpGraph) -> list[int]:
    """For each position ``i`` of the topological order, how many units of ``units[:i+1]`` have a consumer after
    ``i``: the tensors live across a barrier placed after unit ``i`` (a cut point has 1)."""
    n = len(graph)
    delta = [0] * (n + 1)
    for i in range(n):
        last = max(graph.succs[i], default=i)
        if last > i:             # live from i up to (not including) its last consumer
            delta[i] += 1
            delta[last] -= 1
    out, live = [], 0
    for i in range(n):
        live += delta[i]
        out.append(live)
    return out


class _DownSets:
    """Down-set count of a growing topological segment, stopping at ``limit`` (what the IOS DP would hold)."""

    def __init__(self, graph: OpGraph, limit: int):
        self.graph, self.limit = graph, limit
        self.reset()

    def reset(self) -> None:
        self.pos: dict[int, int] = {}
        self.sets: list[int] | None = [0]

    def add(self, v: int) -> None:
        self.pos[v] = len(self.pos)
        if self.sets is None:
            return
        pm = 0
        for p in self.graph.preds[v]:
            j = self.pos.get(p)
            if j is not None:
                pm |= 1 << j
        b = 1 << self.pos[v]
        self.sets += [s | b for s in self.sets if s & pm == pm]
        if len(self.sets) > self.limit:
            self.sets = None

    @property
    def count(self) -> int | None:
        """Down-sets so far, or None once over the limit."""
        return None if self.sets is None else len(self.sets)


@dataclass
class Block:
    """One block: its units (topological order), down-set count (None: over the budget) and the tensors live
    across the barrier after it."""

    units: list[str]
    states: int | None
    frontier: int

    def to_json(self) -> dict:
        return {"units": len(self.units), "states": self.states, "frontier": self.frontier,
                "first": self.units[0], "last": self.units[-1]}


def frontier_blocks(graph: OpGraph, max_frontier: int = DEFAULT_MAX_FRONTIER,
                    max_states: int | None = DEFAULT_BLOCK_STATES) -> list[Block]:
    """Blocks of ``graph`` for an exact search (IOS's blocks): barriers where at most ``max_frontier`` tensors are
    live, as few as keep every block within ``max_states`` down-sets.

    Every cut point is a barrier (it loses nothing). Between cut points, a block is grown along the topological
    order and, once it would exceed ``max_states`` down-sets, cut at the last position with a frontier of at most
    ``max_frontier`` (greedy furthest reach: the fewest barriers, so the least parallelism lost to them). A
    stretch with no such position stays one block over the budget (the search then cuts it itself and says so).
    ``max_states=None``: cut points only.
    """
    if max_frontier < 1:
        raise InteropError(f"max_frontier must be >= 1, got {max_frontier}")
    if max_states is not None and max_states < 2:
        raise InteropError(f"max_block_states must be >= 2, got {max_states}")
    n = len(graph)
    front = frontier_sizes(graph)
    cuts = set(cut_points(graph))
    counter = _DownSets(graph, max_states or 0)
    blocks: list[Block] = []
    start = 0
    while start < n:
        counter.reset()
        end, last_ok = start, None
        while end < n:
            counter.add(end)
            if max_states is not None and counter.count is None and last_ok is not None:
                break
            if end in cuts:
                last_ok = end
                break
            if front[end] <= max_frontier:
                last_ok = end
            end += 1
        stop = last_ok if last_ok is not None else n - 1
        if end >= n:
            stop = n - 1
        counter.reset()
        for v in range(start, stop + 1):
            counter.add(v)
        blocks.append(Block([graph.units[i].name for i in range(start, stop + 1)],
                            counter.count if max_states is not None else None, front[stop]))
        start = stop + 1
    return blocks
