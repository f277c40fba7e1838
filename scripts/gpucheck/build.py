"""The GPU check's ``build`` step (here, with TVM's compiler and nvcc; no GPU): the zoo's plain and scheduled
CUDA libraries (fatbins, weights as parameters, xz-compressed), the manifest, the runtime kit and the graph JSON
of each model for the PyTorch baseline.

Everything the GPU machine would need a compiler for happens here: kernels are compiled by nvcc into fatbins
(``passes.cuda_compile``), and every exported library is checked to hold binaries, never CUDA source, so the
device steps load them with TVM's runtime alone.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import tarfile
import time
from dataclasses import dataclass
from typing import Any

from tvm_interop.runtime import atomic
from tvm_interop.runtime.model import export_library

from .common import CARRY_LIMIT, FLOW, FLOW_OPTIONS, FLOWS, FUNC, WAVE, fusion_of
from .device import SOURCE_FORMATS, cuda_kernel_formats


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class BuildContext:
    """What every model's build shares: the options, the target, and where the results go."""

    args: Any
    target: Any
    gpu: bool
    arches: list[str] | None
    out: str


def _structural_equal(a, b) -> bool:
    import tvm

    fn = getattr(tvm.ir, "structural_equal", None)
    if fn is None:
        from tvm_ffi import structural_equal as fn
    return bool(fn(a, b))


def _merge(mods):
    """One module of every variant's functions, a function shared by several variants once. Two variants may hold
    different functions of one name: differently merged schedules of one model (IOS's merge stages, e.g. ``ios`` and
    a ``--schedule`` file) each name their merged kernels ``..._merged``, ``..._merged1`` in their own order. The
    later one is renamed (``name__v2``) in its module, calls included, so both programs keep their own kernels."""
    import tvm

    funcs: dict = {}
    by_name: dict = {}
    for m in mods:
        clashes = [gv.name_hint for gv, f in m.functions.items()
                   if gv.name_hint in by_name and not _structural_equal(by_name[gv.name_hint][1], f)]
        if clashes:
            taken = set(by_name) | {g.name_hint for g in m.get_global_vars()}
            m = _renamed(m, {n: _free_name(n, taken) for n in clashes})
        # a function kept from an earlier module under its name: this module's calls must use that module's
        # GlobalVar (two merged programs that merged the same pair each made their own; the build looks calls
        # up by GlobalVar and found no definition of the second one: ios, ios_s2 and ios_s4 of Inception-v3)
        shared = {gv.name_hint: by_name[gv.name_hint][0] for gv in m.get_global_vars()
                  if gv.name_hint in by_name and not by_name[gv.name_hint][0].same_as(gv)}
        if shared:
            m = _calls_rebound(m, shared)
        for gv, f in m.functions.items():
            if gv.name_hint in by_name:
                continue
            by_name[gv.name_hint] = (gv, f)
            funcs[gv] = f
    return tvm.IRModule(funcs)


def _free_name(name: str, taken: set) -> str:
    k = 2
    while f"{name}__v{k}" in taken:
        k += 1
    taken.add(f"{name}__v{k}")
    return f"{name}__v{k}"


def _renamed(mod, renames: dict):
    """``mod`` with the functions ``renames`` names (old -> new name) renamed, every call of them in its Relax
    functions too (a PrimFunc's symbol follows its new name)."""
    import tvm
    from tvm import relax

    keep = tvm.IRModule({g: f for g, f in mod.functions.items() if g.name_hint not in renames}, attrs=mod.attrs)
    bb = relax.BlockBuilder(keep)
    new_gv = {gv.name_hint: bb.add_func(f, renames[gv.name_hint]) for gv, f in mod.functions.items()
              if gv.name_hint in renames}
    out = _calls_rebound(bb.get(), new_gv)
    renamed = {g.name_hint for g in new_gv.values()}
    for gv, f in list(out.functions.items()):
        if gv.name_hint in renamed and f.attrs and "global_symbol" in f.attrs:
            out[gv] = f.with_attr("global_symbol", gv.name_hint)
    return out


def _calls_rebound(mod, targets: dict):
    """``mod`` with every reference of its Relax functions to a function named in ``targets`` (name ->
    GlobalVar) replaced by that GlobalVar."""
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rebind(relax.PyExprMutator):
        def visit_global_var_(self, op):  # noqa: N802 - TVM's visitor name
            return targets.get(op.name_hint, op)

    import tvm

    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)   # the caller's module stays as it is
    for gv, f in list(mod.functions.items()):
        if isinstance(f, relax.Function):
            body = _Rebind().visit_expr(f.body)
            nf = relax.Function(list(f.params), body, f.ret_ty, f.is_pure)
            out[gv] = nf.with_attrs(dict(f.attrs)) if f.attrs else nf
    return out


def _native_addons(program=None, lowered=()) -> list[str]:
    """The native extension's object when the library calls it (cuDNN / cuBLAS units, reused events): linked in,
    so the device loads one ``.so`` with TVM's runtime."""
    uses = (program is not None and any(c.is_library for c in program.calls.values())) or \
        any(getattr(low, "sync", "tvm") == "events" or getattr(low, "stage_timing", False) for low in lowered)
    if not uses:
        return []
    from tvm_interop.passes.offload import ensure_extension

    return [ensure_extension()["object"]]


def _export_xz(ex, path: str, arches: list[str] | None = None, addons: list[str] | None = None) -> list[str]:
    """Export the library and keep it xz-compressed (``path + '.xz'``): kernel libraries shrink ~40x. CUDA
    libraries carry fatbins for ``arches`` (``passes.cuda_compile``), so the device needs TVM's runtime only;
    returns the CUDA modules' formats, and refuses a CUDA library that came out holding source."""
    if arches:
        from tvm_interop.passes.cuda_compile import export_cuda_library

        export_cuda_library(ex, path, arches, addons=addons or None)
    else:
        export_library(ex, path, **({"addons": addons} if addons else {}))
    formats = cuda_kernel_formats(path)
    if arches and any(f in SOURCE_FORMATS for f in formats):
        raise RuntimeError(f"{path}: the export holds CUDA source, which the GPU machine cannot load without TVM's "
                           "compiler; the kernels must be exported as fatbins")
    _xz_in_place(path)
    return formats


def _runtime_kit(out: str, log) -> None:
    """What the GPU machine installs (``gpu_check.sh``'s ``runtime_kit``): TVM's Python package without
    ``libtvm_compiler.so`` (the device runs on the runtime only) and the Python 3.12 wheel of ``apache-tvm-ffi``."""
    import tvm

    kit = os.path.join(out, "tvm_kit.tar.xz")
    if not os.path.exists(kit):
        root = os.path.dirname(os.path.dirname(tvm.__file__))
        skip = ("tvm/lib/libtvm_compiler.so", "tvm/src", "tvm/include", "tvm/3rdparty", "tvm/web", "tvm/lib64")

        def filt(ti):
            name = ti.name
            if name.startswith(skip) or "__pycache__" in name:
                return None
            return ti

        with atomic.atomic_path(kit) as tmp, tarfile.open(tmp, "w:xz") as tf:
            tf.add(os.path.join(root, "tvm"), arcname="tvm", filter=filt)
        log(f"runtime-only TVM package -> {kit} ({os.path.getsize(kit) / 2**20:.1f} MiB)")
    whl = os.path.join(out, "whl")
    if not (os.path.isdir(whl) and any(f.endswith(".whl") for f in os.listdir(whl))):
        import subprocess

        import tvm_ffi

        version = getattr(tvm_ffi, "__version__", "0.1.14.post1")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64", "--platform",
               "manylinux_2_27_x86_64", "--platform", "manylinux_2_24_x86_64", "--platform",
               "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64", "-d", whl,
               f"apache-tvm-ffi=={version}"]
        log("downloading the Python 3.12 wheel of apache-tvm-ffi ...")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def torch_program(mod, constants: dict | None = None) -> dict:
    """The network as graph JSON for the PyTorch baseline (replayed on the device by ``gpucheck.torch_replay``
    with the project's one Relax->torch interpreter). ``constants``, when given, receives the weights by name: the
    device draws random ones of the recorded shapes, the tests replay with these."""
    from tvm_interop.export import graph_to_json, read_relax

    g = read_relax(mod)
    if constants is not None:
        constants.update(g.constants)
    return graph_to_json(g)


def _build(ctx: BuildContext, mod, graph_funcs: list[str], strict: bool = True, check: bool = False,
           window_rule: bool = True):
    """``(executable, CudaBuildReport)``. For CUDA the scheduled library is checked inside the build, on the IR it
    compiles (the as-built memory check; the build refuses an unsafe program); a CPU dry run is a plain compile.
    ``window_rule=False``: TVM's own DLight kernels (plain TVM, the reference)."""
    if ctx.gpu:
        from tvm_interop.passes.as_built import memory_check_pass
        from tvm_interop.passes.cuda_build import build_cuda

        return build_cuda(mod, ctx.target, cuda_graph=bool(graph_funcs), graph_funcs=graph_funcs, strict=strict,
                          after_kill=[memory_check_pass()] if check else (), arches=ctx.arches,
                          window_rule=window_rule)
    import tvm

    from tvm_interop.passes.cuda_build import CudaBuildReport

    return tvm.compile(mod, ctx.target), CudaBuildReport()


def _model(ctx: BuildContext, name: str):
    """``(Relax module, image size)`` of a zoo model with the build's knobs."""
    from tvm_interop.models import MODELS, get_model

    spec = MODELS[name]
    kw = {}
    if ctx.args.depth is not None and spec.depth_param:
        kw["depth"] = max(spec.min_depth, ctx.args.depth)
    image = ctx.args.image_size or spec.default_image_size
    return get_model(name, batch_size=ctx.args.batch, image_size=image, width=ctx.args.width, **kw), image


def _plain_variants(ctx: BuildContext, name: str, program) -> tuple[list[dict], str, list[str]]:
    """Plain TVM (the reference), direct and with TVM's own CUDA graph (``main_graph``: the same program under a
    second name, fresh variables): variants, library, kernel formats."""
    from tvm.relax.utils import copy_with_new_vars

    from tvm_interop.passes.lower_streams import lift_main_constants

    plain = lift_main_constants(program)
    main_fn = copy_with_new_vars(plain["main"])
    plain["main_graph"] = main_fn.with_attr("global_symbol", "main_graph") \
        if main_fn.attrs is not None and "global_symbol" in main_fn.attrs else main_fn
    # TVM's own default kernels: the reference is independent of our kernel schedules (passes.kernels.gpu_window)
    ex, rep = _build(ctx, plain, ["main_graph"] if ctx.gpu else [], strict=False, window_rule=False)
    lib = os.path.join("libs", f"{name}.plain.so")
    formats = _export_xz(ex, os.path.join(ctx.out, lib), ctx.arches)
    variants = [{"name": "plain TVM", "library": lib, "function": "main", "streams": None, "cuda_graph": False},
                {"name": "plain TVM + CUDA graph", "library": lib, "function": "main_graph" if ctx.gpu else "main",
                 "streams": None, "cuda_graph": rep.cuda_graph,
                 "note": None if rep.cuda_graph else rep.reasons.get("main_graph", rep.reason)}]
    return variants, lib, formats


def _lowered(ctx: BuildContext, name: str, program, waves: bool = True) -> list[tuple]:
    """Every (scheduler, mode) program, stream-lowered and checked: ``(scheduler, mode, prefix, lowered,
    schedule, weight recipe)``; the recipe (None when the weights are the model's) derives the weights of a program
    with IOS's merged convolutions from the model's (``gpucheck.common.derive_weights``)."""
    from tvm_interop.passes.as_built import check_lowered
    from tvm_interop.passes.lower_streams import lower_program
    from tvm_interop.passes.merge import apply_merges, has_merges
    from tvm_interop.passes.schedulers import available_schedulers, schedule_graph

    out = []
    made = []   # (spec, label, schedule)
    for spec in [s for s in ctx.args.schedulers.split(",") if s and (waves or not fusion_of(s)[1])]:
        sname, fusion = fusion_of(spec)
        if fusion in FLOWS and not ctx.gpu:
            log(f"  {name}: {spec}: flow fusion builds a persistent CUDA launch; not on a CPU dry run, skipped")
            continue
        if sname not in available_schedulers():
            log(f"  {name}: scheduler {sname} not available, skipped")
            continue
        opts = {"max_streams": ctx.args.max_streams} if sname == "greedy" else {}
        made.append((spec, sname, schedule_graph(program.graph, sname, ctx.args.cost, model_name=name, **opts)))
    made += [(label, label, sched) for label, sched in schedule_files(getattr(ctx.args, "schedule", []), name,
                                                                       program.graph)]
    for spec, sname, sched in made:
        prog, recipe = program, None
        fusion = fusion_of(spec)[1]
        if has_merges(sched):   # IOS's merge stages run as merged kernels, as tvm_interop.compile builds them
            merges = sum(st.strategy == "merge" for st in sched.stages)
            prog, sched = apply_merges(program, sched, target=ctx.target)
            recipe = _weight_recipe(program, prog, sched.options["merges"])
            log(f"  {name}: {spec}: {merges} merge stage(s) applied")
        if spec.endswith(WAVE):   # every fusable stage fused (the H100 run tells whether it pays)
            from tvm_interop.passes.wave import apply_wave_fusion

            # the weights are parameters that the device draws in the model's shapes: a CPU dry run's fused
            # kernels must read them as they are, not repacked at build time as a CPU library's constants are
            prog, sched, records = apply_wave_fusion(program, sched, ctx.target, name_prefix=f"{sname}_",
                                                     repack_weights=False)
            fused = [r for r in records if r.fused]
            if not fused:
                log(f"  {name}: {spec}: no stage fused, skipped")
                continue
            log(f"  {name}: {spec}: {len(fused)} of {len(records)} stages fused, "
                f"{sum(len(r.left) for r in fused)} groups left beside their fused kernel")
        elif fusion in FLOWS:   # runs of whole stages in one persistent launch, blocks waiting on counters
            from tvm_interop.passes.wave.flow import apply_flow_fusion

            # +flow_noinline: the device functions kept as calls (one copy of each in the machine code);
            # +flow_coarse: one task per block of a repacked member's own. Each under names of its own, since
            # the variants' kernels go into one library
            prefix = f"{sname}_" if fusion == FLOW else f"{sname}_{fusion[len(FLOW) + 1:]}_"
            prog, sched, records = apply_flow_fusion(prog, sched, ctx.target, name_prefix=prefix,
                                                     **FLOW_OPTIONS[fusion])
            runs = [r for r in records if r.units]
            if not runs:
                log(f"  {name}: {spec}: no run of stages fused, skipped")
                continue
            log(f"  {name}: {spec}: {len(runs)} run(s) of {sum(len(r.stages) for r in runs)} stage(s) "
                f"({sum(r.members for r in runs)} launches, {sum(r.tasks for r in runs)} blocks) in one launch "
                f"each; {sum(len(r.stages) for r in records if not r.units)} stage(s) left as scheduled")
        for mode in [m for m in ctx.args.modes.split(",") if m]:
            for sync in _syncs(ctx):
                for waits in _waits(ctx, mode):
                    prefix = (f"{sname}{fusion.replace('+', '_')}__{mode}__"
                              f"{'ev__' if sync == 'events' else ''}{'wc__' if waits == 'consumer' else ''}")
                    low = lower_program(prog, sched, ctx.target, max_streams=ctx.args.max_streams, mode=mode,
                                        cuda_graph=True, lift_constants=True, prefix=prefix, sync=sync, waits=waits)
                    if sync == "events" and low.sync != "events":
                        continue   # nothing to order (one stream): the same program as with TVM's sync
                    if waits != low.waits:
                        continue   # one stream, or stage mode: the same program as with the default placement
                    check_lowered(low.mod, ctx.target).raise_if_unsafe()
                    out.append((spec, mode, prefix, low, sched, recipe))
    return out


def _timed_twins(ctx: BuildContext, pending: list[tuple], program) -> dict[str, Any]:
    """For every direct stage-mode variant with TVM's sync (``--stage-times``, CUDA): the same program lowered
    with in-context stage timing (``lower_program(stage_timing=True)``), so the run measures what each stage costs
    inside the program next to its isolated cost. Keyed by the variant's prefix."""
    from tvm_interop.passes.as_built import check_lowered
    from tvm_interop.passes.lower_streams import lower_program

    if not (ctx.gpu and getattr(ctx.args, "stage_times", True)):
        return {}
    out = {}
    for spec, mode, prefix, low, sched, recipe in pending:
        # stage mode only (dependency mode has no stage boundary on one stream); not the merged programs of IOS
        # (their merged kernels are not the units the cost tables time) nor wave-fused ones
        if mode != "stage" or low.sync != "tvm" or fusion_of(spec)[1] or recipe is not None:
            continue
        timed = lower_program(program, sched, ctx.target, max_streams=ctx.args.max_streams, mode="stage",
                              cuda_graph=False, lift_constants=True, prefix=prefix + "timed__", sync="tvm",
                              stage_timing=True)
        check_lowered(timed.mod, ctx.target).raise_if_unsafe()
        out[prefix] = timed
    return out


def _schedule_spec(spec: str) -> tuple[str, str, str]:
    """``(model, label, path)`` of one ``--schedule MODEL:LABEL=FILE`` option."""
    head, eq, path = spec.partition("=")
    m, colon, label = head.partition(":")
    if not (eq and colon and m and path and label.isidentifier()):
        raise SystemExit(f"--schedule {spec!r}: expected MODEL:LABEL=FILE, LABEL a name (letters, digits, _)")
    return m, label, path


def schedule_files(specs: list[str], model: str, graph) -> list[tuple[str, Any]]:
    """The ``--schedule MODEL:LABEL=FILE`` schedules of ``model``: ``(label, Schedule)``, each validated against the
    model's graph (a schedule of another model, or one that misses or repeats a unit, is refused by name)."""
    from tvm_interop.passes.schedule import Schedule
    from tvm_interop.runtime.errors import InteropError

    out = []
    for spec in specs:
        m, label, path = _schedule_spec(spec)
        if m != model:
            continue
        try:
            sched = Schedule.load(path)
            sched.validate(graph)
        except InteropError as e:
            raise SystemExit(f"--schedule {spec!r}: {e}") from None
        out.append((label, sched))
    return out


def _weight_recipe(program, merged, merges: list[dict]) -> list[dict]:
    """How each weight of ``merged`` (``program`` with IOS's merges applied) derives from ``program``'s weights
    (:func:`gpucheck.common.derive_weights`): the unchanged ones by identity, the merged convolutions' weights
    and biases as ``passes.merge`` builds them; checked here on the model's real weights."""
    import numpy as np

    from tvm_interop.passes.merge import _merged_constants, mergeable

    from .common import derive_weights

    recipe: list = []
    for c in merged.const_exprs:
        j = next((j for j, o in enumerate(program.const_exprs) if o.same_as(c)), None)
        recipe.append(None if j is None else {"from": j})
    for m in merges:
        units = m["units"]
        geo = mergeable(units, program).geometry
        weight, bias = _merged_constants(program, units, geo)
        made = [(weight, {"pad_concat": [[program.calls[u].args[1].index, row, col]
                                         for u, (row, col) in zip(units, geo.offsets)], "kernel": list(geo.kernel)})]
        if bias is not None:
            made.append((bias, {"concat": [program.calls[u].args[2].index for u in units], "axis": 1}))
        for value, item in made:
            k = next((k for k, r in enumerate(recipe) if r is None and merged.constants[k].shape == value.shape
                      and np.array_equal(merged.constants[k], value)), None)
            if k is None:
                raise RuntimeError(f"merge of {units}: its merged weight is not among the program's constants")
            recipe[k] = item
    missing = [k for k, r in enumerate(recipe) if r is None]
    if missing:
        raise RuntimeError(f"weights {missing[:5]} of the merged program derive from no weight of the model")
    derived = derive_weights([np.asarray(c) for c in program.constants], recipe)
    if not all(np.array_equal(a, np.asarray(b)) for a, b in zip(derived, merged.constants)):
        raise RuntimeError("the weight recipe does not reproduce the merged program's weights")
    return recipe


def _syncs(ctx: BuildContext) -> list[str]:
    """How the scheduled variants order their streams: TVM's per-call event and/or the reused events (CUDA only;
    a CPU dry run has no streams to order)."""
    syncs = [s for s in ctx.args.sync.split(",") if s]
    return syncs if ctx.gpu else [s for s in syncs if s != "events"] or ["tvm"]


def _waits(ctx: BuildContext, mode: str) -> list[str]:
    """Where dependency-mode variants issue their cross-stream waits: today's placement, and with ``--waits
    stage-start,consumer`` also the placement of the builds before 2026-11-27 ('[waits at consumer]' in the name),
    so one run measures what the change did. Stage mode has one placement."""
    from tvm_interop.passes.lower_streams import DEFAULT_WAIT_PLACEMENT, WAIT_PLACEMENTS

    waits = [w for w in ctx.args.waits.split(",") if w] or [DEFAULT_WAIT_PLACEMENT]
    unknown = [w for w in waits if w not in WAIT_PLACEMENTS]
    if unknown:
        raise SystemExit(f"gpu_check build: --waits {','.join(unknown)}: expected {' or '.join(WAIT_PLACEMENTS)}")
    return waits if mode == "dependency" else [DEFAULT_WAIT_PLACEMENT]


def _scheduled_variants(ctx: BuildContext, name: str, program, tf32: bool = False,
                        waves: bool = True) -> tuple[list[dict], str, list[str]]:
    """The scheduled programs, all in one library sharing the kernels, each direct and with CUDA graph:
    variants, library, kernel formats."""
    from tvm_interop.passes.lower_streams import stage_groups
    from tvm_interop.runtime.cuda import MAIN_GRAPH_FUNC

    pending = _lowered(ctx, name, program, waves)
    timed = _timed_twins(ctx, pending, program)
    graph_funcs = [prefix + MAIN_GRAPH_FUNC for _, _, prefix, _, _, _ in pending]
    lows = [low for _, _, _, low, _, _ in pending] + list(timed.values())
    ex, rep = _build(ctx, _merge([low.mod for low in lows]), graph_funcs if ctx.gpu else [], check=True)
    lib = os.path.join("libs", f"{name}.sched.so")
    formats = _export_xz(ex, os.path.join(ctx.out, lib), ctx.arches, _native_addons(program, lows))
    variants = []
    for sname, mode, prefix, low, sched, recipe in pending:
        label = (sname if mode == "stage" else f"{sname} ({mode})") + (" [events]" if low.sync == "events" else "") \
            + (" [waits at consumer]" if low.waits == "consumer" else "")
        common = {"library": lib, "streams": prefix + "__tvm_interop_streams", "num_streams": low.num_streams,
                  "sync": low.sync, "waits": low.waits, **({"tf32": True} if tf32 else {}),
                  "stages": sched.num_stages, "max_concurrency": sched.max_concurrency(), "mode": mode,
                  "predicted_ms": (sched.predicted_latency or 0) * 1e3,
                  **({"weight_recipe": recipe} if recipe is not None else {})}
        gname = prefix + MAIN_GRAPH_FUNC
        syncs = {f: sp.count("sync") for f, sp in low.programs.items()}   # events issued per call (fork/join)
        direct = {"name": label, "function": prefix + FUNC, "cuda_graph": False, "syncs": syncs.get(FUNC), **common}
        if prefix in timed:   # the in-context stage times of this program (run: `in_context`)
            t = timed[prefix]
            direct["stage_times"] = {"function": t.prefix + FUNC, "streams": t.prefix + "__tvm_interop_streams",
                                     "read": t.stage_times_function,
                                     "stages": [stage_groups(st) for st in sched.stages],
                                     "predicted_ms": [(st.predicted_latency or 0.0) * 1e3 for st in sched.stages]}
        variants.append(direct)
        variants.append({"name": f"{label} + CUDA graph", "function": gname if ctx.gpu else prefix + FUNC,
                         "syncs": syncs.get(MAIN_GRAPH_FUNC, syncs.get(FUNC)),
                         "cuda_graph": gname in rep.graph_functions,
                         "note": rep.reasons.get(gname) or (None if ctx.gpu else "CPU dry run"), **common})
    return variants, lib, formats


def _torch_fields(ctx: BuildContext, name: str, mod) -> dict:
    """The manifest fields of the PyTorch baseline: its graph JSON, or why there is none."""
    from tvm_interop.runtime.errors import UnsupportedModelError

    path = os.path.join("libs", f"{name}.torch.json")
    try:
        atomic.write_text(os.path.join(ctx.out, path), json.dumps(torch_program(mod)))
    except UnsupportedModelError as e:
        return {"torch_program": None, "torch_note": str(e)}
    return {"torch_program": path}


def _xz_in_place(path: str) -> None:
    """Replace ``path`` by ``path + '.xz'`` (the device side decompresses it: ``gpucheck.device.library_path``)."""
    import lzma

    with atomic.atomic_path(path + ".xz") as tmp, open(path, "rb") as f, lzma.open(tmp, "wb", preset=6) as g:
        g.write(f.read())
    os.unlink(path)


def _unit_bundle(ctx: BuildContext, name: str, program) -> dict:
    """The model's units alone, and on CUDA each offloadable one also as its cuDNN / cuBLAS call, in a profiling
    bundle that ``run`` measures into ``unit_costs/<model>.json``: the table ``units="auto"`` picks by, per unit
    (``build --auto MODEL=TABLE`` in the next round; ``tvm-interop compile --units auto --cost table:...``)."""
    from tvm_interop.passes.profile_bundle import LIBRARY, BundleOptions, build_profile_bundle

    rel = os.path.join("bundles", name.replace("+", "-"))
    stages = [{"groups": [[u.name]], "sources": ["unit"]} for u in program.graph.units]
    bundle = build_profile_bundle(program, ctx.target, os.path.join(ctx.out, rel),
                                  BundleOptions(ios=False, lios=False, library=ctx.gpu), stages=stages)
    _xz_in_place(os.path.join(ctx.out, rel, LIBRARY))
    library = sum(st.get("strategy") == "library" for st in bundle.plan["stages"])
    log(f"  {name}: unit bundle of {len(program.graph)} units and {library} library calls -> {rel}")
    return {"unit_bundle": rel}


def _auto_offload(program, table_path: str):
    """``(program, report)`` with each offloadable unit as the library call where the device's unit table
    measured it faster than the TVM kernel (``units="auto"``); the table must have been measured for this graph.
    Its device-clock times where it has them: issue 13's target compares the sequential program in a CUDA graph,
    where a library call's host time is gone (``compile`` makes the same choice for a build with a graph)."""
    from tvm_interop.passes.cost.table import TableCostModel, has_device_clock
    from tvm_interop.passes.offload import offload

    from tvm_interop.runtime.errors import InteropError
    from tvm_interop.runtime.json_file import read_json

    try:
        clock = "device" if has_device_clock(read_json(table_path, f"unit table {table_path}")) else "issue"
        table = TableCostModel(table_path, clock=clock)
        table.check_graph(program.graph)
    except InteropError as e:
        raise SystemExit(f"gpu_check build: --auto: {e}") from None
    times = table.implementation_times()
    if not times:
        raise SystemExit(f"gpu_check build: {table_path} has no library measurements (was it measured from a bundle "
                         "built with --unit-costs for a CUDA target?)")
    return offload(program, units="auto", measured=times, clock=clock)


def build_model(ctx: BuildContext, name: str, tuning_db: str | None = None, units: str = "tvm",
                tf32: bool = False, unit_bundle: bool = False, auto_table: str | None = None,
                splitk: bool = False) -> dict:
    """One model's manifest entry: prepared once, then its plain and scheduled libraries and its graph JSON.
    ``tuning_db``: the entry ``NAME+tuned``, every variant (plain TVM included) built with the database's tuned
    kernels, so that the run compares tuned and default kernels model by model. ``units="cudnn"``: the entry
    ``NAME+cudnn``, whose scheduled variants (sequential included) run every offloadable convolution / dense layer
    as a cuDNN / cuBLAS call (``passes.offload``), checked against plain TVM with TVM's own kernels;
    ``units="auto"`` with ``auto_table`` (a unit table a run measured): the entry ``NAME+auto``, each unit as
    whichever the table measured faster. ``unit_bundle``: also the bundle that measures such a table.
    ``splitk``: the entry ``NAME+splitk``, whose scheduled variants (sequential included; no wave fusion) run the
    convolutions ``passes.kernels.gpu_splitk`` takes with that schedule, checked against plain TVM's own kernels."""
    import dataclasses

    import tvm_interop

    t0 = time.perf_counter()
    mod, image = _model(ctx, name)
    program = tvm_interop.api.prepare_program(mod, ctx.target, name=name)
    label = name
    extra: dict = {}
    if tuning_db is not None:
        from tvm_interop.passes.kernels.tuning import apply_database, tuned_functions

        program = dataclasses.replace(program, mod=apply_database(program.mod, ctx.target, tuning_db))
        label = f"{name}+tuned"
        extra = {"tuning_db": os.path.abspath(tuning_db), "tuned_kernels": tuned_functions(program.mod),
                 "torch_program": None, "torch_note": f"the PyTorch baseline is in the entry {name}"}
    scheduled_program = program
    if splitk:
        from tvm_interop.passes.kernels.gpu_splitk import apply_split_reduction

        split_mod, split_kernels = apply_split_reduction(program.mod, ctx.target)
        scheduled_program = dataclasses.replace(program, mod=split_mod)
        label = f"{name}+splitk"
        taken = set(split_kernels)
        extra = {"splitk_kernels": split_kernels,
                 "splitk_units": [u.name for u in program.graph.units if u.func_name in taken],
                 "torch_program": None, "torch_note": f"the PyTorch baseline is in the entry {name}"}
        if unit_bundle:   # the same units timed with these kernels: unit_costs/NAME-splitk.json beside NAME.json
            extra.update(_unit_bundle(ctx, label, scheduled_program))
    elif units != "tvm":
        from tvm_interop.passes.offload import offload

        if units == "auto":
            scheduled_program, report = _auto_offload(program, auto_table)
        else:
            scheduled_program, report = offload(program, units=units, tf32=tf32)
        label = f"{name}+{units}" + ("+tf32" if tf32 else "")
        extra = {"library_units": len(report.offloaded), "left_to_tvm": report.refused,
                 **({"chosen_by": report.chosen_by, "unit_table": os.path.abspath(auto_table),
                     "unit_table_clock": report.clock} if auto_table else {}),
                 "torch_program": None, "torch_note": f"the PyTorch baseline is in the entry {name}"}
    elif unit_bundle:
        extra = _unit_bundle(ctx, name, program)
    plain, plain_lib, plain_formats = _plain_variants(ctx, label, program)   # the reference: TVM's own kernels
    sched, sched_lib, sched_formats = _scheduled_variants(ctx, label, scheduled_program, tf32=tf32, waves=not splitk)
    entry = {"name": label, "image_size": image, "units": len(program.graph),
             "inputs": [{"shape": list(t.shape), "dtype": t.dtype} for t in program.input_infos],
             "weights": [{"shape": [int(d) for d in c.shape], "dtype": str(c.dtype)} for c in program.constants],
             "plain": {"library": plain_lib}, "variants": plain + sched,
             "kernels": {plain_lib: plain_formats, sched_lib: sched_formats},
             **extra, **({} if "torch_note" in extra else _torch_fields(ctx, name, mod))}
    log(f"  {label}: {len(program.graph)} units, {len(entry['variants'])} variants, built in "
        f"{time.perf_counter() - t0:.0f} s" + (f" ({len(extra['tuned_kernels'])} tuned kernels)"
                                              if "tuned_kernels" in extra else "")
        + (f" ({extra['library_units']} library units)" if "library_units" in extra else "")
        + (f" ({len(extra['splitk_kernels'])} split-reduction kernels)" if "splitk_kernels" in extra else ""))
    return entry


def _context(args) -> BuildContext:
    from tvm_interop.passes.cuda_build import ensure_nvcc
    from tvm_interop.passes.target import normalize_target

    target = normalize_target(args.target)
    gpu = target.kind.name == "cuda"
    if gpu:
        ensure_nvcc()
    else:
        log(f"target {target.kind.name}: a CPU dry run of the check (no CUDA graphs)")
    return BuildContext(args=args, target=target, gpu=gpu, arches=[target.attrs["arch"]] if gpu else None,
                        out=args.dir)


def _source_revision() -> str:
    """The commit the build was made from (``+dirty`` with uncommitted changes), so a build carried to the GPU
    later is reported with the code it holds, not with whatever the checkout is by then."""
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (rev or "unknown") + ("+dirty" if dirty else "")


def _manifest(ctx: BuildContext) -> dict:
    import tvm

    from tvm_interop.passes.lower_streams import DEFAULT_WAIT_PLACEMENT

    a = ctx.args
    return {"format": "tvm-interop-gpu-check", "version": 1,
            "target": f"cuda -arch={ctx.target.attrs['arch']}" if ctx.gpu else ctx.target.kind.name,
            "device": "cuda" if ctx.gpu else "cpu", "tvm": tvm.__version__, "built_on": platform.node(),
            "built_from": _source_revision(), "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "width": a.width, "image_size": a.image_size, "batch": a.batch, "seed": a.seed, "cost": a.cost,
            # the dependency mode's wait placement of the unlabelled variants (what the fit reproduces them with)
            "max_streams": a.max_streams, "waits": DEFAULT_WAIT_PLACEMENT, "models": []}


def _model_list(text: str, names: list[str], option: str) -> list[str]:
    """The models an option names (comma-separated, ``all`` or ``''``); each must be one that is built."""
    chosen = names if text == "all" else [m.strip() for m in text.split(",") if m.strip()]
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise SystemExit(f"gpu_check build: {option} names models that are not built: {unknown}")
    return chosen


def _model_paths(items: list[str], names: list[str], option: str, exists, wants: str) -> dict[str, str]:
    """``{model: path}`` from repeated ``MODEL=PATH`` options; each path must pass ``exists`` and each model must
    be one that is built."""
    out = {}
    for item in items:
        model, sep, path = item.partition("=")
        if not sep or not exists(path):
            raise SystemExit(f"gpu_check build: {option} wants {wants}, got {item!r}")
        out[model] = path
    unknown = sorted(set(out) - set(names))
    if unknown:
        raise SystemExit(f"gpu_check build: {option} names models that are not built: {unknown}")
    return out


def cmd_build(args) -> int:
    """Build every requested model into ``--dir``; exit 1 when the result is over the device tool's carry
    budget (it could not be carried to the GPU machine)."""
    from tvm_interop.models import list_models

    ctx = _context(args)
    names = list_models() if args.models == "all" else [m.strip() for m in args.models.split(",") if m.strip()]
    tuned = _model_paths(args.tuned, names, "--tuned", os.path.isdir,
                         "MODEL=DIR with an existing tuning database")
    with_library = _model_list(args.cudnn, names, "--cudnn")
    with_bundle = _model_list(args.unit_costs, names, "--unit-costs")
    auto = _model_paths(args.auto, names, "--auto", os.path.isfile,
                        "MODEL=TABLE with a unit table a run measured (unit_costs/MODEL.json)")
    if auto and not ctx.gpu:
        raise SystemExit("gpu_check build: --auto chooses library units, which need a CUDA target")
    with_splitk = _model_list(args.splitk, names, "--splitk")
    if with_splitk and not ctx.gpu:
        raise SystemExit("gpu_check build: --splitk schedules CUDA kernels: they need a CUDA target")
    # every option is checked before the first model builds: a full build takes tens of minutes, and a typo in an
    # option that matters only late (a dependency-mode variant, a schedule file) must not cost them
    _waits(ctx, "dependency")
    for spec in args.schedule:
        _schedule_spec(spec)
    os.makedirs(os.path.join(ctx.out, "libs"), exist_ok=True)
    if not args.no_kit:
        _runtime_kit(ctx.out, log)
    manifest = _manifest(ctx)
    for name in names:
        manifest["models"].append(build_model(ctx, name, unit_bundle=name in with_bundle))
        if name in tuned:
            manifest["models"].append(build_model(ctx, name, tuned[name]))
        if name in with_library and ctx.gpu:
            manifest["models"].append(build_model(ctx, name, units="cudnn"))
            if args.tf32:   # reported separately: TF32 changes the numbers (checked with TF32's tolerance)
                manifest["models"].append(build_model(ctx, name, units="cudnn", tf32=True))
        if name in auto:
            manifest["models"].append(build_model(ctx, name, units="auto", auto_table=auto[name]))
        if name in with_splitk:
            manifest["models"].append(build_model(ctx, name, splitk=True, unit_bundle=name in with_bundle))
    if getattr(args, "probe", True):   # the host cost of each kind of op, measured alone (gpucheck.probe)
        from .probe import build_probe

        manifest["probe"] = build_probe(ctx, log)
    atomic.write_text(os.path.join(ctx.out, "manifest.json"), json.dumps(manifest, indent=1))
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(ctx.out) for fn in fns)
    log(f"wrote {ctx.out} ({total / 2**20:.1f} MiB{'; OVER the 60 MiB carry budget' if total > CARRY_LIMIT else ''})")
    return 0 if total <= CARRY_LIMIT else 1
