"""Lowering, part 2: the stream-lowered Relax program (what the VM runs, on GPU streams).

``lower_to_relax`` returns a rewritten Relax ``main`` whose bindings follow the schedule, with stream switching and
  cross-stream synchronisation through TVM's stream runtime functions (``runtime.Device_StreamCreate``,
  ``runtime.Device_SetStream``, ``runtime.Device_StreamSyncFromTo``, ``runtime.Device_StreamFree``). On a CPU
  those calls do nothing, but the program is the same one a GPU runs.

Memory (DESIGN.md): TVM's StaticPlanBlockMemory reuses a buffer as soon as its last reader has been *issued*,
which assumes sequential execution. In the lowered program every tensor read or written inside a concurrent
stage is also passed to that stage's closing synchronisation call (a tuple of "keep-alive" tensors), so its
lifetime extends to the point where the whole stage has joined; no tensor the stage touches can be reused by a
unit that may still be running beside it.
"""
from __future__ import annotations

import tvm
from tvm import relax

from runtime.errors import ScheduleError

from .extract import Program
from .schedule import MERGE, Schedule


# ---------------------------------------------------------------------------------------------- relax
def _device_string(target: tvm.target.Target) -> str:
    kind = target.kind.name
    if kind in ("cuda", "rocm", "vulkan", "metal", "opencl"):
        return f"{kind}:0"
    return "cpu:0"


def lower_to_relax(program: Program, schedule: Schedule, target: "str | tvm.target.Target" = "llvm",
                   max_streams: int = 8) -> tvm.IRModule:
    """Return a copy of the prepared module whose ``main`` runs ``schedule`` on streams.

    Layout of the new main (one non-dataflow block, because stream calls have side effects):
    create streams; for each stage: make every stream of the stage wait for the main stream (fork), switch to
    the group's stream and issue its units, then make the main stream wait for every stream used (join) and pass
    the stage's tensors to a keep-alive tuple; finally free the streams and return.
    Groups beyond ``max_streams`` share streams round-robin (still correct: same-stream work is ordered).
    """
    if isinstance(target, str):
        target = tvm.target.Target(target)
    schedule.validate(program.graph)
    mod = program.mod
    old_main = mod["main"]
    dev = relax.expr.StringImm(_device_string(target)) if hasattr(relax.expr, "StringImm") \
        else tvm.ir.expr.StringImm(_device_string(target))
    obj = relax.ObjectType()
    n_streams = max(1, min(max_streams, schedule.max_concurrency()))

    bb = relax.BlockBuilder()
    params = [relax.Var(p.name, p.ty) for p in old_main.params]
    var_map: dict[relax.Var, relax.Expr] = dict(zip(old_main.params, params))

    def packed(name: str, *args):
        return relax.Call(relax.ExternFunc(name), list(args), ty_args=[obj])

    # Non-call bindings of the old main (aliases, tuples, tuple items) are re-emitted lazily when needed.
    old_bindings: dict[relax.Var, relax.Expr] = {}
    unit_binding: dict[str, relax.VarBinding] = {}
    for block in old_main.body.blocks:
        for b in block.bindings:
            old_bindings[b.var] = b.value
    for name, uc in program.calls.items():
        unit_binding[name] = uc.binding_var

    def remap(e: relax.Expr) -> relax.Expr:
        if isinstance(e, relax.Var):
            if e in var_map:
                return var_map[e]
            if e in old_bindings:  # a glue binding (tuple / tuple item / alias) whose inputs are now available
                nv = bb.emit(remap(old_bindings[e]), name_hint=e.name)
                var_map[e] = nv
                return nv
            raise ScheduleError(f"variable {e.name} used before it is produced in the schedule")
        if isinstance(e, relax.Tuple):
            return relax.Tuple([remap(f) for f in e.fields])
        if isinstance(e, relax.TupleGetItem):
            return relax.TupleGetItem(remap(e.tuple_value), e.index)
        if isinstance(e, relax.Call):
            return relax.Call(e.op, [remap(a) for a in e.args], e.attrs, e.ty_args)
        return e

    with bb.function("main", params, attrs=dict(old_main.attrs) if old_main.attrs else None):
        streams = [bb.emit(packed("runtime.Device_StreamCreate", dev), name_hint=f"stream{k}")
                   for k in range(n_streams)] if n_streams > 1 else []
        main_stream = relax.prim_value(tvm.tirx.IntImm("int64", 0))
        for stage in schedule.stages:
            groups = [[u] for u in stage.units] if stage.strategy == MERGE else stage.groups
            concurrent = len(groups) > 1 and streams
            touched: list[relax.Expr] = []
            used_streams = []
            for gi, group in enumerate(groups):
                if concurrent:
                    s = streams[gi % n_streams]
                    if s not in used_streams:
                        used_streams.append(s)
                        bb.emit(packed("runtime.Device_StreamSyncFromTo", dev, main_stream, s))
                    bb.emit(packed("runtime.Device_SetStream", dev, s))
                for name in group:
                    var = unit_binding[name]
                    value = old_bindings[var]
                    new_value = remap(value)
                    nv = bb.emit(new_value, name_hint=var.name)
                    var_map[var] = nv
                    if concurrent:
                        touched.extend(a for a in new_value.args[1].fields if isinstance(a, relax.Var))
                        touched.append(nv)
            if concurrent:
                bb.emit(packed("runtime.Device_SetStream", dev, main_stream))
                for s in used_streams:
                    bb.emit(packed("runtime.Device_StreamSyncFromTo", dev, s, main_stream))
                # keep-alive: every tensor the stage touched stays live until the join above has been issued
                uniq = list(dict.fromkeys(touched))
                bb.emit(relax.Tuple(uniq), name_hint="stage_keepalive")
        result = remap(old_main.body.body)
        result = bb.emit(result, name_hint="result") if not isinstance(result, relax.Var) else result
        for s in streams:
            bb.emit(packed("runtime.Device_StreamFree", dev, s))
        bb.emit_func_output(result)
    new_main = bb.get()["main"]
    new_mod = tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"}, attrs=mod.attrs)
    new_mod["main"] = new_main
    return new_mod
