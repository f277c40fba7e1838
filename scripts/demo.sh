#!/usr/bin/env bash
# Install into .venv and run the main job: compile a built-in multi-branch model (Inception-v3) with the best
# scheduler available, run it, print scheduled vs sequential latency, write the schedule JSON and the .so to out/.
#   scripts/demo.sh [--model NAME] [--width W] [--image-size N] [--repeat N]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh test
exec .venv/bin/python scripts/demo.py "$@"
