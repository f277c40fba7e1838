"""One parallel region per wave on a CPU: the members' loop nests as one TVM parallel loop.

The region has one iteration per worker thread (a virtual execution unit, Rammer's vEU); each iteration runs
its share of every member (:mod:`passes.wave.partition`): serial nests whole, longest first onto the least
loaded unit, and the members' parallel loops laid end to end and cut so that the units' loads come out equal.
A member's parallel loop becomes a serial loop over the unit's range of its iterations (the loop variable and
body are the member's own; the ranges are compile-time tables indexed by the unit). So there is one thread
hand-off per wave instead of one per kernel, and no thread idles while another member's kernel still runs.

Wave ``k`` holds the ``k``-th nest of every member (a member being one kernel or a group's chain of kernels),
and the end of a parallel region is a barrier: a member's nests stay in their order, and members never wait
for each other inside a wave.

When the members' chains balance over the units (the busiest within :data:`CHAIN_SLACK` of an even share), a
stage is instead one region in which every unit runs whole chains, kernel after kernel, single-threaded
(:func:`chain_region`): no barrier at all, and each kernel reads its predecessor's output from its own core.
"""
from __future__ import annotations

import tvm
from tvm import tirx
from tvm.tirx import stmt as S

from .lowered import LoweredKernel, Nest
from .partition import plan_wave, share_range, unit_loads


def _i64(x: int):
    return tirx.IntImm("int64", int(x))


def _table(t, values: list[int], dtype: str):
    """``values[t]`` as a TIR expression (a Select chain; the tables are as long as the thread count)."""
    expr = tirx.IntImm(dtype, values[-1])
    for k in range(len(values) - 2, -1, -1):
        expr = tirx.Select(tirx.EQ(t, tirx.IntImm("int64", k)), tirx.IntImm(dtype, values[k]), expr)
    return expr


def wave_region(nests: list[Nest], veus: int, name: str):
    """One parallel loop over ``veus`` units running ``nests`` (one per member), placed by
    :func:`partition.plan_wave`."""
    t = tirx.Var(f"{name}_veu", "int64")
    par = [n for n in nests if n.kind == "parallel"]
    ser = [n for n in nests if n.kind != "parallel"]
    plan = plan_wave([(n.iterations, max(1, n.work // n.iterations)) for n in par], [n.work for n in ser], veus)
    owner = dict(zip(map(id, ser), plan.owners))
    share = dict(zip(map(id, par), plan.shares))
    body = []
    for nest in nests:
        if nest.kind != "parallel":
            body.append(S.IfThenElse(tirx.EQ(t, _i64(owner[id(nest)])), nest.stmt, None))
            continue
        body.append(_split_loop(nest, t, share[id(nest)], plan))
    return S.For(t, _i64(0), _i64(veus), tirx.ForKind.PARALLEL, S.SeqStmt(body) if len(body) > 1 else body[0])


# how far over an even share the busiest unit may be for a stage to run one whole member chain per unit
CHAIN_SLACK = 0.3


def _serial(nest: Nest):
    """A nest as one thread runs it: a parallel loop becomes a serial loop over all its iterations."""
    if nest.kind != "parallel":
        return nest.stmt
    loop = nest.stmt
    return S.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body, annotations=loop.annotations)


def _split_loop(nest: Nest, t, share, plan):
    """``nest``'s parallel loop as a serial loop over unit ``t``'s range of its iterations under ``plan``."""
    loop = nest.stmt
    dtype = str(loop.loop_var.ty.dtype)
    veus = len(plan.bounds) - 1
    ranges = [share_range(share, plan.bounds[u], plan.bounds[u + 1]) for u in range(veus)]
    lo, hi = _table(t, [a for a, _ in ranges], dtype), _table(t, [b for _, b in ranges], dtype)
    return S.For(loop.loop_var, lo, hi - lo, tirx.ForKind.SERIAL, loop.body, annotations=loop.annotations)


def _one_kernel(chain: list[Nest]) -> bool:
    """A member of one parallel loop: no order with any other member, so its iterations may go to any unit."""
    return len(chain) == 1 and chain[0].kind == "parallel"


def _fluid(chains: list[list[Nest]], split: bool) -> list[int]:
    """The members :func:`chain_region` cuts over the units (one-kernel members, when ``split``)."""
    return [m for m, c in enumerate(chains) if split and _one_kernel(c)]


def member_declarations(members: list[list[LoweredKernel]], prologue: list) -> list[list]:
    """Per member: the prologue statements binding its kernels' parameters, then its kernels' own declarations.

    Why each outlined chain declares its own buffers: the code generator makes every variable the outlined
    function uses but does not define a ``noalias`` pointer parameter, and two members (or two kernels of one
    chain) name one fused tensor through different variables (a producer's output parameter and its consumer's
    input parameter are both bound to the same fused buffer by the prologue). Declared outside, those would be
    two ``noalias`` pointers to the same memory, and LLVM moved a consumer's loads above its producer's stores
    (measured: an Inception-v3 stage, 999 of 1000 outputs wrong). Declared inside, the function's parameters
    are the fused kernel's own buffers, which are distinct tensors."""
    owned = []
    for chain in members:
        params = [p for k in chain if k.func is not None for p in k.params]   # None: a synthetic kernel (tests)
        binds = [d for d in prologue if any(d.buffer.same_as(p) for p in params)]
        owned.append(binds + [d for k in chain for d in k.decls])
    return owned


def region_declared(prologue: list, declarations: list[list], outlined_members: list[int]) -> list:
    """What a chain region's kernel declares before its parallel loop: every declaration except those of the
    members in ``outlined_members`` (each declares its own inside its function), the prologue's first."""
    owned = [d for decls in declarations for d in decls]
    unowned = [d for d in prologue if not any(d.same_as(o) for o in owned)]
    return unowned + [d for m, decls in enumerate(declarations) if m not in outlined_members for d in decls]


# the attribute marking a statement to be compiled as a function of its own (see :func:`outlined`)
OUTLINE_ATTR = "tvm_interop.outline"
# whether :func:`chain_region` outlines whole chains; off only to compare against the inline kernel
# (``scripts/wave_forms_cpu.py``): off, a fused kernel is built exactly as before the outlining
OUTLINE_CHAINS = True


def outlined(stmt, name: str):
    """``stmt`` marked to be compiled as a function of its own. Our TIR pipeline (``passes.wave.cpu_pipeline``,
    used by every build of ours) turns the mark into a ``compute_scope``, which TVM's LLVM code generator makes a
    ``noinline`` function with ``noalias`` pointer parameters (what it does for every kernel's
    ``main_compute_``). Why: inside the parallel loop's function, LLVM reloaded the members' buffer pointers from
    the stack in their multiply-add loops (11-14 stack accesses per iteration of a 1x1 convolution, none in the
    serial kernel), and a chain ran 1.3x slower there than serially. Why a mark of our own and not the
    ``compute_scope`` itself: the outlined function only helps without ``StorageRewrite`` (which hoists the
    chain's register tiles out of it: slower than not outlined, measured), which only our pipeline leaves out;
    a fused program built by TVM's own pipeline (our Relax pass inside a user's ``tvm.compile``) ignores the
    mark and compiles the chain inline, as before. ``stmt`` must declare the chain's buffers itself
    (:func:`member_declarations`: every pointer parameter is ``noalias``)."""
    return S.AttrStmt(tirx.IntImm("int32", 0), OUTLINE_ATTR, tvm.ir.StringImm(name), stmt)


def chain_region(chains: list[list[Nest]], veus: int, name: str, slack: float, split: bool = True,
                 declarations: list[list] | None = None):
    """One parallel loop over ``veus`` units where each member's whole chain runs on one unit, its kernels
    single-threaded one after another: no barrier inside the stage, and every kernel reads what the kernel
    before it wrote on the same core. ``split``: a member that is one parallel kernel is cut instead, its
    iterations filling up the units that the whole chains (placed longest first) leave short
    (:func:`partition.plan_wave`'s water filling; members laid end to end, so at most ``veus - 1`` of them are
    actually cut). None when the busiest unit would be more than ``slack`` over an even share (then
    :func:`fuse_cpu` builds waves).

    Why: on a CPU, a kernel reading a tensor that another core has just written pays for the transfer (2-core
    Xeon: a 1x1 convolution 45 us alone, 102-125 us after its input was written by the other core), and a wave
    splits every member's parallel loop over all cores, so each member's next kernel reads half of its input
    from the other core, after a barrier. Measured (2 cores, one process, interleaved): RandWire (width 0.5)
    with lios + wave fusion 1.02-1.04x of sequential as waves, 1.15-1.18x as chains (slack 0.3, 0.6, 2);
    Inception-v3 0.96x -> 1.02-1.05x; greedy schedules (chains of one kernel) within noise. Why cut the
    one-kernel members: an Inception-v3 stage of a 432 us convolution (one thread) beside chains of 189 us left
    one core idle for half the stage as whole chains (410.7 us; cut 329.0 us, as waves 335.8 us, timed together
    by ``scripts/wave_forms_cpu.py``, run 1 of the page below). Cutting is not always
    better (a RandWire stage: 921 us cut, 719 us whole, 583 us as waves): on a CPU some kernels run slower over
    two cores than on one (``docs/bench_cpu_wave_forms_2026-11-29.md``), so the default cuts only where whole
    chains do not balance.

    ``declarations``: per member, the statements declaring its buffers (:func:`member_declarations`), placed
    inside its outlined function (:func:`outlined`) when it runs whole; the caller declares the rest
    (:func:`region_declared`)."""
    fluid = _fluid(chains, split)
    whole = [m for m in range(len(chains)) if m not in fluid]
    works = [sum(n.work for n in chains[m]) for m in whole]
    plan = plan_wave([(chains[m][0].iterations, max(1, chains[m][0].work // chains[m][0].iterations))
                      for m in fluid], works, veus)
    if max(unit_loads(plan, works)) > (1.0 + slack) * (sum(works) + sum(s.n * s.w for s in plan.shares)) / veus:
        return None
    t = tirx.Var(f"{name}_veu", "int64")
    owner = dict(zip(whole, plan.owners))
    share = dict(zip(fluid, plan.shares))
    body = []
    for m, c in enumerate(chains):
        if m in share:
            body.append(_split_loop(c[0], t, share[m], plan))
        else:
            run = _seq([_serial(n) for n in c])
            if OUTLINE_CHAINS:
                run = outlined(_seq(list(declarations[m] if declarations else []) + [run]), f"{name}_m{m}")
            body.append(S.IfThenElse(tirx.EQ(t, _i64(owner[m])), run, None))
    return S.For(t, _i64(0), _i64(veus), tirx.ForKind.PARALLEL, S.SeqStmt(body) if len(body) > 1 else body[0])


# the forms of a fused CPU stage (``fuse_cpu``'s ``form``): whole chains, one unit each; whole chains with the
# one-kernel members cut over the units; one parallel region per wave
CHAINS, SPLIT_CHAINS, WAVES = "chains", "chains+split", "waves"
CPU_FORMS = (CHAINS, SPLIT_CHAINS, WAVES)
# how far over an even share a form of whole chains may leave the busiest unit and still be worth comparing
FORM_SLACK = 1.0


def _seq(stmts: list):
    return stmts[0] if len(stmts) == 1 else S.SeqStmt(stmts)


def _nest_chains(members: list[list[LoweredKernel]]) -> list[list[Nest]]:
    return [[n for k in chain for n in k.nests] for chain in members]


def cpu_forms(members: list[list[LoweredKernel]], veus: int) -> list[str]:
    """The forms of this stage that differ from each other and could win (what ``scripts/wave_forms_cpu.py``
    times against each other): waves always; whole chains when there are several units and chains to spread
    over them (within :data:`FORM_SLACK`); chains with the one-kernel members cut when there are both such
    members and longer chains (all one-kernel members cut is one wave)."""
    chains = _nest_chains(members)
    forms = []
    if veus > 1 and len(chains) > 1:
        if chain_region(chains, veus, "form", FORM_SLACK, split=False) is not None:
            forms.append(CHAINS)
        cut = [c for c in chains if _one_kernel(c)]
        if cut and len(cut) < len(chains) and chain_region(chains, veus, "form", FORM_SLACK, split=True) is not None:
            forms.append(SPLIT_CHAINS)
    return forms + [WAVES]


def fuse_cpu(members: list[list[LoweredKernel]], prologue: list, params: list, veus: int,
             attrs: dict, form: str | None = None) -> tuple[tirx.PrimFunc, int, str]:
    """The fused PrimFunc: ``params`` (the fused kernel's buffers), ``prologue`` (statements binding every
    member parameter to one of them), each member's declarations, then the stage in ``form`` (one of
    :data:`CPU_FORMS`: forced, see :func:`cpu_forms`), or by default one region of whole chains
    (:func:`chain_region`) when they balance over the units, else one with the one-kernel members cut when that
    balances them, else the waves. ``members``: per member, its chain of lowered kernels (run one after
    another). Returns the function, its number of regions (waves; 1 for chains) and its form. A ``form`` of
    chains that this stage cannot take (fewer chains than two, one thread) falls back to the default.

    Why the default is a rule and not a timing of every form: timed alone, the fastest form of each stage
    summed 2-7 % below the default's stages, but programs built from those choices ran within noise of the
    default (RandWire 1.25/1.07/1.14x vs 1.28/1.07/1.12x, Inception-v3 1.056x vs 1.062x over sequential, same
    processes) at twice the compile time (``docs/bench_cpu_wave_forms_2026-11-29.md``)."""
    if form is not None and form not in CPU_FORMS:
        raise ValueError(f"unknown CPU wave form {form!r}; expected one of {', '.join(CPU_FORMS)}")
    chains = _nest_chains(members)
    decls = [d for chain in members for k in chain for d in k.decls]
    owned = member_declarations(members, prologue)
    region, split = None, False
    if form in (CHAINS, SPLIT_CHAINS) and veus > 1 and len(chains) > 1:
        split = form == SPLIT_CHAINS and any(_one_kernel(c) for c in chains)
        region = chain_region(chains, veus, "chains", float("inf"), split=split, declarations=owned)
    elif form is None and veus > 1:   # whole chains where they balance, else cut where that balances them
        region = chain_region(chains, veus, "chains", CHAIN_SLACK, split=False, declarations=owned)
        if region is None and any(_one_kernel(c) for c in chains):
            split = True
            region = chain_region(chains, veus, "chains", CHAIN_SLACK, split=True, declarations=owned)
    if region is not None:
        whole = [m for m in range(len(chains)) if OUTLINE_CHAINS and m not in _fluid(chains, split)]
        declared = region_declared(prologue, owned, whole) if whole else list(prologue) + decls
        body = _seq(declared + [region])
        mode = SPLIT_CHAINS if split else CHAINS
        return tirx.PrimFunc(params, body, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs)), 1, mode
    waves = []
    for w in range(max(len(c) for c in chains)):
        nests = [c[w] for c in chains if w < len(c)]
        if len(nests) == 1 and nests[0].kind == "serial":
            waves.append(nests[0].stmt)        # nothing to share: no region
        else:
            waves.append(wave_region(nests, veus, f"wave{w}"))
    body = _seq(list(prologue) + decls + waves)
    return tirx.PrimFunc(params, body, attrs=tvm.ir.make_node("ir.DictAttrs", **attrs)), len(waves), WAVES
