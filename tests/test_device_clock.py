"""The device clock: cost tables with two times per stage on a GPU, and which one prices what.

On a GPU a stage is timed twice (``runtime.profile_bundle``): ``latency`` on the issue clock (calls back to back:
the host's pace when host work outlasts the kernels, as in a direct program) and ``device_latency`` on the device
clock (calls queued behind a held stream: the device's pace, as in a CUDA graph). The holding itself needs a GPU;
what runs here is everything around it: the tables' reading, the choice of clock for a build, the fleet's merge, the
unit-table summary and report, and the clock's retry logic (with the native functions stood in: the real ones are
tested for their refusals in ``test_native_ext.py`` and run on the device by ``gpu_check``). Times are
illustrative."""
from __future__ import annotations

import json

import pytest

from tvm_interop.passes.cost.table import TableCostModel, has_device_clock, spec_for_build
from tvm_interop.passes.graph import Unit
from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.profile_bundle import stage_key


def _table(device: bool = True, missing: tuple[str, ...] = ()) -> dict:
    def row(groups, strategy, issue, dev):
        r = {"key": stage_key(groups, strategy), "groups": groups, "strategy": strategy, "latency": issue}
        if device:
            r["device_latency"] = None if groups[0][0] in missing and strategy == "concurrent" else dev
        return r

    rows = [row([["a"]], "concurrent", 20e-6, 15e-6), row([["b"]], "concurrent", 30e-6, 25e-6),
            row([["a"], ["b"]], "concurrent", 35e-6, 26e-6), row([["a"]], "library", 40e-6, 9e-6)]
    t = {"format": "tvm-interop-cost-table", "version": 1, "model": "m", "device_kind": "cuda",
         "device": "cuda:x:sm_90", "units": {"a": 20e-6, "b": 30e-6}, "stages": rows}
    if device:
        t["device_clock"] = {"held": 20, "not_held": 0, "stages_without": len(missing), "programs_without": 0}
    return t


def _write(tmp_path, table, name="costs.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(table))
    return str(path)


def _unit(name: str, library: bool = False) -> Unit:
    return Unit(name=name, kind="conv2d", func_name="fused_conv2d", attrs={"library": "cudnn"} if library else {})


def test_both_clocks_price_units_stages_and_library_calls(tmp_path):
    path = _write(tmp_path, _table())
    issue, device = TableCostModel(path), TableCostModel(path, clock="device")
    a, b = _unit("a"), _unit("b")
    assert issue.unit_latency(a) == pytest.approx(20e-6) and device.unit_latency(a) == pytest.approx(15e-6)
    assert issue.stage_latency([[a], [b]]) == pytest.approx(35e-6)
    assert device.stage_latency([[a], [b]]) == pytest.approx(26e-6)
    assert issue.unit_latency(_unit("a", library=True)) == pytest.approx(40e-6)
    assert device.unit_latency(_unit("a", library=True)) == pytest.approx(9e-6)
    assert issue.implementation_times() == {"a": (20e-6, 40e-6)}
    assert device.implementation_times() == {"a": (15e-6, 9e-6)}
    assert device.stats()["clock"] == "device" and device.name.endswith(":device-clock")


def test_rows_without_a_device_time_keep_their_issue_time_and_are_counted(tmp_path):
    model = TableCostModel(_write(tmp_path, _table(missing=("b",))), clock="device")
    assert model.unit_latency(_unit("b")) == pytest.approx(30e-6)
    assert model.clock_fallbacks == 1   # b's unit row
    assert "have no device-clock time" in model.composed_report()


def test_device_clock_refused_on_a_table_without_it(tmp_path):
    path = _write(tmp_path, _table(device=False))
    with pytest.raises(InteropError, match="has no device-clock times .*issue clock only.*clock=issue"):
        TableCostModel(path, clock="device")
    skipped = _table(device=False)
    skipped["device_clock"] = {"skipped": "the native extension is not in this library"}
    with pytest.raises(InteropError, match="the native extension is not in this library"):
        TableCostModel(_write(tmp_path, skipped, "s.json"), clock="device")
    with pytest.raises(InteropError, match="unknown cost table clock 'wall'"):
        TableCostModel(path, clock="wall")


def test_spec_options_and_the_clock_a_build_takes(tmp_path):
    from tvm_interop.passes.cost import get_cost_model

    both, issue_only = _write(tmp_path, _table()), _write(tmp_path, _table(device=False), "i.json")
    assert get_cost_model(f"table:{both};clock=device").clock == "device"
    assert get_cost_model(f"table:{both};fallback=error;clock=issue").clock == "issue"
    with pytest.raises(InteropError, match="unknown cost table option 'speed=1'.*clock=issue\\|device"):
        get_cost_model(f"table:{both};speed=1")
    # a build with a CUDA graph reads a two-clock table on the device clock, unless the spec names one
    assert spec_for_build(f"table:{both}", cuda_graph=True) == f"table:{both};clock=device"
    assert spec_for_build(f"table:{both}", cuda_graph=False) == f"table:{both}"
    assert spec_for_build(f"table:{both};clock=issue", cuda_graph=True) == f"table:{both};clock=issue"
    assert spec_for_build(f"table:{issue_only}", cuda_graph=True) == f"table:{issue_only}"
    assert spec_for_build("sim:h100", cuda_graph=True) == "sim:h100" and spec_for_build(None, True) is None
    assert has_device_clock(_table()) and not has_device_clock(_table(device=False))


def test_fleet_merge_keeps_both_clocks_and_library_rows():
    """Chunks measured on several devices merge into one table: rows keep their device times, the clock's counts
    add up, and a unit's library row ("library" strategy) is neither its unit time nor a key mismatch."""
    from tvm_interop.passes.fleet.bundle import merge_tables

    full = _table(missing=("b",))
    parts = []
    for i, rows in enumerate((full["stages"][:2], full["stages"][2:])):
        part = {k: v for k, v in full.items() if k != "stages"}
        part["stages"] = [dict(r, index=2 * i + j) for j, r in enumerate(rows)]
        part["device_clock"] = {"method": "m", "statistic": "s", "held": 10, "not_held": i, "stages_without": 1 - i,
                                "programs_without": 0}
        parts.append(part)
    merged = merge_tables(parts)
    assert merged["units"] == {"a": 20e-6, "b": 30e-6}
    assert [r.get("device_latency") for r in merged["stages"]] == [15e-6, None, 26e-6, 9e-6]
    assert merged["device_clock"] == {"method": "m", "statistic": "s", "held": 20, "not_held": 1,
                                      "stages_without": 1, "programs_without": 0}
    parts[1]["device_clock"] = {"skipped": "no extension"}
    assert merge_tables(parts)["device_clock"]["chunks_skipped_because"] == "no extension"


def test_in_context_tables_have_the_issue_clock_only():
    """In-context stage times come from direct programs: a table merged with them drops the device times, so a
    graph build cannot price the in-context stages on the other clock."""
    from tvm_interop.passes.cost.in_context import merge_in_context

    merged = merge_in_context(_table(), [{"name": "p", "stages": [[["a"], ["b"]]], "stages_ms": [0.05]}])
    assert not has_device_clock(merged)
    assert all("device_latency" not in st for st in merged["stages"])


def test_measuring_with_the_device_clock_needs_a_gpu_and_the_vm_method():
    from tvm_interop.runtime.profile_bundle import measure_plan

    plan = {"device": "cpu", "stages": [], "units": {}, "tensors": []}
    with pytest.raises(InteropError, match="the device clock times GPU streams: it needs --device cuda"):
        measure_plan(plan, "unused.so", device="cpu", device_clock=True)


class _StandInNative:
    """The native hold / timing functions stood in: ``held`` says, per hold, whether it lasted until release."""

    def __init__(self, held: list[bool]):
        self.held = list(held)
        self.calls: list = []

    def funcs(self) -> dict:
        def record(pool, k, stream):
            self.calls.append(("record", k))

        return {"stream_hold": lambda dev, stream, ms: self.calls.append(("hold", ms)) or 7,
                "stream_release": lambda h: self.held.pop(0),
                "timing_create": lambda dev, n: 1, "timing_record": record,
                "timing_read": lambda pool, n: [0.5], "timing_free": lambda pool: None}


def _clock(native: _StandInNative):
    from tvm_interop.runtime.device_clock import DeviceClock

    clock = DeviceClock.__new__(DeviceClock)
    clock._f, clock.device_id, clock.timeout_ms, clock._pool = native.funcs(), 0, 1000, 1
    clock.held = clock.not_held = clock.last_calls = 0
    return clock


def test_device_clock_retries_one_call_then_gives_up():
    runs = []
    clock = _clock(_StandInNative([True]))
    assert clock.time(lambda: runs.append(1), 10) == pytest.approx(0.5e-3 / 10)
    assert len(runs) == 10 and (clock.held, clock.not_held) == (1, 0)
    clock = _clock(_StandInNative([False, True]))          # 10 calls outlasted the hold; one call did not
    assert clock.time(lambda: None, 10) == pytest.approx(0.5e-3) and (clock.held, clock.not_held) == (1, 1)
    assert clock.last_calls == 1
    clock = _clock(_StandInNative([False, False]))         # not even one call: no device time
    assert clock.time(lambda: None, 10) is None and clock.not_held == 2


def test_device_clock_releases_the_stream_when_a_call_fails():
    native = _StandInNative([True])
    clock = _clock(native)

    def boom():
        raise RuntimeError("kernel failed")

    with pytest.raises(RuntimeError, match="kernel failed"):
        clock.time(boom, 3)
    assert native.held == []   # released


def test_device_clock_names_a_missing_extension(monkeypatch):
    import tvm

    from tvm_interop.runtime.device_clock import DeviceClock

    real = tvm.get_global_func
    monkeypatch.setattr(tvm, "get_global_func", lambda name, allow_missing=False: None if "stream_hold" in name
                        else real(name, allow_missing=allow_missing))
    with pytest.raises(InteropError, match="needs tvm-interop's native extension .*stream_hold is not registered"):
        DeviceClock(tvm.cpu(0))


def test_unit_table_summary_and_report_on_both_clocks():
    """gpu_check's unit-table summary: the same sums on the device clock, how many units the clocks choose
    differently for, and the library calls' issue / device ratio (the host-bound floor)."""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
    from gpucheck.report import _unit_costs_lines
    from gpucheck.run import unit_cost_summary

    uc = unit_cost_summary(_table())
    assert uc["library_faster"] == 0 and uc["device"]["library_faster"] == 1 and uc["device"]["flips"] == 1
    assert uc["device"]["library_issue_over_device"] == [pytest.approx(40 / 9)]
    assert uc["all_faster_us"] == pytest.approx(50) and uc["device"]["all_faster_us"] == pytest.approx(34)
    torch = {"name": "PyTorch eager (cuDNN) + CUDA graph", "median_ms": 0.04}
    text = "\n".join(_unit_costs_lines({"unit_costs": {"table": "t.json", **uc}, "variants": [torch]}))
    assert ("summed (a sum of unit times, not a measured program): issue clock 0.050 ms (1.25x); device clock "
            "0.034 ms (0.85x) of PyTorch eager (cuDNN) + CUDA graph 0.040 ms.") in text
    assert "On the device clock (what a CUDA graph pays): the library call is faster for 1 of 1" in text
    assert "choose differently for 1 units" in text and "median 4.44x" in text
    assert "device" not in unit_cost_summary(_table(device=False))


def test_cli_clock_options(tmp_path, capsys):
    """``schedule --clock`` belongs to an active search; ``profile-measure --no-device-clock`` is accepted on a CPU
    bundle (where the issue clock is the only one) and its table has no device clock."""
    from tvm_interop.cli import main

    assert main(["schedule", "squeezenet", "--clock", "device"]) == 1
    assert "--clock belongs to --active DIR" in capsys.readouterr().err
    bundle = str(tmp_path / "b")
    assert main(["profile-bundle", "squeezenet", "--image-size", "32", "--width", "0.125", "--no-ios",
                 "-o", bundle, "--quiet"]) == 0
    capsys.readouterr()
    out = str(tmp_path / "costs.json")
    assert main(["profile-measure", bundle, "-o", out, "--repeat", "2", "--number", "1", "--warmup", "1",
                 "--no-device-clock", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["device_clock"] is None
    assert not has_device_clock(json.load(open(out)))


@pytest.mark.parametrize("damage, match", [
    (lambda t: t["units"].update(a="fast"), "unit 'a' has no valid time"),
    (lambda t: t["stages"][1].pop("latency"), "stage row 1 has no valid latency"),
    (lambda t: t["stages"][2].update(latency=float("nan")), "stage row 2 has no valid latency"),
    (lambda t: t["stages"][0].update(device_latency=-1.0), "stage row 0 has no valid device_latency"),
    (lambda t: t["stages"][3].pop("groups"), "stage row 3 has no groups"),
    (lambda t: t.update(stages={}), "'stages' is not a list"),
])
def test_a_damaged_table_is_refused_naming_the_entry(tmp_path, damage, match):
    table = _table()
    damage(table)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(table))   # NaN is written as NaN: json reads it back
    with pytest.raises(InteropError, match=match + ".*measure the bundle again|" + match):
        TableCostModel(str(path))
