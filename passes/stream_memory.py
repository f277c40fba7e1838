"""Memory safety of stream-lowered programs, and their activation memory.

:func:`check_stream_memory_safety` reads a **memory-planned** module — the IR the build compiles, as
:mod:`passes.as_built` produces it inside the build (TVM's pipeline for the target up to ``KillAfterLastUse``) —
and proves, per Relax function, that the stream program never lets two kernels that may
run at the same time touch the same memory. It knows nothing about how the program was lowered: it replays the
bindings in order, tracking

* the current stream (``runtime.Device_SetStream``; at entry: the caller's stream, named ``main``; a stream is
  identified by where its handle comes from: ``streams[k]`` of the stream-tuple parameter, the result of the
  current-stream query, a ``StreamCreate`` result, or a literal handle, 0 being the caller's stream);
* a **vector clock** per stream: ``runtime.Device_StreamSyncFromTo(dev, a, b)`` makes everything issued to ``a``
  so far happen before everything issued to ``b`` afterwards; kernels on one stream are ordered;
* every kernel launch (a call to a device PrimFunc; host functions and packed calls such as the keep-alive
  calls are uses, not device work) with the tensors it touches, each tensor resolved through aliases and tuples to its storage
  (``R.memory.alloc_storage``) and byte range (``R.memory.alloc_tensor`` offset and size);
* into CUDA graphs: the storage function of ``get_cached_alloc`` and the captured region of ``run_or_capture``
  (the functions TVM's RewriteCUDAGraph lifts out) are replayed inline where they are called.

Checks (each violation names both tensors, their kernels and streams):

``storage``  two tensors with overlapping bytes of one storage: every access of the earlier one must happen
             before every access of the later one.
``pool``     the VM's pooled allocator hands a freed storage to the next allocation of the same rounded size: a
             storage allocated after another one died (its tensors and itself last used or killed —
             ``KillAfterLastUse``'s ``kill_*`` calls are uses — in program order) is treated as possibly the
             same memory, with the same rule. Storages of a CUDA graph (``get_cached_alloc``) live as long as
             the VM and never return to the pool.
``data``     every access of a tensor happens after its first access (the kernel that writes it) — and after the
             caller's stream at entry for parameters: a missing event is reported even when memory is not reused.
``exit``     every kernel happens before the function returns on the caller's stream (the outputs are complete,
             and storages released at exit are not reused while a stream still runs).
``workspace`` two launches of kernels that allocate a global buffer of their own (a scheduled kernel's
             intermediate, e.g. a reduction factored through global memory): TVM's host code takes it from a
             per-thread workspace pool and gives it back as soon as the launch is issued, so the next such
             kernel gets the same memory; the two launches must be ordered. (No kernel of today's schedules
             allocates one; a schedule rule or tuned kernel that did would race on streams without this.)

:func:`activation_memory` sums the ``alloc_storage`` sizes of a planned function
(:func:`passes.as_built.memory_report` compares the scheduled program with plain TVM's sequential one).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from tvm_interop.runtime.cuda import CURRENT_STREAM_FUNC, MAIN_FUNC
from tvm_interop.runtime.errors import InteropError

MAIN_STREAM = "main"
GET_CACHED_ALLOC = "vm.builtin.cuda_graph.get_cached_alloc"
# Extern calls that are device work (``passes.offload``'s library units) and the reused-event sync of the lowering.
LIBRARY_KERNELS = ("tvm_interop.cudnn.conv2d", "tvm_interop.cublas.dense")
EVENT_SYNC_FUNC = "tvm_interop.cuda.event_sync"
RUN_OR_CAPTURE = "vm.builtin.cuda_graph.run_or_capture"
PAGE = 4096  # the pooled allocator's rounding


# ---------------------------------------------------------------------------------------------- report
@dataclass
class Violation:
    kind: str          # storage | pool | data | exit
    function: str
    first: str         # tensor (or kernel, for "exit")
    second: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.function}: {self.detail}"


@dataclass
class MemorySafetyReport:
    violations: list[Violation] = field(default_factory=list)
    functions: dict[str, dict] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def raise_if_unsafe(self) -> None:
        if self.violations:
            lines = "\n  ".join(str(v) for v in self.violations[:10])
            more = f"\n  ... and {len(self.violations) - 10} more" if len(self.violations) > 10 else ""
            raise InteropError(f"stream program is not memory-safe ({len(self.violations)} violation(s)):\n  "
                               f"{lines}{more}")

    def summary(self) -> str:
        if self.ok:
            return "memory-safe: " + (", ".join(f"{n} ({d['kernels']} kernels on {d['streams']} stream(s), "
                                                 f"{d['storages']} storages)"
                                                 for n, d in self.functions.items() if d["kernels"]) or "no kernels")
        return f"{len(self.violations)} violation(s); first: {self.violations[0]}"


# ---------------------------------------------------------------------------------------------- replay
@dataclass
class _Tensor:
    name: str
    storage: object       # storage key
    offset: int
    nbytes: int
    accesses: list = field(default_factory=list)   # [(stream, idx, vc, kernel, binding index)]
    last_use: int = -1
    is_param: bool = False
    aliases: list = field(default_factory=list)

    @property
    def label(self) -> str:
        named = [a for a in self.aliases if not a.startswith(("alloc", "gv"))]
        return f"{named[0]} ({self.name})" if named else self.name


@dataclass
class _Storage:
    key: object
    nbytes: int
    alloc_at: int
    tensors: list = field(default_factory=list)
    last_use: int = -1
    static: bool = False   # cached for the life of the VM (CUDA-graph storage): never back in the pool


class _Tup:
    def __init__(self, items):
        self.items = list(items)


class _StreamTuple:
    def __init__(self, name):
        self.name = name


class _Stream:
    def __init__(self, key):
        self.key = key


def _nbytes_of(ty) -> int:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return 0
    n = 1
    for d in ty.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            return 0
        n *= int(d)
    dt = tvm.DataType(str(ty.dtype))
    return n * max(1, (dt.bits * dt.lanes + 7) // 8)


def _int(e, default=0) -> int:
    if isinstance(e, tvm.tirx.IntImm):
        return int(e.value)
    v = getattr(e, "value", None)
    if isinstance(v, tvm.tirx.IntImm):
        return int(v.value)
    if isinstance(v, int):
        return v
    return default


class _Replay:
    def __init__(self, mod: tvm.IRModule, name: str, func: relax.Function):
        self.mod = mod
        self.fname = name
        self.func = func
        self.env: dict = {}
        self.tensors: list[_Tensor] = []
        self.storages: dict[object, _Storage] = {}
        self.cur = MAIN_STREAM
        self.count: dict[object, int] = {MAIN_STREAM: 1}   # op 0 of main: the caller's work before entry
        self.vc: dict[object, dict] = {MAIN_STREAM: {}}
        self.kernels = 0
        self.streams_seen = {MAIN_STREAM}
        self.pos = 0
        self.workspace_launches: list[tuple] = []   # (stream, index, clock, kernel, pos, buffers)
        self._workspaces: dict[str, list[str]] = {}

    # ---------------------------------------------------------------- values
    def value_of(self, e):
        if isinstance(e, relax.Var):
            return self.env.get(e)
        if isinstance(e, relax.Tuple):
            return _Tup([self.value_of(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            base = self.value_of(e.tuple_value)
            if isinstance(base, _Tup):
                return base.items[int(e.index)]
            if isinstance(base, _StreamTuple):
                return _Stream(("streams", base.name, int(e.index)))
            return None
        if isinstance(e, tvm.tirx.IntImm) or isinstance(getattr(e, "value", None), tvm.tirx.IntImm):
            return _Stream(MAIN_STREAM if _int(e) == 0 else ("literal", _int(e)))
        return None

    def tensors_in(self, v) -> list[_Tensor]:
        if isinstance(v, _Tensor):
            return [v]
        if isinstance(v, _Tup):
            out = []
            for it in v.items:
                out.extend(self.tensors_in(it))
            return out
        return []

    def stream_key(self, e):
        v = self.value_of(e)
        if isinstance(v, _Stream):
            return v.key
        return ("unknown", str(e))

    def new_tensor(self, name, storage_key, offset, nbytes, is_param=False) -> _Tensor:
        t = _Tensor(name, storage_key, offset, nbytes, is_param=is_param)
        self.tensors.append(t)
        if storage_key in self.storages:
            self.storages[storage_key].tensors.append(t)
        return t

    # ---------------------------------------------------------------- events
    def issue(self, kernel: str, args) -> None:
        s = self.cur
        self.streams_seen.add(s)
        n = self.count.get(s, 0)
        snap = dict(self.vc.get(s, {}))
        snap[s] = n
        for t in {id(t): t for a in args for t in self.tensors_in(self.value_of(a))}.values():
            t.accesses.append((s, n, snap, kernel, self.pos))
        buffers = self.workspaces(kernel)
        if buffers:
            self.workspace_launches.append((s, n, snap, kernel, self.pos, buffers))
        self.count[s] = n + 1
        self.kernels += 1

    def workspaces(self, kernel: str) -> list[str]:
        """The global buffers ``kernel`` allocates for itself (none for library calls and unknown names)."""
        if kernel not in self._workspaces:
            gv = next((gv for gv in self.mod.get_global_vars() if gv.name_hint == kernel), None)
            func = self.mod[gv] if gv is not None else None
            self._workspaces[kernel] = global_workspaces(func) if isinstance(func, tvm.tirx.PrimFunc) else []
        return self._workspaces[kernel]

    def sync(self, src, dst) -> None:
        merged = dict(self.vc.get(dst, {}))
        for k, v in self.vc.get(src, {}).items():
            if v > merged.get(k, 0):
                merged[k] = v
        merged[src] = max(merged.get(src, 0), self.count.get(src, 0))
        self.vc[dst] = merged

    def use(self, value_expr, pos) -> None:
        for v in relax.analysis.free_vars(value_expr):
            val = self.env.get(v)
            for t in self.tensors_in(val):
                t.last_use = max(t.last_use, pos)
            if isinstance(val, _Storage):
                val.last_use = max(val.last_use, pos)

    # ---------------------------------------------------------------- walk
    def run(self) -> None:
        for p in self.func.params:
            ty = p.ty
            if isinstance(ty, relax.TupleType) and all(isinstance(f, tvm.ir.PrimType) for f in ty.fields):
                self.env[p] = _StreamTuple(p.name)
            elif isinstance(ty, relax.TensorType):
                key = ("param", p.name)
                t = self.new_tensor(p.name, key, 0, _nbytes_of(ty), is_param=True)
                t.accesses.append((MAIN_STREAM, 0, {MAIN_STREAM: 0}, "<caller>", -1))
                self.env[p] = t
        body = self.func.body
        for block in body.blocks:
            for b in block.bindings:
                self.binding(b)
                self.pos += 1
        self.end_pos = self.pos
        self.use(body.body, self.pos)
        for t in self.tensors_in(self.value_of(body.body)):
            t.last_use = 1 << 60

    def binding(self, b) -> None:
        pos = self.pos
        var, value = b.var, b.value
        if not isinstance(b, relax.VarBinding):
            return
        self.use(value, pos)
        if isinstance(value, (relax.Var, relax.Tuple, relax.TupleGetItem)):
            v = self.value_of(value)
            self.env[var] = v
            if isinstance(v, _Tensor):
                v.aliases.append(var.name)
            return
        if not isinstance(value, relax.Call):
            return
        op = value.op
        if isinstance(op, tvm.ir.Op):
            name = op.name
            if name == "relax.memory.alloc_storage":
                size = _int(value.args[0].values[0]) if isinstance(value.args[0], relax.ShapeExpr) else 0
                st = _Storage(("storage", var.name, pos), size, pos)
                self.storages[st.key] = st
                self.env[var] = st
            elif name == "relax.memory.alloc_tensor":
                st = self.env.get(value.args[0])
                key = st.key if isinstance(st, _Storage) else ("unknown-storage", pos)
                if isinstance(st, _Storage):
                    st.last_use = max(st.last_use, pos)
                self.env[var] = self.new_tensor(var.name, key, _int(value.args[1]), _nbytes_of(var.ty))
            elif name == "relax.builtin.alloc_tensor":
                self.env[var] = self.new_tensor(var.name, ("builtin", var.name, pos), 0, _nbytes_of(var.ty))
            elif name in ("relax.reshape", "relax.memory.view", "relax.memory.ensure_zero_offset"):
                self.env[var] = self.value_of(value.args[0])
            elif name == "relax.call_builtin_with_ctx" and isinstance(value.args[0], relax.ExternFunc):
                self.builtin(var, str(value.args[0].global_symbol), value.args[1])
            elif name == "relax.call_tir":
                raise InteropError("check_stream_memory_safety needs the memory-planned module (call_tir left: check "
                                   "tvm_interop.passes.as_built.as_built_ir(mod, target))")
            return
        if isinstance(op, relax.ExternFunc):
            sym = str(op.global_symbol)
            if sym == "runtime.Device_SetStream":
                self.cur = self.stream_key(value.args[1])
            elif sym == "runtime.Device_StreamSyncFromTo":
                self.sync(self.stream_key(value.args[1]), self.stream_key(value.args[2]))
            elif sym == EVENT_SYNC_FUNC:   # (events, k, src, dst): the reused-event form of the same sync
                self.sync(self.stream_key(value.args[2]), self.stream_key(value.args[3]))
            elif sym in LIBRARY_KERNELS:   # a cuDNN / cuBLAS unit: device work on the current stream
                self.issue(sym, value.args)
            elif sym == "runtime.Device_StreamCreate":
                self.env[var] = _Stream(("created", var.name, pos))
            return
        if isinstance(op, relax.GlobalVar):
            try:
                callee = self.mod[op]
            except Exception:  # noqa: BLE001 - not in the module
                callee = None
            if isinstance(callee, tvm.tirx.PrimFunc):
                attrs = callee.attrs or {}
                if CURRENT_STREAM_FUNC in op.name_hint:
                    self.env[var] = _Stream(MAIN_STREAM)
                elif "tirx.is_host_func" in attrs and bool(attrs["tirx.is_host_func"]):
                    return  # host work (keep-alive etc.): a use, not device work
                else:
                    self.issue(op.name_hint, value.args)
            return

    def builtin(self, var, symbol: str, args) -> None:
        """The two VM builtins through which TVM's RewriteCUDAGraph runs a program: ``get_cached_alloc(f, k)``
        (``f`` allocates the static storages once per VM) and ``run_or_capture(f, args, k)`` (``f`` is the
        captured region). Both are replayed inline, so the check follows the kernels into the graph."""
        fields = list(args.fields) if isinstance(args, relax.Tuple) else []
        if not fields or not isinstance(fields[0], relax.GlobalVar):
            return
        callee = self.mod[fields[0]] if fields[0] in self.mod.get_global_vars() else None
        if not isinstance(callee, relax.Function):
            return
        if symbol == GET_CACHED_ALLOC:
            first = len(self.storages)
            result = self.inline(callee, [])
            for st in list(self.storages.values())[first:]:
                st.static = True
            self.env[var] = result
        elif symbol == RUN_OR_CAPTURE and len(fields) >= 2:
            inner = fields[1]
            call_args = list(inner.fields) if isinstance(inner, relax.Tuple) else [inner]
            self.env[var] = self.inline(callee, [self.value_of(a) for a in call_args])

    def inline(self, func: relax.Function, arg_values: list):
        """Replay ``func``'s bindings here (same streams, clocks and positions) with its parameters bound to
        ``arg_values``; returns the value of its result."""
        for p, v in zip(func.params, arg_values):
            self.env[p] = v
        body = func.body
        for block in body.blocks:
            for b in block.bindings:
                self.pos += 1
                self.binding(b)
        self.use(body.body, self.pos)
        return self.value_of(body.body)

    # ---------------------------------------------------------------- checks
    def check(self, pool: bool = True) -> list[Violation]:
        out: list[Violation] = []
        fn = self.fname

        def hb(a, b) -> bool:
            return b[2].get(a[0], 0) > a[1]

        def where(acc) -> str:
            return f"{acc[3]} on stream {_sname(acc[0])}"

        def ordered(t1: _Tensor, t2: _Tensor, kind: str) -> None:
            if not t1.accesses or not t2.accesses:
                return
            a_first, b_first = min(t1.accesses, key=lambda a: a[4]), min(t2.accesses, key=lambda a: a[4])
            if b_first[4] < a_first[4]:
                t1, t2 = t2, t1
            for a in t1.accesses:
                for b in t2.accesses:
                    if not hb(a, b):
                        out.append(Violation(kind, fn, t1.label, t2.label,
                                             f"{t1.label} ({where(a)}) and {t2.label} ({where(b)}) share "
                                             f"{'a storage' if kind == 'storage' else 'pooled memory'} but are not "
                                             f"ordered by stream order or events"))
                        return

        # storage sharing
        for st in self.storages.values():
            ts = st.tensors
            for i in range(len(ts)):
                for j in range(i + 1, len(ts)):
                    a, b = ts[i], ts[j]
                    if a.offset < b.offset + max(1, b.nbytes) and b.offset < a.offset + max(1, a.nbytes):
                        ordered(a, b, "storage")
        # pool reuse
        if pool:
            sts = sorted(self.storages.values(), key=lambda s: s.alloc_at)
            death = {}
            for st in sts:
                death[st.key] = max([st.last_use] + [t.last_use for t in st.tensors])
            for s1 in sts:
                for s2 in sts:
                    if s1.static or s2.static:
                        continue
                    if s2.alloc_at > death[s1.key] and _rounded(s1.nbytes) == _rounded(s2.nbytes):
                        for a in s1.tensors:
                            for b in s2.tensors:
                                ordered(a, b, "pool")
        # data: every access after the first (the write, or the caller for parameters)
        for t in self.tensors:
            if len(t.accesses) < 2:
                continue
            acc = sorted(t.accesses, key=lambda a: a[4])
            first = acc[0]
            for a in acc[1:]:
                if not hb(first, a):
                    out.append(Violation("data", fn, t.label, a[3],
                                         f"{t.label} is read by {where(a)} without an event after "
                                         f"{'the caller (entry)' if first[3] == '<caller>' else where(first)}"))
                    break
        # workspace: kernels with their own global buffer take the same pooled memory, so they must be ordered
        launches = self.workspace_launches
        for i in range(len(launches)):
            for j in range(i + 1, len(launches)):
                a, b = launches[i], launches[j]
                if not hb(a, b):
                    out.append(Violation("workspace", fn, a[3], b[3],
                                         f"{where(a)} and {where(b)} each allocate a global buffer ({a[5][0]}, "
                                         f"{b[5][0]}) from TVM's workspace pool, which can hand both the same memory, "
                                         f"but are not ordered by stream order or events"))
        # exit: everything joined into the caller's stream
        end = (None, None, dict(self.vc.get(MAIN_STREAM, {})))
        end[2][MAIN_STREAM] = self.count.get(MAIN_STREAM, 0)
        missing = {}
        for t in self.tensors:
            for a in t.accesses:
                if a[3] != "<caller>" and not hb(a, end):
                    missing.setdefault(a[0], a)
        for s, a in missing.items():
            out.append(Violation("exit", fn, a[3], "return",
                                 f"work on stream {_sname(s)} (e.g. {a[3]}) is not joined into the caller's stream "
                                 f"before the function returns"))
        # de-duplicate (a pair can be found by several rules)
        seen, uniq = set(), []
        for v in out:
            k = (v.kind, v.first, v.second)
            if k not in seen:
                seen.add(k)
                uniq.append(v)
        return uniq


def _rounded(n: int) -> int:
    return ((max(1, n) + PAGE - 1) // PAGE) * PAGE


def _sname(key) -> str:
    if key == MAIN_STREAM:
        return "main"
    if isinstance(key, tuple) and key and key[0] == "streams":
        return f"streams[{key[2]}]"
    if isinstance(key, tuple) and key and key[0] == "created":
        return key[1]
    return str(key)


def check_stream_memory_safety(mod: tvm.IRModule, functions=None, pool: bool = True) -> MemorySafetyReport:
    """Check every Relax function of a memory-planned module (or those named in ``functions``); see the module
    docstring. Returns a report (``.ok``, ``.violations``, ``.raise_if_unsafe()``)."""
    report = MemorySafetyReport()
    lifted = lifted_functions(mod)
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or gv.name_hint in lifted:
            continue
        if functions is not None and gv.name_hint not in functions:
            continue
        r = _Replay(mod, gv.name_hint, func)
        r.run()
        report.violations.extend(r.check(pool=pool))
        report.functions[gv.name_hint] = {"kernels": r.kernels, "streams": len(r.streams_seen),
                                          "storages": len(r.storages), "tensors": len(r.tensors)}
    return report


def lifted_functions(mod: tvm.IRModule) -> set[str]:
    """Functions that TVM's RewriteCUDAGraph lifted out of a program (its storage allocation and its captured
    region): they run only through ``get_cached_alloc`` / ``run_or_capture``, where the check replays them."""
    out: set[str] = set()

    def visit(e):
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.call_builtin_with_ctx" \
                and isinstance(e.args[0], relax.ExternFunc) \
                and str(e.args[0].global_symbol) in (GET_CACHED_ALLOC, RUN_OR_CAPTURE) \
                and isinstance(e.args[1], relax.Tuple) and isinstance(e.args[1].fields[0], relax.GlobalVar):
            callee = e.args[1].fields[0]
            if isinstance(mod[callee], relax.Function) and mod[callee].attrs is not None \
                    and "relax.force_pure" in mod[callee].attrs:
                out.add(callee.name_hint)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return out


def global_workspaces(func: "tvm.tirx.PrimFunc") -> list[str]:
    """Names of the global-scope buffers a scheduled kernel allocates inside itself (its intermediates; a
    parameter is not one): TVM's host code takes each from the per-thread workspace pool at every launch."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import get_root_block

    body = func.body
    if not isinstance(body, s_tir.stmt.SBlockRealize):
        return []
    try:
        sch = s_tir.Schedule(func)
        blocks = [get_root_block(sch)]
    except Exception:  # noqa: BLE001 - not a block-form kernel (a host function): nothing to find
        return []
    out, gpu = [], False
    while blocks:
        rv = blocks.pop()
        out += [b.name for b in sch.get(rv).alloc_buffers if b.scope() in ("global", "")]
        children = list(sch.get_child_blocks(rv))
        for child in children:
            gpu = gpu or any(str(sch.get(lp).thread_binding.thread_tag).startswith(("blockIdx", "threadIdx"))
                             for lp in sch.get_loops(child) if sch.get(lp).thread_binding is not None)
        blocks += children
    # only a GPU kernel's launch returns before it runs (a CPU kernel has finished when its call returns)
    return out if gpu else []


# ---------------------------------------------------------------------------------------------- memory
def activation_memory(planned: tvm.IRModule, function: str = MAIN_FUNC) -> int:
    """Bytes of all ``R.memory.alloc_storage`` of a planned function (the activations TVM's plan keeps; model
    outputs, allocated per call, are not counted)."""
    func = planned[function]
    total = 0

    def visit(e):
        nonlocal total
        if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name == "relax.memory.alloc_storage":
            if isinstance(e.args[0], relax.ShapeExpr):
                total += _int(e.args[0].values[0])

    relax.analysis.post_order_visit(func.body, visit)
    return total
