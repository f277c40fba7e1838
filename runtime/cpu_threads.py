"""How many threads TVM's CPU kernels get: one per physical core this process may run on.

Why: TVM's thread pool, unless ``TVM_NUM_THREADS`` is set, uses half of ``std::thread::hardware_concurrency()`` on
x86 on the assumption that every core has two hyper-threads. On a machine (or VM) without SMT that halves the
kernels' parallelism: measured on the 2-core EPYC dev machine, TVM's pool had one thread and SqueezeNet ran in
10.5 ms, against 5.96 ms with ``TVM_NUM_THREADS=2`` (``runtime.NumThreads`` 1 vs 2). Counting the physical cores
from the kernel's topology files gives TVM's own answer on SMT machines and the right one elsewhere.

:func:`configure` sets ``TVM_NUM_THREADS`` (only when the user has not) before any TVM pool exists; ``runtime``
calls it at import. Reads ``/sys`` only: a deployed model needs nothing beyond TVM's runtime.
"""
from __future__ import annotations

import os

ENV = "TVM_NUM_THREADS"


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int] | None = None, sysfs: str = "/sys/devices/system/cpu") -> int | None:
    """Distinct physical cores among ``cpus`` (default: :func:`usable_cpus`), from the topology files; None
    when they cannot be read."""
    cpus = usable_cpus() if cpus is None else cpus
    cores = set()
    for c in cpus:
        base = os.path.join(sysfs, f"cpu{c}", "topology")
        try:
            with open(os.path.join(base, "core_id"), encoding="ascii") as f:
                core = f.read().strip()
            with open(os.path.join(base, "physical_package_id"), encoding="ascii") as f:
                package = f.read().strip()
        except OSError:
            return None
        cores.add((package, core))
    return len(cores) or None


def kernel_threads() -> int:
    """Threads a kernel's parallel loop gets: ``TVM_NUM_THREADS`` when set, else the physical cores usable here
    (else the usable logical CPUs)."""
    env = os.environ.get(ENV, "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return physical_cores() or max(1, len(usable_cpus()))


def configure() -> int:
    """Set ``TVM_NUM_THREADS`` to :func:`kernel_threads` unless the user set it; returns the count. Must run
    before TVM starts its first thread pool (TVM reads the variable then)."""
    n = kernel_threads()
    os.environ.setdefault(ENV, str(n))
    return n
