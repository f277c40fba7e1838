"""The tvm-interop command line, end to end on a small zoo model."""
import json

import pytest

from tvm_interop.cli import main


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    so, sj = d / "m.so", d / "s.json"
    rc = main(["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--scheduler", "greedy",
               "--guard", "off", "-o", str(so), "--schedule-out", str(sj), "--quiet"])
    assert rc == 0
    return d, so, sj


def test_compile_writes_outputs(built, capsys):
    d, so, sj = built
    assert so.exists() and sj.exists()
    assert json.loads(sj.read_text())["scheduler"] == "greedy"


def test_run_prints_median(built, capsys):
    _, so, _ = built
    assert main(["run", str(so), "--repeat", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["median_ms"] > 0 and out["model"] == "squeezenet" and out["output_shape"] == [1, 1000]


def test_show_text_trace_png(built, capsys, tmp_path):
    _, so, sj = built
    assert main(["show", str(sj)]) == 0
    assert "concurrent" in capsys.readouterr().out
    trace = tmp_path / "t.json"
    assert main(["show", str(so), "--trace", str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    sched = json.loads(sj.read_text())
    assert sorted(e["name"] for e in slices) == sorted(u for st in sched["stages"] for g in st["groups"] for u in g)
    pytest.importorskip("matplotlib")
    png = tmp_path / "g.png"
    assert main(["show", str(so), "--png", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_show_library_summary_is_the_compiled_schedule(built, capsys, tmp_path):
    """``show m.so`` first says what the library holds, read from the file: model, scheduler, every stage's units
    in the compiled schedule's order (then the traced run of a CPU library)."""
    _, so, sj = built
    sched = json.loads(sj.read_text())
    assert main(["show", str(so)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"{so}: squeezenet, scheduler greedy, target llvm")
    stages = [ln.split(None, 1)[1] for ln in lines if ln[:6].strip().isdigit()]
    assert stages == [" | ".join(", ".join(g) for g in st["groups"]) for st in sched["stages"]]
    assert lines[-1].startswith("measured run: ")
    assert main(["show", str(so), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["model"], out["device"], out["stages"], out["candidates"]) == ("squeezenet", "cpu", len(stages), [])
    assert out["units"] == sum(len(g) for st in sched["stages"] for g in st["groups"]) and out["measured_ms"] > 0


def test_show_refuses_what_is_not_a_model_library(tmp_path, capsys):
    import tvm
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Plain:
        @R.function
        def main(x: R.Tensor((4,), "float32")):
            return R.add(x, x)

    plain = tmp_path / "plain.so"
    tvm.compile(Plain, target="llvm").export_library(str(plain))
    assert main(["show", str(plain)]) == 1
    assert "is a TVM library but not a tvm-interop model" in capsys.readouterr().err
    bad = tmp_path / "bad.so"
    for data in (b"\x7fELF not really", plain.read_bytes()[:4096], plain.read_bytes()[:-4096]):
        bad.write_bytes(data)
        assert main(["show", str(bad)]) == 1
        assert "is not a library exported by TVM" in capsys.readouterr().err


def test_models_listing(capsys):
    assert main(["models", "--no-count", "--json"]) == 0
    names = [r["name"] for r in json.loads(capsys.readouterr().out)]
    assert {"inception_v3", "nasnet_a_large", "randwire", "squeezenet"} <= set(names)


def test_errors_are_clear(tmp_path, capsys):
    assert main(["compile", "no_such_model"]) == 1
    assert "no_such_model" in capsys.readouterr().err
    bad = tmp_path / "bad.so"
    bad.write_bytes(b"not a library")
    assert main(["run", str(bad)]) == 1
    assert "not a loadable TVM library" in capsys.readouterr().err
    assert main(["show", str(tmp_path / "missing.json")]) == 1
    assert "cannot read schedule file" in capsys.readouterr().err
    # a model file that is not there: one line naming it, not a traceback (checked before the ONNX import)
    assert main(["compile", str(tmp_path / "absent.onnx")]) == 1
    assert "ONNX model file not found: " + str(tmp_path / "absent.onnx") in capsys.readouterr().err
    # an unknown scheduler is refused before the model is loaded, listing every choice (autograph included)
    assert main(["compile", "squeezenet", "--scheduler", "nope"]) == 1
    assert "unknown scheduler 'nope'; available: autograph, exhaustive, greedy, hios, ios, lios, sequential" \
        in capsys.readouterr().err


def test_schedule_with_timed_costs(tmp_path, capsys):
    out = tmp_path / "s.json"
    args = ["schedule", "squeezenet", "--width", "0.125", "--image-size", "32", "--scheduler", "ios",
            "--cost-cache", str(tmp_path / "cc.json"), "-o", str(out), "--json", "--quiet"]
    assert main(args + ["--cost", "learned:rounds=2,seed_stages=8"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["cost"].startswith("measured:cpu")
    assert 1 <= len(summary["search"]["active_rounds"]) <= 2 and summary["search"]["measurements"] > 0
    assert json.loads(out.read_text())["scheduler"] == "ios"
    assert main(args + ["--cost", "measured"]) == 0  # every stage timed, many of them from the cache above
    summary = json.loads(capsys.readouterr().out)
    assert summary["search"]["cache_hits"] > 0


def test_schedule_timed_cost_needs_real_kernels(capsys):
    assert main(["schedule", "synthetic:inception_v3", "--cost", "measured"]) != 0
    assert "synthetic graphs have none" in capsys.readouterr().err


def test_progress_logging_shows_long_work_on_stderr(capsys):
    import argparse
    import logging

    from tvm_interop.cli.common import progress_logging

    log = logging.getLogger("tvm_interop.passes.schedulers.active")
    with progress_logging(argparse.Namespace(quiet=False, json=False, verbose=False), force=True):
        log.info("learned search round %d", 1)
    log.info("not shown after the block")
    with progress_logging(argparse.Namespace(quiet=True, json=False, verbose=False), force=True):
        log.info("not shown with --quiet")
    err = capsys.readouterr().err
    assert "learned search round 1" in err and "not shown" not in err


def test_compile_reports_a_failed_memory_report_after_writing_its_outputs(tmp_path, capsys, monkeypatch):
    """The activation memory report compiles the built program again through TVM's pipeline; if that fails, the
    library and schedule are still written and the failure is named, not a traceback."""
    import tvm_interop.api as api

    def broken(self):
        raise RuntimeError("InternalError: the report's own compile failed")

    monkeypatch.setattr(api.CompiledModel, "memory_report", broken)
    so, sj = tmp_path / "m.so", tmp_path / "s.json"
    rc = main(["compile", "squeezenet", "--width", "0.125", "--image-size", "32", "--scheduler", "greedy",
               "--guard", "off", "-o", str(so), "--schedule-out", str(sj), "--json"])
    captured = capsys.readouterr()
    assert rc == 0 and so.exists() and sj.exists()
    out = json.loads(captured.out)
    assert "the report's own compile failed" in out["activation_report_error"]
    assert out["activation_scheduled_bytes"] is None
    assert "activation memory report failed" in captured.err
