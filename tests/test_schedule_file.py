import json

import pytest

from tvm_interop.passes.graph import OpGraph, Unit
from tvm_interop.passes.schedule import Schedule, Stage
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.runtime.errors import ScheduleError, ScheduleFileError


def graph():
    us = [Unit(n, "conv2d", flops=1e6 * (i + 1)) for i, n in enumerate("abcde")]
    return OpGraph(us, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("d", "e")], name="g")


@pytest.mark.parametrize("scheduler", ["sequential", "greedy"])
def test_round_trip(tmp_path, scheduler):
    g = graph()
    s = schedule_graph(g, scheduler)
    p = tmp_path / "s.json"
    s.save(p)
    s2 = Schedule.load(p)
    assert s2.to_json() == s.to_json()
    s2.validate(g)


def test_greedy_groups_independent_units():
    s = schedule_graph(graph(), "greedy")
    assert [st.groups for st in s.stages] == [[["a"]], [["c"], ["b"]], [["d"]], [["e"]]]


def test_greedy_respects_max_streams():
    us = [Unit("src", "conv2d")] + [Unit(f"u{i}", "conv2d", flops=1e6) for i in range(6)]
    g = OpGraph(us, [("src", f"u{i}") for i in range(6)])
    s = schedule_graph(g, "greedy", max_streams=2)
    assert max(len(st.groups) for st in s.stages) == 2
    s.validate(g)


def test_wrong_model_is_refused():
    s = schedule_graph(graph(), "greedy")
    other = OpGraph([Unit(n, "conv2d") for n in "abcdf"], [("a", "b")])
    with pytest.raises(ScheduleError, match="different model"):
        s.validate(other)


def test_invalid_schedules_are_refused():
    g = graph()
    with pytest.raises(ScheduleError, match="more than once"):
        Schedule([Stage([["a"]]), Stage([["a"]])]).validate(g)
    with pytest.raises(ScheduleError, match="leaves out"):
        Schedule([Stage([["a"]])]).validate(g)
    with pytest.raises(ScheduleError, match="producer"):
        Schedule([Stage([["a"]]), Stage([["b"], ["d"]]), Stage([["c"]]), Stage([["e"]])]).validate(g)
    with pytest.raises(ScheduleError, match="not in the model"):
        Schedule([Stage([["zz"]])]).validate(g)
    with pytest.raises(ScheduleError, match="unknown stage strategy"):
        Stage([["a"]], strategy="parallel")


def test_hostile_files(tmp_path):
    s = schedule_graph(graph(), "greedy")
    text = s.dumps()
    p = tmp_path / "t.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(ScheduleFileError, match="not valid JSON"):
        Schedule.load(p)
    p.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ScheduleFileError, match="not a tvm-interop schedule"):
        Schedule.load(p)
    d = s.to_json()
    d["version"] = 99
    p.write_text(json.dumps(d))
    with pytest.raises(ScheduleFileError, match="version 99"):
        Schedule.load(p)
    p.write_bytes(b"\x00\xff\xfe garbage")
    with pytest.raises(ScheduleFileError):
        Schedule.load(p)
    with pytest.raises(ScheduleFileError, match="cannot read"):
        Schedule.load(tmp_path / "missing.json")


def test_save_is_atomic(tmp_path):
    g = graph()
    s = schedule_graph(g, "greedy")
    p = tmp_path / "s.json"
    s.save(p)
    before = p.read_text()

    s.options["bad"] = object()  # not JSON serialisable -> save fails
    with pytest.raises(TypeError):
        s.save(p)
    assert p.read_text() == before
    assert [f.name for f in tmp_path.iterdir()] == ["s.json"]


def test_schedule_from_another_device_is_refused():
    s = schedule_graph(graph(), "greedy")
    s.device = "sim:h100"
    with pytest.raises(ScheduleError, match="tuned for 'sim:h100' \\(gpu\\) but the target is cpu"):
        s.check_device("cpu")
    s.check_device("cuda")
    s.check_device("cpu", allow_mismatch=True)
    s.device = "measured:cpu:Some CPU:2cores"
    s.check_device("cpu")
    with pytest.raises(ScheduleError, match="target is cuda"):
        s.check_device("cuda")
    s.device = "unit"
    s.check_device("cuda")
