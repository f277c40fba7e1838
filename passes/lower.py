"""Lowering, part 1: turn (Program, Schedule) into the runtime ExecutionPlan.

The plan lists kernel calls in schedule order (kernel, argument slots, output buffers), the stages and groups,
the dependencies between calls (for dependency mode) and a buffer-to-storage assignment that is safe under
concurrency: two buffers share storage only if no stage can touch both (``runtime.plan.assign_storage``). The
stream-lowered Relax program (part 2) is in ``passes.lower_streams``.
"""
from __future__ import annotations

from tvm_interop.runtime.errors import ScheduleError
from tvm_interop.runtime.plan import Call, ExecutionPlan, Ref, assign_storage

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




def lower_to_relax(*args, **kwargs):
    """Compatibility alias: see ``passes.lower_streams.lower_to_relax``."""
    from .lower_streams import lower_to_relax as impl

    return impl(*args, **kwargs)
