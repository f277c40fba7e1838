"""A fleet: every device the tracker has under one key, each driven by a worker thread, fed from one queue.

Why a pool of our own rather than TVM's ``request_and_run`` or MetaSchedule's ``RPCRunner``: a job here (a
tuning run, a profiling bundle, a measured search) must survive a server that dies mid-measurement by retrying
only that server's in-flight items elsewhere, bound every measurement by a timeout, and refuse devices whose
fingerprint differs from the others under the key, so that one stray machine cannot pollute a database.

* **Fingerprint**: every session is asked what it is (``tvm_interop.rpc.describe``). The key's fingerprint is
  the caller's ``expected_fingerprint`` (e.g. the one a database already holds) or, at start, the majority of
  the free devices (ties: the first one seen). A device with another fingerprint is refused with both named,
  and its session is held (parked) until the job ends, so the tracker does not hand it out to us again.
* **Faults**: an item whose device is lost (session broken, server killed, call timed out) goes back to the
  front of the queue and is retried on another device, at most ``max_attempts`` times; the worker requests a
  replacement device from the tracker (waiting at most ``device_wait`` seconds). An error *raised on* a device
  (a candidate that fails to load) is that item's result, not retried.
* **Timeouts**: ``device_wait`` for a free device, ``call_timeout`` per measurement call.
* **Ctrl-C**: items in flight are abandoned; what callers already stored stays (each caller writes its
  results atomically, see ``fleet.bundle`` and the tuning database).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable, Protocol

from .device import DeviceLost, RemoteDevice
from .tracker import FleetError, TrackerAddress, TrackerConnection, check_key

log = logging.getLogger(__name__)


@dataclass
class FleetOptions:
    max_devices: int | None = None     # use at most this many devices of the key (default: all)
    device_wait: float = 60.0          # seconds to wait for a free device before giving up
    call_timeout: float = 600.0        # seconds one measurement call may take
    max_attempts: int = 3              # devices an item is tried on before it fails
    session_timeout: float = 0.0       # server-side limit of a session (0: none); a backstop for hung calls
    expected_fingerprint: str | None = None


class Job(Protocol):
    """What a fleet runs: ``run(device, item)`` measures one item on one device (uploading what it needs once per
    session with ``device.upload``) and returns its result."""

    name: str

    def run(self, device: RemoteDevice, item): ...


@dataclass
class _Task:
    job: Job
    item: object
    future: Future
    attempts: int = 0


class Fleet:
    """Devices of ``key`` on the tracker at ``tracker`` (``HOST:PORT``). Use as a context manager, or call
    :meth:`start` and :meth:`close`. ``progress(done, total, device_address)`` is called after every item."""

    def __init__(self, tracker: "str | TrackerAddress", key: str, options: FleetOptions | None = None,
                 progress: Callable[[int, int, str], None] | None = None):
        self.tracker = TrackerAddress.parse(tracker)
        self.key = key
        self.options = options or FleetOptions()
        self.progress = progress
        self.fingerprint: str | None = self.options.expected_fingerprint
        self.devices: list[RemoteDevice] = []      # accepted, ever (for the report)
        self.parked: list[RemoteDevice] = []       # refused, held until close
        self.refused: list[dict] = []
        self.lost: list[dict] = []
        self.retries = 0
        self.failed = 0
        self.done = 0
        self.submitted = 0
        self._queue: collections.deque[_Task] = collections.deque()
        self._cv = threading.Condition()
        self._workers: list[threading.Thread] = []
        self._live_workers = 0
        self._closed = False
        self._started = False
        self._t0 = time.perf_counter()

    # ------------------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Fleet":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "Fleet":
        """Check the key, open sessions on the free devices, settle the key's fingerprint, start the workers."""
        if self._started:
            return self
        rec = check_key(self.tracker, self.key)
        opened: list[RemoteDevice] = []
        for i in range(max(1, rec["total"])):
            # every device votes on the key's fingerprint; the first may take a while (all busy), the others
            # are asked only if free right now
            dev = self._request_device(self.options.device_wait if i == 0 else 2.0)
            if dev is None:
                break
            opened.append(dev)
        if not opened:
            raise FleetError(self._no_device_message(self.options.device_wait))
        if self.fingerprint is None:
            counts = collections.Counter(d.fingerprint for d in opened)
            top = max(counts.values())
            self.fingerprint = next(d.fingerprint for d in opened if counts[d.fingerprint] == top)
        accepted = []
        for d in opened:
            if d.fingerprint != self.fingerprint:
                self._park(d)
            elif self.options.max_devices is None or len(accepted) < self.options.max_devices:
                accepted.append(d)
            else:
                d.close()   # more than asked for: back to the tracker for others
        if not accepted:
            raise FleetError(f"every device the tracker {self.tracker} handed out under key {self.key!r} was refused: "
                             + "; ".join(r["why"] for r in self.refused))
        self._started = True
        for d in accepted:
            self._spawn(d)
        log.info("fleet %s/%s: %d device(s) of %s%s", self.tracker, self.key, len(accepted), self.fingerprint,
                 f", {len(self.parked)} refused" if self.parked else "")
        return self

    def close(self) -> None:
        with self._cv:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cv.notify_all()
        for t in pending:
            if not t.future.done():
                t.future.set_exception(FleetError("the fleet was closed before this item ran"))
        for w in self._workers:
            w.join(timeout=5.0)
        for d in self.devices + self.parked:   # every session ends: the servers go back to the tracker
            d.close()

    # ------------------------------------------------------------------------------------------ work
    def submit(self, job: Job, item) -> Future:
        if not self._started:
            self.start()
        fut: Future = Future()
        with self._cv:
            if self._closed:
                raise FleetError("the fleet is closed")
            if self._live_workers == 0:
                self._spawn(None)   # every worker retired earlier (no device): try to get one again
            self._queue.append(_Task(job, item, fut))
            self.submitted += 1
            self._cv.notify()
        return fut

    def map(self, job: Job, items) -> list:
        """Run ``job`` on every item across the fleet; results in item order. An item that failed raises its
        error here (after all others finished), so a caller that wants partial results uses :meth:`submit`."""
        futures = [self.submit(job, it) for it in items]
        results, first_error = [], None
        for f in futures:
            try:
                results.append(f.result())
            except Exception as err:  # noqa: BLE001
                results.append(None)
                first_error = first_error or err
        if first_error is not None:
            raise first_error
        return results

    # ------------------------------------------------------------------------------------------ devices
    def _request_device(self, wait: float) -> RemoteDevice | None:
        """A new session on a free device of the key, or None after ``wait`` seconds. Refused devices are parked
        and the wait goes on with the time left."""
        deadline = time.monotonic() + wait
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                conn = TrackerConnection(self.tracker, timeout=min(10.0, max(1.0, left)))
                try:
                    host, port, matchkey = conn.request(self.key, timeout=left)
                finally:
                    conn.close()
            except (TimeoutError, OSError):
                return None
            except FleetError as err:   # the tracker went away mid-job: keep trying until the wait is over
                log.warning("fleet: %s", err)
                time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                continue
            try:
                dev = RemoteDevice.connect(host, port, matchkey, self.options.session_timeout,
                                           call_timeout=min(60.0, self.options.call_timeout))
            except DeviceLost as err:
                self._record_lost(f"{host}:{port}", str(err))
                continue
            if self._started and dev.fingerprint != self.fingerprint:
                self._park(dev)
                continue
            return dev

    def _park(self, dev: RemoteDevice) -> None:
        why = (f"refused {dev.address} ({dev.fingerprint}): the other devices under key {self.key!r} are "
               f"{self.fingerprint}")
        log.warning("fleet: %s", why)
        self.refused.append({"address": dev.address, "fingerprint": dev.fingerprint, "expected": self.fingerprint,
                             "why": why})
        self.parked.append(dev)

    def _record_lost(self, address: str, why: str) -> None:
        log.warning("fleet: lost %s (%s)", address, why)
        self.lost.append({"address": address, "why": why, "at_s": round(time.perf_counter() - self._t0, 3)})

    def _no_device_message(self, wait: float) -> str:
        try:
            rec = check_key(self.tracker, self.key)
            state = f"{rec['total']} server(s) registered, {rec['free']} free, {rec['pending']} request(s) pending"
        except FleetError as err:
            state = str(err)
        return (f"no free device with key {self.key!r} on the tracker {self.tracker} within {wait:.0f} s ({state}); "
                "raise --device-wait or free a device")

    # ------------------------------------------------------------------------------------------ workers
    def _spawn(self, device: RemoteDevice | None) -> None:
        self._live_workers += 1
        if device is not None:
            self.devices.append(device)
        th = threading.Thread(target=self._worker, args=(device,), daemon=True,
                              name=f"fleet-{self.key}-{len(self._workers)}")
        self._workers.append(th)
        th.start()

    def _next_task(self) -> _Task | None:
        with self._cv:
            while not self._queue and not self._closed:
                self._cv.wait(0.5)
            if self._closed:
                return None
            return self._queue.popleft()

    def _acquire(self) -> RemoteDevice | None:
        """A device for a worker that has none: asked for in short rounds (so a closed fleet stops the wait),
        for at most ``device_wait`` seconds. None: give up (the caller retires, failing the queue if it was the
        last worker)."""
        t_end = time.monotonic() + self.options.device_wait
        while not self._closed and time.monotonic() < t_end:
            dev = self._request_device(min(2.0, max(0.1, t_end - time.monotonic())))
            if dev is not None:
                self.devices.append(dev)
                return dev
        return None

    def _worker(self, device: RemoteDevice | None) -> None:
        counted = True
        try:
            while not self._closed:
                if device is None or device.lost:
                    device = self._acquire()
                    if device is None:
                        counted = not self._retire()
                        return
                task = self._next_task()
                if task is None:
                    return
                try:
                    result = task.job.run(device, task.item)
                except DeviceLost as err:
                    self._record_lost(device.address, str(err))
                    device = None
                    task.attempts += 1
                    if task.attempts >= self.options.max_attempts:
                        self.failed += 1
                        task.future.set_exception(FleetError(
                            f"{task.job.name}: item lost on {task.attempts} device(s), giving up (last: {err})"))
                    else:
                        self.retries += 1
                        with self._cv:
                            self._queue.appendleft(task)
                            self._cv.notify()
                    continue
                except BaseException as err:  # noqa: BLE001 - the item's own failure is its result
                    self.failed += 1
                    task.future.set_exception(err)
                    continue
                device.items_done += 1
                self.done += 1
                task.future.set_result(result)
                if self.progress:
                    self.progress(self.done, self.submitted, device.address)
        except BaseException as err:  # noqa: BLE001 - a bug here must not leave callers waiting forever
            log.exception("fleet worker failed")
            with self._cv:
                last = self._live_workers == 1
                pending = list(self._queue) if last else []
                if last:
                    self._queue.clear()
            for t in pending:
                t.future.set_exception(FleetError(f"the fleet's last worker failed: {err}"))
        finally:
            if counted:
                with self._cv:
                    self._live_workers -= 1

    def _retire(self) -> bool:
        """This worker found no device within ``device_wait``: when it is the last one, the queued work fails
        with a message saying what the tracker has; otherwise the others carry on."""
        err = FleetError(self._no_device_message(self.options.device_wait))
        with self._cv:   # decided and counted under one lock: a submit() after this spawns a fresh worker
            if self._live_workers > 1 or self._closed:
                return False
            pending = list(self._queue)
            self._queue.clear()
            self._live_workers -= 1
        for t in pending:
            self.failed += 1
            t.future.set_exception(err)
        return True

    # ------------------------------------------------------------------------------------------ report
    def report(self) -> dict:
        """What the job used: devices and their item counts, refused and lost devices, retries."""
        per: dict[str, int] = {}
        for d in self.devices:
            per[d.address] = per.get(d.address, 0) + d.items_done
        return {"tracker": str(self.tracker), "key": self.key, "fingerprint": self.fingerprint,
                "devices": [{"address": a, "items": n} for a, n in per.items()],
                "items": self.done, "retries": self.retries, "failed": self.failed,
                "lost": list(self.lost), "refused": [{k: r[k] for k in ("address", "fingerprint", "expected")}
                                                     for r in self.refused],
                "seconds": round(time.perf_counter() - self._t0, 3)}
