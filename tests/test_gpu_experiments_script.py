"""scripts/gpu_experiments.sh: what a device call carries (each build once its manifest exists, as a new checkout
has none), with an active search pending, ended or absent, and in as many calls as the device tool's 64 MiB
(working tree included) needs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _carry(active: str, build: str) -> list[str]:
    env = dict(os.environ, GPU_EXPERIMENTS_ACTIVE=active, GPU_EXPERIMENTS_BUILD=build,
               GPU_EXPERIMENTS_FLOW=os.path.join(active, "no-flow-build"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_experiments.sh"), "carry"], env=env,
                         capture_output=True, text=True, check=True).stdout
    (line,) = out.splitlines()   # small builds: one call
    return json.loads(line)


def _built(path) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "manifest.json"), "w") as f:
        f.write("{}")
    return str(path)


def test_carry_names_the_pending_round_and_leaves_an_ended_search_out(tmp_path):
    b = _built(tmp_path / "build_dir")
    active = tmp_path / "search"
    for k in (1, 2, 10):
        (active / f"round-{k}").mkdir(parents=True)
    (active / "round-x").mkdir()          # not a round
    assert _carry(str(active), b) == [b, f"{active}/round-10"]            # no state yet: the highest round
    (active / "active.json").write_text(json.dumps({"round": 10, "pending": {"round": 10}}))
    assert _carry(str(active), b) == [b, f"{active}/round-10"]
    (active / "active.json").write_text(json.dumps({"round": 10, "pending": None}))   # the search has ended
    assert _carry(str(active), b) == [b]
    assert _carry(str(tmp_path / "absent"), b) == [b]
    assert _carry(str(tmp_path / "absent"), str(tmp_path / "never_built")) == []   # a new checkout: nothing


def test_carry_adds_the_flow_build_once_it_is_built(tmp_path):
    b = _built(tmp_path / "build_dir")
    env = dict(os.environ, GPU_EXPERIMENTS_ACTIVE=str(tmp_path / "absent"), GPU_EXPERIMENTS_BUILD=b,
               GPU_EXPERIMENTS_FLOW=str(tmp_path / "flow"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")

    def carry():
        return json.loads(subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_experiments.sh"), "carry"],
                                         env=env, capture_output=True, text=True, check=True).stdout)

    assert carry() == [b]
    (tmp_path / "flow").mkdir()
    assert carry() == [b]                     # a build that did not finish has no manifest
    (tmp_path / "flow" / "manifest.json").write_text("{}")
    assert carry() == [b, str(tmp_path / "flow")]
    os.remove(os.path.join(b, "manifest.json"))
    assert carry() == [str(tmp_path / "flow")]   # the flow build alone (a new checkout that built only it)


def test_carry_splits_the_builds_into_calls_that_fit_the_device_tools_limit(tmp_path):
    """64 MiB per call, the working tree that travels included: two builds that do not fit together go in two
    calls, in order (sparse files: their apparent size is what travels)."""
    b, flow = _built(tmp_path / "build_dir"), _built(tmp_path / "flow")
    for d, mib in ((b, 20), (flow, 30)):
        with open(os.path.join(d, "libs.so"), "wb") as f:
            f.truncate(mib << 20)
    env = dict(os.environ, GPU_EXPERIMENTS_ACTIVE=str(tmp_path / "absent"), GPU_EXPERIMENTS_BUILD=b,
               GPU_EXPERIMENTS_FLOW=flow)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")

    def calls():
        out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_experiments.sh"), "carry"], env=env,
                             capture_output=True, text=True, check=True, cwd=ROOT).stdout
        return [json.loads(line) for line in out.splitlines()]

    tree = sum(os.path.getsize(os.path.join(ROOT, f)) for f in subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True, check=True,
        cwd=ROOT).stdout.decode().split("\0") if f and os.path.isfile(os.path.join(ROOT, f)))
    if tree + (50 << 20) > (63 << 20):
        assert calls() == [[b], [flow]]
    else:   # a checkout small enough for both: grow the flow build past the limit
        with open(os.path.join(flow, "libs.so"), "wb") as f:
            f.truncate((63 << 20) - tree)
        assert calls() == [[b], [flow]]
    os.remove(os.path.join(flow, "libs.so"))
    assert calls() == [[b, flow]]
