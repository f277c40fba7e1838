"""Partition an OpGraph into blocks between cut points.

A cut point is a unit that every path from an input to an output passes through: every other unit is either
its ancestor or its descendant. No schedule can run anything beside a cut point's ancestors and descendants at
the same time across it, so searching each block separately loses nothing (IOS does the same). Blocks larger
than ``max_block_size`` are split in topological order, which bounds the cost of exponential searches.
"""
from __future__ import annotations

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
