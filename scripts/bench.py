"""Side-by-side CPU benchmark: plain TVM vs tvm-interop's schedulers vs ONNX Runtime vs PyTorch eager.

One process, one machine, one seeded input per model. Every configuration is compiled first (compile /
optimisation time recorded), its output compared with plain TVM's, then all are timed with INTERLEAVED repeats:
each repeat runs every configuration once, round-robin, the starting configuration rotating from one repeat to the
next, so slow drifts of a shared machine hit every configuration alike. Each timed call follows ``--settle``
untimed calls of the same configuration (default 1), so it measures that configuration's steady state rather than
the state its neighbour in the round left (measured on SqueezeNet: our first call after PyTorch eager ran 2.5 ms
slower, its OpenMP threads still spinning; after plain TVM's long single-threaded run 0.7 ms slower). Reported: median (and min, IQR) ms, speedup
vs plain TVM and vs our sequential schedule (> 1 = faster).

Configurations
  tvm                   plain ``tvm.compile`` (``tvm_interop.api.reference_build``: relax.get_pipeline("zero"),
                        TVM's default untuned CPU kernels), run by ``relax.VirtualMachine``
  interop:<scheduler>   ``tvm_interop.compile(mod, scheduler=..., cost=...)`` (``<scheduler>+wave``: with
                        ``fusion="wave"``), run with ``cm.run(x, numpy=False)``
                        (its default executor: the Relax VM for a sequential schedule, else CPU worker
                        threads; stage mode)
  onnxruntime:seq       the model exported by ``tvm_interop.export.to_onnx``; ORT_SEQUENTIAL, intra-op threads =
                        --threads, inter-op 1
  onnxruntime:par       ORT_PARALLEL, inter-op threads = --threads, intra-op threads = 1 (inter-operator parallelism
                        only, like our executor)
  torch                 ``tvm_interop.export.to_torch`` (torch.nn.functional, eager), ``torch.inference_mode``,
                        ``torch.set_num_threads(--threads)``
  (``--single-thread`` adds onnxruntime:seq-1t and torch-1t: one thread each)

Thread pools keep their defaults (ORT workers spin while waiting for work, OpenMP as configured by the
environment): that is what a user gets. ``--spin off`` disables ORT's spinning and sets OMP_WAIT_POLICY=PASSIVE
(PyTorch's OpenMP), so that a pool spinning after one configuration cannot steal a core from the next one in the
round-robin; on a loaded machine passive waiting can however make multi-threaded runs of small operators much
slower, which is why it is not the default.

Examples
  python scripts/bench.py squeezenet --width 0.25 --image-size 64 --repeat 3          # quick check
  python scripts/bench.py inception_v3 squeezenet googlenet randwire --width 0.5 --image-size 149 --repeat 20
Writes <out>.json and <out>.md (default docs/benchmarks.json / .md) and prints the tables.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tvm_interop  # noqa: E402
from tvm_interop.runtime.errors import InteropError  # noqa: E402
from tvm_interop.cli.common import parse_tuning_databases  # noqa: E402
from tvm_interop.models import MODELS, get_model  # noqa: E402

# An output further than this from plain TVM's is flagged MISMATCH. The tests hold the exports to 1e-4 at small
# configurations; at benchmark sizes (hundreds of layers, wide reductions) the frameworks' different accumulation
# orders (oneDNN / MLAS / Winograd / FMA) reach ~1e-4 absolute on O(1) logits (measured: Inception-v3 at width 0.5,
# 149 px: ORT 6.9e-5, torch 1.0e-4), hence 1e-3.
RTOL = ATOL = 1e-3


# ----------------------------------------------------------------------------------------------- machine
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gib() -> float | None:
    try:
        import psutil

        return psutil.virtual_memory().total / 2**30
    except Exception:  # noqa: BLE001
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemTotal"):
                        return int(line.split()[1]) / 2**20
        except OSError:
            pass
    return None


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def _versions() -> dict:
    import tvm

    out = {"python": platform.python_version(), "numpy": np.__version__, "tvm": tvm.__version__,
           "tvm_interop": tvm_interop.__version__}
    for mod in ("onnxruntime", "onnx", "torch"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            out[mod] = None
    return out


def _git() -> str | None:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return (rev + ("+dirty" if dirty else "")) or None
    except Exception:  # noqa: BLE001
        return None


def machine_info(threads: int) -> dict:
    return {"cpu": _cpu_model(), "logical_cores": os.cpu_count(), "usable_cores": _usable_cores(),
            "ram_gib": round(_ram_gib() or 0, 1), "platform": platform.platform(), "threads": threads,
            "loadavg_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "env": {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "TVM_NUM_THREADS")}}


# ----------------------------------------------------------------------------------------------- configurations
class Config:
    """One thing to time: ``call()`` runs the model once (result not converted), ``output()`` numpy output(s)."""

    def __init__(self, name, kind, call, output, compile_s, details=None, close=None, prepare=None):
        self.name, self.kind, self.call, self.output = name, kind, call, output
        self.prepare = prepare  # run (untimed) before each timed call
        self.compile_s = compile_s
        self.details = details or {}
        self.close = close
        self.times: list[float] = []
        self.max_abs_diff: float | None = None
        self.match: bool | None = None


def _first(y):
    return y[0] if isinstance(y, (list, tuple)) else y


def make_plain_tvm(mod, x, target):
    import tvm
    from tvm import relax

    from tvm_interop.runtime.model import vm_to_numpy

    t = time.perf_counter()
    ex = tvm_interop.api.reference_build(mod, target)
    vm = relax.VirtualMachine(ex, tvm.cpu())
    compile_s = time.perf_counter() - t
    f = vm["main"]
    xt = tvm.runtime.tensor(x, tvm.cpu())
    return Config("tvm", "plain TVM", lambda: f(xt), lambda: vm_to_numpy(f(xt)), compile_s,
                  {"build": f"relax.get_pipeline('zero') + tvm.compile, target {target}",
                   "executor": "relax.VirtualMachine"})


WAVE = "+wave"   # scheduler suffix: the same scheduler with wave fusion (passes.wave)


def make_interop(mod, x, name, scheduler, cost, target, tuning_db=None, layout="auto", max_memory_ratio=1.5):
    import tvm

    base, wave = scheduler.removesuffix(WAVE), scheduler.endswith(WAVE)
    cm = tvm_interop.compile(mod, target=target, scheduler=base, cost=cost, name=name, tuning_db=tuning_db,
                             layout=layout, fusion="wave" if wave else None, max_memory_ratio=max_memory_ratio)
    xt = tvm.runtime.tensor(x, tvm.cpu())
    s = cm.schedule
    search = {k: v for k, v in (s.search or {}).items() if isinstance(v, (int, float, str, bool))}
    details = {"scheduler": scheduler, "shipped_scheduler": s.scheduler, "cost": cost, "units": len(cm.graph),
               "stages": s.num_stages, "max_concurrency": s.max_concurrency(), "executor": cm.runner.executor,
               "compile_timings_s": {k: round(v, 3) for k, v in cm.timings.items()}, "search": search}
    if cm.guard is not None:
        details["guard"] = {"scheduled_ms": cm.guard.scheduled_ms, "sequential_ms": cm.guard.sequential_ms,
                            "kept": cm.guard.keep_schedule}
    if tuning_db:
        details["tuning_db"] = tuning_db
    details["layout"] = cm.layout
    if cm.memory is not None:
        details["memory"] = cm.memory.to_json()
    label = f"interop:{scheduler}" + ("+tuned" if tuning_db else "") + ("" if layout == "auto" else f"[{layout}]")
    return Config(label, "tvm-interop", lambda: cm.run(xt, numpy=False), lambda: cm.run(x),
                  cm.timings.get("total", 0.0), details, close=cm.close)


def make_onnxruntime(mod, x, parallel: bool, threads: int, tag: str, spin: bool = True):
    import onnxruntime as ort

    from tvm_interop.export import to_onnx

    t = time.perf_counter()
    model = to_onnx(mod)
    export_s = time.perf_counter() - t
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if parallel:
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        so.inter_op_num_threads, so.intra_op_num_threads = threads, 1
    else:
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.inter_op_num_threads, so.intra_op_num_threads = 1, threads
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    t = time.perf_counter()
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    session_s = time.perf_counter() - t
    feed = {sess.get_inputs()[0].name: x}
    details = {"execution_mode": "ORT_PARALLEL" if parallel else "ORT_SEQUENTIAL",
               "intra_op_num_threads": so.intra_op_num_threads, "inter_op_num_threads": so.inter_op_num_threads,
               "graph_optimization_level": "ORT_ENABLE_ALL", "allow_spinning": int(spin),
               "onnx_nodes": len(model.graph.node), "export_s": round(export_s, 3), "session_s": round(session_s, 3)}
    outs = lambda: sess.run(None, feed)  # noqa: E731
    return Config(f"onnxruntime:{tag}", "ONNX Runtime", outs, lambda: [np.asarray(o) for o in outs()],
                  export_s + session_s, details)


def make_torch(mod, x, threads: int, tag: str):
    import torch

    from tvm_interop.export import to_torch

    t = time.perf_counter()
    net = to_torch(mod)
    compile_s = time.perf_counter() - t
    xt = torch.from_numpy(x.copy())

    def call():
        with torch.inference_mode():
            return net(xt)

    def prepare():
        # torch's thread count is global: when another torch configuration changed it, switch back and run once
        # untimed (the first parallel region after a change rebuilds the OpenMP pool)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
            call()

    def output():
        prepare()
        y = call()
        return [t.numpy() for t in y] if isinstance(y, (tuple, list)) else y.numpy()

    try:
        backend = [ln.strip() for ln in torch.__config__.parallel_info().splitlines()
                   if "backend" in ln or ln.strip().startswith("OpenMP") or ln.strip().startswith("MKL")]
    except Exception:  # noqa: BLE001
        backend = None
    details = {"num_threads": threads, "mode": "torch.inference_mode, torch.fx GraphModule of F.* calls",
               "parallel_info": backend}
    return Config(tag, "PyTorch eager", call, output, compile_s, details, prepare=prepare)


def _importable(name: str) -> bool:
    try:
        __import__(name)
        return True
    except Exception:  # noqa: BLE001
        return False


# ----------------------------------------------------------------------------------------------- one model
def bench_model(name: str, args, schedulers: list[str], log) -> dict:
    spec = MODELS[name]
    size = args.image_size if args.image_size is not None else spec.default_image_size
    size = max(size, spec.min_image_size)
    kw = {"width": args.width, "image_size": size}
    depth = args.depth.get(name, args.depth.get("*"))
    if spec.depth_param is not None and depth is not None:
        kw["depth"] = max(depth, spec.min_depth)
    mod = get_model(name, **kw)
    x = np.random.default_rng(args.seed).standard_normal((1, 3, size, size)).astype("float32")
    log(f"[bench] {name} {kw}: building configurations")
    configs: list[Config] = []
    failed: dict = {}

    def add(label, fn, *a):
        t = time.perf_counter()
        try:
            c = fn(*a)
        except Exception as e:  # noqa: BLE001
            failed[label] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
            log(f"[bench]   {label:22s} FAILED to build: {failed[label]}")
            if args.verbose:
                traceback.print_exc()
            return
        configs.append(c)
        log(f"[bench]   {c.name:22s} compiled in {c.compile_s:7.2f} s (wall {time.perf_counter() - t:.2f} s)")

    add("tvm", make_plain_tvm, mod, x, args.target)
    if not configs:
        raise RuntimeError(f"plain TVM build of {name} failed: {failed}")
    for s in schedulers:
        for lay in args.layouts:
            tag = f"interop:{s}" + ("" if lay == "auto" else f"[{lay}]")
            add(tag, make_interop, mod, x, name, s, args.cost, args.target, None, lay, args.max_memory_ratio)
    if name in args.tuned:  # the same program with MetaSchedule-tuned kernels (tvm-interop tune ... --db DIR)
        add("interop:sequential+tuned", make_interop, mod, x, name, "sequential", args.cost, args.target,
            args.tuned[name])
    if not args.no_onnx:
        if _importable("onnxruntime") and _importable("onnx"):
            spin = args.spin == "on"
            add("onnxruntime:seq", make_onnxruntime, mod, x, False, args.threads, "seq", spin)
            add("onnxruntime:par", make_onnxruntime, mod, x, True, args.threads, "par", spin)
            if args.single_thread:
                add("onnxruntime:seq-1t", make_onnxruntime, mod, x, False, 1, "seq-1t", spin)
        else:
            failed["onnxruntime"] = "not importable (pip install onnxruntime onnx)"
    if not args.no_torch:
        if _importable("torch"):
            add("torch", make_torch, mod, x, args.threads, "torch")
            if args.single_thread:
                add("torch-1t", make_torch, mod, x, 1, "torch-1t")
        else:
            failed["torch"] = "not importable"

    # outputs vs plain TVM
    ref = configs[0].output()
    ref_l = ref if isinstance(ref, list) else [ref]
    for c in configs:
        try:
            out = c.output()
            out_l = out if isinstance(out, list) else [out]
            c.max_abs_diff = float(max(np.max(np.abs(np.asarray(o, dtype=np.float64) - r)) for o, r in
                                       zip(out_l, ref_l)))
            c.match = len(out_l) == len(ref_l) and all(
                np.shape(o) == np.shape(r) and np.allclose(o, r, rtol=RTOL, atol=ATOL) for o, r in zip(out_l, ref_l))
        except Exception as e:  # noqa: BLE001
            c.match, c.details["output_error"] = False, f"{type(e).__name__}: {e}"

    # interleaved timing
    for _ in range(args.warmup):
        for c in configs:
            if c.prepare is not None:
                c.prepare()
            c.call()
    n = len(configs)
    t_start = time.perf_counter()
    for r in range(args.repeat):
        for j in range(n):
            c = configs[(r + j) % n]
            if c.prepare is not None:
                c.prepare()
            if c.name != "tvm":   # (plain TVM is 50-100x slower: what ran before it does not show)
                for _ in range(args.settle):
                    c.call()
            t = time.perf_counter()
            c.call()
            c.times.append(time.perf_counter() - t)
    bench_s = time.perf_counter() - t_start
    for c in configs:
        if c.close is not None:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass

    med = {c.name: float(np.median(c.times)) for c in configs}
    base = med["tvm"]
    seq = med.get("interop:sequential")
    rows = []
    for c in configs:
        ts = np.array(c.times) * 1e3
        rows.append({
            "config": c.name, "kind": c.kind, "median_ms": float(np.median(ts)), "min_ms": float(ts.min()),
            "iqr_ms": float(np.percentile(ts, 75) - np.percentile(ts, 25)), "times_ms": [round(t, 4) for t in ts],
            "speedup_vs_plain_tvm": base / med[c.name],
            "speedup_vs_our_sequential": (seq / med[c.name]) if seq else None,
            "compile_s": round(c.compile_s, 3), "max_abs_diff_vs_plain_tvm": c.max_abs_diff, "match": c.match,
            "details": c.details,
        })
    return {"model": name, "config": kw, "input_shape": list(x.shape), "seed": args.seed, "repeat": args.repeat,
            "warmup": args.warmup, "timing_wall_s": round(bench_s, 2), "rows": rows, "failed": failed}


# ----------------------------------------------------------------------------------------------- reporting
def _fmt_x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def table(res: dict) -> list[str]:
    lines = [f"### {res['model']}  ({', '.join(f'{k}={v}' for k, v in res['config'].items())}, input "
             f"{'x'.join(map(str, res['input_shape']))}, {res['repeat']} interleaved repeats)", "",
             "| config | median ms | min ms | IQR ms | vs plain TVM | vs our sequential | compile s | max abs diff | "
             "output |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        d = r["details"]
        note = ""
        if r["kind"] == "tvm-interop":
            note = f" ({d['stages']} stages, <= {d['max_concurrency']} concurrent"
            if d.get("shipped_scheduler") != d.get("scheduler"):
                note += f", shipped {d.get('shipped_scheduler')}"
            note += ")"
        diff = "-" if r["max_abs_diff_vs_plain_tvm"] is None else f"{r['max_abs_diff_vs_plain_tvm']:.1e}"
        ok = "ok" if r["match"] else "**MISMATCH**"
        lines.append(f"| {r['config']}{note} | {r['median_ms']:.2f} | {r['min_ms']:.2f} | {r['iqr_ms']:.2f} | "
                     f"{_fmt_x(r['speedup_vs_plain_tvm'])} | {_fmt_x(r['speedup_vs_our_sequential'])} | "
                     f"{r['compile_s']:.2f} | {diff} | {ok} |")
    for k, v in res["failed"].items():
        lines.append(f"| {k} | failed: {v} | | | | | | | |")
    return lines


def markdown(report: dict) -> str:
    m, v = report["machine"], report["versions"]
    out = ["# Benchmarks: plain TVM vs tvm-interop vs ONNX Runtime vs PyTorch (CPU)", "",
           f"Generated {report['date']} by `scripts/bench.py` (git {report['git'] or '?'}).", "",
           "Reproduce:", "", "```bash", report["command"], "```", "",
           f"Machine: {m['cpu']}, {m['logical_cores']} logical cores ({m['usable_cores']} usable), "
           f"{m['ram_gib']} GiB RAM, {m['platform']}; load average at start {m['loadavg_start']}, "
           f"at end {m.get('loadavg_end')}.", "",
           "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val), "",
           f"Target (plain TVM and tvm-interop): `{report['args']['target']}`; scheduler cost model: "
           f"`{report['args']['cost']}`. "
           f"Method: one process; per model one seeded input; every configuration compiled, its output compared to "
           f"plain TVM's (max abs diff; MISMATCH beyond rtol = atol = {RTOL:g}); {report['args']['warmup']} warm-up "
           f"rounds, then {report['args']['repeat']} interleaved repeats (round-robin over the configurations, the "
           f"first one rotating each repeat; before each timed call {report['args'].get('settle', 0)} untimed "
           "call(s) of the same configuration, except plain TVM); median / min / interquartile range of the per-call wall time. "
           "\"vs\" columns are speedups (> 1 = faster than the reference), computed on medians. compile s: plain "
           "TVM: reference build; tvm-interop: `tvm_interop.compile` total (prepare + schedule + build [+ guard]); "
           "ONNX Runtime: export + session creation (graph optimisation); torch: export to a torch.fx module.", "",
           f"Threads: ONNX Runtime sequential: intra-op {report['args']['threads']}, inter-op 1; parallel: inter-op "
           f"{report['args']['threads']}, intra-op 1; spinning {report['args']['spin']}. "
           f"PyTorch: torch.set_num_threads("
           f"{report['args']['threads']}), OMP_WAIT_POLICY={m['env'].get('OMP_WAIT_POLICY')}. tvm-interop: its "
           "default executor (a schedule without concurrent groups on the Relax VM, others on the CPU worker-thread "
           "executor, workers = the schedule's max concurrency <= usable cores). Plain TVM: TVM's "
           "default untuned CPU kernels (naive loop nests), relax.VirtualMachine. tvm-interop's kernels come "
           "from its own default CPU schedule (passes/kernels/cpu_schedule.py), so \"vs plain TVM\" mixes kernel "
           "quality and scheduling; \"vs our sequential\" isolates the inter-operator schedule.", ""]
    for res in report["results"]:
        out += table(res) + [""]
        comp = [r for r in res["rows"] if r["kind"] == "tvm-interop"]
        if comp:
            out.append("Compile / optimisation time of the tvm-interop configurations (s):")
            out.append("")
            keys = sorted({k for r in comp for k in r["details"]["compile_timings_s"]})
            out.append("| config | " + " | ".join(keys) + " |")
            out.append("|---|" + "---:|" * len(keys))
            for r in comp:
                t = r["details"]["compile_timings_s"]
                out.append(f"| {r['config']} | " + " | ".join(f"{t[k]:.2f}" if k in t else "-" for k in keys) + " |")
            out.append("")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------- main
def _depths(text: str) -> dict:
    out = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, val = part.rpartition("=")
        if name and name not in MODELS:
            raise argparse.ArgumentTypeError(f"unknown model {name!r} in --depth")
        try:
            out[name or "*"] = int(val)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad --depth entry {part!r} (N or MODEL=N)") from None
    return out


def main(argv=None) -> int:
    from tvm_interop.passes.schedulers import available_schedulers

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", metavar="MODEL", help=f"zoo models: {', '.join(sorted(MODELS))}")
    ap.add_argument("--width", type=float, default=1.0, help="channel multiplier (default 1.0)")
    ap.add_argument("--image-size", type=int, default=None,
                    help="input H = W (default: each model's; raised to a model's minimum where smaller)")
    ap.add_argument("--depth", type=_depths, default={}, metavar="N|MODEL=N,...",
                    help="repeat count (see tvm-interop models): N for every model that has one, or per model, "
                         "e.g. randwire=8 (default: the paper's)")
    ap.add_argument("--repeat", type=int, default=20, help="interleaved timed repeats (default 20)")
    ap.add_argument("--settle", type=int, default=1,
                    help="untimed calls of a configuration right before each of its timed calls (default 1): the "
                         "timed call then sees that configuration's steady state (its threads awake, its weights "
                         "in cache), not what the configuration before it left behind (an OpenMP pool still "
                         "spinning, a cold cache after plain TVM's long single-threaded run); 0: the first call "
                         "after the neighbour is timed")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    ap.add_argument("--schedulers", default="sequential,greedy,lios,ios",
                    help="tvm-interop schedulers, comma-separated (default sequential,greedy,lios,ios); a "
                         "'+wave' suffix (lios+wave) adds wave fusion (fusion='wave')")
    ap.add_argument("--max-memory-ratio", type=lambda v: None if v == "none" else float(v), default=1.5,
                    help="tvm_interop.compile's bound on activation memory vs sequential (default 1.5; 'none': no "
                         "bound, the schedule as found)")
    ap.add_argument("--cost", default="sim:cpu", help="cost model for the schedulers: sim:cpu (default) or measured")
    ap.add_argument("--target", default="llvm",
                    help="TVM target for plain TVM and tvm-interop (default llvm = generic x86-64; 'native' = llvm "
                         "-mcpu=<this CPU>)")
    ap.add_argument("--threads", type=int, default=_usable_cores(),
                    help="threads for ONNX Runtime / PyTorch (default: usable cores)")
    ap.add_argument("--single-thread", action="store_true", help="also time ONNX Runtime and PyTorch on 1 thread")
    ap.add_argument("--spin", choices=["on", "off"], default="on",
                    help="on (default): thread pools as configured by default; off: ONNX Runtime spinning off and "
                         "OMP_WAIT_POLICY=PASSIVE")
    ap.add_argument("--no-onnx", action="store_true", help="skip ONNX Runtime")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    ap.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    ap.add_argument("--tuned", action="append", default=[], metavar="MODEL=DIR",
                    help="add interop:sequential+tuned for MODEL with the kernels of tuning database DIR (tune it "
                         "at the same --width/--image-size: tvm-interop tune MODEL ... --db DIR); repeatable")
    ap.add_argument("--layouts", default="auto", type=lambda t: [v.strip() for v in t.split(",") if v.strip()],
                    help="CPU activation layouts of our programs, each its own row: auto (default: NCHW[c]c), "
                         "nchw, nchwc, nchw<N>c; e.g. auto,nchw compares the blocked layout with TVM's")
    ap.add_argument("--out", default="docs/benchmarks", help="output prefix: writes OUT.json and OUT.md")
    ap.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failed configurations")
    args = ap.parse_args(argv)

    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {', '.join(sorted(MODELS))}")
    schedulers = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    bad = [s for s in schedulers if s.removesuffix(WAVE) not in available_schedulers()]
    if bad:
        ap.error(f"unknown scheduler(s) {bad}; available: {', '.join(available_schedulers())}")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    try:
        args.tuned = parse_tuning_databases(args.tuned)
    except InteropError as e:
        ap.error(str(e))
    if args.target == "native":
        import tvm

        args.target = f"llvm -mcpu={tvm.target.codegen.llvm_get_system_cpu()}"
    if args.spin == "off":
        if "torch" in sys.modules:  # pragma: no cover - OpenMP reads it when the library loads
            print("[bench] warning: torch already imported; OMP_WAIT_POLICY has no effect", file=sys.stderr)
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"

    def log(msg):
        print(msg, flush=True)

    t0 = time.perf_counter()
    root = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    py = os.path.relpath(sys.executable, root) if sys.executable.startswith(root + os.sep) else "python"
    report = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
              "command": f"{py} scripts/bench.py " + shlex.join(sys.argv[1:] if argv is None else argv),
              "git": _git(), "machine": machine_info(args.threads), "versions": _versions(),
              "args": dict(vars(args)), "results": []}
    for name in args.models:
        res = bench_model(name, args, schedulers, log)
        report["results"].append(res)
        print()
        print("\n".join(table(res)))
        print(flush=True)
    report["machine"]["loadavg_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    report["total_s"] = round(time.perf_counter() - t0, 1)
    out_dir = os.path.dirname(args.out)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(report))
    mism = [(r["model"], row["config"]) for r in report["results"] for row in r["rows"] if not row["match"]]
    log(f"[bench] wrote {args.out}.json and {args.out}.md in {report['total_s']} s"
        + (f"; MISMATCH: {mism}" if mism else "; every output matches plain TVM"))
    return 1 if mism else 0


if __name__ == "__main__":
    sys.exit(main())
