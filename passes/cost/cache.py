"""Persistent cache of measured latencies.

One JSON file per device: a header (format, version, device fingerprint, TVM version) and entries keyed by
strategy, kernel structural hashes, shapes and batch. Rules:
- a cache written on another device or by another TVM version is *refused* (CostCacheError, naming both): its
  numbers would be silently wrong here;
- a corrupt cache (truncated, not JSON, wrong format) is reported (logged warning) and rebuilt from scratch;
- writers are safe against each other: the file is rewritten atomically (temp file + rename) under an exclusive
  ``fcntl`` lock, merging entries that another process wrote in the meantime.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from tvm_interop.runtime import atomic
from tvm_interop.runtime.errors import InteropError

log = logging.getLogger(__name__)

CACHE_FORMAT = "tvm-interop-cost-cache"
CACHE_VERSION = 1


class CostCacheError(InteropError):
    """The cost cache belongs to another device or TVM version."""


def default_cache_path(device: str | None = None) -> Path:
    """The user's cache file; one per ``device`` fingerprint when given (a CPU target with other instructions is
    another device: its kernels are other code), so switching targets never meets a foreign cache."""
    base = os.environ.get("TVM_INTEROP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tvm-interop")
    if device is None:
        return Path(base) / "cost-cache.json"
    import hashlib

    return Path(base) / f"cost-cache-{hashlib.sha256(device.encode()).hexdigest()[:12]}.json"


class CostCache:
    def __init__(self, path: "str | os.PathLike", device: str, tvm_version: str):
        self.path = Path(path)
        if self.path.is_dir() or (not self.path.suffix and not self.path.exists()):
            self.path = self.path / "cost-cache.json"
        self.device = device
        self.tvm_version = tvm_version
        self.entries: dict[str, float] = {}
        self._dirty: dict[str, float] = {}
        self.rebuilt_reason: str | None = None
        self._load()

    def _header(self) -> dict:
        return {"format": CACHE_FORMAT, "version": CACHE_VERSION, "device": self.device,
                "tvm_version": self.tvm_version}

    def _read_file(self) -> dict[str, float]:
        """Entries on disk; raises CostCacheError for a foreign file, returns {} (and warns) for a corrupt one."""
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
                raise ValueError("not a tvm-interop cost cache")
            if data.get("version") != CACHE_VERSION:
                raise ValueError(f"cache format version {data.get('version')} (expected {CACHE_VERSION})")
            entries = data["entries"]
            if not isinstance(entries, dict) or not all(isinstance(v, (int, float)) for v in entries.values()):
                raise ValueError("entries are malformed")
        except (ValueError, KeyError, UnicodeDecodeError) as e:
            self.rebuilt_reason = f"cost cache {self.path} is corrupt ({e}); rebuilding it"
            log.warning(self.rebuilt_reason)
            return {}
        if data.get("device") != self.device or data.get("tvm_version") != self.tvm_version:
            raise CostCacheError(
                f"cost cache {self.path} was measured on {data.get('device')!r} with TVM {data.get('tvm_version')}, "
                f"but this is {self.device!r} with TVM {self.tvm_version}; its latencies do not apply here. "
                "Use another cache path (TVM_INTEROP_CACHE or cache=...) or delete the file."
            )
        return {str(k): float(v) for k, v in entries.items()}

    def _load(self) -> None:
        self.entries = self._read_file()

    def get(self, key: str) -> float | None:
        return self.entries.get(key)

    def put(self, key: str, value: float) -> None:
        self.entries[key] = float(value)
        self._dirty[key] = float(value)
        if len(self._dirty) >= 64:
            self.flush()

    def flush(self) -> None:
        """Merge our new entries into the file atomically, under an exclusive lock."""
        if not self._dirty and self.path.exists() and self.rebuilt_reason is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        import fcntl

        with open(lock_path, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                on_disk = self._read_file()
            except CostCacheError:
                on_disk = {}
                raise
            on_disk.update(self._dirty)
            self.entries.update(on_disk)
            try:
                atomic.write_json(self.path, {**self._header(), "entries": on_disk}, indent=None)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        self._dirty = {}
        self.rebuilt_reason = None
