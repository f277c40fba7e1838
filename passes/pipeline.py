"""tvm-interop as a pass in TVM's own build: ``tvm.compile(mod, target, relax_pipeline=pipeline(...))``.

The pass prepares the module (legalize + fuse), schedules its units, rewrites ``main`` into schedule order with
stream calls, then hands the result to TVM's default Relax pipeline for the target (memory planning, VM
lowering) with the stream memory check inside it, on the IR that pipeline plans (``passes.as_built``). The schedule
is attached to the module as the attribute ``tvm_interop.schedule`` (JSON) so it can be inspected afterwards.
"""
from __future__ import annotations

import tvm


def pipeline(scheduler: str = "greedy", cost=None, schedule=None, max_streams: int = 8,
             max_block_size: int | None = None, **scheduler_options) -> tvm.transform.Pass:
    """A module pass that schedules and lowers; use it as ``relax_pipeline`` of ``tvm.compile``. ``cost`` takes
    every spec ``tvm_interop.compile`` takes, the timed ones (``measured``, ``learned``) included."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_interop.Schedule")
    def _schedule_pass(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from .cost.registry import default_spec
        from .extract import extract
        from .target import device_kind
        from .lower_streams import lower_to_relax
        from .prepare import prepare
        from .schedule import Schedule
        from .search import is_timed_cost, search_schedule, timed_cost_model

        target = tvm.target.Target.current(allow_none=True) or tvm.target.Target("llvm")
        program = extract(prepare(mod, target))
        if schedule is not None:
            sched = schedule if isinstance(schedule, Schedule) else Schedule.load(schedule)
            sched.validate(program.graph)
        else:
            opts = dict(scheduler_options)
            if scheduler == "greedy":
                opts.setdefault("max_streams", max_streams)
            spec = cost if cost is not None else default_spec(device_kind(target))
            timed = is_timed_cost(spec)
            model = timed_cost_model(program, target, spec) if timed else spec
            try:
                sched = search_schedule(program.graph, scheduler, model, max_block_size=max_block_size, **opts)
            finally:
                if timed:
                    model.close()
        from .merge import apply_merges

        program, built = apply_merges(program, sched, target=target)
        lowered = lower_to_relax(program, built, target, max_streams=max_streams)
        lowered = lowered.with_attr("tvm_interop.schedule", sched.dumps())
        from .as_built import checked_passes

        with target:
            return tvm.transform.Sequential(checked_passes(target))(lowered)

    return _schedule_pass
