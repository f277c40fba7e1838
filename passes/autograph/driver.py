"""``scheduler="autograph"`` from a cost spec: how the compile API and the CLI run the AutoGraph search.

Why a driver: AutoGraph is not a graph scheduler like the others — it changes the model, so it needs the Relax
module before legalization, a way to prepare each candidate exactly as the build will, and a cost model per
candidate (a measured cost times *that* candidate's kernels). This module turns the user's options into those
callbacks, so ``tvm_interop.compile`` and ``tvm-interop schedule`` mean the same thing by the same options.
"""
from __future__ import annotations

from typing import Callable

from tvm_interop.runtime.errors import InteropError

from ..cost.simulated import SimulatedDevice

#: options of the search itself; every other option goes to the scheduler that schedules each candidate
SEARCH_OPTIONS = ("scheduler", "top_k", "max_part_nodes", "max_states", "max_depth", "relax", "alpha", "rules",
                  "check")
DEFAULT_SCHEDULER = "ios"


def split_options(options: dict | None) -> tuple[dict, str, dict]:
    """(search options, the per-candidate scheduler's name, that scheduler's options)."""
    options = dict(options or {})
    search = {k: options.pop(k) for k in SEARCH_OPTIONS if k in options}
    inner = search.pop("scheduler", DEFAULT_SCHEDULER)
    if inner == "autograph":
        raise InteropError("autograph's scheduler option names the scheduler of each candidate; it cannot be "
                           "autograph itself")
    rules = search.get("rules")
    if isinstance(rules, str):
        search["rules"] = [r for r in rules.split(",") if r]
    return search, inner, options


def estimate_device(cost, device_kind: str) -> SimulatedDevice:
    """The simulated device of the mixed critical-path estimate: the cost model itself when it is simulated, else
    the preset for the device kind (the estimate only ranks candidates; the real cost model verifies them)."""
    from ..cost import get_cost_model
    from ..cost.registry import default_spec

    if isinstance(cost, SimulatedDevice):
        return cost
    if isinstance(cost, str) and cost.startswith("sim"):
        return get_cost_model(cost)
    model = get_cost_model(default_spec(device_kind))
    if not isinstance(model, SimulatedDevice):
        raise InteropError("autograph needs the simulated device model for its estimate")
    return model


def run_autograph(mod, *, prepare: Callable, cost_for: Callable, device_kind: str, cost_spec,
                  options: dict | None = None, model_name: str = "model", batch: int = 1,
                  max_block_size: int | None = None, progress: Callable[[str], None] | None = None):
    """AutoGraph on ``mod``: ``prepare(module) -> Program``; ``cost_for(program) -> (cost model, close)`` gives the
    cost each candidate is scheduled under (``close`` releases a timed one). Returns :class:`AutographResult`."""
    from ..cost import get_cost_model
    from ..schedulers.block_memo import BlockMemo, prices_by_structure
    from ..search import search_schedule
    from .search import autograph_search

    search_opts, inner, inner_opts = split_options(options)
    # the candidates share most of their blocks: under a cost that prices by structure, each block is searched once
    memo = BlockMemo()

    def schedule(program):
        cost, close = cost_for(program)
        try:
            model = get_cost_model(cost)
            extra = {"memo": memo} if prices_by_structure(model) else {}
            sched = search_schedule(program.graph, inner, model, max_block_size=max_block_size,
                                    model_name=model_name, batch=batch, **extra, **inner_opts)
        finally:
            close()
        return sched

    result = autograph_search(mod, prepare=prepare, schedule=schedule, device=estimate_device(cost_spec, device_kind),
                              progress=progress, **search_opts)
    sched = result.schedule
    sched.search["autograph"]["scheduler"] = inner
    sched.search["autograph"]["blocks_reused"] = memo.hits
    sched.search["autograph"]["blocks_searched"] = memo.misses
    sched.scheduler = "autograph"
    return result
