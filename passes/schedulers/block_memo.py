"""Reuse a block's schedule when the same block comes back: a memo keyed by the block's structure.

Why: AutoGraph (``passes.autograph``) schedules several candidate graphs that differ only where a substitution
was applied; every other block is the same kernels in the same wiring, and re-running ios's dynamic program on
them re-finds the same stages (RandWire: about 27 s per candidate). A memo shared by those calls hands back the
stored stages instead.

It is only sound when the cost model prices a unit by what the key holds -- kind, shapes, FLOPs, bytes moved,
attributes -- and nothing else: a cost model says so with ``prices_by_structure = True`` (the simulated
device). Measured and table costs time real kernels by name and hash, so blocks priced by them are never
memoised.

The key of a block: the scheduler's name and options, the cost model's fingerprint, and per unit in block
order its structural signature (names dropped; the tensors named in ``attrs`` renamed by first appearance,
so the merge strategy still sees which units read the same tensor), the signatures of its kernels when it is
a chain, and the positions of its predecessors in the block. Stages are stored by unit position and mapped
back onto the names of the block that asks.
"""
from __future__ import annotations

import json
from copy import copy
from typing import Any, Mapping

from ..graph import OpGraph
from ..schedule import Stage
from .result import SchedulerResult, SearchStats

__all__ = ["BlockMemo", "prices_by_structure"]


def prices_by_structure(cost) -> bool:
    """Whether ``cost`` prices units by their structure only (so equal blocks cost the same)."""
    return bool(getattr(cost, "prices_by_structure", False))


class BlockMemo:
    """Stored block schedules; pass one to ``schedule_graph(..., memo=...)`` across related graphs."""

    def __init__(self) -> None:
        self._store: dict[str, tuple[list[tuple[list[list[int]], str]], SearchStats, dict[int, int] | None]] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._store)

    def key(self, scheduler: str, options: Mapping[str, Any], cost, block: OpGraph,
            members: Mapping[str, list[str]], kernels: OpGraph) -> str:
        """The structural key of ``block`` (see the module docstring)."""
        names: dict[str, int] = {}

        def canon(value):
            if isinstance(value, str):
                return ["t", names.setdefault(value, len(names))]
            return value

        def unit_sig(u) -> dict:
            d = u.to_json()
            d.pop("name")
            d.pop("func_name", None)
            # names: the tensor a conv reads (renamed by first appearance: merges need "the same tensor"), and a
            # chain's kernel names (their signatures are in the key instead)
            d["attrs"] = {k: canon(v) if k == "data" else v for k, v in sorted(d.get("attrs", {}).items())
                          if k != "kernels"}
            return d

        position = {u.name: i for i, u in enumerate(block.units)}
        units = []
        for u in block.units:
            ks = members.get(u.name, [u.name])
            units.append({"unit": unit_sig(u),
                          "kernels": [unit_sig(kernels.unit(k)) for k in ks] if len(ks) > 1 else [],
                          "preds": sorted(position[p] for p in block.pred_names(u.name))})
        payload = {"scheduler": scheduler, "options": {k: repr(v) for k, v in sorted(options.items())},
                   "cost": cost.device_fingerprint, "units": units}
        return json.dumps(payload, sort_keys=True, default=repr)

    def get(self, key: str, block: OpGraph) -> SchedulerResult | None:
        """The stored result mapped onto ``block``'s unit names, or None."""
        hit = self._store.get(key)
        if hit is None:
            self.misses += 1
            return None
        self.hits += 1
        stages, stats, devices = hit
        names = [u.name for u in block.units]
        out = [Stage([[names[i] for i in g] for g in groups], strategy) for groups, strategy in stages]
        unit_devices = None if devices is None else {names[i]: d for i, d in devices.items()}
        return SchedulerResult(out, copy(stats), unit_devices)

    def put(self, key: str, block: OpGraph, result: SchedulerResult) -> None:
        position = {u.name: i for i, u in enumerate(block.units)}
        stages = [([[position[n] for n in g] for g in st.groups], st.strategy) for st in result.stages]
        devices = None if result.unit_devices is None else \
            {position[n]: d for n, d in result.unit_devices.items() if n in position}
        self._store[key] = (stages, copy(result.stats), devices)
