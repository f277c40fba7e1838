"""Schedule units above kernels: chains of kernels contracted into one unit of the search.

Why: TVM fuses a model into kernels, not into the operators a person would schedule. A separable convolution is
two kernels (depthwise, pointwise), a RandWire node three (aggregation + ReLU, depthwise, pointwise), so the
scheduler sees 2-3x more units than IOS does (IOS Table 2: NASNet 374 operators, ours 748 kernels), and its
search space (down-sets of a block) grows exponentially with them. A kernel whose output feeds exactly one
kernel, which reads nothing else produced in the model, can never gain from running apart from it: the consumer
waits for it anyway, and nothing else waits for it. IOS's user-defined units ("Relu-SepConv") are such chains.

:func:`contract_chains` merges every maximal chain ``a -> b -> c`` (each inner edge: the producer has one
consumer, the consumer one producer) into one :class:`~passes.graph.Unit` of the search graph. The search runs on
that graph; :func:`expand_stages` turns its stages back into kernel stages (a chain's kernels stay in order in
its group), so lowering, memory planning, bundles and executors only ever see kernels. A chain of one kernel is
that kernel itself (same object), so a merge stage still sees real convolutions; a longer chain has kind
``chain`` and never merges.

Cost models are asked about kernels only: :class:`ChainCost` wraps a model and expands every chain before it
asks (a chain in a group is its kernels one after another in that group), so a cost table's stage entries, a
measured model's kernels and the simulated device's contention all see what will run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tvm_interop.runtime.errors import InteropError

from .cost import CostModel
from .graph import OpGraph, Unit
from .schedule import MERGE, Stage

GRANULARITIES = ("auto", "chain", "kernel")
DEFAULT_GRANULARITY = "auto"
CHAIN_KIND = "chain"


def check_granularity(value) -> str:
    """``value`` if it names a granularity, else an InteropError listing the valid ones."""
    if value not in GRANULARITIES:
        raise InteropError(f"unit_granularity must be one of {list(GRANULARITIES)} (schedule units: 'chain' "
                           "contracts single-consumer chains of kernels, 'kernel' schedules every kernel, 'auto' "
                           f"is 'chain' for the exact searches and 'kernel' for the others), got {value!r}")
    return value


@dataclass
class Contraction:
    """A search graph over chains and the kernels of each of its units (``members``, in execution order)."""

    graph: OpGraph
    members: dict[str, list[str]]
    kernels: OpGraph

    @property
    def contracted(self) -> bool:
        return len(self.graph) < len(self.kernels)

    def expand(self, names: Sequence[str]) -> list[str]:
        return [k for n in names for k in self.members[n]]


def chains(graph: OpGraph) -> list[list[int]]:
    """Maximal chains (unit indices, topological order): consecutive units joined by an edge whose producer has
    no other consumer and whose consumer no other producer. Every unit is in exactly one chain."""
    n = len(graph)
    head = [True] * n
    for i in range(n):
        if len(graph.succs[i]) == 1:
            j = graph.succs[i][0]
            if len(graph.preds[j]) == 1:
                head[j] = False
    out = []
    for i in range(n):
        if not head[i]:
            continue
        chain = [i]
        while len(graph.succs[chain[-1]]) == 1 and not head[graph.succs[chain[-1]][0]]:
            chain.append(graph.succs[chain[-1]][0])
        out.append(chain)
    return out


def chain_unit(kernels: Sequence[Unit]) -> Unit:
    """One search unit standing for ``kernels`` run in order (the kernel itself when there is one)."""
    if len(kernels) == 1:
        return kernels[0]
    return Unit(name="+".join(k.name for k in kernels), kind=CHAIN_KIND, inputs=list(kernels[0].inputs),
                outputs=list(kernels[-1].outputs), flops=float(sum(k.flops for k in kernels)),
                bytes_moved=float(sum(k.bytes_moved for k in kernels)), func_name="",
                attrs={"kernels": [k.name for k in kernels], "kinds": [k.kind for k in kernels]})


def contract_chains(graph: OpGraph) -> Contraction:
    """The search graph of ``graph`` with every chain as one unit (see the module docstring)."""
    groups = chains(graph)
    owner: dict[int, str] = {}
    units, members = [], {}
    for chain in groups:
        unit = chain_unit([graph.units[i] for i in chain])
        units.append(unit)
        members[unit.name] = [graph.units[i].name for i in chain]
        for i in chain:
            owner[i] = unit.name
    edges = {(owner[a], owner[b]) for b in range(len(graph)) for a in graph.preds[b] if owner[a] != owner[b]}
    return Contraction(OpGraph(units, edges, name=graph.name), members, graph)


def identity(graph: OpGraph) -> Contraction:
    """The contraction that changes nothing (``unit_granularity="kernel"``)."""
    return Contraction(graph, {u.name: [u.name] for u in graph.units}, graph)


def expand_stages(stages: Sequence[Stage], members: dict[str, list[str]]) -> list[Stage]:
    """Kernel stages from search-unit stages: each chain's kernels in order, in its group."""
    out = []
    for st in stages:
        if st.strategy == MERGE and any(len(members[n]) > 1 for g in st.groups for n in g):
            raise InteropError("a merge stage holds a chain of kernels; only single kernels merge")
        out.append(Stage([[k for n in g for k in members[n]] for g in st.groups], st.strategy))
    return out


class ChainCost(CostModel):
    """``cost`` asked about kernels: every chain unit is expanded into its kernels, in its group, in order.

    ``unit_latency`` of a chain is the latency of its kernels as one group (what the chain costs alone). The
    optional fast-path hooks of :class:`~passes.schedulers.stage_coster.StageCoster` are offered when ``cost``
    has them (see :func:`chain_cost`): a chain's token is the tuple of its kernels' tokens, flattened into its
    group before the wrapped model sees it.
    """

    def __init__(self, cost: CostModel, contraction: Contraction):
        self.inner = cost
        self.name = cost.name
        self._kernels = {n: [contraction.kernels.unit(k) for k in ks] for n, ks in contraction.members.items()}

    def kernels_of(self, unit: Unit) -> list[Unit]:
        return self._kernels.get(unit.name) or [unit]

    def unit_latency(self, unit: Unit) -> float:
        ks = self.kernels_of(unit)
        if len(ks) == 1:
            return self.inner.unit_latency(ks[0])
        return float(self.inner.stage_latency([ks]))

    def stage_latency(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> float:
        return self.inner.stage_latency([[k for u in g for k in self.kernels_of(u)] for g in groups], strategy)

    @property
    def device_fingerprint(self) -> str:
        return self.inner.device_fingerprint


class _ChainTokens(ChainCost):
    """:class:`ChainCost` for a model with the token hooks (e.g. ``LearnedCostModel``): the searches' fast path
    without building unit lists per stage."""

    def unit_token(self, unit: Unit) -> tuple:
        return tuple(self.inner.unit_token(k) for k in self.kernels_of(unit))

    def stage_latency_tokens(self, groups: tuple) -> float:
        return self.inner.stage_latency_tokens(tuple(tuple(t for chain in g for t in chain) for g in groups))


class _ChainTokenCost(_ChainTokens):
    """:class:`ChainCost` for a model with the token and bound hooks (e.g. ``SimulatedDevice``)."""

    def unit_bound_terms(self, unit: Unit) -> tuple[float, float]:
        terms = [self.inner.unit_bound_terms(k) for k in self.kernels_of(unit)]
        return (sum(t[0] for t in terms), sum(t[1] for t in terms))

    def concurrent_bound_params(self) -> tuple[float, float, float]:
        return self.inner.concurrent_bound_params()


def chain_cost(cost: CostModel, contraction: Contraction) -> CostModel:
    """``cost`` itself when nothing was contracted, else a :class:`ChainCost` (with the fast-path hooks when
    ``cost`` offers them)."""
    if not contraction.contracted:
        return cost
    tokens = all(hasattr(cost, h) for h in ("unit_token", "stage_latency_tokens"))
    bounds = all(hasattr(cost, h) for h in ("unit_bound_terms", "concurrent_bound_params"))
    cls = (_ChainTokenCost if bounds else _ChainTokens) if tokens else ChainCost
    return cls(cost, contraction)
