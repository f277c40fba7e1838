"""scripts/gpu_experiments.sh: what a device call carries, with an active search pending, ended or absent."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _carry(active: str) -> list[str]:
    env = dict(os.environ, GPU_EXPERIMENTS_ACTIVE=active, GPU_EXPERIMENTS_BUILD="build_dir")
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
