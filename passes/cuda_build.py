"""Building a stream-lowered module for CUDA, on a machine with or without a GPU.

* **Targets.** This TVM refuses the old CLI target strings (``"cuda -arch=sm_90"``); :func:`normalize_target`
  accepts them anyway, plus ``"cuda"``, dicts and ``Target`` objects, and fills in ``arch`` (default ``sm_90``,
  the H100 / H200; ``TVM_INTEROP_CUDA_ARCH`` overrides) so that no GPU is needed to pick one.
* **Compiler.** Kernels are compiled with ``nvcc`` at build time, by :func:`build_cuda`, into one fatbin with a
  cubin per requested arch (``passes.cuda_compile``: TVM's nvcc flags, ``-gencode arch=compute_XY,code=sm_XY``
  per arch, no PTX); the export ships that fatbin instead of the CUDA source that TVM keeps when no CUDA driver
  is present, so the library loads with TVM's runtime alone. ``TVM_CUDA_COMPILE_MODE=nvcc`` is set when unset
  (for a build on a GPU machine, where TVM compiles too). No GPU or driver is needed.
* **Pipeline.** TVM's default CUDA pipeline (``relax.backend.cuda``): legalization, DLight's default GPU
  schedules (``Matmul, GEMV, Reduction, GeneralReduction, Fallback``: every kernel gets thread bindings), memory
  planning, and the VM lowering passes — with four changes:

  - our kernels are marked opaque first, so that TVM's ``FuseOps`` does not group them again
    (``passes.keep_kernels``: it did so nondeterministically, into malformed functions);
  - our ``WindowReduction`` rule goes before DLight's reduction rules (``passes.kernels.gpu_window``: pooling
    and depthwise windows get a thread per output; DLight gave Inception-v3's average pools a block per output,
    21 % of its H100 time);

  - DLight runs rule by rule per kernel and a rule that *crashes* on a kernel is skipped for it
    (:func:`robust_default_schedule`; TVM 0.27's GEMV rule asserts on some NASNet kernels, which fails plain
    ``tvm.compile`` of that model);
  - ``RewriteCUDAGraph`` is applied to the CUDA-graph variant(s) only (TVM's pass would otherwise also lift the
    stream-creating function and every other function). Each rewritten function is then checked: exactly one
    captured region must hold every scheduled kernel and stream call (only the input and output copies may stay
    outside). Otherwise that function keeps direct launches and the reason is reported (:class:`CudaBuildReport`)
    and logged: a program split into several regions would leave a stream switch or an event inside one graph
    and the kernels it orders outside it.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import dataclass, field

import tvm
from tvm import relax

from tvm_interop.runtime.cuda import COPY_FUNC, MAIN_GRAPH_FUNC
from tvm_interop.runtime.errors import InteropError

from .target import normalize_target, requested_arches

log = logging.getLogger(__name__)

RUN_OR_CAPTURE = "vm.builtin.cuda_graph.run_or_capture"


def ensure_nvcc() -> str:
    """Select nvcc for CUDA compilation (when the user chose nothing) and return its path."""
    os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    mode = os.environ["TVM_CUDA_COMPILE_MODE"].lower()
    if mode != "nvcc":
        return mode
    path = shutil.which("nvcc")
    if path is None:
        for cand in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
            if os.path.exists(cand):
                path = cand
                os.environ["PATH"] = os.path.dirname(cand) + os.pathsep + os.environ.get("PATH", "")
                break
    if path is None:
        raise InteropError("building for CUDA needs nvcc (the CUDA toolkit) on PATH; install it, or set "
                           "TVM_CUDA_COMPILE_MODE=nvrtc with the cuda-bindings package")
    return path


@dataclass
class CudaBuildReport:
    cuda_graph_requested: bool = False
    cuda_graph: bool = False
    reason: str | None = None
    captured_calls: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    reasons: dict = field(default_factory=dict)          # function -> why it has no CUDA graph
    graph_functions: list = field(default_factory=list)  # functions that run as captured graphs
    arches: list = field(default_factory=list)           # SASS arches of the compiled kernels

    def to_json(self) -> dict:
        return {"cuda_graph_requested": self.cuda_graph_requested, "cuda_graph": self.cuda_graph,
                "cuda_graph_reason": self.reason, "captured_calls": self.captured_calls}


# ---------------------------------------------------------------------------------------------- CUDA graph
def _calls(func) -> list[relax.Call]:
    out: list[relax.Call] = []

    def visit(e):
        if isinstance(e, relax.Call):
            out.append(e)

    relax.analysis.post_order_visit(func.body, visit)
    return out


def _callee_name(call: relax.Call) -> str:
    op = call.op
    if isinstance(op, relax.ExternFunc):
        return str(op.global_symbol)
    if isinstance(op, relax.GlobalVar):
        return op.name_hint
    if isinstance(op, tvm.ir.Op):
        return op.name
    return ""


def _graph_check(mod: tvm.IRModule, fname: str, strict: bool = True) -> tuple[bool, str | None, int]:
    """Is every scheduled kernel and stream call of ``fname`` inside its single captured region?"""
    func = mod[fname]
    captures = []
    stray = []
    for c in _calls(func):
        name = _callee_name(c)
        if name == "relax.call_builtin_with_ctx" and isinstance(c.args[0], relax.ExternFunc) \
                and str(c.args[0].global_symbol) == RUN_OR_CAPTURE:
            captures.append(c)
        elif name.startswith(("runtime.Device_", "tvm_interop.")):   # stream calls, events, library units
            stray.append(name)
        elif isinstance(c.op, relax.GlobalVar) and isinstance(mod[c.op], tvm.tirx.PrimFunc) \
                and COPY_FUNC not in name:
            stray.append(name)
    if not captures:
        return False, "TVM found no region it can capture (no static kernel launches)", 0
    if not strict:
        return True, None, len(captures)
    if len(captures) > 1:
        return False, (f"the program splits into {len(captures)} captured regions (something between them is not "
                       "static), which would separate stream switches from the kernels they order"), 0
    if stray:
        return False, (f"{len(stray)} scheduled call(s) stay outside the captured region "
                       f"(e.g. {', '.join(sorted(set(stray))[:3])})"), 0
    capture_fn = captures[0].args[1].fields[0]
    n = len(_calls(mod[capture_fn])) if isinstance(capture_fn, relax.GlobalVar) else 0
    return True, None, n


def rewrite_cuda_graph_for(func_names, report: CudaBuildReport, strict: bool = True) -> tvm.transform.Pass:
    """TVM's RewriteCUDAGraph applied to ``func_names`` only, checked (see module docstring). The functions are
    rewritten together (TVM merges their static storage into one cached allocation and numbers the captures),
    so a function that fails the check is dropped and the rest rewritten again; a dropped function keeps
    direct launches and ``report.reasons[name]`` (``report.reason``: the first one) says why. ``strict=False``
    accepts TVM's own result as long as something is captured (plain TVM programs: one stream, so regions split
    by an uncapturable call are harmless)."""

    @tvm.transform.module_pass(opt_level=0, name="InteropRewriteCUDAGraph")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        names = [n for n in func_names if any(gv.name_hint == n for gv in mod.get_global_vars())]
        while names:
            sub = tvm.IRModule({gv: f for gv, f in mod.functions.items()
                                if gv.name_hint in names or isinstance(f, tvm.tirx.PrimFunc)})
            with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
                try:
                    rewritten = relax.transform.RewriteCUDAGraph()(sub)
                except Exception as e:  # noqa: BLE001 - TVM internal failure: keep direct launches
                    why = f"RewriteCUDAGraph failed: {str(e).splitlines()[-1]}"
                    for n in names:
                        report.reasons[n] = why
                    report.reason = report.reason or why
                    log.warning("CUDA graph disabled: %s", why)
                    return mod
            failed = []
            counts = 0
            for n in names:
                ok, why, count = _graph_check(rewritten, n, strict)
                if not ok:
                    failed.append(n)
                    report.reasons[n] = why
                    report.reason = report.reason or why
                    log.warning("CUDA graph disabled for %s, falling back to direct launches: %s", n, why)
                counts += count
            if failed:
                names = [n for n in names if n not in failed]
                continue
            out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
            for gv, f in rewritten.functions.items():
                if gv.name_hint in names or not isinstance(f, tvm.tirx.PrimFunc):
                    out[gv] = f
            report.captured_calls += counts
            report.graph_functions = list(names)
            report.cuda_graph = True
            return out
        return mod

    return _pass


def graph_feasibility(mod: tvm.IRModule, target=None, func: str = MAIN_GRAPH_FUNC) -> tuple[bool, str | None]:
    """Would :func:`rewrite_cuda_graph_for` capture ``func`` as one graph? A cheap prediction (memory planning
    and the rewrite on a copy, no kernel scheduling or compilation) so that a build can lower without the graph
    variant up front; the build's own report is what counts (``passes.build`` rebuilds when they disagree)."""
    if not any(gv.name_hint == func for gv in mod.get_global_vars()):
        return False, f"the module has no {func}"
    report = CudaBuildReport(cuda_graph_requested=True)
    seq = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.ToNonDataflow(),
                                    relax.transform.RemovePurityChecking(), relax.transform.CallTIRRewrite(),
                                    relax.transform.StaticPlanBlockMemory()])
    with normalize_target(target or "cuda"):
        planned = seq(mod)
    rewrite_cuda_graph_for((func,), report)(planned)
    return report.cuda_graph, report.reason


def robust_default_schedule(target: tvm.target.Target, report: "CudaBuildReport | None" = None,
                            window_rule: bool = True):
    """DLight's default GPU schedules (the rules of TVM's CUDA pipeline, in its order) plus our
    ``WindowReduction``, and a rule that raises on a kernel is skipped for that kernel (logged) and the next rule
    tried: TVM 0.27's GEMV rule asserts on some fused kernels (e.g. in NASNet), which would otherwise fail the
    whole build. ``window_rule=False``: DLight's rules alone (TVM's own default kernels, the plain-TVM reference
    of ``scripts/gpu_check``)."""
    from tvm.s_tir import dlight as dl

    from tvm_interop.passes.kernels.gpu_window import WindowReduction

    # WindowReduction before DLight's reduction rules: pooling and depthwise windows (a few terms per output)
    # get a thread per output, not a mostly idle block per output (passes.kernels.gpu_window says why)
    rules = [dl.gpu.Matmul(), dl.gpu.GEMV(), *([WindowReduction()] if window_rule else []), dl.gpu.Reduction(),
             dl.gpu.GeneralReduction(), dl.gpu.Fallback()]

    @tvm.transform.module_pass(opt_level=0, name="InteropApplyDefaultSchedule")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updated = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc):
                continue
            attrs = func.attrs or {}
            if "tirx.is_scheduled" in attrs and int(attrs["tirx.is_scheduled"]) == 1:
                continue
            tgt = attrs.get("target") or tvm.target.Target.current(allow_none=False)
            for rule in rules:
                try:
                    space = rule.apply(func, tgt, False)
                except Exception as e:  # noqa: BLE001 - a crashing rule must not fail the build
                    note = f"DLight {type(rule).__name__} failed on {gv.name_hint} ({type(e).__name__}); next rule"
                    log.info(note)
                    if report is not None:
                        report.notes.append(note)
                    continue
                if space is None:
                    continue
                sch = space[0] if isinstance(space, (list, tuple)) else space
                updated[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
                break
            else:
                raise InteropError(f"no GPU schedule applies to kernel {gv.name_hint}: DLight found no thread binding "
                                   "for it, so it cannot run on a GPU")
        for gv, func in updated.items():
            mod[gv] = func
        return mod

    return _pass


def scheduled_as_built(func: tvm.tirx.PrimFunc, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    """One kernel with the schedule a CUDA build gives it (:func:`robust_default_schedule`); an already scheduled
    (tuned) kernel is kept. What wave fusion fuses and what a tuning round times as the untuned default."""
    if func.attrs is not None and "tirx.is_scheduled" in func.attrs and int(func.attrs["tirx.is_scheduled"]):
        return func
    with target:
        return robust_default_schedule(target)(tvm.IRModule({"main": func}))["main"]


KILL_PASS = "KillAfterLastUse"
UNSAFE_MARKER = "stream program is not memory-safe"


def insert_after(passes: list, name: str, extra) -> list:
    """``passes`` with ``extra`` inserted right after the pass called ``name`` (which must be there)."""
    names = [p.info.name for p in passes]
    if name not in names:
        raise InteropError(f"TVM's pipeline has no {name} pass (passes: {', '.join(names)})")
    k = names.index(name) + 1
    return passes[:k] + list(extra) + passes[k:]


def cuda_pipeline_passes(target: tvm.target.Target, graph_funcs=(MAIN_GRAPH_FUNC,),
                         report: CudaBuildReport | None = None, strict: bool = True, window_rule: bool = True
                         ) -> list:
    """The passes of TVM's default CUDA pipeline, in its order, with RewriteCUDAGraph restricted to
    ``graph_funcs`` and DLight made robust (:func:`robust_default_schedule`); nothing else is left out, and two
    passes are added: first, our kernels marked opaque so that ``FuseOps`` does not group them again
    (:func:`passes.keep_kernels.keep_kernels_pass`), and at the end, flow runs' device functions made private
    again after ``AttachGlobalSymbol`` (:func:`passes.wave.subroutine.keep_device_subroutines`; it touches
    nothing else). ``passes.as_built`` inserts the memory check into this list, so the check sees what this
    build compiles."""
    from tvm.relax.backend.cuda import pipeline as cp

    from .keep_kernels import keep_kernels_pass
    from .wave.subroutine import keep_device_subroutines

    report = report if report is not None else CudaBuildReport()
    finalize = [rewrite_cuda_graph_for(graph_funcs, report, strict) if p.info.name == "RewriteCUDAGraph" else p
                for p in cp.finalize_passes(target)]
    legalize = [robust_default_schedule(target, report, window_rule) if p.info.name == "ApplyDefaultSchedule" else p
                for p in cp.legalize_passes(target)]
    return ([keep_kernels_pass()] + cp.library_dispatch_passes(target) + legalize + cp.dataflow_lower_passes(target)
            + finalize + [keep_device_subroutines(target)])


def cuda_pipeline(target: tvm.target.Target, graph_funcs=(MAIN_GRAPH_FUNC,),
                  report: CudaBuildReport | None = None, strict: bool = True, passes: list | None = None
                  ) -> tvm.transform.Pass:
    """TVM's default CUDA pipeline as :func:`cuda_pipeline_passes` (or the given ``passes``), run under the
    target. ``graph_funcs=()``: no CUDA graph at all (plain TVM's default)."""
    seq_passes = passes if passes is not None else cuda_pipeline_passes(target, graph_funcs, report, strict)

    @tvm.transform.module_pass(opt_level=0, name="InteropCUDAPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:
            return tvm.transform.Sequential(seq_passes)(mod)

    return _pipeline


def build_cuda(mod: tvm.IRModule, target, cuda_graph: bool = True, graph_funcs=None, strict: bool = True,
               after_kill: tuple = (), arches: list[str] | None = None, window_rule: bool = True):
    """Compile a lowered (and payload-carrying) module for CUDA. Returns ``(executable, CudaBuildReport)``.
    ``graph_funcs``: the functions to capture as CUDA graphs (default: the lowering's graph variant).
    ``after_kill``: passes run right after ``KillAfterLastUse`` (the memory check of ``passes.as_built``).
    ``arches``: the SASS arches the kernels are compiled for (default: the target's); the fatbin is made here,
    so the build fails on an nvcc error, and ``passes.cuda_compile.export_cuda_library`` ships it.
    ``window_rule=False``: TVM's own default kernels (:func:`robust_default_schedule`)."""
    target = normalize_target(target)
    if target.kind.name != "cuda":
        raise InteropError(f"build_cuda needs a CUDA target, got {target.kind.name}")
    ensure_nvcc()
    report = CudaBuildReport(cuda_graph_requested=cuda_graph)
    graph_funcs = tuple(graph_funcs if graph_funcs is not None else (MAIN_GRAPH_FUNC,)) if cuda_graph else ()
    if cuda_graph and not any(gv.name_hint in graph_funcs for gv in mod.get_global_vars()):
        report.reason = "the module was lowered without a CUDA-graph variant"
        graph_funcs = ()
    t0 = time.perf_counter()
    try:
        passes = insert_after(cuda_pipeline_passes(target, graph_funcs, report, strict, window_rule), KILL_PASS, after_kill)
        ex = tvm.compile(mod, target, relax_pipeline=cuda_pipeline(target, passes=passes))
    except InteropError:
        raise
    except Exception as e:  # noqa: BLE001 - nvcc / codegen errors come as several types
        text = str(e)
        if UNSAFE_MARKER in text:  # the memory check refused the program (TVM re-raised it under its own type)
            raise InteropError(text[text.index(UNSAFE_MARKER):].strip()) from None
        msg = text.strip().splitlines()
        raise InteropError(f"CUDA build failed: {msg[-1] if msg else type(e).__name__}") from e
    from .cuda_compile import compile_library_kernels

    report.arches = list(arches or requested_arches(target))
    compile_library_kernels(ex, report.arches)
    report.seconds = time.perf_counter() - t0
    return ex, report
