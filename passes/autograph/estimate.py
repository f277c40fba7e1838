"""A fast latency estimate of a Relax dataflow graph *before* TVM fuses it: AutoGraph's mixed critical path.

Why an estimate: the substitution search visits thousands of rewritten graphs; legalizing and fusing each one with
TVM (seconds for a NASNet) and scheduling it would make the search take hours. Instead each graph's operator calls
are grouped the way TVM's ``FuseOps`` groups them — a convolution, matmul or pool absorbs the elementwise chain
after it (bias, ReLU, a branch ``add``) when the values in between have one use — and each group becomes one
estimated kernel (a :class:`~passes.graph.Unit`) priced by a simulated device. The estimate only ranks
candidates; the best few are then prepared by TVM, scheduled and priced by the real cost model
(:mod:`passes.autograph.search`), so a wrong guess here costs search quality, never correctness.

The *mixed critical path* (AutoGraph, AAAI'23) blends the two bounds on a multi-stream run::

    MCP = alpha * critical_path + (1 - alpha) * work

with ``critical_path`` the longest chain of kernel latencies (launch + duration) and ``work`` the sum of each
kernel's device area: launch plus the fraction of the device it fills times its duration (the time it would
take if kernels packed perfectly). ``alpha = 1`` trusts parallelism fully, ``alpha = 0`` not at all. Our
critical path lets the kernels on it share the device (:func:`shared_critical_path`): the paper's plain longest
path priced the two halves of a split device-filling convolution as running side by side at full speed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..cost.simulated import SimulatedDevice
from ..graph import TensorInfo, Unit

#: kernels that absorb the elementwise operators after them (TVM's OutEWiseFusable ops and the elementwise ones)
_ANCHORS = {"conv2d", "conv1d", "conv2d_transpose", "matmul", "linear", "dense", "max_pool2d", "avg_pool2d",
            "adaptive_avg_pool2d"}
_ELEMWISE = {"add", "subtract", "multiply", "divide", "relu", "sigmoid", "tanh", "clip", "maximum", "minimum",
             "gelu", "silu", "sqrt", "exp", "negative", "power", "rsqrt", "erf", "relu6", "leaky_relu"}
#: operators TVM turns into no kernel at all (views)
_FREE = {"reshape", "flatten", "squeeze", "expand_dims", "TupleGetItem"}
DEFAULT_ALPHA = 0.5


def short_op(op: str) -> str:
    """``relax.nn.conv2d`` -> ``conv2d``."""
    return op.rsplit(".", 1)[-1]


@dataclass
class Estimate:
    """Estimated kernels of a graph: ``units[g]`` is kernel ``g``; node ``k`` (program order) belongs to kernel
    ``group[k]``, reads the nodes ``reads[k]`` and starts its kernel when ``first[k]``."""

    units: list[Unit]
    group: list[int]
    reads: list[list[int]]
    first: list[bool]


def _numel(shape) -> int:
    n = 1
    for d in shape or ():
        n *= int(d)
    return n


def estimate_kernels(nodes: Sequence, param_shapes: dict[str, tuple]) -> Estimate:
    """Group ``nodes`` (``passes.substitutions.Node``: name, op, inputs, shape, dtype, flops) into estimated fused
    kernels. ``param_shapes`` gives the shapes of ``main``'s parameters, which nodes may read."""
    by_name = {n.name: n for n in nodes}
    uses: dict[str, int] = {}
    for n in nodes:
        for i in n.inputs:
            uses[i] = uses.get(i, 0) + 1
    group_of: dict[str, int] = {}
    members: list[list] = []
    absorbs: list[bool] = []
    for n in nodes:
        op = short_op(n.op)
        g = None
        if op in _ELEMWISE:
            for i in n.inputs:   # join a producer whose only reader is this operator and whose kernel absorbs it
                if i in group_of and uses.get(i, 0) == 1 and absorbs[group_of[i]]:
                    g = group_of[i]
                    break
        if g is None:
            g = len(members)
            members.append([])
            absorbs.append(op in _ANCHORS or op in _ELEMWISE)
        members[g].append(n)
        group_of[n.name] = g

    def shape_of(name: str):
        if name in by_name:
            return by_name[name].shape
        return param_shapes.get(name)

    units = []
    for g, ns in enumerate(members):
        inside = {n.name for n in ns}
        last = ns[-1]
        flops = float(sum(n.flops for n in ns))
        ins = []
        for n in ns:
            for i in n.inputs:
                if i not in inside:
                    s = shape_of(i)
                    if s is not None:
                        ins.append(TensorInfo(tuple(int(d) for d in s), n.dtype))
            weights = _weight_elements(n)
            if weights:
                ins.append(TensorInfo((weights,), n.dtype))
        if last.shape is not None:
            outs = [TensorInfo(tuple(int(d) for d in last.shape), last.dtype)]
        else:   # a tuple result (split): as large as what it reads
            outs = [TensorInfo((max(1, sum(t.numel for t in ins)),), last.dtype)]
        kind = short_op(ns[0].op)
        unit = Unit(name=last.name, kind=kind, inputs=ins, outputs=outs, flops=flops)
        if kind in _FREE and len(ns) == 1:
            unit.bytes_moved = 1.0   # a view: no kernel of its own, only the dependence
        units.append(unit)
    index = {n.name: k for k, n in enumerate(nodes)}
    seen: set[int] = set()
    first = []
    for n in nodes:
        first.append(group_of[n.name] not in seen)
        seen.add(group_of[n.name])
    return Estimate(units, [group_of[n.name] for n in nodes],
                    [[index[i] for i in n.inputs if i in index] for n in nodes], first)


def _weight_elements(node) -> int:
    """Elements of a convolution's or matmul's weight (a constant, so not among the node's inputs), from its FLOPs:
    ``flops = 2 * weight * (output elements / output channels)``."""
    op = short_op(node.op)
    if op not in ("conv2d", "conv1d", "conv2d_transpose", "matmul", "linear", "dense") or not node.shape:
        return 0
    channels = int(node.shape[1] if op.startswith("conv") else node.shape[-1])
    per_weight = _numel(node.shape) // max(1, channels)
    return int(node.flops // max(1, 2 * per_weight))


def mixed_critical_path(est: Estimate, device: SimulatedDevice, alpha: float = DEFAULT_ALPHA) -> float:
    """AutoGraph's mixed critical-path cost of ``est`` on ``device`` (seconds; see the module docstring)."""
    launch = device.spec.launch
    latency, demand, work = [], [], 0.0
    for u in est.units:
        if u.kind in _FREE and u.bytes_moved == 1.0:
            latency.append(0.0)
            demand.append(0.0)
            continue
        d, f, m = device.unit_token(u)
        latency.append(launch + d)
        demand.append(max(f, m))
        compute_area, memory_area = device.unit_bound_terms(u)
        work += launch + max(compute_area, memory_area)
    critical = shared_critical_path(est, latency, demand)
    return alpha * critical + (1.0 - alpha) * work


def shared_critical_path(est: Estimate, latency: Sequence[float], demand: Sequence[float]) -> float:
    """The critical path when the kernels on it share one device: every kernel starts as soon as its inputs are
    done (unlimited streams), and the running kernels progress at ``1 / max(1, sum of their demands)`` (the
    simulated device's fluid sharing; a kernel's demand is the larger of its compute-unit and bandwidth shares).

    Why not the plain longest path: it lets two halves of a kernel that already fills the device run side by side
    at full speed, so splitting such a kernel always looked like a gain (it shortened the path, work unchanged),
    and the search chased splits the scheduler then priced as losses. Sharing the device removes that illusion
    and keeps what is real: kernels that each fill a small part of the device still overlap fully."""
    n = len(est.units)
    deps: list[set[int]] = [set() for _ in range(n)]
    for k, reads in enumerate(est.reads):
        g = est.group[k]
        for i in reads:   # an absorbed branch ``add`` makes its kernel wait for the other input too
            if est.group[i] != g:
                deps[g].add(est.group[i])
    users: list[list[int]] = [[] for _ in range(n)]
    for g, ds in enumerate(deps):
        for d in ds:
            users[d].append(g)
    waiting = [len(ds) for ds in deps]
    remaining = list(latency)
    running = [g for g in range(n) if not waiting[g]]
    now, done = 0.0, 0
    while running:
        rate = 1.0 / max(1.0, sum(demand[g] for g in running))
        step = min(remaining[g] for g in running) / rate
        now += step
        finished = []
        for g in running:
            remaining[g] -= step * rate
            if remaining[g] <= 1e-15:
                finished.append(g)
        running = [g for g in running if g not in finished]
        for g in finished:
            done += 1
            for u in users[g]:
                waiting[u] -= 1
                if not waiting[u]:
                    running.append(u)
    if done != n:
        raise ValueError("estimate: the kernels' dependences form a cycle")
    return now
