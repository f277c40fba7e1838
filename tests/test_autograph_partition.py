"""AutoGraph's flow partition and mixed critical-path estimate, on plain graphs (no TVM build)."""
from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest

from tvm_interop.passes.autograph.estimate import estimate_kernels, mixed_critical_path
from tvm_interop.passes.autograph.flow_partition import flow_partition
from tvm_interop.passes.cost.simulated import SimulatedDevice
from tvm_interop.runtime.errors import InteropError


def _random_dag(n: int, seed: int):
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(n)]
    preds = {v: sorted({names[j] for j in (rng.randrange(i) for _ in range(rng.randint(1, 2)))}) if i else []
             for i, v in enumerate(names)}
    return names, preds


def _check_partition(names, preds, parts, max_nodes):
    flat = [v for p in parts for v in p]
    assert sorted(flat) == sorted(names), "every node in exactly one part"
    assert all(1 <= len(p) <= max_nodes for p in parts)
    where = {v: k for k, p in enumerate(parts) for v in p}
    for v, ps in preds.items():
        for u in ps:
            assert where[u] <= where[v], f"{u} -> {v} goes from part {where[u]} back to part {where[v]}"


@pytest.mark.parametrize("seed", range(6))
def test_parts_are_convex_bounded_and_cover_the_graph(seed):
    names, preds = _random_dag(120, seed)
    rng = random.Random(seed)
    matches = [tuple(rng.sample(names, 2)) for _ in range(40)]
    part = flow_partition(names, preds, matches, max_nodes=16)
    _check_partition(names, preds, part.parts, 16)
    assert part.cuts >= 1
    where = {v: k for k, p in enumerate(part.parts) for v in p}
    assert part.lost == sum(1 for m in matches if len({where[v] for v in m}) > 1)


def _two_clusters(k: int):
    """Two clusters of ``k`` parallel branches each, joined by one node ``mid`` that no substitution touches."""
    names, preds, matches = ["in"], {"in": []}, []
    for c, src in (("a", "in"), ("b", "mid")):
        branch = [f"{c}{i}" for i in range(k)]
        for v in branch:
            names.append(v)
            preds[v] = [src]
        matches += list(itertools.combinations(branch, 2))
        join = f"{c}_join"
        names.append(join)
        preds[join] = branch
        if c == "a":
            names.append("mid")
            preds["mid"] = [join]
    return names, preds, matches


def test_min_cut_goes_through_the_nodes_no_substitution_touches():
    names, preds, matches = _two_clusters(6)
    part = flow_partition(names, preds, matches, max_nodes=10)
    _check_partition(names, preds, part.parts, 10)
    assert part.lost == 0, part.parts     # the cut is at "mid"/the joins, never inside a cluster
    assert part.capacity["a0"] == 5 and "mid" not in part.capacity


def test_adjacent_small_parts_merge_back_and_small_graphs_stay_whole():
    names, preds = _random_dag(10, 0)
    assert flow_partition(names, preds, [], max_nodes=24).parts == [names]
    with pytest.raises(InteropError, match="max_part_nodes"):
        flow_partition(names, preds, [], max_nodes=1)


def _node(name, op, inputs, shape, flops):
    return SimpleNamespace(name=name, op=op, inputs=tuple(inputs), shape=shape, dtype="float32", attrs={},
                           flops=flops)


def test_estimate_fuses_epilogues_and_prices_parallel_branches_below_their_sum():
    conv_flops = 2 * 64 * 32 * 32 * 64 * 9
    nodes = [
        _node("c1", "relax.nn.conv2d", ["x"], (1, 64, 32, 32), conv_flops),
        _node("b1", "relax.add", ["c1"], (1, 64, 32, 32), 64 * 32 * 32),
        _node("r1", "relax.nn.relu", ["b1"], (1, 64, 32, 32), 64 * 32 * 32),
        _node("c2", "relax.nn.conv2d", ["x"], (1, 64, 32, 32), conv_flops),
        _node("r2", "relax.nn.relu", ["c2"], (1, 64, 32, 32), 64 * 32 * 32),
        _node("sum", "relax.add", ["r1", "r2"], (1, 64, 32, 32), 64 * 32 * 32),
    ]
    est = estimate_kernels(nodes, {"x": (1, 64, 32, 32)})
    assert len(est.units) == 2            # conv+bias+relu+add(branch), conv+relu: TVM's fusion, roughly
    assert est.units[0].flops == conv_flops + 3 * 64 * 32 * 32
    assert est.units[1].flops == conv_flops + 64 * 32 * 32
    assert est.group == [0, 0, 0, 1, 1, 0] and est.first == [True, False, False, True, False, False]
    assert (64 * 64 * 9,) in [t.shape for t in est.units[0].inputs]    # the weight, recovered from the FLOPs
    dev = SimulatedDevice("h100")
    serial = sum(dev.unit_latency(u) for u in est.units)
    # the branch add is fused into c1's kernel, so that kernel waits for c2's: no overlap left
    assert mixed_critical_path(est, dev, alpha=1.0) == pytest.approx(serial)
    assert mixed_critical_path(est, dev, alpha=0.0) <= serial
    # joined by a concat instead (its own kernel), the two small convs overlap on the device
    nodes = nodes[:5] + [_node("cat", "relax.concat", ["r1", "r2"], (1, 128, 32, 32), 0)]
    est = estimate_kernels(nodes, {"x": (1, 64, 32, 32)})
    assert len(est.units) == 3
    convs = sum(dev.unit_latency(u) for u in est.units[:2])
    parallel = mixed_critical_path(est, dev, alpha=1.0)
    assert parallel < convs
    assert mixed_critical_path(est, dev, alpha=0.0) < mixed_critical_path(est, dev, alpha=1.0) * 2


def test_estimate_sees_no_gain_in_splitting_a_kernel_that_fills_the_device():
    """Two halves of a convolution that already fills the GPU share it: the split costs a launch more, where the
    plain longest path would have priced the halves side by side at full speed."""
    big = 2 * 256 * 64 * 64 * 256 * 9
    whole = [_node("c", "relax.nn.conv2d", ["x"], (1, 256, 64, 64), big)]
    halves = [_node("c1", "relax.nn.conv2d", ["x"], (1, 128, 64, 64), big // 2),
              _node("c2", "relax.nn.conv2d", ["x"], (1, 128, 64, 64), big // 2),
              _node("cat", "relax.concat", ["c1", "c2"], (1, 256, 64, 64), 0)]
    dev = SimulatedDevice("h100")
    shapes = {"x": (1, 256, 64, 64)}
    for alpha in (0.0, 0.5, 1.0):
        assert mixed_critical_path(estimate_kernels(halves, shapes), dev, alpha) > \
            mixed_critical_path(estimate_kernels(whole, shapes), dev, alpha)
