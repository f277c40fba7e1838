"""IOS's granularity: schedule units above kernels (chains contracted) and blocks at small frontiers.

Central properties, on seeded random DAGs: the contracted search equals the kernel-level search restricted to
schedules that keep every chain together in one group (brute force over the kernel graph with a cost that
forbids splitting a chain); blocks cover the graph in order, end at small frontiers and respect the state budget
where the graph allows it; every option mistake is a clear error.
"""
from __future__ import annotations

import pytest

from tvm_interop.passes.contract import (ChainCost, chain_cost, chains, check_granularity, contract_chains, expand_stages,
                             identity)
from tvm_interop.passes.cost import UnitCostModel, get_cost_model
from tvm_interop.passes.graph import OpGraph, TensorInfo, Unit
from tvm_interop.passes.partition import cut_points, frontier_blocks, frontier_sizes
from tvm_interop.passes.schedule import MERGE, Stage
from tvm_interop.passes.schedulers import get_scheduler, schedule_graph
from tvm_interop.passes.schedulers.latency import schedule_cost
from tvm_interop.passes.schedulers.bitdag import LocalDAG, ideals
from tvm_interop.passes.synthetic import nasnet_like, random_dag, randwire_like
from tvm_interop.runtime.errors import InteropError
from zoo_cases import zoo_params

SIM = get_cost_model("sim:h100")
UNIT = UnitCostModel()
T = TensorInfo((1, 16, 8, 8))


def _graph(edges: list[tuple[str, str]], names: str) -> OpGraph:
    return OpGraph([Unit(n, "conv2d" if n in "ab" else "add", [T], [T], flops=1e6 * (1 + ord(n) % 5))
                    for n in names], edges, name="g")


def _random(count: int, lo: int, hi: int, offset: int = 0):
    for seed in range(offset, offset + count):
        n = lo + seed % (hi - lo + 1)
        yield random_dag(n, seed, edge_prob=(0.15, 0.25, 0.4)[seed % 3], locality=3)


# ------------------------------------------------------------------------------------------------ chains
def test_chains_follow_single_consumer_single_producer_edges():
    #   a -> b -> c -> e,  b's only consumer is c, c's only producer is b; d -> e joins; e -> f
    g = _graph([("a", "b"), ("b", "c"), ("c", "e"), ("d", "e"), ("e", "f")], "abcdef")
    got = [[g.units[i].name for i in ch] for ch in chains(g)]
    assert sorted(got) == [["a", "b", "c"], ["d"], ["e", "f"]]
    con = contract_chains(g)
    assert len(con.graph) == 3 and con.contracted
    assert con.members["a+b+c"] == ["a", "b", "c"]
    assert con.graph.unit("d") is g.unit("d")                  # a one-kernel chain is the kernel itself
    assert con.graph.unit("a+b+c").kind == "chain"             # never a merge candidate
    assert sorted(con.graph.edges) == [("a+b+c", "e+f"), ("d", "e+f")]
    # a fan-out breaks a chain: a has two consumers
    g2 = _graph([("a", "b"), ("a", "c")], "abc")
    assert sorted(len(ch) for ch in chains(g2)) == [1, 1, 1]


@pytest.mark.parametrize("offset", [0, 100])
def test_contraction_partitions_the_kernels_into_dag_chains(offset):
    for g in _random(60, 2, 14, offset):
        con = contract_chains(g)
        flat = [k for ks in con.members.values() for k in ks]
        assert sorted(flat) == sorted(u.name for u in g.units)
        for ks in con.members.values():                         # a chain is a path of kernels
            for a, b in zip(ks, ks[1:]):
                assert g.succ_names(a) == [b] and g.pred_names(b) == [a]
        # contracted edges are exactly the kernel edges between different chains
        owner = {k: n for n, ks in con.members.items() for k in ks}
        want = {(owner[a], owner[b]) for a, b in g.edges if owner[a] != owner[b]}
        assert set(con.graph.edges) == want


def test_expanded_schedules_are_valid_and_keep_chains_together():
    for g in list(_random(40, 3, 12)) + [nasnet_like(cells=2), randwire_like(12, stages=1)]:
        for sched in ("ios", "greedy", "lios", "sequential"):
            s = schedule_graph(g, sched, SIM, unit_granularity="chain")
            s.validate(g)
            con = contract_chains(g)
            for ks in con.members.values():
                where = {(si, gi) for si, st in enumerate(s.stages) for gi, grp in enumerate(st.groups)
                         for k in grp if k in ks}
                assert len(where) == 1, (g.name, sched, ks)
                (si, gi), = where
                grp = s.stages[si].groups[gi]
                i = grp.index(ks[0])
                assert grp[i:i + len(ks)] == ks                 # contiguous, in order
            assert s.options["unit_granularity"] == "chain"


class _KeepChains(UnitCostModel):
    """A cost model with a penalty for every chain split over several groups: the brute force over kernels
    restricted to chain-keeping schedules. (The brute force orders a group's kernels by index, so it may
    interleave two chains of one group: the order inside a group does not change a unit-cost group's sum.)"""

    def __init__(self, inner, members):
        super().__init__()
        self.inner = inner
        self.chain_of = {k: tuple(ks) for ks in members.values() if len(ks) > 1 for k in ks}

    def unit_latency(self, unit):
        return self.inner.unit_latency(unit)

    def stage_latency(self, groups, strategy="concurrent"):
        penalty = 0.0
        for g in groups:
            names = {u.name for u in g}
            penalty += 1e3 * sum(1 for n in names if n in self.chain_of and not names >= set(self.chain_of[n]))
        return self.inner.stage_latency(groups, strategy) + penalty


@pytest.mark.parametrize("cost", [SIM, UNIT], ids=["sim:h100", "unit"])
def test_contracted_search_equals_kernel_search_restricted_to_chains(cost):
    """Exact for the unit cost model; under the simulated device the order of kernels inside a group changes
    contention slightly, so there the chained optimum is checked against ios and the unrestricted search."""
    exhaustive, ios = get_scheduler("exhaustive"), get_scheduler("ios")
    checked = 0
    for g in _random(80, 3, 8, offset=300):
        con = contract_chains(g)
        if not con.contracted:
            continue
        # one block each (no barriers): the search over chains, expanded, against the brute force over kernels
        # restricted to schedules that keep every chain together and in order
        chained = expand_stages(exhaustive(con.graph, chain_cost(cost, con), merge=False).stages, con.members)
        restricted = exhaustive(g, _KeepChains(cost, con.members), merge=False).stages
        free = exhaustive(g, cost, merge=False).stages
        got, want = schedule_cost(chained, g, cost), schedule_cost(restricted, g, cost)
        assert schedule_cost(restricted, g, _KeepChains(cost, con.members)) == pytest.approx(want, rel=1e-12)
        if cost is UNIT:
            assert abs(got - want) <= 1e-9 * max(got, want), (g.name, got, want)
        assert schedule_cost(free, g, cost) <= got * (1 + 1e-9)   # contraction can only restrict the space
        # and ios over chains (r, s unbounded) finds the same optimum
        io = expand_stages(ios(con.graph, chain_cost(cost, con), r=None, s=None, merge=False, guard=False).stages,
                           con.members)
        assert abs(schedule_cost(io, g, cost) - got) <= 1e-9 * got, g.name
        checked += 1
    assert checked >= 30


def test_chain_cost_asks_the_wrapped_model_about_kernels_only():
    g = _graph([("a", "b"), ("b", "c"), ("d", "c")], "abcd")
    con = contract_chains(g)
    assert set(con.members) == {"a+b", "c", "d"}
    asked = []

    class Spy(UnitCostModel):
        def stage_latency(self, groups, strategy="concurrent"):
            asked.append([[u.name for u in grp] for grp in groups])
            return super().stage_latency(groups, strategy)

    wrapped = chain_cost(Spy(), con)
    assert isinstance(wrapped, ChainCost)
    ab = con.graph.unit("a+b")
    assert wrapped.unit_latency(ab) == pytest.approx(UNIT.unit_latency(g.unit("a")) + UNIT.unit_latency(g.unit("b")))
    wrapped.stage_latency([[ab], [con.graph.unit("d")]])
    assert asked[-1] == [["a", "b"], ["d"]]
    assert chain_cost(UNIT, identity(g)) is UNIT               # nothing contracted: the model itself
    # the simulated device's fast path sees the flattened kernels: same numbers as asking with kernels
    fast = chain_cost(SIM, con)
    tokens = ((fast.unit_token(ab),), (fast.unit_token(con.graph.unit("d")),))
    assert fast.stage_latency_tokens(tokens) == pytest.approx(
        SIM.stage_latency([[g.unit("a"), g.unit("b")], [g.unit("d")]]))


class _TokenOnly(UnitCostModel):
    """A model with the searches' token hooks and no bound hooks, as the learned model of the device search's later
    rounds: a concurrent stage costs its slowest group plus a tenth of the others (deterministic, not additive)."""

    def unit_token(self, unit):
        return (unit.name, self.unit_latency(unit))

    def stage_latency_tokens(self, groups):
        sums = sorted((sum(t[1] for t in g) for g in groups), reverse=True)
        return sums[0] + 0.1 * sum(sums[1:])

    def stage_latency(self, groups, strategy="concurrent"):
        return self.stage_latency_tokens([[self.unit_token(u) for u in g] for g in groups if len(g)])


def test_a_model_with_tokens_but_no_bounds_keeps_the_fast_path_through_chains():
    """The learned model has tokens but no sharper bound: wrapped for chains it keeps the token path (the ios
    search of RandWire's learned rounds spent most of its time building unit lists without it), and the search
    finds the same schedules as through the plain wrapper."""
    model = _TokenOnly()
    ios = get_scheduler("ios")
    checked = 0
    for g in _random(40, 5, 9, offset=500):
        con = contract_chains(g)
        if not con.contracted:
            continue
        fast = chain_cost(model, con)
        assert hasattr(fast, "stage_latency_tokens") and not hasattr(fast, "concurrent_bound_params")
        slow = ChainCost(model, con)
        a = ios(con.graph, fast, r=None, s=None, merge=False, guard=False)
        b = ios(con.graph, slow, r=None, s=None, merge=False, guard=False)
        assert [st.groups for st in a.stages] == [st.groups for st in b.stages]
        assert schedule_cost(a.stages, con.graph, fast) == schedule_cost(b.stages, con.graph, slow)
        checked += 1
    assert checked >= 10


def test_a_merge_stage_of_a_chain_is_refused():
    members = {"a+b": ["a", "b"], "c": ["c"]}
    assert expand_stages([Stage([["a+b"], ["c"]])], members)[0].groups == [["a", "b"], ["c"]]
    with pytest.raises(InteropError, match="only single kernels merge"):
        expand_stages([Stage([["a+b"], ["c"]], MERGE)], members)


# ------------------------------------------------------------------------------------------------ blocks
def test_frontier_sizes_count_tensors_live_across_each_position():
    # a -> b, a -> c, b -> d, c -> d: after a 1 live (a), after b 2 (a, b), after c 2 (b, c), after d 0
    g = _graph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")], "abcd")
    assert frontier_sizes(g) == [1, 2, 2, 0]
    assert cut_points(g) == [0, 3]


@pytest.mark.parametrize("k,budget", [(1, 8), (2, 16), (2, 64), (3, 32)])
def test_frontier_blocks_cover_the_graph_within_budget(k, budget):
    for g in list(_random(40, 6, 22, offset=700)) + [nasnet_like(cells=3)]:
        blocks = frontier_blocks(g, k, budget)
        flat = [n for b in blocks for n in b.units]
        assert flat == [u.name for u in g.units]               # in topological order, each unit once
        front = frontier_sizes(g)
        cuts = set(cut_points(g))
        for b in blocks[:-1]:
            end = g.index[b.units[-1]]
            assert front[end] <= k or end in cuts               # a barrier only at a small frontier
        for b in blocks:
            sub = g.subgraph(b.units)
            found = ideals(LocalDAG(sub, range(len(sub))), limit=budget)
            if b.states is not None:
                assert found is not None and b.states == len(found) <= budget
            else:                                               # over budget only where no small frontier helped
                assert found is None
                inner = [g.index[n] for n in b.units[:-1]]
                assert not any(front[i] <= k for i in inner[1:])


def test_nasnet_like_cells_become_blocks_and_the_search_stays_exact():
    g = nasnet_like(cells=6)
    s = schedule_graph(g, "ios", SIM, guard=False)
    blocks = s.search["blocks"]
    assert len(blocks) >= 6                                    # about one block per cell
    assert all(b["states"] is not None and b["states"] <= 4096 for b in blocks)
    assert sum(b["kernels"] for b in blocks) == len(g)
    assert s.search["schedule_units"] == sum(b["units"] for b in blocks) < len(g)
    lios = schedule_graph(g, "lios", SIM)
    assert s.predicted_latency <= lios.predicted_latency * (1 + 1e-9)


def test_heuristic_schedulers_keep_kernels_and_cut_points_by_default():
    g = nasnet_like(cells=3)
    for name in ("greedy", "lios", "sequential"):
        s = schedule_graph(g, name, SIM)
        assert s.options["unit_granularity"] == "kernel"
        assert s.search["schedule_units"] == len(g)
    assert schedule_graph(g, "ios", SIM).options["unit_granularity"] == "chain"


# ------------------------------------------------------------------------------------------------ bad options
@pytest.mark.parametrize("opts,match", [
    ({"unit_granularity": "op"}, "unit_granularity must be one of"),
    ({"unit_granularity": None}, "unit_granularity must be one of"),
    ({"max_frontier": 0}, "max_frontier must be >= 1"),
    ({"max_block_states": 1}, "max_block_states must be >= 2"),
])
def test_bad_granularity_options_are_clear_errors(opts, match):
    with pytest.raises(InteropError, match=match):
        schedule_graph(nasnet_like(cells=2), "ios", SIM, **opts)


def test_check_granularity_lists_the_choices():
    assert check_granularity("kernel") == "kernel"
    with pytest.raises(InteropError, match=r"\['auto', 'chain', 'kernel'\]"):
        check_granularity("block")


def test_schedule_command_reports_blocks(capsys):
    import json

    from tvm_interop.cli import main

    assert main(["schedule", "synthetic:inception_v3", "--scheduler", "ios", "--cost", "sim:h100", "--json",
                 "--quiet"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["unit_granularity"] == "chain" and d["schedule_units"] < d["units"]
    assert len(d["blocks"]) >= 10 and sum(b["kernels"] for b in d["blocks"]) == d["units"]
    assert all(set(b) >= {"units", "kernels", "states", "frontier"} for b in d["blocks"])
    assert main(["schedule", "synthetic:inception_v3", "--scheduler", "ios", "--granularity", "kernel",
                 "--max-frontier", "3", "--max-block-states", "512", "--json", "--quiet"]) == 0
    k = json.loads(capsys.readouterr().out)
    assert k["unit_granularity"] == "kernel" and k["schedule_units"] == k["units"]
    assert k["options"] == {"r": 3, "s": 8, "unit_granularity": "kernel", "max_frontier": 3, "max_block_states": 512}
    assert main(["schedule", "synthetic:squeezenet", "--scheduler", "ios", "--max-frontier", "0"]) == 1
    assert "max_frontier must be >= 1" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ numerics
@pytest.mark.parametrize("name", zoo_params())
def test_zoo_models_scheduled_over_chains_match_plain_tvm(name):
    """ios over schedule units (chains contracted, frontier blocks) on every zoo model equals plain tvm.compile,
    in stage and dependency modes; the schedule the build used really kept its chains together."""
    import numpy as np

    import tvm_interop
    from tvm_interop.runtime.model import ScheduledModel
    from zoo_cases import zoo_case

    mod, x, ref = zoo_case(name)
    cm = tvm_interop.compile(mod, scheduler="ios", cost="sim:h100", name=name, max_memory_ratio=None, guard=False)
    try:
        s = cm.schedule
        assert s.options["unit_granularity"] == "chain"
        con = contract_chains(cm.graph)
        assert s.search["schedule_units"] == len(con.graph)
        for ks in con.members.values():
            assert len({gi for st in s.stages for gi, g in enumerate(st.groups) if ks[0] in g and set(ks) <= set(g)}) == 1
        for executor, mode in (("vm", "stage"), ("threads", "dependency")):
            runner = ScheduledModel(cm.runner.library, executor=executor, mode=mode)
            out = runner.run(x)
            runner.close()
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=f"{name} {executor}/{mode}")
    finally:
        cm.close()


def test_frontier_blocks_are_the_best_choice_of_barriers():
    """Brute force over every set of small-frontier barriers (cut points always barriers; a block may exceed the
    budget only when it holds no small-frontier position to cut at): the fewest blocks over the budget, then the
    fewest blocks, then the most down-sets in total."""
    import itertools

    def key(blocks, g, budget, free=()):
        over, total = 0, 0
        for b in blocks:
            sub = g.subgraph(b)
            found = ideals(LocalDAG(sub, range(len(sub))), limit=budget)
            if found is None and any(g.index[name] in free for name in b[:-1]):
                return None                      # could have been cut: not a legal choice
            over += found is None
            total += len(found) if found is not None else 0
        return (over, len(blocks), -total)

    checked = 0
    for g in _random(40, 5, 12, offset=900):
        k, budget = 2, 6
        front = frontier_sizes(g)
        cuts = set(cut_points(g))
        n = len(g)
        free = [p for p in range(n - 1) if front[p] <= k and p not in cuts]
        if len(free) > 10:
            continue
        best = None
        for r in range(len(free) + 1):
            for chosen in itertools.combinations(free, r):
                ends = sorted(set(chosen) | cuts | {n - 1})
                blocks, s = [], 0
                for e in ends:
                    blocks.append([u.name for u in g.units[s:e + 1]])
                    s = e + 1
                kk = key(blocks, g, budget, set(free))
                if kk is not None:
                    best = kk if best is None or kk < best else best
        got = key([b.units for b in frontier_blocks(g, k, budget)], g, budget)
        assert got == best, (g.name, got, best)
        checked += 1
    assert checked >= 20
