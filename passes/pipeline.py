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
    every spec ``tvm_interop.compile`` takes, the timed ones (``measured``, ``learned``) included;
    ``scheduler="autograph"`` rewrites the model first (``passes.autograph``; its options as keyword arguments),
    and a schedule that carries substitutions rewrites the module it is applied to the same way."""

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
        sched = schedule if schedule is None or isinstance(schedule, Schedule) else Schedule.load(schedule)
        if sched is not None and sched.search.get("substitutions"):
            # an autograph schedule belongs to the rewritten model: rewrite this one the same way (each proved)
            from .autograph.search import apply_substitutions

            mod = apply_substitutions(mod, sched.search["substitutions"])
        if sched is None and scheduler == "autograph":
            program, sched = _autograph(mod, target)
        else:
            program = extract(prepare(mod, target))
        if sched is not None:
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

    def _autograph(mod: tvm.IRModule, target):
        """``scheduler="autograph"``: substitutions searched with the schedule (``passes.autograph``), each candidate
        prepared as this pass prepares the model; returns the shipped candidate's program and schedule."""
        from .autograph.driver import run_autograph
        from .cost.registry import default_spec
        from .extract import extract
        from .prepare import prepare
        from .search import is_timed_cost, timed_cost_model
        from .target import device_kind

        spec = cost if cost is not None else default_spec(device_kind(target))
        timed = is_timed_cost(spec)

        def cost_for(program):
            if timed:
                model = timed_cost_model(program, target, spec)
                return model, model.close
            return spec, lambda: None

        found = run_autograph(mod, prepare=lambda m: extract(prepare(m, target)), cost_for=cost_for,
                              device_kind=device_kind(target), cost_spec=spec, options=scheduler_options,
                              max_block_size=max_block_size)
        return found.program, found.schedule

    return _schedule_pass
