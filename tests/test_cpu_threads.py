"""Kernel thread count: one TVM thread per physical core (TVM's own default halves the hardware threads on x86)."""
import os
import subprocess
import sys

from tvm_interop.runtime import cpu_threads


def _fake_sysfs(tmp_path, topology):
    """topology: {cpu: (package, core)}"""
    for cpu, (package, core) in topology.items():
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "core_id").write_text(f"{core}\n")
        (d / "physical_package_id").write_text(f"{package}\n")
    return str(tmp_path)


def test_smt_siblings_count_once(tmp_path):
    sysfs = _fake_sysfs(tmp_path, {0: (0, 0), 1: (0, 1), 2: (0, 0), 3: (0, 1)})
    assert cpu_threads.physical_cores([0, 1, 2, 3], sysfs) == 2
    assert cpu_threads.physical_cores([0, 2], sysfs) == 1     # an affinity set of two siblings: one core


def test_no_smt_counts_every_cpu(tmp_path):
    sysfs = _fake_sysfs(tmp_path, {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)})
    assert cpu_threads.physical_cores([0, 1, 2, 3], sysfs) == 4   # same core id on two packages: two cores


def test_unreadable_topology_is_none(tmp_path):
    assert cpu_threads.physical_cores([0], str(tmp_path)) is None


def test_user_setting_wins(monkeypatch):
    monkeypatch.setenv(cpu_threads.ENV, "3")
    assert cpu_threads.kernel_threads() == 3
    assert cpu_threads.configure() == 3 and os.environ[cpu_threads.ENV] == "3"


def test_tvm_pool_gets_the_physical_core_count():
    """In a fresh process, importing the runtime sizes TVM's pool before it exists (what the kernels really get)."""
    env = {k: v for k, v in os.environ.items() if k != cpu_threads.ENV}
    code = ("import tvm_interop.runtime, tvm; from tvm_interop.runtime import cpu_threads; "
            "print(tvm.get_global_func('runtime.NumThreads')(), cpu_threads.kernel_threads())")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    pool, expected = map(int, out.stdout.split())
    assert pool == expected == (cpu_threads.physical_cores() or len(cpu_threads.usable_cpus()))


def test_a_dropped_model_frees_its_worker_threads(branchy_model, branchy_input, branchy_reference):
    """A compiled model on the CPU worker-thread executor that the program drops (no ``close()``) stops its worker
    threads when it is collected. Each worker used to keep its last task, whose closures hold the executor, in its
    frame while it waited for the next: the executor was never collected, and every dropped model left its threads
    (and their TVM pools) behind for the life of the process (8 per Inception-v3 lios model, measured)."""
    import gc
    import threading

    import numpy as np

    import tvm_interop

    def workers() -> int:
        return sum(t.name.startswith("tvm-interop-worker") for t in threading.enumerate())

    before = workers()
    cm = tvm_interop.compile(branchy_model, target="llvm", scheduler="lios", guard=False, executor="threads",
                             max_memory_ratio=None)
    np.testing.assert_allclose(cm.run(branchy_input), branchy_reference, rtol=1e-4, atol=1e-4)
    assert workers() > before          # it ran on worker threads
    del cm
    gc.collect()
    for t in [t for t in threading.enumerate() if t.name.startswith("tvm-interop-worker")]:
        t.join(timeout=10)
    assert workers() == before
