"""The stream-lowered program (passes.lower_streams) and its memory-safety checker (passes.stream_memory).

No GPU needed: the lowered Relax IR is inspected (streams, events, where streams come from), taken through the
build's own pipeline up to KillAfterLastUse (passes.as_built: the IR the build compiles) and checked; the CPU
build runs it to compare outputs.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_interop
from tvm_interop.passes.lower_streams import (MAIN, lower_program, lower_to_relax, plan_streams, release_points,
                                  resolve_stream_count, simulate)
from tvm_interop.passes.schedule import Schedule, Stage
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.as_built import as_built_ir, check_lowered, memory_report, run_until
from tvm_interop.passes.stream_memory import activation_memory, check_stream_memory_safety
from tvm_interop.runtime.cuda import (CURRENT_STREAM_FUNC, FREE_STREAMS_FUNC, KEEPALIVE_FUNC, MAIN_FUNC, MAIN_GRAPH_FUNC,
                          STREAM_CACHE_INDEX, STREAMS_FUNC)
from tvm_interop.runtime.errors import InteropError

TOL = dict(rtol=1e-4, atol=1e-4)
CUDA = {"kind": "cuda", "arch": "sm_90"}


@pytest.fixture(scope="module")
def branchy_program(branchy_model):
    # NCHW, as CUDA builds keep it (a CPU build of this model on an 8-lane CPU would block its 8 channels)
    return tvm_interop.api.prepare_program(branchy_model, "llvm", name="branchy", layout="nchw")


@pytest.fixture(scope="module")
def hand_schedule(branchy_program):
    """Stage 0: four groups, two of them chains (1x1 -> 3x3 conv, pool -> 1x1 conv); then the tail one by one."""
    g = branchy_program.graph
    names = {u.name for u in g.units}
    assert {"lv", "lv1", "lv2", "lv3", "lv12", "lv4", "lv16", "lv5", "lv21", "gv"} <= names
    assert g.pred_names("lv3") == ["lv2"] and g.pred_names("lv4") == ["lv12"]
    stages = [Stage([["lv"], ["lv1"], ["lv2", "lv3"], ["lv12", "lv4"]])] + [Stage([[u]]) for u in
                                                                              ("lv16", "lv5", "lv21", "gv")]
    s = Schedule(stages)
    s.validate(g)
    return s


# ---------------------------------------------------------------------------------------------- IR helpers
def events(mod, fname=MAIN_FUNC):
    """The issued program of a lowered function, read back from the Relax IR: ("sync", a, b), ("set", s),
    ("unit", name), ("keepalive", n); streams as "main" / "s<k>"."""
    func = mod[fname]
    env = {}
    out = []

    def sname(e):
        return env.get(e, "?") if isinstance(e, relax.Var) else ("main" if int(e.value) == 0 else f"lit{e}")

    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, relax.TupleGetItem) and isinstance(v.tuple_value, relax.Var) \
                    and v.tuple_value.name == "streams":
                env[b.var] = f"s{v.index}"
            elif isinstance(v, relax.Call) and isinstance(v.op, relax.GlobalVar) \
                    and v.op.name_hint == CURRENT_STREAM_FUNC:
                env[b.var] = "main"
            elif isinstance(v, relax.Call) and isinstance(v.op, relax.ExternFunc):
                sym = str(v.op.global_symbol)
                if sym == "runtime.Device_StreamSyncFromTo":
                    out.append(("sync", sname(v.args[1]), sname(v.args[2])))
                elif sym == "runtime.Device_SetStream":
                    out.append(("set", sname(v.args[1])))
                elif sym == KEEPALIVE_FUNC:
                    out.append(("keepalive", len(v.args)))
                else:
                    out.append(("packed", sym))
            elif isinstance(v, relax.Call) and v.op == tvm.ir.Op.get("relax.call_tir"):
                out.append(("unit", b.var.name))
    return out


def count_packed(mod, fname, symbol):
    n = 0

    def visit(e):
        nonlocal n
        if isinstance(e, relax.Call) and isinstance(e.op, relax.ExternFunc) and str(e.op.global_symbol) == symbol:
            n += 1

    relax.analysis.post_order_visit(mod[fname].body, visit)
    return n


def strip(ev):
    return [e for e in ev if e[0] in ("sync", "set", "unit")]


# ---------------------------------------------------------------------------------------------- streams
def test_stage_mode_events_for_a_known_schedule(branchy_program, hand_schedule):
    low = lower_program(branchy_program, hand_schedule, CUDA, mode="stage")
    assert low.num_streams == 4
    s0, s1, s2, s3 = "s0", "s1", "s2", "s3"
    expected = [("sync", "main", s0), ("sync", "main", s1), ("sync", "main", s2), ("sync", "main", s3),
                ("set", s0), ("unit", "lv"), ("set", s1), ("unit", "lv1"), ("set", s2), ("unit", "lv2"),
                ("unit", "lv3"), ("set", s3), ("unit", "lv12"), ("unit", "lv4"), ("set", "main"),
                ("sync", s0, "main"), ("sync", s1, "main"), ("sync", s2, "main"), ("sync", s3, "main"),
                ("unit", "lv16"), ("unit", "lv5"), ("unit", "lv21"), ("unit", "gv")]
    assert strip(events(low.mod)) == expected
    # per stage: the concurrent stage has 2 events per stream and one stream switch per group + 1; the
    # single-group stages none
    assert low.programs[MAIN_FUNC].per_stage() == {0: {"sync": 8, "set": 5}}
    # streams are created in their own function, never in the scheduled program
    assert count_packed(low.mod, STREAMS_FUNC, "runtime.Device_StreamCreate") == 4
    assert count_packed(low.mod, FREE_STREAMS_FUNC, "runtime.Device_StreamFree") == 4
    for fname in (MAIN_FUNC, "main"):
        assert count_packed(low.mod, fname, "runtime.Device_StreamCreate") == 0
        assert count_packed(low.mod, fname, "runtime.Device_StreamFree") == 0
    # no device-wide synchronisation anywhere
    for gv in low.mod.get_global_vars():
        if isinstance(low.mod[gv], relax.Function):
            assert count_packed(low.mod, gv.name_hint, "runtime.Device_StreamSync") == 0


def test_dependency_mode_events_for_a_known_schedule(branchy_program, hand_schedule):
    low = lower_program(branchy_program, hand_schedule, CUDA, mode="dependency")
    ev = strip(events(low.mod))
    # every stream is forked once at the start; no stage barrier after stage 0
    assert ev[:4] == [("sync", "main", f"s{k}") for k in range(4)]
    assert ("set", "main") not in ev[4:-2]
    # the concat waits only for the three other branch streams (its own stream is ordered already)
    i = ev.index(("unit", "lv16"))
    waits = [e for e in ev[ev.index(("unit", "lv4")) + 1:i] if e[0] == "sync"]
    stream_of = {}
    cur = None
    for e in ev:
        if e[0] == "set":
            cur = e[1]
        elif e[0] == "unit":
            stream_of[e[1]] = cur
    assert {w[2] for w in waits} == {stream_of["lv16"]}
    assert {w[1] for w in waits} == {stream_of[u] for u in ("lv", "lv1", "lv3", "lv4")} - {stream_of["lv16"]}
    # the tail continues on the concat's stream (affinity): no event between lv16, lv5, lv21, gv
    tail = ev[i:]
    assert [e for e in tail if e[0] == "sync"] == [("sync", stream_of["lv16"], "main")]
    assert stream_of["lv5"] == stream_of["lv21"] == stream_of["gv"] == stream_of["lv16"]
    assert ev[-2:] == [("set", "main"), ("sync", stream_of["gv"], "main")]
    assert low.programs[MAIN_FUNC].count("sync") == 4 + 3 + 1


def test_groups_beyond_the_streams_share_them(branchy_program, hand_schedule):
    low = lower_program(branchy_program, hand_schedule, CUDA, mode="stage", max_streams=2)
    assert low.num_streams == 2
    ev = strip(events(low.mod))
    assert ev.count(("sync", "main", "s0")) == 1 and ev.count(("sync", "main", "s1")) == 1
    sets = [e[1] for e in ev if e[0] == "set"]
    assert sets == ["s0", "s1", "s0", "s1", "main"]
    assert check_lowered(low.mod).ok


def test_stream_bound_is_clamped_with_a_warning(branchy_program, hand_schedule, caplog, monkeypatch):
    monkeypatch.setenv("TVM_INTEROP_STREAM_LIMIT", "3")
    with caplog.at_level(logging.WARNING, logger="tvm_interop.passes.lower_streams"):
        low = lower_program(branchy_program, hand_schedule, CUDA, max_streams=100)
    assert low.num_streams == 3
    assert "max_streams=100 is more than the 3 streams allowed" in caplog.text
    assert count_packed(low.mod, STREAMS_FUNC, "runtime.Device_StreamCreate") == 3
    with pytest.raises(InteropError, match="max_streams"):
        resolve_stream_count(0, 4)
    assert resolve_stream_count(8, 1) == 0  # a sequential schedule needs no streams


def test_sequential_schedule_has_no_stream_calls(branchy_program):
    seq = schedule_graph(branchy_program.graph, "sequential")
    low = lower_program(branchy_program, seq, CUDA)
    assert low.num_streams == 0
    assert [e for e in events(low.mod) if e[0] != "unit"] == []


def test_streams_come_from_the_vm_cache_on_gpu_and_are_null_on_cpu(branchy_program, hand_schedule):
    gpu = lower_to_relax(branchy_program, hand_schedule, CUDA)
    calls = []
    relax.analysis.post_order_visit(gpu["main"].body, lambda e: calls.append(e) if isinstance(e, relax.Call) else None)
    cached = [c for c in calls if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.call_builtin_with_ctx"]
    assert len(cached) == 1
    assert str(cached[0].args[0].global_symbol) == "vm.builtin.cuda_graph.get_cached_alloc"
    fn, key = cached[0].args[1].fields
    assert fn.name_hint == STREAMS_FUNC and int(key.value) == STREAM_CACHE_INDEX
    cpu = lower_to_relax(branchy_program, hand_schedule, "llvm")
    assert "get_cached_alloc" not in cpu["main"].script()
    assert count_packed(cpu, "main", "runtime.Device_StreamCreate") == 0
    # the scheduled function takes the stream handles as a fixed (non-input) parameter
    assert int(gpu[MAIN_FUNC].attrs["num_input"]) == 1
    assert [p.name for p in gpu[MAIN_FUNC].params] == ["data", "streams"]


@pytest.mark.parametrize("mode", ["stage", "dependency"])
def test_cpu_build_of_the_stream_program_matches_plain_tvm(branchy_program, hand_schedule, branchy_input,
                                                           branchy_reference, mode, monkeypatch):
    """The CPU build runs the same program (stream calls are no-ops there); streams are made once per model."""
    import tvm_interop.runtime.cuda as rc
    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.lower import make_plan
    from tvm_interop.runtime.model import ScheduledModel

    made = []
    real = rc.StreamSet.__init__

    def counting(self, vm, device=None, **kw):
        made.append(1)
        real(self, vm, device, **kw)

    monkeypatch.setattr(rc.StreamSet, "__init__", counting)
    plan = make_plan(branchy_program, hand_schedule, mode=mode, meta={"mode": mode})
    lib = build_library(branchy_program, hand_schedule, plan, "llvm", mode=mode)
    m = ScheduledModel(lib, executor="vm", mode=mode)
    for _ in range(3):
        np.testing.assert_allclose(m.run(branchy_input), branchy_reference, **TOL)
    assert made == [1] and m.entry_function == MAIN_FUNC and m.num_streams == 4
    m.close()
    # TVM alone: main() works too
    vm = relax.VirtualMachine(lib, tvm.cpu())
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(branchy_input)).numpy(), branchy_reference, **TOL)


def test_cuda_graph_request_on_cpu_is_logged(branchy_program, hand_schedule, caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_interop.passes.lower_streams"):
        low = lower_program(branchy_program, hand_schedule, "llvm", cuda_graph=True)
    assert not low.cuda_graph and "CUDA graphs need a CUDA target" in low.cuda_graph_reason
    assert MAIN_GRAPH_FUNC not in [gv.name_hint for gv in low.mod.get_global_vars()]
    assert "CUDA graphs need a CUDA target" in caplog.text


# ---------------------------------------------------------------------------------------------- CUDA graph
def test_cuda_graph_variant_is_one_captured_region(branchy_program, hand_schedule):
    from tvm_interop.passes.cuda_build import CudaBuildReport, graph_feasibility, rewrite_cuda_graph_for

    low = lower_program(branchy_program, hand_schedule, CUDA, cuda_graph=True, mode="dependency")
    assert low.cuda_graph
    ev = events(low.mod, MAIN_GRAPH_FUNC)
    units = [e[1] for e in ev if e[0] == "unit"]
    assert units[0].startswith("data") and units[-1].startswith("output")  # input copied in, output out
    def shape(evs):  # the same program in between, up to the names of the bindings
        return [e if e[0] != "unit" else "unit" for e in strip(evs)]

    assert shape(ev)[1:-1] == shape(events(low.mod, MAIN_FUNC))
    ok, why = graph_feasibility(low.mod, CUDA)
    assert ok, why
    report = CudaBuildReport()
    planned = run_until(low.mod, CUDA, "StaticPlanBlockMemory", graph_funcs=())
    rewritten = rewrite_cuda_graph_for([MAIN_GRAPH_FUNC], report)(planned)
    assert report.cuda_graph and report.captured_calls > 20
    names = [gv.name_hint for gv in rewritten.get_global_vars()]
    assert f"{MAIN_GRAPH_FUNC}_cuda_graph_capture" in names and "cuda_graph_alloc" in names
    # only the graph variant was rewritten: the stream-creating function still creates streams directly
    assert count_packed(rewritten, STREAMS_FUNC, "runtime.Device_StreamCreate") == low.num_streams
    assert "run_or_capture" not in rewritten[MAIN_FUNC].script()


def test_cuda_graph_falls_back_with_a_logged_reason(branchy_program, hand_schedule, caplog):
    """A binding TVM cannot capture in the middle splits the program: direct launches, reason logged."""
    from tvm_interop.passes.cuda_build import CudaBuildReport, rewrite_cuda_graph_for

    low = lower_program(branchy_program, hand_schedule, CUDA, cuda_graph=True)
    planned = run_until(low.mod, CUDA, "StaticPlanBlockMemory", graph_funcs=())
    f = planned[MAIN_GRAPH_FUNC]
    bindings = list(f.body.blocks[0].bindings)
    kernels = [i for i, b in enumerate(bindings) if isinstance(b.value, relax.Call)
               and isinstance(b.value.op, relax.GlobalVar) and b.value.op.name_hint.startswith("fused_")]
    k = kernels[3]
    barrier = relax.VarBinding(relax.Var("opaque", relax.ObjectType()),
                               relax.Call(relax.ExternFunc("vm.builtin.null_value"), [], ty_args=[relax.ObjectType()]))
    bindings.insert(k + 1, barrier)
    body = relax.SeqExpr([relax.BindingBlock(bindings)], f.body.body)
    planned = tvm.IRModule(dict(planned.functions), attrs=planned.attrs)
    planned[MAIN_GRAPH_FUNC] = relax.Function(f.params, body, f.ret_ty, f.is_pure, f.attrs)
    planned = relax.transform.Normalize()(planned)
    report = CudaBuildReport()
    with caplog.at_level(logging.WARNING, logger="tvm_interop.passes.cuda_build"):
        out = rewrite_cuda_graph_for([MAIN_GRAPH_FUNC], report)(planned)
    assert not report.cuda_graph
    assert "2 captured regions" in report.reason
    assert "falling back to direct launches" in caplog.text
    assert "run_or_capture" not in out[MAIN_GRAPH_FUNC].script()


def test_runtime_cuda_graph_request_without_variant_is_logged(branchy_program, hand_schedule, branchy_input,
                                                              caplog):
    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.lower import make_plan
    from tvm_interop.runtime.model import ScheduledModel

    plan = make_plan(branchy_program, hand_schedule, meta={"mode": "stage"})
    lib = build_library(branchy_program, hand_schedule, plan, "llvm", cuda_graph=True)
    assert plan.meta["cuda_graph"] is False and "CUDA target" in plan.meta["cuda_graph_reason"]
    m = ScheduledModel(lib, executor="vm", plan=plan, cuda_graph=True)
    with caplog.at_level(logging.WARNING, logger="tvm_interop.runtime.model"):
        m.run(branchy_input)
    assert m.entry_function == MAIN_FUNC and "CUDA graph requested but not available" in caplog.text
    m.close()


# ---------------------------------------------------------------------------------------------- memory safety
def _noop_primfunc(n: int):
    """The keep-alive of the first GPU run: a no-op host PrimFunc. Relax sees a *pure* call."""
    from tvm import tirx

    params = [tirx.Var(f"t{i}", "handle") for i in range(n)]
    f = tirx.PrimFunc(params, tirx.Evaluate(tirx.IntImm("int32", 0)))
    return f.with_attrs({"tirx.is_host_func": True, "tirx.is_scheduled": True})


@pytest.mark.parametrize("target", ["llvm", CUDA])
def test_only_an_impure_call_extends_a_lifetime_through_the_build(target):
    """Why the keep-alive is an impure packed call: TVM's planner reuses a storage after the last *use*; a tuple
    is none, and a call of a no-op PrimFunc is pure, so FoldConstant / FuseTIR delete it before planning (what
    raced on the H100). Checked on the IR the build compiles, for CPU and CUDA."""
    from tvm import topi

    def build(keep):
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((64,), "float32"))
        with bb.function("main", [x], pure=False):
            a = bb.emit_te(topi.add, x, x)
            b = bb.emit_te(topi.multiply, a, a)
            c = bb.emit_te(topi.add, b, b)   # a is dead here in program order
            keep(bb, a, b)                   # ... unless this is a use
            d = bb.emit_te(topi.add, c, x)
            bb.emit_func_output(d)
        return as_built_ir(bb.get(), target)

    def storages(mod):  # activations + the output
        return mod["main"].script().count("R.memory.alloc_storage(")

    with_tuple = build(lambda bb, a, b: bb.emit(relax.Tuple([a, b])))
    with_pure = build(lambda bb, a, b: bb.emit(relax.Call(bb.add_func(_noop_primfunc(2), "noop_keep"), [a, b])))
    with_call = build(lambda bb, a, b: bb.emit(relax.Call(relax.ExternFunc(KEEPALIVE_FUNC), [a, b],
                                                          ty_args=[relax.ObjectType()])))
    assert storages(with_tuple) == 3   # c reuses a's storage: the tuple did not keep a alive
    assert storages(with_pure) == 3    # the pure call was deleted by the pipeline
    assert "noop_keep" not in with_pure["main"].script()
    assert storages(with_call) == 4    # a is kept until the call, so c gets a storage of its own
    assert KEEPALIVE_FUNC in with_call["main"].script()


def test_checker_finds_the_h100_race_in_the_old_lowering(monkeypatch):
    """The first GPU run's lowering (keep-alive = pure no-op PrimFunc) on googlenet 64 px w0.25: the as-built
    check finds the races the old checker (its own short pipeline) missed; the build refuses it; the current
    lowering is clean."""
    import tvm_interop.passes.lower_streams as ls
    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.lower import make_plan
    from tvm_interop.models import get_model

    program = tvm_interop.api.prepare_program(get_model("googlenet", image_size=64, width=0.25), CUDA)
    counts = {}
    for sched_name in ("greedy", "lios"):
        sched = schedule_graph(program.graph, sched_name, "sim:h100")
        assert check_lowered(lower_program(program, sched, CUDA).mod, CUDA).ok
        with monkeypatch.context() as m:
            def old_keepalive(self, tensors):
                gv = self.bb.add_func(_noop_primfunc(len(tensors)), f"__tvm_interop_keepalive{len(tensors)}")
                return relax.Call(gv, list(tensors))

            m.setattr(ls.ProgramEmitter, "keepalive", old_keepalive)
            low = lower_program(program, sched, CUDA)
            assert "__tvm_interop_keepalive" in low.mod[MAIN_FUNC].script()
            report = check_lowered(low.mod, CUDA)
            counts[sched_name] = len(report.violations)
            assert {v.kind for v in report.violations} & {"storage", "pool"}
            if sched_name == "greedy":
                with pytest.raises(InteropError, match="not memory-safe"):
                    build_library(program, sched, make_plan(program, sched), CUDA)
    assert counts["greedy"] > 0 and counts["lios"] > 0, counts


@pytest.mark.parametrize("mode", ["stage", "dependency"])
@pytest.mark.parametrize("graph", [False, True])
def test_checker_passes_on_lowered_programs(branchy_program, hand_schedule, mode, graph):
    for sched in (hand_schedule, schedule_graph(branchy_program.graph, "greedy"),
                  schedule_graph(branchy_program.graph, "ios", "sim:h100")):
        for max_streams in (2, 8):
            low = lower_program(branchy_program, sched, CUDA, mode=mode, max_streams=max_streams, cuda_graph=graph)
            report = check_lowered(low.mod, CUDA)
            assert report.ok, report.summary()
            assert report.functions[MAIN_FUNC]["streams"] == 1 + low.num_streams
            if graph:  # the captured region is replayed inline: every kernel of the graph variant is checked
                assert report.functions[MAIN_GRAPH_FUNC]["kernels"] == report.functions[MAIN_FUNC]["kernels"] + 2


@pytest.mark.parametrize("mode", ["stage", "dependency"])
def test_checker_fails_without_keep_alive(branchy_program, mode):
    sched = schedule_graph(branchy_program.graph, "greedy")
    low = lower_program(branchy_program, sched, CUDA, mode=mode, keep_alive=False)
    report = check_lowered(low.mod, CUDA)
    assert not report.ok
    v = report.violations[0]
    assert v.kind == "storage" and v.function == MAIN_FUNC
    assert "share a storage but are not ordered" in v.detail
    with pytest.raises(InteropError, match="not memory-safe"):
        report.raise_if_unsafe()


def test_build_refuses_an_unsafe_program(branchy_program, monkeypatch):
    import tvm_interop.passes.candidates as cand
    from tvm_interop.passes.build import build_library
    from tvm_interop.passes.lower import make_plan

    real = cand.lower_program
    monkeypatch.setattr(cand, "lower_program", lambda *a, **k: real(*a, **{**k, "keep_alive": False}))
    sched = schedule_graph(branchy_program.graph, "greedy")
    with pytest.raises(InteropError, match="not memory-safe"):
        build_library(branchy_program, sched, make_plan(branchy_program, sched), "llvm")


def _drop_binding(mod, fname, pred):
    f = mod[fname]
    bindings = list(f.body.blocks[0].bindings)
    k = next(i for i, b in enumerate(bindings) if pred(b))
    del bindings[k]
    out = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    out[fname] = relax.Function(f.params, relax.SeqExpr([relax.BindingBlock(bindings)], f.body.body), f.ret_ty,
                                f.is_pure, f.attrs)
    return out


def _is_sync(b, src=None, dst=None):
    v = b.value
    if not (isinstance(v, relax.Call) and isinstance(v.op, relax.ExternFunc)
            and str(v.op.global_symbol) == "runtime.Device_StreamSyncFromTo"):
        return False
    return (src is None or v.args[1].name == src) and (dst is None or v.args[2].name == dst)


def test_checker_reports_a_missing_event(branchy_program, hand_schedule):
    low = lower_program(branchy_program, hand_schedule, CUDA, mode="dependency")
    planned = as_built_ir(low.mod, CUDA)
    assert check_stream_memory_safety(planned).ok
    # the concat no longer waits for one branch: a data race (and an unordered reuse)
    broken = _drop_binding(planned, MAIN_FUNC, lambda b: _is_sync(b, src="stream0", dst="stream3"))
    kinds = {v.kind for v in check_stream_memory_safety(broken).violations}
    assert "data" in kinds
    # the streams are not joined before returning
    broken = _drop_binding(planned, MAIN_FUNC, lambda b: _is_sync(b, dst="main_stream"))
    assert {v.kind for v in check_stream_memory_safety(broken).violations} == {"exit"}
    # a branch reads the input before its stream waited for the caller
    broken = _drop_binding(planned, MAIN_FUNC, lambda b: _is_sync(b, src="main_stream", dst="stream1"))
    assert any(v.kind == "data" and "caller" in v.detail for v in check_stream_memory_safety(broken).violations)


def test_checker_needs_a_planned_module(branchy_program, hand_schedule):
    low = lower_to_relax(branchy_program, hand_schedule, CUDA)
    with pytest.raises(InteropError, match="memory-planned"):
        check_stream_memory_safety(low)


def test_checker_passes_on_random_models_and_schedules():
    """Release points by vector clocks, on random DAGs x random schedules x modes x stream counts."""
    from tvm_interop.fuzz import random_model, random_schedule

    rng = np.random.default_rng(7)
    checked = 0
    for seed in range(8):
        mod, _ = random_model(seed)
        program = tvm_interop.api.prepare_program(mod, "llvm")
        for _ in range(3):
            sched = random_schedule(program.graph, rng)
            for mode in ("stage", "dependency"):
                ms = int(rng.choice([1, 2, 3, 8]))
                low = lower_program(program, sched, CUDA, mode=mode, max_streams=ms,
                                    cuda_graph=bool(rng.integers(0, 2)))
                report = check_lowered(low.mod, CUDA)
                assert report.ok, f"seed {seed} {mode} max_streams={ms}: {report.summary()}"
                checked += 1
    assert checked == 48


def test_checker_on_zoo_models():
    from tvm_interop.models import get_model

    for name, kw in (("inception_v3", dict(image_size=75, depth=1)), ("nasnet_a_mobile", dict(image_size=32, depth=1))):
        program = tvm_interop.api.prepare_program(get_model(name, width=0.125, **kw), "llvm", name=name)
        for sched in (schedule_graph(program.graph, "greedy"), schedule_graph(program.graph, "ios", "sim:h100")):
            for mode in ("stage", "dependency"):
                low = lower_program(program, sched, CUDA, mode=mode, cuda_graph=True)
                report = check_lowered(low.mod, CUDA)
                assert report.ok, f"{name} {sched.scheduler} {mode}: {report.summary()}"
                assert low.num_streams >= 2


# ---------------------------------------------------------------------------------------------- release points
def test_release_points_follow_the_event_graph(branchy_program, hand_schedule):
    sp = plan_streams(branchy_program, hand_schedule, "dependency", 4, keep_alive=False)
    issued = simulate(sp.ops)
    points = release_points(sp, issued)
    order = sorted(issued, key=lambda u: issued[u].pos)
    # lv2 (read by lv3 on the same stream) may only be freed once a unit ordered after that stream runs: the
    # concat, which waits for every branch
    assert order[points[("u", "lv2", 0)]] == "lv16"
    # in stage mode the same tensor is freed at the first unit after the stage's join
    sp_stage = plan_streams(branchy_program, hand_schedule, "stage", 4, keep_alive=False)
    pts = release_points(sp_stage)
    iss = simulate(sp_stage.ops)
    order = sorted(iss, key=lambda u: iss[u].pos)
    assert order[pts[("u", "lv2", 0)]] == "lv16"
    # sequential stretches release right after the last use (no keep-alive needed)
    assert pts[("u", "lv5", 0)] == iss["lv21"].pos + 1
    assert issued["lv"].stream != MAIN


# ---------------------------------------------------------------------------------------------- memory report
def test_memory_report_scheduled_vs_sequential(branchy_program, hand_schedule):
    rep = memory_report(branchy_program, hand_schedule, CUDA)
    assert rep["scheduled_bytes"] >= rep["sequential_bytes"] > 0
    seq = schedule_graph(branchy_program.graph, "sequential")
    assert memory_report(branchy_program, seq, CUDA)["scheduled_bytes"] == rep["sequential_bytes"]
    planned = as_built_ir(lower_to_relax(branchy_program, hand_schedule, CUDA), CUDA)
    assert activation_memory(planned) == rep["scheduled_bytes"]


def test_compile_cli_prints_both_memories(tmp_path, capsys):
    from tvm_interop.cli import main

    rc = main(["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--scheduler", "greedy",
               "--json"])
    assert rc == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["activation_scheduled_bytes"] >= out["activation_sequential_bytes"] > 0
    rc = main(["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--scheduler", "greedy"])
    text = capsys.readouterr().out
    assert rc == 0 and "activation memory, TVM's memory plan as built (VM executor): scheduled" in text
    assert "vs sequential" in text and "activation memory, threads executor's buffers" in text


def test_lifted_constants_are_parameters(branchy_program, hand_schedule, branchy_input, branchy_reference):
    """lift_constants (the GPU check's libraries): weights come in as arguments, nothing is embedded."""
    from tvm_interop.passes.lower_streams import lift_main_constants

    low = lower_program(branchy_program, hand_schedule, "llvm", lift_constants=True, prefix="greedy__")
    assert check_lowered(low.mod).ok
    n_w = len(branchy_program.constants)
    f = low.mod["greedy____tvm_interop_main"]
    assert len(f.params) == 1 + n_w + 1 and int(f.attrs["num_input"]) == 1
    consts = []
    relax.analysis.post_order_visit(f.body, lambda e: consts.append(e) if isinstance(e, tvm.ir.expr.GenericConst)
                                    else None)
    assert consts == []
    ex = tvm.compile(low.mod, "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    ws = [tvm.runtime.tensor(c) for c in branchy_program.constants]
    x = tvm.runtime.tensor(branchy_input)
    streams = vm["greedy____tvm_interop_streams"]()
    np.testing.assert_allclose(vm["greedy____tvm_interop_main"](x, *ws, streams).numpy(), branchy_reference, **TOL)
    plain = relax.VirtualMachine(tvm.compile(lift_main_constants(branchy_program), "llvm"), tvm.cpu())
    np.testing.assert_allclose(plain["main"](x, *ws).numpy(), branchy_reference, **TOL)
