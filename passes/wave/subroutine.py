"""One copy of a kernel launch's code per flow run, however many members run it: a CUDA device function.

Why: a flow run (:mod:`passes.wave.flow`) holds every launch of every unit of up to a whole model, and many of
them run one kernel function (RandWire's 274 launches run 112 functions). With a copy of the code per member the
run's kernel was as large as the unfused program in one function: 17.6 MB of CUDA source for RandWire, 295 s of
lowering and 389 s of nvcc here. TIR cannot choose a tensor pointer at run time (TVM 0.27 refuses a ``Select``
or a bound ``if_then_else`` of pointers), but a call can pass different pointers. So each (kernel function,
launch) of the run becomes a private PrimFunc with a device target, which TVM 0.27 compiles into a CUDA
``__device__`` function; it takes its tensors' pointers, the member's block index and the thread index, and the
flow launch's task dispatch calls it with the member's tensors.

Shared memory: CUDA allocates the ``__shared__`` arrays of every device function a kernel calls side by side, so
a run calling 112 functions would declare their sum. A subroutine therefore declares none. Its shared buffers are
views, at fixed offsets, into one pool per data type that the flow launch declares as large as the largest
subroutine needs. A block runs one member at a time, so one pool serves them all. The launch passes the pool
whole (its pointer, not the address of an element): TVM's ``CompactBufferAllocation`` would otherwise shrink the
pool to the element an address names.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import tvm
from tvm import tirx
from tvm.tirx import stmt as S

from ..cuda_compile import NOINLINE_SUFFIX
from .cuda import Launch, member_stmt
from .lowered import LoweredKernel, NotFusable, rebuild

SUBROUTINE_ATTR = "tvm_interop.device_subroutine"   # the build keeps these private device functions
SHARED_ALIGN = 64   # bytes: each shared buffer starts at a multiple (TVM declares its shared arrays alignas(64))


def _elements(buf) -> int:
    n = 1
    for d in buf.shape:
        if not isinstance(d, tirx.IntImm):
            raise NotFusable(f"a shared buffer {buf.name} of a shape that is not constant")
        n *= int(d.value)
    return n


def _bytes(dtype: str) -> int:
    return max(tvm.runtime.DataType(dtype).bits * tvm.runtime.DataType(dtype).lanes // 8, 1)


def _is_shared_alloc(stmt) -> bool:
    return isinstance(stmt, S.AllocBuffer) and stmt.buffer.scope().startswith("shared")


def shared_allocations(stmts: list) -> list:
    """The shared buffers allocated under ``stmts``, in order (``shared.dyn`` refused: a flow launch declares its
    shared memory statically)."""
    found = []

    def visit(s):
        if _is_shared_alloc(s):
            if s.buffer.scope() != "shared":
                raise NotFusable(f"a {s.buffer.scope()} buffer ({s.buffer.name}): the flow launch declares its "
                                 "shared memory statically")
            found.append(s.buffer)
        return s

    for s in stmts:
        rebuild(s, visit)
    return found


@dataclass
class SharedLayout:
    """Where a subroutine's shared buffers lie in the pools: buffer -> (dtype, element offset); ``need``: elements
    of each dtype's pool the subroutine uses."""

    offsets: dict = field(default_factory=dict)
    need: dict = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(n * _bytes(d) for d, n in self.need.items())


def shared_layout(buffers: list) -> SharedLayout:
    """The buffers end to end in their dtype's pool, each at a multiple of :data:`SHARED_ALIGN` bytes."""
    out = SharedLayout()
    for buf in buffers:
        dtype = str(buf.dtype)
        align = max(SHARED_ALIGN // _bytes(dtype), 1)
        at = -(-out.need.get(dtype, 0) // align) * align
        out.offsets[buf] = (dtype, at)
        out.need[dtype] = at + _elements(buf)
    return out


def pooled_shared_bytes(kern: LoweredKernel) -> int:
    """Shared memory the kernel's subroutine takes from the pools (its buffers laid out as :func:`shared_layout`)."""
    return shared_layout(shared_allocations(list(kern.decls) + [n.stmt.body for n in kern.nests])).bytes


@dataclass
class Subroutine:
    """A device function of the run: ``gvar`` to call, the number of tensor pointers it takes first, then the
    block and thread indices, then one pool pointer per dtype of ``pool_dtypes``."""

    func: tirx.PrimFunc
    gvar: tvm.ir.GlobalVar
    num_tensors: int
    pool_dtypes: list[str]
    layout: SharedLayout

    def call(self, tensors: list, local_b, tx, pools: dict) -> S.Evaluate:
        """The statement calling it (``pools``: dtype -> the launch's pool buffer)."""
        if len(tensors) != self.num_tensors:
            raise NotFusable(f"{self.gvar.name_hint} takes {self.num_tensors} tensors, the member passes "
                             f"{len(tensors)}")
        args = list(tensors) + [local_b, tx] + [pools[d].data for d in self.pool_dtypes]
        return S.Evaluate(tvm.ir.Call(self.gvar, args, ret_ty="void"))


def _pointer(name: str, dtype: str, scope: str) -> tirx.Var:
    return tirx.Var(name, tvm.ir.PointerType(tvm.ir.PrimType(dtype), scope))


def _pools_in(layout: SharedLayout, name: str) -> tuple[dict, dict]:
    """The subroutine's pool parameters (dtype -> pointer var) and their buffer views (dtype -> buffer)."""
    params, views = {}, {}
    for dtype, n in sorted(layout.need.items()):
        ptr = _pointer(f"{name}_pool_{dtype}", dtype, "shared")
        params[dtype] = ptr
        views[dtype] = tirx.decl_buffer((n,), dtype, name=f"{name}_pool_{dtype}_buf", data=ptr, scope="shared")
    return params, views


def _into_pools(layout: SharedLayout, views: dict):
    """A statement rewriter turning each shared allocation into a declaration of the same buffer on the address of
    its place in the pool (the body that uses it is left untouched)."""
    def rewrite(s):
        if _is_shared_alloc(s):
            dtype, at = layout.offsets[s.buffer]
            where = tirx.address_of(tirx.BufferLoad(views[dtype], [tirx.IntImm("int64", at)]))
            return S.DeclBuffer(s.buffer, data=where)
        return s

    return rewrite


def make_subroutine(kern: LoweredKernel, nest: int, block: int, grid: int, name: str,
                    inline: bool = True) -> Subroutine:
    """Launch ``nest`` of ``kern`` as a device function for a flow run whose blocks have ``block`` threads (the
    launch's ``grid`` blocks there, :func:`cuda.member_stmt`): parameters its tensors' pointers (in the kernel's
    parameter order), the member's block index and the fused thread index (``int64``), then the pools.

    ``inline=False`` names it so that the build compiles it as a function of its own that the flow kernel calls
    (``cuda_compile.with_noinline_functions``): one copy of its machine code however many call sites it has, where
    nvcc inlines most subroutines into the kernel (RandWire's run: 6 of 112 kept as calls) and the kernel's code
    stays close to one copy per member. The variant that tells whether the instruction cache is what a flow
    launch pays for."""
    if not inline:
        name += NOINLINE_SUFFIX
    la: Launch = kern.nests[nest].stmt
    allocs = shared_allocations(list(kern.decls) + [la.body])
    layout = shared_layout(allocs)
    pool_params, views = _pools_in(layout, name)
    rewrite = _into_pools(layout, views)
    tensors = [_pointer(f"{p.name}_ptr", str(p.dtype), "global") for p in kern.params]
    local_b = tirx.Var(f"{name}_b", "int64")
    tx = tirx.Var(f"{name}_tx", "int64")
    moved = copy.copy(la)
    moved.body = rebuild(la.body, rewrite)
    body = ([S.DeclBuffer(p, data=t) for p, t in zip(kern.params, tensors)]
            + [S.DeclBuffer(views[d], data=pool_params[d]) for d in views]
            + [rebuild(d, rewrite) for d in kern.decls]
            + [member_stmt(moved, block, local_b, tx, grid)])
    params = tensors + [local_b, tx] + list(pool_params.values())
    attrs = {"tirx.is_scheduled": True, "tirx.noalias": True, SUBROUTINE_ATTR: True}
    func = tirx.PrimFunc(params, S.SeqStmt(body), attrs=tvm.ir.make_node("ir.DictAttrs", **attrs))
    return Subroutine(func, tvm.ir.GlobalVar(name), len(tensors), list(pool_params), layout)


def keep_device_subroutines(target: tvm.target.Target) -> tvm.transform.Pass:
    """The last pass of a CUDA build: the flow runs' subroutines made private device functions again.

    Why: Relax's ``AttachGlobalSymbol`` gives every PrimFunc a global symbol, and TVM then compiles a function with
    one as a host entry point (``MakePackedAPI``), which a kernel cannot call. Without the symbol and with the
    device target alone, TVM 0.27 emits a ``__device__`` function that the flow kernel calls directly."""
    device = tvm.target.Target({k: v for k, v in dict(target.export()).items() if k != "host"})

    @tvm.transform.module_pass(opt_level=0, name="InteropKeepDeviceSubroutines")
    def _pass(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, tirx.PrimFunc) and func.attrs is not None and SUBROUTINE_ATTR in func.attrs:
                updates[gv] = func.without_attr("global_symbol").with_attr("target", device)
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return _pass
