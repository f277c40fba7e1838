"""MetaSchedule tuning in rounds across a machine boundary: candidates built here, timed there, learned from here.

Why: a GPU machine may hold TVM's runtime only (no compiler, no nvcc) and be lent for minutes at a time, while
MetaSchedule's tuner wants a builder and a runner in one process. So a round is split in three steps:

1. ``export_round`` (here, compiler): for every kernel that still needs trials, the evolutionary search proposes
   up to ``per_round`` candidates, guided by the XGBoost model and skipping what the database already holds;
   each is built (CUDA kernels as fatbins for the target's arch) into ``BUNDLE/<id>.so``; ``bundle.json`` lists
   them with their argument shapes. The tuning records (trace, workload, args) wait in the database directory
   (``bundles/<bundle id>.json``) for their timings.
2. ``python -m tvm_interop.runtime.tuning_bundle BUNDLE -o results.json`` (there, runtime only) times them all.
3. ``import_results`` (here): the timings become tuning records in the database (failed candidates as failures,
   so they are not proposed again), the XGBoost model is updated with them and saved, so the next round's
   search is guided by everything measured so far.

On CUDA the first round of each kernel also carries the kernel a build ships without tuning (DLight's schedule,
as ``passes.cuda_build`` gives it): its timing becomes the task's ``default_ms``, so ``compile --tuning-db`` keeps
that kernel where no tuned record beat it (on an H200, round 2 of Inception-v3's stride-2 3x3 convolution was
still slower than its default kernel).

Repeat until every kernel has its trials; ``compile --tuning-db DIR`` then uses the best records. The state
file says which bundle is outstanding; results are refused when they belong to a bundle this database did not
export (or already imported), or were measured on a device other than the one the database was tuned on,
naming both.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid

import tvm
from tvm.s_tir import meta_schedule as ms

from tvm_interop.runtime import atomic
from tvm_interop.runtime.json_file import read_json
from tvm_interop.runtime.tuning_bundle import BUNDLE_FORMAT, RESULTS_FORMAT, VERSION

from .fast_builder import InProcessBuilder, args_info_json, tensor_intrinsics_for
from .tuning import (STATE_FORMAT, STATE_VERSION, TuningError, _as_module, _check_target, _extract_tasks, _lock,
                     _make_cost_model, _open_database, _read_state, _Records, _save_cost_model, _search_strategy,
                     _target_text, _write_state, tuning_target)

log = logging.getLogger(__name__)

PENDING_DIR = "bundles"
FAILED_SECONDS = 1e10   # MetaSchedule's cost of a candidate that did not run


def _device_kind(target) -> str:
    return "cpu" if target.kind.name in ("llvm", "c") else target.kind.name


def export_round(program, target, work_dir: str, bundle_dir: str, trials: int, *, per_round: int = 64,
                 op_names: list[str] | None = None, num_threads: int | None = None, target_cores: int | None = None,
                 cost_model: str = "xgb", population_size: int | None = None, seed: int | None = None) -> dict:
    """Write one round of candidates for every kernel with fewer than ``trials`` records into ``bundle_dir``.
    ``target_cores``: a CPU target's ``num-cores`` (the device's cores; default this machine's). Returns a
    summary: bundle id, candidates per task, and whether anything is left to tune."""
    t0 = time.perf_counter()
    num_threads = int(num_threads or ms.utils.cpu_count(logical=False))
    target = tuning_target(target, target_cores or num_threads)
    mod = _as_module(program, target)
    os.makedirs(work_dir, exist_ok=True)
    with _lock(work_dir):
        state = _read_state(work_dir) or {"format": STATE_FORMAT, "version": STATE_VERSION, "tasks": {}}
        pending = state.get("pending_bundle")
        if pending:
            raise TuningError(f"bundle {pending['id']} (exported to {pending['dir']}, {pending['candidates']} "
                              "candidates) is still waiting for its results: measure it and --import them first "
                              "(or delete its entry 'pending_bundle' from the state file to abandon it)")
        _check_target(state if state.get("target") else None, target, work_dir, strict_device=False,
                      here=state.get("device"))
        db = _open_database(work_dir, create=True)
        records = _Records(db)
        _, tasks = _extract_tasks(mod, target, op_names)
        model, _ = _make_cost_model(cost_model, work_dir, num_threads)
        bundle_id = uuid.uuid4().hex[:12]
        if os.path.exists(bundle_dir) and os.listdir(bundle_dir):
            raise TuningError(f"{bundle_dir} is not empty; give a new directory for the bundle")
        os.makedirs(bundle_dir, exist_ok=True)
        cands_out, pending_records, per_task, baselines = [], [], {}, []
        scratch = tempfile.mkdtemp(prefix="tvm_interop_round_")
        builder = InProcessBuilder(export=True, tmp_root=scratch)
        try:
            for t in tasks:
                tmod = t.dispatched[0]
                key = ms.utils.shash2hex(tmod)
                n_done, _ = records.for_task(tmod)
                want = min(per_round, trials - n_done)
                st = state["tasks"].setdefault(key, {})
                st.setdefault("name", t.task_name)
                if want <= 0 or st.get("exhausted_at", -1) >= n_done:
                    continue
                proposed = _propose(t, tmod, target, want, db, model, work_dir, population_size, seed, num_threads)
                if not proposed:
                    st["exhausted_at"] = n_done   # the search space has nothing new to offer
                    continue
                workload = db.commit_workload(tmod)
                built = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in proposed])
                for c, b in zip(proposed, built):
                    if b.error_msg is not None:   # a candidate that does not build is a failure, like locally
                        pending_records.append(_record_json(c, workload, target, key, None, b.error_msg))
                        continue
                    cid = f"c{len(cands_out):05d}"
                    shutil.move(b.artifact_path, os.path.join(bundle_dir, cid + ".so"))
                    info = args_info_json(c.args_info)
                    cands_out.append({"id": cid, "file": cid + ".so", "task": t.task_name, "args_info": info})
                    pending_records.append(_record_json(c, workload, target, key, cid, None))
                per_task[t.task_name] = len(proposed)
                if "default_ms" not in st:
                    base = _shipped_kernel(tmod, target)
                    if base is not None:
                        (bb,) = builder.build([ms.builder.BuilderInput(base, target)])
                        if bb.error_msg is None:
                            cid = f"c{len(cands_out):05d}"
                            shutil.move(bb.artifact_path, os.path.join(bundle_dir, cid + ".so"))
                            info = args_info_json(ms.arg_info.ArgInfo.from_entry_func(base, remove_preproc=True))
                            cands_out.append({"id": cid, "file": cid + ".so", "task": t.task_name,
                                              "args_info": info, "baseline": True})
                            baselines.append({"id": cid, "task": key})
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        plan = {"format": BUNDLE_FORMAT, "version": VERSION, "id": bundle_id, "target": str(target),
                "device": _device_kind(target), "tvm_version": tvm.__version__,
                "evaluator": {"number": 3, "repeat": 1, "min_repeat_ms": 100}, "candidates": cands_out}
        atomic.write_json(os.path.join(bundle_dir, "bundle.json"), plan)
        os.makedirs(os.path.join(work_dir, PENDING_DIR), exist_ok=True)
        atomic.write_json(os.path.join(work_dir, PENDING_DIR, bundle_id + ".json"),
                          {"id": bundle_id, "records": pending_records, "baselines": baselines})
        state.update(target=_target_text(target), tvm_version=tvm.__version__)
        if pending_records:
            state["pending_bundle"] = {"id": bundle_id, "dir": os.path.abspath(bundle_dir),
                                       "candidates": len(cands_out)}
        _write_state(work_dir, state)
    return {"bundle": os.path.abspath(bundle_dir), "id": bundle_id, "candidates": len(cands_out),
            "build_failures": sum(1 for r in pending_records if r["error"]), "per_task": per_task,
            "done": not pending_records, "seconds": time.perf_counter() - t0}


def _shipped_kernel(tmod: tvm.IRModule, target) -> tvm.IRModule | None:
    """The task's kernel as a build ships it without tuning, when that is not the task itself: on CUDA, DLight's
    default schedule (``cuda_build.scheduled_as_built``). CPU kernels get their default schedule in ``prepare``;
    a CPU round times them through ``tuning.tune``'s baselines instead."""
    if target.kind.name != "cuda":
        return None
    from ..cuda_build import scheduled_as_built

    try:
        return tvm.IRModule({"main": scheduled_as_built(tmod["main"], target)})
    except Exception as err:  # noqa: BLE001 - no baseline: the round still tunes
        log.warning("no default kernel to time beside the candidates: %s", err)
        return None


def _propose(task, tmod, target, want, db, model, work_dir, population_size, seed, num_threads) -> list:
    """Up to ``want`` new candidates for one task from MetaSchedule's evolutionary search (cost-model guided,
    nothing the database already measured)."""
    with tensor_intrinsics_for(target):
        ctx = ms.TuneContext(mod=tmod, target=target, space_generator="post-order-apply",
                             search_strategy=_search_strategy(want, population_size), task_name=task.task_name,
                             rand_state=-1 if seed is None else int(seed), num_threads=num_threads).clone()
        spaces = ctx.space_generator.generate_design_space(ctx.mod)
        ss = ctx.search_strategy
        ss.pre_tuning(max_trials=want, num_trials_per_iter=want, design_spaces=spaces, database=db, cost_model=model)
        try:
            cands = ss.generate_measure_candidates() or []
        finally:
            ss.post_tuning()
    return list(cands)[:want]


def _record_json(cand, workload, target, task_key: str, cid: str | None, error: str | None) -> dict:
    rec = ms.database.TuningRecord(cand.sch.trace, workload, None, target, cand.args_info)
    return {"id": cid, "task": task_key, "workload": _plain_json(workload.as_json()),
            "record": _plain_json(rec.as_json()), "error": error}


def _plain_json(obj):
    """A TVM JSON value (``as_json()`` of a record or workload) as plain Python, for our JSON files."""
    return json.loads(json.dumps(obj, default=lambda v: v.value if hasattr(v, "value") else str(v)))


def import_results(work_dir: str, results_path: str, *, num_threads: int | None = None,
                   cost_model: str = "xgb") -> dict:
    """Put a measured round into the database and the XGBoost model (see the module doc). Returns a summary."""
    t0 = time.perf_counter()
    res = read_json(results_path, f"tuning results {results_path}", error=TuningError)
    if not isinstance(res, dict) or res.get("format") != RESULTS_FORMAT:
        raise TuningError(f"{results_path} is not a tvm-interop tuning results file "
                          "(written by python -m tvm_interop.runtime.tuning_bundle)")
    num_threads = int(num_threads or ms.utils.cpu_count(logical=False))
    with _lock(work_dir):
        state = _read_state(work_dir)
        pending = (state or {}).get("pending_bundle")
        pending_path = os.path.join(work_dir, PENDING_DIR, f"{res.get('bundle_id')}.json")
        if not pending or pending["id"] != res.get("bundle_id") or not os.path.exists(pending_path):
            waiting = f"it waits for bundle {pending['id']} ({pending['dir']})" if pending else "it waits for none"
            raise TuningError(f"{results_path} holds results of bundle {res.get('bundle_id')!r}, which the tuning "
                              f"database {work_dir!r} did not export or already imported; {waiting}")
        if state.get("device") and state["device"] != res.get("device"):
            raise TuningError(f"{results_path} was measured on {res.get('device')!r}, but the database {work_dir!r} "
                              f"was tuned on {state['device']!r}; use another --db for that device")
        if res.get("tvm_version") and res["tvm_version"] != tvm.__version__:
            raise TuningError(f"{results_path} was measured with TVM {res['tvm_version']}, this is "
                              f"{tvm.__version__}: the candidates are other code")
        waiting = read_json(pending_path, f"pending bundle {pending_path}", error=TuningError)
        timed = {r["id"]: r for r in res.get("results", [])}
        db = _open_database(work_dir, create=False)
        model, persistent = _make_cost_model(cost_model, work_dir, num_threads)
        target = None
        by_task: dict[str, list] = {}
        added = failed = missing = 0
        for item in waiting["records"]:
            workload = ms.database.Workload.from_json(item["workload"])
            workload = db.commit_workload(workload.mod)
            r = timed.get(item["id"]) if item["id"] else None
            if item["id"] and r is None:
                missing += 1
            secs = [FAILED_SECONDS] if r is None or "error" in r or item["error"] else [float(x) for x in r["run_secs"]]
            failed += secs == [FAILED_SECONDS]
            rec_json = list(item["record"])
            rec_json[1] = secs   # [trace, run_secs, target, args_info]
            rec = ms.database.TuningRecord.from_json(rec_json, workload)
            db.commit_tuning_record(rec)
            added += 1
            target = rec.target
            by_task.setdefault(item["task"], []).append((rec, secs, r.get("error") if r else item["error"]))
        # the XGBoost model learns this round's timings (what MetaSchedule's UpdateCostModel callback does).
        # TuneContext imports every tensor intrinsic TVM has unless told otherwise: 43 of the 46 s an import of
        # one 4-candidate round took on the 2-core dev machine (now 0.1 s in all for an LLVM round).
        if target is not None and hasattr(model, "update"):
            for key, recs in by_task.items():
                with tensor_intrinsics_for(target):
                    ctx = ms.TuneContext(mod=recs[0][0].workload.mod, target=target, num_threads=num_threads)
                cands, results = [], []
                for rec, secs, err in recs:
                    sch = tvm.s_tir.Schedule(rec.workload.mod)
                    rec.trace.apply_to_schedule(sch, remove_postproc=False)
                    cands.append(ms.MeasureCandidate(sch, rec.args_info))
                    results.append(ms.runner.RunnerResult(None if err else secs, err or None))
                model.update(ctx, cands, results)
            if persistent:
                _save_cost_model(model, work_dir)
        for base in waiting.get("baselines", []):   # the kernel that ships untuned: its time is the bar to beat
            r = timed.get(base["id"])
            if r is not None and "error" not in r and r.get("run_secs"):
                secs = [float(x) for x in r["run_secs"]]
                state["tasks"].setdefault(base["task"], {})["default_ms"] = sum(secs) / len(secs) * 1e3
        state["device"] = res.get("device")
        state["rounds"] = int(state.get("rounds", 0)) + 1
        state.pop("pending_bundle", None)
        for key, recs in by_task.items():
            st = state["tasks"].setdefault(key, {})
            st["seconds"] = float(st.get("seconds", 0.0))   # device time is in the results file, not here
        _write_state(work_dir, state)
        os.remove(pending_path)
    return {"bundle_id": res["bundle_id"], "device": res.get("device"), "records": added, "failed": failed,
            "missing": missing, "tasks": len(by_task), "round": state["rounds"], "seconds": time.perf_counter() - t0}
