"""From a cost spec to a schedule: which cost model, which search driver.

Simulated and table costs go straight to ``schedulers.schedule_graph``. The *timed* specs need the program's
built kernels: ``measured`` (every stage the search asks for is timed) and ``learned[:options]`` (XGBoost on
timed stages, searched by ``schedulers.active.active_search``, which measures every pick). The compile API,
the CLI and the ``passes.pipeline`` pass all come through here, so a spec means the same everywhere.
"""
from __future__ import annotations

from tvm_interop.runtime.errors import InteropError


def is_timed_cost(spec) -> bool:
    """True for the cost specs that time real kernels on this machine: ``measured`` and ``learned[:options]``."""
    return isinstance(spec, str) and spec.partition(":")[0] in ("measured", "learned")


def timed_cost_model(program, target, spec: str, cache=None, batch: int = 1, fleet=None):
    """The cost model for ``measured`` (every stage timed) or ``learned[:options]`` (XGBoost on timed stages, see
    ``passes.cost.learned``) over ``program``'s kernels. Timing runs the kernels here, or on the CPU devices of
    ``fleet`` (``passes.fleet``), so the target must be a CPU."""
    from .cost.measured import MeasuredCostModel
    from .target import normalize_target

    kind = normalize_target(target).kind.name
    if kind not in ("llvm", "c"):
        raise InteropError(f"cost={spec!r} times kernels on this machine's CPU, not on a {kind} device; for a GPU "
                           "target measure on the GPU with a profiling bundle (tvm-interop profile-bundle, then "
                           "cost='table:FILE')")
    options = _learned_options(spec) if spec.partition(":")[0] == "learned" else {}
    model = MeasuredCostModel(program, target, cache=cache, batch=batch, fleet=fleet)
    if spec.partition(":")[0] == "learned":
        from .cost.learned import LearnedCostModel

        model = LearnedCostModel(model, program.graph, **options)
    return model


def search_schedule(graph, scheduler: str, cost, **kwargs):
    """``schedule_graph``, or for a learned cost model its active search (picks measured, model refit, again)."""
    from .cost.learned import LearnedCostModel
    from .schedulers import schedule_graph

    if isinstance(cost, LearnedCostModel):
        from .schedulers.active import active_search

        sched = active_search(graph, scheduler, cost, rounds=cost.rounds, **kwargs)
    else:
        sched = schedule_graph(graph, scheduler, cost, **kwargs)
    if hasattr(cost, "stats"):
        sched.search.update(cost.stats())
    return sched


def _learned_options(spec: str) -> dict:
    """Options of ``learned:rounds=4,seed_stages=48`` as LearnedCostModel keyword arguments."""
    _, _, arg = spec.partition(":")
    keys = ("rounds", "seed_stages", "trees", "depth", "seed")
    out = {}
    for part in filter(None, arg.split(",")):
        k, _, v = part.partition("=")
        k = k.strip()
        if k not in keys or not v.strip().isdigit() or int(v) < 1:
            raise InteropError(f"bad learned cost option {part!r}: use learned:rounds=N,seed_stages=N,trees=N,"
                               "depth=N,seed=N with integers >= 1")
        out[k] = int(v)
    return out
