"""Measured cost model: stage latency is timed on this machine with the kernels that will really run.

IOS's central idea: the scheduler asks the device, not a formula. Each distinct stage is built from the units'
TVM kernels and timed by ``runtime.stage_timer`` (the same worker-thread executor that ships; warm-up, repeats,
median). Results go to a persistent cache so later compiles of the same model (or models sharing kernels) do not
measure again. See ``passes.cost.cache`` for the cache's keys and its refusal of foreign files.

What is timed is what ships: on a CPU the built library repacks convolution weights once, at build time
(``passes.kernels.prepack``), and runs only the compute part of those kernels. So the kernels that the build
splits are timed as their compute part, fed a weight of the repacked shape, and a stage's cache key hashes that
compute kernel (entries timed with the in-kernel repack, under the old hash, are never reused). Merged
convolutions (merge stages) and wave-fused stages are built from repacked kernels the same way.
"""
from __future__ import annotations

import logging
from typing import Sequence

import tvm

from tvm_interop.runtime.cpu_threads import kernel_threads
from tvm_interop.runtime.machine import cpu_identity
from tvm_interop.runtime.stage_timer import KernelCall, StageTimer

from ..graph import Unit
from .base import CostModel
from .cache import CostCache, default_cache_path

log = logging.getLogger(__name__)


def _structural_hash(obj) -> int:
    """Structural hash of an IR object (moved from tvm.ir to tvm_ffi in TVM 0.27)."""
    fn = getattr(getattr(tvm, "ir", None), "structural_hash", None)
    if fn is None:
        from tvm_ffi import structural_hash as fn
    return int(fn(obj))


def cpu_fingerprint() -> str:
    """Identifies the measuring machine: CPU model and usable cores (see ``runtime.machine``)."""
    return cpu_identity()


class MeasuredCostModel(CostModel):
    """Times stages of a Program's units on the CPU with worker threads.

    ``program``: the extracted Program (its prepared module supplies the PrimFuncs). Kernels are built once
    (``tvm.compile`` of the prepared module; every PrimFunc becomes a callable symbol). ``cache``: a path, a
    CostCache, or None for the default location; ``use_cache=False`` measures everything afresh.
    """

    PROGRESS_SECONDS = 10.0

    def __init__(self, program, target: "str | tvm.target.Target" = "llvm", cache=None, use_cache: bool = True,
                 warmup: int = 2, repeat: int = 7, library=None, batch: int | None = None, fleet=None):
        self.program = program
        from ..target import normalize_target, target_text

        self.target = normalize_target(target)
        if self.target.kind.name not in ("llvm", "c"):
            raise NotImplementedError(
                "in-process measurement runs CPU kernels; for a GPU use a profiling bundle (cost 'table:FILE')")
        # ``fleet``: stages are timed on its devices (passes.fleet.stage_timer), keyed by their fingerprint
        self.fleet = fleet
        if fleet is not None:
            fleet.start()
        where = fleet.fingerprint if fleet is not None else cpu_fingerprint()
        # the CPU that times and the instructions the kernels use: llvm-generic and -mcpu=<host> kernels differ
        self.name = "measured:" + where + ":" + target_text(self.target)
        self.batch = batch
        self._library = library
        self._timer: StageTimer | None = None
        self.warmup, self.repeat = warmup, repeat
        self._func_hash: dict[str, str] = {}
        if isinstance(cache, CostCache):
            self.cache = cache
        else:
            self.cache = CostCache(cache or default_cache_path(self.name), device=self.name,
                                   tvm_version=tvm.__version__) if use_cache else None
        self._memo: dict[tuple, float] = {}
        self.cache_hits = 0
        self._merged_kernels: dict[str, object] = {}   # kernel name -> function, for merge stages
        self._merged_calls: dict[tuple, list] = {}      # merge key -> [KernelCall] (merged conv, split)
        self._merged_libs: list = []
        self.merged_builds = 0
        self._shipped = None      # kernel name -> prepack.ShippedKernel (the build runs its compute part)
        self._wave_program = None  # the program as the wave fusion sees it (weights repacked)
        self._wave_kernels: dict[str, object] = {}   # wave kernel name -> its WaveKernel, for paired timings
        self._last_report = 0.0

    @property
    def device_fingerprint(self) -> str:
        return self.name

    # ------------------------------------------------------------------ kernels
    def _timer_ready(self) -> StageTimer:
        if self._timer is None:
            from tvm_interop.runtime.model import kernel_library, lookup_kernel

            if self._library is None:
                self._library = self._build_shipped_kernels()
            if self.fleet is not None:
                from ..fleet.stage_timer import RemoteStageTimer

                self._timer = RemoteStageTimer(self.fleet, self._library, warmup=self.warmup, repeat=self.repeat)
                return self._timer
            lib = kernel_library(self._library)
            merged = self._merged_kernels

            def lookup(name):  # the model's kernels, then the merged kernels built for merge stages
                return merged[name] if name in merged else lookup_kernel(lib, name)

            self._timer = StageTimer(lookup, warmup=self.warmup, repeat=self.repeat)
        return self._timer

    def shipped(self) -> dict:
        """Kernel name -> ``prepack.ShippedKernel`` for the kernels that the built library runs without their
        weight repack (empty off CPU targets)."""
        if self._shipped is None:
            self._shipped = {}
            if self.target.kind.name == "llvm":
                from ..kernels.prepack import shipped_kernels

                self._shipped = shipped_kernels(self.program, self.target)
        return self._shipped

    def _build_shipped_kernels(self):
        """The model's kernels as the build ships them: the prepared module, except that each kernel the build
        splits is its compute part. On a CPU, a module of kernels only, each exported under its name (no ``main``
        for TVM's pipeline to group the kernels again: ``passes.keep_kernels``); a GPU's kernels get their thread
        bindings from the Relax pipeline, so there the whole module is built."""
        shipped = self.shipped()
        if self.target.kind.name != "llvm":
            return tvm.compile(self.program.mod, self.target)
        funcs = {gv.name_hint: (shipped[gv.name_hint].compute if gv.name_hint in shipped else f)
                 for gv, f in self.program.mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
        mod = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()})
        return self._compile_kernels(mod)

    def _compile_kernels(self, mod: tvm.IRModule):
        """A module of kernels built as the build compiles them: on a CPU through our TIR pipeline
        (``passes.wave.cpu_pipeline``: outlined chains, register tiles on the stack), elsewhere through TVM's."""
        if self.target.kind.name == "llvm":
            from ..wave.cpu_pipeline import compile_with_waves

            return compile_with_waves(mod, self.target)
        return tvm.compile(mod, self.target)

    def _kernel_hash(self, func_name: str) -> str:
        """Hash of the kernel that is timed (and ships): the compute part where the build repacks the weight."""
        if func_name not in self._func_hash:
            sk = self.shipped().get(func_name)
            func = sk.compute if sk is not None else self.program.mod[func_name]
            self._func_hash[func_name] = f"{_structural_hash(func) & 0xFFFFFFFFFFFF:012x}"
        return self._func_hash[func_name]

    def _call(self, unit: Unit) -> KernelCall:
        call = self.program.calls[unit.name]
        args = [(tuple(t.shape), t.dtype) for t in unit.inputs]
        sk = self.shipped().get(call.func_name)
        if sk is not None:   # the weight arrives repacked
            args[sk.pos] = (sk.shape, args[sk.pos][1])
        return KernelCall(call.func_name, tuple(args), tuple((tuple(t.shape), t.dtype) for t in unit.outputs))

    def _signature(self, unit: Unit) -> str:
        """The timed kernel: its scheduled TIR's hash, the code our pipeline makes of it, its shapes."""
        from ..wave.cpu_pipeline import PIPELINE_CODEGEN

        shapes = ";".join(f"{'x'.join(map(str, t.shape))}{t.dtype}" for t in unit.inputs + unit.outputs)
        return f"{self._kernel_hash(unit.func_name)}p{PIPELINE_CODEGEN}[{shapes}]"

    # ------------------------------------------------------------------ CostModel
    def unit_latency(self, unit: Unit) -> float:
        return self.stage_latency([[unit]])

    def stage_latency(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> float:
        if strategy == "merge":
            return self._merge_latency([u for g in groups for u in g])
        if strategy == "wave":
            return self._wave_latency(groups)
        sig_groups = tuple(sorted(tuple(self._signature(u) for u in g) for g in groups))
        key = (strategy, sig_groups)
        if key in self._memo:
            return self._memo[key]
        # A stage with more groups than cores runs on one worker per core, each pulling the next group
        # (``runtime.thread_executor``); timings from before that ran a worker per group, so they are another key.
        pulled = "+pulled" if len(groups) > kernel_threads() else ""
        cache_key = f"{strategy}{pulled}|{'|'.join(','.join(g) for g in sig_groups)}|b{self.batch}"
        value = self.cache.get(cache_key) if self.cache is not None else None
        if value is not None:
            self.cache_hits += 1
        else:
            value = self._timer_ready().time_stage([[self._call(u) for u in g] for g in groups])
            if self.cache is not None:
                self.cache.put(cache_key, value)
            self._report_progress()
        self._memo[key] = value
        return value

    def _report_progress(self) -> None:
        """A log line every ``PROGRESS_SECONDS`` of timing: a measured search can run for minutes, and the CLI
        shows these lines as its progress."""
        spent = self.seconds_spent
        if spent - self._last_report >= self.PROGRESS_SECONDS:
            self._last_report = spent
            log.info("measured cost: %d stages timed in %.0f s (%d from the cache)", self.measurements, spent,
                     self.cache_hits)

    # ------------------------------------------------------------------ merge stages
    def _merge_latency(self, units: Sequence[Unit]) -> float:
        """Time a merge stage as ``passes.merge.apply_merges`` will run it: each mergeable subset as one merged
        convolution followed by its channel split (a chain on one worker), units that cannot merge beside them
        as single-unit groups. The merged kernels are built (once per merge key) from the units' weights."""
        from ..merge import plan_merge_stage

        if len(units) < 2:
            return self.stage_latency([[u] for u in units])
        subsets, leftovers, _ = plan_merge_stage(self.program, [u.name for u in units])
        if not subsets:
            return self.stage_latency([[u] for u in units])
        by_name = {u.name: u for u in units}
        merged_keys = tuple(sorted(tuple(sorted(self._signature(by_name[n]) for n in sub)) for sub in subsets))
        left_sigs = tuple(sorted(self._signature(by_name[n]) for n in leftovers))
        key = ("merged", merged_keys, left_sigs)
        if key in self._memo:
            return self._memo[key]
        cache_key = ("merged|" + "|".join("+".join(k) for k in merged_keys) + "|" + ",".join(left_sigs)
                     + f"|b{self.batch}")
        value = self.cache.get(cache_key) if self.cache is not None else None
        if value is not None:
            self.cache_hits += 1
        else:
            timer = self._timer_ready()
            groups = [self._merged_chain([by_name[n] for n in sub]) for sub in subsets]
            groups += [[self._call(by_name[n])] for n in leftovers]
            value = timer.time_stage(groups)
            if self.cache is not None:
                self.cache.put(cache_key, value)
        self._memo[key] = value
        return value

    # ------------------------------------------------------------------ wave stages
    def _wave_latency(self, groups: Sequence[Sequence[Unit]]) -> float:
        """Time a stage as ``passes.wave`` fuses it: its groups built into one kernel (cached by the members'
        signatures, like every stage), one call."""
        groups = [list(g) for g in groups if len(g)]
        key = ("wave", tuple(tuple(self._signature(u) for u in g) for g in groups))
        if key in self._memo:
            return self._memo[key]
        cache_key = self._wave_key(groups)
        value = self.cache.get(cache_key) if self.cache is not None else None
        if value is not None:
            self.cache_hits += 1
        else:
            value = self._timer_ready().time_stage([[self._wave_call(groups)]])
            if self.cache is not None:
                self.cache.put(cache_key, value)
            self._report_progress()
        self._memo[key] = value
        return value

    def _wave_key(self, groups: Sequence[Sequence[Unit]]) -> str:
        from ..wave.kernel import WAVE_CODEGEN

        sig_groups = tuple(tuple(self._signature(u) for u in g) for g in groups)
        return f"wave{WAVE_CODEGEN}|" + "|".join(",".join(g) for g in sig_groups) + f"|b{self.batch}"

    def _wave_call(self, groups: Sequence[Sequence[Unit]], form: str | None = None) -> KernelCall:
        """The stage's groups built into one wave kernel (once per key; ``form``: a CPU form to force, see
        ``passes.wave.cpu.cpu_forms``, None the default), as a call the stage timer can run."""
        import hashlib

        from ..wave.kernel import build_wave_kernel

        key = self._wave_key(groups) + ("" if form is None else f"|{form}")
        name = "wave_" + hashlib.sha1(key.encode()).hexdigest()[:16]
        kern = self._wave_kernels.get(name)
        if kern is None:
            kern = build_wave_kernel(self._wave_source(), [[u.name for u in g] for g in groups], self.target,
                                     form=form)
            from ..wave.cpu_pipeline import compile_with_waves

            compiled = compile_with_waves(tvm.IRModule({name: kern.func.with_attr("global_symbol", name)}),
                                          self.target)
            self._add_kernels(compiled, [name])
            self.merged_builds += 1
            self._wave_kernels[name] = kern
        args = tuple(self._ref_info(r) for r in kern.signature.inputs)
        calls = self._wave_source().calls
        outs = tuple((tuple(calls[u].outputs[i].shape), calls[u].outputs[i].dtype)
                     for u, i in kern.signature.outputs)
        return KernelCall(name, args, outs)

    # rounds of a paired wave timing at least: the forms it compares are often within a few percent of each other
    # (Inception-v3, 7 rounds: two of 15 stages within 2 %), and a round of a stage costs well under a millisecond
    PAIRED_ROUNDS = 21

    def wave_comparison(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> dict[str, float]:
        """The stage fused (``"wave"``), as scheduled (``strategy``) and with its groups one after another, every
        kernel on all cores (``"in_order"``: how the program runs it when the groups in order win), timed in
        interleaved repeats in one measurement (cached as one). A remote timer (``fleet``) times one stage per
        call: then the fused and the scheduled price only, each timed on its own.

        Why not :meth:`stage_latency` twice: the search timed the stage as scheduled minutes before wave fusion
        times it fused, and this host's speed moves by up to 2x between minutes, so the two numbers compared
        phases of the host as much as forms of the stage (measured: Inception-v3's identical-shaped blocks priced
        fused 286 and 449 us; fusing every fusable stage then ran 1.08-1.09x of sequential, the stages chosen
        from the unpaired numbers 0.99x, same process)."""
        groups = [list(g) for g in groups if len(g)]
        forms = ("wave", strategy, "in_order")
        base = "paired|" + self._wave_key(groups) + f"|{strategy}"
        pulled = "+pulled" if len(groups) > kernel_threads() else ""
        keys = [f"{base}|{f}{pulled if f == strategy else ''}" for f in forms]
        cached = [self.cache.get(k) for k in keys] if self.cache is not None else [None] * 3
        if all(v is not None for v in cached):
            self.cache_hits += 1
            return dict(zip(forms, cached))
        timer = self._timer_ready()
        if not hasattr(timer, "time_stages"):  # a remote timer times one stage per call: two separate prices
            return {"wave": self._wave_latency(groups), strategy: self.stage_latency(groups, strategy)}
        plain = [[self._call(u) for u in g] for g in groups]
        values = timer.time_stages([[[self._wave_call(groups)]], plain, [[c for g in plain for c in g]]],
                                   repeat=max(self.repeat, self.PAIRED_ROUNDS))
        if self.cache is not None:
            for k, v in zip(keys, values):
                self.cache.put(k, v)
        self._report_progress()
        return dict(zip(forms, values))

    def _wave_source(self):
        """The program that ``passes.wave.apply_wave_fusion`` fuses: on a CPU, with the weights repacked at build
        time (its fused kernels read them repacked), re-extracted with the constants at their indices."""
        if self._wave_program is None:
            self._wave_program = self.program
            if self.target.kind.name == "llvm" and self.shipped():
                from ..extract import extract
                from ..kernels.prepack import prepack_weights

                packed = prepack_weights(self.program, self.target)
                if packed is not self.program:
                    self._wave_program = extract(packed.mod, name=self.program.graph.name,
                                                 known_constants=packed.const_exprs)
        return self._wave_program

    def _ref_info(self, ref) -> tuple:
        """(shape, dtype) of a kernel argument of the program the wave kernels are built from."""
        from ..extract import _ref_info

        prog = self._wave_source()
        info = _ref_info(ref, prog.input_infos, prog.constants, prog.calls)
        return (tuple(info.shape), info.dtype)

    def _add_kernels(self, compiled, names: list[str]) -> None:
        """Make ``names`` of ``compiled`` callable by the stage timer (here, or on the fleet's devices)."""
        from tvm_interop.runtime.model import kernel_library, lookup_kernel

        timer = self._timer_ready()
        if self.fleet is not None:
            timer.add_library(compiled)
            return
        lib = kernel_library(compiled)
        for name in names:
            fn = lookup_kernel(lib, name)
            if fn is None:  # pragma: no cover - compile exports every kernel under its name
                raise RuntimeError(f"kernel {name} missing from its library")
            self._merged_kernels[name] = fn
        self._merged_libs.append(lib)  # keep the modules alive

    def _merged_chain(self, units: Sequence[Unit]) -> list[KernelCall]:
        """The kernel calls of one merged subset (merged conv, split), building and caching its kernels."""
        import hashlib

        from ..merge import build_merged_kernel

        units = sorted(units, key=self._signature)  # channel order does not change the time: one build per key
        mkey = tuple(self._signature(u) for u in units)
        if mkey not in self._merged_calls:
            suffix = "m" + hashlib.sha1("|".join(mkey).encode()).hexdigest()[:12]
            kern = build_merged_kernel(self.program, [u.name for u in units], suffix=suffix, target=self.target)
            # the merged weight is a constant of the merged program: the build repacks it, the kernel that ships
            # is the compute part
            funcs, repacked = dict(kern.funcs), {}
            if self.target.kind.name == "llvm":
                from ..kernels.prepack import split_kernel

                n_out = {f: len(outs) for f, _, outs in kern.calls}
                for fname, func in kern.funcs.items():
                    sk = split_kernel(fname, func, n_out.get(fname, 1)) if fname in n_out else None
                    if sk is not None:
                        funcs[fname], repacked[fname] = sk.compute, sk
            mod = tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in funcs.items()})
            self._add_kernels(self._compile_kernels(mod), list(funcs))   # the fleet's devices load them too
            self.merged_builds += 1
            calls = []
            for f, args, outs in kern.calls:
                args = [(tuple(s), d) for s, d in args]
                if f in repacked:
                    args[repacked[f].pos] = (repacked[f].shape, args[repacked[f].pos][1])
                calls.append(KernelCall(f, tuple(args), tuple((tuple(s), d) for s, d in outs)))
            self._merged_calls[mkey] = calls
        return self._merged_calls[mkey]

    # ------------------------------------------------------------------ reporting
    @property
    def measurements(self) -> int:
        return self._timer.measurements if self._timer else 0

    @property
    def seconds_spent(self) -> float:
        return self._timer.seconds_spent if self._timer else 0.0

    def stats(self) -> dict:
        out = {"measurements": self.measurements, "measure_seconds": self.seconds_spent,
               "cache_hits": self.cache_hits, "merged_builds": self.merged_builds,
               "cache": None if self.cache is None else str(self.cache.path)}
        if self.fleet is not None:
            out["fleet"] = self.fleet.report()
        return out

    def close(self) -> None:
        if self.cache is not None:
            self.cache.flush()
        if self._timer is not None:
            self._timer.close()
