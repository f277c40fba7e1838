"""Atomic file writes: a file is either the old one or the complete new one, never half written.

Why one helper: schedules, cost caches, tuning databases, pick files, profiling tables and exported libraries are
all rewritten in place by long jobs that may be interrupted (Ctrl-C, a full disk, a crash in TVM); each had its own
temp-file-then-rename code with slightly different cleanup. Lives in ``runtime`` (the lowest layer) so that every
layer can use it.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "", fsync: bool = False) -> Iterator[str]:
    """Yield a temporary path in the target's folder; when the block ends without an exception, rename it over
    ``path`` (``fsync``: flush it to disk first); otherwise delete it. ``suffix``: for writers that look at the
    file extension (``export_library`` wants ``.so``)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", suffix=suffix, dir=folder)
    os.close(fd)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_bytes(path: str | os.PathLike, data: bytes, fsync: bool = False) -> None:
    with atomic_path(path, fsync=fsync) as tmp, open(tmp, "wb") as f:
        f.write(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path: str | os.PathLike, obj, indent: int | None = 1) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent)
