"""AutoGraph's flow-based partition: cut the graph where the fewest substitutions are lost.

Why: the substitution search is exponential in the number of places a rule applies, so it runs per subgraph; a
substitution whose operators fall in two subgraphs can no longer be found. AutoGraph gives every node a capacity
equal to the number of substitutions that touch it and cuts the graph recursively along minimum cuts, so cuts
go through nodes no rule cares about; adjacent small subgraphs are then merged back.

Each split is a minimum s-t *vertex* cut of the subgraph's DAG: the first quarter of its nodes (program order)
are sources, the last quarter sinks (attached before and after their own capacity, so every source-sink path
crosses a finite edge), every node ``v`` becomes ``v_in -> v_out`` with capacity
``capacity(v) * (n + 1) + 1`` (substitutions lost first, then the number of nodes cut), data edges are
uncuttable, and every edge ``u -> v`` also gets an uncuttable ``v_in -> u_out``, which makes the cut *convex*:
a node on the first side never reads a node on the second (the first side is then closed under "reads", for the
nodes no flow decides). Cut nodes go with the first side.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from tvm_interop.runtime.errors import InteropError

DEFAULT_MAX_NODES = 24
_INF = float("inf")


@dataclass
class Partition:
    """Subgraphs (lists of node names in program order) and what the cuts cost."""

    parts: list[list[str]]
    lost: int = 0                      # substitutions whose nodes fall in two or more parts
    cuts: int = 0                      # min cuts computed
    capacity: dict[str, int] = field(default_factory=dict)

    def stats(self) -> dict:
        sizes = [len(p) for p in self.parts]
        return {"parts": len(self.parts), "largest_part": max(sizes, default=0), "matches_lost_at_cuts": self.lost,
                "min_cuts": self.cuts}


class _FlowNetwork:
    """Edmonds-Karp max flow on a small graph (a few thousand edges)."""

    def __init__(self, n: int):
        self.adj: list[list[int]] = [[] for _ in range(n)]
        self.to: list[int] = []
        self.cap: list[float] = []

    def add(self, u: int, v: int, c: float) -> None:
        self.adj[u].append(len(self.to))
        self.to.append(v)
        self.cap.append(c)
        self.adj[v].append(len(self.to))
        self.to.append(u)
        self.cap.append(0.0)

    def max_flow(self, s: int, t: int) -> set[int]:
        """Run to the max flow; return the nodes reachable from ``s`` in the residual graph (the source side)."""
        while True:
            parent = {s: -1}
            queue = deque([s])
            while queue and t not in parent:
                u = queue.popleft()
                for e in self.adj[u]:
                    v = self.to[e]
                    if self.cap[e] > 0 and v not in parent:
                        parent[v] = e
                        queue.append(v)
            if t not in parent:
                return set(parent)
            push, v = _INF, t
            while v != s:
                e = parent[v]
                push = min(push, self.cap[e])
                v = self.to[e ^ 1]
            v = t
            while v != s:
                e = parent[v]
                self.cap[e] -= push
                self.cap[e ^ 1] += push
                v = self.to[e ^ 1]


def _split(names: list[str], preds: dict[str, list[str]], capacity: dict[str, int]) -> tuple[list[str], list[str]]:
    """One minimum convex vertex cut of ``names`` (program order) into (first, second)."""
    n = len(names)
    idx = {v: i for i, v in enumerate(names)}
    net = _FlowNetwork(2 * n + 2)
    s, t = 2 * n, 2 * n + 1
    quarter = max(1, n // 4)
    for i, v in enumerate(names):
        net.add(2 * i, 2 * i + 1, capacity.get(v, 0) * (n + 1) + 1)
        for u in preds.get(v, ()):
            if u in idx:
                j = idx[u]
                net.add(2 * j + 1, 2 * i, _INF)
                net.add(2 * i, 2 * j + 1, _INF)
        if i < quarter:
            net.add(s, 2 * i, _INF)
        elif i >= n - quarter:
            net.add(2 * i + 1, t, _INF)
    source_side = net.max_flow(s, t)
    # the first side: nodes whose input side the source reaches, closed under "reads" (a node that carries no
    # flow can sit on either side of a minimum cut; taking the closure keeps the split convex)
    chosen = {v for i, v in enumerate(names) if 2 * i in source_side}
    for v in reversed(names):
        if v in chosen:
            chosen.update(u for u in preds.get(v, ()) if u in idx)
    first = [v for v in names if v in chosen]
    second = [v for v in names if v not in chosen]
    if not first or not second:   # the cheapest cut took a whole side: split in program order (still convex)
        return names[:n // 2], names[n // 2:]
    return first, second


def flow_partition(names: Sequence[str], preds: dict[str, list[str]], matches: Sequence[Sequence[str]],
                   max_nodes: int = DEFAULT_MAX_NODES) -> Partition:
    """Partition the nodes ``names`` (program order; ``preds[v]`` the nodes ``v`` reads) into convex subgraphs of at
    most ``max_nodes`` nodes, cutting through as few substitution sites (``matches``: the node names of each
    applicable substitution) as possible, then merging adjacent subgraphs while they fit."""
    if max_nodes < 2:
        raise InteropError(f"autograph max_part_nodes must be >= 2, got {max_nodes}")
    capacity: dict[str, int] = {}
    for m in matches:
        for v in set(m):
            capacity[v] = capacity.get(v, 0) + 1
    cuts = 0
    parts: list[list[str]] = []
    todo = [list(names)]
    while todo:
        part = todo.pop()
        if len(part) <= max_nodes:
            parts.append(part)
            continue
        first, second = _split(part, preds, capacity)
        cuts += 1
        todo.extend([second, first])   # first is popped next: parts come out in program order
    merged: list[list[str]] = []
    for p in parts:
        if merged and len(merged[-1]) + len(p) <= max_nodes:
            merged[-1] = merged[-1] + p
        else:
            merged.append(p)
    where = {v: k for k, p in enumerate(merged) for v in p}
    lost = sum(1 for m in matches if len({where.get(v) for v in m}) > 1)
    return Partition(merged, lost, cuts, capacity)
