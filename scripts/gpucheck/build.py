"""The GPU check's ``build`` step (here, with TVM's compiler and nvcc; no GPU): the zoo's plain and scheduled
CUDA libraries (fatbins, weights as parameters, xz-compressed), the manifest, the runtime kit and the graph JSON
of each model for the PyTorch baseline."""
from __future__ import annotations

import json
import os
import platform
import sys
import tarfile
import time

from runtime import atomic

from .common import CARRY_LIMIT, FUNC

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
    with atomic.atomic_path(path + ".xz") as tmp, open(path, "rb") as f, lzma.open(tmp, "wb", preset=6) as g:
        g.write(f.read())
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
