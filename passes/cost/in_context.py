"""Cost tables with stage costs measured in context (issue 12, "costs that compose").

A cost table (``runtime.profile_bundle``) times every stage alone, warm, back to back: what the stage costs
without its program around it. Summed over a schedule, those costs missed the H100 programs by 1.3-1.8x (launch
gaps, host work between stages, events). A program lowered with stage timing (``passes.lower_streams``,
``stage_timing=True``; ``gpu_check`` builds one per direct stage-mode variant) records what each of its stages
cost *inside* the program, and those costs add up to the program by construction.

:func:`merge_in_context` puts them into a table: every stage seen in a timed program gets its in-context cost
(the median over the programs it was seen in), keeping the isolated one beside it (``isolated_latency``); stages
never seen in context keep their isolated cost, scaled by the median in-context / isolated ratio of the stages that
were seen (``scale_unseen``; the units too): unscaled, every stage not yet timed in a program would look cheaper
than the ones that were, only because it was timed alone, and a search would prefer it for that reason. A
scheduler searching with such a table (``--cost table:FILE``) prices the programs already measured at what they
cost and the rest at the calibrated estimate: the next round of measurements is where those two disagree.
"""
from __future__ import annotations

import statistics
from typing import Iterable, Mapping

from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.profile_bundle import TABLE_FORMAT, stage_key

IN_CONTEXT_SOURCE = "in-context"


def merge_in_context(table: Mapping, timed: Iterable[Mapping], source: str = "", scale_unseen: bool = True) -> dict:
    """A copy of ``table`` (a cost table dict) whose stages seen in ``timed`` carry their in-context cost.

    ``timed``: records of timed programs, each ``{"stages": [[[unit, ...], ...], ...] (groups per stage),
    "stages_ms": [ms per stage], "name": ...}`` (``gpu_check``'s ``in_context``). Every unit must be one of the
    table's (another model's program is refused, naming the unit), and a record whose stage and time counts
    differ is refused. ``source`` is recorded (e.g. the gpu_check result it came from). ``scale_unseen``: the
    stages and units not seen in context are scaled by the seen stages' median in-context / isolated ratio
    (recorded as ``in_context.unseen_scale``; the isolated value stays in ``isolated_latency``)."""
    if not isinstance(table, Mapping) or table.get("format") != TABLE_FORMAT:
        raise InteropError("merge_in_context: the base is not a tvm-interop cost table")
    units = set(table.get("units", {}))
    seen: dict[str, list[float]] = {}
    groups_of: dict[str, list[list[str]]] = {}
    programs = 0
    for rec in timed:
        stages, times = rec.get("stages"), rec.get("stages_ms")
        name = rec.get("name", "?")
        if not stages or times is None or len(stages) != len(times):
            raise InteropError(f"timed program {name}: {len(stages or [])} stages but "
                               f"{len(times or [])} stage times")
        for groups, ms in zip(stages, times):
            for g in groups:
                for u in g:
                    if u not in units:
                        raise InteropError(f"timed program {name} runs unit {u!r}, which the cost table (model "
                                           f"{table.get('model')!r}) does not have: another model's program?")
            if ms is None or not ms >= 0.0:
                raise InteropError(f"timed program {name}: stage {groups} has no time ({ms!r})")
            key = stage_key(groups, "concurrent")
            seen.setdefault(key, []).append(float(ms) * 1e-3)
            groups_of[key] = [list(g) for g in groups]
        programs += 1
    isolated = {st["key"]: float(st["latency"]) for st in table.get("stages", []) if "key" in st}
    ratios = [statistics.median(lat) / isolated[k] for k, lat in seen.items() if isolated.get(k, 0.0) > 0.0]
    scale = statistics.median(ratios) if scale_unseen and ratios else 1.0
    out = {k: v for k, v in table.items() if k not in ("stages", "device_clock")}
    if "device_clock" in table:
        # in-context times come from direct programs (the issue clock's world): the isolated device-clock times
        # beside them would price the same stages on another clock, so the merged table has the issue clock only
        out["device_clock"] = {"skipped": "in-context stage times are from direct programs; device times dropped"}
    out["units"] = {u: float(v) * scale for u, v in table.get("units", {}).items()}
    stages_out = []
    for st in table.get("stages", []):
        st = dict(st)
        st.pop("device_latency", None)
        if st.get("key") in seen:
            lat = seen.pop(st["key"])
            st.update(isolated_latency=st["latency"], latency=statistics.median(lat),
                      sources=[IN_CONTEXT_SOURCE], in_context_samples=len(lat))
        elif scale != 1.0:
            st.update(isolated_latency=st["latency"], latency=float(st["latency"]) * scale)
        stages_out.append(st)
    for key, lat in seen.items():   # stages the bundle never timed alone
        stages_out.append({"index": len(stages_out), "key": key, "groups": groups_of[key],
                           "latency": statistics.median(lat), "sources": [IN_CONTEXT_SOURCE],
                           "in_context_samples": len(lat), "strategy": "concurrent"})
    out["stages"] = stages_out
    out["in_context"] = {"programs": programs, "stages": sum(1 for s in stages_out
                                                              if IN_CONTEXT_SOURCE in s.get("sources", [])),
                         "unseen_scale": scale, "source": source}
    return out
