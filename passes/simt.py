"""A CPU interpreter for the CUDA kernels a build hands to TVM's CUDA codegen, with race and barrier checks.

Why: the flow and wave launches (``passes/wave``) change what runs inside a kernel: block indices re-derived, blocks
repacked, tasks taken from a counter, waits on other blocks' counters. A GPU run finds a mistake as a wrong number
at best; a race may even pass there by luck. This module runs the very device IR that the build compiles (the
``IRModule`` TVM passes to ``target.build.cuda``, captured by :func:`capture_build`) on NumPy:

* a block's threads run in lock step, one NumPy lane each (``if``/``while`` under a lane mask, so shared memory,
  ``__syncthreads`` and warp shuffles mean what they mean on the device); blocks run one after another in block
  order, which is the order in which a flow launch's blocks take their tasks;
* a ``__syncthreads`` reached by only some of a block's threads is an error (undefined on the device);
* shared memory: a thread reading an element that a thread of another warp wrote since the last barrier, or
  writing one that such a thread read, is a race (a missing barrier that lock step would hide);
* global memory: a block reading an element that another block of the same launch wrote is a race unless the
  reader waited for a counter that the writer (or a block that waited for it, transitively) counted up;
* a block that would have to wait (a poll that finds its producer unfinished, i.e. a ``__nanosleep``) is an
  error: blocks run in task order, so a producer is always finished first when the task layout is right;
* an out-of-bounds access by an active thread is an error; so is a launch whose grid or block differs from the
  thread extents its kernel was compiled for.

:func:`capture_build` takes both halves of a build: the device functions, and the host functions' launches
(kernel, the tensors passed, grid and block), so :meth:`Emulator.call` runs a unit the way its library does.

Memory is sequentially consistent here and fences do nothing: whether the device makes one block's writes visible
to another (fences, caches) is not modelled, nor speed, nor which blocks are resident at once.

It covers the IR that TVM's default CUDA schedules and ``passes/wave`` produce (scalars, vectors of lanes, lets,
serial loops, shared/local buffers, ``atomicAdd``, ``__ldcg``, warp shuffles, device-function calls) and refuses
anything else by name, so it never runs a kernel it does not understand.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm.ir import expr as X
from tvm.ir.prim import expr as E
from tvm.tirx import stmt as S

WARP = 32


class EmulationError(RuntimeError):
    """The kernel did something the device would not do right (race, divergent barrier, out of bounds, a wait)."""


class Unsupported(NotImplementedError):
    """An IR node the emulator does not know: refused rather than guessed."""


# ------------------------------------------------------------------------------------------------ capture
@dataclass
class CapturedBuild:
    """What a CUDA build compiled: ``device``, every device function TVM's CUDA codegen received; ``host``, every
    host function as it stood when TVM split host from device code (its kernel launches: which kernel, on which
    of the function's tensors, with which grid)."""

    result: object
    device: dict
    host: dict


def capture_build(build) -> CapturedBuild:
    """Run ``build()`` (a CUDA build: ``build_library``, ``tvm.compile``...) and capture what it compiled."""
    import sys

    device, host = [], []
    original = tvm.get_global_func("target.build.cuda")
    tir_build = sys.modules["tvm.tirx.build"]
    split = tir_build.split_host_device_mods

    def capture(mod, target):
        device.append(mod)
        return original(mod, target)

    def spy(mod):
        host.append(mod)
        return split(mod)

    tvm.register_global_func("target.build.cuda", capture, override=True)
    tir_build.split_host_device_mods = spy
    try:
        result = build()
    finally:
        tvm.register_global_func("target.build.cuda", original, override=True)
        tir_build.split_host_device_mods = split
    funcs = lambda mods: {gv.name_hint: f for m in mods for gv, f in m.functions.items()  # noqa: E731
                          if isinstance(f, tvm.tirx.PrimFunc)}
    dev = funcs(device)
    return CapturedBuild(result, dev, {k: f for k, f in funcs(host).items() if k not in dev})


@dataclass
class KernelLaunch:
    """One kernel launch of a host function: ``args``, per kernel parameter, the name of the host function's
    tensor whose memory it is (or a constant); the grid and block the host launches with."""

    kernel: str
    args: list
    grid: tuple
    block: tuple


_LAUNCH_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")


def host_launches(host_func, name: str = "") -> list[KernelLaunch]:
    """The kernel launches of a host function, in order, each argument traced back through the buffers declared
    on it to one of the function's own tensors."""
    root: dict[int, str] = {}
    out: list[KernelLaunch] = []

    def data_root(e) -> str:
        if isinstance(e, X.Call) and e.op.name.endswith("buffer_data"):
            key = hash(e.args[0])
            if key not in root:
                raise Unsupported(f"{name}: a kernel argument on buffer {e.args[0].name}, declared nowhere")
            return root[key]
        raise Unsupported(f"{name}: a kernel argument that is not a buffer's data: {e}")

    for s in _statements(host_func.body):
        if isinstance(s, S.DeclBuffer):
            d = s.data
            root[hash(s.buffer)] = (data_root(d) if isinstance(d, X.Call) and d.op.name.endswith("buffer_data")
                                    else s.buffer.name)   # a tensor of the function's own arguments
        elif (isinstance(s, S.Evaluate) and isinstance(s.value, X.Call) and hasattr(s.value.op, "name")
              and s.value.op.name.endswith("call_ffi_kernel")):
            c = s.value
            tags = [str(t) for t in c.attrs.launch_params]
            unknown = [t for t in tags if t not in _LAUNCH_TAGS]
            if unknown:
                raise Unsupported(f"{name}: a launch with {unknown} (dynamic shared memory, clusters...)")
            ext = {}
            for t, v in zip(tags, c.args[len(c.args) - len(tags):]):
                if not isinstance(v, E.IntImm):
                    raise Unsupported(f"{name}: a launch extent that is not a constant: {t} = {v}")
                ext[t] = int(v.value)
            args = [int(a.value) if isinstance(a, E.IntImm) else data_root(a)
                    for a in c.args[1:len(c.args) - len(tags)]]
            out.append(KernelLaunch(c.args[0].value, args, tuple(ext.get(f"blockIdx.{a}", 1) for a in "xyz"),
                                    tuple(ext.get(f"threadIdx.{a}", 1) for a in "xyz")))
    return out


# ------------------------------------------------------------------------------------------------ memory
_NP = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "int32": np.int32, "int64": np.int64,
       "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint32": np.uint32, "bool": np.bool_}


def _scalar_dtype(dtype) -> str:
    return str(tvm.DataType(str(dtype)).with_lanes(1)) if str(dtype) != "bool" else "bool"


def _lanes(dtype) -> int:
    return tvm.DataType(str(dtype)).lanes


@dataclass
class Storage:
    """One allocation. ``global``/``shared``: ``data`` is 1-D; ``local``: ``data`` is (threads, n).
    ``writer``: per element, the block that last wrote it (global) or the warp and barrier epoch of the last
    write and read (shared), for the race checks."""

    name: str
    scope: str
    data: np.ndarray
    writer: np.ndarray | None = None
    w_epoch: np.ndarray | None = None
    w_warp: np.ndarray | None = None
    r_epoch: np.ndarray | None = None
    r_warp: np.ndarray | None = None

    @staticmethod
    def make(name: str, scope: str, data: np.ndarray) -> "Storage":
        s = Storage(name, scope, data)
        n = data.shape[-1]
        if scope == "global":
            s.writer = np.full(n, -1, np.int64)
        elif scope == "shared":
            s.w_epoch = np.full(n, -1, np.int64)
            s.w_warp = np.full(n, -1, np.int64)
            s.r_epoch = np.full(n, -1, np.int64)
            s.r_warp = np.full(n, -1, np.int64)
        return s


@dataclass(frozen=True)
class Pointer:
    """A pointer value: an allocation and an offset into it, in scalars of its data type."""

    storage: Storage
    offset: int


# ------------------------------------------------------------------------------------------------ launch state
@dataclass
class _Block:
    """What one running block knows: its index, its threads, the barrier epoch, what it may read (the blocks that
    happened before it, as a bit set)."""

    index: int
    threads: int
    lane: np.ndarray
    epoch: int = 0
    before: int = 0


@dataclass
class Launch:
    """A launch of one kernel: grid and block shape, and the happens-before sets carried by counters."""

    grid: tuple
    block: tuple
    counter_before: dict = field(default_factory=dict)   # (storage id, index) -> bit set of blocks counted there


class _Ctx:
    """What a compiled statement runs in: the variables (by ``hash`` of the IR variable), the block, the launch."""

    __slots__ = ("env", "blk", "launch")

    def __init__(self, env, blk, launch):
        self.env, self.blk, self.launch = env, blk, launch


def _any(mask) -> bool:
    return bool(np.any(mask))


def _full(mask, n):
    return mask if isinstance(mask, np.ndarray) else np.full(n, bool(mask))


class Emulator:
    """Compiles device functions to closures once, then runs launches of them."""

    def __init__(self, functions: dict[str, tvm.tirx.PrimFunc]):
        self.functions = functions
        self._compiled: dict[str, object] = {}

    # -------------------------------------------------------------------------------- public
    def launch(self, name: str, args: list, grid: tuple | None = None, block: tuple | None = None) -> None:
        """Run kernel ``name`` on ``args`` (NumPy arrays for pointer parameters, ints for scalars), in place.
        ``grid``/``block``: (x, y, z); by default the kernel's own constant thread extents."""
        func = self.functions[name]
        extents = _thread_extents(func.body)
        own = (tuple(extents.get(f"blockIdx.{a}", 1) for a in "xyz"), tuple(extents.get(f"threadIdx.{a}", 1)
                                                                          for a in "xyz"))
        if any(not isinstance(v, int) for v in own[0] + own[1]):
            raise Unsupported(f"{name}: thread extents that are not constants: {own}")
        if (grid or own[0], block or own[1]) != own:
            raise EmulationError(f"{name}: launched with grid {grid} and block {block}, compiled for {own}")
        grid, block = own
        if len(args) != len(func.params):
            raise ValueError(f"{name} takes {len(func.params)} arguments, got {len(args)}")
        env0 = {}
        for p, a in zip(func.params, args):   # a fresh record of writers per launch: launches are ordered
            env0[hash(p)] = global_pointer(a, p.name) if isinstance(a, np.ndarray) else a
        body = self._compiled_body(name)
        launch = Launch(grid, block)
        nthreads = int(np.prod(block))
        lane = np.arange(nthreads, dtype=np.int64)
        tid = {"threadIdx.x": lane % block[0], "threadIdx.y": (lane // block[0]) % block[1],
               "threadIdx.z": lane // (block[0] * block[1])}
        for b in range(int(np.prod(grid))):
            bid = {"blockIdx.x": b % grid[0], "blockIdx.y": (b // grid[0]) % grid[1],
                   "blockIdx.z": b // (grid[0] * grid[1])}
            env = dict(env0)
            env["__thread__"] = {**tid, **bid}
            blk = _Block(b, nthreads, lane)
            body(_Ctx(env, blk, launch), np.ones(nthreads, bool))

    def call(self, launches: list[KernelLaunch], tensors: dict) -> None:
        """Run a host function's kernel launches (:func:`host_launches`) on ``tensors`` (its tensors by name:
        NumPy arrays, written in place), one launch after another as its stream runs them."""
        for ln in launches:
            missing = [a for a in ln.args if isinstance(a, str) and a not in tensors]
            if missing:
                raise ValueError(f"{ln.kernel}: no array for {missing}")
            self.launch(ln.kernel, [tensors[a] if isinstance(a, str) else a for a in ln.args], ln.grid, ln.block)

    # -------------------------------------------------------------------------------- compile
    def _compiled_body(self, name):
        if name not in self._compiled:
            self._compiled[name] = None   # recursion guard
            self._compiled[name] = self._stmt(self.functions[name].body, name)
        return self._compiled[name]

    def _stmt(self, s, fname):
        if isinstance(s, S.SeqStmt):
            parts = [self._stmt(x, fname) for x in s.seq]

            def run(ctx, mask):
                for p in parts:
                    p(ctx, mask)
            return run
        if isinstance(s, S.Bind):
            var, value = hash(s.var), self._expr(s.value, fname)

            def run(ctx, mask):
                ctx.env[var] = value(ctx, mask)
            return run
        if isinstance(s, S.DeclBuffer):
            key, data = hash(s.buffer), self._expr(s.data, fname)
            name = s.buffer.name

            def run(ctx, mask):
                ptr = data(ctx, mask)
                if not isinstance(ptr, Pointer):
                    raise Unsupported(f"{fname}: buffer {name} declared on something that is not a pointer")
                ctx.env[key] = ptr
            return run
        if isinstance(s, S.AllocBuffer):
            buf = s.buffer
            scope = str(buf.scope())
            n = int(np.prod([int(d) for d in buf.shape])) * _lanes(buf.dtype)
            np_dtype = _NP[_scalar_dtype(buf.dtype)]
            if scope not in ("shared", "local", "shared.dyn"):
                raise Unsupported(f"{fname}: allocation {buf.name} in scope {scope}")

            key, fill = hash(buf), (np.nan if np.issubdtype(np_dtype, np.floating) else 0)

            def run(ctx, mask):   # NaN: a read of what no thread wrote shows in the output
                shape = (ctx.blk.threads, n) if scope == "local" else (n,)
                ctx.env[key] = Pointer(Storage.make(buf.name, "local" if scope == "local" else "shared",
                                                    np.full(shape, fill, np_dtype)), 0)
            return run
        if isinstance(s, S.AttrStmt):
            body = self._stmt(s.body, fname)
            if s.attr_key == "thread_extent":
                var, tag = hash(s.node.var), s.node.thread_tag

                def run(ctx, mask):
                    ctx.env[var] = ctx.env["__thread__"][tag]
                    body(ctx, mask)
                return run
            return body
        if isinstance(s, S.For):
            if s.kind not in (S.ForKind.SERIAL, S.ForKind.UNROLLED, S.ForKind.VECTORIZED):
                raise Unsupported(f"{fname}: a {s.kind} loop")
            var, lo, ext = hash(s.loop_var), self._expr(s.min, fname), self._expr(s.extent, fname)
            step = self._expr(s.step, fname) if s.step is not None else (lambda ctx, mask: 1)
            body = self._stmt(s.body, fname)

            def run(ctx, mask):
                a, n, st = lo(ctx, mask), ext(ctx, mask), step(ctx, mask)
                if isinstance(a, np.ndarray) or isinstance(n, np.ndarray) or isinstance(st, np.ndarray):
                    raise Unsupported(f"{fname}: a loop whose bounds differ between threads")
                for i in range(int(a), int(a) + int(n), int(st)):
                    ctx.env[var] = i
                    body(ctx, mask)
            return run
        if isinstance(s, S.IfThenElse):
            cond = self._expr(s.condition, fname)
            then = self._stmt(s.then_case, fname)
            other = self._stmt(s.else_case, fname) if s.else_case is not None else None

            def run(ctx, mask):
                c = cond(ctx, mask)
                if not isinstance(c, np.ndarray):
                    if c:
                        then(ctx, mask)
                    elif other is not None:
                        other(ctx, mask)
                    return
                m = mask & c
                if _any(m):
                    then(ctx, m)
                if other is not None:
                    m = mask & ~c
                    if _any(m):
                        other(ctx, m)
            return run
        if isinstance(s, S.While):
            cond, body = self._expr(s.condition, fname), self._stmt(s.body, fname)

            def run(ctx, mask):
                active = mask
                while True:
                    c = cond(ctx, active)
                    active = active & c
                    if not _any(active):
                        return
                    body(ctx, active)
            return run
        if isinstance(s, S.BufferStore):
            return self._store(s, fname)
        if isinstance(s, S.Evaluate):
            value = self._expr(s.value, fname, statement=True)

            def run(ctx, mask):
                value(ctx, mask)
            return run
        if isinstance(s, S.AssertStmt):
            cond = self._expr(s.condition, fname)

            def run(ctx, mask):
                c = cond(ctx, mask)
                if not np.all(np.where(mask, c, True)):
                    raise EmulationError(f"{fname}: assertion failed: {s.message_parts}")
            return run
        raise Unsupported(f"{fname}: statement {type(s).__name__}")

    # -------------------------------------------------------------------------------- memory access
    def _index(self, buf, indices, fname):
        if len(indices) != 1:
            raise Unsupported(f"{fname}: a {len(indices)}-D access to {buf.name} (device IR is flat)")
        idx = self._expr(indices[0], fname)
        lanes = _lanes(buf.dtype)
        off = buf.elem_offset
        off_f = self._expr(off, fname) if off is not None else (lambda ctx, mask: 0)

        key = hash(buf)

        def where(ctx, mask):
            ptr = ctx.env.get(key)
            if not isinstance(ptr, Pointer):
                raise Unsupported(f"{fname}: buffer {buf.name} has no memory")
            i = idx(ctx, mask)
            base = (i + off_f(ctx, mask)) * lanes + ptr.offset
            if lanes > 1:   # an element of a vector dtype: its lanes in a row
                if np.ndim(base) == 2:
                    raise Unsupported(f"{fname}: a vector index into {buf.name}, a buffer of vectors")
                base = _lanewise(ctx, base)[:, None] + np.arange(lanes)
            return ptr.storage, _lanewise(ctx, base)
        return where

    def _load(self, e, fname):
        where = self._index(e.source, e.indices, fname)
        name = e.source.name

        def run(ctx, mask):
            st, i = where(ctx, mask)
            return _access(ctx, st, i, mask, None, name, fname)
        return run

    def _store(self, s, fname):
        where = self._index(s.buffer, s.indices, fname)
        value = self._expr(s.value, fname)
        name = s.buffer.name

        def run(ctx, mask):
            st, i = where(ctx, mask)
            _access(ctx, st, i, mask, value(ctx, mask), name, fname)
        return run

    # -------------------------------------------------------------------------------- expressions
    def _expr(self, e, fname, statement=False):
        if isinstance(e, E.IntImm):
            v = bool(e.value) if str(e.ty) == "bool" else int(e.value)
            return lambda ctx, mask: v
        if isinstance(e, E.FloatImm):
            v = _NP[str(e.ty)](e.value)
            return lambda ctx, mask: v
        if isinstance(e, X.StringImm):
            v = e.value
            return lambda ctx, mask: v
        if isinstance(e, X.TensorLoad):
            return self._load(e, fname)
        if isinstance(e, (E.Var, X.Var)):
            return _lookup(e, f"{fname}: unbound variable {e.name}")
        if isinstance(e, E.Cast):
            v, dt = self._expr(e.value, fname), str(e.ty)
            return lambda ctx, mask: _cast(v(ctx, mask), dt)
        binop = _BINOPS.get(type(e))
        if binop is not None:
            a, b = self._expr(e.a, fname), self._expr(e.b, fname)
            is_float = str(e.a.ty).startswith("float")
            f = binop(is_float)
            return lambda ctx, mask: f(a(ctx, mask), b(ctx, mask))
        if isinstance(e, E.Not):
            a = self._expr(e.a, fname)
            return lambda ctx, mask: np.logical_not(a(ctx, mask))
        if isinstance(e, E.BitwiseNot):
            a = self._expr(e.a, fname)
            return lambda ctx, mask: ~a(ctx, mask)
        if isinstance(e, E.Select):
            c, t, f = self._expr(e.condition, fname), self._expr(e.true_value, fname), self._expr(e.false_value, fname)
            return lambda ctx, mask: _select(c(ctx, mask), t(ctx, mask), f(ctx, mask))
        if isinstance(e, E.Ramp):
            base, stride, n = self._expr(e.base, fname), self._expr(e.stride, fname), int(e.lanes)
            return lambda ctx, mask: _vec(ctx, base(ctx, mask)) + _vec(ctx, stride(ctx, mask)) * np.arange(n)
        if isinstance(e, E.Broadcast):
            v, n = self._expr(e.value, fname), int(e.lanes)
            return lambda ctx, mask: np.repeat(_vec(ctx, v(ctx, mask)), n, axis=-1)
        if isinstance(e, E.Let):
            var, value, body = hash(e.var), self._expr(e.value, fname), self._expr(e.body, fname)

            def run(ctx, mask):
                ctx.env[var] = value(ctx, mask)
                return body(ctx, mask)
            return run
        if isinstance(e, E.Shuffle):
            vecs = [self._expr(v, fname) for v in e.vectors]
            idx = [int(i) for i in e.indices]

            def run(ctx, mask):
                cat = np.concatenate([_vec(ctx, v(ctx, mask)) for v in vecs], axis=-1)
                out = cat[..., idx]
                return out[..., 0] if len(idx) == 1 else out
            return run
        if isinstance(e, X.Call):
            return self._call(e, fname, statement)
        raise Unsupported(f"{fname}: expression {type(e).__name__}")

    def _call(self, e, fname, statement):
        if isinstance(e.op, tvm.ir.GlobalVar):   # a device function
            callee = e.op.name_hint
            if callee not in self.functions:
                raise Unsupported(f"{fname}: call to {callee}, which is not in the module")
            params = list(self.functions[callee].params)
            args = [self._expr(a, fname) for a in e.args]

            def run(ctx, mask):
                body = self._compiled_body(callee)
                env = {"__thread__": ctx.env["__thread__"]}
                for p, a in zip(params, args):
                    env[hash(p)] = a(ctx, mask)
                body(_Ctx(env, ctx.blk, ctx.launch), mask)
                return 0
            return run
        name = e.op.name
        args = e.args
        for prefix in ("tirx.cuda.", "prim.cuda.", "tirx.", "prim.", "cuda."):
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        if name in ("call_extern", "call_pure_extern"):
            name, args = args[0].value, args[1:]
        handler = _CALLS.get(name)
        if handler is None:
            raise Unsupported(f"{fname}: call to {name}")
        return handler(self, e, [a for a in args], fname)


# ------------------------------------------------------------------------------------------------ helpers
def global_pointer(a: np.ndarray, name: str = "arg") -> Pointer:
    """A pointer to a global array; writes go to ``a`` (which must be contiguous)."""
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: a launch writes through a flat view; pass a contiguous array")
    return Pointer(Storage.make(name, "global", a.reshape(-1)), 0)


def _lanewise(ctx, v):
    """``v`` as one value per thread (a uniform scalar broadcast)."""
    return v if isinstance(v, np.ndarray) and v.ndim >= 1 else np.full(ctx.blk.threads, v)


def _vec(ctx, v):
    """``v`` as (threads, lanes): a scalar per thread gets a lane axis of 1."""
    v = _lanewise(ctx, v)
    return v[:, None] if v.ndim == 1 else v


def _cast(v, dt):
    sd = _scalar_dtype(dt)
    t = _NP[sd]
    if isinstance(v, np.ndarray):
        if np.issubdtype(t, np.integer) and np.issubdtype(v.dtype, np.floating):
            return np.trunc(v).astype(t)
        return v.astype(t)
    if sd == "bool":
        return bool(v)
    if np.issubdtype(t, np.integer):
        return int(v)
    return t(v)


def _select(c, t, f):
    if not isinstance(c, np.ndarray):
        return t if c else f
    if np.ndim(t) > np.ndim(c) or np.ndim(f) > np.ndim(c):
        c = c[..., None]
    return np.where(c, t, f)


def _tdiv(a, b):   # C division of integers: toward zero
    q = np.floor_divide(a, b)
    return q + ((np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0)))


def _tmod(a, b):
    return a - _tdiv(a, b) * b


def _int_or_float(fi, ff):
    return lambda is_float: ff if is_float else fi


_BINOPS = {
    E.Add: lambda _: (lambda a, b: a + b),
    E.Sub: lambda _: (lambda a, b: a - b),
    E.Mul: lambda _: (lambda a, b: a * b),
    E.Div: _int_or_float(_tdiv, lambda a, b: a / b),
    E.Mod: _int_or_float(_tmod, np.fmod),
    E.FloorDiv: _int_or_float(np.floor_divide, lambda a, b: np.floor(a / b)),
    E.FloorMod: _int_or_float(np.remainder, np.remainder),
    E.Min: lambda _: np.minimum,
    E.Max: lambda _: np.maximum,
    E.EQ: lambda _: (lambda a, b: np.equal(a, b)),
    E.NE: lambda _: (lambda a, b: np.not_equal(a, b)),
    E.LT: lambda _: (lambda a, b: np.less(a, b)),
    E.LE: lambda _: (lambda a, b: np.less_equal(a, b)),
    E.GT: lambda _: (lambda a, b: np.greater(a, b)),
    E.GE: lambda _: (lambda a, b: np.greater_equal(a, b)),
    E.And: lambda _: (lambda a, b: np.logical_and(a, b)),
    E.BitwiseAnd: lambda _: (lambda a, b: a & b),
    E.BitwiseOr: lambda _: (lambda a, b: a | b),
    E.BitwiseXor: lambda _: (lambda a, b: a ^ b),
    E.LShift: lambda _: (lambda a, b: a << b),
    E.RShift: lambda _: (lambda a, b: a >> b),
    E.Or: lambda _: (lambda a, b: np.logical_or(a, b)),
}


def _access(ctx: _Ctx, st: Storage, i: np.ndarray, mask, value, name: str, fname: str):
    """Load (``value is None``) or store ``i`` of ``st`` for the active lanes, with the bounds and race checks."""
    blk = ctx.blk
    mask = _full(mask, blk.threads)
    n = st.data.shape[-1]
    m2 = mask[:, None] if i.ndim == 2 else mask
    active = np.broadcast_to(m2, i.shape)
    bad = active & ((i < 0) | (i >= n))
    if bad.any():
        lane = int(np.argwhere(bad)[0][0])
        raise EmulationError(f"{fname}: thread {lane} of block {blk.index} accesses {name}[{int(i[bad][0])}], "
                             f"outside its {n} elements")
    safe = np.where(active, i, 0)
    if st.scope == "local":
        rows = np.broadcast_to(np.arange(blk.threads)[:, None] if i.ndim == 2 else np.arange(blk.threads), i.shape)
        if value is None:
            return st.data[rows, safe]
        v = np.broadcast_to(np.asarray(value, st.data.dtype), i.shape)
        st.data[rows[active], safe[active]] = v[active]
        return None
    warp = blk.lane // WARP
    warps = np.broadcast_to(warp[:, None] if i.ndim == 2 else warp, i.shape)[active]
    idx = safe[active]
    if st.scope == "shared":
        _shared_race(st, idx, warps, blk.epoch, value is None, name, fname, blk)
    else:
        _global_race(st, idx, value is None, name, fname, blk)
    if value is None:
        return st.data[safe]
    v = np.broadcast_to(np.asarray(value, st.data.dtype), i.shape)
    st.data[idx] = v[active]
    return None


def _missing_barrier(clash, warps, idx, verb: str, other: str, name, fname, blk):
    if clash.any():
        raise EmulationError(f"{fname}: block {blk.index}: a thread of warp {int(warps[clash][0])} {verb} "
                             f"{name}[{int(idx[clash][0])}], {other} since the last barrier (a missing __syncthreads)")


def _shared_race(st, idx, warps, epoch, is_read, name, fname, blk):
    """Shared memory between two barriers: a warp reads what another wrote, or writes what another read."""
    if is_read:
        clash = (st.w_epoch[idx] == epoch) & (st.w_warp[idx] != warps)
        _missing_barrier(clash, warps, idx, "reads", "written by another warp", name, fname, blk)
        # readers of this epoch: one warp, or -2 when several (per element read, not per element of the buffer)
        touched, which = np.unique(idx, return_inverse=True)
        lo = np.full(len(touched), np.iinfo(np.int64).max)
        hi = np.full(len(touched), -1)
        np.minimum.at(lo, which, warps)
        np.maximum.at(hi, which, warps)
        same_epoch = st.r_epoch[touched] == epoch
        prev = st.r_warp[touched]
        new = np.where(lo == hi, lo, -2)
        merged = np.where(same_epoch & (prev != new), -2, new)
        st.r_warp[touched] = merged
        st.r_epoch[touched] = epoch
    else:
        clash = (st.r_epoch[idx] == epoch) & (st.r_warp[idx] != warps)
        _missing_barrier(clash, warps, idx, "writes", "read by another warp", name, fname, blk)
        st.w_epoch[idx] = epoch
        st.w_warp[idx] = warps


def _global_race(st, idx, is_read, name, fname, blk):
    writers = st.writer[idx]
    other = (writers >= 0) & (writers != blk.index)
    if other.any():
        for w in np.unique(writers[other]):
            if not (blk.before >> int(w)) & 1:
                what = "reads" if is_read else "writes"
                raise EmulationError(f"{fname}: block {blk.index} {what} {name}[{int(idx[other][0])}], written by "
                                     f"block {int(w)} of the same launch, without waiting for it")
    if not is_read:
        st.writer[idx] = blk.index


# ------------------------------------------------------------------------------------------------ calls
def _pointer_arg(emu, e, fname):
    """``address_of(buf[i])`` -> (storage, scalar offset)."""
    if not (isinstance(e, X.Call) and e.op.name.endswith(".address_of")):
        raise Unsupported(f"{fname}: a pointer argument that is not address_of(...)")
    load = e.args[0]
    return emu._index(load.source, load.indices, fname)


def _call_address_of(emu, e, args, fname):
    where = _pointer_arg(emu, e, fname)

    def run(ctx, mask):
        st, i = where(ctx, mask)
        return Pointer(st, _uniform(ctx, i, mask, fname, "a pointer"))
    return run


def _call_sync(emu, e, args, fname):
    scope = args[0].value if args else "shared"

    def run(ctx, mask):
        if scope in ("shared", "global") and not np.all(mask):
            raise EmulationError(f"{fname}: block {ctx.blk.index}: __syncthreads reached by "
                                 f"{int(np.sum(mask))} of {ctx.blk.threads} threads (a divergent barrier)")
        if scope == "shared":
            ctx.blk.epoch += 1
        return 0
    return run


def _call_atomic_add(emu, e, args, fname):
    where = _pointer_arg(emu, args[0], fname)
    value = emu._expr(args[1], fname)

    def run(ctx, mask):
        st, i = where(ctx, mask)
        v = value(ctx, mask)
        mask = _full(mask, ctx.blk.threads)
        i = np.broadcast_to(np.asarray(i), (ctx.blk.threads,))
        v = np.broadcast_to(np.asarray(v), (ctx.blk.threads,))
        out = np.zeros(ctx.blk.threads, st.data.dtype)
        for lane in np.flatnonzero(mask):   # one thread after another, as the atomic unit serialises them
            k = int(i[lane])
            if not 0 <= k < st.data.shape[-1]:
                raise EmulationError(f"{fname}: atomicAdd outside {st.name}")
            out[lane] = st.data[k]
            st.data[k] += v[lane]
            if st.scope == "global":   # counting up publishes what this block and its predecessors did
                key = (id(st), k)
                ctx.launch.counter_before[key] = (ctx.launch.counter_before.get(key, 0) | ctx.blk.before
                                                  | (1 << ctx.blk.index))
        return out
    return run


def _call_ldcg(emu, e, args, fname):
    where = _pointer_arg(emu, args[0], fname)

    def run(ctx, mask):
        st, i = where(ctx, mask)
        k = _uniform(ctx, i, mask, fname, "a polled counter")
        # reading a counter acquires what was counted there (the caller fences after the wait)
        ctx.blk.before |= ctx.launch.counter_before.get((id(st), k), 0)
        return st.data[k]
    return run


def _call_sleep(emu, e, args, fname):
    def run(ctx, mask):
        raise EmulationError(f"{fname}: block {ctx.blk.index} has to wait for a counter: blocks run in task "
                             "order, so a task waits for one that comes after it (a wrong task layout)")
    return run


def _noop(emu, e, args, fname):
    return lambda ctx, mask: 0


def _call_activemask(emu, e, args, fname):
    def run(ctx, mask):
        m = _full(mask, ctx.blk.threads)
        bits = np.zeros(ctx.blk.threads, np.int64)
        for w in range(0, ctx.blk.threads, WARP):
            word = sum(1 << j for j, on in enumerate(m[w:w + WARP]) if on)
            bits[w:w + WARP] = word
        return bits
    return run


def _shuffle(kind):
    def make(emu, e, args, fname):
        value = emu._expr(args[1], fname)
        src = emu._expr(args[2], fname)
        width = emu._expr(args[3], fname) if len(args) > 3 else (lambda ctx, mask: WARP)

        def run(ctx, mask):
            v = np.broadcast_to(np.asarray(value(ctx, mask)), (ctx.blk.threads,))
            s = np.broadcast_to(np.asarray(src(ctx, mask), np.int64), (ctx.blk.threads,))
            w = int(width(ctx, mask))
            lane = ctx.blk.lane
            in_warp = lane % WARP
            seg = (in_warp // w) * w
            if kind == "down":
                j = in_warp + s
                j = np.where(j - seg < w, j, in_warp)
            elif kind == "up":
                j = in_warp - s
                j = np.where(j >= seg, j, in_warp)
            else:
                j = seg + s % w
            target = lane - in_warp + j
            m = _full(mask, ctx.blk.threads)
            exists = target < ctx.blk.threads
            safe = np.where(exists, target, 0)
            out = v[safe].copy()
            # a lane that does not exist or is not active gives an undefined value (TVM's reductions read such
            # lanes for results they then drop): NaN, so that any use of it shows in the output
            undefined = ~exists | ~m[safe]
            if undefined.any() and np.issubdtype(out.dtype, np.floating):
                out[undefined] = np.nan
            return out
        return run
    return make


def _math(fn):
    def make(emu, e, args, fname):
        fs = [emu._expr(a, fname) for a in args]
        dt = _NP[_scalar_dtype(e.ty)]
        return lambda ctx, mask: np.asarray(fn(*[f(ctx, mask) for f in fs])).astype(dt)
    return make


def _call_if_then_else(emu, e, args, fname):
    c, t, f = (emu._expr(a, fname) for a in args)

    def run(ctx, mask):
        cv = c(ctx, mask)
        if not isinstance(cv, np.ndarray):
            return t(ctx, mask) if cv else f(ctx, mask)
        mt, mf = mask & cv, mask & ~cv
        tv = t(ctx, mt) if _any(mt) else None
        fv = f(ctx, mf) if _any(mf) else None
        if tv is None:
            return fv
        if fv is None:
            return tv
        return _select(cv, tv, fv)
    return run


def _uniform(ctx, i, mask, fname, what) -> int:
    """The one value of ``i`` over the active threads."""
    vals = np.unique(np.asarray(i)[_full(mask, ctx.blk.threads)]) if np.ndim(i) else [i]
    if len(vals) != 1:
        raise Unsupported(f"{fname}: {what} that differs between threads")
    return int(vals[0])


def _lookup(var, unbound: str):
    """A variable's (or buffer's) value in the running context."""
    key = hash(var)

    def run(ctx, mask):
        try:
            return ctx.env[key]
        except KeyError:
            raise Unsupported(unbound) from None
    return run


def _call_buffer_data(emu, e, args, fname):
    return _lookup(args[0], f"{fname}: the data of unknown buffer {args[0].name}")


def _call_reinterpret(emu, e, args, fname):
    v = emu._expr(args[0], fname)
    dt = _NP[_scalar_dtype(e.ty)]
    return lambda ctx, mask: np.asarray(v(ctx, mask)).view(dt)


_CALLS = {
    "address_of": _call_address_of,
    "tvm_storage_sync": _call_sync,
    "atomicAdd": _call_atomic_add,
    "__ldcg": _call_ldcg,
    "__nanosleep": _call_sleep,
    "__threadfence": _noop,
    "__activemask": _call_activemask,
    "tvm_warp_activemask": _call_activemask,
    "__shfl_down_sync": _shuffle("down"),
    "__shfl_up_sync": _shuffle("up"),
    "__shfl_sync": _shuffle("idx"),
    "tvm_warp_shuffle_down": _shuffle("down"),
    "tvm_warp_shuffle_up": _shuffle("up"),
    "tvm_warp_shuffle": _shuffle("idx"),
    "if_then_else": _call_if_then_else,
    "buffer_data": _call_buffer_data,
    "likely": lambda emu, e, args, fname: emu._expr(args[0], fname),
    "reinterpret": _call_reinterpret,
    "exp": _math(np.exp), "expf": _math(np.exp), "__expf": _math(np.exp),
    "sqrt": _math(np.sqrt), "sqrtf": _math(np.sqrt),
    "rsqrt": _math(lambda x: 1 / np.sqrt(x)), "rsqrtf": _math(lambda x: 1 / np.sqrt(x)),
    "tanh": _math(np.tanh), "tanhf": _math(np.tanh),
    "fabs": _math(np.abs), "fabsf": _math(np.abs),
    "log": _math(np.log), "logf": _math(np.log), "__logf": _math(np.log),
    "pow": _math(np.power), "powf": _math(np.power), "__powf": _math(np.power),
    "floor": _math(np.floor), "floorf": _math(np.floor), "ceil": _math(np.ceil), "ceilf": _math(np.ceil),
    "round": _math(np.round), "roundf": _math(np.round), "trunc": _math(np.trunc), "truncf": _math(np.trunc),
    "erf": _math(lambda x: np.vectorize(__import__("math").erf)(x)),
    "erff": _math(lambda x: np.vectorize(__import__("math").erf)(x)),
    "sigmoid": _math(lambda x: 1 / (1 + np.exp(-x))),
}


def _statements(stmt):
    """Every statement under ``stmt``, in program order (a statement before the ones inside it). Iterative: a
    host function checks each of its tensors in a nested ``if``, hundreds deep for a flow launch's."""
    stack = [stmt]
    while stack:
        s = stack.pop()
        yield s
        if isinstance(s, S.SeqStmt):
            stack.extend(reversed(list(s.seq)))
        elif isinstance(s, (S.AttrStmt, S.For, S.While)):
            stack.append(s.body)
        elif isinstance(s, S.IfThenElse):
            if s.else_case is not None:
                stack.append(s.else_case)
            stack.append(s.then_case)


def _thread_extents(stmt) -> dict:
    """The extents of a kernel's ``thread_extent`` attributes, by thread tag."""
    return {s.node.thread_tag: int(s.value) if isinstance(s.value, E.IntImm) else s.value
            for s in _statements(stmt) if isinstance(s, S.AttrStmt) and s.attr_key == "thread_extent"}
