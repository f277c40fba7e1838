"""A measured cost table standing in for the device of an active search (``passes.device_search``).

Why: the active search (search -> a bundle of what the picks need measured -> the device -> refit -> search) is
the GPU twin of the CPU ``learned`` cost, and GPU time is scarce. The H100 cost tables in
``shared/gpu-data/h100-2026-11-22`` are real device measurements of thousands of stages of a model: answering a
round's bundle from such a table exercises the whole loop here, with real H100 numbers, and says what the search
would ship before a GPU session spends device time on it. What the answer is made of, stated in it:

* **stages**: the table's own measurements, exactly (stage key lookup); a stage the table never measured is
  composed from its units' measured latencies (the longest group) and *counted* (``composed_stages``); a unit the
  table lacks is refused;
* **whole programs** (the candidates' measured latency, which decides what ships): no table measured them, so
  they are **predicted** by the fitted whole-program model (``passes.cost.program``: the program's stages back to
  back as the bundle's program function runs them, forks and joins on streams, from the table's unit latencies and
  its timing protocol); ``programs_from`` says so.

The answer is a cost table (``runtime.profile_bundle``'s format) whose ``device`` names the stand-in
(``<the table's device> [stand-in: <table file>]``), so a search answered by a table can never be continued with
measurements of a real device (``device_search`` refuses a device change), and ``method`` says what answered.
"""
from __future__ import annotations

import os
import time

from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.json_file import read_json
from tvm_interop.runtime.profile_bundle import TABLE_FORMAT, stage_key

STAND_IN_METHOD = "stand-in: stages from a measured cost table, programs predicted by passes.cost.program"


def answer_bundle(bundle_dir: str, table_path: str, graph, out: str | None = None, params=None) -> dict:
    """The cost table that ``table_path`` answers for the profiling bundle in ``bundle_dir`` (see the module doc);
    written to ``out`` when given. ``graph``: the model's OpGraph (work items and classes of its units for the
    program model); the table, the bundle and the graph must be the same model."""
    from .cost.program import IssuedProgram, ProgramCostModel, load_fitted, simulate, stage_ops
    from .cost.table import TableCostModel

    t0 = time.perf_counter()
    plan = read_json(os.path.join(bundle_dir, "bundle.json"), f"profiling bundle {bundle_dir}")
    table = TableCostModel(table_path)
    table.check_graph(graph, str(plan.get("model") or graph.name))
    if plan.get("graph_fingerprint") != graph.fingerprint():
        raise InteropError(f"bundle {bundle_dir} was built for model {plan.get('model')!r} (fingerprint "
                           f"{plan.get('graph_fingerprint')}), not for {graph.name!r} ({graph.fingerprint()})")
    table.check_target(str(plan.get("target") or ""))
    by_name = {u.name: u for u in graph.units}
    stages = []
    composed = 0
    for st in plan["stages"]:
        groups = [list(g) for g in st["groups"] if len(g)]
        strategy = st.get("strategy", "concurrent")
        misses = table.misses   # the table model counts what it had to compose
        lat = table.stage_latency([[by_name[u] for u in g] for g in groups], strategy)
        composed += table.misses > misses
        stages.append({"key": stage_key(groups, strategy), "groups": groups, "latency": float(lat),
                       "sources": st.get("sources", []), "strategy": strategy})
    number = int(table.table.get("number") or 0)
    model = ProgramCostModel(table.units, params or load_fitted(), timing_number=number)
    units = model.unit_inputs(graph)
    programs = []
    # a dependency-mode twin (``mode: "dependency"``) is predicted as its stage-mode program: the protocol model
    # replays stages back to back; it never ranks a pick above its own stage-mode program
    for k, pr in enumerate(plan.get("programs", [])):
        ops = [op for groups in pr["stages"] for op in stage_ops(groups)]
        streams = max((len(groups) for groups in pr["stages"]), default=1)
        prog = IssuedProgram(ops, num_streams=streams if streams > 1 else 0, name=pr["name"])
        programs.append({"index": k, "name": pr["name"], "stages": len(pr["stages"]),
                         "latency": simulate(prog, units, model.params).latency})
    src = table.table
    answer = {
        "format": TABLE_FORMAT, "version": src.get("version", 1), "model": plan.get("model"),
        "graph_fingerprint": plan.get("graph_fingerprint"), "target": plan.get("target"),
        "device_kind": src.get("device_kind"),
        "device": f"{src.get('device', '?')} [stand-in: {os.path.basename(table_path)}]",
        "tvm_version": src.get("tvm_version"), "method": STAND_IN_METHOD, "statistic": src.get("statistic"),
        "repeat": src.get("repeat"), "number": src.get("number"), "warmup": src.get("warmup"),
        "units": {s["groups"][0][0]: s["latency"] for s in stages
                  if s["strategy"] == "concurrent" and len(s["groups"]) == 1 and len(s["groups"][0]) == 1},
        "stages": stages, "programs": programs, "seconds": time.perf_counter() - t0,
        "stand_in": {"table": os.path.abspath(table_path), "composed_stages": composed,
                     "table_stages": len(stages) - composed, "programs_from": "passes.cost.program (predicted)"},
    }
    if out:
        from tvm_interop.runtime import atomic

        atomic.write_json(out, answer)
    return answer


__all__ = ["STAND_IN_METHOD", "answer_bundle"]
