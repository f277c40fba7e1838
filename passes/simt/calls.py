"""The intrinsics and extern calls a kernel may make (barriers, atomics, polls, shuffles, math), each compiled to a
closure over the running block: ``handler(emu, call, args, fname) -> run(ctx, mask)``.

Why a table: a call the emulator does not list is refused by name (:class:`Unsupported`), so a kernel that uses
something new is never run on a guess.
"""
from __future__ import annotations

import numpy as np
from tvm.ir import expr as X

from .errors import EmulationError, Unsupported
from .memory import NP, WARP, Pointer, any_active, full_mask, lookup, scalar_dtype, select_value, uniform_value


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
        return Pointer(st, uniform_value(ctx, i, mask, fname, "a pointer"))
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
        mask = full_mask(mask, ctx.blk.threads)
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
        k = uniform_value(ctx, i, mask, fname, "a polled counter")
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
        m = full_mask(mask, ctx.blk.threads)
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
            m = full_mask(mask, ctx.blk.threads)
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
        dt = NP[scalar_dtype(e.ty)]
        return lambda ctx, mask: np.asarray(fn(*[f(ctx, mask) for f in fs])).astype(dt)
    return make


def _call_if_then_else(emu, e, args, fname):
    c, t, f = (emu._expr(a, fname) for a in args)

    def run(ctx, mask):
        cv = c(ctx, mask)
        if not isinstance(cv, np.ndarray):
            return t(ctx, mask) if cv else f(ctx, mask)
        mt, mf = mask & cv, mask & ~cv
        tv = t(ctx, mt) if any_active(mt) else None
        fv = f(ctx, mf) if any_active(mf) else None
        if tv is None:
            return fv
        if fv is None:
            return tv
        return select_value(cv, tv, fv)
    return run



def _call_buffer_data(emu, e, args, fname):
    return lookup(args[0], f"{fname}: the data of unknown buffer {args[0].name}")


def _call_reinterpret(emu, e, args, fname):
    v = emu._expr(args[0], fname)
    dt = NP[scalar_dtype(e.ty)]
    return lambda ctx, mask: np.asarray(v(ctx, mask)).view(dt)


CALLS = {
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
