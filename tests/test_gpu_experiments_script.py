"""scripts/gpu_experiments.sh: what a device call carries (each build once its manifest exists, as a new checkout
has none), with an active search pending, ended or absent."""
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
    return json.loads(out)


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
