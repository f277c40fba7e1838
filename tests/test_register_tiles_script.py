"""``scripts/bench_register_tiles.py`` builds a model's sequential program with the register tiles on the heap
(``local`` scope, before 2026-11-30) and on the stack (``global``), both equal to plain TVM; the heap build makes
more workspace allocations. Small SqueezeNet, two rounds: behaviour, not speed."""
import json

from scripts_under_test import load_script


def test_heap_and_stack_tiles_are_built_checked_and_timed(tmp_path):
    script = load_script("bench_register_tiles")
    out = tmp_path / "tiles"
    script.main(["--models", "squeezenet", "--repeat", "2", "--width", "0.25", "--image-size", "64",
                 "--out", str(out)])
    (row,) = json.loads((tmp_path / "tiles.json").read_text())["results"]
    heap, stack = script.SCOPES
    assert row["workspace_calls"][heap] > row["workspace_calls"][stack] >= 0
    assert all(v <= 1e-4 * 100 for v in row["max_abs_diff"].values())
    assert row["speedup"] > 0 and all(v > 0 for v in row["median_ms"].values())
    assert script.cpu_schedule._ACC_SCOPE == "global"   # restored after the heap build
