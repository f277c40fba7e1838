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
    heap, stack = script.COMPARISONS["scope"]
    assert row["workspace_calls"][heap] > row["workspace_calls"][stack] >= 0
    assert all(v <= 1e-4 * 100 for v in row["max_abs_diff"].values())
    assert row["speedup"] > 0 and all(v > 0 for v in row["median_ms"].values())
    assert script.cpu_schedule._ACC_SCOPE == "global"   # restored after the heap build


def test_tiles_left_to_tvm_and_kept_on_the_stack_are_built_checked_and_timed(tmp_path):
    """``--compare stack-tiles``: both builds equal plain TVM; on an AVX-512 host (tiles of 20-26 vectors,
    1280-1664 bytes) the build that leaves them to TVM makes more workspace allocations, elsewhere as many."""
    from tvm_interop.passes.target import normalize_target
    from tvm_interop.passes.kernels.cpu_schedule import vector_lanes

    script = load_script("bench_register_tiles")
    script.main(["--models", "squeezenet", "--repeat", "2", "--width", "0.25", "--image-size", "64",
                 "--compare", "stack-tiles", "--out", str(tmp_path / "tiles")])
    data = json.loads((tmp_path / "tiles.json").read_text())
    (row,) = data["results"]
    heap, stack = script.COMPARISONS["stack-tiles"]
    assert data["compare"] == "stack-tiles"
    if vector_lanes(normalize_target("llvm")) == 16:
        assert row["workspace_calls"][heap] > row["workspace_calls"][stack]
    else:
        assert row["workspace_calls"][heap] == row["workspace_calls"][stack]
    assert all(v <= 1e-4 * 100 for v in row["max_abs_diff"].values())
    assert script.stack_tiles.ENABLED   # restored after the build without it


def test_parallel_thresholds_are_built_checked_and_timed(tmp_path):
    """``--compare parallel-threshold`` with one more threshold: three builds, each equal to plain TVM, each
    timed; the module's threshold is restored."""
    script = load_script("bench_register_tiles")
    saved = script.cpu_schedule._MIN_PARALLEL_MACS_PER_THREAD
    script.main(["--models", "squeezenet", "--repeat", "2", "--width", "0.25", "--image-size", "64",
                 "--compare", "parallel-threshold", "--macs-per-thread", "0", "--out", str(tmp_path / "par")])
    (row,) = json.loads((tmp_path / "par.json").read_text())["results"]
    assert len(row["median_ms"]) == 3 and all(v > 0 for v in row["median_ms"].values())
    assert set(row["speedup_over_before"]) == set(row["median_ms"])
    assert all(v <= 1e-2 for v in row["max_abs_diff"].values())
    assert script.cpu_schedule._MIN_PARALLEL_MACS_PER_THREAD == saved
