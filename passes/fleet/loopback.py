"""A whole fleet on this machine: a tracker and device servers as child processes, on free local ports.

For the tests and ``scripts/bench_fleet.py``, and for trying the fleet commands before setting up real device
machines. Every child runs in its own process group, so stopping a server also stops the session processes it
forked (what a machine that dies does to its in-flight measurements). Needs the ``rpc`` extra (tornado and
cloudpickle, for TVM's tracker).
"""
from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from .tracker import FleetError, TrackerConnection, key_counts


def tracker_available() -> str | None:
    """None when TVM's tracker can run here; else what is missing."""
    import importlib.util

    missing = [m for m in ("tornado", "cloudpickle") if importlib.util.find_spec(m) is None]
    return f"TVM's RPC tracker needs {' and '.join(missing)} (pip install 'tvm-interop[rpc]')" if missing else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    key: str
    proc: subprocess.Popen
    port: int
    banner: str

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class LoopbackFleet:
    """``with LoopbackFleet() as lf: lf.add_server("cpu"); lf.add_server("cpu"); lf.wait_for("cpu", 2)``.
    ``env``: environment of the servers (e.g. runtime-only, see tests/runtime_only.py); ``log_dir``: where the
    children's output goes (default: discarded)."""

    env: dict | None = None
    log_dir: str | None = None
    start_timeout: float = 60.0
    tracker_port: int = 0
    servers: list[ServerProcess] = field(default_factory=list)
    _tracker: subprocess.Popen | None = None

    @property
    def tracker(self) -> str:
        return f"127.0.0.1:{self.tracker_port}"

    def __enter__(self) -> "LoopbackFleet":
        why = tracker_available()
        if why:
            raise FleetError(why)
        last = None
        for _ in range(5):   # a free port can be taken between finding it and the tracker binding it
            port = _free_port()
            proc = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                     "--port", str(port), "--port-end", str(port + 1)],
                                    stdout=self._log("tracker"), stderr=subprocess.STDOUT, start_new_session=True)
            deadline = time.monotonic() + self.start_timeout
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    TrackerConnection(f"127.0.0.1:{port}", timeout=1.0).close()
                    self._tracker, self.tracker_port = proc, port
                    return self
                except FleetError as err:
                    last = err
                    time.sleep(0.2)
            self._stop(proc, signal.SIGKILL)
        self.close()
        raise FleetError(f"the loopback tracker did not start ({last})")

    def __exit__(self, *exc) -> None:
        self.close()

    def _log(self, name: str):
        if not self.log_dir:
            return subprocess.DEVNULL
        os.makedirs(self.log_dir, exist_ok=True)
        return open(os.path.join(self.log_dir, f"{name}.log"), "ab")

    def add_server(self, key: str, cpus: str | None = None, device: str = "cpu") -> ServerProcess:
        """Start a device server (``runtime.rpc_server``) registered under ``key``; returns once it listens."""
        cmd = [sys.executable, "-m", "tvm_interop.runtime.rpc_server", "--tracker", self.tracker, "--key", key,
               "--host", "127.0.0.1", "--port", "0", "--device", device]
        if cpus is not None:
            cmd += ["--cpus", cpus]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log(f"server{len(self.servers)}"),
                                env=self.env, start_new_session=True)
        banner = b""
        deadline = time.monotonic() + self.start_timeout
        while not banner.endswith(b"\n") and time.monotonic() < deadline and proc.poll() is None:
            ready, _, _ = select.select([proc.stdout], [], [], 0.5)
            if ready:
                banner += os.read(proc.stdout.fileno(), 4096)
        text = banner.decode(errors="replace").strip()
        if "listening on" not in text:
            self._stop(proc, signal.SIGKILL)
            raise FleetError(f"device server for {key!r} did not start (exit {proc.poll()}): {text or 'no output'}")
        port = int(text.split("listening on", 1)[1].split(",")[0].rsplit(":", 1)[1])
        server = ServerProcess(key, proc, port, text)
        self.servers.append(server)
        return server

    def wait_for(self, key: str, count: int, free: bool = True) -> None:
        """Until the tracker lists ``count`` servers of ``key`` (all free, with ``free``)."""
        deadline = time.monotonic() + self.start_timeout
        rec = None
        while time.monotonic() < deadline:
            with TrackerConnection(self.tracker) as conn:
                rec = key_counts(conn.summary()).get(key)
            if rec and rec["total"] == count and (not free or rec["free"] == count):
                return
            time.sleep(0.2)
        raise FleetError(f"the tracker lists {rec} for key {key!r}, expected {count} server(s)")

    def kill(self, server: ServerProcess) -> None:
        """Kill a server and the sessions it serves at once (SIGKILL to its process group): a machine dying."""
        self._stop(server.proc, signal.SIGKILL)

    def stop(self, server: ServerProcess) -> None:
        """Stop a server politely (SIGTERM: it exits through Python, running its exit handlers)."""
        self._stop(server.proc, signal.SIGTERM)

    @staticmethod
    def _stop(proc: subprocess.Popen, sig) -> None:
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def close(self) -> None:
        for s in self.servers:
            self.stop(s)
            if s.proc.stdout:
                s.proc.stdout.close()
        if self._tracker is not None:
            self._stop(self._tracker, signal.SIGKILL)
            self._tracker = None
