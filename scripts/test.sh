#!/usr/bin/env bash
# Install into .venv (tests + ONNX + viz + rpc + cuda extras) and run the test suite.
#   scripts/test.sh            the development suite (skips tests marked zoo, ci or slow)
#   scripts/test.sh --zoo      adds the zoo-wide checks on the costliest zoo models (marker zoo) and the further
#                              cases of checks the development suite makes on cheaper ones (marker ci): what CI runs
#   scripts/test.sh --slow     everything, including full-size model tests
#   scripts/test.sh -k ios     extra arguments go to pytest
# Set TVM_INTEROP_EXTRAS=test,onnx,torch to also test the torch frontend (torch==2.13.0, a CPU build).
#
# Two passes: every test not marked `serial` runs on TVM_INTEROP_TEST_WORKERS pytest-xdist workers (default: the
# usable cores, at most 4; 1 = no xdist), then the `serial` tests (they assert on wall-clock time, so they must not
# share the cores with another worker) run alone. Most tests wait on one single-threaded LLVM build, which is why
# a second worker nearly halved the suite when it was measured (22 -> 13 min); 2026-11-27: 24 min with two workers.
# The first pass lists its 25 slowest tests (--durations), so a log says where the suite's time goes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_venv.sh "${TVM_INTEROP_EXTRAS:-test,onnx,viz,rpc,cuda}"
# tiers: the default leaves out `zoo`, `ci` and `slow`; --zoo adds `zoo` and `ci`; --slow adds all three
SKIP="not slow and not zoo and not ci"
ARGS=()
for a in "$@"; do
  case "$a" in
    --slow) SKIP="" ;;
    --zoo) [ -z "$SKIP" ] || SKIP="not slow" ;;
    *) ARGS+=("$a") ;;
  esac
done
and_slow() { if [ -n "$SKIP" ]; then echo "$1 and $SKIP"; else echo "$1"; fi; }

CORES=$(.venv/bin/python -c "import os; print(len(os.sched_getaffinity(0)))")
WORKERS="${TVM_INTEROP_TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}"
PARALLEL=()
if [ "$WORKERS" -gt 1 ] && .venv/bin/python -c "import xdist" 2>/dev/null; then
  PARALLEL=(-n "$WORKERS")
fi

# pytest exits 5 when a pass selects no test (e.g. -k matching only one kind): not a failure
status=0
.venv/bin/python -m pytest -q --durations=25 "${PARALLEL[@]}" -m "$(and_slow "not serial")" "${ARGS[@]}" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
serial=0
.venv/bin/python -m pytest -q -m "$(and_slow "serial")" "${ARGS[@]}" || serial=$?
if [ "$serial" -ne 0 ] && [ "$serial" -ne 5 ]; then exit "$serial"; fi
if [ "$status" -eq 5 ] && [ "$serial" -eq 5 ]; then echo "no test selected" >&2; exit 5; fi
exit 0
