"""What a CUDA build will take on the GPU, estimated here: the whole-program model (``passes.cost.program``) fed
the unit latencies of ``sim:h100-tvm``, the simulated H100 fitted to TVM's default CUDA kernels.

Why: a compile reports its scheduler's prediction under ``sim:h100``, which assumes tuned kernels and ignores the
host's launch work, so it reads 2-3x below what the library then measures (SqueezeNet: 0.21 ms predicted, 0.46-0.52
ms measured on an H100 / H200). The program model (version 6) on a fitted preset's units predicted measured
runs' variants within 3.8-10.2 % (median per run, worst 21-37 %; ``scripts/gpu_cost_transfer.py --sim``,
``docs/gpu_cost_transfer_*_sim_preset2.json``; SqueezeNet's 5-15 % high on the H100), so a user without the GPU at hand
learns what to expect of each candidate program the library carries: the schedule in both synchronisation modes
and sequential, each launched directly and as a CUDA graph.

Only where that model was validated: an sm_90 target, TVM kernels (no cuDNN / cuBLAS units, no wave-fused stages,
no flow launches: a flow launch is one unit to this model, priced as if its members were one kernel).
"""
from __future__ import annotations

FITTED_PRESET = "sim:h100-tvm"
ARCHES = ("sm_90", "sm_90a")


def estimate_programs(program, schedule, target: str, max_streams: int = 8) -> dict | None:
    """``{"cost": preset, "programs": {label: {"direct": ms, "cuda_graph": ms}}}`` for ``schedule`` (stage and
    dependency mode when it has concurrency) and sequential; None where the model does not apply (see the module
    docstring)."""
    from ..candidates import sequential_schedule
    from ..target import requested_arches
    from . import get_cost_model
    from .program import ProgramCostModel, load_fitted

    arches = requested_arches(target)   # [] for a target that is not CUDA
    if not arches or not set(arches) <= set(ARCHES):
        return None
    if any(c.is_library for c in program.calls.values()) or any(st.strategy == "wave" for st in schedule.stages):
        return None
    if any(run.get("units") for run in schedule.options.get("flow") or []):
        return None
    model = ProgramCostModel(get_cost_model(FITTED_PRESET), load_fitted(), max_streams=max_streams,
                             timing_number=0)
    lowerings = [("sequential", sequential_schedule(schedule), "stage")]
    if schedule.max_concurrency() > 1:
        lowerings += [(f"{schedule.scheduler or 'schedule'} ({mode})", schedule, mode)
                      for mode in ("stage", "dependency")]
    return {"cost": FITTED_PRESET,
            "programs": {label: {"direct": model.predict(program, sched, mode) * 1e3,
                                 "cuda_graph": model.predict(program, sched, mode, cuda_graph=True) * 1e3}
                         for label, sched, mode in lowerings}}
