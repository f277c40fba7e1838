"""A device server for a fleet: TVM's RPC server plus the measuring functions tvm-interop calls remotely.

    python -m tvm_interop.runtime.rpc_server --tracker HOST:9190 --key h100 [--host 0.0.0.0] [--port 9090]

Runs on the device machine with TVM's runtime only (``TVM_USE_RUNTIME_LIB=1`` is enough: no compiler, no nvcc).
It registers with the tracker under ``--key``; a client (``tvm-interop tune|profile-measure|schedule|compile
--rpc HOST:PORT --device-key KEY``, see ``passes.fleet``) is handed a free server by the tracker, uploads what it
built, and calls the functions below. Every session is served in a fresh forked process of this server (TVM's
RPC server does that), which inherits the functions registered here; a session that crashes takes only itself
down and the server goes back to the tracker.

Remote functions (all arguments and results are JSON text or numbers, so any client can call them):

``tvm_interop.rpc.describe()``
    what this device is: ``fingerprint`` (what measurements are keyed by: ``cuda:<name>:sm_<cc>`` or
    ``cpu:<model>:<usable cores>cores:tvm<version>``), device kind and name, host, TVM version, whether TVM's
    compiler library is loaded (it never is with ``TVM_USE_RUNTIME_LIB=1``).
``tvm_interop.rpc.measure_bundle(plan_file, lib_file, options)``
    a share of a profiling bundle (``runtime.profile_bundle.measure_plan``), as a cost-table JSON.
``tvm_interop.rpc.time_kernel(lib_file, args_info, options)``
    one MetaSchedule candidate: its entry function timed with ``time_evaluator`` on random arguments, as
    MetaSchedule's runners time it (seconds per repeat, JSON list).
``tvm_interop.rpc.time_stage(lib_files, groups, options)``
    one stage of kernel calls on worker threads (``runtime.stage_timer``): the measured cost model's unit of work.
``tvm_interop.rpc.time_plans(runs, options)``
    whole execution plans against each other (``runtime.plan_timer``): the never-slower guard.

File names are relative to the session's work directory, where ``RPCSession.upload`` puts files.

Uses one private function of TVM's RPC server (``tvm.rpc.server._listen_loop``, TVM 0.27): the public ``Server``
starts its loop in a separate interpreter, which would not see the functions registered here.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys

FUNC_PREFIX = "tvm_interop.rpc."
PROTOCOL_VERSION = 1


# ------------------------------------------------------------------------------------------------ identity
def _compiler_loaded() -> bool:
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            return "libtvm_compiler" in f.read()
    except OSError:  # pragma: no cover - non-Linux
        return False


def describe(device_kind: str = "cpu") -> dict:
    """What this server measures on. The fingerprint is the one cost tables and caches are keyed by."""
    import tvm

    from .machine import cpu_identity
    from .profile_bundle import device_fingerprint

    dev = None
    name = cpu_identity().split(":")[1]
    if device_kind == "cuda":
        from .cuda import check_cuda_device

        dev = check_cuda_device(0)
        name = dev.device_name
    return {"fingerprint": device_fingerprint(device_kind, dev), "device_kind": device_kind, "device_name": name,
            "host": socket.gethostname(), "tvm_version": getattr(tvm, "__version__", "?"),
            "compiler_loaded": _compiler_loaded(), "protocol": PROTOCOL_VERSION,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}


# ------------------------------------------------------------------------------------------------ session state
class _Session:
    """State of one served session (one forked process): loaded libraries and a stage timer, kept between calls
    so a client that times many stages of one model uploads and loads its kernels once."""

    def __init__(self, device_kind: str):
        self.device_kind = device_kind
        self.libs: dict[str, object] = {}
        self.timer = None

    def path(self, name: str) -> str:
        """A file the client uploaded: names are relative to the session's work directory."""
        import tvm_ffi

        if os.path.isabs(name) or ".." in name.split("/"):
            raise ValueError(f"remote file names are relative to the session directory, got {name!r}")
        workpath = tvm_ffi.get_global_func("tvm.rpc.server.workpath", allow_missing=True)
        path = workpath(name) if workpath is not None else name
        if not os.path.exists(path):
            raise FileNotFoundError(f"{name}: not uploaded to this session")
        return path

    def library(self, name: str):
        import tvm

        if name not in self.libs:
            self.libs[name] = tvm.runtime.load_module(self.path(name))
        return self.libs[name]

    def device(self):
        import tvm

        return tvm.cuda(0) if self.device_kind == "cuda" else tvm.cpu(0)


def register_functions(device_kind: str) -> None:
    """Register the remote functions (in this process; forked sessions inherit them)."""
    import tvm_ffi

    state: dict = {}

    def session() -> _Session:
        # one per served process: a forked session starts with an empty dict (registered before the fork)
        if state.get("pid") != os.getpid():
            state.update(pid=os.getpid(), session=_Session(device_kind))
        return state["session"]

    def reg(name):
        return tvm_ffi.register_global_func(FUNC_PREFIX + name, override=True)

    @reg("describe")
    def _describe() -> str:
        return json.dumps(describe(device_kind))

    @reg("measure_bundle")
    def _measure_bundle(plan_file: str, lib_file: str, options: str) -> str:
        from .profile_bundle import measure_plan

        s = session()
        opts = json.loads(options)
        with open(s.path(plan_file), encoding="utf-8") as f:
            plan = json.load(f)
        table = measure_plan(plan, s.path(lib_file), device=opts.get("device", device_kind),
                             method=opts.get("method"), repeat=int(opts.get("repeat", 20)),
                             number=int(opts.get("number", 10)), warmup=int(opts.get("warmup", 3)),
                             indices=opts.get("indices"), program_indices=opts.get("program_indices"),
                             device_clock=opts.get("device_clock"))
        return json.dumps(table)

    @reg("time_kernel")
    def _time_kernel(lib_file: str, args_info: str, options: str) -> str:
        from .kernel_timer import time_kernel

        s = session()
        opts = json.loads(options)
        secs = time_kernel(s.library(lib_file), json.loads(args_info), s.device(), number=opts.get("number", 3),
                           repeat=opts.get("repeat", 1), min_repeat_ms=opts.get("min_repeat_ms", 100),
                           seed=int(opts.get("seed", 0)))
        s.libs.pop(lib_file, None)   # candidates are used once: keep neither hundreds of modules nor their files
        try:
            os.remove(s.path(lib_file))
        except OSError:
            pass
        return json.dumps(secs)

    @reg("time_stage")
    def _time_stage(lib_files: str, groups: str, options: str) -> float:
        from .model import kernel_library, lookup_kernel
        from .stage_timer import KernelCall, StageTimer

        s = session()
        opts = json.loads(options)
        libs = [kernel_library(s.library(n)) for n in json.loads(lib_files)]

        def lookup(name):
            for lib in libs:
                fn = lookup_kernel(lib, name)
                if fn is not None:
                    return fn
            raise KeyError(f"kernel {name} is in none of the uploaded libraries")

        key = (int(opts.get("warmup", 2)), int(opts.get("repeat", 7)))
        if s.timer is None or getattr(s.timer, "_key", None) != key:
            if s.timer is not None:
                s.timer.close()
            s.timer = StageTimer(lookup, s.device(), warmup=key[0], repeat=key[1])
            s.timer._key = key
        s.timer.lookup_kernel = lookup
        calls = [[KernelCall(c[0], tuple((tuple(a[0]), a[1]) for a in c[1]), tuple((tuple(o[0]), o[1]) for o in c[2]))
                  for c in g] for g in json.loads(groups)]
        return float(s.timer.time_stage(calls))

    @reg("time_plans")
    def _time_plans(runs: str, options: str) -> str:
        from .plan import ExecutionPlan
        from .plan_timer import time_plans

        s = session()
        opts = json.loads(options)
        loaded = {name: (s.library(lib), ExecutionPlan.loads(plan)) for name, (lib, plan) in json.loads(runs).items()}
        times = time_plans(loaded, repeat=int(opts.get("repeat", 15)), warmup=int(opts.get("warmup", 2)),
                           seed=int(opts.get("seed", 0)))
        return json.dumps(times)


# ------------------------------------------------------------------------------------------------ serving
def parse_address(text: str, default_port: int = 9190) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, default_port
    try:
        return host or "127.0.0.1", int(port)
    except ValueError:
        raise ValueError(f"expected HOST:PORT, got {text!r}") from None


def _parse_cpus(text: str) -> set[int]:
    """``0-3,6`` -> {0, 1, 2, 3, 6}."""
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


def _bind(host: str, port: int, port_end: int) -> tuple[socket.socket, int]:
    last = None
    for p in range(port, max(port, port_end) + 1):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((host, p))
            sock.listen(1)
            return sock, sock.getsockname()[1]
        except OSError as err:
            sock.close()
            last = err
    raise OSError(f"no free port in {port}..{port_end} on {host}: {last}")


def _device_kind(requested: str) -> str:
    if requested != "auto":
        return requested
    try:
        import tvm

        return "cuda" if tvm.cuda(0).exist else "cpu"
    except Exception:  # noqa: BLE001 - no CUDA runtime: a CPU server
        return "cpu"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tvm_interop.runtime.rpc_server",
                                description="Serve this machine's device to a tvm-interop fleet through TVM's RPC "
                                            "tracker (runtime only).")
    p.add_argument("--tracker", required=True, help="tracker address HOST:PORT")
    p.add_argument("--key", required=True, help="device key the tracker files this server under (e.g. h100)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=9090, help="first port to try (default 9090; 0: any free port)")
    p.add_argument("--port-end", type=int, default=9199, help="last port to try (default 9199)")
    p.add_argument("--custom-addr", default=None,
                   help="address clients should connect to, when the tracker sees this host under another one")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="device to measure on (default: cuda when present, else cpu)")
    p.add_argument("--cpus", default=None,
                   help="pin the server to these CPU cores (e.g. 0-7): several servers can share a large host; "
                        "the core count is part of a CPU device's fingerprint")
    args = p.parse_args(argv)
    import signal

    # stop cleanly (exit handlers run) on SIGTERM, and on Ctrl-C even when started with SIGINT ignored (as a
    # shell's background job is): a service manager and a terminal both get an orderly exit
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.cpus:
        os.sched_setaffinity(0, _parse_cpus(args.cpus))
    kind = _device_kind(args.device)
    tracker = parse_address(args.tracker)
    info = describe(kind)
    register_functions(kind)
    sock, port = _bind(args.host, args.port, args.port_end if args.port else args.port)
    custom = args.custom_addr or (None if args.host in ("0.0.0.0", "") else args.host)
    print(f"tvm-interop device server: key {args.key!r}, {info['fingerprint']}, listening on {args.host}:{port}, "
          f"tracker {tracker[0]}:{tracker[1]}", flush=True)
    from tvm.rpc import server as rpc_server

    try:
        rpc_server._listen_loop(sock, port, args.key, tracker, "", custom)
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
