"""The operator graph (OpGraph): what every scheduler and cost model works on.

It is a plain Python object, independent of how it was built (from a Relax module by ``passes.extract`` or
synthesised by a test), so schedulers and cost models can be studied on random DAGs without TVM.
Units are kept in a topological order; ``index`` of a unit is its position in that order.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from tvm_interop.runtime.errors import GraphError


@dataclass(frozen=True)
class TensorInfo:
    """Shape and dtype of one tensor a unit reads or writes."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        bits = int("".join(ch for ch in self.dtype if ch.isdigit()) or 32)
        return self.numel * max(1, bits // 8)

    def to_json(self) -> dict:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict) -> "TensorInfo":
        return TensorInfo(tuple(int(x) for x in d["shape"]), str(d["dtype"]))


@dataclass
class Unit:
    """One schedulable operator: by default one fused ``call_tir`` binding of Relax ``main``.

    ``kind`` is the leading operator of the fused kernel (``conv2d``, ``max_pool2d``, ``add``, ...); it is what
    the merge strategy compares. ``attrs`` carries operator details a scheduler or cost model may use (for a
    convolution: ``data`` — the name of the tensor it reads — ``weight_shape``, ``strides``, ``padding``,
    ``dilation``, ``groups``). ``func_name`` names the PrimFunc that implements it (several units may share one).
    """

    name: str
    kind: str
    inputs: list[TensorInfo] = field(default_factory=list)
    outputs: list[TensorInfo] = field(default_factory=list)
    flops: float = 0.0
    bytes_moved: float = 0.0
    func_name: str = ""
    attrs: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "func_name": self.func_name,
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "flops": self.flops,
            "bytes_moved": self.bytes_moved,
            "attrs": self.attrs,
        }

    @staticmethod
    def from_json(d: dict) -> "Unit":
        return Unit(
            name=d["name"],
            kind=d["kind"],
            inputs=[TensorInfo.from_json(t) for t in d.get("inputs", [])],
            outputs=[TensorInfo.from_json(t) for t in d.get("outputs", [])],
            flops=float(d.get("flops", 0.0)),
            bytes_moved=float(d.get("bytes_moved", 0.0)),
            func_name=d.get("func_name", ""),
            attrs=dict(d.get("attrs", {})),
        )


class OpGraph:
    """A DAG of units. Construction checks that edges name known units and that there is no cycle.

    ``edges`` are (producer name, consumer name) pairs. Units are re-ordered topologically (stable with respect
    to the given order), so ``units[i]`` may only depend on ``units[j]`` with ``j < i``.
    """

    # what one unit stands for: "kernel", or "chain" for a search graph of contracted chains (passes.contract);
    # searches whose cost grows with the endings per state size their budgets by it
    schedule_units: str = "kernel"

    def __init__(self, units: Sequence[Unit], edges: Iterable[tuple[str, str]], name: str = "graph"):
        self.name = name
        by_name: dict[str, Unit] = {}
        for u in units:
            if u.name in by_name:
                raise GraphError(f"duplicate unit name {u.name!r} in graph {name!r}")
            by_name[u.name] = u
        edge_set: set[tuple[str, str]] = set()
        for a, b in edges:
            if a not in by_name or b not in by_name:
                missing = a if a not in by_name else b
                raise GraphError(f"edge ({a!r} -> {b!r}) names unknown unit {missing!r} in graph {name!r}")
            if a == b:
                raise GraphError(f"self-loop on unit {a!r} in graph {name!r}")
            edge_set.add((a, b))
        order = _topological_order([u.name for u in units], edge_set, name)
        self.units: list[Unit] = [by_name[n] for n in order]
        self.index: dict[str, int] = {u.name: i for i, u in enumerate(self.units)}
        n = len(self.units)
        self.preds: list[list[int]] = [[] for _ in range(n)]
        self.succs: list[list[int]] = [[] for _ in range(n)]
        for a, b in sorted(edge_set, key=lambda e: (self.index[e[0]], self.index[e[1]])):
            self.preds[self.index[b]].append(self.index[a])
            self.succs[self.index[a]].append(self.index[b])

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.units)

    def __iter__(self):
        return iter(self.units)

    def unit(self, name: str) -> Unit:
        try:
            return self.units[self.index[name]]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no unit {name!r}") from None

    @property
    def edges(self) -> list[tuple[str, str]]:
        return [(self.units[a].name, self.units[b].name) for b in range(len(self)) for a in self.preds[b]]

    def pred_names(self, name: str) -> list[str]:
        return [self.units[j].name for j in self.preds[self.index[name]]]

    def succ_names(self, name: str) -> list[str]:
        return [self.units[j].name for j in self.succs[self.index[name]]]

    def pred_masks(self) -> list[int]:
        """Bit masks of direct predecessors, one per unit (bit i = unit index i); used by the searches."""
        return [sum(1 << j for j in p) for p in self.preds]

    def succ_masks(self) -> list[int]:
        return [sum(1 << j for j in s) for s in self.succs]

    def ancestor_masks(self) -> list[int]:
        """Bit masks of every unit each unit depends on, transitively (units are in topological order)."""
        anc = [0] * len(self.units)
        for i, preds in enumerate(self.preds):
            for p in preds:
                anc[i] |= anc[p] | (1 << p)
        return anc

    def descendant_masks(self) -> list[int]:
        """Bit masks of every unit reachable from each unit (units are in topological order)."""
        desc = [0] * len(self.units)
        for i in reversed(range(len(self.units))):
            for s in self.succs[i]:
                desc[i] |= desc[s] | (1 << s)
        return desc

    def is_weakly_connected(self) -> bool:
        if not self.units:
            return True
        seen = {0}
        stack = [0]
        while stack:
            i = stack.pop()
            for j in self.preds[i] + self.succs[i]:
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        return len(seen) == len(self.units)

    def require_connected(self) -> None:
        if not self.is_weakly_connected():
            raise GraphError(f"graph {self.name!r} is disconnected; schedule each component separately")

    def subgraph(self, names: Iterable[str], name: str | None = None) -> "OpGraph":
        """The induced sub-DAG on ``names`` (edges from outside are dropped: those inputs are ready)."""
        keep = set(names)
        for n in keep:
            if n not in self.index:
                raise GraphError(f"graph {self.name!r} has no unit {n!r}")
        units = [u for u in self.units if u.name in keep]
        edges = [(a, b) for (a, b) in self.edges if a in keep and b in keep]
        return OpGraph(units, edges, name=name or f"{self.name}[{len(units)}]")

    def total_flops(self) -> float:
        return float(sum(u.flops for u in self.units))

    def fingerprint(self) -> str:
        """A stable hash of structure and shapes: a schedule records it so it cannot be applied elsewhere."""
        payload = {
            "units": [[u.name, u.kind, [t.to_json() for t in u.inputs], [t.to_json() for t in u.outputs]]
                      for u in self.units],
            "edges": sorted(self.edges),
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {"name": self.name, "units": [u.to_json() for u in self.units], "edges": self.edges}

    @staticmethod
    def from_json(d: dict) -> "OpGraph":
        return OpGraph([Unit.from_json(u) for u in d["units"]], [tuple(e) for e in d["edges"]], d.get("name", "graph"))

    def __repr__(self) -> str:
        return f"OpGraph({self.name!r}, units={len(self.units)}, edges={sum(len(p) for p in self.preds)})"


def _topological_order(names: list[str], edges: set[tuple[str, str]], graph_name: str) -> list[str]:
    """Kahn's algorithm, picking ready units in their given order so the result is deterministic."""
    pos = {n: i for i, n in enumerate(names)}
    indeg = {n: 0 for n in names}
    out: dict[str, list[str]] = {n: [] for n in names}
    for a, b in edges:
        indeg[b] += 1
        out[a].append(b)
    import heapq

    ready = [(pos[n], n) for n in names if indeg[n] == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        _, n = heapq.heappop(ready)
        order.append(n)
        for m in out[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                heapq.heappush(ready, (pos[m], m))
    if len(order) != len(names):
        cyclic = sorted(n for n in names if indeg[n] > 0)
        raise GraphError(f"graph {graph_name!r} has a cycle through units {cyclic[:8]}")
    return order
