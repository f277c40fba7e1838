"""RandWire-WS (small regime).

Xie, Kirillov, Girshick, He, "Exploring Randomly Wired Neural Networks for Image Recognition", ICCV 2019
(arXiv:1904.01569), Section 3 and Table 1 (small computation regime), with the Watts-Strogatz generator
WS(K=4, P=0.75), N=32 nodes per stage and C=78.

Random graphs: :func:`watts_strogatz_edges` is the project's own implementation of the Watts-Strogatz
model (the same algorithm as ``networkx.watts_strogatz_graph``: a ring lattice where each node is joined
to its K/2 neighbours on either side, then, going around the ring once per neighbour offset, every
clockwise edge (u, u+j) is rewired with probability P to (u, w) with w chosen uniformly, avoiding
self-loops and duplicates), driven by ``numpy.random.default_rng``. The undirected graph is made a DAG
by orienting every edge from the smaller to the larger node index (paper, Sec. 3.1). A unique input
node feeds every node without predecessors and a unique output node averages every node without
successors (paper, Sec. 3.2). Each stage draws its own graph from ``default_rng([seed, stage])``.

Node operation (paper, Sec. 3.2): aggregation = weighted sum of the inputs with positive weights
(sigmoid of a random weight, folded to constants) -> ReLU -> 3x3 separable conv (3x3 depthwise, then
1x1) -> BN (folded into the 1x1 conv). Nodes fed by the stage input use stride 2 (the paper: "the nodes
that are directly connected to the input node" - in an index-ordered DAG this always includes node 0)
and have a single input (no aggregation weight).

Network (Table 1, small regime, 224 px):

* conv1: 3x3/2 conv, C/2 channels, BN
* conv2: ReLU -> 3x3/2 conv, C channels, BN (a single conv in the small regime)
* conv3, conv4, conv5: random-graph stages with N nodes and C, 2C, 4C channels (each halves the
  resolution)
* classifier: ReLU -> 1x1 conv 1280 -> BN -> ReLU, global average pool, fully connected.

``depth`` sets N (nodes per stage, default 32; at least K+1 = 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .layers import NetBuilder, T

N_NODES = 32
K = 4
P = 0.75
C = 78
DEFAULT_IMAGE_SIZE = 224
MIN_IMAGE_SIZE = 1


def watts_strogatz_edges(n: int, k: int, p: float, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Undirected Watts-Strogatz small-world graph as a sorted list of edges (u, v), u < v."""
    if k % 2 or k < 2:
        raise ValueError(f"Watts-Strogatz K must be even and >= 2, got {k}")
    if not n > k:
        raise ValueError(f"Watts-Strogatz needs N > K, got N={n}, K={k}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"Watts-Strogatz P must be in [0, 1], got {p}")
    adj: list[set[int]] = [set() for _ in range(n)]
    for j in range(1, k // 2 + 1):
        for u in range(n):
            v = (u + j) % n
            adj[u].add(v)
            adj[v].add(u)
    for j in range(1, k // 2 + 1):
        for u in range(n):
            v = (u + j) % n
            if rng.random() < p:
                w = int(rng.integers(n))
                skip = False
                while w == u or w in adj[u]:
                    if len(adj[u]) >= n - 1:
                        skip = True  # u is connected to everyone: no rewiring possible
                        break
                    w = int(rng.integers(n))
                if not skip:
                    adj[u].discard(v)
                    adj[v].discard(u)
                    adj[u].add(w)
                    adj[w].add(u)
    return sorted((u, v) for u in range(n) for v in adj[u] if u < v)


@dataclass
class RandomDAG:
    """A stage graph: nodes 0..n-1, edges oriented from the smaller to the larger index."""

    n: int
    edges: list[tuple[int, int]]
    preds: list[list[int]] = field(default_factory=list)
    succs: list[list[int]] = field(default_factory=list)

    def __post_init__(self):
        self.preds = [[] for _ in range(self.n)]
        self.succs = [[] for _ in range(self.n)]
        for u, v in self.edges:
            a, b = min(u, v), max(u, v)
            self.preds[b].append(a)
            self.succs[a].append(b)
        for lst in self.preds + self.succs:
            lst.sort()

    @property
    def input_nodes(self) -> list[int]:
        """Nodes without predecessors: fed by the unique stage input node."""
        return [i for i in range(self.n) if not self.preds[i]]

    @property
    def output_nodes(self) -> list[int]:
        """Nodes without successors: averaged by the unique stage output node."""
        return [i for i in range(self.n) if not self.succs[i]]


def random_graph(n: int = N_NODES, k: int = K, p: float = P, seed=0) -> RandomDAG:
    """Seeded WS(n, k, p) graph as an index-ordered DAG. ``seed`` is anything ``default_rng`` accepts."""
    rng = np.random.default_rng(seed)
    return RandomDAG(n, watts_strogatz_edges(n, k, p, rng))


def _stage(nb: NetBuilder, x: T, graph: RandomDAG, channels: int) -> T:
    outs: dict[int, T] = {}
    for node in range(graph.n):  # index order is a topological order
        preds = graph.preds[node]
        if not preds:
            agg, stride = x, 2
        else:
            ws = 1.0 / (1.0 + np.exp(-nb.rng.standard_normal(len(preds))))
            agg = nb.weighted_sum([outs[p] for p in preds], ws)
            stride = 1
        outs[node] = nb.sep_conv(nb.relu(agg), channels, 3, stride, 1)
    return nb.mean_of([outs[i] for i in graph.output_nodes])


def body(nb: NetBuilder, x: T, depth: int | None = None) -> T:
    n = N_NODES if depth is None else depth
    x = nb.conv(x, nb.ch(C / 2), 3, 2, 1)
    x = nb.conv(nb.relu(x), nb.ch(C), 3, 2, 1)
    for stage, mult in enumerate((1, 2, 4)):
        graph = random_graph(n, K, P, seed=[nb.seed, stage])
        x = _stage(nb, x, graph, nb.ch(C * mult))
    x = nb.conv(nb.relu(x), nb.ch(1280), 1, relu=True)
    x = nb.global_avg_pool(x)
    return nb.dense(x, nb.num_classes)
