#!/usr/bin/env bash
# Install into .venv (tests + ONNX + viz + rpc + cuda extras) and run the test suite.
#   scripts/test.sh            default suite (skips tests marked slow)
#   scripts/test.sh --slow     everything, including full-size model tests
#   scripts/test.sh -k ios     extra arguments go to pytest
# Set TVM_INTEROP_EXTRAS=test,onnx,torch to also test the torch frontend (torch==2.13.0, a CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh "${TVM_INTEROP_EXTRAS:-test,onnx,viz,rpc,cuda}"
MARK=(-m "not slow")
ARGS=()
for a in "$@"; do
  if [ "$a" = "--slow" ]; then MARK=(); else ARGS+=("$a"); fi
done
exec .venv/bin/python -m pytest -q "${MARK[@]}" "${ARGS[@]}"
