"""The fleet (passes/fleet, runtime/rpc_server.py) on loopback: a real TVM RPC tracker and device servers started
by the tests on free local ports, torn down after.

What must hold, and why each test exists:
* the servers run with TVM's runtime only (``TVM_USE_RUNTIME_LIB=1`` and compiler-only imports blocked): a device
  machine has nothing else;
* a profiling bundle measured through two servers gives the table a local measurement gives (same stages, same
  keys), keyed by the fingerprint the servers reported, with the work spread over both;
* tuning through the fleet fills the same database as local tuning, keyed by the remote fingerprint;
* the measured cost and the never-slower guard time on the fleet;
* a server killed mid-job loses only its in-flight items, which finish elsewhere (counted in the report);
* a server whose fingerprint differs from the key's others is refused, with both named;
* an unreachable tracker, an unknown key, and no free device within the wait each give one clear error.
"""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from tvm_interop.passes.fleet import Fleet, FleetError, FleetOptions
from tvm_interop.passes.fleet.loopback import LoopbackFleet, tracker_available

from runtime_only import assert_runtime_only, runtime_only_env

pytestmark = pytest.mark.skipif(tracker_available() is not None, reason=str(tracker_available()))

TINY = dict(batch_size=1, image_size=32, width=0.125)


@pytest.fixture(scope="module")
def runtime_env(tmp_path_factory):
    return runtime_only_env(tmp_path_factory.mktemp("fleet_runtime_only"))


@pytest.fixture(scope="module")
def loopback(runtime_env, tmp_path_factory):
    """A tracker and two runtime-only CPU servers under key ``cpu``."""
    env, _ = runtime_env
    with LoopbackFleet(env=env, log_dir=str(tmp_path_factory.mktemp("fleet_logs"))) as lf:
        lf.add_server("cpu")
        lf.add_server("cpu")
        lf.wait_for("cpu", 2)
        yield lf


@pytest.fixture(scope="module")
def tiny_program():
    from tvm_interop.api import load_module, prepare_program

    mod, name = load_module("squeezenet", **TINY)
    return prepare_program(mod, "llvm", name=name)


@pytest.fixture(scope="module")
def bundle(tiny_program, tmp_path_factory):
    from tvm_interop.passes.profile_bundle import BundleOptions, build_profile_bundle

    out = str(tmp_path_factory.mktemp("bundle"))
    build_profile_bundle(tiny_program, "llvm", out, BundleOptions(ios_block=4))
    return out


def _fleet(lf, key="cpu", **kw) -> Fleet:
    return Fleet(lf.tracker, key, FleetOptions(**{"device_wait": 20.0, "call_timeout": 120.0, **kw}))


# ------------------------------------------------------------------------------------------ devices
def test_devices_lists_both_servers_with_their_device(loopback, capsys):
    from tvm_interop.cli import main

    assert main(["devices", "--rpc", loopback.tracker, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["servers"]
    servers = [r for r in rows if "address" in r]
    assert sorted(r["address"] for r in servers) == sorted(s.address for s in loopback.servers)
    assert all(r["state"] == "free" and r["fingerprint"].startswith("cpu:") for r in servers), servers
    assert any(r.get("summary", "").startswith("2 server(s), 2 free") for r in rows), rows
    loopback.wait_for("cpu", 2)   # the probe's sessions are back


def test_servers_run_with_tvm_runtime_only(loopback):
    with _fleet(loopback) as fleet:
        infos = [d.info for d in fleet.devices]
    assert len(infos) == 2 and all(i["compiler_loaded"] is False for i in infos), infos


# ------------------------------------------------------------------------------------------ bundle
def test_bundle_measured_on_two_servers_matches_local_table(loopback, bundle, tmp_path):
    from tvm_interop.passes.fleet.bundle import measure_bundle_on_fleet
    from tvm_interop.runtime.profile_bundle import measure_bundle

    local = measure_bundle(bundle, repeat=3, warmup=1)
    out = str(tmp_path / "costs.json")
    with _fleet(loopback) as fleet:
        remote = measure_bundle_on_fleet(bundle, fleet, repeat=3, warmup=1, chunk=4, out=out)
        device_print = fleet.devices[0].fingerprint
    assert [r["key"] for r in remote["stages"]] == [r["key"] for r in local["stages"]]
    assert [r["index"] for r in remote["stages"]] == list(range(len(local["stages"])))
    assert set(remote["units"]) == set(local["units"])
    assert all(r["latency"] > 0 for r in remote["stages"])
    assert remote["device"] == device_print and remote["format"] == local["format"]
    report = remote["fleet"]
    assert report["items"] == -(-len(local["stages"]) // 4) and report["retries"] == 0
    assert len(report["devices"]) == 2 and all(d["items"] > 0 for d in report["devices"]), report
    assert json.load(open(out))["stages"] == remote["stages"]   # what was written is what was returned
    # the table is a cost model a scheduler can use
    from tvm_interop.passes.cost import get_cost_model

    assert get_cost_model(f"table:{out}").device_fingerprint


def test_profile_measure_cli_with_rpc(loopback, bundle, tmp_path, capsys):
    from tvm_interop.cli import main

    out = str(tmp_path / "c.json")
    assert main(["profile-measure", bundle, "-o", out, "--repeat", "2", "--warmup", "1", "--rpc", loopback.tracker,
                 "--device-key", "cpu", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["fleet"]["key"] == "cpu" and summary["stages"] == len(json.load(open(out))["stages"])


# ------------------------------------------------------------------------------------------ tuning
def test_tuning_through_the_fleet_fills_the_database(loopback, tiny_program, tmp_path):
    from tvm_interop.passes.kernels.tuning import apply_database, database_summary, tune_program

    db = str(tmp_path / "db")
    with _fleet(loopback) as fleet:
        report = tune_program(tiny_program, "llvm", db, trials=4, op_names=["conv2d_add_relu"],
                              num_trials_per_iter=4, quiet=True, fleet=fleet)
        rep = fleet.report()
    tasks = [t for t in report.tasks if t.status in ("tuned", "exhausted")]
    assert tasks and all(t.trials > 0 and t.best_ms is not None for t in tasks), report.table()
    summary = database_summary(db)
    assert summary["records"] >= len(tasks)
    assert summary["state"]["device"] == rep["fingerprint"]            # keyed by what the servers reported
    assert all(t.untuned_ms is not None for t in report.tasks)   # baselines timed on the fleet too
    assert rep["items"] >= report.new_trials and rep["failed"] == 0
    apply_database(tiny_program.mod, "llvm", db)            # the database is usable as a local one


def test_ctrl_c_during_fleet_tuning_leaves_a_resumable_database(loopback, tiny_program, tmp_path, monkeypatch):
    """Ctrl-C after the first batch measured on the fleet: the database holds that batch, the devices go back to
    the tracker, and the same command continues where it stopped."""
    import signal

    from tvm_interop.passes.kernels import tuning

    db = str(tmp_path / "db")
    cls = tuning._ProgressCallback._cls
    original = cls.apply

    def apply_then_ctrl_c(self, *args):
        original(self, *args)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(cls, "apply", apply_then_ctrl_c)
    kw = dict(trials=4, op_names=["conv2d_add_relu"], num_trials_per_iter=2, quiet=True, baselines=False)
    with pytest.raises(KeyboardInterrupt):
        with _fleet(loopback) as fleet:
            tuning.tune_program(tiny_program, "llvm", db, fleet=fleet, **kw)
    first = tuning.database_summary(db)["records"]
    assert first == 2
    loopback.wait_for("cpu", 2)
    monkeypatch.setattr(cls, "apply", original)
    with _fleet(loopback) as fleet:
        resumed = tuning.tune_program(tiny_program, "llvm", db, fleet=fleet, **kw)
    assert resumed.tasks[0].trials == 4 and resumed.tasks[0].new_trials == 2


# ------------------------------------------------------------------------------------------ measured cost, guard
def test_measured_schedule_and_guard_on_the_fleet(loopback, tmp_path, capsys):
    from tvm_interop.cli import main

    cache = str(tmp_path / "stages.json")
    args = ["squeezenet", "--width", "0.125", "--image-size", "32", "--rpc", loopback.tracker, "--device-key", "cpu"]
    assert main(["schedule", *args, "--scheduler", "greedy", "--cost", "measured", "--cost-cache", cache,
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cost"].startswith("measured:cpu:") and ":tvm" in out["cost"]   # the remote fingerprint
    assert out["search"]["measurements"] > 0 and out["fleet"]["items"] == out["search"]["measurements"]
    assert json.load(open(cache))["device"] == out["cost"]
    assert main(["compile", *args, "--scheduler", "greedy", "--guard", "on", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["guard"]["device"] == out["fleet"]["fingerprint"] and out["guard"]["repeat"] > 0
    assert out["fleet"]["items"] == 1


# ------------------------------------------------------------------------------------------ faults
def _job_with_a_failing_server(env, bundle, fail, call_timeout: float, log_dir: str | None = None):
    """Two servers measure ``bundle`` in small chunks; ``fail(lf, victim)`` is applied to one of them right after
    its first chunk. Returns (the cost table, the victim, whether it failed, whether it is still alive, seconds).
    The victim is killed at the end whatever ``fail`` did (SIGKILL also ends a stopped process)."""
    from tvm_interop.passes.fleet.bundle import measure_bundle_on_fleet

    with LoopbackFleet(env=env, log_dir=log_dir) as lf:
        victim = lf.add_server("cpu")
        lf.add_server("cpu")
        lf.wait_for("cpu", 2)
        failed = threading.Event()

        def progress(done, total, address):
            if address == victim.address and not failed.is_set():
                failed.set()
                fail(lf, victim)

        try:
            t0 = time.perf_counter()
            opts = FleetOptions(device_wait=5.0, call_timeout=call_timeout)
            with Fleet(lf.tracker, "cpu", opts, progress=progress) as fleet:
                table = measure_bundle_on_fleet(bundle, fleet, repeat=60, warmup=1, chunk=2)
            seconds = time.perf_counter() - t0
            alive = victim.alive
        finally:
            lf.kill(victim)
    return table, victim, failed.is_set(), alive, seconds


def test_server_killed_mid_job_loses_only_its_items(runtime_env, bundle, tmp_path):
    """Two servers measure a bundle in small chunks; one is killed (with its session) after its first chunk.
    The job still finishes with every stage, its in-flight chunk retried on the other server."""
    env, _ = runtime_env
    kill = lambda lf, victim: threading.Thread(target=lf.kill, args=(victim,), daemon=True).start()  # noqa: E731
    table, victim, killed, alive, _ = _job_with_a_failing_server(env, bundle, kill, 60.0, str(tmp_path / "logs"))
    assert killed and not alive
    n = len(json.load(open(os.path.join(bundle, "bundle.json")))["stages"])
    assert [r["index"] for r in table["stages"]] == list(range(n))
    report = table["fleet"]
    assert [x["address"] for x in report["lost"]] == [victim.address], report
    assert report["retries"] >= 1 and report["failed"] == 0
    survivor = [d for d in report["devices"] if d["address"] != victim.address]
    assert survivor and survivor[0]["items"] > report["items"] // 2


@pytest.mark.serial
def test_a_wedged_server_costs_one_timeout(runtime_env, bundle, tmp_path):
    """A server that stops answering mid-job (SIGSTOP: alive, registered, silent) holds its item for at most the
    measurement timeout; the item is then measured on the other server and the job finishes."""
    import signal

    env, _ = runtime_env
    stop = lambda lf, victim: os.killpg(victim.proc.pid, signal.SIGSTOP)  # noqa: E731
    table, victim, stopped, _, seconds = _job_with_a_failing_server(env, bundle, stop, 3.0)
    assert stopped
    report = table["fleet"]
    assert [x["address"] for x in report["lost"]] == [victim.address], report
    assert "did not return within 3 s" in report["lost"][0]["why"] and report["failed"] == 0
    n = len(json.load(open(os.path.join(bundle, "bundle.json")))["stages"])
    assert [r["index"] for r in table["stages"]] == list(range(n))
    assert seconds < 60


def test_foreign_fingerprint_refused(runtime_env, bundle, tmp_path):
    """Two servers on every core and one pinned to a single core under one key: the single-core one (another
    device, by its fingerprint) is refused with both fingerprints named and measures nothing."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores to start a server with a different core count")
    from tvm_interop.passes.fleet.bundle import measure_bundle_on_fleet

    env, _ = runtime_env
    with LoopbackFleet(env=env) as lf:
        lf.add_server("cpu")
        lf.add_server("cpu")
        odd = lf.add_server("cpu", cpus="0")
        lf.wait_for("cpu", 3)
        with Fleet(lf.tracker, "cpu", FleetOptions(device_wait=10.0)) as fleet:
            table = measure_bundle_on_fleet(bundle, fleet, repeat=2, warmup=1, chunk=8)
    report = table["fleet"]
    assert [r["address"] for r in report["refused"]] == [odd.address], report
    refused = report["refused"][0]
    assert refused["fingerprint"].endswith(":1cores:" + refused["fingerprint"].rsplit(":", 1)[1])
    assert refused["expected"] == report["fingerprint"] == table["device"] != refused["fingerprint"]
    assert odd.address not in [d["address"] for d in report["devices"]]


def test_expected_fingerprint_refuses_everything_else(loopback):
    with pytest.raises(FleetError, match="refused.*other-device"):
        Fleet(loopback.tracker, "cpu", FleetOptions(device_wait=5.0, expected_fingerprint="other-device")).start()
    loopback.wait_for("cpu", 2)


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.serial
def test_unreachable_tracker_is_one_clear_error():
    t0 = time.perf_counter()
    with pytest.raises(FleetError, match=r"cannot reach the RPC tracker at 127\.0\.0\.1:1 .*rpc_tracker"):
        Fleet("127.0.0.1:1", "cpu").start()
    assert time.perf_counter() - t0 < 15
    with pytest.raises(FleetError, match="HOST:PORT"):
        Fleet("nonsense", "cpu")


def test_unknown_key_names_the_keys_there_are(loopback):
    with pytest.raises(FleetError, match=r"no device server with key 'h100'.*cpu \(2 server\(s\)\).*rpc_server"):
        Fleet(loopback.tracker, "h100").start()


@pytest.mark.serial
def test_no_free_device_within_the_wait(loopback):
    with _fleet(loopback) as holder:          # holds both servers
        assert len(holder.devices) == 2
        t0 = time.perf_counter()
        with pytest.raises(FleetError, match=r"no free device with key 'cpu'.*within 2 s.*2 server\(s\) registered, "
                                             r"0 free"):
            Fleet(loopback.tracker, "cpu", FleetOptions(device_wait=2.0)).start()
        assert time.perf_counter() - t0 < 20
    loopback.wait_for("cpu", 2)


def test_cli_rpc_without_key_and_key_without_rpc(capsys):
    from tvm_interop.cli import main

    assert main(["profile-measure", "/nonexistent", "--rpc", "127.0.0.1:1"]) == 1
    assert "--rpc needs --device-key" in capsys.readouterr().err
    assert main(["schedule", "squeezenet", "--cost", "sim:h100", "--rpc", "127.0.0.1:1", "--device-key", "x"]) == 1
    assert "needs --cost measured or learned" in capsys.readouterr().err


def test_runtime_only_record_after_the_servers_stop(runtime_env, loopback):
    """Last (module order): the servers' import records, written when they exit, show no compiler-only import."""
    env, log = runtime_env
    for s in loopback.servers:
        loopback.stop(s)
    assert_runtime_only(log, processes=2)
