"""Schedulers (ios, lios, hios, exhaustive) on seeded random DAGs and structured synthetic graphs.

The central property: ``ios`` with r and s unbounded finds exactly the optimum of ``exhaustive`` (brute force,
written independently), under the simulated device and under the unit cost model.
"""
from __future__ import annotations

import itertools
import time

import pytest

from tvm_interop.passes.cost import UnitCostModel, get_cost_model
from tvm_interop.passes.graph import OpGraph, TensorInfo, Unit
from tvm_interop.passes.schedule import MERGE, Schedule
from tvm_interop.passes.schedulers import get_scheduler, schedule_graph
from tvm_interop.passes.schedulers.bitdag import LocalDAG, ideals, split_parts
from tvm_interop.passes.schedulers.ios_dp import ending_dp
from tvm_interop.passes.schedulers.options import SchedulerOptionError
from tvm_interop.passes.schedulers.stage_coster import StageCoster
from tvm_interop.passes.schedulers.result import SearchStats
from tvm_interop.passes.synthetic import inception_like, nasnet_like, random_dag, randwire_like, squeezenet_like, synthetic_model
from tvm_interop.runtime.errors import GraphError, InteropError

SIM = get_cost_model("sim:h100")
UNIT = UnitCostModel()
REL = 1e-9


def graphs(count: int, lo: int = 2, hi: int = 8, offset: int = 0):
    """Seeded random DAGs of lo..hi units, with sparse to dense edges, some disconnected."""
    for seed in range(offset, offset + count):
        n = lo + seed % (hi - lo + 1)
        p = (0.15, 0.3, 0.5, 0.7)[seed % 4]
        yield random_dag(n, seed, edge_prob=p, connected=seed % 5 != 0)


def close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * max(abs(a), abs(b), 1e-12)


# ------------------------------------------------------------------------------------------------ optimality
@pytest.mark.parametrize("cost", [SIM, UNIT], ids=["sim:h100", "unit"])
def test_ios_unbounded_equals_exhaustive(cost):
    checked = 0
    for g in graphs(200, 2, 8):
        ex = schedule_graph(g, "exhaustive", cost)
        io = schedule_graph(g, "ios", cost, r=None, s=None)
        assert close(io.predicted_latency, ex.predicted_latency), (g.name, io.predicted_latency, ex.predicted_latency)
        io.validate(g)
        ex.validate(g)
        checked += 1
    assert checked == 200


def test_ios_equals_exhaustive_without_bounds_and_merges():
    # the branch-and-bound and the merge strategy change nothing about optimality
    for g in graphs(30, 3, 7, offset=500):
        ex = schedule_graph(g, "exhaustive", SIM, merge=False)
        io = schedule_graph(g, "ios", SIM, r=None, s=None, merge=False, bound=False, guard=False)
        assert close(io.predicted_latency, ex.predicted_latency), g.name


def test_ios_pruned_properties():
    """r=3, s=8 (defaults): valid, never worse than greedy, sequential or lios; pruning is monotone."""
    chains = [[(1, 1), (1, 2), (2, 2), (3, 8), (None, None)],
              [(1, None), (2, None), (3, None), (None, None)],
              [(None, 1), (None, 2), (None, 4), (None, None)]]
    for cost in (SIM, UNIT, get_cost_model("sim:v100")):
        for g in graphs(60, 3, 9, offset=1000):
            io = schedule_graph(g, "ios", cost)
            io.validate(g)
            for base in ("greedy", "sequential", "lios"):
                other = schedule_graph(g, base, cost)
                assert io.predicted_latency <= other.predicted_latency * (1 + REL), (g.name, base, cost.name)
            for chain in chains:
                vals = [schedule_graph(g, "ios", cost, r=r, s=s).predicted_latency for r, s in chain]
                for tight, loose in zip(vals, vals[1:]):
                    assert loose <= tight * (1 + REL), (g.name, cost.name, chain, vals)


def test_ios_respects_pruning_without_guard():
    for g in graphs(40, 4, 9, offset=2000):
        for r, s in ((1, 1), (2, 2), (3, 8)):
            result = get_scheduler("ios")(g, SIM, r=r, s=s, guard=False)
            stages, stats = result.stages, result.stats
            assert result.unit_devices is None
            Schedule(stages).validate(g)
            for st in stages:
                if st.strategy != MERGE:
                    assert len(st.groups) <= s and all(len(grp) <= r for grp in st.groups)
            assert stats.states > 0 and stats.transitions > 0 and stats.stages_costed > 0


def test_every_legal_ending_is_enumerated_once():
    """The DP tries, at every state, exactly the endings a brute force finds (r, s pruning included) —
    including endings whose groups share descendants outside the ending."""
    for g in graphs(25, 3, 7, offset=3000):
        dag = LocalDAG(g, list(range(len(g))))
        states = ideals(dag)
        for r, s in ((None, None), (1, 2), (2, 2), (3, 8), (2, None), (None, 2)):
            stats = SearchStats()
            ending_dp(dag, StageCoster(UNIT, dag, stats), stats, r, s, merge=False, states=states)
            assert stats.transitions == sum(_brute_endings(dag, S, r, s) for S in states if S), (g.name, r, s)


def _brute_endings(dag: LocalDAG, S: int, r, s) -> int:
    count = 0
    members = [i for i in range(dag.n) if S >> i & 1]
    for k in range(1, len(members) + 1):
        for combo in itertools.combinations(members, k):
            E = sum(1 << i for i in combo)
            if any(dag.succ[i] & S & ~E for i in combo):
                continue  # an edge leaves E for the rest of S
            # connected components of E (undirected)
            comps, left = [], set(combo)
            while left:
                stack, comp = [left.pop()], 0
                while stack:
                    i = stack.pop()
                    comp |= 1 << i
                    for j in list(left):
                        if (dag.succ[i] | dag.pred[i]) >> j & 1:
                            left.discard(j)
                            stack.append(j)
                comps.append(comp.bit_count())
            if r is not None and max(comps) > r:
                continue
            if s is not None and not _packable(sorted(comps, reverse=True), r, s):
                continue
            count += 1
    return count


def _packable(sizes: list[int], r, s: int) -> bool:
    bins = [0] * s

    def place(i: int) -> bool:
        if i == len(sizes):
            return True
        tried = set()
        for b in range(s):
            if bins[b] in tried or (r is not None and bins[b] + sizes[i] > r):
                continue
            tried.add(bins[b])
            bins[b] += sizes[i]
            if place(i + 1):
                return True
            bins[b] -= sizes[i]
        return False

    return place(0)


def test_reference_ios_missed_ending():
    """a -> c <- b with a, b also feeding x, y: the ending {a, b, c} (one group) exists although no unit's
    descendants are exactly {a, b, c}; with tiny units and a large sync cost it is part of the optimum."""
    t = TensorInfo((1, 8, 4, 4))
    units = [Unit(n, "add", [t], [t], flops=0.0, bytes_moved=1e3) for n in ("p", "a", "b", "c", "x", "y")]
    g = OpGraph(units, [("p", "a"), ("p", "b"), ("a", "c"), ("b", "c"), ("a", "x"), ("b", "y")])
    lat = {"p": 1.0, "a": 1.0, "b": 1.0, "c": 1.0, "x": 5.0, "y": 5.0}
    cost = UnitCostModel(latency=lat)
    ex = schedule_graph(g, "exhaustive", cost)
    io = schedule_graph(g, "ios", cost, r=None, s=None)
    assert close(io.predicted_latency, ex.predicted_latency)


# ------------------------------------------------------------------------------------------------ merge
def _fan_out(k: int = 4, size: int = 7) -> OpGraph:
    """stem -> k small 1x1 convolutions of the stem's output -> concat: launch-bound, merging pays."""
    from tvm_interop.passes.synthetic import _Builder

    b = _Builder("fan_out")
    x = b.conv("stem", b.input(64, size), 64, k=1)
    heads = [b.conv(f"head{i}", x, 32, k=1) for i in range(k)]
    b.concat("cat", heads)
    return b.graph()


def test_ios_uses_merge_when_it_pays():
    g = _fan_out()
    sc = schedule_graph(g, "ios", SIM)
    sc.validate(g)
    merges = [st for st in sc.stages if st.strategy == MERGE]
    assert merges, sc.describe()
    for st in merges:
        data = {g.unit(n).attrs["data"] for n in st.units}
        assert len(data) == 1 and len(st.units) >= 2
    assert sc.predicted_latency < schedule_graph(g, "ios", SIM, merge=False).predicted_latency


# ------------------------------------------------------------------------------------------------ scale
def test_ios_on_wide_blocks_splits_into_parts():
    g = nasnet_like(cells=3)
    parts = split_parts(g, 200)
    assert len(parts) > 1 and all(len(ids) <= 200 for _, ids in parts)
    assert sorted(i for p, _ in parts for i in p) == list(range(len(g)))
    sc = schedule_graph(g, "ios", SIM, max_states=200)
    sc.validate(g)
    assert sc.predicted_latency <= schedule_graph(g, "greedy", SIM).predicted_latency * (1 + REL)


@pytest.mark.parametrize("make", [lambda: squeezenet_like(4), lambda: inception_like(2), lambda: randwire_like(16, stages=1)])
def test_structured_graphs(make):
    g = make()
    seq = schedule_graph(g, "sequential", SIM).predicted_latency
    for name in ("greedy", "lios", "hios", "ios"):
        sc = schedule_graph(g, name, SIM)
        sc.validate(g)
        assert sc.predicted_latency > 0
    assert schedule_graph(g, "ios", SIM).predicted_latency < seq


def test_lios_is_fast_on_large_graphs():
    g = synthetic_model("nasnet_a_large")
    assert len(g) > 800
    t0 = time.process_time()
    sc = schedule_graph(g, "lios", SIM)
    assert time.process_time() - t0 < 1.0
    sc.validate(g)
    assert max(len(st.groups) for st in sc.stages) <= 8
    assert schedule_graph(g, "lios", SIM, x=2).max_concurrency() <= 2


# ------------------------------------------------------------------------------------------------ hios
def test_hios_device_map():
    for g in list(graphs(20, 3, 9, offset=4000)) + [inception_like(2, batch=32)]:
        for M in (1, 2, 3):
            sc = schedule_graph(g, "hios", SIM, devices=M)
            sc.validate(g)
            assert set(sc.unit_devices) == {u.name for u in g.units}
            assert set(sc.unit_devices.values()) <= set(range(M))
            for st in sc.stages:  # a group never spans devices
                for grp in st.groups:
                    assert len({sc.unit_devices[n] for n in grp}) == 1
            if M == 1:
                assert set(sc.unit_devices.values()) == {0}


def test_hios_uses_devices_when_links_are_fast():
    g = inception_like(3, batch=32)
    one = schedule_graph(g, "hios", SIM, devices=1)
    two = schedule_graph(g, "hios", SIM, devices=2, link_bandwidth=3e12, link_latency=1e-6)
    assert len(set(two.unit_devices.values())) == 2
    assert two.predicted_latency < one.predicted_latency
    # the guard never returns a multi-device schedule slower than the one-device one
    slow = schedule_graph(g, "hios", SIM, devices=2, link_bandwidth=1e8)
    assert slow.predicted_latency <= one.predicted_latency * (1 + REL)


# ------------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("name,opts", [("ios", {"r": 0}), ("ios", {"s": 0}), ("ios", {"r": -2}), ("ios", {"s": 1.5}),
                                       ("ios", {"max_states": 0}), ("lios", {"x": 0}), ("hios", {"devices": 0}),
                                       ("hios", {"w": 0}), ("hios", {"link_bandwidth": 0}),
                                       ("hios", {"link_latency": -1}), ("exhaustive", {"max_units": 0})])
def test_bad_options_are_clear_errors(name, opts):
    g = random_dag(5, 1)
    with pytest.raises(SchedulerOptionError) as e:
        schedule_graph(g, name, SIM, **opts)
    assert isinstance(e.value, InteropError)
    assert next(iter(opts)).split("_")[0] in str(e.value)


@pytest.mark.parametrize("name,opts,hint", [("greedy", {"max_stream": 4}, "did you mean 'max_streams'"),
                                            ("ios", {"foo": 1}, "r=3, s=8"), ("lios", {"r": 2}, "x=None")])
def test_unknown_options_are_refused_with_the_valid_ones(name, opts, hint):
    """A mistyped option used to be swallowed by ``**_options``; now it names the scheduler and its options."""
    g = random_dag(5, 1)
    with pytest.raises(SchedulerOptionError, match=f"scheduler '{name}' has no option '{next(iter(opts))}'") as e:
        schedule_graph(g, name, SIM, **opts)
    assert hint in str(e.value)


def test_every_scheduler_returns_one_result_type():
    from tvm_interop.passes.schedulers import SchedulerResult, available_schedulers

    g = random_dag(7, 2)
    for name in available_schedulers():
        result = get_scheduler(name).schedule(g, SIM)
        assert isinstance(result, SchedulerResult), name
        Schedule(result.stages).validate(g)
        assert (result.unit_devices is not None) == (name == "hios"), name


def test_exhaustive_refuses_large_graphs():
    g = random_dag(14, 3, edge_prob=0.0, connected=False)
    with pytest.raises(SchedulerOptionError, match="max_units"):
        schedule_graph(g, "exhaustive", SIM)


def test_cyclic_graph_and_unknown_scheduler():
    t = TensorInfo((1, 4))
    units = [Unit(n, "add", [t], [t]) for n in "abc"]
    with pytest.raises(GraphError):
        OpGraph(units, [("a", "b"), ("b", "c"), ("c", "a")])
    with pytest.raises(InteropError):
        schedule_graph(random_dag(3, 0), "magic", SIM)


def test_disconnected_and_trivial_graphs():
    g = random_dag(7, 11, edge_prob=0.1, connected=False)
    assert not g.is_weakly_connected()
    for name in ("ios", "lios", "hios", "exhaustive"):
        schedule_graph(g, name, SIM).validate(g)
    one = random_dag(1, 0)
    for name in ("ios", "lios", "hios", "exhaustive", "greedy"):
        sc = schedule_graph(one, name, SIM)
        assert sc.num_stages == 1 and close(sc.predicted_latency, sc.sequential_latency)


# ------------------------------------------------------------------------------------------------ CLI
def test_schedule_command_json(capsys, tmp_path):
    import json

    from tvm_interop.cli import main

    out = tmp_path / "s.json"
    assert main(["schedule", "synthetic:squeezenet", "--scheduler", "ios", "--cost", "sim:h100", "--json",
                 "-o", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("model", "scheduler", "cost", "predicted_ms", "sequential_ms", "speedup", "num_stages"):
        assert key in d
    assert set(d["search"]) == {"states", "transitions", "stages_costed", "seconds"}
    assert d["cost"] == "sim:h100" and d["speedup"] > 1.0 and d["options"] == {"r": 3, "s": 8}
    assert Schedule.load(out).scheduler == "ios"
    assert main(["schedule", "synthetic:squeezenet", "--scheduler", "ios", "--r", "none", "--s", "2",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["options"] == {"r": None, "s": 2}
    assert main(["schedule", "synthetic:squeezenet", "--scheduler", "hios", "--devices", "0"]) == 1
    assert "devices" in capsys.readouterr().err
