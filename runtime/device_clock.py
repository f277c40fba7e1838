"""Device time of work a callable queues on a GPU: the stream is held while the host queues the calls.

Why: TVM's ``time_evaluator`` times ``number`` calls back to back with CUDA events. That is device time only when
the device is the bottleneck. A call whose host work outlasts its kernels (a legacy cuDNN call: ~40 us of host
time, measured on the H100 run of 2026-11-26) is timed at the host's issue rate: in the unit tables of that run
almost no library unit measured under ~28 us. Without a CUDA graph that host time is real; inside a graph it is
not, so a cost table that drives graph programs (the default on CUDA) needs both clocks.

The *device clock* holds the caller's stream at a host function of the native extension
(``tvm_interop.cuda.stream_hold``), records a timing event, queues ``number`` calls, records a second event and
releases the stream: the calls then run back to back at the device's pace, and the events measure only that. If
the hold timed out before everything was queued (a call that synchronises, or more launches than the device's
queue takes), the time is not a device time: the clock retries with one call, then answers None.
"""
from __future__ import annotations

from typing import Callable

from .errors import InteropError

HOLD_TIMEOUT_MS = 1000
_FUNCS = ("stream_hold", "stream_release", "timing_create", "timing_record", "timing_read", "timing_free")


class DeviceClock:
    """Device time per call of ``run`` on device ``dev``'s current (default) stream; one timing pool per clock."""

    def __init__(self, dev, timeout_ms: int = HOLD_TIMEOUT_MS):
        import tvm

        found = {n: tvm.get_global_func(f"tvm_interop.cuda.{n}", allow_missing=True) for n in _FUNCS}
        missing = [n for n, f in found.items() if f is None]
        if missing:
            raise InteropError("the device clock needs tvm-interop's native extension (tvm_interop.cuda."
                               f"{missing[0]} is not registered): measure a library built for CUDA by this "
                               "tvm-interop, or time with the issue clock only")
        self._f = found
        self.device_id = int(dev.index)
        self.timeout_ms = int(timeout_ms)
        self._pool = self._f["timing_create"](self.device_id, 2)
        self.held = 0       # measurements that were held until every call was queued
        self.not_held = 0   # ... that were not (their times are discarded)
        self.last_calls = 0   # calls the last time() took its time from (0: none was held)

    def time(self, run: Callable[[], object], number: int) -> float | None:
        """Seconds per call of ``run`` on the device, from ``number`` calls queued while the stream was held (one
        call where ``number`` outlasted the hold; ``last_calls`` says which); None when even a single call could
        not be queued within the hold (it synchronises, or it is too long)."""
        for n in ((number, 1) if number > 1 else (1,)):
            held = self._hold_and_run(run, n)
            if held:
                self.held += 1
                self.last_calls = n
                return self._f["timing_read"](self._pool, 2)[0] / 1e3 / n
            self.not_held += 1
        self.last_calls = 0
        return None

    def _hold_and_run(self, run: Callable[[], object], n: int) -> bool:
        hold = self._f["stream_hold"](self.device_id, None, self.timeout_ms)
        try:
            self._f["timing_record"](self._pool, 0, None)
            for _ in range(n):
                run()
            self._f["timing_record"](self._pool, 1, None)
        finally:
            held = bool(self._f["stream_release"](hold))   # also on an error: the stream must not stay held
        return held

    def close(self) -> None:
        if self._pool is not None:
            self._f["timing_free"](self._pool)
            self._pool = None

    def __enter__(self) -> "DeviceClock":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
