"""The GPU check's ``run`` step (there: TVM's runtime only): every variant checked against plain TVM and timed,
what the candidate picker ships per scheduler, PyTorch eager on the same network, the environment.

Nothing here imports TVM's compiler or ``passes`` (the GPU machine has neither): programs run through
``tvm.runtime`` and ``runtime/``, the PyTorch baseline through :mod:`gpucheck.torch_replay`, and every library is
checked for CUDA source before anything is loaded (:func:`gpucheck.device.check_kernels`).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any, Callable

from tvm_interop.runtime.errors import DeviceError
from tvm_interop.runtime.model import load_tvm_module

from .common import derive_weights, fusion_of
from .device import (SourceKernelsError, check_kernels, environment, library_path, open_device,
                     runtime_only_status)
from .kernel_profile import profile_kernels, profile_timeline
from .report import render_markdown
from .torch_replay import torch_runner

TOL_REL, TOL_ABS = 1e-4, 1e-5


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Variants:
    """The libraries of one model loaded on ``dev`` (one VM each) and each variant's streams, created once:
    ``call(var)`` runs a manifest variant on the model's inputs and weights; ``close`` frees the streams."""

    def __init__(self, d: str, entry: dict, seed: int, dev):
        import numpy as np
        import tvm

        rng = np.random.default_rng(seed)
        self.inputs = [tvm.runtime.tensor(rng.standard_normal(tuple(s["shape"])).astype(s["dtype"]), dev)
                       for s in entry["inputs"]]
        self.raw_weights = _weights(entry, seed + 1, lambda a: a)
        self.weights = [tvm.runtime.tensor(a, dev) for a in self.raw_weights]
        self.derived: dict = {}   # weight recipe (merged programs) -> its weights on the device
        self.dir, self.dev = d, dev
        self.library_units = bool(entry.get("library_units"))
        self.vms: dict = {}
        self.streams: dict = {}
        if self.library_units:   # cuDNN / cuBLAS units: the NVIDIA libraries from pip's nvidia/*/lib
            from tvm_interop.runtime.native_libs import preload_cuda_libraries

            log(f"  {entry['name']}: NVIDIA libraries {preload_cuda_libraries()}")

    def call(self, var: dict) -> Callable[[], Any]:
        """A callable running ``var`` once (returns its raw output)."""
        import tvm
        from tvm.runtime import vm as rvm

        lib = var["library"]
        if lib not in self.vms:
            self.vms[lib] = rvm.VirtualMachine(load_tvm_module(library_path(self.dir, lib)), self.dev)
        vm = self.vms[lib]
        extra = []
        if var.get("streams"):
            key = (lib, var["streams"])
            if key not in self.streams:
                self.streams[key] = vm[var["streams"]]()
            extra = [self.streams[key]]
        fn = vm[var["function"]]
        weights = self.weights
        if var.get("weight_recipe"):   # IOS's merged convolutions: weights derived from the model's draws
            key = json.dumps(var["weight_recipe"])
            if key not in self.derived:
                self.derived[key] = [tvm.runtime.tensor(a, self.dev)
                                     for a in derive_weights(self.raw_weights, var["weight_recipe"])]
            weights = self.derived[key]
        return lambda: fn(*self.inputs, *weights, *extra)

    def close(self) -> None:
        for (lib, name), hs in self.streams.items():
            try:
                self.dev.sync()
                self.vms[lib][name.replace("__tvm_interop_streams", "__tvm_interop_free_streams")](hs)
            except Exception:  # noqa: BLE001 - freeing is best effort
                pass
        self.streams = {}


# ---------------------------------------------------------------------------------------------- helpers
def load_manifest(d: str) -> dict:
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def selected_models(manifest: dict, models: str | None) -> list[dict]:
    """The manifest's model entries, restricted to ``--models a,b`` when given, in that order (the most wanted
    first: a run cut off by the device's time limit keeps the models it finished); a model's name selects its
    ``+cudnn`` / ``+tuned`` / ``+auto`` entries too, right after it."""
    if not models:
        return list(manifest["models"])
    order = [m.strip() for m in models.split(",") if m.strip()]

    def rank(entry: dict) -> int | None:
        # an entry by its name, or by its model's (``inception_v3`` also selects ``inception_v3+cudnn``)
        for key in (entry["name"], entry["name"].split("+")[0]):
            if key in order:
                return order.index(key)
        return None

    return sorted((e for e in manifest["models"] if rank(e) is not None), key=rank)


def preflight(d: str, entries: list[dict]) -> dict[str, dict[str, list[str]]]:
    """``{model: {library: CUDA kernel formats}}``; raises SourceKernelsError before anything is loaded when a
    library holds CUDA source (no load-time compile on the device)."""
    return {e["name"]: check_kernels(d, [v["library"] for v in e["variants"]]
                                     + ([_bundle_library(e)] if e.get("unit_bundle") else [])) for e in entries}


def _bundle_library(entry: dict) -> str:
    return os.path.join(entry["unit_bundle"], "bundle.so")


class CannotRun(Exception):
    """The carried build cannot run here (CUDA source in a library, no manifest, no GPU): ``status`` is the exit
    code, the message the one-paragraph reason."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def start(args) -> tuple[dict, list[dict], dict, object, bool]:
    """What run and diagnose both do first: (manifest, selected entries, kernel formats, device, is_gpu), or
    :class:`CannotRun` (already logged) when the build cannot run here, before anything is loaded."""
    manifest = load_manifest(args.dir)
    entries = selected_models(manifest, args.models)
    try:
        kernels = preflight(args.dir, entries)
        dev, is_gpu = open_device(manifest)
    except (SourceKernelsError, FileNotFoundError, DeviceError) as e:
        raise CannotRun(refuse(e)) from None
    return manifest, entries, kernels, dev, is_gpu


def refuse(e: Exception) -> int:
    """Exit status 2 with a one-paragraph reason (no traceback): the carried build cannot run here."""
    log(f"gpu_check: {e}")
    return 2


def _bench(fn, sync, warmup: int, repeat: int) -> dict:
    import numpy as np

    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    a = np.array(times) * 1e3
    return {"median_ms": float(np.median(a)), "mean_ms": float(a.mean()), "min_ms": float(a.min()),
            "p90_ms": float(np.percentile(a, 90)), "repeat": repeat, "warmup": warmup}


def _to_numpy(out):
    import tvm

    if isinstance(out, tvm.runtime.Tensor):
        return out.numpy()
    return [_to_numpy(o) for o in out]


def _max_err(a, b) -> float:
    import numpy as np

    if isinstance(a, list):
        return max(_max_err(x, y) for x, y in zip(a, b))
    return float(np.max(np.abs(np.asarray(a, dtype="float64") - np.asarray(b, dtype="float64"))))


TF32_TOL_REL = 1e-2   # TensorFloat-32 keeps 10 mantissa bits: an entry built with --tf32 is held to this


def tolerance(ref, rel: float = TOL_REL) -> float:
    """Allowed max abs error against plain TVM: relative to the reference's largest magnitude (kernels of the
    same math, reordered, differ in the last bits)."""
    import numpy as np

    first = ref[0] if isinstance(ref, list) else ref
    return rel * max(1e-6, float(np.max(np.abs(np.asarray(first))))) + TOL_ABS


def _weights(entry, seed: int, make):
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for w in entry["weights"]:
        shape = tuple(w["shape"])
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(1, shape[0] if shape else 1)
        out.append(make((rng.standard_normal(shape) * np.sqrt(1.0 / fan_in)).astype(w["dtype"])))
    return out


def _error_text(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]


# ---------------------------------------------------------------------------------------------- picking
def _pick_per_scheduler(calls: dict, sync, rounds: int) -> dict:
    """For each scheduler, what the runtime's picker would ship from the candidates a library compiled with it
    carries (its variants in both modes, direct and CUDA graph, and the sequential ones; for ``X+wave`` and
    ``X+flow``, also ``X``'s variants: a fused library carries its schedule unfused, ``passes.candidates``), timed
    interleaved."""
    seq = {n: c for n, c in calls.items() if n.startswith("sequential")}
    if not seq or rounds <= 0:
        return {}
    out = {}
    scheds = sorted({n.split(" ")[0] for n in calls} - {"sequential", "plain"})
    for s in scheds:
        own = {s, fusion_of(s)[0]}
        mine = {n: c for n, c in calls.items() if n.split(" ")[0] in own}
        out[s] = _interleaved_pick({**mine, **seq}, sync, rounds)
    return out


def _interleaved_pick(calls: dict, sync, rounds: int) -> dict:
    """Time ``calls`` (name -> callable) in interleaved rounds and choose as the runtime does
    (``runtime.picker.choose``: lowest median, ties within 1% to the earlier name)."""
    import numpy as np

    from tvm_interop.runtime.picker import TIE, choose

    names = list(calls)
    times = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            t0 = time.perf_counter()
            calls[n]()
            sync()
            times[n].append(time.perf_counter() - t0)
    choice = choose(times, names)
    med = {n: float(np.median(t)) * 1e3 for n, t in times.items()}
    seq = min(v for n, v in med.items() if n.startswith("sequential"))
    return {"choice": choice, "median_ms": med[choice], "best_sequential_ms": seq, "speedup": seq / med[choice],
            "never_slower": med[choice] <= seq * (1 + TIE), "candidates": med, "rounds": rounds}


# ---------------------------------------------------------------------------------------------- the step
def _torch_available(is_gpu: bool) -> bool:
    """PyTorch eager runs only on a GPU machine with a CUDA build of torch (cuDNN benchmark mode on)."""
    try:
        import torch
    except ImportError:
        return False
    if not (is_gpu and torch.cuda.is_available()):
        return False
    torch.backends.cudnn.benchmark = True
    # fp32 as our kernels compute it: no TF32 tensor cores (PyTorch's default for convolutions is TF32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return True


def _new_result(args, manifest: dict, dev, is_gpu: bool) -> dict:
    env = environment(dev, is_gpu)
    return {"format": "tvm-interop-gpu-check-result", "version": 1, "environment": env,
            "device": env["device"], "compute_version": env["compute_capability"], "multi_processors":
            env["sm_count"] if is_gpu else os.cpu_count(), "tvm": env["tvm"], "python": env["python"],
            "repeat": args.repeat, "warmup": args.warmup, "timing": "wall clock of one call + device sync; median",
            "build": {k: manifest.get(k) for k in ("target", "width", "image_size", "batch", "cost", "max_streams",
                                                   "waits", "built_from", "built_at")},
            "torch": env["torch"] if _torch_available(is_gpu) else None, "models": []}


def _check_variant(variants: Variants, var: dict, ref, is_reference: bool, args,
                   sync) -> tuple[dict, Any, Callable | None]:
    """One variant: its output against ``ref`` (plain TVM's; ``is_reference``: this one is plain TVM) and its
    latency. Returns the record, its output and the callable (None when it failed or computed something else)."""
    rec = {k: var.get(k) for k in ("name", "cuda_graph", "num_streams", "stages", "max_concurrency", "mode",
                                   "predicted_ms", "note", "sync", "syncs", "waits")}
    try:
        run_once = variants.call(var)
        t0 = time.perf_counter()
        out = _to_numpy(run_once())
        # the first call pays what a user's first inference pays: cuDNN handles, workspaces, the engine choice per
        # convolution shape (timed runs), a CUDA graph's capture
        rec["first_call_ms"] = (time.perf_counter() - t0) * 1e3
        ref = out if is_reference else ref
        if ref is None:
            rec.update(ok=None, note="not checked: plain TVM failed")
        else:
            rec["max_abs_err"] = _max_err(out, ref)
            rec["ok"] = bool(rec["max_abs_err"] <= tolerance(ref, TF32_TOL_REL if var.get("tf32") else TOL_REL))
        if variants.library_units:
            from tvm_interop.runtime.native_libs import library_call_stats

            library_call_stats(reset=True)
        rec.update(_bench(run_once, sync, args.warmup, args.repeat))
        if variants.library_units:   # host us per direct library call: ours before the call, the library's in it
            rec["library_host_us"] = {k: v for k, v in (library_call_stats(reset=True) or {}).items() if v["calls"]}
    except Exception as e:  # noqa: BLE001 - record and go on with the other variants
        rec.update(ok=False, error=_error_text(e))
        return rec, None, None
    if var.get("stage_times") and rec["ok"]:
        try:
            rec["in_context"] = _in_context(variants, var, ref, sync, args)
        except Exception as e:  # noqa: BLE001 - the variant itself is measured; record why its stages are not
            rec["in_context"] = {"error": _error_text(e)}
    return rec, out, run_once if rec["ok"] else None


IN_CONTEXT_REPEAT = 50   # calls of a timed twin (each followed by a read of its events): medians per stage


def _in_context(variants: Variants, var: dict, ref, sync, args) -> dict:
    """The variant's timed twin (``lower_program(stage_timing=True)``: a timing event on the caller's stream at
    every stage boundary): each stage's in-context device time, median over ``IN_CONTEXT_REPEAT`` calls, against the
    stages of the schedule; the twin's output is checked like any variant's, and its own wall-clock median shows
    what the timing events cost."""
    import numpy as np

    spec = var["stage_times"]
    twin = {**var, "function": spec["function"], "streams": spec["streams"]}
    run_once = variants.call(twin)
    err = _max_err(_to_numpy(run_once()), ref)
    read = variants.vms[var["library"]][spec["read"]]
    handles = variants.streams[(var["library"], spec["streams"])]
    for _ in range(args.warmup):
        run_once()
    sync()
    walls, per_call = [], []
    repeat = min(args.repeat, IN_CONTEXT_REPEAT)
    for _ in range(repeat):
        t0 = time.perf_counter()
        run_once()
        sync()
        walls.append(time.perf_counter() - t0)
        per_call.append([float(x) for x in read(handles)])
    times = np.array(per_call)   # calls x stages, ms
    if times.shape[1] != len(spec["stages"]):
        raise RuntimeError(f"{spec['read']} returned {times.shape[1]} stage times for {len(spec['stages'])} stages")
    stages = np.median(times, axis=0)
    return {"stages_ms": [float(x) for x in stages], "stages": spec["stages"],
            "predicted_stages_ms": spec.get("predicted_ms"), "sum_ms": float(stages.sum()),
            "median_total_ms": float(np.median(times.sum(axis=1))),
            "timed_median_ms": float(np.median(walls) * 1e3), "repeat": repeat,
            "max_abs_err": err, "ok": bool(err <= tolerance(ref, TF32_TOL_REL if var.get("tf32") else TOL_REL))}


def _torch_records(args, manifest: dict, entry: dict) -> list[dict]:
    """PyTorch eager on the same network (random weights: latency only, fp32 without TF32), launched op by op
    and replayed as one CUDA graph (the issue's baseline: what PyTorch does best without a compiler)."""
    import torch

    note = "random weights: latency only; fp32, TF32 off"
    eager = {"name": "PyTorch eager (cuDNN)", "cuda_graph": False, "note": note}
    graph = {"name": "PyTorch eager (cuDNN) + CUDA graph", "cuda_graph": True, "note": note}
    try:
        with open(os.path.join(args.dir, entry["torch_program"]), encoding="utf-8") as f:
            run = torch_runner(json.load(f), "cuda", manifest["seed"])
        with torch.inference_mode():
            eager.update(_bench(run, torch.cuda.synchronize, args.warmup, args.repeat))
            eager["ok"] = None
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):   # warm-up off the default stream, as torch.cuda.graphs asks
                for _ in range(3):
                    run()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run()
            graph.update(_bench(g.replay, torch.cuda.synchronize, args.warmup, args.repeat))
            graph["ok"] = None
    except Exception as e:  # noqa: BLE001
        for rec in (eager, graph):
            if "median_ms" not in rec:
                rec["error"] = _error_text(e)
    return [eager, graph]


def _log_variant(model: str, rec: dict) -> None:
    if "median_ms" not in rec:
        log(f"  {model:16s} {rec['name']:32s} FAILED: {rec.get('error')}")
    else:
        err = f"  err {rec['max_abs_err']:.1e}" if "max_abs_err" in rec else ""
        log(f"  {model:16s} {rec['name']:32s} {rec['median_ms']:8.3f} ms{err}")


def run_model(args, manifest: dict, entry: dict, dev, with_torch: bool) -> dict:
    """Every variant of one model checked and timed, the pick per scheduler, PyTorch eager."""
    t0 = time.perf_counter()
    model = {"name": entry["name"], "units": entry["units"], "image_size": entry["image_size"], "variants": []}
    variants = Variants(args.dir, entry, manifest["seed"], dev)
    ref, calls = None, {}
    if entry.get("library_units"):
        from tvm_interop.runtime.native_libs import cudnn_conv_choices

        cudnn_conv_choices(reset=True)   # the per-shape engine choices of this entry's main pass alone
    try:
        for i, var in enumerate(entry["variants"]):
            # the first variant is plain TVM's direct build: the reference
            rec, out, call = _check_variant(variants, var, ref, i == 0, args, dev.sync)
            ref = out if i == 0 else ref
            if call is not None and var.get("waits") != "consumer":   # the legacy placement is not a candidate
                calls[var["name"]] = call
            model["variants"].append(rec)
            _log_variant(entry["name"], rec)
        model["picked"] = _pick_per_scheduler(calls, dev.sync, args.pick_rounds)
        if entry.get("library_units"):
            choices = cudnn_conv_choices() or {}
            if choices.get("policy") == "measured":   # the library's default: its choices are the shipped ones
                model["cudnn_choices"] = engine_choice_summary(choices)
        for sname, pk in model["picked"].items():
            log(f"  {entry['name']:16s} picked for {sname}: {pk['choice']} {pk['median_ms']:.3f} ms "
                f"({pk['speedup']:.2f}x of the best sequential; never slower: {pk['never_slower']})")
    finally:
        variants.close()
    if with_torch and entry.get("torch_program"):
        for rec in _torch_records(args, manifest, entry):
            model["variants"].append(rec)
            _log_variant(entry["name"], rec)
    if entry.get("unit_bundle"):
        model["unit_costs"] = measure_units(args, entry)
        uc = model["unit_costs"]
        log(f"  {entry['name']:16s} unit table -> {uc['table']}: library faster for {uc['library_faster']} of "
            f"{uc['offloadable']} offloadable units; their sum {uc['offloadable_tvm_us']:.0f} us as TVM kernels, "
            f"{uc['offloadable_library_us']:.0f} as library calls, {uc['offloadable_faster_us']:.0f} the faster each")
        if uc.get("splitk"):
            sk = uc["splitk"]
            log(f"  {entry['name']:16s} split-reduction kernels faster than DLight's for {sk['splitk_faster']} of "
                f"{sk['units']} units: {sk['dlight_us']:.0f} -> {sk['splitk_us']:.0f} us (best of three "
                f"{sk['best_of_three_us']:.0f} us)")
    model["seconds"] = time.perf_counter() - t0
    return model


def engines_suffix(policy: str) -> str:
    """The engines pass's name suffix: which cuDNN engine policy re-timed the variant."""
    return f" [{policy} cuDNN engines]"


ENGINES_SUFFIX = engines_suffix("measured")


def other_policy(policy: str | None) -> str:
    """The engine policy the engines pass compares with: the one the library does not run by default."""
    return "legacy" if policy == "measured" else "measured"


@contextlib.contextmanager
def _cudnn_policy(policy: str):
    """The native extension's cuDNN engine policy set for the block and set back after it, also on an error."""
    from tvm_interop.runtime.native_libs import cudnn_engine_policy

    previous = cudnn_engine_policy(policy)
    try:
        yield
    finally:
        cudnn_engine_policy(previous)


def _engine_variants(entry: dict, model: dict) -> list[dict]:
    """What the engines pass re-times: the sequential programs (issue 13's target 1 is about them) and the two
    fastest other variants that ran correctly in the legacy pass (its target 2)."""
    ok = {r["name"]: r for r in model["variants"] if r.get("ok") and "median_ms" in r}
    by_name = {v["name"]: v for v in entry["variants"]}
    chosen = [n for n in ("sequential", "sequential + CUDA graph") if n in ok and n in by_name]
    others = sorted((r["median_ms"], n) for n, r in ok.items()
                    if n in by_name and not n.startswith(("plain TVM", "sequential")))
    chosen += [n for _, n in others[:2]]
    return [{k: v for k, v in by_name[n].items() if k != "stage_times"} for n in chosen]


def run_engines(args, manifest: dict, entry: dict, model: dict, dev) -> dict:
    """The model's library variants again under the cuDNN engine policy the library does not run by default
    (``runtime.native_libs.cudnn_engine_policy``; ``measured``, the default since 2026-11-27: graph-API engine
    configurations and the legacy path timed per convolution shape, the fastest kept; ``legacy``: cudnnFind over
    the legacy algorithms), each checked against plain TVM; then the measured policy's per-shape choices (made in
    this pass, or in the main pass where measured is the default). A pass of its own after every model was measured
    and written: a failure here must not cost the rest of the run. The policy is set back to what it was."""
    from tvm_interop.runtime.native_libs import cudnn_conv_choices, cudnn_engine_policy

    variants = Variants(args.dir, entry, manifest["seed"], dev)
    default = cudnn_engine_policy()
    policy = other_policy(default)
    cudnn_conv_choices(reset=True)   # this model's shapes only in its summary (shared shapes are measured again)
    records: list[dict] = []
    try:
        with _cudnn_policy(policy):
            _, ref, _ = _check_variant(variants, entry["variants"][0], None, True, args, dev.sync)
            for var in _engine_variants(entry, model):
                rec, _, _ = _check_variant(variants, var, ref, False, args, dev.sync)
                rec["name"] += engines_suffix(policy)
                records.append(rec)
                _log_variant(entry["name"], rec)
            choices = cudnn_conv_choices() or {}
    finally:
        variants.close()
    summary = (engine_choice_summary(choices) if policy == "measured" else
               model.get("cudnn_choices") or engine_choice_summary({}))
    return {"policy": policy, "default_policy": default, "variants": records, **summary}


def run_profiles(args, manifest: dict, entry: dict, model: dict, dev) -> dict:
    """Per-kernel device time (``kernel_profile.profile_kernels``) of PyTorch eager (an entry with a PyTorch
    program) and of our sequential program with the legacy and with the measured cuDNN engines (a library
    entry). Last in the run, after every timing: the profiler must not touch a measured number."""
    import torch

    out: dict[str, dict] = {}
    if entry.get("torch_program"):
        with open(os.path.join(args.dir, entry["torch_program"]), encoding="utf-8") as f:
            run = torch_runner(json.load(f), "cuda", manifest["seed"])
        with torch.inference_mode():
            out["PyTorch eager (cuDNN)"] = profile_kernels(run, torch.cuda.synchronize)
    sequential = next((v for v in entry["variants"] if v["name"] == "sequential"), None)
    if entry.get("library_units") and sequential is not None:
        variants = Variants(args.dir, entry, manifest["seed"], dev)
        try:
            call = variants.call(sequential)
            with _cudnn_policy("legacy"):
                out["sequential, legacy cuDNN engines"] = profile_kernels(call, dev.sync)
            with _cudnn_policy("measured"):
                out["sequential, measured cuDNN engines"] = profile_kernels(call, dev.sync)
        finally:
            variants.close()
    return out


def run_timelines(args, manifest: dict, entry: dict, model: dict, dev) -> dict:
    """``--timeline VARIANT``: each named variant of the entry under the CUDA profiler
    (``kernel_profile.profile_timeline``), with the median this run timed for it. Last in the run, like the
    kernel profiles: the profiler must not touch a measured number."""
    medians = {v["name"]: v.get("median_ms") for v in model["variants"]}
    out: dict[str, dict] = {}
    variants = Variants(args.dir, entry, manifest["seed"], dev)
    try:
        for var in entry["variants"]:
            if var["name"] not in args.timeline:
                continue
            t = profile_timeline(variants.call(var), dev.sync)
            if "error" not in t and medians.get(var["name"]):
                t["median_ms"] = medians[var["name"]]
            out[var["name"]] = t
    finally:
        variants.close()
    return out


def engine_choice_summary(choices: dict) -> dict:
    """``cudnn_conv_choices()`` in short: per shape the legacy and the chosen time, and how many chose a graph
    engine; the reasons candidates were dropped, counted."""
    shapes = choices.get("choices", [])
    dropped: dict[str, int] = {}
    for c in shapes:
        for why in c.get("dropped", []):
            dropped[why] = dropped.get(why, 0) + 1
    timed = [c for c in shapes if c["legacy_us"] > 0 and c["chosen_us"] > 0]
    return {"shapes": shapes, "graph_chosen": sum(c["chosen"] != "legacy" for c in shapes),
            "legacy_us": sum(c["legacy_us"] for c in timed), "chosen_us": sum(c["chosen_us"] for c in timed),
            "dropped": dropped}


def measure_units(args, entry: dict) -> dict:
    """The model's unit bundle (``build --unit-costs``) measured as a cost table, written to
    ``OUT/unit_costs/<model>.json`` (what ``build --auto MODEL=TABLE`` and ``compile --units auto --cost table:``
    choose by), and its summary: per offloadable unit the faster of TVM kernel and library call."""
    from tvm_interop.runtime.json_file import read_json
    from tvm_interop.runtime.profile_bundle import measure_plan

    from .device import library_path

    plan = read_json(os.path.join(args.dir, entry["unit_bundle"], "bundle.json"))
    # the device tool returns files named in letters, digits, '.', '_' and '-' only: NAME+splitk -> NAME-splitk
    rel = os.path.join("unit_costs", f"{entry['name'].replace('+', '-')}.json")
    os.makedirs(os.path.join(args.out, "unit_costs"), exist_ok=True)
    table = measure_plan(plan, library_path(args.dir, _bundle_library(entry)), out=os.path.join(args.out, rel))
    out = {"table": rel, **unit_cost_summary(table)}
    base = os.path.join(args.out, "unit_costs", f"{entry['name'].split('+')[0]}.json")
    if entry.get("splitk_units") and os.path.exists(base):
        out["splitk"] = splitk_summary(read_json(base), table, entry["splitk_units"])
    return out


def splitk_summary(base: dict, split: dict, units: list[str]) -> dict:
    """The units whose convolution ``build --splitk`` rescheduled, in microseconds: as DLight's kernel (the entry
    without), as the split-reduction kernel, and as the library call where the base table timed one."""
    library = {st["groups"][0][0]: st["latency"] * 1e6 for st in base["stages"] if st.get("strategy") == "library"}
    rows = {u: (base["units"][u] * 1e6, split["units"][u] * 1e6, library.get(u)) for u in units
            if u in base["units"] and u in split["units"]}
    return {"units": len(rows), "splitk_faster": sum(s < d for d, s, _ in rows.values()),
            "dlight_us": sum(d for d, _, _ in rows.values()), "splitk_us": sum(s for _, s, _ in rows.values()),
            "best_of_three_us": sum(min(x for x in r if x is not None) for r in rows.values()),
            "per_unit_us": {u: list(r) for u, r in rows.items()}}


def unit_cost_summary(table: dict) -> dict:
    """Sums over a unit table, in microseconds: every TVM kernel; the offloadable units as TVM kernels, as library
    calls, and each as the faster of the two (what ``units="auto"`` would run); how many the library wins. A table
    with device-clock times (a GPU table from this version on) gets the same sums on that clock under ``device``,
    and how many units the two clocks choose differently for (``flips``): the issue clock is what a direct program
    pays, the device clock what a CUDA graph pays."""
    from tvm_interop.runtime.profile_bundle import unit_row

    def times(field: str) -> tuple[dict, dict]:
        rows = [st for st in table["stages"] if st.get(field) is not None]
        if field == "latency":   # the table's own unit times
            tvm_us = {u: v * 1e6 for u, v in table["units"].items()}
        else:                    # a unit's own row: its concurrent one-unit stage
            tvm_us = {unit_row(st): st[field] * 1e6 for st in rows if unit_row(st) is not None}
        library_us = {st["groups"][0][0]: st[field] * 1e6 for st in rows if st.get("strategy") == "library"}
        return tvm_us, library_us

    def sums(tvm_us: dict, library_us: dict) -> dict:
        both = [(tvm_us[u], lib) for u, lib in library_us.items() if u in tvm_us]
        return {"units": len(tvm_us), "offloadable": len(library_us),
                "library_faster": sum(lib < t for t, lib in both), "all_tvm_us": sum(tvm_us.values()),
                "offloadable_tvm_us": sum(t for t, _ in both), "offloadable_library_us": sum(lib for _, lib in both),
                "offloadable_faster_us": sum(min(t, lib) for t, lib in both),
                # the whole model one unit after another, each unit the faster of its two implementations
                "all_faster_us": sum(min(t, library_us.get(u, t)) for u, t in tvm_us.items())}

    issue = times("latency")
    out = {**sums(*issue), "method": table.get("method"), "seconds": table.get("seconds")}
    device = times("device_latency")
    if device[1]:
        out["device"] = sums(*device)
        common = [u for u in device[1] if u in device[0] and u in issue[0] and u in issue[1]]
        out["device"]["flips"] = sum((issue[1][u] < issue[0][u]) != (device[1][u] < device[0][u]) for u in common)
        out["device"]["library_issue_over_device"] = sorted(issue[1][u] / device[1][u] for u in common
                                                            if device[1][u] > 0)
    if table.get("device_clock"):
        out["device_clock"] = table["device_clock"]
    return out


def _write(out: str, result: dict) -> None:
    from tvm_interop.runtime import atomic

    os.makedirs(out, exist_ok=True)
    atomic.write_text(os.path.join(out, "gpu_check.json"), json.dumps(result, indent=1))
    atomic.write_text(os.path.join(out, "gpu_check.md"), render_markdown(result))


def cmd_run(args) -> int:
    """Check and time every variant of every (selected) model; exit 1 when a variant fails, 2 when the carried
    build cannot run here at all (CUDA source in a library, no manifest)."""
    try:
        manifest, entries, kernels, dev, is_gpu = start(args)
    except CannotRun as e:
        return e.status
    result = _new_result(args, manifest, dev, is_gpu)
    if manifest.get("probe"):   # first: seconds, and what the program model's host costs should be
        from .probe import run_probe

        try:
            result["probe"] = run_probe(args.dir, manifest["probe"], dev, dev.sync)
        except Exception as e:  # noqa: BLE001 - the models are what the run is for
            result["probe"] = {"error": _error_text(e)}
        _write(args.out, result)
    for entry in entries:
        model = run_model(args, manifest, entry, dev, result["torch"] is not None)
        model["kernels"] = kernels[entry["name"]]
        result["models"].append(model)
        # after every model: a run cut off by the device's time limit still returns what it measured
        result["runtime_only"] = runtime_only_status()
        _write(args.out, result)
    if not args.no_cudnn_engines:
        for entry, model in zip(entries, result["models"]):
            if not entry.get("library_units") or "+tf32" in entry["name"]:
                continue
            try:
                model["cudnn_engines"] = run_engines(args, manifest, entry, model, dev)
            except Exception as e:  # noqa: BLE001 - the main pass is recorded; say why this one is not
                model["cudnn_engines"] = {"error": _error_text(e)}
            ce = model["cudnn_engines"]
            log(f"  {entry['name']:16s} {ce.get('policy', 'measured')} cuDNN engines pass: "
                + (ce["error"] if "error" in ce else
                   f"graph engine chosen for {ce['graph_chosen']} of {len(ce['shapes'])} shapes; per call "
                   f"{ce['legacy_us']:.0f} -> {ce['chosen_us']:.0f} us summed"))
            _write(args.out, result)
    if result["torch"] is not None and not args.no_kernel_profile:
        for entry, model in zip(entries, result["models"]):
            if "+tf32" in entry["name"] or not (entry.get("torch_program") or entry.get("library_units")):
                continue
            try:
                model["kernel_profiles"] = run_profiles(args, manifest, entry, model, dev)
            except Exception as e:  # noqa: BLE001 - a diagnostic: record why it is missing
                model["kernel_profiles"] = {"all": {"error": _error_text(e)}}
            _write(args.out, result)
    if result["torch"] is not None and getattr(args, "timeline", None):
        for entry, model in zip(entries, result["models"]):
            if not any(v["name"] in args.timeline for v in entry["variants"]):
                continue
            try:
                model["timelines"] = run_timelines(args, manifest, entry, model, dev)
            except Exception as e:  # noqa: BLE001 - a diagnostic: record why it is missing
                model["timelines"] = {"all": {"error": _error_text(e)}}
            log(f"  {entry['name']:16s} timelines: " + "; ".join(
                f"{n} " + (t["error"] if "error" in t else f"busy {t['busy_us']:.0f} us, concurrency "
                                                           f"{t['concurrency']:.2f}")
                for n, t in model["timelines"].items()))
            _write(args.out, result)
    result["runtime_only"] = runtime_only_status()
    _write(args.out, result)
    bad = [(m["name"], v["name"]) for m in result["models"] for v in m["variants"] if v.get("ok") is False]
    log(f"wrote {args.out}/gpu_check.json and gpu_check.md; {len(bad)} variant(s) failed")
    return 0 if not bad else 1
