"""Library units: convolutions and dense layers run by cuDNN / cuBLAS instead of a TVM kernel (CUDA targets).

TVM's default CUDA kernels are 1.4-2.2x slower than cuDNN on an H100 (``../shared/gpu-data``), and IOS's own units
are cuDNN kernels. The PyPI TVM wheel has neither library, so the calls go to our native extension
(``runtime/native``, built by :mod:`passes.native_build`), which registers these global functions:

``tvm_interop.cudnn.conv2d(params, x, w, [bias], [z], out)``
    ``out = act(conv2d(x, w) + bias + z)``, NCHW / OIHW, fp32; ``params`` = ``[stride_h, stride_w, pad_h, pad_w,
    dil_h, dil_w, groups, has_bias, has_z, relu, tf32]``.
``tvm_interop.cublas.dense(params, x, w, [bias], out)``
    ``out = act(x @ w' + bias)``; ``params`` = ``[has_bias, relu, w_transposed, tf32]`` (``w`` is [N, K] when
    ``w_transposed`` = 1, else [K, N]).

**Which units.** A unit is offloadable when its fused PrimFunc is, block by block, exactly one of those calls:
an optional padding block, one reduction block that is a 2-d convolution (``conv2d_nchw`` /
``group_conv2d_nchw``) or a 2-d matmul, then element-wise blocks that each add one kernel parameter (a bias
with one value per output channel, or a residual ``z`` of the output's shape) or take ``max(x, 0)`` (ReLU, last).
The convolution's strides, padding, dilation and groups are not visible in TIR; they come from the ``relax.nn.
conv2d`` the weight belonged to before legalization (``prepare.collect_conv_attrs``), and are cross-checked
against the shapes (the output size they imply must be the unit's). Everything else is left to TVM with the
reason recorded (:class:`OffloadReport`): multiply epilogues (RandWire's weighted sums), asymmetric padding
(cuDNN pads symmetrically), non-NCHW layouts, a weight that is not a constant, and so on.

**How.** :func:`apply_offload` rewrites the prepared program's ``main``: the unit's ``call_tir`` binding becomes
``call_dps_packed(<library function>, (params, x, w, ...), out_sinfo)``; :func:`passes.extract.extract` reads
such a binding back as a unit (same name, kind, arguments and outputs as the TVM kernel's, so the graph
fingerprint is unchanged; ``attrs["library"]``), so schedulers, the lowering,
the memory check and bundles treat it like any other unit. Like ``call_tir`` it is a destination-passing call
whose output the next units read, so TVM's memory planner sees its arguments as uses and no pass drops it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import tvm
from tvm import relax

from tvm_interop.runtime.errors import InteropError

from .extract import Program, extract
from .prepare import CONV_ATTRS, weight_key

CONV2D_FUNC = "tvm_interop.cudnn.conv2d"
DENSE_FUNC = "tvm_interop.cublas.dense"
LIBRARY_FUNCS = (CONV2D_FUNC, DENSE_FUNC)
LIBRARY_OF = {CONV2D_FUNC: "cudnn", DENSE_FUNC: "cublas"}
UNIT_CHOICES = ("tvm", "cudnn", "auto")
CONV_PARAMS = ("stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w", "groups", "has_bias", "has_z", "relu",
               "tf32")
DENSE_PARAMS = ("has_bias", "relu", "w_transposed", "tf32")

_CONV_BLOCKS = ("conv2d_nchw", "group_conv2d_nchw")
_MATMUL_BLOCKS = ("matmul", "T_matmul_NT", "NT_matmul", "T_matmul")
_PAD_BLOCKS = ("pad_temp",)


@dataclass(frozen=True)
class LibraryCall:
    """How one unit runs as a library call: ``func(params, *[args[i] for i in arg_index], out)``."""

    func: str
    params: tuple[int, ...]
    arg_index: tuple[int, ...]     # positions in the unit's call_tir arguments: x, w, then bias and z if present
    flops: float

    @property
    def library(self) -> str:
        return LIBRARY_OF[self.func]

    def named_params(self) -> dict[str, int]:
        names = CONV_PARAMS if self.func == CONV2D_FUNC else DENSE_PARAMS
        return dict(zip(names, self.params))

    def to_json(self) -> dict:
        return {"func": self.func, "params": self.named_params(), "flops": self.flops}


@dataclass
class OffloadReport:
    """Which units run as library calls and, for every other convolution / matmul unit, why not."""

    units: str = "tvm"
    tf32: bool = False
    offloaded: dict[str, LibraryCall] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    chosen_by: dict[str, str] = field(default_factory=dict)   # unit -> why this implementation (auto mode)
    clock: str | None = None   # auto mode: the cost table's clock the choice compared ("issue" or "device")

    def summary(self) -> str:
        libs: dict[str, int] = {}
        for c in self.offloaded.values():
            libs[c.library] = libs.get(c.library, 0) + 1
        parts = [f"{n} {lib}" for lib, n in sorted(libs.items())]
        by = f" (chosen by {self.clock}-clock times)" if self.clock else ""
        return (f"library units: {', '.join(parts) if parts else 'none'}{by}; "
                f"{len(self.refused)} convolution/matmul unit(s) left to TVM")

    def to_json(self) -> dict:
        return {"units": self.units, "tf32": self.tf32,
                "offloaded": {u: c.to_json() for u, c in self.offloaded.items()},
                "refused": dict(self.refused), "chosen_by": dict(self.chosen_by),
                **({"clock": self.clock} if self.clock else {})}


# ------------------------------------------------------------------------------------------------ TIR reading
def _blocks(func: tvm.tirx.PrimFunc) -> list:
    sch = tvm.s_tir.Schedule(func)
    root = sch.get_sblock("root")
    out = []
    for b in sch.get_child_blocks(root):
        if sch.get_child_blocks(b):
            return []          # nested blocks: not a plain legalized operator
        out.append(sch.get(b))
    return out


def _is(e, *names: str) -> bool:
    return type(e).__name__ in names


def _buf(load):
    """The tensor a load reads (``TensorLoad.source`` in TVM 0.27's TIR; ``BufferLoad.buffer`` before)."""
    return load.source if hasattr(load, "source") else load.buffer


def _loads(e) -> list:
    """The tensor loads of an element-wise expression (direct operands only)."""
    if _is(e, "TensorLoad", "BufferLoad"):
        return [e]
    return []


def _param_index(func, buf) -> int | None:
    for i, p in enumerate(func.params):
        if p.same_as(buf):
            return i
    return None


def _is_zero(e) -> bool:
    return _is(e, "FloatImm", "IntImm") and float(e.value) == 0.0


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _conv_out_size(size: int, k: int, stride: int, pad_total: int, dil: int) -> int:
    return (size + pad_total - dil * (k - 1) - 1) // stride + 1


def match_unit(program: Program, unit: str, tf32: bool = False) -> "LibraryCall | str":
    """The library call equivalent to ``unit``'s kernel, or the reason there is none (a string)."""
    uc = program.calls[unit]
    if uc.func_name in LIBRARY_FUNCS:
        return "already a library call"
    func = program.mod[uc.func_name]
    if not isinstance(func, tvm.tirx.PrimFunc):
        return f"{uc.func_name} is not a TIR kernel"
    blocks = _blocks(func)
    if not blocks:
        return f"{uc.func_name}: nested blocks (not a plain legalized operator)"
    names = [b.name_hint for b in blocks]
    k = 0
    if names[0] in _PAD_BLOCKS:
        k = 1
    if k >= len(blocks) or blocks[k].init is None:
        return f"{uc.func_name}: no reduction block where the convolution / matmul should be (blocks {names})"
    main = blocks[k]
    n_in = len(uc.args)
    infos = [program.graph.unit(unit).inputs[i] for i in range(n_in)] if hasattr(program.graph, "unit") else None
    if infos is None:
        infos = [_info_of(program, r) for r in uc.args]
    out_info = uc.outputs[0] if len(uc.outputs) == 1 else None
    if out_info is None:
        return f"{uc.func_name}: {len(uc.outputs)} outputs"
    if any(str(i.dtype) != "float32" for i in infos) or str(out_info.dtype) != "float32":
        return f"{uc.func_name}: not float32 (the library calls are fp32)"

    # ---- the reduction: which parameter is the data, which the weight
    body = main.body
    if not _is(body, "BufferStore") or not _is(body.value, "Add"):
        return f"{uc.func_name}: block {main.name_hint} is not a sum of products"
    prod = body.value.b
    if not _is(prod, "Mul") or not (_loads(prod.a) and _loads(prod.b)):
        return f"{uc.func_name}: block {main.name_hint} is not a sum of products"
    lhs, rhs = prod.a, prod.b
    if main.name_hint in _CONV_BLOCKS:
        kind = "conv2d"
    elif main.name_hint in _MATMUL_BLOCKS:
        kind = "dense"
    else:
        return f"{uc.func_name}: {main.name_hint} is neither a 2-d convolution nor a matmul"
    w_idx = _param_index(func, _buf(rhs))
    if w_idx is None:
        return f"{uc.func_name}: the weight of {main.name_hint} is not a kernel parameter"
    if k == 1:   # data goes through the padding block
        pad = blocks[0]
        pl = [e for e in _flat_loads(pad.body.value)]
        x_idx = _param_index(func, _buf(pl[0])) if len(pl) == 1 else None
        if not _buf(lhs).same_as(pad.body.buffer):
            return f"{uc.func_name}: the convolution does not read the padding block's output"
    else:
        x_idx = _param_index(func, _buf(lhs))
    if x_idx is None:
        return f"{uc.func_name}: the data of {main.name_hint} is not a kernel parameter"
    if uc.args[w_idx].kind != "const":
        return f"{uc.func_name}: the weight is computed at run time, not a constant"

    # ---- element-wise epilogue: + bias, + z, then max(., 0)
    prev = body.buffer
    bias_idx = z_idx = None
    relu = False
    for b in blocks[k + 1:]:
        st = b.body
        if not _is(st, "BufferStore") or b.init is not None:
            return f"{uc.func_name}: block {b.name_hint} is not element-wise"
        v = st.value
        if relu:
            return f"{uc.func_name}: {b.name_hint} follows the ReLU"
        if _is(v, "Max") and _loads(v.a) and _buf(v.a).same_as(prev) and _is_zero(v.b):
            relu = True
        elif _is(v, "Add") and _loads(v.a) and _loads(v.b):
            a, c = (v.a, v.b) if _buf(v.a).same_as(prev) else (v.b, v.a)
            if not _buf(a).same_as(prev):
                return f"{uc.func_name}: {b.name_hint} does not continue the chain"
            pi = _param_index(func, _buf(c))
            if pi is None or pi >= n_in:
                return f"{uc.func_name}: {b.name_hint} adds an intermediate, not a kernel input"
            shape = tuple(int(d) for d in infos[pi].shape)
            out_shape = tuple(int(d) for d in out_info.shape)
            channels = out_shape[1]
            is_bias = _broadcast_bias(shape, channels, kind) and (shape == out_shape or _bias_indexing_ok(c, kind))
            if is_bias and bias_idx is None:   # (an output of one value per channel: bias and z coincide)
                bias_idx = pi
            elif shape == out_shape and z_idx is None and kind == "conv2d":
                z_idx = pi
            else:
                return f"{uc.func_name}: {b.name_hint} adds a tensor of shape {list(shape)} (neither a bias of "\
                       f"{channels} channels nor a residual of the output's shape)"
        else:
            op = _op_name(v)
            return f"{uc.func_name}: epilogue block {b.name_hint} ({op}) has no library equivalent"
        prev = st.buffer
    if _param_index(func, prev) != n_in:
        return f"{uc.func_name}: the last block does not write the kernel's output"

    x_info, w_info = infos[x_idx], infos[w_idx]
    arg_index = (x_idx, w_idx) + ((bias_idx,) if bias_idx is not None else ()) + ((z_idx,) if z_idx is not None else ())
    if arg_index != tuple(range(n_in)):
        # the library call takes (x, w, bias, z): a kernel that takes them in another order would change the
        # unit's signature, and with it the graph fingerprint that schedules and cost tables are checked against
        return f"{uc.func_name}: takes its arguments in another order than the library call ({list(arg_index)})"
    if kind == "dense":
        return _dense_call(uc.func_name, main, lhs, rhs, x_info, w_info, out_info, arg_index, bias_idx is not None,
                           relu, tf32)
    return _conv_call(program, uc, x_info, w_info, out_info, arg_index, bias_idx is not None, z_idx is not None,
                      relu, tf32)


def _flat_loads(e) -> list:
    """Every tensor load inside ``e`` (the padding block's ``if_then_else(..., x[...], 0)``)."""
    found = []

    def walk(x):
        if _is(x, "TensorLoad", "BufferLoad"):
            found.append(x)
            return
        for attr in ("a", "b", "true_value", "false_value", "value", "condition"):
            if hasattr(x, attr):
                try:
                    walk(getattr(x, attr))
                except Exception:  # noqa: BLE001 - not an expression field
                    pass
        if _is(x, "Call"):
            for arg in x.args:
                walk(arg)

    walk(e)
    return found


def _op_name(e) -> str:
    if _is(e, "Call"):
        return str(e.op.name) if hasattr(e.op, "name") else "call"
    return type(e).__name__.lower()


def _broadcast_bias(shape: tuple, channels: int, kind: str) -> bool:
    """One value per output channel, laid out to broadcast along the channel axis."""
    if _numel(shape) != channels:
        return False
    if kind == "dense":
        return shape in ((channels,), (1, channels))
    return shape in ((channels,), (1, channels, 1, 1), (channels, 1, 1))


def _bias_indexing_ok(load, kind: str) -> bool:
    """The bias load must index its channel axis with the output's channel variable (not, say, a spatial one)."""
    idx = list(load.indices)
    non_const = [i for i in idx if not _is(i, "IntImm")]
    return len(non_const) <= 2 and len(idx) in ((1, 2) if kind == "dense" else (1, 3, 4))


def _dense_call(fname, main, lhs, rhs, x_info, w_info, out_info, arg_index, has_bias, relu, tf32):
    if len(x_info.shape) != 2 or len(w_info.shape) != 2 or len(out_info.shape) != 2:
        return f"{fname}: matmul of rank {len(x_info.shape)} x {len(w_info.shape)} (the library call takes 2-d)"
    red = [iv.var for iv in main.iter_vars if int(iv.iter_type) == 2]
    if len(red) != 1:
        return f"{fname}: matmul with {len(red)} reduction axes"
    r = red[0]

    def axis_of(load):
        for i, e in enumerate(load.indices):
            if e.same_as(r):
                return i
        return None

    if axis_of(lhs) != 1:
        return f"{fname}: the data is not reduced over its last axis"
    wa = axis_of(rhs)
    if wa is None:
        return f"{fname}: the weight is not indexed by the reduction axis"
    w_transposed = 1 if wa == 1 else 0
    m, kdim = (int(d) for d in x_info.shape)
    n = int(w_info.shape[0] if w_transposed else w_info.shape[1])
    if int(w_info.shape[1 if w_transposed else 0]) != kdim or tuple(int(d) for d in out_info.shape) != (m, n):
        return f"{fname}: shapes {list(x_info.shape)} x {list(w_info.shape)} -> {list(out_info.shape)} do not agree"
    params = (int(has_bias), int(relu), w_transposed, int(tf32))
    return LibraryCall(DENSE_FUNC, params, arg_index, 2.0 * m * n * kdim)


def _conv_call(program, uc, x_info, w_info, out_info, arg_index, has_bias, has_z, relu, tf32):
    table = _conv_table(program)
    w = program.constants[uc.args[arg_index[1]].index]
    conv = table.get(weight_key(w))
    fname = uc.func_name
    if conv is None:
        return f"{fname}: the convolution's attributes were not recorded (weight not found before legalization)"
    if conv.get("ambiguous"):
        return f"{fname}: the weight is shared by convolutions with different attributes"
    if conv["data_layout"] != "NCHW" or conv["kernel_layout"] != "OIHW":
        return f"{fname}: layout {conv['data_layout']}/{conv['kernel_layout']} (the library call takes NCHW/OIHW)"
    top, left, bottom, right = conv["padding"]
    if top != bottom or left != right:
        return f"{fname}: asymmetric padding {conv['padding']} (cuDNN pads symmetrically)"
    sh, sw = conv["strides"]
    dh, dw = conv["dilation"]
    groups = int(conv["groups"])
    n, c, h, wd = (int(d) for d in x_info.shape)
    o, cg, kh, kw = (int(d) for d in w_info.shape)
    expect = (n, o, _conv_out_size(h, kh, sh, top + bottom, dh), _conv_out_size(wd, kw, sw, left + right, dw))
    if cg * groups != c or o % groups or tuple(int(d) for d in out_info.shape) != expect:
        return (f"{fname}: recorded attributes (strides {conv['strides']}, padding {conv['padding']}, groups "
                f"{groups}) do not reproduce the kernel's shapes {list(x_info.shape)} -> {list(out_info.shape)}")
    params = (sh, sw, top, left, dh, dw, groups, int(has_bias), int(has_z), int(relu), int(tf32))
    flops = 2.0 * n * o * expect[2] * expect[3] * cg * kh * kw
    return LibraryCall(CONV2D_FUNC, params, arg_index, flops)


def _conv_table(program: Program) -> dict:
    cache = program.__dict__.setdefault("_offload_conv_table", None)
    if cache is None:
        attrs = program.mod.attrs
        cache = json.loads(str(attrs[CONV_ATTRS])) if attrs is not None and CONV_ATTRS in attrs else {}
        program.__dict__["_offload_conv_table"] = cache
    return cache


def _info_of(program: Program, ref):
    return program.info_of(ref)


_CANDIDATE = re.compile(r"^(fused_)?(conv2d|matmul|dense)")


def is_candidate(func_name: str) -> bool:
    """Units whose kernel starts with a convolution or matmul: the ones a report must account for."""
    return bool(_CANDIDATE.match(func_name))


# ------------------------------------------------------------------------------------------------ planning
def plan_offload(program: Program, units: str = "cudnn", tf32: bool = False,
                 measured: "dict[str, tuple[float, float]] | None" = None, clock: str | None = None) -> OffloadReport:
    """Decide, unit by unit, TVM kernel or library call.

    ``units``: ``"tvm"`` (none offloaded), ``"cudnn"`` (every offloadable unit), ``"auto"`` (per unit, whichever
    ``measured`` says is faster: ``{unit: (tvm_seconds, library_seconds)}`` from a profiling bundle measured on the
    device; a unit without both measurements runs as the library call, which the H100 runs measured faster in
    aggregate, and the reason says so). ``clock`` names the table clock the times come from, for the report.
    """
    if units not in UNIT_CHOICES:
        raise InteropError(f"unknown units choice {units!r}; use one of {', '.join(UNIT_CHOICES)}")
    report = OffloadReport(units=units, tf32=bool(tf32), clock=clock if units == "auto" and measured else None)
    if units == "tvm":
        return report
    for name, uc in program.calls.items():
        if not is_candidate(uc.func_name):
            continue
        found = match_unit(program, name, tf32=tf32)
        if isinstance(found, str):
            report.refused[name] = found
            continue
        if units == "auto":
            times = (measured or {}).get(name)
            if times is None or times[0] is None or times[1] is None:
                report.chosen_by[name] = "library (no device measurement of both implementations)"
            elif times[0] <= times[1]:
                report.refused[name] = (f"TVM kernel measured faster ({times[0] * 1e6:.1f} us vs "
                                        f"{found.library} {times[1] * 1e6:.1f} us)")
                continue
            else:
                report.chosen_by[name] = (f"{found.library} measured faster ({times[1] * 1e6:.1f} us vs TVM "
                                          f"{times[0] * 1e6:.1f} us)")
        report.offloaded[name] = found
    return report


def library_value(call: LibraryCall, args: list, out_ty) -> relax.Call:
    """The Relax expression of one library call: ``call_dps_packed(func, (params, *args), out_ty)``."""
    params = relax.ShapeExpr([int(p) for p in call.params])
    return relax.call_dps_packed(relax.ExternFunc(call.func), relax.Tuple([params] + list(args)), out_ty)


def apply_offload(program: Program, report: OffloadReport) -> Program:
    """The program with every unit of ``report.offloaded`` rewritten as its library call (see module docstring).
    Constants keep their indices, so weights passed by position stay valid."""
    if not report.offloaded:
        return program
    by_var = {program.calls[u].binding_var: c for u, c in report.offloaded.items()}
    main = program.mod["main"]
    blocks = []
    for block in main.body.blocks:   # same variables, new values: nothing downstream needs remapping
        bindings = []
        for b in block.bindings:
            call = by_var.get(b.var)
            if call is not None:
                args = list(b.value.args[1].fields)
                b = relax.VarBinding(b.var, library_value(call, [args[i] for i in call.arg_index], b.var.ty))
            bindings.append(b)
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    new_main = relax.Function(main.params, relax.SeqExpr(blocks, main.body.body), main.ret_ty, main.is_pure,
                              main.attrs)
    mod = tvm.IRModule({gv: f for gv, f in program.mod.functions.items() if gv.name_hint != "main"},
                       attrs=program.mod.attrs)
    mod["main"] = new_main
    mod = relax.transform.Normalize()(mod)
    new_program = extract(mod, program.graph.name, known_constants=program.const_exprs)
    new_program.__dict__["offload"] = report
    return new_program


def ensure_extension() -> dict:
    """Build (or take from the cache) the native extension and load it into this process, so that an in-process
    VM finds the library functions; returns what the plan records (``plan.meta["native_extension"]``): the
    object file that :func:`passes.cuda_compile.export_cuda_library` links into the exported ``.so``."""
    from tvm_interop.runtime.native_libs import load_extension

    from .native_build import build_extension

    ext = build_extension()
    load_extension(ext.shared_path)
    return {"object": ext.object_path, "source_hash": ext.source_hash, "functions": list(ext.functions)}


def offload(program: Program, units: str = "cudnn", tf32: bool = False,
            measured: "dict[str, tuple[float, float]] | None" = None,
            clock: str | None = None) -> tuple[Program, OffloadReport]:
    """:func:`plan_offload` then :func:`apply_offload`."""
    report = plan_offload(program, units=units, tf32=tf32, measured=measured, clock=clock)
    return apply_offload(program, report), report
