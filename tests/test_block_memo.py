"""``passes.schedulers.block_memo``: a block scheduled once is handed back for a structurally equal block, only
under a cost model that prices by structure, and the schedule is the one a fresh search finds."""
from __future__ import annotations

import pytest

from tvm_interop.passes.cost import get_cost_model
from tvm_interop.passes.graph import OpGraph, Unit
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.schedulers.block_memo import BlockMemo
from tvm_interop.passes.synthetic import inception_like, nasnet_like


def _renamed(graph: OpGraph, prefix: str) -> OpGraph:
    """The same graph with every unit (and every tensor named in ``attrs["data"]``) renamed."""
    def new(n):
        return f"{prefix}{n}"

    units = []
    for u in graph.units:
        d = u.to_json()
        d["name"] = new(u.name)
        if isinstance(d["attrs"].get("data"), str):
            d["attrs"] = dict(d["attrs"], data=new(d["attrs"]["data"]))
        units.append(Unit.from_json(d))
    return OpGraph(units, [(new(a), new(b)) for a, b in graph.edges], name=graph.name)


def _stages(s) -> list:
    return [(st.strategy, [list(g) for g in st.groups]) for st in s.stages]


@pytest.mark.parametrize("make", [inception_like, nasnet_like])
def test_a_renamed_graph_gets_every_block_from_the_memo_and_the_same_schedule(make):
    g = make()
    memo = BlockMemo()
    first = schedule_graph(g, "ios", "sim:h100", memo=memo, r=3, s=8)
    blocks = len(first.search["blocks"])
    assert memo.misses + memo.hits == blocks and memo.misses >= 1   # equal cells inside one model hit already
    h = _renamed(g, "x_")
    fresh = schedule_graph(h, "ios", "sim:h100", r=3, s=8)
    hits_before = memo.hits
    reused = schedule_graph(h, "ios", "sim:h100", memo=memo, r=3, s=8)
    assert memo.hits - hits_before == blocks
    assert _stages(reused) == _stages(fresh)
    assert reused.predicted_latency == pytest.approx(fresh.predicted_latency)
    reused.validate(h)


def test_a_changed_unit_misses_and_other_options_or_devices_miss():
    g = inception_like()
    memo = BlockMemo()
    schedule_graph(g, "ios", "sim:h100", memo=memo, r=3, s=8)
    seen = memo.misses
    units = [Unit.from_json(u.to_json()) for u in g.units]
    changed = max(i for i, u in enumerate(units) if u.flops > 0)
    units[changed].flops *= 2   # the block holding it is not the same block any more
    schedule_graph(OpGraph(units, g.edges, name=g.name), "ios", "sim:h100", memo=memo, r=3, s=8)
    assert memo.misses == seen + 1
    before = memo.misses
    schedule_graph(g, "ios", "sim:v100", memo=memo, r=3, s=8)
    schedule_graph(g, "ios", "sim:h100", memo=memo, r=2, s=8)
    assert memo.misses == before + 2 * seen


def test_costs_that_do_not_price_by_structure_are_never_memoised():
    g = inception_like()
    memo = BlockMemo()
    unit = get_cost_model("unit")
    schedule_graph(g, "ios", unit, memo=memo, r=3, s=8)
    schedule_graph(g, "ios", unit, memo=memo, r=3, s=8)
    assert memo.hits == memo.misses == len(memo) == 0
