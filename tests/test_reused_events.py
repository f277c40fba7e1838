"""Reused events (issue 12): ``sync="events"`` orders CUDA streams with a pool of events created once per loaded
model by the native extension, instead of TVM's ``Device_StreamSyncFromTo`` (an event created and destroyed on
every call). Without a GPU: the lowering issues exactly the same synchronisations, the as-built memory check
(which reads ``event_sync`` as the ordering it is) passes, and the handles are created and freed once."""
from __future__ import annotations

import pytest

import tvm_interop
from tvm_interop.models import get_model, small_config
from tvm_interop.passes.as_built import as_built_ir
from tvm_interop.passes.lower_streams import EVENT_SYNC, EVENTS_CREATE, EVENTS_FREE, SYNC, lower_program
from tvm_interop.passes.schedulers import schedule_graph
from tvm_interop.passes.stream_memory import check_stream_memory_safety
from tvm_interop.runtime.cuda import FREE_STREAMS_FUNC, MAIN_FUNC, MAIN_GRAPH_FUNC, STREAMS_FUNC
from tvm_interop.runtime.errors import InteropError
from zoo_cases import zoo_params

from issued_ops import extern_calls

CUDA = {"kind": "cuda", "arch": "sm_90"}


@pytest.fixture(scope="module", params=zoo_params())
def zoo_program(request):
    name = request.param
    return name, tvm_interop.api.prepare_program(get_model(name, **small_config(name)), CUDA, name=name)


@pytest.mark.parametrize("scheduler,mode", [("greedy", "stage"), ("lios", "dependency")])
def test_events_replace_every_per_call_event(zoo_program, scheduler, mode):
    name, program = zoo_program
    sched = schedule_graph(program.graph, scheduler, "sim:h100")
    tvm_low = lower_program(program, sched, CUDA, mode=mode, cuda_graph=True)
    low = lower_program(program, sched, CUDA, mode=mode, cuda_graph=True, sync="events")
    n = low.num_streams
    if n == 0:
        assert low.sync == "tvm"    # nothing to order: no pool either
        return
    assert low.sync == "events"
    for fn in (MAIN_FUNC, MAIN_GRAPH_FUNC):
        assert not extern_calls(low.mod[fn], SYNC), f"{name} {fn}: a per-call event is left"
        assert len(extern_calls(low.mod[fn], EVENT_SYNC)) == len(extern_calls(tvm_low.mod[fn], SYNC))
        for call in extern_calls(low.mod[fn], EVENT_SYNC):   # event k belongs to source stream k (caller: n)
            assert 0 <= int(call.args[1].value) <= n
    created = extern_calls(low.mod[STREAMS_FUNC], EVENTS_CREATE)
    assert len(created) == 1 and int(created[0].args[1].value) == n + 1
    assert len(extern_calls(low.mod[FREE_STREAMS_FUNC], EVENTS_FREE)) == 1
    report = check_stream_memory_safety(as_built_ir(low.mod, CUDA))
    assert report.ok, f"{name}: {report.summary()}"


def test_memory_check_reads_event_sync_as_ordering():
    """Without the keep-alives the program is unsafe; the check must still say so when the events are ours
    (it would pass vacuously if it ignored event_sync, and fail if it did not treat it as ordering)."""
    program = tvm_interop.api.prepare_program(get_model("googlenet", **small_config("googlenet")), CUDA,
                                              name="googlenet")
    sched = schedule_graph(program.graph, "greedy", "sim:h100")
    unsafe = lower_program(program, sched, CUDA, mode="stage", sync="events", keep_alive=False)
    assert not check_stream_memory_safety(as_built_ir(unsafe.mod, CUDA)).ok


def test_compile_with_events_records_them_and_links_the_extension():
    from tvm_interop.passes import native_build

    try:
        native_build.include_dirs(native_build.find_nvcc())
    except native_build.NativeBuildError as e:
        pytest.skip(f"cannot build the native extension here: {e}")
    cm = tvm_interop.compile("squeezenet", target="cuda", scheduler="greedy", sync="events",
                             **small_config("squeezenet"))
    assert cm.plan.meta["sync"] == "events" and cm.plan.meta["num_streams"] > 0
    assert EVENT_SYNC in cm.plan.meta["native_extension"]["functions"]
    assert cm.plan.meta["cuda_graph"], cm.plan.meta.get("cuda_graph_reason")


def test_bad_sync_choices_are_refused():
    with pytest.raises(InteropError, match="orders CUDA streams"):
        tvm_interop.compile("squeezenet", target="llvm", sync="events", **small_config("squeezenet"))
    with pytest.raises(InteropError, match="unknown sync"):
        tvm_interop.compile("squeezenet", target="cuda", sync="nccl", **small_config("squeezenet"))
