"""The execution plan: what a runtime executor needs to run a schedule, as plain JSON-able data.

A plan lists kernel calls (kernel symbol, argument slots, output buffers), the stages and groups to run them
in, the dependencies between calls (for dependency mode) and a buffer-to-storage assignment that is safe under
concurrency. It is produced at compile time (``passes.lower.make_plan``), embedded in an exported ``.so`` and read
back by ``runtime.load`` — so it must not depend on anything but the standard library.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterator

from .errors import ExportError, InputError

PLAN_FORMAT = "tvm-interop-plan"
PLAN_VERSION = 1


@dataclass(frozen=True)
class Ref:
    """Where a value comes from: a model input, a constant, an output of a unit, or a tuple of those."""

    kind: str  # "input" | "const" | "unit" | "tuple"
    index: int = 0
    unit: str = ""
    items: tuple["Ref", ...] = ()

    @staticmethod
    def input(i: int) -> "Ref":
        return Ref("input", i)

    @staticmethod
    def const(i: int) -> "Ref":
        return Ref("const", i)

    @staticmethod
    def unit(name: str, output: int = 0) -> "Ref":  # noqa: D401 - constructor
        return Ref("unit", output, name)

    @staticmethod
    def tuple(items) -> "Ref":
        return Ref("tuple", 0, "", tuple(items))

    def item(self, i: int) -> "Ref":
        if self.kind != "tuple":
            raise ExportError(f"tuple index {i} taken from a non-tuple value {self.describe()}")
        return self.items[i]

    def flatten(self) -> list["Ref"]:
        if self.kind == "tuple":
            out: list[Ref] = []
            for it in self.items:
                out.extend(it.flatten())
            return out
        return [self]

    def describe(self) -> str:
        if self.kind == "unit":
            return self.unit if self.index == 0 else f"{self.unit}.{self.index}"
        if self.kind == "tuple":
            return "(" + ", ".join(i.describe() for i in self.items) + ")"
        return f"{self.kind}{self.index}"


@dataclass
class Call:
    """One kernel launch: ``func(*args, *outs)``. Args are slots ``["i", k]``, ``["c", k]`` or ``["b", k]``."""

    unit: str
    func: str
    args: list[list]
    outs: list[int]


@dataclass
class ExecutionPlan:
    inputs: list[dict]                     # [{"name", "shape", "dtype"}]
    num_constants: int
    buffers: list[dict]                    # [{"shape", "dtype", "storage"}]
    calls: list[Call]
    stages: list[list[list[int]]]          # stage -> groups -> call indices (run in order)
    deps: list[list[int]]                  # call index -> producer call indices
    output: object                         # slot, or nested list of slots (a tuple)
    output_is_tuple: bool = False
    meta: dict = field(default_factory=dict)  # model name, scheduler, target, schedule summary

    @property
    def num_storages(self) -> int:
        return 1 + max((b["storage"] for b in self.buffers), default=-1)

    def storage_bytes(self) -> int:
        return sum(storage_sizes(self.buffers, [b["storage"] for b in self.buffers]).values())

    def max_concurrency(self) -> int:
        return max((len(s) for s in self.stages), default=1)

    def iter_calls(self) -> Iterator[int]:
        for st in self.stages:
            for g in st:
                yield from g

    def to_json(self) -> dict:
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "inputs": self.inputs,
            "num_constants": self.num_constants,
            "buffers": self.buffers,
            "calls": [[c.unit, c.func, c.args, c.outs] for c in self.calls],
            "stages": self.stages,
            "deps": self.deps,
            "output": self.output,
            "output_is_tuple": self.output_is_tuple,
            "meta": self.meta,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    @staticmethod
    def loads(text: str) -> "ExecutionPlan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ExportError(f"embedded execution plan is not valid JSON: {e}") from None
        if not isinstance(d, dict) or d.get("format") != PLAN_FORMAT:
            raise ExportError("the module carries no tvm-interop execution plan")
        if d.get("version") != PLAN_VERSION:
            raise ExportError(f"execution plan version {d.get('version')} is not supported (expected {PLAN_VERSION})")
        return ExecutionPlan(
            inputs=d["inputs"],
            num_constants=int(d["num_constants"]),
            buffers=d["buffers"],
            calls=[Call(u, f, a, o) for u, f, a, o in d["calls"]],
            stages=d["stages"],
            deps=d["deps"],
            output=d["output"],
            output_is_tuple=bool(d.get("output_is_tuple")),
            meta=d.get("meta", {}),
        )


def check_run_inputs(spec: list[dict], inputs) -> None:
    """Refuse inputs that do not match the plan's input spec (count, array-ness, dtype, shape) with one message
    naming the input. Why here: both executors (the VM and the worker threads) take the same inputs, and a wrong
    one would otherwise fail deep in a kernel call, or be read as if it had the compiled shape."""
    if len(inputs) != len(spec):
        raise InputError(f"model takes {len(spec)} input(s) ({', '.join(s['name'] for s in spec)}), got {len(inputs)}")
    for x, s in zip(inputs, spec):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            hint = " (pass the arrays as separate arguments: run(*arrays))" if isinstance(x, (list, tuple)) else ""
            raise InputError(f"input {s['name']!r} must be a numpy array or a TVM tensor, got "
                             f"{type(x).__name__}{hint}")
        if tuple(x.shape) != tuple(s["shape"]) or str(x.dtype) != s["dtype"]:
            raise InputError(
                f"input {s['name']!r} must be {s['dtype']}{list(s['shape'])}, got {x.dtype}{list(x.shape)} "
                "(the model was compiled for fixed shapes and batch size)")


def device_tensors(inputs, dev) -> list:
    """The inputs as TVM tensors on ``dev``: numpy arrays copied there, tensors passed through. One place for
    ``run``, ``benchmark`` and the candidate picker, which time a model with its inputs already in place."""
    import numpy as np
    import tvm

    return [x if isinstance(x, tvm.runtime.Tensor) else tvm.runtime.tensor(np.ascontiguousarray(x), dev)
            for x in inputs]


def tensor_nbytes(shape, dtype: str) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    bits = int("".join(ch for ch in dtype if ch.isdigit()) or 32)
    return n * max(1, bits // 8)


def storage_sizes(buffers: list[dict], storage_ids: list[int]) -> dict[int, int]:
    """Bytes of each storage: its largest buffer (``storage_ids[b]`` holds buffer ``b``)."""
    sizes: dict[int, int] = {}
    for buf, sid in zip(buffers, storage_ids):
        sizes[sid] = max(sizes.get(sid, 0), tensor_nbytes(buf["shape"], buf["dtype"]))
    return sizes


def assign_storage(buffers: list[dict], live: list[tuple[int, int]]) -> None:
    """Give buffers storage ids so that two buffers share storage only if their live intervals are disjoint.

    ``live[b] = (first, last)`` in units of *stages* (inclusive). Intervals at stage granularity are what makes
    this safe under concurrency: everything in a stage may run at once, so a buffer read anywhere in stage k is
    live for the whole of stage k. A storage is as large as its largest buffer, and each buffer is a view of it
    from its start (``runtime.thread_executor``). Two assignments are made and the smaller one is kept:
    buffers of one shape and dtype sharing (greedy by start time, optimal within each class), and any buffers
    sharing (best fit by size). Why both: NASNet-A-large's many shapes left the first little to share — 158 MiB
    for its sequential program on worker threads, where TVM's own plan for the VM needs 43 MiB.
    """
    sizes = [tensor_nbytes(buf["shape"], buf["dtype"]) for buf in buffers]
    options = [_same_shape_storage(buffers, live), _best_fit_storage(sizes, live)]
    for buf, sid in zip(buffers, min(options, key=lambda ids: sum(storage_sizes(buffers, ids).values()))):
        buf["storage"] = sid


def _same_shape_storage(buffers: list[dict], live: list[tuple[int, int]]) -> list[int]:
    """Storage ids shared only within a (shape, dtype) class: greedy by start time."""
    ids = [0] * len(buffers)
    order = sorted(range(len(buffers)), key=lambda b: (live[b][0], live[b][1], b))
    free: dict[tuple, list[tuple[int, int]]] = {}  # key -> [(last_stage, storage)]
    next_id = 0
    for b in order:
        key = (tuple(buffers[b]["shape"]), buffers[b]["dtype"])
        pool = free.setdefault(key, [])
        start, end = live[b]
        chosen = None
        for k, (last, sid) in enumerate(pool):
            if last < start:
                chosen = k
                break
        if chosen is None:
            sid = next_id
            next_id += 1
            pool.append((end, sid))
        else:
            sid = pool[chosen][1]
            pool[chosen] = (end, sid)
        ids[b] = sid
    return ids


def _best_fit_storage(sizes: list[int], live: list[tuple[int, int]]) -> list[int]:
    """Storage ids shared by any buffers with disjoint intervals, by start time: the smallest free storage that
    holds the buffer, else the largest free one (which grows), else a new one."""
    ids = [0] * len(sizes)
    order = sorted(range(len(sizes)), key=lambda b: (live[b][0], live[b][1], b))
    storages: list[list[int]] = []   # [last stage, size, id]
    for b in order:
        start, end = live[b]
        free = [st for st in storages if st[0] < start]
        fits = [st for st in free if st[1] >= sizes[b]]
        if fits:
            st = min(fits, key=lambda x: (x[1], x[2]))
        elif free:
            st = max(free, key=lambda x: (x[1], -x[2]))
        else:
            st = [end, 0, len(storages)]
            storages.append(st)
        st[0], st[1] = end, max(st[1], sizes[b])
        ids[b] = st[2]
    return ids
