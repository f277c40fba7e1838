"""Cost model from a measured cost table (spec ``"table:FILE"``), as written by ``runtime.profile_bundle``.

``unit_latency`` and ``stage_latency`` return the measured latencies of the stages in the table. A stage that is
not in it (a search asked for something the bundle did not build) is handled by ``fallback``:

* ``"units"`` (default): estimated from the measured latencies of its units as the longest group (a group costs
  the sum of its units; no contention, no sync overhead) — and counted in ``misses``, with one warning;
* ``"error"``: raises InteropError naming the stage and the table;
* any other cost-model spec (``"sim:h100"``): that model answers.

A unit missing from the table is answered by the fallback model, or an error (``"error"`` and ``"units"`` have
nothing to compose it from). Spec forms: ``table:costs.json``, ``table:costs.json;fallback=error``,
``table:costs.json;fallback=sim:h100``, ``table:costs.json;clock=device``. A table made for another model (graph
fingerprint) is refused by :meth:`TableCostModel.check_graph`.

``clock``: which of a GPU table's two times prices a stage (``runtime.profile_bundle``): ``issue`` (``latency``,
calls back to back: the host's pace where a stage's host work outlasts its kernels, as in a direct program) or
``device`` (``device_latency``, calls queued behind a held stream: the device's pace, as in a CUDA graph, where
host work is gone). A compile that builds a CUDA graph takes ``device`` when the table has it
(:func:`spec_for_build`). A row the device clock could not time keeps its issue time and is counted.
"""
from __future__ import annotations

import logging
from typing import Sequence

from tvm_interop.runtime.errors import InteropError
from tvm_interop.runtime.json_file import read_json
from tvm_interop.runtime.profile_bundle import stage_key, unit_row

from ..graph import OpGraph, Unit
from . import registry
from .base import CostModel

log = logging.getLogger(__name__)

TABLE_FORMAT = "tvm-interop-cost-table"
CLOCKS = ("issue", "device")


def _key(groups: Sequence[Sequence[str]], strategy: str = "concurrent") -> str:
    return stage_key(groups, strategy)


def has_device_clock(table: dict) -> bool:
    """Whether a cost table was measured with the device clock too (a GPU table from this version on)."""
    clock = table.get("device_clock")
    return isinstance(clock, dict) and "skipped" not in clock


def _read_table(path: str) -> dict:
    table = read_json(path, f"cost table {path}")
    if not isinstance(table, dict) or table.get("format") != TABLE_FORMAT:
        raise InteropError(f"{path} is not a tvm-interop cost table (run python -m tvm_interop.runtime.profile_bundle)")
    _check_table(path, table)
    return table


def _time(value, device: bool = False) -> bool:
    if device and value is None:   # a row the device clock could not time
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0.0 and value == value \
        and value != float("inf")


def _check_table(path: str, table: dict) -> None:
    """A damaged or hand-edited table is refused naming the first bad entry, never a KeyError or a wrong price."""
    units = table.get("units", {})
    if not isinstance(units, dict):
        raise InteropError(f"cost table {path}: 'units' is not an object of unit -> seconds")
    for u, v in units.items():
        if not _time(v):
            raise InteropError(f"cost table {path}: unit {u!r} has no valid time ({v!r}); the table is damaged: "
                               "measure the bundle again")
    stages = table.get("stages", [])
    if not isinstance(stages, list):
        raise InteropError(f"cost table {path}: 'stages' is not a list")
    for i, st in enumerate(stages):
        groups = st.get("groups") if isinstance(st, dict) else None
        why = None
        if not isinstance(groups, list) or not groups or not all(isinstance(g, list) and g for g in groups):
            why = "no groups"
        elif not isinstance(st.get("key"), str):
            why = "no key"
        elif not _time(st.get("latency")):
            why = f"no valid latency ({st.get('latency')!r})"
        elif not _time(st.get("device_latency"), device=True):
            why = f"no valid device_latency ({st.get('device_latency')!r})"
        if why:
            raise InteropError(f"cost table {path}: stage row {i} has {why}; the table is damaged: measure the "
                               "bundle again")


class TableCostModel(CostModel):
    def __init__(self, path: str, fallback: str = "units", clock: str = "issue"):
        table = _read_table(path)
        if clock not in CLOCKS:
            raise InteropError(f"unknown cost table clock {clock!r}; use one of {', '.join(CLOCKS)}")
        if clock == "device" and not has_device_clock(table):
            why = (table.get("device_clock") or {}).get("skipped", "it was measured with the issue clock only")
            raise InteropError(f"cost table {path} has no device-clock times ({why}); measure the bundle on the GPU "
                               "with this tvm-interop (without --no-device-clock), or use clock=issue")
        self.path = path
        self.table = table
        self.clock = clock
        rows = table.get("stages", [])
        untimed = [clock == "device" and st.get("device_latency") is None for st in rows]
        self.clock_fallbacks = sum(untimed)   # rows the device clock could not time: priced at their issue time
        lats = [float(st["latency"] if miss or clock == "issue" else st["device_latency"])
                for st, miss in zip(rows, untimed)]
        if clock == "issue":
            self.units = {str(k): float(v) for k, v in table.get("units", {}).items()}
        else:   # a unit's own row: its concurrent one-unit stage
            self.units = {unit_row(st): lat for st, lat in zip(rows, lats) if unit_row(st) is not None}
        self.stages = {st["key"]: lat for st, lat in zip(rows, lats)}
        # a unit's cuDNN / cuBLAS call timed alone (``profile-bundle --library-units``): stage "library:<unit>"
        self.library = {st["groups"][0][0]: lat for st, lat in zip(rows, lats) if st.get("strategy") == "library"}
        self.fallback_spec = fallback
        self._fallback_model: CostModel | None = None
        if fallback not in ("units", "error"):
            from . import get_cost_model

            self._fallback_model = get_cost_model(fallback)
        self.hits = 0
        self.misses = 0
        self._warned = False
        self.name = f"table:{table.get('device', '?')}" + (":device-clock" if clock == "device" else "")

    @property
    def device_fingerprint(self) -> str:
        return str(self.table.get("device", "table"))

    def check_graph(self, graph: OpGraph, model_name: str = "") -> None:
        """Refuse a table measured for another model or batch size (their graphs differ: the fingerprint covers
        every unit's shapes) or with another TVM version (other kernels), naming both sides."""
        fp = self.table.get("graph_fingerprint")
        if fp and fp != graph.fingerprint():
            raise InteropError(f"cost table {self.path} was measured for model {self.table.get('model')!r} (graph "
                               f"fingerprint {fp}); this is model {model_name or graph.name!r} (fingerprint "
                               f"{graph.fingerprint()}): another model or batch size. Build and measure a bundle "
                               "for this model")
        import tvm

        theirs = self.table.get("tvm_version")
        if theirs and theirs != tvm.__version__:
            raise InteropError(f"cost table {self.path} was measured with TVM {theirs}, this is TVM {tvm.__version__}: "
                               "its kernels are other code; measure a bundle built with this TVM")

    def check_target(self, target_text: str) -> None:
        """Refuse a table measured for another target (another GPU arch or device kind), naming both."""
        theirs = self.table.get("target")
        if theirs and target_text and theirs.split()[0] == target_text.split()[0] and theirs != target_text:
            raise InteropError(f"cost table {self.path} was measured for {theirs!r}; this build is for "
                               f"{target_text!r}: measure a bundle built for this target")
        if theirs and target_text and theirs.split()[0] != target_text.split()[0]:
            raise InteropError(f"cost table {self.path} was measured for {theirs!r}, not for {target_text!r}")

    def composed_report(self) -> str | None:
        """How many stage costs were not in the table and were composed by the fallback, and how many rows the
        device clock could not time (None: neither happened)."""
        parts = []
        if self.misses:
            parts.append(f"{self.misses} of {self.hits + self.misses} stage costs the search asked for were not in "
                         f"the cost table {self.path} and were composed by the {self.fallback_spec!r} fallback")
        if self.clock_fallbacks:
            parts.append(f"{self.clock_fallbacks} rows of {self.path} have no device-clock time and are priced at "
                         "their issue-clock time")
        return "; ".join(parts) or None

    def implementation_times(self) -> dict[str, tuple[float | None, float | None]]:
        """``{unit: (TVM kernel seconds, library call seconds)}`` for every unit with a library measurement: what
        ``units="auto"`` chooses by (``passes.offload.plan_offload``)."""
        return {u: (self.units.get(u), lat) for u, lat in self.library.items()}

    # ------------------------------------------------------------------ interface
    def unit_latency(self, unit: Unit) -> float:
        library = unit.attrs.get("library")   # a cuDNN / cuBLAS unit: its own measurement, never the TVM kernel's
        lat = (self.library if library else self.units).get(unit.name)
        if lat is not None:
            self.hits += 1
            return lat
        self.misses += 1
        if self._fallback_model is not None:
            return self._fallback_model.unit_latency(unit)
        if library:
            raise InteropError(f"unit {unit.name!r} runs as a {library} call, which the cost table {self.path} did "
                               "not measure; build the profiling bundle with --library-units")
        raise InteropError(f"unit {unit.name!r} is not in the cost table {self.path} (measured for model "
                           f"{self.table.get('model')!r}); was the bundle built for this model?")

    def stage_latency(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> float:
        groups = [g for g in groups if len(g)]
        if not groups:
            return 0.0
        names = [[u.name for u in g] for g in groups]
        # a measured stage ran TVM's kernels: with library units in it, it is composed from their own times
        lat = None if any(u.attrs.get("library") for g in groups for u in g) else self.stages.get(_key(names, strategy))
        if lat is not None:
            self.hits += 1
            return lat
        if strategy == "wave":   # a fused kernel's time cannot be composed from its members'
            raise InteropError(f"the cost table {self.path} has no measurement of the fused stage {names}; build the "
                               "profiling bundle with --wave-fusion")
        if len(groups) == 1 and len(groups[0]) == 1:
            return self.unit_latency(groups[0][0])
        self.misses += 1
        if self.fallback_spec == "error":
            raise InteropError(f"stage {names} ({strategy}) is not in the cost table {self.path}; build the bundle "
                               "with the options of this search, or use fallback=units / fallback=sim:...")
        if not self._warned:
            self._warned = True
            log.warning("cost table %s lacks some stages the search asked for (first: %s); using the %s fallback",
                        self.path, names, self.fallback_spec)
        if self._fallback_model is not None:
            return self._fallback_model.stage_latency(groups, strategy)
        if strategy == "merge":
            return max(self.unit_latency(g[0]) for g in groups)
        return max(sum(self.unit_latency(u) for u in g) for g in groups)

    def stats(self) -> dict:
        return {"table": self.path, "hits": self.hits, "misses": self.misses, "fallback": self.fallback_spec,
                "composed_from_fallback": self.misses, "clock": self.clock, "clock_fallbacks": self.clock_fallbacks}


def _factory(arg: str | None = None, **kwargs) -> TableCostModel:
    if not arg:
        raise InteropError("the table cost model needs a file: cost='table:costs.json'")
    path, options = _parse(arg)
    return TableCostModel(path, fallback=options.get("fallback", kwargs.pop("fallback", "units")),
                          clock=options.get("clock", kwargs.pop("clock", "issue")))


def _parse(arg: str) -> tuple[str, dict[str, str]]:
    """``FILE;k=v;...`` -> (FILE, {k: v}); only the options this model knows."""
    path, _, opts = arg.partition(";")
    options: dict[str, str] = {}
    for part in filter(None, opts.split(";")):
        k, _, v = part.partition("=")
        if k.strip() not in ("fallback", "clock") or not v:
            raise InteropError(f"unknown cost table option {part!r}; use table:FILE;fallback=units|error|<cost spec>"
                               f";clock={'|'.join(CLOCKS)}")
        options[k.strip()] = v.strip()
    return path, options


def spec_for_build(spec, cuda_graph: bool):
    """The table spec a build prices with: a build with a CUDA graph runs at the device's pace, so a table that
    has device-clock times is read with ``clock=device`` unless the spec names a clock. Anything else unchanged."""
    if not (isinstance(spec, str) and spec.startswith("table:")) or not cuda_graph:
        return spec
    path, options = _parse(spec[len("table:"):])
    if "clock" in options or not has_device_clock(_read_table(path)):
        return spec
    log.info("cost table %s: the build has a CUDA graph, so stages are priced at their device-clock times", path)
    return spec + ";clock=device"


registry.register("table", _factory)
