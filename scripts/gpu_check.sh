#!/usr/bin/env bash
# GPU check: build the zoo for CUDA here, check outputs and time batch-1 latency on an NVIDIA GPU there, and find
# races between streams. (plain TVM, sequential, greedy, lios, ios -- stage and dependency mode, each with and
# without CUDA graph -- and PyTorch eager on the same network.) The code is scripts/gpu_check.py + scripts/gpucheck/.
#
# Recipe for this workplace's device tool (GPU machine: H100/H200, Python 3.12, PyTorch, maybe nvcc, NO
# compiler-side TVM and no network; the tool copies the repo's working tree plus the ignored paths named in `carry`,
# 64 MiB in all, and returns files written under $OUT):
#
#   1. here (needs .venv with TVM's compiler and nvcc; no GPU), from the repo root:
#        scripts/gpu_check.sh build                 # all zoo models, width 1.0 (takes a while on 2 cores)
#        scripts/gpu_check.sh build --models inception_v3,squeezenet --width 0.5     # a smaller run
#        scripts/gpu_check.sh build --models squeezenet --width 0.25                 # ~30 s: a smoke test
#      -> .gpu_check/ (ignored by git via .git/info/exclude; --dir elsewhere for experiments):
#         libs/<model>.plain.so.xz (plain TVM build: the reference), libs/<model>.sched.so.xz (all schedules),
#         libs/<model>.torch.json (graph JSON for the PyTorch baseline), manifest.json, tvm_kit.tar.xz (TVM's
#         Python package without libtvm_compiler.so), whl/ (apache-tvm-ffi for cp312; --no-kit skips both).
#         Kernels are fatbins compiled here by nvcc (sm_90 unless --target says otherwise); a library holding CUDA
#         source is refused by the build. Weights are generated on the device from a seed, so the libraries stay
#         small; the build exits 1 when .gpu_check is over 60 MiB.
#         Every dependency-mode variant with streams also comes as '<name> [waits at consumer]' (its waits issued
#         as the builds before 2026-11-27 did; --waits stage-start to leave them out); with --sync tvm,events
#         every scheduled variant with streams also as '<name> [events]' (reused events of the native
#         extension instead of TVM's per-call event), and every model also as an entry
#         MODEL+cudnn (--cudnn all|a,b|''; --tf32 for MODEL+cudnn+tf32) whose scheduled variants run every offloadable
#         convolution / dense layer through cuDNN / cuBLAS (the extension linked into the library; the device's
#         python3 finds libcudnn / libcublasLt in its nvidia-* wheels), checked against plain TVM's own kernels.
#         That is about 2.5x the variants of before: run the models in two or three calls (--models) to stay
#         inside the device tool's 600 s per call.
#         --splitk MODELS adds an entry MODEL+splitk: its scheduled variants run the convolutions with few outputs
#         and long reductions with passes/kernels/gpu_splitk.py's schedule (not measured yet; checked against
#         plain TVM's own kernels like every entry).
#         Every direct stage-mode variant (TVM's sync, not merged or wave-fused) also has a timed twin: the run
#         records each stage's cost inside the program ('in_context'; --no-stage-times to leave them out), and
#         scripts/in_context_table.py puts those costs into a model's cost table.
#         The build also holds a host-cost probe (libs/probe.so; --no-probe to leave it out): the run times each
#         kind of op alone first (kernel launch, TVM sync idle/busy, reused event, stream switch, keep-alive).
#         --unit-costs MODELS adds a bundle of each model's units (and their library calls), which the run
#         measures into $OUT/unit_costs/MODEL.json; a second build with --auto MODEL=<that file> adds the entry
#         MODEL+auto (per unit, TVM kernel or library call, whichever measured faster) for a second run.
#   2. there: one call of the device tool's `run` with
#        carry: [".gpu_check"]      command: bash scripts/gpu_check.sh run      (timeout_s 600)
#      which unpacks the runtime kit into /tmp, installs the wheel with `pip install --no-index --target`, sets
#      TVM_USE_RUNTIME_LIB=1 and runs `python3 scripts/gpu_check.py run --dir .gpu_check --out $OUT`
#      (extra arguments go to it: --repeat 200 --warmup 20 --models a,b). It writes $OUT/gpu_check.json and
#      $OUT/gpu_check.md, which the tool copies back (files_at). Exit 1: a variant failed; exit 2: the carried
#      build cannot run with TVM's runtime alone (a library holds CUDA source: rebuild here).
#      `bash scripts/gpu_check.sh diagnose [--runs 4] [--models a,b]` (same carry): every concurrent variant
#      --runs times on the same inputs (run-to-run spread, error against plain TVM), then the same in a child
#      process with CUDA_LAUNCH_BLOCKING=1: exact / racy / wrong per variant ($OUT/gpu_check_diagnose.json, .md).
#      Both reports record the environment (device, compute capability, SMs, driver, CUDA driver API and runtime,
#      nvcc or "not found", TVM, Python, PyTorch) and that only TVM's runtime was used (`runtime_only`).
#   3. here:
#        scripts/gpu_check.sh report <files_at>/gpu_check.json      # -> docs/gpu_check.json, docs/gpu_check.md
#      (a run split into calls by --models: name each call's gpu_check.json, in order; one report)
set -euo pipefail
cd "$(dirname "$0")/.."
step="${1:-}"
D="${GPU_CHECK_DIR:-.gpu_check}"   # another build: GPU_CHECK_DIR=DIR (carry that one)

# The GPU machine's environment: TVM's runtime only (the kit built here, without libtvm_compiler.so) and the
# apache-tvm-ffi wheel, on PYTHONPATH; used by the run and diagnose steps.
runtime_kit() {
  [ -f "$D/manifest.json" ] || { echo "gpu_check: $D/manifest.json missing (run 'build' here, carry .gpu_check)" >&2; exit 2; }
  KIT=/tmp/gpu_check_kit SITE=/tmp/gpu_check_site
  mkdir -p "$KIT" "$SITE"
  tar xJf "$D/tvm_kit.tar.xz" -C "$KIT"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$D"/whl/*.whl
  export PYTHONPATH="$KIT:$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}" TVM_USE_RUNTIME_LIB=1 PYTHONUNBUFFERED=1
}

shift || true
case "$step" in
  build)
    EXCLUDE="$(git rev-parse --git-path info/exclude 2>/dev/null || echo .git/info/exclude)"
    mkdir -p "$(dirname "$EXCLUDE")"
    grep -qxF '/.gpu_check/' "$EXCLUDE" 2>/dev/null || echo '/.gpu_check/' >> "$EXCLUDE"
    PY=.venv/bin/python
    [ -x "$PY" ] || PY=python3
    export TVM_CUDA_COMPILE_MODE="${TVM_CUDA_COMPILE_MODE:-nvcc}"
    exec "$PY" scripts/gpu_check.py build "$@"
    ;;
  run)
    runtime_kit
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
    exec python3 scripts/gpu_check.py run --dir "$D" --out "${OUT:-gpu_check_out}" "$@"
    ;;
  wave-diff)
    # every fused stage's wave kernel (or flow run's launch: `build --fusion flow`) against its members alone, built
    # here by `scripts/gpu_wave_diff.py build` (carry .wave_diff, or the --dir given, and the build's directory,
    # whose runtime kit this uses); extra arguments: [--dir DIR] the models
    runtime_kit
    exec python3 scripts/gpu_wave_diff.py run --out "${OUT:-gpu_check_out}/wave_diff" "$@"
    ;;
  e2e)
    # the user's path: libraries written by `tvm-interop compile` (DIR/MODEL_tvm.so and MODEL_cudnn.so /
    # MODEL_flow.so beside it) loaded with TVM's runtime only, picked, timed and checked against the TVM-kernel
    # library (scripts/gpu_e2e_check.py; carry DIR and the build's directory, whose runtime kit this uses)
    runtime_kit
    [ $# -ge 1 ] || { echo "usage: scripts/gpu_check.sh e2e DIR [--models a,b]" >&2; exit 2; }
    exec python3 scripts/gpu_e2e_check.py --out "${OUT:-gpu_check_out}/e2e" "$@"
    ;;
  tuning-round)
    # one round of CUDA tuning candidates (`tvm-interop tune MODEL --target cuda --bundle DIR`, carry DIR and the
    # build's directory for its runtime kit) timed here; then `tvm-interop tune MODEL --db DB --import` the file
    runtime_kit
    [ $# -ge 1 ] || { echo "usage: scripts/gpu_check.sh tuning-round BUNDLE_DIR" >&2; exit 2; }
    exec python3 -m tvm_interop.runtime.tuning_bundle "$1" -o "${OUT:-gpu_check_out}/tune_results.json" --device cuda
    ;;
  profile-round)
    # one round of an active device search (`tvm-interop schedule MODEL --active DIR`: carry DIR and the build's
    # directory for its runtime kit), or any profiling bundle, measured here; then `tvm-interop schedule MODEL
    # --active DIR --import` the table (the search continues, and ships the pick with the lowest measured program)
    runtime_kit
    [ $# -ge 1 ] || { echo "usage: scripts/gpu_check.sh profile-round BUNDLE_DIR" >&2; exit 2; }
    mkdir -p "${OUT:-gpu_check_out}"
    exec python3 -m tvm_interop.runtime.profile_bundle "$1" -o "${OUT:-gpu_check_out}/costs.json"
    ;;
  diagnose)
    # the race check: every concurrent variant several times, then serialized (CUDA_LAUNCH_BLOCKING=1)
    runtime_kit
    exec python3 scripts/gpu_check.py diagnose --dir "$D" --out "${OUT:-gpu_check_out}" "$@"
    ;;
  report)
    PY=.venv/bin/python
    [ -x "$PY" ] || PY=python3
    exec "$PY" scripts/gpu_check.py report "$@"
    ;;
  *)
    echo "usage: scripts/gpu_check.sh build [--models a,b] [--width W] ... | run [--repeat N] | diagnose [--runs N] | wave-diff MODEL... | e2e DIR [--models a,b] | tuning-round BUNDLE_DIR | profile-round BUNDLE_DIR | report RESULT.json [MORE.json ...] [--name N]" >&2
    exit 2
    ;;
esac
