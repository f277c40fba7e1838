#!/usr/bin/env bash
# Create .venv (if missing) and install tvm-interop with the given extras, e.g. `scripts/setup_venv.sh test,onnx`.
# Idempotent and quick when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-test}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# Quiet pip, but keep errors. apache-tvm-ffi is pinned in pyproject (0.1.15.post2 segfaults in save_json).
.venv/bin/python -m pip install --disable-pip-version-check -q -e ".[${EXTRAS}]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import tvm, tvm_interop; print('tvm', tvm.__version__, '| tvm-interop', tvm_interop.__version__)"
