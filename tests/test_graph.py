import pytest

from tvm_interop.passes.graph import OpGraph, TensorInfo, Unit
from tvm_interop.passes.partition import cut_points, partition
from tvm_interop.runtime.errors import GraphError


def diamond():
    us = [Unit(n, "conv2d", flops=1e6) for n in "abcde"]
    return OpGraph(us, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")], name="diamond")


def test_topological_order_and_queries():
    g = OpGraph([Unit("z", "add"), Unit("y", "add"), Unit("x", "add")], [("x", "y"), ("y", "z")])
    assert [u.name for u in g.units] == ["x", "y", "z"]
    assert g.pred_names("z") == ["y"] and g.succ_names("x") == ["y"]
    assert g.edges == [("x", "y"), ("y", "z")]


def test_cycle_and_bad_edges_are_refused():
    us = [Unit("a", "add"), Unit("b", "add")]
    with pytest.raises(GraphError, match="cycle"):
        OpGraph(us, [("a", "b"), ("b", "a")])
    with pytest.raises(GraphError, match="unknown unit 'q'"):
        OpGraph(us, [("a", "q")])
    with pytest.raises(GraphError, match="duplicate"):
        OpGraph([Unit("a", "add"), Unit("a", "add")], [])


def test_connectivity_and_subgraph():
    g = diamond()
    assert g.is_weakly_connected()
    sub = g.subgraph(["b", "c", "d"])
    assert len(sub) == 3 and sub.edges == [("b", "d"), ("c", "d")]
    g2 = OpGraph([Unit("a", "add"), Unit("b", "add")], [])
    with pytest.raises(GraphError, match="disconnected"):
        g2.require_connected()


def test_fingerprint_changes_with_structure_and_shapes():
    g = diamond()
    assert g.fingerprint() == diamond().fingerprint()
    us = [Unit(n, "conv2d", outputs=[TensorInfo((1, 2))]) for n in "abcde"]
    g2 = OpGraph(us, g.edges)
    assert g2.fingerprint() != g.fingerprint()


def test_cut_points_and_blocks():
    g = diamond()
    assert [g.units[i].name for i in cut_points(g)] == ["a", "d", "e"]
    assert partition(g) == [["a"], ["b", "c", "d"], ["e"]]
    assert partition(g, max_block_size=2) == [["a"], ["b", "c"], ["d"], ["e"]]


def test_json_round_trip():
    g = diamond()
    g2 = OpGraph.from_json(g.to_json())
    assert g2.fingerprint() == g.fingerprint()
