#!/usr/bin/env python3
"""GPU check of tvm-interop: correctness and batch-1 latency of the zoo on an NVIDIA GPU.

The GPU machine has TVM's *runtime* only (no compiler), so the check is split (``scripts/gpu_check.sh`` wraps
the three steps; its header has the exact recipe for this workplace's device tool):

``build`` (here, with the compiler; no GPU needed)
    For each zoo model: prepare it once, then build for CUDA (sm_90, nvcc)

    * ``<model>.plain.so`` -- **plain TVM**: the prepared module (``relax.get_pipeline("zero")``) through TVM's
      default CUDA pipeline (DLight schedules): ``main`` with direct launches and ``main_graph``, the same
      program rewritten by TVM's own ``RewriteCUDAGraph``. Its outputs on the GPU are the reference.
    * ``<model>.sched.so`` -- the **scheduled** programs: for each scheduler (sequential, greedy, lios, ios;
      cost ``sim:h100`` unless ``--cost``) the stream-lowered program, with and without CUDA graph
      (``<sched>__stage____tvm_interop_main`` / ``..._main_graph``), all in one library sharing the kernels.

    Weights are **parameters** (``main(x, *weights)``), generated on the device from a seed, so the libraries
    carry kernels only, and they are stored xz-compressed (``.so.xz``, ~40x smaller; the carry limit is 64 MiB). A ``manifest.json`` lists models, shapes, weights, the
    functions to run and what was decided (streams, CUDA graph or why not). Also written: the runtime-only TVM
    package (``tvm_kit.tar.xz``, the ``tvm`` Python package without ``libtvm_compiler.so``), the Python 3.12 wheel
    of ``apache-tvm-ffi`` (``whl/``), and for each model a small op list that PyTorch can run eagerly.

``run`` (there: runtime only, ``TVM_USE_RUNTIME_LIB=1``)
    Loads the libraries with ``tvm.runtime.load_module`` and ``runtime/`` (``runtime.cuda`` loads TVM's CUDA
    runtime), computes the reference with the plain build, checks every variant's output against it, and
    measures batch-1 latency: wall clock of one call plus a device sync, median of ``--repeat`` (>= 100) runs
    after ``--warmup`` runs. PyTorch eager (the same network from the op list, cuDNN) when ``torch`` with CUDA
    is importable. Writes ``gpu_check.json`` and ``gpu_check.md`` into ``--out``.

    Then, per scheduler, the candidate programs a compiled library would carry (that scheduler's variants and
    the sequential ones) are timed again interleaved and chosen as ``runtime.picker`` does: the report says what
    ships and that it is never slower than sequential. The report records device, driver, nvcc, TVM, Python.

``diagnose`` (there: runtime only)
    Every concurrent variant runs ``--runs`` times on the same inputs, then again in a child process with
    ``CUDA_LAUNCH_BLOCKING=1``; each is classified exact / racy / wrong (``gpu_check_diagnose.json`` / ``.md``).

``report`` (here)
    Copies a run's JSON into ``docs/gpu_check.json`` and renders ``docs/gpu_check.md``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tarfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DEFAULT_DIR = os.path.join(REPO, ".gpu_check")
SCHEDULERS = ("sequential", "greedy", "lios", "ios")
CARRY_LIMIT = 60 * 2**20
FUNC = "__tvm_interop_main"


# ============================================================================================== build (here)
def _structural_equal(a, b) -> bool:
    import tvm

    fn = getattr(tvm.ir, "structural_equal", None)
    if fn is None:
        from tvm_ffi import structural_equal as fn
    return bool(fn(a, b))


def _merge(mods) -> "tvm.IRModule":
    import tvm

    funcs: dict = {}
    by_name: dict = {}
    for m in mods:
        for gv, f in m.functions.items():
            prev = by_name.get(gv.name_hint)
            if prev is not None:
                if not _structural_equal(prev[1], f):
                    raise RuntimeError(f"two different functions named {gv.name_hint} in the scheduled variants")
                continue
            by_name[gv.name_hint] = (gv, f)
            funcs[gv] = f
    return tvm.IRModule(funcs)


def _export_xz(ex, path: str, arches: list[str] | None = None) -> None:
    """Export the library and keep it xz-compressed (``path + '.xz'``): kernel libraries shrink ~40x. CUDA
    libraries carry fatbins for ``arches`` (``passes.cuda_compile``), so the device needs TVM's runtime only."""
    import lzma

    if arches:
        from passes.cuda_compile import export_cuda_library

        export_cuda_library(ex, path, arches)
    else:
        ex.export_library(path)
    with open(path, "rb") as f, lzma.open(path + ".xz.tmp", "wb", preset=6) as g:
        g.write(f.read())
    os.replace(path + ".xz.tmp", path + ".xz")
    os.unlink(path)


def _runtime_kit(out: str, log) -> None:
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

        with tarfile.open(kit + ".tmp", "w:xz") as tf:
            tf.add(os.path.join(root, "tvm"), arcname="tvm", filter=filt)
        os.replace(kit + ".tmp", kit)
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


def cmd_build(args) -> int:
    import numpy as np  # noqa: F401

    import tvm_interop
    from passes.cuda_build import build_cuda, ensure_nvcc
    from passes.target import normalize_target
    from passes.lower_streams import lift_main_constants, lower_program
    from passes.schedulers import available_schedulers, schedule_graph
    from passes.as_built import check_lowered
    from runtime.cuda import MAIN_GRAPH_FUNC
    from runtime.errors import UnsupportedModelError
    from tvm_interop.export import graph_to_json, read_relax
    from tvm_interop.models import MODELS, get_model, list_models

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    target = normalize_target(args.target)
    gpu = target.kind.name == "cuda"
    if gpu:
        ensure_nvcc()
    else:
        log(f"target {target.kind.name}: a CPU dry run of the check (no CUDA graphs)")

    arches = [target.attrs["arch"]] if gpu else None

    def build(mod, graph_funcs, strict=True, check=False):
        if gpu:
            from passes.as_built import memory_check_pass

            # the scheduled library is checked inside the build, on the IR it compiles (the build refuses it)
            return build_cuda(mod, target, cuda_graph=bool(graph_funcs), graph_funcs=graph_funcs, strict=strict,
                              after_kill=[memory_check_pass()] if check else (), arches=arches)
        from passes.cuda_build import CudaBuildReport

        import tvm

        return tvm.compile(mod, target), CudaBuildReport()
    out = args.dir
    os.makedirs(os.path.join(out, "libs"), exist_ok=True)
    if not args.no_kit:
        _runtime_kit(out, log)
    models = list_models() if args.models == "all" else [m.strip() for m in args.models.split(",") if m.strip()]
    schedulers = [s for s in args.schedulers.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    manifest = {"format": "tvm-interop-gpu-check", "version": 1,
                "target": f"cuda -arch={target.attrs['arch']}" if gpu else target.kind.name,
                "device": "cuda" if gpu else "cpu",
                "tvm": __import__("tvm").__version__, "built_on": platform.node(), "width": args.width,
                "image_size": args.image_size, "batch": args.batch, "seed": args.seed, "cost": args.cost,
                "max_streams": args.max_streams, "models": []}
    for name in models:
        t0 = time.perf_counter()
        spec = MODELS[name]
        kw = {}
        if args.depth is not None and spec.depth_param:
            kw["depth"] = max(spec.min_depth, args.depth)
        image = args.image_size or spec.default_image_size
        mod = get_model(name, batch_size=args.batch, image_size=image, width=args.width, **kw)
        program = tvm_interop.api.prepare_program(mod, target, name=name)
        entry = {"name": name, "image_size": image, "units": len(program.graph),
                 "inputs": [{"shape": list(t.shape), "dtype": t.dtype} for t in program.input_infos],
                 "weights": [{"shape": [int(d) for d in c.shape], "dtype": str(c.dtype)} for c in program.constants],
                 "variants": []}
        # plain TVM, direct and with TVM's own CUDA graph
        plain = lift_main_constants(program)
        from tvm.relax.utils import copy_with_new_vars

        main_fn = copy_with_new_vars(plain["main"])  # the same program under a second name (fresh variables)
        plain["main_graph"] = main_fn.with_attr("global_symbol", "main_graph") \
            if main_fn.attrs is not None and "global_symbol" in main_fn.attrs else main_fn
        ex, rep = build(plain, ["main_graph"] if gpu else [], strict=False)
        plain_path = os.path.join("libs", f"{name}.plain.so")
        _export_xz(ex, os.path.join(out, plain_path), arches)
        entry["plain"] = {"library": plain_path}
        entry["variants"].append({"name": "plain TVM", "library": plain_path, "function": "main", "streams": None,
                                  "cuda_graph": False})
        entry["variants"].append({"name": "plain TVM + CUDA graph", "library": plain_path,
                                  "function": "main_graph" if gpu else "main",
                                  "streams": None, "cuda_graph": rep.cuda_graph,
                                  "note": None if rep.cuda_graph else rep.reasons.get("main_graph", rep.reason)})
        # the scheduled programs, all in one library
        lowered = []
        graph_funcs = []
        sched_path = os.path.join("libs", f"{name}.sched.so")
        pending = []
        for sname in schedulers:
            if sname not in available_schedulers():
                log(f"  {name}: scheduler {sname} not available, skipped")
                continue
            opts = {"max_streams": args.max_streams} if sname == "greedy" else {}
            sched = schedule_graph(program.graph, sname, args.cost, model_name=name, **opts)
            for mode in modes:
                prefix = f"{sname}__{mode}__"
                low = lower_program(program, sched, target, max_streams=args.max_streams, mode=mode,
                                    cuda_graph=True, lift_constants=True, prefix=prefix)
                report = check_lowered(low.mod, target)
                report.raise_if_unsafe()
                lowered.append(low.mod)
                graph_funcs.append(prefix + MAIN_GRAPH_FUNC)
                pending.append((sname, mode, prefix, low, sched))
        ex, rep = build(_merge(lowered), graph_funcs if gpu else [], check=True)
        _export_xz(ex, os.path.join(out, sched_path), arches)
        for sname, mode, prefix, low, sched in pending:
            label = sname if mode == "stage" else f"{sname} ({mode})"
            common = {"library": sched_path, "streams": prefix + "__tvm_interop_streams",
                      "num_streams": low.num_streams, "stages": sched.num_stages,
                      "max_concurrency": sched.max_concurrency(), "mode": mode,
                      "predicted_ms": (sched.predicted_latency or 0) * 1e3}
            entry["variants"].append({"name": label, "function": prefix + FUNC, "cuda_graph": False, **common})
            gname = prefix + MAIN_GRAPH_FUNC
            entry["variants"].append({"name": f"{label} + CUDA graph", "function": gname if gpu else prefix + FUNC,
                                      "cuda_graph": gname in rep.graph_functions,
                                      "note": rep.reasons.get(gname) or (None if gpu else "CPU dry run"),
                                      **common})
        torch_path = os.path.join("libs", f"{name}.torch.json")
        try:
            with open(os.path.join(out, torch_path), "w", encoding="utf-8") as f:
                json.dump(graph_to_json(read_relax(mod)), f)
            entry["torch_program"] = torch_path
        except UnsupportedModelError as e:
            entry["torch_program"] = None
            entry["torch_note"] = str(e)
        manifest["models"].append(entry)
        log(f"  {name}: {len(program.graph)} units, {len(entry['variants'])} variants, built in "
            f"{time.perf_counter() - t0:.0f} s")
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
    total = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(out) for fn in fns)
    log(f"wrote {out} ({total / 2**20:.1f} MiB{'; OVER the 60 MiB carry budget' if total > CARRY_LIMIT else ''})")
    return 0 if total <= CARRY_LIMIT else 1


# ============================================================================================== run (there)
def _library(d: str, lib: str) -> str:
    """The path of a library, decompressed from ``lib + '.xz'`` into /tmp when needed."""
    import lzma
    import tempfile

    path = os.path.join(d, lib)
    if os.path.exists(path):
        return path
    # keyed by the compressed file's identity: a library rebuilt under the same name is never served stale
    st = os.stat(path + ".xz")
    tag = f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}"
    import hashlib

    target = os.path.join(tempfile.gettempdir(), "gpu_check_libs", hashlib.sha256(tag.encode()).hexdigest()[:16],
                          os.path.basename(lib))
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with lzma.open(path + ".xz", "rb") as f, open(target + ".tmp", "wb") as g:
            g.write(f.read())
        os.replace(target + ".tmp", target)
    return target


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


def _weights(entry, seed: int, make):
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for w in entry["weights"]:
        shape = tuple(w["shape"])
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else max(1, shape[0] if shape else 1)
        out.append(make((rng.standard_normal(shape) * np.sqrt(1.0 / fan_in)).astype(w["dtype"])))
    return out


def torch_runner(data: dict, device: str, seed: int = 0):
    """The network of ``<model>.torch.json`` (``tvm_interop.export.graph_to_json``) as eager PyTorch on
    ``device``, with random weights and inputs of the recorded shapes: a callable running it once. The one
    Relax->torch interpreter (``tvm_interop.export.torch_interp``) builds it; nothing here needs TVM's compiler."""
    import torch

    from tvm_interop.export import graph_from_json
    from tvm_interop.export.torch_interp import graph_to_torch

    g = graph_from_json(data, seed=seed)
    module = graph_to_torch(g).to(device).eval()
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(tuple(shape), generator=gen).to(device) for _, shape, _ in g.inputs]
    return lambda: module(*xs)


def _command_output(cmd: list[str]) -> str | None:
    import shutil
    import subprocess

    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def environment(dev, is_gpu: bool) -> dict:
    """What the numbers were measured on: device, driver, CUDA, nvcc, TVM, Python (runtime-only queries; a
    missing tool reads "not found")."""
    import tvm

    env = {"tvm": tvm.__version__, "python": platform.python_version(), "host": platform.node()}
    if is_gpu:
        env.update(device=dev.device_name, compute_version=dev.compute_version,
                   multi_processors=dev.multi_processor_count)
        smi = _command_output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader"])
        env["driver"] = smi.splitlines()[0].split(",")[1].strip() if smi else "not found"
        cuda = _command_output(["nvidia-smi"])
        env["cuda_driver_api"] = next((ln.split("CUDA Version:")[1].split("|")[0].strip()
                                       for ln in (cuda or "").splitlines() if "CUDA Version:" in ln), "not found")
    else:
        env.update(device=f"CPU ({platform.processor() or platform.machine()})", compute_version=None,
                   multi_processors=os.cpu_count(), driver=None, cuda_driver_api=None)
    nvcc = _command_output(["nvcc", "--version"])
    env["nvcc"] = nvcc.splitlines()[-1].strip() if nvcc else "not found"
    try:
        import torch

        env["torch"] = f"{torch.__version__} (cuda {torch.version.cuda})"
    except ImportError:
        env["torch"] = "not installed"
    return env


def _pick_per_scheduler(calls: dict, sync, rounds: int) -> dict:
    """For each scheduler, what the runtime's picker would ship from the candidates a library compiled with it
    carries (its variants in both modes, direct and CUDA graph, and the sequential ones), timed interleaved."""
    seq = {n: c for n, c in calls.items() if n.startswith("sequential")}
    if not seq or rounds <= 0:
        return {}
    out = {}
    scheds = sorted({n.split(" ")[0] for n in calls} - {"sequential", "plain"})
    for s in scheds:
        mine = {n: c for n, c in calls.items() if n.split(" ")[0] == s}
        out[s] = _interleaved_pick({**mine, **seq}, sync, rounds)
    return out


def _interleaved_pick(calls: dict, sync, rounds: int) -> dict:
    """Time ``calls`` (name -> callable) in interleaved rounds and choose as the runtime does
    (``runtime.picker.choose``: lowest median, ties within 1% to the earlier name)."""
    import numpy as np

    from runtime.picker import TIE, choose

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


def cmd_run(args) -> int:
    import numpy as np
    import tvm
    from tvm.runtime import vm as rvm

    from runtime.cuda import check_cuda_device, ensure_cuda_runtime

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    with open(os.path.join(args.dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    if manifest.get("device", "cuda") == "cuda":
        ensure_cuda_runtime()
        dev = check_cuda_device(0)
    else:
        dev = tvm.cpu(0)
    is_gpu = dev.dlpack_device_type() != 1 if hasattr(dev, "dlpack_device_type") else True
    result = {"format": "tvm-interop-gpu-check-result", "version": 1, "environment": environment(dev, is_gpu),
              "device": dev.device_name if is_gpu else f"CPU ({platform.processor() or platform.machine()})",
              "compute_version": dev.compute_version if is_gpu else None,
              "multi_processors": dev.multi_processor_count if is_gpu else os.cpu_count(),
              "tvm": tvm.__version__, "python": platform.python_version(), "repeat": args.repeat,
              "warmup": args.warmup, "timing": "wall clock of one call + device sync; median",
              "build": {k: manifest[k] for k in ("target", "width", "image_size", "batch", "cost", "max_streams")},
              "torch": None, "models": []}
    try:
        import torch

        have_torch = torch.cuda.is_available() and is_gpu
        result["torch"] = f"{torch.__version__} (cuda {torch.version.cuda})" if have_torch else None
        if have_torch:
            torch.backends.cudnn.benchmark = True
    except ImportError:
        have_torch = False
    only = set(args.models.split(",")) if args.models else None
    for entry in manifest["models"]:
        if only and entry["name"] not in only:
            continue
        t0 = time.perf_counter()
        rng = np.random.default_rng(manifest["seed"])
        xs = [rng.standard_normal(tuple(s["shape"])).astype(s["dtype"]) for s in entry["inputs"]]
        x_dev = [tvm.runtime.tensor(x, dev) for x in xs]
        w_dev = _weights(entry, manifest["seed"] + 1, lambda a: tvm.runtime.tensor(a, dev))
        vms: dict = {}
        streams: dict = {}

        def vm_of(lib):
            if lib not in vms:
                vms[lib] = rvm.VirtualMachine(tvm.runtime.load_module(_library(args.dir, lib)), dev)
            return vms[lib]

        model = {"name": entry["name"], "units": entry["units"], "image_size": entry["image_size"], "variants": []}
        ref = None
        calls: dict = {}
        for var in entry["variants"]:
            rec = {k: var.get(k) for k in ("name", "cuda_graph", "num_streams", "stages", "max_concurrency", "mode",
                                          "predicted_ms", "note")}
            try:
                vm = vm_of(var["library"])
                extra = []
                if var.get("streams"):
                    key = (var["library"], var["streams"])
                    if key not in streams:
                        streams[key] = vm[var["streams"]]()
                    extra = [streams[key]]
                fn = vm[var["function"]]
                out = _to_numpy(fn(*x_dev, *w_dev, *extra))
                if ref is None:
                    ref = out  # the first variant is plain TVM's direct build: the reference
                err = _max_err(out, ref)
                scale = max(1e-6, float(np.max(np.abs(np.asarray(ref if not isinstance(ref, list) else ref[0])))))
                rec["max_abs_err"] = err
                rec["ok"] = bool(err <= 1e-4 * scale + 1e-5)
                rec.update(_bench(lambda: fn(*x_dev, *w_dev, *extra), dev.sync, args.warmup, args.repeat))
                if rec["ok"]:
                    calls[var["name"]] = (lambda f=fn, e=tuple(extra): f(*x_dev, *w_dev, *e))
            except Exception as e:  # noqa: BLE001 - record and go on with the other variants
                rec["ok"] = False
                rec["error"] = (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]
            model["variants"].append(rec)
            log(f"  {entry['name']:16s} {rec['name']:32s} "
                + (f"{rec['median_ms']:8.3f} ms  err {rec['max_abs_err']:.1e}" if "median_ms" in rec
                   else f"FAILED: {rec.get('error')}"))
        model["picked"] = _pick_per_scheduler(calls, dev.sync, args.pick_rounds)
        for sname, pk in model["picked"].items():
            log(f"  {entry['name']:16s} picked for {sname}: {pk['choice']} {pk['median_ms']:.3f} ms "
                f"({pk['speedup']:.2f}x of the best sequential; never slower: {pk['never_slower']})")
        if have_torch and entry.get("torch_program"):
            rec = {"name": "PyTorch eager (cuDNN)", "cuda_graph": False, "note": "random weights: latency only"}
            try:
                with open(os.path.join(args.dir, entry["torch_program"]), encoding="utf-8") as f:
                    prog = json.load(f)
                run = torch_runner(prog, "cuda", manifest["seed"])
                with torch.inference_mode():
                    rec.update(_bench(run, torch.cuda.synchronize, args.warmup, args.repeat))
                rec["ok"] = None
            except Exception as e:  # noqa: BLE001
                rec["error"] = (str(e).strip().splitlines() or [type(e).__name__])[-1][:300]
            model["variants"].append(rec)
            log(f"  {entry['name']:16s} {rec['name']:32s} "
                + (f"{rec['median_ms']:8.3f} ms" if "median_ms" in rec else f"FAILED: {rec.get('error')}"))
        for key, hs in streams.items():
            try:
                dev.sync()
                vms[key[0]][key[1].replace("__tvm_interop_streams", "__tvm_interop_free_streams")](hs)
            except Exception:  # noqa: BLE001
                pass
        model["seconds"] = time.perf_counter() - t0
        result["models"].append(model)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_check.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "gpu_check.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(result))
    bad = [(m["name"], v["name"]) for m in result["models"] for v in m["variants"] if v.get("ok") is False]
    log(f"wrote {args.out}/gpu_check.json and gpu_check.md; {len(bad)} variant(s) failed")
    return 0 if not bad else 1


# ============================================================================================== diagnose (there)
def _open_device(manifest: dict):
    import tvm

    from runtime.cuda import check_cuda_device, ensure_cuda_runtime

    if manifest.get("device", "cuda") == "cuda":
        ensure_cuda_runtime()
        return check_cuda_device(0), True
    return tvm.cpu(0), False


def _outputs_of_runs(args, manifest, entry, dev, runs: int) -> dict:
    """name -> {"ref": bool, "outputs": [numpy outputs of each run]} for plain TVM and every concurrent variant
    (each run on the same inputs and weights; a full device sync between runs)."""
    import numpy as np
    import tvm
    from tvm.runtime import vm as rvm

    rng = np.random.default_rng(manifest["seed"])
    xs = [tvm.runtime.tensor(rng.standard_normal(tuple(s["shape"])).astype(s["dtype"]), dev)
          for s in entry["inputs"]]
    ws = _weights(entry, manifest["seed"] + 1, lambda a: tvm.runtime.tensor(a, dev))
    vms, streams, out = {}, {}, {}
    for var in entry["variants"]:
        if var["name"] != "plain TVM" and not var.get("num_streams"):
            continue
        if var["library"] not in vms:
            vms[var["library"]] = rvm.VirtualMachine(tvm.runtime.load_module(_library(args.dir, var["library"])), dev)
        vm = vms[var["library"]]
        extra = []
        if var.get("streams"):
            key = (var["library"], var["streams"])
            if key not in streams:
                streams[key] = vm[var["streams"]]()
            extra = [streams[key]]
        fn = vm[var["function"]]
        res = []
        for _ in range(1 if var["name"] == "plain TVM" else runs):
            res.append(_to_numpy(fn(*xs, *ws, *extra)))
            dev.sync()
        out[var["name"]] = res
    for (lib, name), hs in streams.items():
        try:
            vms[lib][name.replace("__tvm_interop_streams", "__tvm_interop_free_streams")](hs)
        except Exception:  # noqa: BLE001
            pass
    return out


def _spread(outputs: list, ref) -> dict:
    errs = [_max_err(o, ref) for o in outputs]
    between = max((_max_err(a, outputs[0]) for a in outputs[1:]), default=0.0)
    return {"max_err": max(errs), "run_to_run": between, "runs": len(outputs)}


def cmd_diagnose(args) -> int:
    """Run every concurrent variant several times, then again serialized (``CUDA_LAUNCH_BLOCKING=1``, in a
    child process): a variant whose outputs differ between runs or from plain TVM but are exact when
    serialized has a race (what found the keep-alive bug on the H100)."""
    import subprocess

    with open(os.path.join(args.dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    dev, is_gpu = _open_device(manifest)
    only = set(args.models.split(",")) if args.models else None
    models = []
    for entry in manifest["models"]:
        if only and entry["name"] not in only:
            continue
        runs = _outputs_of_runs(args, manifest, entry, dev, args.runs)
        ref = runs.pop("plain TVM")[0]
        scale = max(1e-6, float(__import__("numpy").max(__import__("numpy").abs(
            ref if not isinstance(ref, list) else ref[0]))))
        tol = 1e-4 * scale + 1e-5
        models.append({"name": entry["name"], "tolerance": tol,
                       "variants": [{"name": n, **_spread(o, ref)} for n, o in runs.items()]})
        print(f"  {entry['name']}: {len(runs)} concurrent variants x {args.runs} runs", file=sys.stderr, flush=True)
    result = {"format": "tvm-interop-gpu-diagnose", "version": 1, "serialized": bool(args.serialized),
              "environment": environment(dev, is_gpu), "runs": args.runs, "models": models}
    os.makedirs(args.out, exist_ok=True)
    if args.serialized:
        with open(os.path.join(args.out, "serialized.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        return 0
    child = os.path.join(args.out, "serialized")
    cmd = [sys.executable, os.path.abspath(__file__), "diagnose", "--dir", args.dir, "--out", child, "--runs",
           str(args.runs), "--serialized"] + (["--models", args.models] if args.models else [])
    proc = subprocess.run(cmd, env=dict(os.environ, CUDA_LAUNCH_BLOCKING="1"), capture_output=True, text=True)
    serial = {}
    if proc.returncode == 0:
        with open(os.path.join(child, "serialized.json"), encoding="utf-8") as f:
            serial = {(m["name"], v["name"]): v for m in json.load(f)["models"] for v in m["variants"]}
    else:
        result["serialized_error"] = proc.stderr.strip().splitlines()[-1:] if proc.stderr else ["failed"]
    for m in models:
        for v in m["variants"]:
            s = serial.get((m["name"], v["name"]))
            v["serialized"] = s
            v["verdict"] = classify(v, s, m["tolerance"])
    with open(os.path.join(args.out, "gpu_check_diagnose.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "gpu_check_diagnose.md"), "w", encoding="utf-8") as f:
        f.write(render_diagnose(result))
    bad = [v for m in models for v in m["variants"] if v["verdict"] != "exact"]
    print(f"wrote {args.out}/gpu_check_diagnose.json and .md; {len(bad)} variant(s) not exact", file=sys.stderr)
    return 0 if not bad else 1


def classify(run: dict, serialized: dict | None, tol: float) -> str:
    """exact | racy (differs between runs or from plain TVM, exact serialized) | wrong (wrong serialized too)
    | unknown (no serialized run)."""
    if run["max_err"] <= tol and run["run_to_run"] <= tol:
        return "exact"
    if serialized is None:
        return "unknown"
    return "racy" if serialized["max_err"] <= tol and serialized["run_to_run"] <= tol else "wrong"


def render_diagnose(result: dict) -> str:
    env = result.get("environment", {})
    lines = ["# GPU check: diagnose", "", "Environment: " + "; ".join(f"{k} {v}" for k, v in env.items()), "",
             f"Each concurrent variant ran {result['runs']} times on the same inputs, then again with "
             "`CUDA_LAUNCH_BLOCKING=1` (serialized). racy = wrong or unstable only when concurrent.", ""]
    for m in result["models"]:
        lines += [f"## {m['name']}", "", "| variant | max err | run-to-run | serialized max err | verdict |",
                  "|---|---:|---:|---:|---|"]
        for v in m["variants"]:
            s = v.get("serialized")
            lines.append(f"| {v['name']} | {v['max_err']:.1e} | {v['run_to_run']:.1e} | "
                         f"{s['max_err']:.1e} | {v['verdict']} |" if s else
                         f"| {v['name']} | {v['max_err']:.1e} | {v['run_to_run']:.1e} | — | {v['verdict']} |")
        lines.append("")
    return "\n".join(lines) + "\n"


# ============================================================================================== report
def render_markdown(result: dict) -> str:
    b = result.get("build", {})
    lines = [
        "# GPU check",
        "",
        f"Device: **{result.get('device')}** (compute {result.get('compute_version')}, "
        f"{result.get('multi_processors')} SMs); TVM {result.get('tvm')} runtime; PyTorch {result.get('torch')}.",
        f"Built for `{b.get('target')}` (width {b.get('width')}, batch {b.get('batch')}, image size "
        f"{b.get('image_size') or 'default'}, schedules searched with `{b.get('cost')}`, at most "
        f"{b.get('max_streams')} streams).",
        f"Latency: {result.get('timing')} of {result.get('repeat')} runs after {result.get('warmup')} warm-up runs. "
        "Correctness: outputs compared with plain TVM's direct build on the same GPU.",
        "",
        "Produced by `scripts/gpu_check.sh` (build here, run on the GPU machine with TVM's runtime only).",
        "",
    ]
    env = result.get("environment")
    if env:
        lines += ["Environment: " + "; ".join(f"{k} {v}" for k, v in env.items()), ""]
    for m in result.get("models", []):
        lines += [f"## {m['name']} ({m['units']} units, {m['image_size']}x{m['image_size']})", "",
                  "| variant | median ms | p90 ms | vs plain TVM | streams | stages | CUDA graph | output |",
                  "|---|---:|---:|---:|---:|---:|---|---|"]
        base = next((v.get("median_ms") for v in m["variants"] if v["name"] == "plain TVM"), None)
        for v in m["variants"]:
            med = v.get("median_ms")
            speed = f"{base / med:.2f}x" if (base and med) else ""
            graph = "yes" if v.get("cuda_graph") else ("no" if "graph" not in v["name"] else
                                                      f"no: {v.get('note') or 'fallback'}")
            ok = "n/a" if v.get("ok") is None else ("ok" if v.get("ok") else f"FAIL {v.get('error', '')}")
            if "max_abs_err" in v and v.get("ok"):
                ok = f"ok ({v['max_abs_err']:.1e})"
            lines.append(f"| {v['name']} | {med:.3f} | {v.get('p90_ms', 0):.3f} | {speed} | "
                         f"{v.get('num_streams') if v.get('num_streams') is not None else ''} | "
                         f"{v.get('stages') or ''} | {graph} | {ok} |" if med is not None else
                         f"| {v['name']} | — | — | | | | {graph} | {ok} |")
        lines.append("")
        if m.get("picked"):
            lines += ["What the runtime's candidate picker ships (interleaved timing of a library's candidates: the "
                      "scheduler's variants and sequential):", "",
                      "| scheduler | picked | median ms | best sequential ms | speed-up | never slower |",
                      "|---|---|---:|---:|---:|---|"]
            for s, pk in m["picked"].items():
                lines.append(f"| {s} | {pk['choice']} | {pk['median_ms']:.3f} | {pk['best_sequential_ms']:.3f} | "
                             f"{pk['speedup']:.2f}x | {'yes' if pk['never_slower'] else 'NO'} |")
            lines.append("")
    return "\n".join(lines) + "\n"


def cmd_report(args) -> int:
    with open(args.result, encoding="utf-8") as f:
        result = json.load(f)
    docs = os.path.join(REPO, "docs")
    os.makedirs(docs, exist_ok=True)
    with open(os.path.join(docs, "gpu_check.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(docs, "gpu_check.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(result))
    print(f"wrote {docs}/gpu_check.json and {docs}/gpu_check.md")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="here: cross-compile the zoo for CUDA + manifest + runtime kit")
    b.add_argument("--dir", default=DEFAULT_DIR)
    b.add_argument("--models", default="all", help="comma-separated zoo names, or all")
    b.add_argument("--width", type=float, default=1.0)
    b.add_argument("--image-size", type=int, default=None, help="default: each model's")
    b.add_argument("--depth", type=int, default=None, help="default: each model's (paper) depth")
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--target", default="cuda -arch=sm_90")
    b.add_argument("--schedulers", default=",".join(SCHEDULERS))
    b.add_argument("--modes", default="stage,dependency", help="stage, dependency or both (comma-separated)")
    b.add_argument("--cost", default="sim:h100")
    b.add_argument("--max-streams", type=int, default=8)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--no-kit", action="store_true", help="skip the runtime kit and the wheel (local dry runs)")
    b.set_defaults(func=cmd_build)
    r = sub.add_parser("run", help="there: runtime only; check and time every variant")
    r.add_argument("--dir", default=DEFAULT_DIR)
    r.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    r.add_argument("--repeat", type=int, default=200)
    r.add_argument("--warmup", type=int, default=20)
    r.add_argument("--models", default=None)
    r.add_argument("--pick-rounds", type=int, default=30,
                   help="interleaved rounds of the candidate pick per scheduler (0: skip)")
    r.set_defaults(func=cmd_run)
    g = sub.add_parser("diagnose", help="there: run concurrent variants repeatedly, and serialized; find races")
    g.add_argument("--dir", default=DEFAULT_DIR)
    g.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"))
    g.add_argument("--runs", type=int, default=4)
    g.add_argument("--models", default=None)
    g.add_argument("--serialized", action="store_true", help=argparse.SUPPRESS)
    g.set_defaults(func=cmd_diagnose)
    q = sub.add_parser("report", help="here: docs/gpu_check.json + .md from a run's JSON")
    q.add_argument("result")
    q.set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    if getattr(args, "repeat", 100) < 100:
        p.error("--repeat must be >= 100 (median of at least 100 runs)")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
