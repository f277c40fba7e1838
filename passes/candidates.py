"""Candidate programs: one library carries the schedule and its alternatives, the device picks by measurement.

Why: on an H100, greedy/lios/ios ran 0.58-0.89x of sequential on randwire without CUDA graphs, and which of
stage mode, dependency mode, direct launches or a CUDA graph is fastest differs by model and device. No cost
model here predicted that reliably, and the device is not here at compile time. So a GPU build lowers every
variant of the compiled schedule worth trying into the same library — they share every kernel — and the
runtime (``runtime.picker``) times them interleaved on the device and runs the fastest:

* the schedule in the compiled mode (the library's ``main``, unprefixed functions),
* the schedule in the other synchronisation mode (prefix ``alt__``), when it has concurrency,
* sequential: the same units one after another on the caller's stream (prefix ``seq__``),

each with direct launches and, where TVM can capture it, as a CUDA graph. What the library holds is described
in ``plan.meta["candidates"]`` (see :class:`Variant`), which ``runtime`` reads; nothing here is needed at run time.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm

from tvm_interop.runtime.cuda import (FREE_STREAMS_FUNC, MAIN_FUNC, MAIN_GRAPH_FUNC, STREAM_CACHE_INDEX, STREAMS_FUNC)
from tvm_interop.runtime.errors import InteropError

from .extract import Program
from .lower_streams import MODES, Lowered, lower_program
from .schedule import Schedule, Stage

SEQUENTIAL_PREFIX = "seq__"
OTHER_MODE_PREFIX = "alt__"


@dataclass
class Variant:
    """One lowering in the library: a schedule in one mode, with its direct and (maybe) graph functions."""

    prefix: str
    scheduler: str
    mode: str
    lowered: Lowered

    @property
    def sequential(self) -> bool:
        return self.lowered.num_streams == 0

    def label(self) -> str:
        return "sequential" if self.sequential else f"{self.scheduler}-{self.mode}"

    def entries(self) -> list[dict]:
        """The candidates this lowering offers (``plan.meta["candidates"]`` entries)."""
        p = self.prefix
        common = {"scheduler": "sequential" if self.sequential else self.scheduler, "mode": self.mode,
                  "num_streams": self.lowered.num_streams, "streams_function": p + STREAMS_FUNC,
                  "free_streams_function": p + FREE_STREAMS_FUNC, "direct_function": p + MAIN_FUNC}
        out = [{"name": f"{self.label()}-direct", "function": p + MAIN_FUNC, "cuda_graph": False, **common}]
        if self.lowered.cuda_graph:
            out.append({"name": f"{self.label()}-graph", "function": p + MAIN_GRAPH_FUNC, "cuda_graph": True,
                        **common})
        return out


def sequential_schedule(schedule: Schedule) -> Schedule:
    """The units of ``schedule`` in its order, one per stage (merged operators stay merged: same kernels)."""
    stages = [Stage([[u]]) for u in schedule.unit_order()]
    s = Schedule(stages, scheduler="sequential")
    return s


def lower_variants(program: Program, schedule: Schedule, target, max_streams: int, mode: str, cuda_graph: bool,
                   with_alternatives: bool, graph_ok=None, sync: str = "tvm") -> list[Variant]:
    """The primary lowering (unprefixed: ``main`` runs it) and, with ``with_alternatives``, the other mode and
    sequential. ``graph_ok(lowered) -> (bool, reason)`` decides whether a graph variant is kept (a lowering whose
    graph cannot be captured is redone without it)."""
    if mode not in MODES:
        raise InteropError(f"unknown synchronisation mode {mode!r}; use one of {MODES}")

    def lower(sched, m, prefix, index) -> Lowered:
        low = lower_program(program, sched, target, max_streams=max_streams, mode=m, cuda_graph=cuda_graph,
                            prefix=prefix, stream_cache_index=index, sync=sync)
        if low.cuda_graph and graph_ok is not None:
            ok, why = graph_ok(low)
            if not ok:
                low = lower_program(program, sched, target, max_streams=max_streams, mode=m, cuda_graph=False,
                                    prefix=prefix, stream_cache_index=index, sync=sync)
                low.cuda_graph_reason = why
        return low

    primary = Variant("", schedule.scheduler, mode, lower(schedule, mode, "", STREAM_CACHE_INDEX))
    variants = [primary]
    if not with_alternatives:
        return variants
    if primary.lowered.num_streams > 0:
        other = [m for m in MODES if m != mode][0]
        variants.append(Variant(OTHER_MODE_PREFIX, schedule.scheduler, other,
                                lower(schedule, other, OTHER_MODE_PREFIX, STREAM_CACHE_INDEX + 1)))
        seq = sequential_schedule(schedule)
        variants.append(Variant(SEQUENTIAL_PREFIX, "sequential", mode,
                                lower(seq, mode, SEQUENTIAL_PREFIX, STREAM_CACHE_INDEX + 2)))
    return variants


def merge_modules(variants: list[Variant]) -> tvm.IRModule:
    """One module with every variant's functions; shared functions (the kernels) must be the same object."""
    funcs: dict = {}
    by_name: dict = {}
    attrs = variants[0].lowered.mod.attrs
    for v in variants:
        for gv, f in v.lowered.mod.functions.items():
            name = gv.name_hint
            if name in by_name:
                if not by_name[name].same_as(f):
                    raise InteropError(f"two candidate programs define different functions named {name!r}")
                continue
            by_name[name] = f
            funcs[gv] = f
    return tvm.IRModule(funcs, attrs=attrs)


def graph_functions(variants: list[Variant]) -> list[str]:
    return [v.prefix + MAIN_GRAPH_FUNC for v in variants if v.lowered.cuda_graph]


def describe(variants: list[Variant]) -> tuple[list[dict], str]:
    """``plan.meta["candidates"]`` and the default candidate's name (the primary, as a graph when it has one)."""
    entries: list[dict] = []
    for v in variants:
        entries.extend(v.entries())
    primary = [e for e in entries if not e["function"].startswith((OTHER_MODE_PREFIX, SEQUENTIAL_PREFIX))]
    default = next((e for e in primary if e["cuda_graph"]), primary[0])
    return entries, default["name"]
