"""Measure a profiling bundle (built by ``passes.profile_bundle``) on this machine, with TVM's runtime only.

    python -m tvm_interop.runtime.profile_bundle BUNDLE_DIR -o costs.json [--device cuda|cpu] [--method vm|threads]

Every stage of the bundle is timed in one batch and the result written as a **cost table** (JSON) that
``passes.cost.table`` (``cost="table:costs.json"``) reads:

* ``vm`` (the default on a GPU): the stage's Relax function (groups on streams, fork/join events, as the
  stage-mode lowering runs them) is timed with TVM's ``time_evaluator``, which times with CUDA events on a GPU
  (wall clock on a CPU); the streams are created once for the whole batch.
* ``threads`` (the default on a CPU): the stage's groups run on worker threads with the kernels of the bundle,
  as the CPU executor runs them (``runtime.stage_timer``), timed by the wall clock.

Inputs, weights and outputs are random tensors allocated once per tensor of the model. The statistic is the
median of ``repeat`` measurements (each the mean of ``number`` runs for ``vm``) after ``warmup`` runs. The table
records the device fingerprint, so a table measured on one device is not mistaken for another's.

Two clocks on a GPU (``vm`` method). ``latency`` is the *issue clock*: ``time_evaluator``'s calls back to back,
which is the host's pace whenever a stage's host work outlasts its kernels (as in a program run without a CUDA
graph). ``device_latency`` is the *device clock* (``runtime.device_clock``): the median of
``DEVICE_REPEAT`` runs of ``number`` calls queued while the stream is held, so they run at the device's pace (as
in a CUDA graph, where host work is gone); None where the hold could not cover even one call. ``device_clock=False``
(CLI ``--no-device-clock``) skips it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .cuda import STREAMS_FUNC, check_arch, check_cuda_device
from .errors import ExportError, InteropError
from .json_file import read_json
from .machine import cpu_identity

TABLE_FORMAT = "tvm-interop-cost-table"
TABLE_VERSION = 1
BUNDLE_FORMAT = "tvm-interop-profile-bundle"
DEVICE_REPEAT = 5   # device-clock runs per stage (each of ``number`` calls): the median is the stage's device time


def stage_key(groups, strategy: str = "concurrent") -> str:
    """Canonical text key of a stage: the order of groups does not matter, the order inside a group does. The one
    definition: bundles (``passes.profile_bundle``), tables (``passes.cost.table``) and the device side share it."""
    gs = sorted("|".join(g) for g in groups if len(g))
    return strategy + ":" + ";".join(gs)


def unit_row(row: dict) -> str | None:
    """The unit a cost-table row times alone (its concurrent one-unit stage), or None: a unit's library call
    (``library`` strategy), a chain or a concurrent stage is another row. The one definition: the table's ``units``,
    its device-clock unit times and a fleet's merge take their unit times from these rows."""
    groups = row.get("groups") or []
    if row.get("strategy", "concurrent") == "concurrent" and len(groups) == 1 and len(groups[0]) == 1:
        return groups[0][0]
    return None


def device_fingerprint(kind: str, dev=None) -> str:
    import tvm

    if kind == "cuda" and dev is not None:
        return f"cuda:{dev.device_name}:sm_{str(dev.compute_version).replace('.', '')}"
    return f"{cpu_identity()}:tvm{getattr(tvm, '__version__', '?')}"


def load_bundle(bundle_dir: str) -> dict:
    path = os.path.join(bundle_dir, "bundle.json")
    plan = read_json(path, error=ExportError)
    if plan.get("format") != BUNDLE_FORMAT:
        raise ExportError(f"{path} is not a tvm-interop profiling bundle")
    return plan


def _random_tensor(spec, dev, rng):
    import tvm

    shape = tuple(spec["shape"])
    if "float" in spec["dtype"]:
        data = rng.standard_normal(shape).astype(spec["dtype"])
    else:
        data = np.zeros(shape, spec["dtype"])
    return tvm.runtime.tensor(data, dev)


def _check_cuda_binaries(plan: dict, lib_path: str, dev) -> None:
    """A CUDA bundle must carry binaries for this GPU: the bundle records the arches its fatbins hold
    (``cuda_arches``). A bundle without them holds CUDA source, which TVM's runtime alone cannot compile."""
    arches = plan.get("cuda_arches")
    if not arches:
        raise ExportError(f"{lib_path}: the bundle holds CUDA source, not binaries (built by an older tvm-interop); "
                          "TVM's runtime cannot compile it here: rebuild it with `tvm-interop profile-bundle`")
    check_arch(list(arches), dev)


def measure_bundle(bundle_dir: str, device: str | None = None, method: str | None = None, repeat: int = 20,
                   number: int = 10, warmup: int = 3, min_repeat_ms: float = 0.0, limit: int | None = None,
                   out: str | None = None, progress=None, device_clock: bool | None = None) -> dict:
    """Time every stage of the bundle; returns (and writes to ``out``) the cost table."""
    plan = load_bundle(bundle_dir)
    return measure_plan(plan, os.path.join(bundle_dir, plan["library"]), device=device, method=method,
                        repeat=repeat, number=number, warmup=warmup, min_repeat_ms=min_repeat_ms,
                        indices=None if not limit else range(min(limit, len(plan["stages"]))), out=out,
                        progress=progress, device_clock=device_clock)


def measure_plan(plan: dict, lib_path: str, device: str | None = None, method: str | None = None,
                 repeat: int = 20, number: int = 10, warmup: int = 3, min_repeat_ms: float = 0.0,
                 indices=None, program_indices=None, out: str | None = None, progress=None,
                 device_clock: bool | None = None) -> dict:
    """Time the stages ``indices`` (default: all) of a bundle given as its plan (``bundle.json``, read) and the
    path of its library. A device server measures a share of a bundle this way (``runtime.rpc_server``); each
    table row carries its stage ``index`` so shares measured on several devices merge back in order.

    Whole programs (``plan["programs"]``, see ``passes.profile_bundle``) are timed too, each as one VM function
    with ``time_evaluator`` whatever the method (a program's latency is its stages back to back, sync included):
    ``program_indices`` (default: all when ``indices`` is None, else none) -> ``table["programs"]``.

    ``device_clock`` (default: on for the ``vm`` method on a GPU): also time every stage and program with the
    device clock (see the module docstring) -> ``device_latency`` beside ``latency``."""
    import tvm
    from tvm.runtime import vm as rvm

    kind = device or plan["device"]
    method = method or ("vm" if kind != "cpu" else "threads")
    if method not in ("vm", "threads"):
        raise InteropError(f"unknown measuring method {method!r}; use 'vm' or 'threads'")
    if method == "threads" and kind != "cpu":
        raise InteropError("the worker-thread method measures CPU kernels only; use --method vm on a GPU")
    explicit_clock = bool(device_clock)
    if device_clock is None:
        device_clock = kind == "cuda" and method == "vm"
    if device_clock and not (kind == "cuda" and method == "vm"):
        raise InteropError("the device clock times GPU streams: it needs --device cuda and the vm method "
                           f"(this is {kind!r} with {method!r})")
    dev = check_cuda_device(0) if kind == "cuda" else tvm.cpu(0)
    if kind == "cuda":
        _check_cuda_binaries(plan, lib_path, dev)
    from .model import kernel_library, load_tvm_module

    try:
        lib = load_tvm_module(lib_path)
    except Exception as e:  # noqa: BLE001
        raise ExportError(f"{lib_path}: cannot load ({str(e).splitlines()[0] if str(e) else e})") from None
    if any("params" in spec for spec in plan.get("units", {}).values()):
        from .native_libs import preload_cuda_libraries

        preload_cuda_libraries()   # cuDNN / cuBLAS units: the NVIDIA libraries from pip's nvidia/*/lib folders
    rng = np.random.default_rng(0)
    tensors = plan["tensors"]
    cache: dict[int, object] = {}

    def tensor(t: int):
        if t not in cache:
            cache[t] = _random_tensor(tensors[t], dev, rng)
        return cache[t]

    order = list(range(len(plan["stages"]))) if indices is None else [int(i) for i in indices]
    bad = [i for i in order if not 0 <= i < len(plan["stages"])]
    if bad:
        raise InteropError(f"stage indices {bad[:5]} out of range: the bundle has {len(plan['stages'])} stages")
    stages = [plan["stages"][i] for i in order]
    all_programs = plan.get("programs", [])
    p_order = ((list(range(len(all_programs))) if indices is None else []) if program_indices is None
               else [int(i) for i in program_indices])
    if any(not 0 <= i < len(all_programs) for i in p_order):
        raise InteropError(f"program indices {p_order[:5]} out of range: the bundle has {len(all_programs)}")
    t_start = time.perf_counter()
    results = []
    program_results = []
    device_results: dict[str, list] = {"stages": [], "programs": []}
    vm = streams = clock = clock_skipped = None

    def vm_time(fn_name: str, tensor_ids, kind_of: str) -> float:
        nonlocal vm, streams, clock, clock_skipped
        if vm is None:
            vm = rvm.VirtualMachine(lib, dev)
            streams = vm[plan.get("streams_function", STREAMS_FUNC)]()
            if device_clock:
                from .device_clock import DeviceClock

                try:
                    clock = DeviceClock(dev)
                except InteropError as e:
                    if explicit_clock:
                        raise
                    clock_skipped = str(e)
        args = [tensor(t) for t in tensor_ids]
        for _ in range(max(1, warmup)):
            vm[fn_name](*args, streams)
        dev.sync()
        timer = vm.time_evaluator(fn_name, dev, number=number, repeat=repeat, min_repeat_ms=int(min_repeat_ms))
        lat = float(np.median(np.asarray(timer(*args, streams).results)))
        if clock is not None:
            fn = vm[fn_name]
            runs, calls = [], number
            for _ in range(DEVICE_REPEAT):
                t = clock.time(lambda: fn(*args, streams), calls)
                if t is None:
                    break   # not even one call fits a hold: the next run would not either
                runs.append(t)
                calls = clock.last_calls   # once `number` calls outlasted a hold, one call per run from then on
            device_results[kind_of].append(float(np.median(runs)) if runs else None)
        return lat

    if method == "vm":
        for i, st in enumerate(stages):
            lat = vm_time(st["function"], st["tensors"], "stages")
            results.append(lat)
            if progress:
                progress(i + 1, len(stages), lat)
    else:
        from .stage_timer import KernelCall, StageTimer

        klib = kernel_library(lib)
        units = plan["units"]

        def call(u: str) -> KernelCall:
            spec = units[u]
            return KernelCall(spec["func"],
                              tuple((tuple(tensors[t]["shape"]), tensors[t]["dtype"]) for t in spec["args"]),
                              tuple((tuple(tensors[t]["shape"]), tensors[t]["dtype"]) for t in spec["outs"]))

        timer = StageTimer(lambda n: klib.get_function(n), dev, warmup=warmup, repeat=repeat)
        try:
            for i, st in enumerate(stages):   # a wave stage runs its fused kernel in place of its groups
                lat = timer.time_stage([[call(u) for u in g] for g in st.get("run", st["groups"])])
                results.append(lat)
                if progress:
                    progress(i + 1, len(stages), lat)
        finally:
            timer.close()
    for k in p_order:
        program_results.append(vm_time(all_programs[k]["function"], all_programs[k]["tensors"], "programs"))
    if vm is not None:
        try:
            dev.sync()
            vm["__tvm_interop_free_streams"](streams)
        except Exception:  # noqa: BLE001 - best effort
            pass
    if clock is not None:
        clock.close()
    table = {
        "format": TABLE_FORMAT, "version": TABLE_VERSION, "model": plan.get("model"),
        "graph_fingerprint": plan.get("graph_fingerprint"), "target": plan.get("target"), "device_kind": kind,
        "device": device_fingerprint(kind, dev), "tvm_version": getattr(tvm, "__version__", "?"),
        "method": "time_evaluator (CUDA events)" if (method == "vm" and kind == "cuda") else
                  ("time_evaluator (wall clock)" if method == "vm" else "worker threads (wall clock)"),
        "statistic": "median", "repeat": repeat, "number": number if method == "vm" else 1, "warmup": warmup,
        "units": {}, "stages": [], "seconds": 0.0,
        "programs": [{"index": k, "name": all_programs[k]["name"], "stages": len(all_programs[k]["stages"]),
                      "latency": lat} for k, lat in zip(p_order, program_results)],
    }
    if clock_skipped:
        table["device_clock"] = {"skipped": clock_skipped}
    if clock is not None:
        table["device_clock"] = {
            "method": f"stream held while {number} calls are queued, CUDA events around them",
            "statistic": f"median of {DEVICE_REPEAT} runs", "held": clock.held, "not_held": clock.not_held,
            "stages_without": sum(d is None for d in device_results["stages"]),
            "programs_without": sum(d is None for d in device_results["programs"])}
        for row, d in zip(table["programs"], device_results["programs"]):
            row["device_latency"] = d
    for n, (index, st, lat) in enumerate(zip(order, stages, results)):
        groups = st["groups"]
        strategy = st.get("strategy", "concurrent")
        table["stages"].append({"index": index, "key": stage_key(groups, strategy), "groups": groups, "latency": lat,
                                "sources": st.get("sources", []), "strategy": strategy})
        if clock is not None:
            table["stages"][-1]["device_latency"] = device_results["stages"][n]
        if unit_row(table["stages"][-1]) is not None:
            table["units"][groups[0][0]] = lat
    table["seconds"] = time.perf_counter() - t_start
    if out:
        from . import atomic

        atomic.write_json(out, table)
    return table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tvm_interop.runtime.profile_bundle",
                                description="Measure every stage of a tvm-interop profiling bundle (runtime only).")
    p.add_argument("bundle", help="bundle directory (bundle.so + bundle.json)")
    p.add_argument("-o", "--output", default=None, help="cost table to write (default BUNDLE/costs.json)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"], help="default: the bundle's")
    p.add_argument("--method", default=None, choices=["vm", "threads"], help="default: vm on a GPU, threads on a CPU")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--number", type=int, default=10, help="runs per measurement (vm method)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--limit", type=int, default=None, help="measure only the first N stages")
    p.add_argument("--no-device-clock", action="store_true",
                   help="on a GPU, time with the issue clock only (no held-stream device times)")
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    out = args.output or os.path.join(args.bundle, "costs.json")

    def progress(i, n, lat):
        if not args.quiet and (i == n or i % 50 == 0):
            print(f"  {i}/{n} stages measured (last {lat * 1e6:.1f} us)", file=sys.stderr, flush=True)

    try:
        table = measure_bundle(args.bundle, device=args.device, method=args.method, repeat=args.repeat,
                               number=args.number, warmup=args.warmup, limit=args.limit, out=out, progress=progress,
                               device_clock=False if args.no_device_clock else None)
    except InteropError as e:
        print(f"profile_bundle: error: {e}", file=sys.stderr)
        return 1
    print(f"measured {len(table['stages'])} stages on {table['device']} in {table['seconds']:.1f} s -> {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
