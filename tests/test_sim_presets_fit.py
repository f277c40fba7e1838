"""``sim:h100-tvm`` / ``sim:h200-tvm``: simulated GPUs fitted to TVM's default CUDA kernels
(``scripts/fit_sim_preset.py``), checked against the committed device-clock unit tables and whole-program runs."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(name: str):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


@pytest.fixture(scope="module")
def fit_data():
    """The H100 tables of 2026-11-27 (Inception-v3, GoogLeNet, ResNet-50) and the H200 RandWire table."""
    fit = _script("fit_sim_preset")
    return fit, fit.load_units([t for t in fit.TABLES if t[0] == "h100" or "randwire" in t[1]])


def test_tvm_presets_price_the_measured_default_kernels(fit_data):
    """Each table's units: the median |log(simulated / device-clock time)| is at most 0.15 under the fitted preset
    and less than half of the datasheet-level preset's (which says 3-5x too little for the larger kernels); and
    the units sum to within 8 % of the table, the preset's error that a whole-program estimate inherits. Before the
    serial-reduction floor (``reduction_step``) the preset's medians were 0.05-0.26 and its sums 0.76-1.10 of the
    tables (ResNet-50 0.76, GoogLeNet 0.85: the 3x3 convolutions with few outputs, 0.6x their time); with it
    0.03-0.13 and 0.99-1.07 (``docs/sim_presets_fit.md``)."""
    from tvm_interop.passes.cost.simulated import SimulatedDevice

    fit, data = fit_data
    assert len(data) == 4
    for dev, model, units, seconds in data:
        preset = SimulatedDevice(f"{dev}-tvm")
        tvm = np.median(np.abs(fit.log_errors(preset, units, seconds)))
        datasheet = np.median(np.abs(fit.log_errors(SimulatedDevice(dev), units, seconds)))
        assert tvm <= 0.15 and tvm < 0.5 * datasheet, (dev, model, tvm, datasheet)
        total = sum(preset.unit_latency(u) for u in units) / seconds.sum()
        assert abs(total - 1) <= 0.08, (dev, model, total)


def test_the_fit_lands_on_the_shipped_presets(fit_data):
    """On a grid around the shipped point, the fit (every table weighing the same) picks the shipped point, and each
    leave-one-model-out fit lands on it or on a neighbouring grid value (ResNet-50 left out: 30 ns of boundary step
    instead of 35): the presets are what the committed data say."""
    from tvm_interop.passes.cost.simulated import PRESETS

    fit, data = fit_data
    spec = PRESETS["h100-tvm"]
    shipped = fit.shipped_point_of(spec)
    assert PRESETS["h200-tvm"].bandwidth / 4.8e12 == pytest.approx(shipped["bandwidth"])
    assert all(getattr(PRESETS["h200-tvm"], k) == getattr(spec, k)
               for k in ("peak_flops", "lanes_per_unit", "reduction_step", "boundary_step", "gemv_split"))
    grid = {"efficiency": (0.12, 0.14, 0.17), "bandwidth": (0.8, 1.0), "lanes_per_unit": (1280,),
            "reduction_step": (45e-9, 50e-9, 55e-9), "boundary_step": (30e-9, 35e-9, 40e-9)}
    best, held = fit.fit(data, grid)
    assert best == pytest.approx(shipped)

    def index(values, x):
        return min(range(len(values)), key=lambda i: abs(values[i] - x))

    for model, point in held.items():
        assert all(abs(index(grid[k], point[k]) - index(grid[k], shipped[k])) <= 1 for k in grid), (model, point)


def test_whole_programs_from_the_preset_units_match_the_h100_run():
    """``gpu_cost_transfer.py --sim sim:h100-tvm`` on the H100 run of 2026-11-27 (Inception-v3, GoogLeNet,
    ResNet-50, SqueezeNet; 60 variants): the program model fed nothing but the preset's unit latencies predicts
    every variant within 25 % and the median within 6 % (measured 3.8 % / 21.4 %); before the serial-reduction
    floor it was 19.5 % / 35.9 %, GoogLeNet and ResNet-50 21-22 % low (``docs/gpu_cost_transfer_h100_2026-11-27
    _sim_preset2.json`` against ``..._sim_v6.json``)."""
    gct = _script("gpu_cost_transfer")
    with open(os.path.join(ROOT, "docs", "gpu_check_h100_2026-11-27.json"), encoding="utf-8") as f:
        run = json.load(f)
    rows = gct.transfer_rows(run, None, sim="sim:h100-tvm")
    assert len(rows) == 60
    errors = sorted(abs(r["error"]) for r in rows)
    assert errors[-1] <= 0.25 and errors[len(errors) // 2] <= 0.06


def test_program_model_predicts_a_model_without_a_table_from_the_fitted_preset():
    """``gpu_cost_transfer.py --sim``: SqueezeNet of the H200 run of 2026-11-27 has no unit table and was not in the
    preset's fit; the program model fed with ``sim:h200-tvm``'s unit latencies predicts its 12 variants within
    17 %, median within 13 %, where ``sim:h200``'s put every one more than 30 % low. Measured: program model
    version 4 10.2 % / 4.9 % (worst / median), version 5 13.7 % / 8.5 % (its ``program_offset`` takes 1.7 us off
    each of SqueezeNet's 39 kernels, which these unit latencies already put 5 % low; the same version brought the
    run's other 48 variants from 11.5 % to 10.6 % median, ``docs/gpu_cost_transfer_h200_2026-11-27_geo_sim_v5.json``),
    version 6 15.5 % / 11.7 %, all low: its shallow kernels (all of SqueezeNet's) take ``program_scale`` 1.084
    where version 5 gave every kernel 1.155, which moved the table-fed SqueezeNet held out from 12.3 % to 9.3 %
    median and exposes the presets' own low bias on SqueezeNet (``sim:h100-tvm``'s units summed to 0.76x the H100
    table of 2026-11-26; no H200 SqueezeNet table exists to check ``sim:h200-tvm``'s). The run's Inception-v3 and
    NASNet-A-large improved (``docs/gpu_cost_transfer_h200_2026-11-27_geo_sim_v6.json``). With the presets'
    serial-reduction floor (their units now sum to 0.93x that table's issue-clock times, which carry host floors):
    16.1 % / 8.8 %, all high (``..._geo_sim_preset2.json``)."""
    gct = _script("gpu_cost_transfer")
    with open(os.path.join(ROOT, "docs", "gpu_check_h200_2026-11-27_geo.json"), encoding="utf-8") as f:
        run = json.load(f)
    run["models"] = [m for m in run["models"] if m["name"] == "squeezenet"]
    fitted = gct.transfer_rows(run, None, sim="sim:h200-tvm")
    datasheet = gct.transfer_rows(run, None, sim="sim:h200")
    assert len(fitted) == len(datasheet) == 12
    errors = sorted(abs(r["error"]) for r in fitted)
    assert errors[-1] <= 0.17 and errors[len(errors) // 2] <= 0.13
    assert all(r["error"] < -0.3 for r in datasheet)


def test_a_cuda_compile_reports_what_its_candidates_take_on_an_h100():
    """``CompiledModel.gpu_estimate`` (printed by ``tvm-interop compile --target cuda``): the program model on
    ``sim:h100-tvm``'s units for the library's candidate programs. SqueezeNet's greedy schedule and sequential, each
    in both lowerings, direct and as a CUDA graph, within 16 % of what the H100 run of 2026-11-27 measured for the
    same schedules (program model version 5: 2.8-11.1 % low; version 6: 6.6-14.2 % low, see the test above for
    why SqueezeNet moved; with the presets' serial-reduction floor 5.0-15.2 % high, the worst greedy with a CUDA
    graph); nothing for a target the model was not validated on."""
    import shutil

    import tvm_interop
    from tvm_interop.passes.cost.program_estimate import estimate_programs

    if shutil.which("nvcc") is None and not os.path.exists("/usr/local/bin/nvcc"):
        pytest.skip("nvcc not found: no CUDA build here")
    with open(os.path.join(ROOT, "docs", "gpu_check_h100_2026-11-27.json"), encoding="utf-8") as f:
        run = json.load(f)
    measured = {v["name"]: v for v in next(m for m in run["models"] if m["name"] == "squeezenet")["variants"]}
    cm = tvm_interop.compile("squeezenet", target="cuda", scheduler="greedy")
    assert cm.schedule.num_stages == measured["greedy"]["stages"]   # the schedule the run measured
    est = cm.gpu_estimate()
    assert est["cost"] == "sim:h100-tvm"
    names = {"sequential": "sequential", "greedy (stage)": "greedy", "greedy (dependency)": "greedy (dependency)"}
    assert set(est["programs"]) == set(names)
    for label, variant in names.items():
        for how, suffix in (("direct", ""), ("cuda_graph", " + CUDA graph")):
            ms = measured[variant + suffix]["median_ms"]
            assert abs(est["programs"][label][how] / ms - 1) <= 0.16, (label, how, est["programs"][label][how], ms)
    assert estimate_programs(cm.program, cm.schedule, "cuda -arch=sm_80") is None   # fitted on sm_90 only
    assert estimate_programs(cm.program, cm.schedule, "llvm") is None
