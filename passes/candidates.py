"""Candidate programs: one library carries the schedule and its alternatives, the device picks by measurement.

Why: on an H100, greedy/lios/ios ran 0.58-0.89x of sequential on randwire without CUDA graphs, and which of
stage mode, dependency mode, direct launches or a CUDA graph is fastest differs by model and device. No cost
model here predicted that reliably, and the device is not here at compile time. So a GPU build lowers every
variant of the compiled schedule worth trying into the same library — they share every kernel — and the
runtime (``runtime.picker``) times them interleaved on the device and runs the fastest:

* the schedule in the compiled mode (the library's ``main``, unprefixed functions),
* the schedule in the other synchronisation mode (prefix ``alt__``), when it has concurrency,
* sequential: the same units one after another on the caller's stream (prefix ``seq__``),
* for a schedule with wave-fused stages (``passes.wave``) or flow launches (``passes.wave.flow``), the same
  schedule unfused, in both modes (prefixes ``unfused__`` and ``unfused_alt__``), and sequential over the unfused
  units. Which one wins depends on the device and on CUDA graphs: on 2026-11-27, with graphs, NASNet-A-mobile's
  greedy schedule ran faster unfused in dependency mode than as waves (H100 1.307 against 1.496 ms, H200 1.292
  against 1.409), while without graphs the waves were 1.57-1.86x faster than any multi-stream variant (H100), and
  before that day's waits fix they were the fastest with graphs too (H200),

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
UNFUSED_PREFIX = "unfused__"
UNFUSED_OTHER_MODE_PREFIX = "unfused_alt__"
WAVE = "wave"
FLOW = "flow"
FUSIONS = (WAVE, FLOW)   # what may have rewritten a candidate's program (``Variant.fusion``)


@dataclass
class Variant:
    """One lowering in the library: a schedule in one mode, with its direct and (maybe) graph functions."""

    prefix: str
    scheduler: str
    mode: str
    lowered: Lowered
    fusion: str | None = None    # "wave": fused stages run as one kernel each; "flow": runs of stages as one launch

    @property
    def sequential(self) -> bool:
        return self.lowered.num_streams == 0 and self.fusion is None

    def label(self) -> str:
        if self.sequential:
            return "sequential"
        name = f"{self.scheduler}+{self.fusion}" if self.fusion else self.scheduler
        # a fully fused program has no stream to order: both modes lower to the same program
        return name if self.lowered.num_streams == 0 else f"{name}-{self.mode}"

    def entries(self) -> list[dict]:
        """The candidates this lowering offers (``plan.meta["candidates"]`` entries)."""
        p = self.prefix
        common = {"scheduler": "sequential" if self.sequential else self.scheduler, "mode": self.mode,
                  "fusion": self.fusion,
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
                   with_alternatives: bool, graph_ok=None, sync: str = "tvm",
                   unfused: "tuple[Program, Schedule] | None" = None, fused_by: str = WAVE) -> list[Variant]:
    """The primary lowering (unprefixed: ``main`` runs it) and, with ``with_alternatives``, the other mode and
    sequential. ``graph_ok(lowered) -> (bool, reason)`` decides whether a graph variant is kept (a lowering whose
    graph cannot be captured is redone without it). ``unfused``: the (program, schedule) that ``fused_by`` (wave or
    flow fusion) rewrote into ``program, schedule``; with alternatives, its lowerings join the library (see the
    module), and the sequential candidate runs its units, the model's own kernels."""
    if mode not in MODES:
        raise InteropError(f"unknown synchronisation mode {mode!r}; use one of {MODES}")
    other = [m for m in MODES if m != mode][0]

    def lower(prog, sched, m, prefix, index) -> Lowered:
        low = lower_program(prog, sched, target, max_streams=max_streams, mode=m, cuda_graph=cuda_graph,
                            prefix=prefix, stream_cache_index=index, sync=sync)
        if low.cuda_graph and graph_ok is not None:
            ok, why = graph_ok(low)
            if not ok:
                low = lower_program(prog, sched, target, max_streams=max_streams, mode=m, cuda_graph=False,
                                    prefix=prefix, stream_cache_index=index, sync=sync)
                low.cuda_graph_reason = why
        return low

    if fused_by not in FUSIONS:
        raise InteropError(f"unknown fusion {fused_by!r}; expected one of {FUSIONS}")
    fusion = fused_by if unfused is not None else None
    variants = [Variant("", schedule.scheduler, mode, lower(program, schedule, mode, "", STREAM_CACHE_INDEX), fusion)]

    def add(prefix, prog, sched, m, fused, scheduler=None) -> Variant:
        index = STREAM_CACHE_INDEX + len(variants)   # one stream set per lowering, each under its own cache key
        v = Variant(prefix, scheduler or sched.scheduler, m, lower(prog, sched, m, prefix, index), fused)
        variants.append(v)
        return v

    if not with_alternatives:
        return variants
    if variants[0].lowered.num_streams > 0:
        add(OTHER_MODE_PREFIX, program, schedule, other, fusion)
    base_program, base_schedule = unfused if unfused is not None else (program, schedule)
    if unfused is not None and add(UNFUSED_PREFIX, *unfused, mode, None).lowered.num_streams > 0:
        add(UNFUSED_OTHER_MODE_PREFIX, *unfused, other, None)
    if len(variants) > 1:   # a sequential schedule has nothing to compare with
        add(SEQUENTIAL_PREFIX, base_program, sequential_schedule(base_schedule), mode, None, "sequential")
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
    entries = [e for v in variants for e in v.entries()]
    primary = variants[0].entries()    # lower_variants puts the compiled schedule first (unprefixed: ``main``)
    default = next((e for e in primary if e["cuda_graph"]), primary[0])
    return entries, default["name"]
