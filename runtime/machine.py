"""Identity of the machine that measures: what cost caches and cost tables are keyed by."""
from __future__ import annotations

import os
import platform


def cpu_identity() -> str:
    """``cpu:<model name>:<usable cores>cores`` — two measurements compare only if this matches."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    return f"cpu:{model}:{cores}cores"
