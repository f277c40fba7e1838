"""CPU out of the box: ``target="llvm"`` is this machine's CPU, ``llvm-generic`` the portable baseline, and a
library built for instructions the loading CPU lacks is refused before any kernel runs."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_interop.passes.target import (GENERIC_CPU, cpu_isa_features, host_cpu, normalize_target, target_text)
from tvm_interop.runtime.cpu_features import check_cpu_features, host_cpu_flags, missing_features
from tvm_interop.runtime.errors import DeviceError, InteropError


def test_llvm_means_this_machines_cpu():
    cpu = host_cpu()
    assert cpu and cpu not in ("generic", "x86-64")
    for spelling in ("llvm", {"kind": "llvm"}):
        t = normalize_target(spelling)
        assert t.kind.name == "llvm" and t.attrs["mcpu"] == cpu
        assert target_text(spelling) == f"llvm -mcpu={cpu}"
    # this machine has at least AVX2 (every CI and build machine of this project does); generic has none
    assert {"avx", "avx2", "fma"} <= set(cpu_isa_features("llvm"))


def test_generic_and_explicit_cpus():
    g = normalize_target(GENERIC_CPU)
    assert g.kind.name == "llvm" and not g.attrs.get("mcpu")
    assert target_text(GENERIC_CPU) == GENERIC_CPU and cpu_isa_features(GENERIC_CPU) == []
    z = normalize_target("llvm -mcpu=znver4")
    assert z.attrs["mcpu"] == "znver4" and "avx512f" in cpu_isa_features(z)
    # a Target object is taken as it is (TVM's own spelling stays generic)
    import tvm

    assert not normalize_target(tvm.target.Target("llvm")).attrs.get("mcpu")


def test_unknown_mcpu_is_reported_in_llvms_words():
    with pytest.raises(InteropError, match="'nonsense' is not a recognized processor.*llvm-generic"):
        normalize_target("llvm -mcpu=nonsense")


def test_feature_check_maps_llvm_names_to_cpuinfo(tmp_path):
    flags = {"sse4_1", "sse4_2", "avx", "avx2", "fma", "pni", "avx512_vnni"}
    assert missing_features(["sse3", "sse4.1", "avx2", "avx512vnni", "avx512f"], flags) == ["avx512f"]
    check_cpu_features({"cpu_features": ["avx2", "sse4.2"]}, flags)          # all present: nothing raised
    check_cpu_features({"cpu_features": []}, set())                          # a generic library runs anywhere
    with pytest.raises(DeviceError, match=r"llvm -mcpu=znver4.*avx512f, avx512bw.*--target llvm-generic"):
        check_cpu_features({"cpu_features": ["avx2", "avx512f", "avx512bw"], "target": "llvm -mcpu=znver4"}, flags)
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")
    assert host_cpu_flags(str(info)) == {"fpu", "sse2", "avx2"}
    assert host_cpu_flags(str(tmp_path / "missing")) is None
    flags_here = host_cpu_flags()
    assert flags_here is None or not missing_features(cpu_isa_features("llvm"), flags_here)


@pytest.fixture(scope="module")
def branchy_libraries(tmp_path_factory):
    import tvm_interop
    from tvm_interop.models import get_model, small_config

    mod = get_model("squeezenet", **small_config("squeezenet"))
    d = tmp_path_factory.mktemp("host")
    out = {}
    for target in ("llvm", GENERIC_CPU):
        cm = tvm_interop.compile(mod, target=target, scheduler="greedy", name="squeezenet", max_memory_ratio=None)
        path = str(d / f"{target}.so")
        cm.export(path)
        out[target] = (cm, path)
    yield mod, out
    for cm, _ in out.values():
        cm.close()


def test_host_and_generic_builds_match_plain_tvm_and_record_their_cpu(branchy_libraries):
    import tvm_interop
    from tvm_interop.runtime.model import load

    mod, libs = branchy_libraries
    x = np.random.default_rng(5).standard_normal(
        tuple(int(d) for d in mod["main"].params[0].ty.shape.values)).astype("float32")
    ref = tvm_interop.run_reference(mod, [x])
    host = libs["llvm"][0]
    assert host.target == f"llvm -mcpu={host_cpu()}"
    assert host.runner.plan.meta["cpu_features"] == cpu_isa_features("llvm")
    assert libs[GENERIC_CPU][0].runner.plan.meta["cpu_features"] == []
    for target, (cm, path) in libs.items():
        np.testing.assert_allclose(cm.run(x), ref, rtol=1e-4, atol=1e-4, err_msg=target)
        loaded = load(path)
        np.testing.assert_allclose(loaded.run(x), ref, rtol=1e-4, atol=1e-4, err_msg=target)
        loaded.close()


def test_loading_on_a_cpu_without_the_features_is_refused(branchy_libraries, monkeypatch):
    import tvm_interop.runtime.cpu_features as cf
    from tvm_interop.runtime.model import load

    _, libs = branchy_libraries
    # simulate an older CPU: SSE only
    monkeypatch.setattr(cf, "host_cpu_flags", lambda cpuinfo="/proc/cpuinfo": {"fpu", "sse", "sse2"})
    with pytest.raises(DeviceError, match="does not have"):
        load(libs["llvm"][1])
    generic = load(libs[GENERIC_CPU][1])   # the portable library still loads
    generic.close()


class _ConcurrencyHurts:
    """A cost model under which every concurrent stage is slower than its units one after another."""

    def __new__(cls):
        from tvm_interop.passes.cost import UnitCostModel

        class Model(UnitCostModel):
            name = "concurrency-hurts"

            def stage_latency(self, groups, strategy="concurrent"):
                total = sum(self.unit_latency(u) for g in groups for u in g)
                return total * (1.5 if len(groups) > 1 else 1.0)

        return Model(name="concurrency-hurts")


def test_default_cpu_path_never_ships_a_schedule_predicted_slower(branchy_model):
    import tvm_interop

    mod = branchy_model   # an inception-like block: greedy runs its four branches at once
    cm = tvm_interop.compile(mod, scheduler="greedy", cost=_ConcurrencyHurts(), name="branchy",
                             max_memory_ratio=None)
    try:
        s = cm.schedule
        assert s.scheduler == "sequential" and s.search["guard_rejected"] == "greedy"
        assert "greedy predicted slower than sequential" in s.search["shipped_because"]
    finally:
        cm.close()
    # predicted faster: the default guard then times it against sequential, on the executors they ship with, and
    # the faster one ships (which one is this machine's business; the decision and its numbers are recorded)
    cm = tvm_interop.compile(mod, scheduler="greedy", cost="unit", name="branchy", max_memory_ratio=None)
    try:
        g = cm.guard
        assert g is not None and g.repeat > 0
        because = cm.schedule.search["shipped_because"]
        if g.keep_schedule:
            assert cm.schedule.scheduler == "greedy" and because.startswith("measured faster than sequential")
        else:
            assert cm.schedule.scheduler == "sequential" and cm.schedule.search["guard_rejected"] == "greedy"
            assert because.startswith("measured slower than sequential")
    finally:
        cm.close()


def test_compile_command_says_target_what_shipped_and_which_memory(capsys):
    from tvm_interop.cli import main

    args = ["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--scheduler", "greedy", "--quiet"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"target: llvm -mcpu={host_cpu()}" in out
    assert "shipped: " in out and "sequential" in out
    assert "activation memory, threads executor's buffers" in out
    assert "activation memory, TVM's memory plan as built (VM executor): scheduled" in out
    assert out.count("<- runs this library") == 1   # the executor a run uses is marked, and only it
    assert main(args + ["--target", "llvm-generic", "--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["target"] == "llvm-generic" and d["shipped_because"]
    assert main(args + ["--target", "llvm -mcpu=nonsense"]) == 1
    assert "not a recognized processor" in capsys.readouterr().err


def test_a_foreign_cost_table_is_refused_with_both_named(tmp_path):
    import json

    from tvm_interop.passes.cost import get_cost_model
    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.passes.synthetic import synthetic_model
    from tvm_interop.runtime.errors import InteropError

    import os

    shared = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "gpu-data",
                          "h100-2026-11-22", "costs_squeezenet_r2s3b8.json")

    if not os.path.exists(shared):
        pytest.skip("shared H100 data not here")
    g = synthetic_model("inception_v3")
    with pytest.raises(InteropError, match=r"measured for model 'squeezenet'.*this is model 'inception_v3'"):
        schedule_graph(g, "greedy", f"table:{shared}", model_name="inception_v3")
    table = get_cost_model(f"table:{shared}")
    table.check_target("cuda -arch=sm_90")
    with pytest.raises(InteropError, match=r"measured for 'cuda -arch=sm_90'; this build is for 'cuda -arch=sm_80'"):
        table.check_target("cuda -arch=sm_80")
    with pytest.raises(InteropError, match="not for 'llvm"):
        table.check_target("llvm -mcpu=znver4")
    d = json.load(open(shared))
    d["tvm_version"] = "0.19.0"
    d["graph_fingerprint"] = None
    other = tmp_path / "old.json"
    other.write_text(json.dumps(d))
    with pytest.raises(InteropError, match=r"TVM 0.19.0, this is TVM 0.27"):
        schedule_graph(g, "greedy", f"table:{other}")


def test_a_table_missing_stages_says_how_many_were_composed(tmp_path):
    """A table with units only: every concurrent stage is composed from the units, and the schedule says how many."""
    import json

    from tvm_interop.passes.schedulers import schedule_graph
    from tvm_interop.passes.synthetic import synthetic_model

    g = synthetic_model("squeezenet")
    table = {"format": "tvm-interop-cost-table", "version": 1, "model": "squeezenet",
             "graph_fingerprint": g.fingerprint(), "device": "test", "units": {u.name: 1e-5 for u in g.units},
             "stages": []}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    s = schedule_graph(g, "greedy", f"table:{path}", max_streams=8)
    assert s.max_concurrency() > 1
    assert "stage costs the search asked for were not in the cost table" in s.search["cost_note"]
    assert int(s.search["cost_note"].split()[0]) > 0


def test_prepare_with_a_plain_llvm_string_schedules_for_this_cpu():
    """``prepare(mod, "llvm")`` (what the tune / schedule commands and ``prepare_program`` pass) schedules the
    kernels for this machine's vector width, like ``compile`` does with the normalized target: a regression
    scheduled them for generic x86-64 (4 lanes), so measured costs and tuning baselines timed SSE kernels."""
    import tvm

    from conftest import make_branchy_model
    from tvm_interop.passes.kernels.cpu_schedule import vector_lanes
    from tvm_interop.passes.prepare import prepare

    assert vector_lanes(normalize_target("llvm")) >= 8   # AVX2 at least (see above)
    mod = make_branchy_model(channels=32)
    plain = prepare(mod, "llvm", layout="nchw")
    host = prepare(mod, normalize_target("llvm"), layout="nchw")
    generic = prepare(mod, GENERIC_CPU, layout="nchw")
    from tvm_ffi import structural_equal as tvm_ffi_equal

    funcs = [gv.name_hint for gv, f in plain.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert all(tvm_ffi_equal(plain[f], host[f]) for f in funcs)
    assert not all(tvm_ffi_equal(plain[f], generic[f]) for f in funcs)
