"""The GPU check's ``run`` step (there: TVM's runtime only): every variant checked against plain TVM and timed,
what the candidate picker ships per scheduler, PyTorch eager on the same network, the environment."""
from __future__ import annotations

import json
import os
import platform
import sys
import time

from .report import render_markdown

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
        from runtime import atomic

        with atomic.atomic_path(target) as tmp, lzma.open(path + ".xz", "rb") as f, open(tmp, "wb") as g:
            g.write(f.read())
    return target


class Variants:
    """The libraries of one model loaded on ``dev`` (one VM each) and each variant's streams, created once:
    ``call(var)`` runs a manifest variant on the model's inputs and weights; ``close`` frees the streams."""

    def __init__(self, d: str, entry: dict, seed: int, dev):
        import numpy as np
        import tvm

        rng = np.random.default_rng(seed)
        self.inputs = [tvm.runtime.tensor(rng.standard_normal(tuple(s["shape"])).astype(s["dtype"]), dev)
                       for s in entry["inputs"]]
        self.weights = _weights(entry, seed + 1, lambda a: tvm.runtime.tensor(a, dev))
        self.dir, self.dev = d, dev
        self.vms: dict = {}
        self.streams: dict = {}

    def call(self, var: dict):
        """A callable running ``var`` once (returns its raw output)."""
        import tvm
        from tvm.runtime import vm as rvm

        lib = var["library"]
        if lib not in self.vms:
            self.vms[lib] = rvm.VirtualMachine(tvm.runtime.load_module(_library(self.dir, lib)), self.dev)
        vm = self.vms[lib]
        extra = []
        if var.get("streams"):
            key = (lib, var["streams"])
            if key not in self.streams:
                self.streams[key] = vm[var["streams"]]()
            extra = [self.streams[key]]
        fn = vm[var["function"]]
        return lambda: fn(*self.inputs, *self.weights, *extra)

    def close(self) -> None:
        for (lib, name), hs in self.streams.items():
            try:
                self.dev.sync()
                self.vms[lib][name.replace("__tvm_interop_streams", "__tvm_interop_free_streams")](hs)
            except Exception:  # noqa: BLE001 - freeing is best effort
                pass
        self.streams = {}


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
        variants = Variants(args.dir, entry, manifest["seed"], dev)
        model = {"name": entry["name"], "units": entry["units"], "image_size": entry["image_size"], "variants": []}
        ref = None
        calls: dict = {}
        for var in entry["variants"]:
            rec = {k: var.get(k) for k in ("name", "cuda_graph", "num_streams", "stages", "max_concurrency", "mode",
                                          "predicted_ms", "note")}
            try:
                run_once = variants.call(var)
                out = _to_numpy(run_once())
                if ref is None:
                    ref = out  # the first variant is plain TVM's direct build: the reference
                err = _max_err(out, ref)
                scale = max(1e-6, float(np.max(np.abs(np.asarray(ref if not isinstance(ref, list) else ref[0])))))
                rec["max_abs_err"] = err
                rec["ok"] = bool(err <= 1e-4 * scale + 1e-5)
                rec.update(_bench(run_once, dev.sync, args.warmup, args.repeat))
                if rec["ok"]:
                    calls[var["name"]] = run_once
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
        variants.close()
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
