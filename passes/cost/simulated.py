"""A simulated device: an analytical cost model for schedulers, tests and CI (spec ``"sim:<preset>"``).

Why analytical: schedulers are studied on graphs and devices we do not have at hand (an H100 at batch 1, a
1000-unit NASNet), and tests need a cost model that is fast, deterministic and has the effects that make
inter-operator scheduling worth doing (and not worth doing): under-filled devices, launch and synchronisation
overheads, and contention between concurrent kernels.

Device (a :class:`DeviceSpec`): ``compute_units`` (SMs, or CPU cores) each holding ``lanes_per_unit`` resident
work items (threads per SM; for a CPU the work a core needs to be kept busy by a parallel-for), a sustained
``peak_flops`` and memory ``bandwidth`` (what a well-tuned kernel reaches, not the datasheet), a per-kernel
``launch`` latency, a ``stage_sync`` cost paid once by every concurrent stage with two or more groups (fork and
join events / a thread barrier), and ``stream_overhead`` paid per extra stream (group) of such a stage.

One kernel (a unit, or a merged stage) alone::

    W    = output elements (one work item each; at least 1)
    f    = min(1, W / (compute_units * lanes_per_unit))      fraction of the device it fills
    g    = min(1, f / bw_fill)                                 fraction of the bandwidth it can draw: a few
                                                                resident warps per SM already saturate DRAM
    d    = max(flops / (peak_flops * f), bytes / (bandwidth * g))     roofline with partial occupancy
    time = launch + d

A unit with ``flops == 0`` is memory bound (``d = bytes / (bandwidth * g)``); ``bytes`` is ``bytes_moved`` or,
when that is 0, the sizes of its inputs and outputs.

Two terms describe TVM's *default* CUDA kernels (DLight), for the ``-tvm`` presets only (zero / off elsewhere):

    d    = max(d, steps * (reduction_step + boundary_step if padded on both axes))     a convolution
    W    = flops / 2                                                                     a matmul (gemv_split)

A default convolution gives each thread one output element and loops over its whole reduction window (in
channels per group x kernel area = ``steps``) one step after another, so with fewer outputs than the device
has lanes its time follows the reduction depth, not its FLOPs or bytes: on the H100 and H200 (2026-11-27 tables,
device clock) ResNet-50's 3x3 convolutions of 128, 256 and 512 channels took 104, 201 and 385-415 us, 0.09 us
per step each, while their FLOPs are equal; a window padded along both axes (every step tests the inlined
padding's bounds on both) costs 0.08-0.09 us per step, any other 0.047-0.05 (1x1, 1x7, 7x1, an unpadded stride-2
3x3). A batch-1 matmul runs DLight's GEMV rule, which splits the reduction over threads: it fills the device with
its multiply-adds, not its 1000 outputs (measured 5-10 us where one lane per output said 54-206 us).

Concurrent stage: each group is a chain ``launch, kernel, launch, kernel, ...`` on its own stream, and all
groups start together. Kernel ``i`` occupies a fraction ``f_i`` of the compute units for ``d_i`` seconds
(its *compute area* ``f_i * d_i``) and moves ``bytes_i`` (its *memory area* ``bytes_i / bandwidth``). The
device cannot do more than all of its compute units and all of its bandwidth at once, and no group runs faster
than alone, so (default ``contention="aggregate"``)::

    stage = max(slowest group alone, launch + sum of compute areas, launch + sum of memory areas)
            + (stage_sync + (groups - 1) * stream_overhead   if groups >= 2)

i.e. concurrent kernels share the device perfectly until together they need more than it has. Every term
grows with every kernel's FLOPs and bytes, so a stage is monotone in them. Consequences (tested):

* a stage is never faster than its slowest group alone;
* nor than the total work at full throughput, so two kernels that each fill the device gain nothing: the
  stage costs the sum of their times minus one launch plus the sync overheads, which exceed a launch;
* kernels that each fill a small part of the device overlap: the stage costs about the longest one plus the
  sync overheads.

``contention="fluid"`` instead simulates the groups in time: while running, kernel ``i`` wants ``f_i`` of the
compute units and ``m_i = (bytes_i / bandwidth) / d_i`` of the bandwidth, and all running kernels progress at
the common rate ``1 / max(1, sum f_i, sum m_i)``. It also sees that two long chains of large kernels collide
when their large kernels line up, but it is not monotone in FLOPs (a compute-heavier kernel draws less
bandwidth per second, which can let the other groups finish sooner), so it is not the default. Both modes
satisfy the bounds above.

Merge stage (``strategy="merge"``): the operators become one larger kernel: FLOPs and output elements summed,
the shared input read once (``bytes = sum bytes_i - (k - 1) * input bytes``), a single launch. Convolutions
with different kernel sizes are zero-padded to the largest one when lowered (``passes.merge``), so each one's
FLOPs are scaled by ``largest kernel area / its kernel area`` (a 1x1 merged with a 3x3 does 9x its work).

Wave stage (``strategy="wave"``, Rammer's wave fusion, ``passes.wave``): the groups' ``k``-th kernels share one
launch per wave, a barrier between waves, no stage sync: ``sum over waves of (launch + max(slowest kernel of the
wave, sum of its compute areas, sum of its memory areas))``.

Presets (``PRESETS``; "sustained" = datasheet x an efficiency a tuned TVM kernel plausibly reaches):

* ``h100``: H100 SXM5: 132 SMs x 2048 threads; FP32 (no tensor cores) 66.9 TFLOP/s x 0.6; HBM3 3.35 TB/s x 0.8.
* ``h200``: H200 SXM: the same compute; HBM3e 4.8 TB/s x 0.8.
* ``v100``: V100 SXM2: 80 SMs x 2048 threads; 15.7 TFLOP/s x 0.6; HBM2 900 GB/s x 0.8.
* ``cpu``: this build machine: 2 cores (AVX2-class), a naive 50 GFLOP/s per core, ~15 GB/s shared DRAM
  bandwidth, 1024 output elements per core to fill it; launch ~1 us (a packed-function call in the VM),
  stage_sync 8 us and 4 us per extra worker thread (thread hand-off). These are guesses, not measurements.

* ``h100-tvm`` / ``h200-tvm``: the same GPUs running **TVM's default (DLight) CUDA kernels**, fitted
  (``scripts/fit_sim_preset.py``, ``docs/sim_presets_fit.md``) to the device-clock times of every unit of seven
  measured tables (Inception-v3, GoogLeNet, ResNet-50 on an H100; Inception-v3, GoogLeNet, RandWire,
  NASNet-A-large on an H200, 2026-11-27): 14 % of the FP32 peak, the datasheet bandwidth, 1280 resident work
  items per SM (not fitted: see the script), a convolution's serial reduction at 50 ns per step plus 35 ns when
  its window is padded on both axes, and a matmul's reduction split over threads (above). They take 3-5x what
  ``h100`` says for the larger units; per table the median |log(simulated / measured)| of a unit drops from
  0.33-1.14 (a factor 1.4-3.1) to 0.03-0.13 (1.03-1.14), 0.05-0.13 with each model left out of the fit, and a
  table's units sum to 0.99-1.07 of it (without the reduction floor: 0.05-0.26 and 0.76-1.10, ResNet-50's and
  GoogLeNet's 3x3 convolutions 0.6x their time). For predicted latencies on the level of a default build, and
  unit costs of a model without a measured table; the schedules they lead to differ little from ``h100``'s
  (greedy and lios on Inception-v3, GoogLeNet and SqueezeNet the same), which stays the default.

GPU overheads: launch 2.5 us (H100/H200) / 4 us (V100) per kernel; a concurrent stage adds fork/join events
(3 us / 5 us) and 1.5 us / 2 us per extra stream. ``SimulatedDevice("h100", launch=1e-6)`` overrides a field;
``get_cost_model("sim:h100")`` builds a preset.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Sequence

from tvm_interop.runtime.errors import InteropError

from ..graph import Unit
from . import registry
from .base import CostModel
from .conv_geometry import conv_weight_shape, padded_on_both_axes, reduction_depth


@dataclass(frozen=True)
class DeviceSpec:
    """The parameters of a simulated device (see the module docstring for how they are used)."""

    name: str
    compute_units: int          # SMs (GPU) or cores (CPU)
    lanes_per_unit: int         # resident threads per SM / work items per core to fill it
    peak_flops: float           # sustained FLOP/s of the whole device
    bandwidth: float            # sustained memory bandwidth, bytes/s
    launch: float               # seconds per kernel launch
    stage_sync: float           # seconds per concurrent stage with >= 2 groups
    stream_overhead: float      # seconds per extra group (stream / worker) of a concurrent stage
    bw_fill: float = 0.25       # fraction of the device's lanes that already saturates the bandwidth
    description: str = ""
    contention: str = "aggregate"  # "aggregate" (bounds, monotone) or "fluid" (time simulation)
    # TVM's default CUDA kernels (module docstring): 0 / False for kernels that are not those
    reduction_step: float = 0.0    # seconds per step of a convolution's per-output serial reduction
    boundary_step: float = 0.0     # extra seconds per step when its window is padded along both axes
    gemv_split: bool = False       # a matmul's reduction is split over threads: one work item per multiply-add

    @property
    def capacity(self) -> int:
        return self.compute_units * self.lanes_per_unit


PRESETS: dict[str, DeviceSpec] = {
    "h100": DeviceSpec("h100", 132, 2048, 66.9e12 * 0.6, 3.35e12 * 0.8, 2.5e-6, 3.0e-6, 1.5e-6, 0.25,
                       "NVIDIA H100 SXM5 (simulated)"),
    "h200": DeviceSpec("h200", 132, 2048, 66.9e12 * 0.6, 4.8e12 * 0.8, 2.5e-6, 3.0e-6, 1.5e-6, 0.25,
                       "NVIDIA H200 SXM (simulated)"),
    "v100": DeviceSpec("v100", 80, 2048, 15.7e12 * 0.6, 900e9 * 0.8, 4.0e-6, 5.0e-6, 2.0e-6, 0.25,
                       "NVIDIA V100 SXM2 (simulated)"),
    "cpu": DeviceSpec("cpu", 2, 1024, 2 * 50e9, 15e9, 1.0e-6, 8.0e-6, 4.0e-6, 0.5,
                      "2-core AVX2-class CPU (simulated)"),
    # fitted to device-clock unit times of TVM's default CUDA kernels (scripts/fit_sim_preset.py)
    "h100-tvm": DeviceSpec("h100-tvm", 132, 1280, 66.9e12 * 0.14, 3.35e12, 2.5e-6, 3.0e-6, 1.5e-6, 0.25,
                           "NVIDIA H100 SXM5 running TVM's default CUDA kernels (fitted)",
                           reduction_step=50e-9, boundary_step=35e-9, gemv_split=True),
    "h200-tvm": DeviceSpec("h200-tvm", 132, 1280, 66.9e12 * 0.14, 4.8e12, 2.5e-6, 3.0e-6, 1.5e-6, 0.25,
                           "NVIDIA H200 SXM running TVM's default CUDA kernels (fitted)",
                           reduction_step=50e-9, boundary_step=35e-9, gemv_split=True),
}

# (duration at full rate, fill fraction, bandwidth fraction): what the fluid simulation needs of one kernel
_Kernel = tuple


class SimulatedDevice(CostModel):
    """Analytical device model; ``SimulatedDevice("h100")`` or ``SimulatedDevice(spec=DeviceSpec(...))``."""

    #: a unit's cost follows from its kind, shapes, FLOPs, bytes and attributes alone (names and kernels play no
    #: part), so a block's schedule may be reused for a structurally equal block (``schedulers.block_memo``)
    prices_by_structure = True

    def __init__(self, preset: str | None = "h100", spec: DeviceSpec | None = None, **overrides):
        if spec is None:
            key = (preset or "h100").lower()
            if key not in PRESETS:
                raise InteropError(f"unknown simulated device {preset!r}; presets: {', '.join(sorted(PRESETS))}")
            spec = PRESETS[key]
        if overrides:
            known = {f.name for f in fields(DeviceSpec)}
            bad = sorted(set(overrides) - known)
            if bad:
                raise InteropError(f"unknown simulated-device parameter(s) {bad}; known: {sorted(known)}")
            spec = replace(spec, **overrides)
        for attr in ("compute_units", "lanes_per_unit", "peak_flops", "bandwidth", "bw_fill"):
            if not getattr(spec, attr) > 0:
                raise InteropError(f"simulated device {spec.name!r}: {attr} must be > 0")
        for attr in ("launch", "stage_sync", "stream_overhead", "reduction_step", "boundary_step"):
            if getattr(spec, attr) < 0:
                raise InteropError(f"simulated device {spec.name!r}: {attr} must be >= 0")
        if spec.contention not in ("aggregate", "fluid"):
            raise InteropError(f"simulated device {spec.name!r}: contention must be 'aggregate' or 'fluid', "
                               f"got {spec.contention!r}")
        self.spec = spec
        extra = ",".join(f"{k}={overrides[k]}" for k in sorted(overrides))
        self.name = f"sim:{spec.name}" + (f"[{extra}]" if extra else "")
        self._units: dict[int, tuple] = {}     # id(unit) -> (unit, flops, bytes_moved, kernel)
        self._stages: dict[tuple, float] = {}  # (strategy, kernels per group) -> seconds

    # ------------------------------------------------------------------ one kernel
    def kernel(self, flops: float, nbytes: float, work_items: float, floor: float = 0.0) -> _Kernel:
        """(d, f, m): time at full rate without launch, fill fraction, bandwidth fraction. ``floor``: the least
        ``d`` whatever the roofline says (a convolution's serial reduction, :meth:`reduction_floor`)."""
        sp = self.spec
        f = min(1.0, max(1.0, work_items) / sp.capacity)
        g = min(1.0, f / sp.bw_fill)
        t_mem = max(0.0, nbytes) / (sp.bandwidth * g)
        d = max(max(0.0, flops) / (sp.peak_flops * f), t_mem, floor)
        m = (max(0.0, nbytes) / sp.bandwidth) / d if d > 0 else 0.0
        return (d, f, m)

    def _unit_kernel(self, unit: Unit) -> _Kernel:
        hit = self._units.get(id(unit))
        if hit is not None and hit[0] is unit and hit[1] == unit.flops and hit[2] == unit.bytes_moved:
            return hit[3]
        k = self.kernel(unit.flops, _unit_bytes(unit), self.work_items(unit), self.reduction_floor(unit))
        if len(self._units) > 500_000:
            self._units.clear()
        self._units[id(unit)] = (unit, unit.flops, unit.bytes_moved, k)
        return k

    def unit_latency(self, unit: Unit) -> float:
        return self.spec.launch + self._unit_kernel(unit)[0]

    def work_items(self, unit: Unit) -> float:
        """The lanes ``unit`` can fill: its output elements, or a matmul's multiply-adds when the device splits
        its reduction (``gemv_split``)."""
        if self.spec.gemv_split and unit.kind == "matmul" and unit.flops > 0:
            return max(_work_items(unit), unit.flops / 2.0)
        return _work_items(unit)

    def reduction_floor(self, unit: Unit) -> float:
        """Seconds a convolution's threads take to walk their reduction one step at a time (0 for any other unit
        and on a device without ``reduction_step``)."""
        steps = reduction_depth(unit)
        if not steps or not self.spec.reduction_step:
            return 0.0
        return self._walk(steps, padded_on_both_axes(unit))

    def _walk(self, steps: int, padded: bool) -> float:
        """Seconds to walk ``steps`` reduction steps, each testing the padding's bounds when ``padded``."""
        return steps * (self.spec.reduction_step + (self.spec.boundary_step if padded else 0.0))

    # ------------------------------------------------------------------ stages
    def stage_latency(self, groups: Sequence[Sequence[Unit]], strategy: str = "concurrent") -> float:
        groups = [g for g in groups if len(g)]
        if not groups:
            return 0.0
        if strategy == "merge":
            units = [u for g in groups for u in g]
            if len(units) == 1:
                return self.unit_latency(units[0])
            return self.spec.launch + self.merged_kernel(units)[0]
        if strategy == "wave":
            return self.wave_latency([[self._unit_kernel(u) for u in g] for g in groups])
        if strategy != "concurrent":
            raise InteropError(f"unknown stage strategy {strategy!r}")
        return self.stage_latency_tokens(tuple(tuple(self._unit_kernel(u) for u in g) for g in groups))

    # ------------------------------------------------------------------ hooks for the search schedulers
    # Optional, duck-typed (see passes.schedulers.stage_coster.StageCoster): a scheduler that finds them costs stages
    # from pre-computed per-unit tokens and prunes with a lower bound; any other cost model works without them.
    def unit_token(self, unit: Unit) -> _Kernel:
        """A hashable stand-in for ``unit`` in :meth:`stage_latency_tokens`."""
        return self._unit_kernel(unit)

    def stage_latency_tokens(self, groups: tuple) -> float:
        """``stage_latency`` of a concurrent stage given as groups of :meth:`unit_token` values."""
        key = tuple(sorted(groups))
        hit = self._stages.get(key)
        if hit is not None:
            return hit
        sp = self.spec
        if len(groups) == 1:
            t = sum(sp.launch + k[0] for k in groups[0])
        else:
            if sp.contention == "fluid":
                t = self._simulate(groups)
            else:
                slowest = max(sum(sp.launch + k[0] for k in g) for g in groups)
                ca = sum(k[1] * k[0] for g in groups for k in g)
                ma = sum(k[2] * k[0] for g in groups for k in g)
                t = max(slowest, sp.launch + (ca if ca > ma else ma))
            t += sp.stage_sync + (len(groups) - 1) * sp.stream_overhead
        if len(self._stages) > 500_000:
            self._stages.clear()
        self._stages[key] = t
        return t

    def wave_latency(self, groups: Sequence[Sequence[_Kernel]]) -> float:
        """A wave-fused stage: wave ``k`` runs the ``k``-th kernel of every group in one launch, sharing the
        device (no kernel faster than alone, no more than all compute units and bandwidth), and ends together
        (a barrier); no stage sync or extra streams. Costs ``sum over waves of (launch + max(slowest kernel,
        sum of compute areas, sum of memory areas))``."""
        t = 0.0
        for w in range(max(len(g) for g in groups)):
            ks = [g[w] for g in groups if w < len(g)]
            slowest = max(k[0] for k in ks)
            ca = sum(k[1] * k[0] for k in ks)
            ma = sum(k[2] * k[0] for k in ks)
            t += self.spec.launch + max(slowest, ca, ma)
        return t

    def unit_bound_terms(self, unit: Unit) -> tuple[float, float]:
        """(compute area, memory area) of ``unit``: seconds of the whole device's compute units / bandwidth."""
        d, f, m = self._unit_kernel(unit)
        return (f * d, m * d)

    def concurrent_bound_params(self) -> tuple[float, float, float]:
        """(lead, sync, per_stream): any concurrent stage of ``k >= 2`` groups costs at least
        ``max(slowest group alone, lead + max(sum of compute areas, sum of memory areas)) + sync
        + (k - 1) * per_stream`` (nothing runs before the first launch; the fluid model conserves areas)."""
        sp = self.spec
        return (sp.launch, sp.stage_sync, sp.stream_overhead)

    def merged_kernel(self, units: Sequence[Unit]) -> _Kernel:
        """One kernel doing the work of ``units``, which read the same input tensor (read once)."""
        flops = merged_flops(units)
        shared = units[0].inputs[0].nbytes if units[0].inputs else 0
        out_bytes = sum(t.nbytes for u in units for t in u.outputs)
        nbytes = max(float(out_bytes), sum(_unit_bytes(u) for u in units) - (len(units) - 1) * shared)
        return self.kernel(flops, nbytes, sum(self.work_items(u) for u in units), self._merged_floor(units))

    def _merged_floor(self, units: Sequence[Unit]) -> float:
        """The serial-reduction floor of the merged kernel: its members' windows are padded to the largest kernel
        height and width (as their FLOPs in :func:`merged_flops`), so each thread walks that window."""
        shapes = [conv_weight_shape(u) for u in units]
        if not self.spec.reduction_step or not all(shapes):
            return max(self.reduction_floor(u) for u in units)
        steps = max(w[1] for w in shapes) * max(w[2] for w in shapes) * max(w[3] for w in shapes)
        return self._walk(steps, any(padded_on_both_axes(u) for u in units))

    def _simulate(self, groups: tuple) -> float:
        """Fluid simulation of concurrent chains of kernels sharing compute units and bandwidth."""
        launch = self.spec.launch
        if len(groups) == 1:
            return sum(launch + k[0] for k in groups[0])
        # per group: index of current kernel, remaining launch seconds, remaining work (seconds at rate 1)
        idx = [0] * len(groups)
        rem_launch = [launch] * len(groups)
        rem_work = [g[0][0] for g in groups]
        active = list(range(len(groups)))
        t = 0.0
        while active:
            sf = sm = 0.0
            for gi in active:
                if rem_launch[gi] <= 0.0:
                    _, f, m = groups[gi][idx[gi]]
                    sf += f
                    sm += m
            rho = 1.0 / max(1.0, sf, sm)
            dt = float("inf")
            for gi in active:
                if rem_launch[gi] > 0.0:
                    dt = min(dt, rem_launch[gi])
                else:
                    dt = min(dt, rem_work[gi] / rho)
            t += dt
            nxt = []
            for gi in active:
                if rem_launch[gi] > 0.0:
                    rem_launch[gi] -= dt
                    if rem_launch[gi] <= 1e-15:
                        rem_launch[gi] = 0.0
                else:
                    rem_work[gi] -= dt * rho
                    if rem_work[gi] <= 1e-15 * max(1.0, t):
                        idx[gi] += 1
                        if idx[gi] == len(groups[gi]):
                            continue
                        rem_launch[gi] = launch
                        rem_work[gi] = groups[gi][idx[gi]][0]
                nxt.append(gi)
            active = nxt
        return t

    @property
    def device_fingerprint(self) -> str:
        return self.name

    def describe(self) -> str:
        sp = self.spec
        serial = (f", convolutions >= {sp.reduction_step * 1e9:.0f} ns (+{sp.boundary_step * 1e9:.0f} padded) per "
                  f"reduction step" if sp.reduction_step else "")
        return (f"{sp.description or sp.name}: {sp.compute_units} units x {sp.lanes_per_unit} lanes, "
                f"{sp.peak_flops / 1e12:.2f} TFLOP/s, {sp.bandwidth / 1e9:.0f} GB/s, launch {sp.launch * 1e6:.1f} us, "
                f"sync {sp.stage_sync * 1e6:.1f} us + {sp.stream_overhead * 1e6:.1f} us/stream{serial}")

    def __repr__(self) -> str:
        return f"SimulatedDevice({self.name!r})"


def _work_items(unit: Unit) -> float:
    w = sum(t.numel for t in unit.outputs)
    if w <= 0:
        w = max(1.0, _unit_bytes(unit) / 4.0)
    return float(w)


def merged_flops(units: Sequence[Unit]) -> float:
    """FLOPs of the merged kernel of ``units``: convolutions (``attrs["weight_shape"]`` = O, I, kh, kw) are padded
    to the largest kernel height and width, so each does ``flops * (kh_max * kw_max) / (kh * kw)``; units
    without a 4-d weight shape count their own FLOPs."""
    shapes = [u.attrs.get("weight_shape") for u in units]
    if not all(isinstance(w, (list, tuple)) and len(w) == 4 for w in shapes):
        return float(sum(u.flops for u in units))
    kh = max(int(w[2]) for w in shapes)
    kw = max(int(w[3]) for w in shapes)
    return float(sum(u.flops * (kh * kw) / max(1, int(w[2]) * int(w[3])) for u, w in zip(units, shapes)))


def _unit_bytes(unit: Unit) -> float:
    if unit.bytes_moved > 0:
        return float(unit.bytes_moved)
    return float(sum(t.nbytes for t in unit.inputs) + sum(t.nbytes for t in unit.outputs))


def _factory(preset: str | None = None, **kwargs) -> SimulatedDevice:
    return SimulatedDevice(preset or "h100", **kwargs)


registry.register("sim", _factory)
