#!/usr/bin/env bash
# The open GPU questions of issues 12 and 15, built here from committed code in one command and measured in one
# call of the device tool per line that `carry` prints (two since 2026-11-30: the tool's 64 MiB includes the
# working tree).
#
# Why a script: a session's checkout (and the ignored builds in it) does not always survive to the next session,
# and a session is lent a GPU only now and then. Builds prepared by hand were lost that way; this rebuilds them
# in one command, so a session that draws a GPU spends its device minutes measuring, not rebuilding by hand.
#
#   scripts/gpu_experiments.sh build            # here (TVM's compiler + nvcc, no GPU): its longest part 73 min on 2 cores
#   scripts/gpu_experiments.sh carry            # prints the paths to carry: one JSON line per device call
#   scripts/gpu_experiments.sh run              # there, once per line of `carry` (timeout_s 600 each)
#   scripts/gpu_experiments.sh finish FILES_AT  # here: the reports into docs/ and the search's next round
#
# Measure as soon as a part is built: `build` builds the flow part in the background beside the rest, and the main
# part ($BUILD) is ready long before it (2026-11-30: 19 min against 73). A device machine lent at the start of a
# session may be withdrawn before the end (2026-11-30: lent at 11:00, withdrawn when the whole build was ready at
# 12:32, nothing measured), so once `carry` names $BUILD, run it (the main part alone took 145-162 s on the device
# on 2026-11-28, plus a minute or two to start the machine), and the flow part in a second call once it is built
# (its run is cut at 240 s and its diff at 120 s). `run` measures what was carried, `finish` reports what came
# back; the second call's `finish` writes only the flow reports.
# Full size, 2026-11-28 on the 2-core dev machine: 16 min 16 s, 9.6 MiB of libraries + 12 MiB of search round
# (inception_v3 138 s, squeezenet 70 s, randwire 259 s, nasnet_a_large 282 s of gpu_check build; the rest is the
# seven schedule searches and the active round). With the pair probes and the search ended (2026-11-28, later):
# 15 min 34 s, 9.9 MiB (inception_v3 147 s, squeezenet 57 s, randwire 260 s, nasnet_a_large 295 s); the same part
# on 2026-11-28's third machine, by hand: 7 min 44 s (75, 32, 121, 151 s). The flow part then takes 25 min and its
# diff libraries 20 min more (three flow variants, 30 MiB; see "flow" below). On 2026-11-30's (slower) EPYC host:
# the main part 19 min (inception_v3 165 s, squeezenet 61 s, randwire 302 s, nasnet_a_large 354 s), the flow part
# 73 min (randwire 1349 s; nasnet_a_mobile 2966 s, 11 GiB of memory at its peak while LLVM compiled the host
# code), RandWire's diff libraries 15 min beside it; 17 MiB carried for the flow part with RandWire's diff. GPU_EXPERIMENTS_SIZE="--width 0.125 --image-size 96" builds every
# part at that size, a smoke test of this script (2026-11-27: 16.5 min, 9.7 + 12 MiB; 2026-11-30 evening, znver4
# EPYC, code of a606ce5: the main part within 12 min, the flow part with its diff libraries within 58 min, exit 0).
# GPU_EXPERIMENTS_BUILD / GPU_EXPERIMENTS_ACTIVE name other directories.
#
# What each part answers:
#   widths   Inception-v3 and NASNet-A-large with ios limited to 2 and 4 groups per stage (ios_s2, ios_s4), with
#            kernel timelines of their CUDA-graph programs: is NASNet-A-large's ios + CUDA graph slow (14.34 ms
#            against greedy's 9.91 ms on the H200 geomean run) because its stages are wide? (2026-11-28, H200: its
#            kernels ran 29.4 ms per call against ~13 ms in sequence.) The timelines of sequential, greedy and lios
#            with CUDA graph come too, each kernel's time kept, so the report names the kernels that grew against
#            the sequential graph: the contention the program model lacks. Since the second 2026-11-28 run also the
#            direct-launch twins "ios" and "greedy" (do host-paced launches contend less than a graph's?), and every
#            timeline keeps its last call's kernel spans (which neighbour slowed which kernel); `finish` checks the
#            program model kernel by kernel on them (scripts/gpu_kernel_check.py).
#   pairs    Inception-v3 and NASNet-A-large run one kernel at a time except for pairs of kernels that ios runs
#            side by side, each pair alone in its stage (scripts/pair_probe.py): with the spans of its CUDA-graph
#            timeline, every member's time beside exactly one known neighbour, against its time alone in the
#            sequential graph. The controlled data a sharing model of the device is fitted on (none fitted on
#            whole-program totals ordered NASNet-A-large's programs right, docs/gpu_kernel_check_h200_2026-11-28b.md).
#   preset   SqueezeNet, RandWire and NASNet-A-large with ios searched under sim:h200-tvm, the preset fitted to
#            TVM's default CUDA kernels (ios_tvm), against ios under sim:h100: if it is faster on the device, the
#            CUDA default cost could switch.
#   geomean  the four models of issue 12's geomean target (Inception-v3, RandWire, NASNet-A-large, SqueezeNet)
#            with sequential, greedy, lios and ios in both modes, with and without CUDA graph: one build, so the
#            run also re-measures the target (H200 geomean run: 1.57x; target 1.6x).
#   flow     issue 15: RandWire and NASNet-A-mobile with greedy's stages run as flow launches (passes/wave/flow.py:
#            runs of whole stages in one persistent launch, each block waiting only for its producers' counters)
#            beside the same schedule as waves and as streams: does a launch without barriers between stages beat
#            the dependency-mode CUDA graphs that beat the waves (0.96x / 0.87x on an H100)? Beside greedy+flow,
#            two variants that each change one thing: greedy+flow_noinline, each device function compiled as a
#            call (RandWire's run: 785 KB of machine code against 1.11 MB inlined): is it the instruction cache?
#            greedy+flow_coarse, one task per block of a repacked member's own (RandWire's run: 20,088 tasks
#            against 60,306, each taken from one counter): is it handing out tasks? Its own build directory
#            (GPU_EXPERIMENTS_FLOW, default .gpu_check_exp_flow; 2026-11-28 here, the three variants: both models
#            built in 25 min, the diff libraries in 20 min more; 30 MiB), its own output (run/flow), measured after
#            the rest under a timeout: a wait that never ends gives up after 2^16 polls (a wrong output, not a hung GPU;
#            it counts itself in the launch's last counter, which the diff below reads back as waits_given_up),
#            and the timeout bounds what is left. Then each run's launch, plain and coarsened, against its members
#            alone (scripts/gpu_wave_diff.py --fusion flow, built into $FLOW/diff): if a flow variant is wrong,
#            the first unit whose output differs.
#   e2e      issue 15: what `compile(fusion="flow")` ships (`tvm-interop compile squeezenet --target cuda
#            --flow-fusion`: the flow launches and, beside them, the schedule unfused and sequential), loaded with
#            TVM's runtime only next to the same model compiled without it ($BUILD/e2e): does the picker choose the
#            flow launches, and do they compute what the TVM-kernel library computes (scripts/gpu_e2e_check.py)?
#            (2026-11-30, full size: the two libraries built in 25 s and 57 s, 12.6 MiB; SqueezeNet's greedy
#            schedule, 31 stages, became one launch of 39 kernels and 16,472 blocks)
#   active   (only when GPU_EXPERIMENTS_ACTIVE names the search directory: a new checkout would otherwise start the
#            ended search of 2026-11-28 again, as the 2026-11-30 build did)
#            the next round of an active device search on NASNet-A-large whose bundles have the dependency-mode
#            twins of the picks' programs: the highest round-K in the search directory (`finish` imports it and
#            builds round K+1; rounds 1-4 were measured on an H200 on 2026-11-28 and the search ended there, so
#            `carry` and `run` leave it out until GPU_EXPERIMENTS_ACTIVE names a search with a round pending).
set -euo pipefail
cd "$(dirname "$0")/.."
step="${1:-}"
shift || true
BUILD="${GPU_EXPERIMENTS_BUILD:-.gpu_check_exp}"
FLOW="${GPU_EXPERIMENTS_FLOW:-.gpu_check_exp_flow}"
FLOW_MODELS=randwire,nasnet_a_mobile
ACTIVE="${GPU_EXPERIMENTS_ACTIVE:-}"   # e.g. .active_nasnet_large_twins (the search of 2026-11-28, ended)
# the round a run measures: the highest-numbered round-K of the search (the one `finish` has not imported yet)
latest_round() {
  local d best="" n max=-1
  for d in "$ACTIVE"/round-*; do
    n="${d##*/round-}"
    if [ -d "$d" ] && [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt "$max" ]; then max="$n"; best="$d"; fi
  done
  echo "$best"
}
# the round to measure, or nothing when the search has ended (active.json's "pending" is null after the import that
# made no new round: the NASNet-A-large search of 2026-11-28 after round 4)
pending_round() {
  [ -n "$ACTIVE" ] || return 0
  local a="$ACTIVE/active.json"
  if [ -f "$a" ] && "$PY" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("pending") is None else 1)' "$a"; then
    return 0
  fi
  latest_round
}
MODELS=inception_v3,squeezenet,randwire,nasnet_a_large
read -r -a SIZE <<< "${GPU_EXPERIMENTS_SIZE:-}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
TI=(env PYTHONUNBUFFERED=1 "$PY" -c "import sys; from tvm_interop.cli import main; sys.exit(main())")

exclude() {
  local f
  f="$(git rev-parse --git-path info/exclude)"
  mkdir -p "$(dirname "$f")"
  grep -qxF "/$1/" "$f" 2>/dev/null || echo "/$1/" >> "$f"
}

case "$step" in
  build)
    exclude "$BUILD"; exclude "$FLOW"
    # the flow part in the background (its own directory, one core: nvcc and LLVM on one huge launch each), the
    # rest beside it; its output goes to its own log, shown when it ends
    mkdir -p "$FLOW"
    flow_log="$FLOW/build.log"
    (
      set -e
      GPU_CHECK_DIR="$FLOW" bash scripts/gpu_check.sh build --dir "$FLOW" --models "$FLOW_MODELS" "${SIZE[@]}" \
        --schedulers sequential,greedy,greedy+wave,greedy+flow,greedy+flow_noinline,greedy+flow_coarse --cudnn ''
      # each flow run's launch beside its members alone (carried inside $FLOW): names the first wrong unit if any
      "$PY" scripts/gpu_wave_diff.py build --fusion flow --models "$FLOW_MODELS" --dir "$FLOW/diff"
    ) > "$flow_log" 2>&1 &
    flow_pid=$!
    trap 'kill "$flow_pid" 2>/dev/null || true' EXIT
    echo "gpu_experiments: the flow part builds in the background (log: $flow_log)"
    S="$BUILD/schedules"
    mkdir -p "$S"
    SCHEDULES=()
    for m in inception_v3 nasnet_a_large; do
      for s in 2 4; do
        "${TI[@]}" schedule "$m" "${SIZE[@]}" --target cuda --s "$s" --quiet -o "$S/$m.ios_s$s.json"
        SCHEDULES+=(--schedule "$m:ios_s$s=$S/$m.ios_s$s.json")
      done
    done
    for m in squeezenet randwire nasnet_a_large; do
      "${TI[@]}" schedule "$m" "${SIZE[@]}" --target cuda --cost sim:h200-tvm --quiet -o "$S/$m.ios_tvm.json"
      SCHEDULES+=(--schedule "$m:ios_tvm=$S/$m.ios_tvm.json")
    done
    for m in inception_v3 nasnet_a_large; do
      "$PY" scripts/pair_probe.py "$m" "${SIZE[@]}" -o "$S/$m.pairs.json"
      SCHEDULES+=(--schedule "$m:pairs=$S/$m.pairs.json")
    done
    # no cuDNN entries, waits and syncs as the product lowers them: the questions are about TVM's kernels
    GPU_CHECK_DIR="$BUILD" bash scripts/gpu_check.sh build --dir "$BUILD" --models "$MODELS" "${SIZE[@]}" \
      --schedulers sequential,greedy,lios,ios --cudnn '' --waits stage-start --sync tvm "${SCHEDULES[@]}" "$@"
    # the user's path with flow launches (the e2e part): the CLI's libraries, TVM kernels and --flow-fusion
    mkdir -p "$BUILD/e2e"
    "${TI[@]}" compile squeezenet "${SIZE[@]}" --target cuda --scheduler greedy --quiet -o "$BUILD/e2e/squeezenet_tvm.so"
    "${TI[@]}" compile squeezenet "${SIZE[@]}" --target cuda --scheduler greedy --flow-fusion --quiet \
      -o "$BUILD/e2e/squeezenet_flow.so"
    if [ -n "$ACTIVE" ]; then
      exclude "$ACTIVE"
      if [ ! -f "$ACTIVE/active.json" ]; then
        "${TI[@]}" schedule nasnet_a_large "${SIZE[@]}" --target cuda --active "$ACTIVE" \
          -o "$ACTIVE/shipped.json" || [ -d "$ACTIVE/round-1" ]
      fi
      [ -d "$ACTIVE/round-1" ] || { echo "gpu_experiments: $ACTIVE/round-1 was not made" >&2; exit 1; }
    fi
    echo "gpu_experiments: $BUILD is built; carry it now: $("$0" carry) (the flow part is still building)"
    flow_status=0
    wait "$flow_pid" || flow_status=$?
    trap - EXIT
    cat "$flow_log"
    [ "$flow_status" -eq 0 ] || { echo "gpu_experiments: the flow part failed (exit $flow_status)" >&2; exit 1; }
    du -sh "$BUILD" "$FLOW" ${ACTIVE:+"$ACTIVE"}
    echo "carry: $("$0" carry)"
    ;;
  carry)
    # only what was built here (a new checkout keeps none of it): each build once its manifest exists
    ROUND="$(pending_round)"
    parts=()
    [ ! -f "$BUILD/manifest.json" ] || parts+=("$BUILD")
    [ -z "$ROUND" ] || parts+=("$ROUND")
    [ ! -f "$FLOW/manifest.json" ] || parts+=("$FLOW")
    # the device tool's limit (64 MiB) counts the working tree that travels with what is carried (2026-11-30: a
    # 16.5 MiB tree, 23 MiB main part, 30 MiB flow part with both diffs: over it together), so the parts are
    # packed into calls that each fit, in order; one line per call. Call them back to back: an idle machine is
    # handed back after 30 s
    "$PY" - "${parts[@]}" <<'PY'
import json, os, subprocess, sys

LIMIT = 64 << 20
MARGIN = 1 << 20   # what the tool adds besides the files (and files written before the call)


def size(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if not os.path.islink(os.path.join(d, f)))


files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True,
                       check=True).stdout.decode().split("\0")
room = LIMIT - MARGIN - sum(size(f) for f in files if f and os.path.isfile(f))
calls, cur, used = [], [], 0
for part in sys.argv[1:]:
    n = size(part)
    if cur and used + n > room:
        calls.append(cur)
        cur, used = [], 0
    if n > room:
        print(f"gpu_experiments: {part} ({n / 2**20:.1f} MiB) does not fit in one call beside the working tree "
              f"({room / 2**20:.1f} MiB left of 64)", file=sys.stderr)
    cur.append(part)
    used += n
calls.append(cur)
for c in calls:
    print(json.dumps(c))
PY
    ;;
  run)
    O="${OUT:-gpu_experiments_out}"
    status=0
    ROUND="$(pending_round)"
    if [ -n "$ROUND" ]; then
      echo "gpu_experiments: measuring $ROUND"
      GPU_CHECK_DIR="$BUILD" OUT="$O/active" bash scripts/gpu_check.sh profile-round "$ROUND" || status=1
    else
      echo "gpu_experiments: no active search round to measure (GPU_EXPERIMENTS_ACTIVE unset, the search ended, or its round not carried)"
    fi
    # the direct-launch twins of greedy and ios beside their graphs: are kernels launched by the host (paced at its
    # launch rate) slowed less by their neighbours than the same kernels released together by a graph?
    if [ -f "$BUILD/manifest.json" ]; then
      GPU_CHECK_DIR="$BUILD" OUT="$O/run" bash scripts/gpu_check.sh run --repeat 100 --warmup 10 --pick-rounds 0 \
        --timeline "ios + CUDA graph" --timeline "ios_s4 + CUDA graph" --timeline "ios_s2 + CUDA graph" \
        --timeline "sequential + CUDA graph" --timeline "greedy + CUDA graph" --timeline "lios + CUDA graph" \
        --timeline "ios" --timeline "greedy" --timeline "ios (dependency) + CUDA graph" \
        --timeline "pairs + CUDA graph" "$@" || status=1
    else
      echo "gpu_experiments: $BUILD was not carried (no manifest): its experiments are left out"
    fi
    if [ -f "$BUILD/manifest.json" ] && [ -f "$BUILD/e2e/squeezenet_flow.so" ]; then
      GPU_CHECK_DIR="$BUILD" OUT="$O" timeout 120 bash scripts/gpu_check.sh e2e "$BUILD/e2e" --models squeezenet \
        || status=1
    fi
    if [ -f "$FLOW/manifest.json" ]; then
      GPU_CHECK_DIR="$FLOW" OUT="$O/flow" timeout "${GPU_EXPERIMENTS_FLOW_TIMEOUT:-240}" bash scripts/gpu_check.sh run \
        --repeat 50 --warmup 5 --pick-rounds 0 --no-kernel-profile || status=1
      # the models whose diff libraries were built (a build cut short for time may carry only some)
      diffs=()
      for m in ${FLOW_MODELS//,/ }; do [ ! -f "$FLOW/diff/$m.json" ] || diffs+=("$m"); done
      if [ ${#diffs[@]} -gt 0 ]; then
        GPU_CHECK_DIR="$FLOW" OUT="$O/flow" timeout 120 bash scripts/gpu_check.sh wave-diff --dir "$FLOW/diff" \
          "${diffs[@]}" || status=1
      fi
    fi
    exit "$status"
    ;;
  finish)
    [ $# -ge 1 ] || { echo "usage: scripts/gpu_experiments.sh finish FILES_AT [NAME]" >&2; exit 2; }
    F="$1"
    NAME="${2:-gpu_check_experiments_$(date +%F)}"
    if [ -f "$F/run/gpu_check.json" ]; then
      bash scripts/gpu_check.sh report "$F/run/gpu_check.json" --name "$NAME"
      "$PY" scripts/gpu_cost_transfer.py "$F/run/gpu_check.json" --sim sim:h200-tvm \
        --out "docs/${NAME}_sim_transfer.json"
    fi
    if [ -f "$F/active/costs.json" ]; then
      [ -n "$ACTIVE" ] || { echo "gpu_experiments: $F/active/costs.json came back; set GPU_EXPERIMENTS_ACTIVE to the search it measured" >&2; exit 2; }
      "${TI[@]}" schedule nasnet_a_large "${SIZE[@]}" --target cuda --active "$ACTIVE" --import "$F/active/costs.json" \
        -o "$ACTIVE/shipped.json"
    fi
    if [ -f "$F/e2e/e2e.json" ]; then
      cp "$F/e2e/e2e.json" "docs/${NAME}_e2e.json"
    fi
    if [ -f "$F/flow/gpu_check.json" ]; then
      bash scripts/gpu_check.sh report "$F/flow/gpu_check.json" --name "${NAME}_flow"
    fi
    if [ -f "$F/flow/wave_diff/wave_diff.json" ]; then
      cp "$F/flow/wave_diff/wave_diff.json" "docs/${NAME}_flow_diff.json"
    fi
    if [ -f "$F/run/gpu_check.json" ]; then
      "$PY" scripts/gpu_kernel_check.py "$F/run/gpu_check.json" --launches --block-sim \
        $(for f in "$BUILD"/schedules/*.json; do b="${f##*/}"; b="${b%.json}"; echo "--schedule ${b%%.*}:${b#*.}=$f"; done) \
        --out "docs/${NAME}_kernels" || true
    fi
    ;;
  *)
    echo "usage: scripts/gpu_experiments.sh build | carry | run | finish FILES_AT [NAME]" >&2
    exit 2
    ;;
esac
