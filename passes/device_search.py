"""Active search across the device boundary: search, measure what the picks need on the device, refit, again.

Why: stage costs timed one at a time in isolation do not add up to the program that runs (on the H100, ios
predicted 3.75 ms for inception_v3 and measured 6.84), and a model of the device is a model. So the picks are
verified on the device itself, as AutoGraph verifies its top candidates on board:

* **round 1**: every unit alone, plus the stages and the whole programs of the top-k picks of the schedulers
  under the simulated device preset;
* **round k > 1**: the cost model is the measured table (every stage measured so far, exact) with a learned
  model for the rest (``passes.cost.learned``: XGBoost on the concurrency ratios of the measured multi-group
  stages); the schedulers search with it; the top-k picks' stages not measured yet and their whole programs
  are the next bundle;
* the search stops when a round finds nothing new to measure, or after ``rounds``; the pick with the lowest
  **measured whole-program latency** ships (programs are timed as one function each: their stages back to back,
  as the stage-mode lowering runs them; ``passes.profile_bundle``). On a GPU each pick is also timed as the
  dependency-mode lowering issues it (a cross-stream wait only where data crosses streams), and counts with the
  better of the two: the library carries both lowerings and its candidate picker runs the faster.

``clock`` says which of a GPU table's two times the search prices stages and ranks programs by
(``runtime.device_clock``): ``issue`` (calls back to back: what a direct program pays) or ``device`` (calls queued
behind a held stream: what a CUDA graph pays, where host work is gone). A search keeps the clock it started with.

One device call per round: a profiling bundle measured in one batch, either through a fleet (``--rpc``, the
round trip happens inside this call) or by hand (the call returns with the command to run on the device, and
``--import RESULTS`` continues). Everything lives in one directory (``active.json``, the merged ``costs.json``,
one ``round-k/`` bundle per round), so a search survives a lost session and continues where it stopped.
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field

from tvm_interop.runtime import atomic
from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.json_file import read_json
from tvm_interop.runtime.profile_bundle import TABLE_FORMAT, stage_key

from .cost.table import CLOCKS, has_device_clock
from .schedule import Schedule

log = logging.getLogger(__name__)

STATE_FILE = "active.json"
COSTS_FILE = "costs.json"
STATE_FORMAT = "tvm-interop-active-search"
STATE_VERSION = 1
DEFAULT_SCHEDULERS = ("ios", "lios", "greedy")
# the name suffix of a pick's dependency-mode twin in a round's bundle (GPU targets: streams wait only where data
# flows across them); a pick's measured latency is the better of its two lowerings, as the library's candidate
# picker runs the faster one (runtime.picker)
DEPENDENCY = " [dependency]"


@dataclass
class DeviceSearchResult:
    status: str                      # "waiting" (a bundle to measure) or "done"
    schedule: Schedule | None        # the shipped pick (done)
    bundle: str | None = None        # the bundle to measure (waiting)
    history: list = field(default_factory=list)
    candidates: list = field(default_factory=list)   # every pick so far: name, predicted and measured ms
    directory: str = ""
    cost: dict = field(default_factory=dict)         # optimisation_cost(): host search + device seconds so far

    @property
    def measure_command(self) -> str | None:
        if self.bundle is None:
            return None
        return f"python -m tvm_interop.runtime.profile_bundle {self.bundle} -o {self.bundle}/costs.json"


def _schedule_signature(sched: Schedule) -> str:
    return "||".join(stage_key(st.groups, st.strategy) for st in sched.stages)


class _State:
    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, STATE_FILE)
        self.data: dict = read_json(self.path, f"active search state {self.path}") if os.path.exists(self.path) else {}
        if self.data and self.data.get("format") != STATE_FORMAT:
            raise InteropError(f"{self.path} is not a tvm-interop active search state")

    def save(self) -> None:
        atomic.write_json(self.path, self.data)

    @property
    def costs_path(self) -> str:
        return os.path.join(self.directory, COSTS_FILE)


def _check_identity(state: _State, graph, target_text: str, model_name: str, clock: str = "issue") -> None:
    import tvm

    d = state.data
    if not d:
        d.update(format=STATE_FORMAT, version=STATE_VERSION, model=model_name, graph_fingerprint=graph.fingerprint(),
                 target=target_text, tvm_version=tvm.__version__, device=None, round=0, pending=None,
                 candidates={}, history=[], clock=clock)
        return
    if d.get("clock", "issue") != clock:
        raise InteropError(f"{state.path} ranks by the {d.get('clock', 'issue')} clock, not the {clock} clock: its "
                           "rounds were priced on it; use another --active directory for the other clock")
    if d.get("graph_fingerprint") != graph.fingerprint():
        raise InteropError(f"{state.path} belongs to model {d.get('model')!r} (graph fingerprint "
                           f"{d.get('graph_fingerprint')}), not to {model_name!r} ({graph.fingerprint()}): another model "
                           "or batch size; use another --active directory")
    if d.get("target") != target_text:
        raise InteropError(f"{state.path} searches for target {d.get('target')!r}, not {target_text!r}")
    if d.get("tvm_version") != tvm.__version__:
        raise InteropError(f"{state.path} was started with TVM {d.get('tvm_version')}, this is {tvm.__version__}")


# ------------------------------------------------------------------------------------------------ measurements
def _merge_results(state: _State, table: dict, graph) -> dict:
    """Merge a measured round (a cost table from the round's bundle) into ``costs.json`` and the candidates'
    measured program latencies. Refuses a table from another device, model or TVM, naming both."""
    import tvm

    d = state.data
    pending = d.get("pending")
    if not pending:
        raise InteropError(f"{state.path}: no round is waiting for measurements")
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT:
        raise InteropError("the results are not a tvm-interop cost table (python -m tvm_interop.runtime.profile_bundle)")
    if table.get("graph_fingerprint") != graph.fingerprint():
        raise InteropError(f"the results were measured for model {table.get('model')!r} (fingerprint "
                           f"{table.get('graph_fingerprint')}), this search is for {d.get('model')!r}")
    if table.get("tvm_version") not in (None, tvm.__version__):
        raise InteropError(f"the results were measured with TVM {table.get('tvm_version')}, this is {tvm.__version__}")
    if d.get("device") and table.get("device") != d["device"]:
        raise InteropError(f"the results were measured on {table.get('device')!r}, but this search measures on "
                           f"{d['device']!r}; use another --active directory for that device")
    bundle_plan = read_json(os.path.join(pending["bundle"], "bundle.json"), "the round's bundle")
    want = {stage_key(st["groups"]) for st in bundle_plan["stages"]}
    got = {row["key"] for row in table.get("stages", [])}
    if not want <= got or len(table.get("programs", [])) != len(bundle_plan.get("programs", [])):
        raise InteropError(f"the results do not cover round {pending['round']}'s bundle ({len(got & want)} of "
                           f"{len(want)} stages, {len(table.get('programs', []))} of "
                           f"{len(bundle_plan.get('programs', []))} programs): were they measured from "
                           f"{pending['bundle']}?")
    device_clock = d.get("clock", "issue") == "device"
    if device_clock and not has_device_clock(table):
        why = (table.get("device_clock") or {}).get("skipped", "measured with the issue clock only")
        raise InteropError(f"the results have no device-clock times ({why}), and this search ranks by the device "
                           "clock: measure the round's bundle on the GPU without --no-device-clock")
    d["device"] = table.get("device")
    merged = read_json(state.costs_path, "costs") if os.path.exists(state.costs_path) else None
    if merged is None:
        merged = {k: v for k, v in table.items()
                  if k not in ("stages", "units", "programs", "fleet", "seconds", "device_clock")}
        merged.update(stages=[], units={}, rounds=0)
    have = {row["key"]: row for row in merged["stages"]}
    for row in table["stages"]:
        have[row["key"]] = {k: row[k] for k in ("key", "groups", "latency", "device_latency") if k in row}
    merged["stages"] = list(have.values())
    merged["units"].update(table.get("units", {}))
    merged["rounds"] = int(merged.get("rounds", 0)) + 1
    if device_clock:   # every round's table had the device clock (checked above): so has the merged one
        merged["device_clock"] = {"statistic": "per round: see the round's own table", "rounds": merged["rounds"]}
    atomic.write_json(state.costs_path, merged)
    names = [pr["name"] for pr in bundle_plan.get("programs", [])]
    for row in table.get("programs", []):
        name = names[row["index"]]
        twin = name.endswith(DEPENDENCY)
        cand = d["candidates"].get(name[:-len(DEPENDENCY)] if twin else name)
        if cand is not None:
            prefix = "measured_dependency" if twin else "measured"
            cand[f"{prefix}_ms"] = row["latency"] * 1e3
            if row.get("device_latency") is not None:
                cand[f"{prefix}_device_ms"] = row["device_latency"] * 1e3
    d["round"] = pending["round"]
    d["history"].append({"round": pending["round"], "stages_measured": len(table["stages"]),
                         "programs_measured": len(table.get("programs", [])),
                         "device_seconds": table.get("seconds"),
                         # the host's share of the round: its search and bundle build (None: an older state)
                         "search_seconds": pending.get("search_seconds"),
                         "best_measured_ms": _best_measured(d)[1]})
    d["pending"] = None
    return merged


def _measured_of(c: dict, clock: str) -> tuple[float | None, str]:
    """A candidate's measured latency on ``clock`` and the lowering that gave it: the better of its stage-mode
    program and its dependency-mode twin (when the round measured one)."""
    suffix = "_device_ms" if clock == "device" else "_ms"
    got = [(c[f"measured{suffix}"], "stage")] if c.get(f"measured{suffix}") is not None else []
    if c.get(f"measured_dependency{suffix}") is not None:
        got.append((c[f"measured_dependency{suffix}"], "dependency"))
    return min(got) if got else (None, "stage")


def _best_measured(d: dict) -> tuple[str | None, float | None]:
    clock = d.get("clock", "issue")
    done = [(_measured_of(c, clock)[0], name) for name, c in d["candidates"].items()]
    done = [x for x in done if x[0] is not None]
    if not done:
        return None, None
    ms, name = min(done)
    return name, ms


def _round_cost_model(state: _State, graph, fallback_spec: str):
    """Round 1: the simulated preset. Later: measured stages exact, others learned from them."""
    from .cost import get_cost_model

    if not os.path.exists(state.costs_path):
        return get_cost_model(fallback_spec)
    from .cost.learned import LearnedCostModel
    from .cost.table import TableCostModel

    table = TableCostModel(state.costs_path, fallback="units", clock=state.data.get("clock", "issue"))
    model = LearnedCostModel(table, graph=None)
    by_name = {u.name: u for u in graph.units}
    for row in table.table["stages"]:
        if len(row["groups"]) > 1:
            model.measure([[by_name[n] for n in g] for g in row["groups"]])
    if len(model._samples) < 4:
        return table        # too few concurrent stages to learn from: compose from the measured units
    return model


def _is_learned(cost) -> bool:
    from .cost.learned import LearnedCostModel

    return isinstance(cost, LearnedCostModel)


# ------------------------------------------------------------------------------------------------ the search
def device_search(program, target, directory: str, *, scheduler: str = "ios", top_k: int = 3, rounds: int = 4,
                  schedulers: tuple[str, ...] | None = None, fleet=None, import_path: str | None = None,
                  model_name: str | None = None, batch: int = 1, fallback_cost: str | None = None,
                  bundle_options: dict | None = None, progress=None, clock: str = "issue") -> DeviceSearchResult:
    """Run (or continue) an active device search in ``directory``; see the module doc. ``scheduler`` is always
    searched; ``schedulers`` (default ios, lios, greedy) add their picks to the candidates. ``fleet``: measure
    each round on it now; without one the call returns ``status="waiting"`` with the bundle to measure, and
    ``import_path`` (the measured cost table) continues. ``clock``: ``issue`` or ``device`` (module doc)."""
    from .schedulers import schedule_graph
    from .target import device_kind, normalize_target, target_text

    t0 = time.perf_counter()
    target = normalize_target(target)
    kind = device_kind(target)
    graph = program.graph
    model_name = model_name or graph.name
    if clock not in CLOCKS:   # checked before the directory exists: a bad call leaves nothing behind
        raise InteropError(f"unknown clock {clock!r}; use one of {', '.join(CLOCKS)}")
    if clock == "device" and kind != "cuda":
        raise InteropError("the device clock times GPU streams: an active search with clock='device' needs a CUDA "
                           "target")
    os.makedirs(directory, exist_ok=True)
    state = _State(directory)
    _check_identity(state, graph, target_text(target), model_name, clock)
    d = state.data
    say = progress or (lambda msg: log.info("%s", msg))
    if import_path:
        _merge_results(state, read_json(import_path, f"results {import_path}"), graph)
        state.save()
        say(f"round {d['round']} imported: best measured program {_best_measured(d)[1]}")
    elif d.get("pending"):
        p = d["pending"]
        raise InteropError(f"round {p['round']} waits for its measurements: run `python -m "
                           f"tvm_interop.runtime.profile_bundle {p['bundle']} -o R.json` on the device, then "
                           "continue with --import R.json")
    names = tuple(dict.fromkeys((scheduler,) + tuple(schedulers or DEFAULT_SCHEDULERS)))
    fallback_cost = fallback_cost or ("sim:cpu" if kind == "cpu" else "sim:h100")
    while True:
        if d["round"] >= rounds:
            break
        t_round = time.perf_counter()
        cost = _round_cost_model(state, graph, fallback_cost)
        picks = []
        priced_by = "the simulated device" if d["round"] == 0 else (
            "the measured table" + (" + learned stages" if _is_learned(cost) else ""))
        for name in names:
            # a bundle cannot build IOS's merged kernels (passes.profile_bundle): concurrent stages only
            opts = {"guard": False, "merge": False} if name == "ios" else {}
            say(f"round {d['round'] + 1}: {name} searching under {priced_by} ...")
            t_search = time.perf_counter()
            try:
                s = schedule_graph(graph, name, cost, model_name=model_name, batch=batch, **opts)
            except InteropError as err:
                log.warning("device search: %s failed under the round's cost (%s)", name, err)
                continue
            say(f"round {d['round'] + 1}: {name} predicts {(s.predicted_latency or 0.0) * 1e3:.3f} ms "
                f"({time.perf_counter() - t_search:.1f} s)")
            picks.append((s.predicted_latency or 0.0, name, s))
        picks.sort(key=lambda p: p[0])
        chosen, seen = [], set()
        for pred, name, s in picks:
            sig = _schedule_signature(s)
            if sig in seen:
                continue
            seen.add(sig)
            chosen.append((pred, name, s, sig))
            if len(chosen) >= top_k:
                break
        measured_keys = set()
        if os.path.exists(state.costs_path):
            measured_keys = {row["key"] for row in read_json(state.costs_path, "costs")["stages"]}
        new_stages: dict[str, dict] = {}
        if d["round"] == 0:   # every unit alone: what the learned model's features are made of
            for u in graph.units:
                new_stages.setdefault(stage_key([[u.name]]), {"groups": [[u.name]], "sources": ["unit"]})
        programs = []
        for pred, name, s, sig in chosen:
            cname = f"r{d['round'] + 1}:{name}"
            known = next((n for n, c in d["candidates"].items() if c["signature"] == sig), None)
            if known is None:
                d["candidates"][cname] = {"signature": sig, "scheduler": name, "round": d["round"] + 1,
                                          "predicted_ms": pred * 1e3, "measured_ms": None,
                                          "schedule": s.to_json()}
                known = cname
            if d["candidates"][known]["measured_ms"] is None:
                programs.append({"name": known, "stages": [st.groups for st in s.stages]})
                if kind == "cuda" and any(len(st.groups) > 1 for st in s.stages):
                    programs.append({"name": known + DEPENDENCY, "stages": [st.groups for st in s.stages],
                                     "mode": "dependency"})
            for st in s.stages:
                key = stage_key(st.groups)
                if key not in measured_keys and key not in new_stages:
                    new_stages[key] = {"groups": [list(g) for g in st.groups], "sources": [name]}
        if not new_stages and not programs:
            say(f"round {d['round'] + 1}: the top {top_k} picks are measured already; stopping")
            break
        from .profile_bundle import BundleOptions, build_profile_bundle

        bdir = os.path.join(directory, f"round-{d['round'] + 1}")
        if os.path.exists(bdir):
            import shutil

            shutil.rmtree(bdir)   # a bundle built before an interruption: rebuilt from the same state
        build_profile_bundle(program, target, bdir, BundleOptions(**(bundle_options or {})),
                             stages=list(new_stages.values()), programs=programs)
        d["pending"] = {"round": d["round"] + 1, "bundle": bdir, "stages": len(new_stages),
                        "programs": len(programs), "search_seconds": time.perf_counter() - t_round}
        state.save()
        say(f"round {d['round'] + 1}: {len(new_stages)} stages and {len(programs)} programs to measure -> {bdir}")
        if fleet is None:
            return DeviceSearchResult("waiting", None, bdir, list(d["history"]), _candidate_rows(d), directory,
                                      optimisation_cost(d))
        from .fleet.bundle import measure_bundle_on_fleet

        table = measure_bundle_on_fleet(bdir, fleet, out=os.path.join(bdir, "costs.json"))
        _merge_results(state, table, graph)
        state.save()
        say(f"round {d['round']} measured on {table['device']}: best program so far "
            f"{_best_measured(d)[1]:.3f} ms")
    best_name, best_ms = _best_measured(d)
    if best_name is None:
        raise InteropError(f"{directory}: no program has been measured yet (rounds={rounds})")
    sched = Schedule.from_json(d["candidates"][best_name]["schedule"])
    sched.measured_latency = best_ms / 1e3
    sched.search["device_search"] = {"directory": directory, "rounds": d["round"], "device": d["device"],
                                     "shipped": best_name, "history": d["history"],
                                     "candidates": _candidate_rows(d),
                                     "seconds_this_call": time.perf_counter() - t0}
    sched.search["device_search"]["clock"] = d.get("clock", "issue")
    sched.search["device_search"]["optimisation_cost"] = optimisation_cost(d)
    mode = _measured_of(d["candidates"][best_name], d.get("clock", "issue"))[1]
    sched.search["device_search"]["measured_mode"] = mode
    sched.search["shipped_because"] = (f"lowest measured whole-program latency ({best_ms:.3f} ms, "
                                       f"{d.get('clock', 'issue')} clock, {mode} mode) of the picks")
    state.save()
    return DeviceSearchResult("done", sched, None, list(d["history"]), _candidate_rows(d), directory,
                              optimisation_cost(d))


def optimisation_cost(d: dict) -> dict:
    """What the search has cost so far, the number IOS publishes beside its schedules: the host's search and
    bundle builds plus the device's measuring, summed over the rounds (the waiting round's search included).
    Rounds recorded before the search time was kept are counted in ``unrecorded_rounds``, not guessed."""
    rounds = list(d.get("history", []))
    searched = [h.get("search_seconds") for h in rounds]
    pending = d.get("pending") or {}
    if pending:
        searched.append(pending.get("search_seconds"))
    device = [h.get("device_seconds") for h in rounds]
    return {"search_seconds": sum(s for s in searched if s is not None),
            "device_seconds": sum(s for s in device if s is not None),
            "unrecorded_rounds": sum(1 for s in searched if s is None)}


def _candidate_rows(d: dict) -> list[dict]:
    return [{"name": n, "scheduler": c["scheduler"], "round": c["round"], "predicted_ms": c["predicted_ms"],
             "measured_ms": c["measured_ms"], "measured_device_ms": c.get("measured_device_ms"),
             "measured_dependency_ms": c.get("measured_dependency_ms"),
             "measured_dependency_device_ms": c.get("measured_dependency_device_ms")}
            for n, c in d["candidates"].items()]
