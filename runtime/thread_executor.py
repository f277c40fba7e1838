"""The CPU executor: runs a plan's concurrent groups on a fixed pool of worker threads.

Why threads and not the Relax VM: on a CPU the VM runs kernels one after another, so a schedule's concurrency
has to come from the host. TVM kernels release the GIL, so two Python threads really run two kernels at once.
Each thread that calls a parallel TVM kernel gets its own TVM thread pool (thread-local), so we keep a *fixed*
set of workers (pools are created once, at most one per core unless asked) and give each worker's pool a share of
the cores: a stage with g groups runs on w = min(g, workers) workers, each taking the stage's next group when it is
free, with ``cores // w`` TVM threads; a single-group stage uses every core.

TVM pins the thread that owns a pool to a core unless ``TVM_BIND_THREADS=0``; pinned workers would then fight for
the same core, so ``runtime`` sets ``TVM_BIND_THREADS=0`` before TVM starts any pool (unless the user chose).

Modes: ``stage`` — every group of stage k finishes before stage k+1 starts (barrier); ``dependency`` — groups are
still the unit of dispatch, but a group waits only for the calls it reads from (events per call).
"""
from __future__ import annotations

import os
import queue
import threading
from typing import Callable, Sequence

from .errors import InteropError
from .plan import ExecutionPlan, check_run_inputs, storage_sizes

# Must happen before the first parallel kernel starts a TVM thread pool.
os.environ.setdefault("TVM_BIND_THREADS", "0")

import numpy as np  # noqa: E402
import tvm  # noqa: E402

_config_threadpool = None


def _set_thread_count(n: int) -> None:
    """Configure the *calling thread's* TVM pool to use n threads (TVM keeps one pool per calling thread)."""
    global _config_threadpool
    if _config_threadpool is None:
        _config_threadpool = tvm.get_global_func("runtime.config_threadpool")
    _config_threadpool(1, int(n))


class _Worker:
    """A long-lived thread that runs groups of calls; its TVM thread pool lives as long as it does."""

    def __init__(self, idx: int):
        self.idx = idx
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.threads_now = -1
        self.thread = threading.Thread(target=self._loop, name=f"tvm-interop-worker-{idx}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.tasks.get()
            if item is None:
                return
            fn, nthreads, done = item
            try:
                if nthreads != self.threads_now:
                    _set_thread_count(nthreads)
                    self.threads_now = nthreads
                fn()
                done(None)
            except BaseException as e:  # noqa: BLE001 - propagated to the caller
                done(e)
            # Drop the task before waiting for the next one. Its closures hold the executor; kept in this frame
            # while the thread waits, they kept every executor alive for good, so ``ThreadExecutor.__del__`` never
            # stopped its workers: each compiled model a process dropped left its worker threads (and their TVM
            # pools) behind, 8 per Inception-v3 lios model (measured).
            item = fn = done = None

    def submit(self, fn: Callable[[], None], nthreads: int, done: Callable[[BaseException | None], None]) -> None:
        self.tasks.put((fn, nthreads, done))

    def stop(self) -> None:
        self.tasks.put(None)


class WorkerPool:
    """Workers shared by many short-lived executors (the measured cost model times thousands of stages; each
    worker keeps its TVM thread pool, so pools are not re-created per measurement)."""

    def __init__(self):
        self._workers: list[_Worker] = []

    def get(self, n: int) -> list[_Worker]:
        while len(self._workers) < n:
            self._workers.append(_Worker(len(self._workers)))
        return self._workers[:n]

    def close(self) -> None:
        for w in self._workers:
            w.stop()
        self._workers = []


class ThreadExecutor:
    """Run an ExecutionPlan with kernels from a TVM library on a fixed pool of CPU worker threads."""

    def __init__(self, plan: ExecutionPlan, lookup_kernel: Callable[[str], object], constants: Sequence,
                 device=None, mode: str = "stage", num_workers: int | None = None, cores: int | None = None,
                 workers: "WorkerPool | None" = None):
        if mode not in ("stage", "dependency"):
            raise InteropError(f"unknown execution mode {mode!r}; use 'stage' or 'dependency'")
        self.plan = plan
        self.mode = mode
        self.device = device if device is not None else tvm.cpu(0)
        if len(constants) != plan.num_constants:
            raise InteropError(f"plan expects {plan.num_constants} constants, got {len(constants)}")
        self.constants = [c if isinstance(c, tvm.runtime.Tensor) else tvm.runtime.tensor(np.asarray(c), self.device)
                          for c in constants]
        self.kernels = {}
        for c in plan.calls:
            if c.func not in self.kernels:
                f = lookup_kernel(c.func)
                if f is None:
                    raise InteropError(f"kernel {c.func!r} (unit {c.unit}) is missing from the library")
                self.kernels[c.func] = f
        self.cores = cores or _usable_cores()
        want = plan.max_concurrency()
        # By default no more workers than cores: a stage with more groups than cores runs them on the cores'
        # workers, each taking the stage's next group when it is free (see ``_run_stages``). More workers than
        # cores only time-slice: RandWire (width 0.5, 112 px) greedy, stages of up to 7 groups, on a 2-core EPYC
        # ran 18.88 ms with a worker per group and 13.25 ms with two pulling workers (same library, interleaved;
        # docs/bench_cpu_epyc_avx2_2026-11-29.md). An explicit ``num_workers`` is honoured.
        self.num_workers = max(1, min(num_workers or min(want, self.cores), want))
        # Stage mode may share storage between buffers whose stage intervals are disjoint (the plan says which).
        # Dependency mode has no barriers, so no interval is known to be over: every buffer gets its own storage.
        # A storage holds its largest buffer; every buffer is a view of it from its start (shapes may differ).
        storage_of = [b["storage"] if mode == "stage" else i for i, b in enumerate(plan.buffers)]
        self.storages = {sid: tvm.runtime.empty((max(1, n),), "uint8", self.device)
                         for sid, n in storage_sizes(plan.buffers, storage_of).items()}
        self.buffers = [self.storages[sid]._create_view(tuple(b["shape"]), b["dtype"])
                        for b, sid in zip(plan.buffers, storage_of)]
        self._call_fns = [self._bind(i) for i in range(len(plan.calls))]
        self._shared_pool = workers
        self._workers: list[_Worker] = []
        self._inputs: list = []
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ setup
    def _slot(self, slot):
        kind, k = slot
        if kind == "i":
            return lambda: self._inputs[k]
        if kind == "c":
            v = self.constants[k]
            return lambda: v
        v = self.buffers[k]
        return lambda: v

    def _bind(self, i: int) -> Callable[[], None]:
        call = self.plan.calls[i]
        f = self.kernels[call.func]
        getters = [self._slot(s) for s in call.args] + [self._slot(["b", o]) for o in call.outs]
        if all(s[0] != "i" for s in call.args):
            fixed = [g() for g in getters]
            return lambda: f(*fixed)
        return lambda: f(*[g() for g in getters])

    def _ensure_workers(self) -> None:
        if not self._workers and self.num_workers > 1:
            if self._shared_pool is not None:
                self._workers = self._shared_pool.get(self.num_workers)
            else:
                self._workers = [_Worker(i) for i in range(self.num_workers)]

    def close(self) -> None:
        if self._shared_pool is None:
            for w in self._workers:
                w.stop()
        self._workers = []

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # ------------------------------------------------------------------ inputs / outputs
    def _check_inputs(self, inputs: Sequence) -> list:
        check_run_inputs(self.plan.inputs, inputs)
        out = []
        for x in inputs:
            out.append(x if isinstance(x, tvm.runtime.Tensor) else tvm.runtime.tensor(np.ascontiguousarray(x), self.device))
        return out

    def _read(self, slot):
        if isinstance(slot, list) and slot and isinstance(slot[0], str):
            return self._slot(slot)()
        return [self._read(s) for s in slot]

    # ------------------------------------------------------------------ execution
    def run(self, *inputs, numpy: bool = True):
        """Run once; returns a numpy array (or list for tuple outputs), or TVM tensors with ``numpy=False``.

        Outputs are copied out, because the plan's buffers are reused by the next run.
        """
        with self._lock:
            self._inputs = self._check_inputs(inputs)
            self.run_raw()
            out = self._read(self.plan.output)
            if numpy:
                return _to_numpy(out)
            return _copy(out)

    def run_traced(self, *inputs) -> list[dict]:
        """Run once with every kernel call timed: one event per call (unit, kernel, thread, start, end in s).

        Tracing wraps each call in two clock reads (well under a microsecond); the schedule is unchanged.
        """
        import time

        events: list[dict] = []
        lock = threading.Lock()
        plain = self._call_fns

        def wrap(i, fn):
            call = self.plan.calls[i]

            def traced():
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                with lock:
                    events.append({"call": i, "unit": call.unit, "func": call.func,
                                   "thread": threading.current_thread().name, "start": t0, "end": t1})
            return traced

        with self._lock:
            self._inputs = self._check_inputs(inputs)
            self._call_fns = [wrap(i, f) for i, f in enumerate(plain)]
            try:
                t_begin = time.perf_counter()
                self.run_raw()
            finally:
                self._call_fns = plain
        for e in events:
            e["start"] -= t_begin
            e["end"] -= t_begin
        return sorted(events, key=lambda e: e["start"])

    def run_raw(self) -> None:
        """Run on the inputs already set (benchmarks call this to avoid input conversion)."""
        if self.mode == "stage":
            self._run_stages()
        else:
            self._run_dependency()

    def _run_group(self, group: list[int]) -> None:
        fns = self._call_fns
        for c in group:
            fns[c]()

    def _run_stages(self) -> None:
        fns = self._call_fns
        for stage in self.plan.stages:
            if len(stage) == 1 or self.num_workers == 1:
                for g in stage:
                    for c in g:
                        fns[c]()
                continue
            self._ensure_workers()
            self._run_pulled(stage, lambda g: self._run_group(g))

    def _run_pulled(self, groups: list[list[int]], run_group: Callable[[list[int]], None]) -> None:
        """Run ``groups`` on ``min(len(groups), num_workers)`` workers, each taking the next group not yet taken
        (in order) whenever it is free, and return when all are done.

        Why pulled and not dealt out in advance: the executor knows no group's cost, and a worker that pulls
        balances the load by itself (a greedy list schedule), the same whether a stage has as many groups as
        workers or many more. Each worker's kernels get ``cores // active workers`` threads."""
        active = min(len(groups), self.num_workers)
        nthreads = max(1, self.cores // active)
        taken = iter(groups)
        take = threading.Lock()
        pending = active
        cv = threading.Condition()
        errors: list[BaseException] = []

        def pull() -> None:
            while not errors:
                with take:
                    g = next(taken, None)
                if g is None:
                    return
                run_group(g)

        def done(err) -> None:
            nonlocal pending
            with cv:
                if err is not None:
                    errors.append(err)
                pending -= 1
                if pending == 0:
                    cv.notify()

        for w in self._workers[:active]:
            w.submit(pull, nthreads, done)
        with cv:
            while pending:
                cv.wait()
        if errors:
            raise errors[0]

    def _run_dependency(self) -> None:
        """Dispatch every group as soon as the calls it reads from are done; no stage barriers."""
        plan = self.plan
        groups = [g for st in plan.stages for g in st]
        if self.num_workers == 1:
            for g in groups:
                self._run_group(g)
            return
        self._ensure_workers()
        events = [threading.Event() for _ in plan.calls]
        failed = threading.Event()
        fns = self._call_fns

        def run_group(g):
            try:
                for c in g:
                    for d in plan.deps[c]:
                        if not events[d].wait(timeout=600):
                            raise InteropError(f"call {c} waited too long for call {d}")
                        if failed.is_set():
                            raise InteropError("aborted: another group failed")
                    fns[c]()
                    events[c].set()
            except BaseException:
                failed.set()
                for e in events:
                    e.set()
                raise

        # Workers take groups in schedule order, and a group reads only from groups before it: the first group
        # not yet done has every producer done and is running or about to be taken, so there is no deadlock
        # however few workers there are.
        self._run_pulled(groups, run_group)


def _usable_cores() -> int:
    from .cpu_threads import kernel_threads

    return kernel_threads()


def _to_numpy(out):
    if isinstance(out, list):
        return [_to_numpy(o) for o in out]
    return out.numpy()


def _copy(out):
    if isinstance(out, list):
        return [_copy(o) for o in out]
    return tvm.runtime.tensor(out.numpy(), out.device)
