"""A CUDA-graph program simulated thread block by thread block on a GPU's SMs: an experiment, not the product's
model (``passes.cost.program`` is that).

Why: the product's program model shares the device as a fluid, each kernel demanding a share by its output
elements. On an H200 (``docs/gpu_kernel_check_h200_2026-11-28b.md``) that measure is wrong for TVM's default
kernels, whose 1x1 convolutions run small grids of long blocks (4032 -> 672 at 11x11: 44 blocks of 128 threads,
271 us). Two such kernels side by side take no longer than one, since their 88 blocks each get an SM of their
own. Beside many small kernels, one such kernel takes 3.7x, because its slowest block sets its end. Neither effect
exists in a fluid. This model has both.
On that run's NASNet-A-large timelines it reproduces the table's pair stages and the 3.7x kernel, but puts the
lios and ios graphs 1.4-1.8x too slow. So it stays an experiment, to be fitted on the pair probe's spans
(``scripts/pair_probe.py``) and compared with the fluid by ``scripts/gpu_kernel_check.py --block-sim``.

The model:
* the device is ``sms`` SMs, each holding at most ``threads_per_sm`` threads and ``blocks_per_sm`` blocks;
* a kernel whose stream reaches it (its events fired, ``event_latency`` after a cross-stream event) launches:
  its blocks queue, and every queued block, the earliest kernel's first, goes to the SM with the fewest resident
  warps that has room (a kernel's blocks also use room its predecessors' cannot);
* the blocks on an SM share its throughput, ``min(warps, saturation_warps) ** exponent``, in proportion to their
  warps; a block's work is set so that the kernel alone, simulated the same way, takes its measured time;
* a kernel ends when its last block does.

Only CUDA-graph programs: a direct launch costs host time per op, which this model has not.
"""
from __future__ import annotations

import functools
import heapq
from collections.abc import Mapping
from dataclasses import dataclass

from tvm_interop.passes.cost.program import KERNEL, MAIN, SET, SYNC, IssuedOp, IssuedProgram
from tvm_interop.runtime.errors import InteropError


@dataclass(frozen=True)
class BlockDevice:
    """The SMs and how their blocks share them. Defaults: an H100/H200 (132 SMs, 2048 threads and 32 blocks an
    SM); ``exponent`` from the NASNet-A-large search's H200 table (two 84-block convolutions side by side: 1.61x
    one alone, i.e. two 4-warp blocks on an SM deliver 1.24x one); ``event_latency`` the fitted program model's
    ``graph_event_latency``."""

    sms: int = 132
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32
    exponent: float = 0.31
    saturation_warps: int = 64
    event_latency: float = 1.12e-6

    def throughput(self, warps: int) -> float:
        return min(warps, self.saturation_warps) ** self.exponent

    def block_rate(self, warps: int, sm_warps: int) -> float:
        """A block's speed on an SM holding ``sm_warps`` warps, against the same block alone on an SM."""
        return warps / sm_warps * self.throughput(sm_warps) / self.throughput(warps)


@dataclass(frozen=True)
class Kernel:
    """A kernel: its device time alone (seconds) and its launch shape."""

    seconds: float
    blocks: int
    threads: int

    @property
    def warps(self) -> int:
        return max(1, -(-self.threads // 32))


def stream_queues(prog: IssuedProgram) -> tuple[list[list[tuple]], int]:
    """Per stream, its items in order: ``("kernel", unit)``, ``("record", event)``, ``("wait", event)``; and the
    number of events. The input and output copies around the graph are left out (a few microseconds)."""
    if not prog.cuda_graph:
        raise InteropError("the block simulation models CUDA-graph programs only: a direct launch costs host time "
                           "per op, which it does not model")
    queues: dict[int, list[tuple]] = {MAIN: []}
    current, events = MAIN, 0
    for o in prog.ops:
        if o.kind == KERNEL:
            if not (o.unit in prog.copy_bytes and o.unit.startswith("__")):
                queues.setdefault(current, []).append(("kernel", o.unit))
        elif o.kind == SYNC:
            queues.setdefault(o.a, []).append(("record", events))
            queues.setdefault(o.b, []).append(("wait", events))
            events += 1
        elif o.kind == SET:
            current = o.a
    return list(queues.values()), events


class _Sim:
    """One run of the event loop: SM occupancy, queued blocks, streams."""

    def __init__(self, queues: list[list[tuple]], events: int, kernels: Mapping[str, Kernel], device: BlockDevice,
                 work: Mapping[str, float]):
        self.q, self.dev, self.kernels, self.work = queues, device, kernels, work
        self.head = [0] * len(queues)
        self.busy = [False] * len(queues)        # running a kernel, or waiting out an event's latency
        self.fired: list[float | None] = [None] * events
        n = device.sms
        self.blocks: list[list[list]] = [[] for _ in range(n)]   # per SM: [stream, work left, warps, work]
        self.warps = [0] * n
        self.threads = [0] * n
        self.last = [0.0] * n
        self.version = [0] * n
        self.heap: list[tuple] = []               # (time, 0, sm, version) block ends; (time, 1, stream, 0) waits
        self.queued: list[list] = []              # [stream, blocks left to place, warps, work per block]
        self.left: dict[int, int] = {}            # per stream: blocks of its running kernel not yet done
        self.spans: dict[str, tuple[float, float]] = {}

    def _advance(self, s: int, now: float) -> None:
        dt = now - self.last[s]
        if dt > 0 and self.blocks[s]:
            w = self.warps[s]
            for b in self.blocks[s]:
                b[1] -= dt * self.dev.block_rate(b[2], w)
        self.last[s] = now

    def _reschedule(self, s: int, now: float) -> None:
        self.version[s] += 1
        if self.blocks[s]:
            w = self.warps[s]
            first = min(b[1] / self.dev.block_rate(b[2], w) for b in self.blocks[s])
            heapq.heappush(self.heap, (now + max(first, 0.0), 0, s, self.version[s]))

    def _place(self, now: float) -> None:
        touched = set()
        dev = self.dev
        for item in list(self.queued):
            stream, _, warps, work = item
            while item[1] > 0:
                best = None
                for s in range(dev.sms):
                    if self.threads[s] + 32 * warps <= dev.threads_per_sm and len(self.blocks[s]) < dev.blocks_per_sm:
                        if best is None or self.warps[s] < self.warps[best]:
                            best = s
                            if self.warps[s] == 0:
                                break
                if best is None:
                    break
                if best not in touched:
                    self._advance(best, now)
                    touched.add(best)
                self.blocks[best].append([stream, work, warps, work])
                self.warps[best] += warps
                self.threads[best] += 32 * warps
                item[1] -= 1
            if item[1] == 0:
                self.queued.remove(item)
        for s in touched:
            self._reschedule(s, now)

    def _streams(self, now: float) -> None:
        launched, progress = False, True
        while progress:
            progress = False
            for st, q in enumerate(self.q):
                while not self.busy[st] and self.head[st] < len(q):
                    kind, x = q[self.head[st]]
                    if kind == "record":
                        self.fired[x] = now
                        self.head[st] += 1
                        progress = True
                    elif kind == "wait":
                        t = self.fired[x]
                        if t is None:
                            break
                        if t + self.dev.event_latency > now:
                            self.busy[st] = True
                            heapq.heappush(self.heap, (t + self.dev.event_latency, 1, st, 0))
                            break
                        self.head[st] += 1
                    else:
                        k = self.kernels[x]
                        self.left[st] = k.blocks
                        self.spans[x] = (now, now)
                        self.queued.append([st, k.blocks, k.warps, self.work[x]])
                        self.busy[st] = launched = True
        if launched:
            self._place(now)

    def run(self) -> float:
        self._streams(0.0)
        now = 0.0
        while self.heap:
            now, kind, s, version = heapq.heappop(self.heap)
            if kind == 1:                       # an event's latency is over: the stream goes on
                self.busy[s] = False
                self.head[s] += 1
                self._streams(now)
                continue
            if version != self.version[s]:
                continue
            self._advance(s, now)
            done = [b for b in self.blocks[s] if b[1] <= 1e-9 * b[3]]   # relative: no rounding residue left
            for b in done:
                self.blocks[s].remove(b)
                self.warps[s] -= b[2]
                self.threads[s] -= 32 * b[2]
                st = b[0]
                self.left[st] -= 1
                if self.left[st] == 0:          # the kernel's last block: the stream goes on
                    unit = self.q[st][self.head[st]][1]
                    self.spans[unit] = (self.spans[unit][0], now)
                    self.head[st] += 1
                    self.busy[st] = False
            self._reschedule(s, now)
            if done:
                self._place(now)
                self._streams(now)
        # every wait's event is recorded earlier in issue order (a sync appends both at once), so nothing is left
        assert all(self.head[st] == len(q) for st, q in enumerate(self.q)), "a stream never finished"
        return now


@functools.lru_cache(maxsize=4096)
def alone_time(blocks: int, threads: int, device: BlockDevice = BlockDevice()) -> float:
    """The simulated time of a kernel alone whose every block has unit work (its waves, and its blocks sharing
    their SMs): a kernel's work per block is its measured time divided by this."""
    prog = IssuedProgram(ops=[IssuedOp(KERNEL, unit="k")], cuda_graph=True)
    queues, events = stream_queues(prog)
    return _Sim(queues, events, {"k": Kernel(1.0, blocks, threads)}, device, {"k": 1.0}).run()


def simulate_blocks(prog: IssuedProgram, kernels: Mapping[str, Kernel],
                    device: BlockDevice = BlockDevice()) -> tuple[float, dict[str, tuple[float, float]]]:
    """``(device time of the program, {unit: (start, end)})`` in seconds, for every kernel of the graph."""
    queues, events = stream_queues(prog)
    missing = sorted({x for q in queues for kind, x in q if kind == "kernel" and x not in kernels})
    if missing:
        raise InteropError(f"no time or launch shape for {len(missing)} kernel(s), e.g. {missing[0]}")
    work = {u: k.seconds / alone_time(k.blocks, k.threads, device) for u, k in kernels.items()}
    sim = _Sim(queues, events, kernels, device, work)
    return sim.run(), sim.spans
