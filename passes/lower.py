"""Lowering: turn (Program, Schedule) into something executable.

Two products, both in schedule order:
- ``make_plan``: an ExecutionPlan for the runtime executors (calls, stages, dependencies, concurrency-safe buffer
  storage).
- ``lower_to_relax``: a rewritten Relax ``main`` whose bindings follow the schedule, with stream switching and
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
from runtime.plan import Call, ExecutionPlan, Ref, assign_storage

from .extract import Program
from .schedule import MERGE, Schedule


# ---------------------------------------------------------------------------------------------- plan
def make_plan(program: Program, schedule: Schedule, mode: str = "stage", reuse_memory: bool = True,
              meta: dict | None = None) -> ExecutionPlan:
    """Build the runtime ExecutionPlan for ``schedule`` (validated against the program's graph first)."""
    graph = program.graph
    schedule.validate(graph)
    call_index: dict[str, int] = {}
    calls: list[Call] = []
    buffers: list[dict] = []
    out_buf: dict[tuple[str, int], int] = {}
    stage_of_call: list[int] = []
    stages: list[list[list[int]]] = []

    def slot(ref: Ref) -> list:
        if ref.kind == "input":
            return ["i", ref.index]
        if ref.kind == "const":
            return ["c", ref.index]
        if ref.kind == "unit":
            return ["b", out_buf[(ref.unit, ref.index)]]
        raise ScheduleError(f"cannot pass a tuple {ref.describe()} to a kernel")

    for si, stage in enumerate(schedule.stages):
        # A merge stage runs as concurrent single-unit groups until the merge rewrite replaces it.
        groups = [[u] for u in stage.units] if stage.strategy == MERGE else stage.groups
        st: list[list[int]] = []
        for group in groups:
            g: list[int] = []
            for name in group:
                uc = program.calls[name]
                outs = []
                for oi, info in enumerate(uc.outputs):
                    out_buf[(name, oi)] = len(buffers)
                    outs.append(len(buffers))
                    buffers.append({"shape": list(info.shape), "dtype": info.dtype, "storage": -1})
                call_index[name] = len(calls)
                calls.append(Call(name, uc.func_name, [slot(a) for a in uc.args], outs))
                stage_of_call.append(si)
                g.append(call_index[name])
            st.append(g)
        stages.append(st)

    deps = [sorted({call_index[p] for p in graph.pred_names(c.unit)}) for c in calls]

    def out_slot(ref: Ref):
        if ref.kind == "tuple":
            return [out_slot(r) for r in ref.items]
        return slot(ref)

    output = out_slot(program.output)
    # Live intervals in stages; model outputs live to the end (they are read after the run).
    n_stages = len(stages)
    live = [[stage_of_call[ci], stage_of_call[ci]] for ci, c in enumerate(calls) for _ in c.outs]
    for ci, c in enumerate(calls):
        for a in c.args:
            if a[0] == "b":
                live[a[1]][1] = max(live[a[1]][1], stage_of_call[ci])
    for r in program.output_refs():
        if r.kind == "unit":
            live[out_buf[(r.unit, r.index)]][1] = n_stages
    if reuse_memory and mode == "stage":
        assign_storage(buffers, [tuple(x) for x in live])
    else:
        # Dependency mode has no barriers, so no interval is known to be over: every buffer gets its own storage.
        for i, b in enumerate(buffers):
            b["storage"] = i
    inputs = [{"name": n, "shape": list(t.shape), "dtype": t.dtype}
              for n, t in zip(program.input_names, program.input_infos)]
    return ExecutionPlan(inputs=inputs, num_constants=len(program.constants), buffers=buffers, calls=calls,
                         stages=stages, deps=deps, output=output, output_is_tuple=program.output.kind == "tuple",
                         meta=dict(meta or {}))


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
