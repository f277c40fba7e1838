"""Apply wave fusion to a scheduled program: each chosen stage's groups become one kernel call.

Like the operator merge (``passes.merge``), this rewrites the program the build compiles, not the schedule the
user saves: the schedule keeps its stages (and ``options["wave_fusion"]`` which ones to fuse), and
:func:`apply_wave_fusion` turns (program, schedule) into the program and schedule that are lowered and built.
A stage whose groups cannot all share a kernel fuses the ones that can (at least two) and keeps the others
as concurrent groups beside the fused call; a stage where fewer than two can is left as it is. Every such
decision is recorded with its reason in ``schedule.options["waves"]`` and logged: never a failed build.

In ``main`` the fused call takes the place of its units; each unit's variable is re-bound to its item of the
fused call's result, so consumers and the model output read the same variables as before. The bindings are
then re-ordered topologically (a fused call needs the inputs of all its members, which the original order may
place after one member's consumers).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

import tvm
from tvm import relax

from tvm_interop.runtime.errors import InteropError, ScheduleError

from ..schedule import CONCURRENT, Schedule, Stage
from .kernel import WaveKernel, build_wave_kernel
from .lowered import NotFusable

log = logging.getLogger(__name__)


@dataclass
class WaveRecord:
    """What happened to one stage."""

    stage: int
    fused: list[list[str]] = field(default_factory=list)   # groups in the fused kernel (original unit names)
    left: list[list[str]] = field(default_factory=list)    # groups that run beside it
    reasons: list[str] = field(default_factory=list)
    unit: str = ""                                         # the fused unit's name in the new program
    num_waves: int = 0
    mode: str = ""                                         # CPU: "chains", "chains+split" or "waves" (cpu.py)

    def to_json(self) -> dict:
        return {"stage": self.stage, "fused": self.fused, "left": self.left, "reasons": self.reasons,
                "unit": self.unit, "waves": self.num_waves, "mode": self.mode}


def fusable_stages(schedule: Schedule) -> list[int]:
    """Stages that could be fused: concurrent, with at least two groups."""
    return [i for i, s in enumerate(schedule.stages) if s.strategy == CONCURRENT and len(s.groups) >= 2]


def plan_wave_stage(program, groups: list[list[str]], target, veus: int | None = None, form: str | None = None
                    ) -> tuple[WaveKernel | None, WaveRecord]:
    """The kernel for the groups of one stage that can share it (in ``form``, see ``build_wave_kernel``), and the
    record of what was decided."""
    from .kernel import lower_unit

    rec = WaveRecord(stage=-1)
    ok, lowered = [], {}
    for g in groups:
        try:
            lowered.update({u: lower_unit(program, u, target) for u in g})
            ok.append(g)
        except NotFusable as why:
            rec.left.append(list(g))
            rec.reasons.append(str(why))
    if getattr(target, "kind", None) is not None and target.kind.name == "cuda" and len(ok) >= 2:
        from .cuda import admit   # one block size for the fused launches: keep the chains that agree on it

        keep, why = admit([[lowered[u] for u in g] for g in ok])
        for i in sorted(why):
            rec.left.append(list(ok[i]))
            rec.reasons.append(why[i])
        ok = [ok[i] for i in keep]
    kernel = None
    while len(ok) >= 2 and kernel is None:
        try:
            kernel = build_wave_kernel(program, ok, target, veus, lowered, form)
        except NotFusable as why:
            rec.reasons.append(str(why))
            blamed = [g for g in ok if why.unit is not None and why.unit in g]
            if not blamed:   # the stage as a whole cannot fuse
                ok = []
                break
            ok.remove(blamed[0])     # leave that member beside the fused kernel and try the others
            rec.left.append(list(blamed[0]))
    if kernel is None:
        rec.left = [list(g) for g in groups]
        rec.reasons.append(f"{len(ok)} group(s) can share a kernel; at least two are needed")
        return None, rec
    rec.left = [list(g) for g in groups if g not in ok]
    rec.fused = [list(g) for g in ok]
    rec.num_waves = kernel.num_waves
    rec.mode = kernel.mode
    return kernel, rec


def _same_device(groups: list[list[str]], unit_devices: dict) -> tuple[list[list[str]], list]:
    """The groups on the stage's most used device (hios maps units to devices; one kernel runs on one), and
    the others with the reason they stay apart."""
    if not unit_devices:
        return [list(g) for g in groups], []
    dev = [unit_devices.get(g[0], 0) for g in groups]
    main = max(set(dev), key=lambda d: (dev.count(d), -d))
    keep = [list(g) for g, d in zip(groups, dev) if d == main]
    off = [(list(g), f"{g[0]}: on device {d}, the fused kernel runs on device {main}")
           for g, d in zip(groups, dev) if d != main]
    return keep, off


def _unique(base: str, taken: set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _topological(bindings: list, first: dict) -> list:
    """``bindings`` re-ordered so that every variable is bound before it is used; ties keep ``first`` order."""
    import heapq

    bound_by = {b.var: i for i, b in enumerate(bindings)}
    deps = []
    for b in bindings:
        used = relax.analysis.free_vars(b.value)
        deps.append({bound_by[v] for v in used if v in bound_by})
    users: dict = {i: [] for i in range(len(bindings))}
    indeg = [len(d) for d in deps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    ready = [(first[i], i) for i, n in enumerate(indeg) if n == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(bindings[i])
        for k in users[i]:
            indeg[k] -= 1
            if indeg[k] == 0:
                heapq.heappush(ready, (first[k], k))
    if len(out) != len(bindings):  # pragma: no cover - a fused stage's members never depend on each other
        raise InteropError("wave fusion made a cycle in main (a stage whose groups depend on each other)")
    return out


class MainSplice:
    """Rewriting ``main`` so that groups of units become one fused call each (wave and flow fusion): the names
    taken, where each unit is bound, what each call passes; :meth:`replace` records one fused call's bindings,
    :meth:`module` assembles the new module, re-ordered topologically."""

    def __init__(self, program):
        self.program = program
        self.main = program.mod["main"]
        self.taken = {p.name for p in self.main.params} | set(program.graph.index)
        for block in self.main.body.blocks:
            self.taken.update(b.var.name for b in block.bindings)
        self.bb = relax.BlockBuilder(program.mod)
        self.var_of = {n: uc.binding_var for n, uc in program.calls.items()}
        self.value_of = {b.var: b.value for block in self.main.body.blocks for b in block.bindings}
        self.block_of = {b.var: bi for bi, block in enumerate(self.main.body.blocks) for b in block.bindings}
        self.replacement: dict = {}   # block index -> [(unit vars, [bindings])]
        self.gone: set = set()

    def block(self, units: list[str]) -> tuple[int, type]:
        """The binding block holding every unit of ``units`` and the variable class of that block."""
        blocks = {self.block_of[self.var_of[u]] for u in units}
        if len(blocks) != 1:
            raise NotFusable("the fused units are in different binding blocks of main")
        (bi,) = blocks
        return bi, relax.DataflowVar if isinstance(self.main.body.blocks[bi], relax.DataflowBlock) else relax.Var

    def args(self, sig) -> list:
        """What the fused call passes for ``sig.inputs``: the expression the first reader passes (the same
        object, so constants match by identity)."""
        out = []
        for ref in sig.inputs:
            for u in sig.units:
                call = self.program.calls[u]
                if ref in call.args:
                    out.append(self.value_of[self.var_of[u]].args[1].fields[call.args.index(ref)])
                    break
        return out

    def name(self, base: str) -> str:
        return _unique(base, self.taken)

    def replace(self, sig, bi: int, before: list, fused_var) -> None:
        """``before`` (bindings, the fused call's last) takes the place of ``sig``'s units; each unit's variable is
        re-bound to its items of the fused call's result, so its readers read the same variables as before."""
        new = list(before)
        for u in sig.units:
            idx = [j for j, (uu, _) in enumerate(sig.outputs) if uu == u]
            var = self.var_of[u]
            items = [relax.TupleGetItem(fused_var, j) for j in idx]
            value = items[0] if not isinstance(var.ty, relax.TupleType) else relax.Tuple(items)
            new.append(relax.VarBinding(var, self.bb.normalize(value)))
            self.gone.add(var)
        self.replacement.setdefault(bi, []).append(([self.var_of[u] for u in sig.units], new))

    def module(self) -> tvm.IRModule:
        main = self.main
        new_blocks = []
        for bi, block in enumerate(main.body.blocks):
            kept = [b for b in block.bindings if b.var not in self.gone]
            order = {b.var: i for i, b in enumerate(block.bindings)}
            bindings = list(kept)
            first = {i: order[b.var] for i, b in enumerate(kept)}
            for unit_vars, new in self.replacement.get(bi, []):
                at = min(order[v] for v in unit_vars)
                for b in new:
                    first[len(bindings)] = at
                    bindings.append(b)
            new_blocks.append(type(block)(_topological(bindings, first)))
        new_main = relax.Function(main.params, relax.SeqExpr(new_blocks, main.body.body), main.ret_ty,
                                  main.is_pure, main.attrs)
        out = tvm.IRModule(dict(self.bb.get().functions), attrs=self.program.mod.attrs)
        out["main"] = new_main
        return relax.transform.Normalize()(out)


def out_sinfo(program, sig) -> list:
    """The fused call's outputs: every member unit's, in signature order."""
    return [relax.TensorType(list(program.calls[u].outputs[i].shape), program.calls[u].outputs[i].dtype)
            for u, i in sig.outputs]


def splice_waves(program, kernels: list[WaveKernel], name_prefix: str = "") -> tuple[tvm.IRModule, list[str]]:
    """``program.mod`` with each kernel's units replaced by one call of it; returns (module, fused var names)."""
    splice = MainSplice(program)
    names = []
    for k, kern in enumerate(kernels):
        sig = kern.signature
        bi, var_cls = splice.block(sig.units)
        gv = splice.bb.add_func(kern.func, f"{name_prefix}wave_{sig.units[0]}")
        name = splice.name(f"wave{k}_{sig.units[0]}")
        call = splice.bb.normalize(relax.call_tir(gv, splice.args(sig), out_sinfo(program, sig)))
        fused_var = var_cls(name, call.ty if hasattr(call, "ty") else None)
        splice.replace(sig, bi, [relax.VarBinding(fused_var, call)], fused_var)
        names.append(name)
    return splice.module(), names


def fusion_program(program, target):
    """The program whose kernels wave fusion fuses for ``target`` (a normalised Target): on CPU targets with their
    weights repacked at build time (``passes.kernels.prepack``), as the unfused kernels read them; else
    ``program``. Whatever checks fused kernels against their members uses this too, so it checks what ships.

    Computed once per program and target (kept on ``program``): a library that carries the fused program and the
    same schedule unfused (``passes.candidates``) needs both to call the very same kernel objects."""
    if target.kind.name != "llvm":
        return program
    cache = program.__dict__.setdefault("_fusion_programs", {})
    key = str(target)
    if key not in cache:
        cache[key] = _repacked(program, target)
    return cache[key]


def _repacked(program, target):
    from ..extract import extract
    from ..kernels.prepack import prepack_weights

    packed = prepack_weights(program, target)
    if packed is program:
        return program
    return extract(packed.mod, name=program.graph.name, known_constants=packed.const_exprs)


def apply_wave_fusion(program, schedule: Schedule, target, stages: list[int] | None = None,
                      veus: int | None = None, name_prefix: str = "", repack_weights: bool = True,
                      forms: dict[int, str] | None = None):
    """Fuse ``stages`` (default: every stage with two or more groups) of ``schedule`` (made for ``program``);
    ``forms``: a form to force on a stage's fused kernel (by stage index; ``passes.wave.cpu.CPU_FORMS``, for
    comparisons such as ``scripts/wave_forms_cpu.py``), else the default (``passes.wave.cpu.fuse_cpu``).

    Returns ``(new_program, new_schedule, records)``. CPU targets first get their weights repacked at build
    time (``passes.kernels.prepack``), so the fused kernels read repacked weights like the unfused ones. The
    constants keep their indices (callers that pass weights by position rely on it). ``name_prefix``: for the
    fused kernels' names (several fused programs in one library). ``repack_weights=False`` fuses the kernels as
    they are, for a library that takes its weights as parameters (``scripts/gpu_check``'s CPU dry run): its
    unfused kernels repack nothing at build time, and the caller passes the model's weights to every variant.
    """
    from ..extract import extract
    from ..target import normalize_target

    target = normalize_target(target)
    schedule.validate(program.graph)
    if repack_weights:
        program = fusion_program(program, target)
    chosen = fusable_stages(schedule) if stages is None else list(stages)
    absent = [si for si in chosen if not isinstance(si, int) or isinstance(si, bool)
              or not 0 <= si < len(schedule.stages)]
    if absent:   # a schedule file edited by hand, or one whose stages changed after the choice
        raise ScheduleError(f"wave fusion names stage(s) {absent} that this schedule does not have "
                            f"({len(schedule.stages)} stages); re-run the scheduler with wave fusion")
    kernels, records = [], []
    for si in chosen:
        st = schedule.stages[si]
        if st.strategy != CONCURRENT or len(st.groups) < 2:
            records.append(WaveRecord(si, left=st.groups, reasons=["not a concurrent stage of two or more groups"]))
            continue
        groups, off_device = _same_device(st.groups, schedule.unit_devices)
        kernel, rec = plan_wave_stage(program, groups, target, veus, (forms or {}).get(si))
        for g, why in off_device:
            rec.left.append(g)
            rec.reasons.append(why)
        if kernel is None:
            rec.left = [list(g) for g in st.groups]
        rec.stage = si
        records.append(rec)
        if kernel is not None:
            kernels.append(kernel)
        for r in rec.reasons:
            log.info("wave fusion, stage %d: %s", si, r)
    fused_records = [r for r in records if r.fused]
    if not kernels:
        out = replace(schedule, options=dict(schedule.options), search=dict(schedule.search))
        out.options["waves"] = [r.to_json() for r in records]
        return program, out, records
    new_mod, names = splice_waves(program, kernels, name_prefix)
    new_program = extract(new_mod, name=program.graph.name, known_constants=program.const_exprs)
    by_var = {uc.binding_var: n for n, uc in new_program.calls.items()}
    rename = {n: by_var[uc.binding_var] for n, uc in program.calls.items() if uc.binding_var in by_var}
    for rec, name in zip(fused_records, names):
        rec.unit = next(n for n, uc in new_program.calls.items() if uc.binding_var.name == name)
    fused_at = {r.stage: r for r in fused_records}
    stages_out = []
    for si, st in enumerate(schedule.stages):
        rec = fused_at.get(si)
        if rec is None:
            stages_out.append(Stage([[rename[u] for u in g] for g in st.groups], st.strategy, st.predicted_latency,
                                    st.measured_latency))
        else:
            groups = [[rec.unit]] + [[rename[u] for u in g] for g in rec.left]
            stages_out.append(Stage(groups, CONCURRENT, st.predicted_latency, st.measured_latency))
    out = replace(schedule, stages=stages_out, graph_fingerprint=new_program.graph.fingerprint(),
                  units=[{"name": u.name, "kind": u.kind, "func": u.func_name} for u in new_program.graph.units],
                  unit_devices={rename.get(k, k): v for k, v in schedule.unit_devices.items() if k in rename},
                  options=dict(schedule.options), search=dict(schedule.search))
    for rec in fused_records:   # hios: the fused kernel runs where its members ran (they share one device)
        first = rec.fused[0][0]
        if first in schedule.unit_devices:
            out.unit_devices[rec.unit] = schedule.unit_devices[first]
    out.options["waves"] = [r.to_json() for r in records]
    out.validate(new_program.graph)
    log.info("wave fusion: %d of %d stage(s) fused into one kernel each", len(fused_records), len(chosen))
    return new_program, out, records
