#!/usr/bin/env bash
# GPU-machine check of the cuda-ce transport, in two device commands that together fit the device
# time a task gets (15 min, the machine's start included), leaving room to rerun what failed:
#
#   bash scripts/gpu_check.sh --stamp   # HERE, before sending: records the commit in
#                                       #   gpu_check_commit.txt at the top (the copy sent has no .git)
#   bash scripts/gpu_check.sh 1         # <= 450 s with the machine's start: build, machine and
#                                       #   driver, probe, sm_free, cpu-side checks, host-path
#                                       #   primitives (world 2)
#   bash scripts/gpu_check.sh 2         # <= 270 s, right after (warm; builds first if the machine
#                                       #   came back bare or the tree changed): host-path collectives, p2p path,
#                                       #   multi-host CUDA, zero-kernel profile, bandwidth vs
#                                       #   raw copies, overlap benchmark
#   bash scripts/gpu_check.sh --plan 1|2      # the stages and their limits; runs nothing
#   bash scripts/gpu_check.sh --dry-run 1|2   # no build; runs up to the first CUDA call and stops
#
# Every stage runs under `timeout -s INT --kill-after=$KILL_AFTER_S` (pytest still prints its
# summary) and gets min(its limit, what is left of the call's budget), so a call can never run
# past its budget whatever hangs. The log names the commit, nproc, driver, kernel, torch and
# each stage's elapsed time; checks that spawn ranks print each verdict as it happens, so a hang
# still leaves the lines before it. Output: $OUT/gpu_check_<call>.log (+ sm_free.json or
# overlap.json); without $OUT, /tmp. Exit status: the number of failed stages.
set -uo pipefail

# The device machine's start, counted against call 1: it is part of the task's device time.
STARTUP_S=60
KILL_AFTER_S=2
CALL1_BUDGET_S=450   # start-up + every stage's limit and kill-after
CALL2_BUDGET_S=270   # warm machine; a bare one pays its start and the build out of this too
BUILD_S=200

MODE=run
case "${1:-}" in
  --plan) MODE=plan; shift ;;
  --dry-run) MODE=dry; shift ;;
  --stamp) MODE=stamp ;;
esac
CALL="${1:-}"
CALL="${CALL#call}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STAMP="$ROOT/gpu_check_commit.txt"

if [ "$MODE" = stamp ]; then
  { git rev-parse HEAD && echo "uncommitted changes: $(git status --porcelain --untracked-files=no | wc -l) file(s)"
    date -u +%Y-%m-%dT%H:%M:%SZ; } > "$STAMP" && cat "$STAMP"
  exit $?
fi
case "$CALL" in 1|2) ;; *) echo "usage: $0 [--plan|--dry-run] 1|2   or   $0 --stamp" >&2; exit 64 ;; esac

DIR="${OUT:-/tmp}"
LOG="$DIR/gpu_check_$CALL.log"
if [ "$MODE" = plan ]; then LOG=/dev/null; else mkdir -p "$DIR"; : > "$LOG"; fi
FAILED=0
T0=$SECONDS
if [ "$CALL" = 1 ]; then BUDGET=$((CALL1_BUDGET_S - STARTUP_S)); else BUDGET=$CALL2_BUDGET_S; fi
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HOCCL_TEST_WORLDS=2

log() { echo "[$(date +%H:%M:%S) +$((SECONDS - T0))s] $*" | tee -a "$LOG"; }

# stage NAME SECONDS CMD...: CMD under timeout, output to the log; returns CMD's status. The
# limit shrinks to what the call's budget has left (minus the kill-after grace); a stage with
# under 5 s left is not started and counts as failed. HOCCL_STAGE_LIMIT_S tells CMD its limit.
stage() {
  local name="$1" secs="$2" start=$SECONDS rc=0
  shift 2
  if [ "$MODE" = plan ]; then echo "stage $secs $KILL_AFTER_S $name"; return 0; fi
  local left=$((BUDGET - (SECONDS - T0) - KILL_AFTER_S))
  [ "$left" -lt "$secs" ] && secs=$left
  if [ "$secs" -lt 5 ]; then
    log "--- $name: NOT RUN (the call's ${BUDGET}s budget is spent)"
    FAILED=$((FAILED + 1))
    return 1
  fi
  log "=== $name (limit ${secs}s): $*"
  HOCCL_STAGE_LIMIT_S="$secs" timeout -s INT --kill-after="$KILL_AFTER_S" "$secs" "$@" >> "$LOG" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    log "--- $name: PASS ($((SECONDS - start)) s)"
  else
    [ "$rc" -eq 124 ] && log "--- $name: TIMEOUT after ${secs}s" || log "--- $name: FAIL rc=$rc ($((SECONDS - start)) s)"
    FAILED=$((FAILED + 1))
  fi
  return "$rc"
}

finish() {
  if [ "$MODE" = plan ]; then exit 0; fi
  log "summary (call $CALL, $MODE): $FAILED stage(s) failed in $((SECONDS - T0)) s; log: $LOG"
  grep -E '^\[.*\] --- |^rank .*: (OK|FAIL|PASS)|^(PASS|FAIL) |Error: hoccl|PASSED|FAILED|SKIPPED|TFLOP|ratio [0-9]' "$LOG" | tail -80
  exit "$FAILED"
}

# pytest_stage NAME SECONDS PER_TEST ARGS...: every test has its own pytest-timeout; -v prints
# each verdict as the test ends.
pytest_stage() {
  local name="$1" secs="$2" per="$3" timeout_arg
  shift 3
  # Without pytest-timeout only the stage's limit applies (the machine stage logs its version).
  timeout_arg="--timeout=$per"
  python3 -c 'import pytest_timeout' 2> /dev/null || timeout_arg="-q"
  stage "$name" "$secs" python3 -m pytest -v -rs -p no:cacheprovider "$timeout_arg" "$@"
}

build() {
  local nvcc
  if [ "$MODE" = plan ]; then stage build "$BUILD_S" true; return; fi
  nvcc="$(command -v nvcc || true)"
  [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
  if [ -z "$nvcc" ]; then log "nvcc not found: cannot build the CUDA pieces"; FAILED=$((FAILED + 1)); finish; fi
  export CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$nvcc")")")"
  stage "build ($(find cuda -name '*.cpp' | wc -l) sources, 2 kernels)" "$BUILD_S" \
    env MAX_JOBS="${MAX_JOBS:-$(nproc)}" python3 setup.py -q build_ext --inplace || finish
  sources_hash > build/gpu_check_sources.sha1
}

# What the extension is built from: a warm machine keeps the last build, which may predate the
# tree just sent.
sources_hash() { find cuda setup.py scripts/embed_kernel.py -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.py' \) | sort | xargs sha1sum | sha1sum; }

built_from_this_tree() {
  ls hoccl_backend/_C*.so > /dev/null 2>&1 && [ -f build/gpu_check_sources.sha1 ] &&
    [ "$(sources_hash)" = "$(cat build/gpu_check_sources.sha1)" ]
}

# The import, CUDA compiled in, and both embedded kernels: an nvcc failure at build time leaves a
# "CUDA" build without them, on which GPU reductions silently fall back to the host.
gate() {
  stage "extension has CUDA and both kernels" "$1" python3 -c '
import torch
from hoccl_backend import _C, cuda_ext
print("torch", torch.__version__, "cuda", torch.version.cuda)
assert _C.built_with_cuda, "hoccl_backend._C was built without cuda.h: set CUDA_HOME and rebuild"
info = cuda_ext.cuda_module().reduce_kernel_info()
print("kernels", info)
assert info["available"], "no reduction kernel embedded: nvcc failed at build time (see the build stage)"
assert info["spin_image_bytes"], "no spin kernel embedded: nvcc failed at build time (see the build stage)"
' || finish
}

driver() {
  stage "driver (first CUDA call)" "$1" python3 -c '
import torch
from hoccl_backend import cuda_ext
print(cuda_ext.cuda_module().cuda_driver_status())
' || finish
}

if [ "$MODE" = plan ]; then
  [ "$CALL" = 1 ] && echo "budget $CALL1_BUDGET_S startup $STARTUP_S" || echo "budget $CALL2_BUDGET_S startup 0"
fi
log "hoccl gpu_check call $CALL ($MODE): ${BUDGET}s for its stages$([ "$CALL" = 1 ] && echo " + ${STARTUP_S}s for the machine's start")"
stage "machine" 10 python3 scripts/gpu_checks.py machine
# CUDA IPC cannot export expandable segments (VMM memory), so every p2p op would fail: say so,
# then run without it so the other results stay true.
if [ "$MODE" != plan ] && [[ "${PYTORCH_CUDA_ALLOC_CONF:-}${PYTORCH_ALLOC_CONF:-}" == *expandable_segments:[Tt]rue* ]]; then
  log "--- environment: FAIL expandable_segments is on (PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-}," \
      "PYTORCH_ALLOC_CONF=${PYTORCH_ALLOC_CONF:-}): hoccl's p2p path cannot IPC-export such memory; unset for this run"
  FAILED=$((FAILED + 1))
  unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF
fi

if [ "$MODE" = dry ]; then
  log "dry run: no build (the extension built in this tree is used)"
elif [ "$CALL" = 1 ] && [ -z "${HOCCL_GPU_CHECK_SKIP_BUILD:-}" ]; then
  build
elif [ "$CALL" = 2 ] && [ "$MODE" = run ] && ! built_from_this_tree; then
  log "the extension is missing or older than this tree (a bare machine, or a change since call 1): building it"
  build
fi
[ "$MODE" = plan ] && [ "$CALL" = 2 ] && echo "conditional $BUILD_S $KILL_AFTER_S build (only on a bare machine or a changed tree)"
if [ "$CALL" = 1 ]; then gate 15; driver 15; else gate 10; driver 10; fi
if [ "$MODE" = dry ]; then log "dry run: stopping after the first CUDA call"; finish; fi

if [ "$CALL" = 1 ]; then
  stage "probe (register, stream_flag, ipc_copy)" 25 python3 scripts/gpu_checks.py probe --deadline 5
  # Worst case inside, every wait timing out: warm-up 5.5 s, 3 s to fill the SMs, 5 copies x 0.5 s,
  # a 5 s drain, plus the start (~16 s and the import); normally a few seconds.
  stage "sm_free (copies while a kernel fills every SM)" 20 python3 scripts/gpu_checks.py sm_free \
    --start-deadline 3 --copy-deadline 0.5 --json "$DIR/sm_free.json"
  # Only the in-process checks: CI runs the whole file, and its subprocess-heavy tests do not fit.
  pytest_stage "cpu-side checks" 15 12 tests/test_cuda_build.py -k "compiled_in or path_choice or names_libcuda"
  HOCCL_CE_PATH=host pytest_stage "host path: primitives" 70 60 tests/test_cuda_ce.py
else
  HOCCL_CE_PATH=host pytest_stage "host path: collectives" 50 45 tests/test_cuda_collectives.py
  # The reduction kernel is path-independent and ran in call 1.
  HOCCL_CE_PATH=p2p pytest_stage "p2p path (direct-read plans): primitives + collectives" 70 45 \
    tests/test_cuda_ce.py tests/test_cuda_collectives.py -k "not reduce_kernel and not graph_capture"
  # One spawn of 4 ranks serves the whole file (a module fixture): start-up dominates.
  pytest_stage "multi-host CUDA via host staging" 35 30 tests/test_cuda_multihost.py
  HOCCL_CE_PATH=host stage "profile path=host" 20 python3 scripts/gpu_checks.py profile --world 2
  stage "bandwidth path=host,p2p" 25 python3 scripts/gpu_checks.py bandwidth --world 2 --mbytes 64 --paths host,p2p
  # --sm-copy add: a same-device Tensor.copy_ may itself run on a copy engine (sm_free's d2d row of
  # call 1 says), which would make the "SM" baseline no SM baseline at all.
  stage "overlap benchmark" 20 python3 -m hoccl_backend.bench_overlap --world 2 --gemm 8192 --iters 10 \
    --msg-mb 32 --repeats 1 --sm-copy add --json "$DIR/overlap.json"
fi
finish
