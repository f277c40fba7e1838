"""Host cost per op of a stream program, measured on the device (``gpu_check build`` builds it, ``run`` times it).

Why: the whole-program model (``passes.cost.program``) charges the host a fixed time per kernel launch, per
``Device_StreamSyncFromTo``, per ``Device_SetStream`` and per keep-alive call, and fits them from whole programs.
Fitted, NASNet-A-mobile's direct programs want cheaper launches than RandWire's and its TVM syncs dearer (3.7 vs
2.3 us), which no feature of the programs explains. Measured alone, each op's cost needs no fit.

Each probe is one VM function issuing ``OPS`` ops of one kind (and nothing else), called after a device sync. Two
times per call: until the call returns (the host's issue time: the VM issues asynchronous work and returns) and
until the device is synchronised after it (what gpu_check times for a variant). Per op: the difference to the
probe's baseline (the empty function; for the busy-source syncs, the long kernels alone), divided by ``OPS``, medians
over the calls. The kinds:

* ``kernel_<a>``: a chain of tiny kernels with ``a`` tensor arguments each (a - 1 inputs, 1 output; 32 floats);
  on a GPU one launch costs max(host, device) time, and a tiny kernel's device time is below the host's;
* ``tvm_sync_idle`` / ``tvm_sync_busy``: TVM's ``Device_StreamSyncFromTo`` between two of our streams, the source
  idle, or busy with ``BUSY`` long kernels issued first (``busy_only``: those kernels alone, its baseline);
* ``event_sync_idle`` (CUDA): the reused events of the native extension (``sync="events"``), source idle;
* ``set_stream``: ``Device_SetStream``, alternating two streams (the caller's stream restored at the end);
* ``keepalive_16``: ``ffi.Array`` on 16 tensors, the keep-alive call of the lowering.

On a CPU the stream calls are no-ops and there is no event pool (a dry run checks the plumbing).
"""
from __future__ import annotations

import time

OPS = 200          # ops per probe function
BUSY = 20          # long kernels issued before the busy-source syncs
BIG = 1 << 22      # elements of the long kernels' tensor (16 MiB: tens of us per pass on an H100; 4096 on a CPU)
ARGS = (2, 4, 8)   # tensor arguments of the tiny kernels
LIBRARY = "libs/probe.so"


def probe_module(gpu: bool):
    """The probe functions as one Relax module (``probe_<kind>(x0..x7, big, streams)``) and their names."""
    import tvm
    from tvm import relax, te

    from tvm_interop.passes.lower_streams import (CREATE, EVENT_SYNC, EVENTS_CREATE, EVENTS_FREE, FREE, SET, SYNC,
                                                  _i64, _str)
    from tvm_interop.runtime.cuda import KEEPALIVE_FUNC

    dev = _str("cuda:0" if gpu else "cpu:0")
    n_big = big_elements(gpu)
    i64 = tvm.ir.PrimType("int64")
    n_handles = 3 if gpu else 2          # two streams (and, on a GPU, an event pool)
    bb = relax.BlockBuilder()

    def packed(name, *args, ty=None):
        return relax.Call(relax.ExternFunc(name), list(args), ty_args=[ty or relax.ObjectType()])

    const = _i64

    def tiny(*xs):
        return te.compute(xs[0].shape, lambda i: sum(x[i] for x in xs[1:]) + xs[0][i], name="tiny")

    def long_pass(b):
        return te.compute(b.shape, lambda i: b[i] * tvm.tirx.const(1.0001, "float32") + b[(i + 1) % n_big],
                          name="long")

    names = []

    def function(kind: str, body):
        xs = [relax.Var(f"x{k}", relax.TensorType([32], "float32")) for k in range(8)]
        big = relax.Var("big", relax.TensorType([n_big], "float32"))
        streams = relax.Var("streams", relax.TupleType([i64] * n_handles))
        with bb.function(f"probe_{kind}", xs + [big, streams], pure=False):
            s = [bb.emit(relax.TupleGetItem(streams, k), name_hint=f"s{k}") for k in range(n_handles)]
            out = body(xs, big, s)
            bb.emit_func_output(out if out is not None else xs[0])
        names.append(f"probe_{kind}")

    function("empty", lambda xs, big, s: None)
    for a in ARGS:
        def chain(xs, big, s, a=a):
            y = xs[0]
            for _ in range(OPS):
                y = bb.emit_te(tiny, y, *xs[1:a - 1], primfunc_name_hint=f"tiny{a}")
            return y
        function(f"kernel_{a}", chain)

    def syncs(xs, big, s, busy=False):
        if busy:
            busy_only(xs, big, s)
        for _ in range(OPS):
            bb.emit(packed(SYNC, dev, s[0], s[1]))
        return None

    def busy_only(xs, big, s):
        bb.emit(packed(SET, dev, s[0]))
        b = big
        for _ in range(BUSY):
            b = bb.emit_te(long_pass, b, primfunc_name_hint="long_pass")
        bb.emit(packed(SET, dev, const(0)))
        return None

    function("busy_only", busy_only)
    function("tvm_sync_idle", syncs)
    function("tvm_sync_busy", lambda xs, big, s: syncs(xs, big, s, busy=True))
    if gpu:
        def events(xs, big, s):
            for _ in range(OPS):
                bb.emit(packed(EVENT_SYNC, s[2], const(0), s[0], s[1]))
            return None
        function("event_sync_idle", events)

    def sets(xs, big, s):
        for k in range(OPS):
            bb.emit(packed(SET, dev, s[k % 2]))
        bb.emit(packed(SET, dev, const(0)))
        return None

    function("set_stream", sets)

    def keepalive(xs, big, s):
        for _ in range(OPS):
            bb.emit(relax.Call(relax.ExternFunc(KEEPALIVE_FUNC), xs + xs, ty_args=[relax.ObjectType()]))
        return None

    function("keepalive_16", keepalive)
    # the handles: two streams and a pool of reused events (GPU); null handles on a CPU, as the lowering passes
    with bb.function("probe_streams", [], pure=False):
        if gpu:
            hs = [bb.emit(packed(CREATE, dev, ty=i64)) for _ in range(2)]
            hs.append(bb.emit(packed(EVENTS_CREATE, const(0), const(2), ty=i64)))
        else:
            hs = [const(0), const(0)]
        bb.emit_func_output(bb.emit(relax.Tuple(hs)))
    streams = relax.Var("streams", relax.TupleType([i64] * n_handles))
    with bb.function("probe_free_streams", [streams], pure=False):
        if gpu:
            for k in range(2):
                bb.emit(packed(FREE, dev, bb.emit(relax.TupleGetItem(streams, k))))
            bb.emit(packed(EVENTS_FREE, bb.emit(relax.TupleGetItem(streams, 2))))
        bb.emit_func_output(relax.Tuple([]))
    return bb.get(), names


def big_elements(gpu: bool) -> int:
    """On a CPU the long kernels run synchronously inside the call: kept small, they add no noise there."""
    return BIG if gpu else 4096


def build_probe(ctx, log) -> dict:
    """Build the probe library into ``ctx.out``; its manifest entry."""
    import os

    from .build import _build, _export_xz

    mod, names = probe_module(ctx.gpu)
    ex, _ = _build(ctx, mod, [], strict=False)
    addons = []
    if ctx.gpu:   # the event pool's functions: the native extension linked in
        from tvm_interop.passes.offload import ensure_extension

        addons = [ensure_extension()["object"]]
    formats = _export_xz(ex, os.path.join(ctx.out, LIBRARY), ctx.arches, addons)
    log(f"  probe: {len(names)} functions of {OPS} ops each -> {LIBRARY}")
    return {"library": LIBRARY, "functions": names, "ops": OPS, "busy_kernels": BUSY, "big": big_elements(ctx.gpu),
            "device": "cuda" if ctx.gpu else "cpu",
            "kernel_formats": formats}


def run_probe(d: str, spec: dict, dev, sync, repeat: int = 50, warmup: int = 5) -> dict:
    """Time every probe function: per op, the host's issue time and the time to a synchronised device, in us."""
    import numpy as np
    import tvm
    from tvm.runtime import vm as rvm

    from tvm_interop.runtime.model import load_tvm_module

    from .device import library_path

    vm = rvm.VirtualMachine(load_tvm_module(library_path(d, spec["library"])), dev)
    handles = vm["probe_streams"]()
    stream_sync = tvm.get_global_func("runtime.Device_StreamSync")

    def sync_all() -> None:
        """The caller's stream and both of ours: the busy-source probes leave work on a stream that is never
        joined into the caller's, and a sync of the caller's stream alone would let it pile up across calls."""
        sync()
        if spec.get("device", "cuda") == "cuda":
            for k in range(2):
                stream_sync(dev, handles[k])

    xs = [tvm.runtime.tensor(np.ones(32, "float32"), dev) for _ in range(8)]
    big = tvm.runtime.tensor(np.ones(spec.get("big", BIG), "float32"), dev)
    host, total = {}, {}
    try:
        for name in spec["functions"]:
            fn = vm[name]
            for _ in range(warmup):
                fn(*xs, big, handles)
            sync_all()
            th, tt = [], []
            for _ in range(repeat):
                sync_all()
                t0 = time.perf_counter()
                fn(*xs, big, handles)
                t1 = time.perf_counter()
                sync_all()
                t2 = time.perf_counter()
                th.append(t1 - t0)
                tt.append(t2 - t0)
            host[name], total[name] = float(np.median(th)), float(np.median(tt))
    finally:
        sync_all()
        vm["probe_free_streams"](handles)
    n = spec["ops"]
    out = {}
    for name in spec["functions"]:
        kind = name.removeprefix("probe_")
        if kind in ("empty", "busy_only"):
            continue
        base = "probe_busy_only" if kind == "tvm_sync_busy" else "probe_empty"
        out[kind] = {"host_us": (host[name] - host[base]) / n * 1e6, "total_us": (total[name] - total[base]) / n * 1e6}
    return {"ops": n, "repeat": repeat, "empty_call_us": host["probe_empty"] * 1e6, "per_op": out}


def render_probe(probe: dict | None) -> list[str]:
    if not probe or not probe.get("per_op"):
        return []
    rows = [f"| {k} | {v['host_us']:.2f} | {v['total_us']:.2f} |" for k, v in probe["per_op"].items()]
    return ["## Host cost per op (probe)", "",
            f"{probe['ops']} ops of one kind per VM call, medians of {probe['repeat']} calls, minus the baseline "
            f"(the empty call: {probe['empty_call_us']:.1f} us to return; the busy-source syncs: the long kernels "
            "alone). *issue*: until the call returns (host work); *synchronised*: until the device is done too.", "",
            "| op | issue us per op | synchronised us per op |", "|---|---:|---:|", *rows, ""]
