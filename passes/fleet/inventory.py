"""What a tracker has: every server with its key, whether it is free, and (for free ones) what device it is.

The tracker itself knows keys, addresses and free counts only. Device names come from the servers: each free
server is asked once (a short session: ``tvm_interop.rpc.describe``) and released. Busy servers are listed as
busy; asking them would mean waiting for their current user.
"""
from __future__ import annotations

from .device import DeviceLost, RemoteCallError, RemoteDevice
from .tracker import FleetError, TrackerAddress, TrackerConnection, key_counts


def list_devices(tracker: "str | TrackerAddress", probe: bool = True, wait: float = 2.0) -> list[dict]:
    """One row per registered server: ``key``, ``address``, ``state`` (free / busy), and with ``probe`` for free
    servers ``fingerprint``, ``device_name``, ``host``, ``tvm_version`` (or ``error`` when it did not answer as a
    tvm-interop device server)."""
    tracker = TrackerAddress.parse(tracker)
    with TrackerConnection(tracker) as conn:
        counts = key_counts(conn.summary())
    rows = []
    for key, rec in sorted(counts.items()):
        described: dict[str, dict] = {}
        held = []
        if probe:
            for _ in range(rec["free"]):
                try:
                    c = TrackerConnection(tracker)
                    try:
                        host, port, matchkey = c.request(key, timeout=wait)
                    finally:
                        c.close()
                except (TimeoutError, OSError):
                    break
                try:
                    dev = RemoteDevice.connect(host, port, matchkey, call_timeout=10.0)
                    held.append(dev)   # held until every free one is asked: the tracker hands out each once
                    described[dev.address] = dict(dev.info)
                except (DeviceLost, RemoteCallError, FleetError) as err:
                    described[f"{host}:{port}"] = {"error": str(err)}
        for address in rec["addresses"]:
            info = described.get(address)
            row = {"key": key, "address": address,
                   "state": ("free" if info is not None else "busy") if probe else "?"}
            if info is not None:
                row.update({k: info.get(k) for k in ("fingerprint", "device_name", "host", "tvm_version", "error")
                            if info.get(k) is not None})
            rows.append(row)
        rows.append({"key": key, "summary": f"{rec['total']} server(s), {rec['free']} free, "
                                           f"{rec['pending']} request(s) pending"})
        for dev in held:
            dev.close()
    return rows
