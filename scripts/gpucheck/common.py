"""Settings shared by the GPU check's steps (``scripts/gpu_check.py`` is the command line)."""
from __future__ import annotations

import os

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "gpu_check.py")
DEFAULT_DIR = os.path.join(REPO, ".gpu_check")
SCHEDULERS = ("sequential", "greedy", "lios", "ios", "greedy+wave", "lios+wave")
WAVE = "+wave"   # scheduler suffix: the schedule with every fusable stage fused into one kernel (passes.wave)
CARRY_LIMIT = 60 * 2**20
FUNC = "__tvm_interop_main"
