"""The statement and expression compiler: each device function becomes a tree of closures once, then every block of
a launch runs it with its threads in lock step (one NumPy lane each; ``if``/``while`` under a lane mask).
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm.ir import expr as X
from tvm.ir.prim import expr as E
from tvm.tirx import stmt as S

from .calls import CALLS
from .capture import KernelLaunch, thread_extents
from .errors import EmulationError, Unsupported
from .memory import (NP, Block, Ctx, Launch, Pointer, Storage, access, any_active, cast_value, dtype_lanes,
                     full_mask, global_pointer, lookup, per_lane, per_thread, scalar_dtype, select_value)


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
        extents = thread_extents(func.body)
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
            blk = Block(b, nthreads, lane)
            body(Ctx(env, blk, launch), np.ones(nthreads, bool))

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
            n = int(np.prod([int(d) for d in buf.shape])) * dtype_lanes(buf.dtype)
            np_dtype = NP[scalar_dtype(buf.dtype)]
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
                if any_active(m):
                    then(ctx, m)
                if other is not None:
                    m = mask & ~c
                    if any_active(m):
                        other(ctx, m)
            return run
        if isinstance(s, S.While):
            cond, body = self._expr(s.condition, fname), self._stmt(s.body, fname)

            def run(ctx, mask):
                active = mask
                while True:
                    c = cond(ctx, active)
                    active = active & c
                    if not any_active(active):
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
        lanes = dtype_lanes(buf.dtype)
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
                base = per_thread(ctx, base)[:, None] + np.arange(lanes)
            return ptr.storage, per_thread(ctx, base)
        return where

    def _load(self, e, fname):
        where = self._index(e.source, e.indices, fname)
        name = e.source.name

        def run(ctx, mask):
            st, i = where(ctx, mask)
            return access(ctx, st, i, mask, None, name, fname)
        return run

    def _store(self, s, fname):
        where = self._index(s.buffer, s.indices, fname)
        value = self._expr(s.value, fname)
        name = s.buffer.name

        def run(ctx, mask):
            st, i = where(ctx, mask)
            access(ctx, st, i, mask, value(ctx, mask), name, fname)
        return run

    # -------------------------------------------------------------------------------- expressions
    def _expr(self, e, fname, statement=False):
        if isinstance(e, E.IntImm):
            v = bool(e.value) if str(e.ty) == "bool" else int(e.value)
            return lambda ctx, mask: v
        if isinstance(e, E.FloatImm):
            v = NP[str(e.ty)](e.value)
            return lambda ctx, mask: v
        if isinstance(e, X.StringImm):
            v = e.value
            return lambda ctx, mask: v
        if isinstance(e, X.TensorLoad):
            return self._load(e, fname)
        if isinstance(e, (E.Var, X.Var)):
            return lookup(e, f"{fname}: unbound variable {e.name}")
        if isinstance(e, E.Cast):
            v, dt = self._expr(e.value, fname), str(e.ty)
            return lambda ctx, mask: cast_value(v(ctx, mask), dt)
        if isinstance(e, (E.And, E.Or)):
            return self._short_circuit(e, fname)
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
            return lambda ctx, mask: select_value(c(ctx, mask), t(ctx, mask), f(ctx, mask))
        if isinstance(e, E.Ramp):
            base, stride, n = self._expr(e.base, fname), self._expr(e.stride, fname), int(e.lanes)
            return lambda ctx, mask: per_lane(ctx, base(ctx, mask)) + per_lane(ctx, stride(ctx, mask)) * np.arange(n)
        if isinstance(e, E.Broadcast):
            v, n = self._expr(e.value, fname), int(e.lanes)
            return lambda ctx, mask: np.repeat(per_lane(ctx, v(ctx, mask)), n, axis=-1)
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
                cat = np.concatenate([per_lane(ctx, v(ctx, mask)) for v in vecs], axis=-1)
                out = cat[..., idx]
                return out[..., 0] if len(idx) == 1 else out
            return run
        if isinstance(e, X.Call):
            return self._call(e, fname, statement)
        raise Unsupported(f"{fname}: expression {type(e).__name__}")

    def _short_circuit(self, e, fname):
        """``a && b`` / ``a || b`` as C evaluates them (TVM's CUDA codegen prints these operators): ``b`` only on the
        lanes that ``a`` leaves undecided. It matters where ``b`` acts: a flow wait's give-up test re-polls its
        counter (``__ldcg``, which acquires what was counted there) only once its polls ran out, and a race check
        must not see that poll when the device would not make it."""
        a, b = self._expr(e.a, fname), self._expr(e.b, fname)
        is_and = isinstance(e, E.And)
        combine = np.logical_and if is_and else np.logical_or

        def run(ctx, mask):
            av = a(ctx, mask)
            if not isinstance(av, np.ndarray):
                return b(ctx, mask) if bool(av) == is_and else av
            if av.ndim != 1:   # a vector of lanes per thread: no calls in such conditions, both sides evaluated
                return combine(av, b(ctx, mask))
            undecided = full_mask(mask, ctx.blk.threads) & (av if is_and else ~av)
            if not any_active(undecided):
                return av
            return combine(av, b(ctx, undecided))
        return run

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
                body(Ctx(env, ctx.blk, ctx.launch), mask)
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
        handler = CALLS.get(name)
        if handler is None:
            raise Unsupported(f"{fname}: call to {name}")
        return handler(self, e, [a for a in args], fname)



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
    E.BitwiseAnd: lambda _: (lambda a, b: a & b),
    E.BitwiseOr: lambda _: (lambda a, b: a | b),
    E.BitwiseXor: lambda _: (lambda a, b: a ^ b),
    E.LShift: lambda _: (lambda a, b: a << b),
    E.RShift: lambda _: (lambda a, b: a >> b),
}
