"""One device of a fleet: an RPC session to a device server (``runtime.rpc_server``), what it is, what it holds.

Calls run on a helper thread so that a measurement that hangs (a wedged device, a server stopped without closing
its socket) costs the caller ``timeout`` seconds and not the whole job: the session is then abandoned and the
device counted as lost. TVM's RPC client cannot interrupt a call in flight, so the helper thread stays blocked
until the server side gives up (sessions are requested with a server-side ``session_timeout`` as a backstop).
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field

from tvm_interop.runtime.rpc_server import FUNC_PREFIX

from .tracker import FleetError


class DeviceLost(Exception):
    """The session to a device broke (server died, connection reset) or a call timed out: retry elsewhere."""


class RemoteCallError(FleetError):
    """The device answered, but the call failed there (a bad candidate, a kernel that does not load)."""


def _file_digest(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


@dataclass
class RemoteDevice:
    """A live session. ``address``: the server's ``host:port`` (as the tracker handed it out)."""

    session: object
    address: str
    info: dict = field(default_factory=dict)
    uploaded: dict = field(default_factory=dict)   # local path -> remote name
    lost: bool = False
    items_done: int = 0

    @property
    def fingerprint(self) -> str:
        return str(self.info.get("fingerprint", "?"))

    @staticmethod
    def connect(host: str, port: int, matchkey: str, session_timeout: float = 0.0,
                call_timeout: float = 60.0) -> "RemoteDevice":
        from tvm import rpc

        try:
            sess = rpc.connect(host, port, matchkey, session_timeout=int(session_timeout) if session_timeout else 0)
        except Exception as err:  # noqa: BLE001 - the server went away between the tracker's answer and now
            raise DeviceLost(f"cannot open a session on {host}:{port}: {_first_line(err)}") from None
        dev = RemoteDevice(sess, f"{host}:{port}")
        try:
            text = dev.call("describe", timeout=call_timeout)
        except RemoteCallError as err:
            raise FleetError(f"the server at {host}:{port} is not a tvm-interop device server ({err}); start it "
                             "with `python -m tvm_interop.runtime.rpc_server`, not tvm.exec.rpc_server") from None
        dev.info = json.loads(text)
        return dev

    def call(self, name: str, *args, timeout: float | None = None):
        """Call the device server's ``tvm_interop.rpc.<name>``; DeviceLost when the session breaks or the call
        outlives ``timeout`` seconds, RemoteCallError when the function raised on the device."""
        if self.lost:
            raise DeviceLost(f"{self.address}: session already lost")

        def remote():
            return self.session.get_function(FUNC_PREFIX + name)(*args)

        finished, result = _run_with_timeout(remote, timeout, f"fleet-call-{name}")
        if not finished:
            self.lost = True
            raise DeviceLost(f"{self.address}: {name} did not return within {timeout:.0f} s")
        if "error" in result:
            err = result["error"]
            if isinstance(err, KeyboardInterrupt):
                raise err
            # did the device answer with an error, or is the session gone? ask it something harmless
            if name == "describe" or not self._answers():
                self.lost = True
                raise DeviceLost(f"{self.address}: {_first_line(err)}")
            raise RemoteCallError(f"{self.address}: {name}: {_remote_message(err)}")
        return result["value"]

    def _answers(self, timeout: float = 15.0) -> bool:
        try:
            self.call("describe", timeout=timeout)
            return True
        except (DeviceLost, RemoteCallError):
            return False

    def upload(self, path: str, timeout: float | None = None) -> str:
        """Upload ``path`` once per session; returns its remote name (content-addressed, so two different files
        with one name do not collide)."""
        if path in self.uploaded:
            return self.uploaded[path]
        base = os.path.basename(path)
        stem, ext = os.path.splitext(base)
        name = f"{stem}-{_file_digest(path)}{ext}"
        with open(path, "rb") as f:
            data = bytearray(f.read())
        finished, result = _run_with_timeout(lambda: self.session.upload(data, name), timeout, "fleet-upload")
        if not finished or "error" in result:
            self.lost = True
            why = "timed out" if not finished else _first_line(result["error"])
            raise DeviceLost(f"{self.address}: upload of {base} failed ({why})")
        self.uploaded[path] = name
        return name

    def close(self) -> None:
        """End the session: the server process serving it exits and the server goes back to the tracker."""
        self.session = None
        import gc

        gc.collect()


def _run_with_timeout(fn, timeout: float | None, name: str) -> tuple[bool, dict]:
    """Run ``fn`` on a daemon thread: ``(finished, {"value": ...} or {"error": ...})``. TVM's RPC client cannot
    interrupt a call in flight, so a call that outlives ``timeout`` is abandoned (its thread stays blocked)."""
    result: dict = {}

    def target():
        try:
            result["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            result["error"] = err

    th = threading.Thread(target=target, name=name, daemon=True)
    th.start()
    th.join(timeout)
    return not th.is_alive(), result


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return (text.splitlines() or [type(err).__name__])[0][:300]


def _remote_message(err: BaseException) -> str:
    """The last meaningful line of a remote traceback (the exception raised on the device)."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if not ln.startswith(("File ", "^", "~")) and "Traceback" not in ln:
            return ln[:400]
    return _first_line(err)
