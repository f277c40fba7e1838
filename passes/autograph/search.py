"""AutoGraph (AAAI'23): equivalent graph substitutions searched together with the inter-operator schedule.

Why: IOS and our other schedulers place the operators of the graph *as given*. AutoGraph rewrites the graph for a
parallel launch first — convolutions that share an input become one, convolutions added together become one over
concatenated inputs, a wide convolution splits in two when the device is under-filled — and reports 1.06-1.26x
over IOS. The search, as in the paper:

1. **Flow-based partition** (:mod:`.flow_partition`): every node's capacity is the number of substitutions that
   touch it; the graph is cut recursively along minimum cuts into subgraphs of at most ``max_part_nodes`` nodes,
   adjacent small ones merged back. A conv/matmul chain (with its bias and ReLU) is one node of that graph, so
   a rule sees the same chain in a subgraph as in the model (:func:`partition_keeping_chains`).
2. **Per subgraph, backtracking over substitution sequences** under the *mixed critical-path* cost
   (:mod:`.estimate`): the subgraph is cut out as a module of its own (:mod:`.region`); from each state every
   applicable substitution is tried (a sequence is a path; states reached by two orders are one, by structural
   hash), expanding best first while a state is within ``relax`` of the best cost seen (TASO's pruning), up to
   ``max_states`` states.
3. **DP over the subgraphs** in program order: ``MCP[G] = min_p (MCP[G - p] + BSMCP[p])`` where ``p`` is the last
   subgraph and ``BSMCP[p]`` the best substitution sequence of ``p``. Subgraphs interact only through their
   boundary values, so the minimum takes each subgraph's best; the runner-ups form the other top-k candidates.
4. **Top-k verification**: each candidate (and the unrewritten model) is rewritten in full, prepared by TVM,
   scheduled by ``scheduler`` (default ``ios``) under the *real* cost model — simulated, table, or measured on
   this CPU — and the best one ships. The unrewritten model is always a candidate, so autograph is never worse
   than its scheduler alone under the same cost.

Substitutions come from :mod:`passes.substitutions`; each one's numeric check runs before the search may use it
(``check=True``): a rule that changes shapes or numerics is rejected there, with its name.
"""
from __future__ import annotations

import heapq
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import tvm
from tvm import relax

from tvm_interop.runtime.errors import InteropError

from ..cost.simulated import SimulatedDevice
from .estimate import DEFAULT_ALPHA, estimate_kernels, mixed_critical_path
from .flow_partition import DEFAULT_MAX_NODES, flow_partition
from .region import extract_region

log = logging.getLogger(__name__)

DEFAULT_TOP_K = 4
DEFAULT_MAX_STATES = 64      # states per subgraph
DEFAULT_MAX_DEPTH = 4        # substitutions per subgraph
DEFAULT_RELAX = 1.05         # expand states within 5% of the best (TASO's alpha)


@dataclass
class Step:
    """One applied substitution: the match (node names of the module it was applied to) and the nodes it created,
    in program order (so the same step can be replayed on the full model, whose fresh names may differ)."""

    match: object
    created: tuple[str, ...]


@dataclass
class RegionResult:
    """The best substitution sequences found for one subgraph, cheapest first (the first is always the best; the
    empty sequence is always among them)."""

    names: list[str]
    sequences: list[tuple[float, list[Step]]]
    base: float = 0.0          # the estimate of the subgraph as given
    states: int = 0
    rejected: dict[str, str] = field(default_factory=dict)


@dataclass
class Candidate:
    """A whole-model candidate: the steps of every subgraph, its estimated cost, and once verified its module,
    program, schedule and predicted latency under the real cost model."""

    steps: list[Step]
    estimate: float
    applied: list = field(default_factory=list)   # the steps' matches as applied to the whole model
    module: object = None
    program: object = None
    schedule: object = None
    latency: float | None = None
    note: str = ""

    @property
    def substitutions(self) -> list[dict]:
        return [match_to_json(m) for m in self.applied]


@dataclass
class AutographResult:
    """What :func:`autograph_search` found: the rewritten module that ships, its prepared program and schedule, and
    every verified candidate (for the report)."""

    module: tvm.IRModule
    program: object
    schedule: object
    candidates: list[Candidate]
    stats: dict


def _node_names(mod) -> list[str]:
    """The names of ``dataflow_nodes(mod)`` (op calls and tuple items, program order), read off the bindings
    without building the nodes (shapes, FLOPs): the search asks this of every state."""
    from .region import main_bindings

    out = []
    for b in main_bindings(mod):
        v = b.value
        if (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)) or isinstance(v, relax.TupleGetItem):
            out.append(b.var.name)
    return out


def _param_shapes(mod) -> dict[str, tuple]:
    out = {}
    for p in mod["main"].params:
        shape = getattr(p.ty, "shape", None)
        if shape is not None and hasattr(shape, "values"):
            out[p.name] = tuple(int(d) for d in shape.values)
    return out


def _state_hash(mod) -> int:
    """Two orders of the same substitutions reach one state: the rewritten module's structure (weights' values
    skipped: the same structure costs the same)."""
    import tvm_ffi

    return tvm_ffi.structural_hash(mod, map_free_vars=True, skip_tensor_content=True)


def estimate_cost(mod, device: SimulatedDevice, alpha: float = DEFAULT_ALPHA) -> float:
    """The mixed critical-path estimate of ``mod``'s ``main`` (seconds)."""
    from ..substitutions import dataflow_nodes

    return mixed_critical_path(estimate_kernels(dataflow_nodes(mod), _param_shapes(mod)), device, alpha)


def _apply(mod, match, check: bool, before: set[str] | None = None):
    """(rewritten module, names it created in program order) or raise SubstitutionError. ``before``: the names
    of ``mod``'s nodes, when the caller applies several matches to one module."""
    from ..substitutions import apply_match

    before = set(_node_names(mod)) if before is None else before
    new = apply_match(mod, match, check=check)
    return new, tuple(n for n in _node_names(new) if n not in before)


def search_region(region, device: SimulatedDevice, rules: Sequence[str] | None, *, alpha: float = DEFAULT_ALPHA,
                  max_states: int = DEFAULT_MAX_STATES, max_depth: int = DEFAULT_MAX_DEPTH,
                  relax: float = DEFAULT_RELAX, keep: int = DEFAULT_TOP_K, check: bool = True,
                  names: list[str] | None = None) -> RegionResult:
    """Backtracking over substitution sequences of one subgraph module ``region`` (best first, see the module
    docstring); the ``keep`` cheapest distinct states."""
    from ..substitutions import SubstitutionError, find_matches

    base = estimate_cost(region, device, alpha)
    result = RegionResult(names or _node_names(region), [], base)
    seen = {_state_hash(region)}
    found: list[tuple[float, int, list[Step]]] = [(base, 0, [])]
    heap = [(base, 0, region, [])]
    best, tick = base, 1
    while heap and len(seen) < max_states:
        cost, _, mod, steps = heapq.heappop(heap)
        if cost > best * relax or len(steps) >= max_depth:
            continue
        before = set(_node_names(mod))
        for match in find_matches(mod, rules=rules):
            if match.rule in result.rejected:
                continue
            try:
                new, created = _apply(mod, match, check, before)
            except SubstitutionError as e:
                result.rejected[match.rule] = str(e)
                log.warning("autograph: substitution %s rejected: %s", match.rule, e)
                continue
            h = _state_hash(new)
            if h in seen:
                continue
            seen.add(h)
            c = estimate_cost(new, device, alpha)
            new_steps = steps + [Step(match, created)]
            found.append((c, tick, new_steps))
            heapq.heappush(heap, (c, tick, new, new_steps))
            tick += 1
            best = min(best, c)
            if len(seen) >= max_states:
                break
    found.sort(key=lambda x: (x[0], x[1]))
    result.sequences = [(c, s) for c, _, s in found[:keep]]
    if not any(not s for _, s in result.sequences):
        result.sequences.append((base, []))
    result.states = len(seen)
    return result


def combine(regions: Sequence[RegionResult], k: int) -> list[Candidate]:
    """The DP over subgraphs: the best whole-model candidate takes every subgraph's best sequence (``MCP[G] =
    MCP[G - p] + BSMCP[p]``); the next ones swap one subgraph to its next-best sequence, smallest loss first."""
    best = [r.sequences[0] for r in regions]
    total = sum(c for c, _ in best)
    cands = [Candidate([s for _, seq in best for s in seq], total)]
    swaps = []
    for i, r in enumerate(regions):
        for c, seq in r.sequences[1:]:
            swaps.append((c - best[i][0], i, seq))
    swaps.sort(key=lambda x: x[0])
    for delta, i, seq in swaps[:max(0, k - 1)]:
        chosen = [seq if j == i else b[1] for j, b in enumerate(best)]
        cands.append(Candidate([s for part in chosen for s in part], total + delta))
    return cands


def match_to_json(m) -> dict:
    return {"rule": m.rule, "nodes": list(m.nodes), "params": _jsonable(m.params)}


def _jsonable(v):
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def _tupled(v):
    if isinstance(v, list):
        return tuple(_tupled(x) for x in v)
    return v


def apply_substitutions(mod, substitutions: Sequence[dict], check: bool = True):
    """Apply recorded substitutions (``schedule.search["substitutions"]``: rule, nodes, params, as applied to the
    whole model) to ``mod`` in order: how a saved autograph schedule is brought back to the model it came from."""
    from ..substitutions import RULES, Match, SubstitutionError, ensure_unique_names

    mod = ensure_unique_names(mod)
    for i, d in enumerate(substitutions):
        rule = d.get("rule")
        if rule not in RULES:
            raise InteropError(f"substitution {i} names rule {rule!r}, which this version does not have; known: "
                               f"{sorted(RULES)}")
        m = Match(rule, tuple(d.get("nodes", ())), _tupled(list(d.get("params", ()))))
        try:
            mod, _ = _apply(mod, m, check)
        except SubstitutionError as e:
            raise InteropError(f"substitution {i} ({rule} on {list(m.nodes)[:4]}) does not apply to this model: "
                               f"{e}") from None
    return mod


def replay(mod, steps: Sequence[Step], check: bool = False):
    """Apply ``steps`` (found on subgraph modules) to the full model ``mod``, renaming as the full model's fresh
    names come out (the n-th node a step created in the subgraph is the n-th it creates here). Returns the module
    and the matches as applied to it."""
    from ..substitutions import Match, SubstitutionError

    rename: dict[str, str] = {}
    applied = []
    for step in steps:
        m = step.match
        full = Match(m.rule, tuple(rename.get(n, n) for n in m.nodes), m.params)
        try:
            mod, created = _apply(mod, full, check)
        except SubstitutionError as e:
            raise InteropError(f"autograph: replaying {m.rule} on {list(full.nodes)} failed on the whole model: "
                               f"{e}") from None
        if len(created) != len(step.created):
            raise InteropError(f"autograph: {m.rule} created {len(created)} nodes on the whole model but "
                               f"{len(step.created)} on its subgraph")
        rename.update(zip(step.created, created))
        applied.append(full)
    return mod, applied


def chain_heads(mod) -> dict[str, str]:
    """Node -> the head of its conv/matmul chain (``passes.substitutions.chains``: the head, its bias add, its
    ReLU, each read only by the next), for every node in such a chain."""
    from ..substitutions.chains import chain_at
    from ..substitutions.graph import DataflowGraph

    g = DataflowGraph(mod)
    head_of: dict[str, str] = {}
    for n in g.order:
        c = chain_at(g, n)
        if c is not None:
            for m in c.nodes:
                head_of.setdefault(m, c.head)
    return head_of


def partition_keeping_chains(mod, names: Sequence[str], preds: dict[str, list[str]],
                             matches: Sequence[Sequence[str]], max_part_nodes: int):
    """The flow partition over chains: a conv/matmul chain is one node of the cut graph, so no cut separates a
    convolution from its bias or ReLU. Why: the rules match whole chains; a chain cut at a subgraph boundary is
    shorter in the subgraph than in the model (its tail is outside), so a match found there would not be the
    model's match, and the subgraph's best sequence could not be replayed on the model. ``max_part_nodes``
    counts chains."""
    head = chain_heads(mod)
    rep = {v: head.get(v, v) for v in names}
    members: dict[str, list[str]] = {}
    for v in names:
        members.setdefault(rep[v], []).append(v)
    reps = list(members)
    cpreds = {r: sorted({rep[u] for v in members[r] for u in preds[v] if u in rep and rep[u] != r}) for r in reps}
    cmatches = [sorted({rep[v] for v in m if v in rep}) for m in matches]
    part = flow_partition(reps, cpreds, cmatches, max_part_nodes)
    order = {v: i for i, v in enumerate(names)}
    part.parts = [sorted((v for r in p for v in members[r]), key=order.__getitem__) for p in part.parts]
    return part


def autograph_search(mod: tvm.IRModule, *, prepare: Callable, schedule: Callable, device: SimulatedDevice,
                     rules: Sequence[str] | None = None, top_k: int = DEFAULT_TOP_K,
                     max_part_nodes: int = DEFAULT_MAX_NODES, max_states: int = DEFAULT_MAX_STATES,
                     max_depth: int = DEFAULT_MAX_DEPTH, relax: float = DEFAULT_RELAX, alpha: float = DEFAULT_ALPHA,
                     check: bool = True, progress: Callable[[str], None] | None = None) -> AutographResult:
    """Search substitutions + schedule for ``mod`` (high-level Relax, before legalization).

    ``prepare(module) -> Program`` legalizes, fuses and extracts a candidate (as the build will); ``schedule(program)
    -> Schedule`` schedules it under the real cost model and sets ``predicted_latency``; ``device`` is the simulated
    device of the mixed critical-path estimate. Returns the verified best (see the module docstring)."""
    from ..substitutions import RULES, dataflow_nodes, ensure_unique_names, find_matches

    if top_k < 1:
        raise InteropError(f"autograph top_k must be >= 1, got {top_k}")
    if rules is not None:
        unknown = sorted(set(rules) - set(RULES))
        if unknown:
            raise InteropError(f"unknown substitution rule(s) {unknown}; known: {sorted(RULES)}")
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    mod = ensure_unique_names(mod)
    nodes = dataflow_nodes(mod)
    names = [n.name for n in nodes]
    preds = {n.name: [i for i in n.inputs] for n in nodes}
    matches = find_matches(mod, rules=rules)
    part = partition_keeping_chains(mod, names, preds, [m.nodes for m in matches], max_part_nodes)
    say(f"autograph: {len(nodes)} operators, {len(matches)} substitution sites, {len(part.parts)} subgraphs "
        f"({part.lost} sites lost at cuts)")
    t_part = time.perf_counter()
    regions: list[RegionResult] = []
    rejected: dict[str, str] = {}
    where = {v: k for k, p in enumerate(part.parts) for v in p}
    has_site = {where[m.nodes[0]] for m in matches if len({where.get(v) for v in m.nodes}) == 1}
    for k, p in enumerate(part.parts):
        if k not in has_site:   # nothing to rewrite here: the empty sequence is the only one
            regions.append(RegionResult(p, [(0.0, [])]))
            continue
        r = search_region(extract_region(mod, p), device, rules, alpha=alpha, max_states=max_states,
                          max_depth=max_depth, relax=relax, keep=top_k, check=check, names=p)
        rejected.update(r.rejected)
        regions.append(r)
    t_search = time.perf_counter()
    cands = combine(regions, top_k)
    if all(c.steps for c in cands):
        cands.append(Candidate([], sum(r.base for r in regions)))
    say(f"autograph: searched {sum(r.states for r in regions)} states in {t_search - t_part:.1f} s; verifying "
        f"{len(cands)} candidates")
    for c in cands:
        try:
            c.module, c.applied = replay(mod, c.steps) if c.steps else (mod, [])
        except InteropError as e:   # a subgraph's sequence that the whole model does not admit: never shipped
            c.note = str(e)
            log.warning("%s", e)
            say(f"autograph: candidate with {len(c.steps)} substitutions dropped: {e}")
            continue
        c.program = prepare(c.module)
        try:
            c.schedule = schedule(c.program)
        except InteropError as e:   # e.g. a measured table that has no stages of the rewritten graph
            if not c.steps:
                raise
            c.note = str(e)
            say(f"autograph: candidate with {len(c.steps)} substitutions not priced: {e}")
            continue
        c.latency = c.schedule.predicted_latency
        c.schedule.search["substitutions"] = c.substitutions   # a saved candidate brings its rewrite along
        say(f"autograph: candidate with {len(c.steps)} substitutions: "
            f"{(c.latency or float('nan')) * 1e3:.3f} ms")
    verified = [c for c in cands if c.latency is not None]
    if not verified:
        raise InteropError("autograph: the cost model gave no latency for any candidate")
    best = min(verified, key=lambda c: (c.latency, len(c.steps)))
    identity = next(c for c in cands if not c.steps)
    rules_used: dict[str, int] = {}
    for s in best.steps:
        rules_used[s.match.rule] = rules_used.get(s.match.rule, 0) + 1
    stats = {
        "operators": len(nodes), "substitution_sites": len(matches), **part.stats(),
        "states": sum(r.states for r in regions), "candidates": len(cands),
        "substitutions_applied": len(best.steps), "rules_applied": rules_used,
        "unrewritten_latency": identity.latency, "rejected_rules": rejected,
        "partition_s": round(t_part - t0, 3), "search_s": round(t_search - t_part, 3),
        "verify_s": round(time.perf_counter() - t_search, 3), "total_s": round(time.perf_counter() - t0, 3),
    }
    sched = best.schedule
    if identity.schedule is not None and identity.schedule.sequential_latency:
        # "never slower than sequential" means the model as given, not the rewritten one
        sched.sequential_latency = identity.schedule.sequential_latency
    sched.search["autograph"] = stats
    return AutographResult(best.module, best.program, sched, cands, stats)
