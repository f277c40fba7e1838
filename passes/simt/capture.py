"""What a CUDA build compiled, captured as it passes through TVM: the device functions nvcc gets, and the host
functions' kernel launches (which kernel, on which tensors, with which grid and block).

Why: an emulation must run the IR the build ships, not one rebuilt beside it; so the capture hooks the two points
every CUDA build goes through (``target.build.cuda`` and ``split_host_device_mods``) while the product builds.
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm.ir import expr as X
from tvm.ir.prim import expr as E
from tvm.tirx import stmt as S

from .errors import Unsupported


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

    for s in statements(host_func.body):
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



def statements(stmt):
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


def thread_extents(stmt) -> dict:
    """The extents of a kernel's ``thread_extent`` attributes, by thread tag."""
    return {s.node.thread_tag: int(s.value) if isinstance(s.value, E.IntImm) else s.value
            for s in statements(stmt) if isinstance(s, S.AttrStmt) and s.attr_key == "thread_extent"}
