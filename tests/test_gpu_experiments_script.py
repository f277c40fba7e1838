"""scripts/gpu_experiments.sh: what a device call carries, with an active search pending, ended or absent, and the
flow build once it is built."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _carry(active: str) -> list[str]:
    env = dict(os.environ, GPU_EXPERIMENTS_ACTIVE=active, GPU_EXPERIMENTS_BUILD="build_dir",
               GPU_EXPERIMENTS_FLOW=os.path.join(active, "no-flow-build"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_experiments.sh"), "carry"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_carry_names_the_pending_round_and_leaves_an_ended_search_out(tmp_path):
    active = tmp_path / "search"
    for k in (1, 2, 10):
        (active / f"round-{k}").mkdir(parents=True)
    (active / "round-x").mkdir()          # not a round
    assert _carry(str(active)) == ["build_dir", f"{active}/round-10"]            # no state yet: the highest round
    (active / "active.json").write_text(json.dumps({"round": 10, "pending": {"round": 10}}))
    assert _carry(str(active)) == ["build_dir", f"{active}/round-10"]
    (active / "active.json").write_text(json.dumps({"round": 10, "pending": None}))   # the search has ended
    assert _carry(str(active)) == ["build_dir"]
    assert _carry(str(tmp_path / "absent")) == ["build_dir"]


def test_carry_adds_the_flow_build_once_it_is_built(tmp_path):
    env = dict(os.environ, GPU_EXPERIMENTS_ACTIVE=str(tmp_path / "absent"), GPU_EXPERIMENTS_BUILD="build_dir",
               GPU_EXPERIMENTS_FLOW=str(tmp_path / "flow"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")

    def carry():
        return json.loads(subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_experiments.sh"), "carry"],
                                         env=env, capture_output=True, text=True, check=True).stdout)

    assert carry() == ["build_dir"]
    (tmp_path / "flow").mkdir()
    assert carry() == ["build_dir"]                     # a build that did not finish has no manifest
    (tmp_path / "flow" / "manifest.json").write_text("{}")
    assert carry() == ["build_dir", str(tmp_path / "flow")]
