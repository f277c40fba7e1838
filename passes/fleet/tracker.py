"""Talking to TVM's RPC tracker: reachability, what it has, and a device request that can time out.

TVM's ``TrackerSession`` retries a refused connection for a minute and waits for a free device forever; a fleet
job needs a clear error within seconds when the tracker is unreachable or the key unknown, and a bounded wait
for a free device. The protocol is TVM's (``tvm.rpc.base``): length-prefixed JSON messages after a magic word.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from tvm_interop.runtime.errors import InteropError


class FleetError(InteropError):
    """A fleet job cannot run: tracker unreachable, key unknown, no free device, every device refused or lost."""


@dataclass(frozen=True)
class TrackerAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @staticmethod
    def parse(text: "str | TrackerAddress") -> "TrackerAddress":
        if isinstance(text, TrackerAddress):
            return text
        host, sep, port = str(text).rpartition(":")
        try:
            if not sep or not host:
                raise ValueError
            return TrackerAddress(host, int(port))
        except ValueError:
            raise FleetError(f"--rpc wants the tracker as HOST:PORT (e.g. 127.0.0.1:9190), got {text!r}") from None


class TrackerConnection:
    """One connection to the tracker. ``timeout``: seconds for connecting and for each reply."""

    def __init__(self, address: "str | TrackerAddress", timeout: float = 10.0):
        from tvm.rpc import base

        self.address = TrackerAddress.parse(address)
        self._base = base
        try:
            sock = socket.create_connection((self.address.host, self.address.port), timeout=timeout)
        except OSError as err:
            raise FleetError(f"cannot reach the RPC tracker at {self.address} ({err.strerror or err}); start one "
                             "with `python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190`") from None
        try:
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            magic = struct.unpack("<i", base.recvall(sock, 4))[0]
        except (OSError, RuntimeError) as err:
            sock.close()
            raise FleetError(f"{self.address} did not answer as an RPC tracker ({err})") from None
        if magic != base.RPC_TRACKER_MAGIC:
            sock.close()
            raise FleetError(f"{self.address} is not an RPC tracker (wrong magic)")
        self.sock = sock

    def _ask(self, message, timeout: float | None):
        self.sock.settimeout(timeout)
        self._base.sendjson(self.sock, message)
        return self._base.recvjson(self.sock)

    def summary(self, timeout: float = 10.0) -> dict:
        reply = self._ask([self._base.TrackerCode.SUMMARY], timeout)
        if reply[0] != self._base.TrackerCode.SUCCESS:
            raise FleetError(f"the tracker at {self.address} refused a summary: {reply}")
        return reply[1]

    def request(self, key: str, timeout: float | None, priority: int = 1) -> tuple[str, int, str]:
        """Wait (at most ``timeout`` seconds) for a free server of ``key``: ``(host, port, matchkey)``. On a
        timeout this connection is closed, which withdraws the request (the tracker skips closed requesters)."""
        try:
            reply = self._ask([self._base.TrackerCode.REQUEST, key, "", priority], timeout)
        except (socket.timeout, TimeoutError):
            self.close()
            raise
        if reply[0] != self._base.TrackerCode.SUCCESS:
            raise FleetError(f"the tracker at {self.address} refused a request for {key!r}: {reply}")
        host, port, matchkey = reply[1]
        return host, int(port), matchkey

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def key_counts(summary: dict) -> dict[str, dict]:
    """Per key: ``total`` servers registered, ``free`` ones, ``pending`` requests, server ``addresses``."""
    out: dict[str, dict] = {}
    for item in summary.get("server_info", []):
        key = str(item.get("key", "")).partition(":")[2]
        rec = out.setdefault(key, {"total": 0, "free": 0, "pending": 0, "addresses": []})
        rec["total"] += 1
        rec["addresses"].append(":".join(map(str, item.get("addr", []))))
    for key, q in summary.get("queue_info", {}).items():
        rec = out.setdefault(key, {"total": 0, "free": 0, "pending": 0, "addresses": []})
        rec["free"], rec["pending"] = int(q.get("free", 0)), int(q.get("pending", 0))
    return out


def check_key(address: "str | TrackerAddress", key: str, timeout: float = 10.0) -> dict:
    """The tracker's record of ``key`` (see :func:`key_counts`), or a FleetError naming the keys it does have."""
    with TrackerConnection(address, timeout) as conn:
        counts = key_counts(conn.summary(timeout))
    rec = counts.get(key)
    if not rec or rec["total"] == 0:
        have = ", ".join(f"{k} ({v['total']} server(s))" for k, v in sorted(counts.items()) if v["total"]) or "none"
        raise FleetError(f"the tracker at {TrackerAddress.parse(address)} has no device server with key {key!r}; "
                         f"keys it has: {have}. Start one on the device with `python -m "
                         f"tvm_interop.runtime.rpc_server --tracker {TrackerAddress.parse(address)} --key {key}`")
    return rec
