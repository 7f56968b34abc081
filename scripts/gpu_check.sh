#!/usr/bin/env bash
# GPU-machine check of the cuda-ce transport, in two device commands that each fit one call:
#
#   bash scripts/gpu_check.sh 1   # <= ~570 s of stage limits: build, driver + probe, sm_free (copies while a
#                                 #   kernel fills every SM), host-path CUDA tests (world 2)
#   bash scripts/gpu_check.sh 2   # <= ~300 s, right after (warm): p2p-path tests (its direct-read plans
#                                 #   over CUDA IPC), multi-host CUDA tests (2
#                                 #   HOCCL_HOSTNAME hosts on the one GPU), zero-kernel profile,
#                                 #   bandwidth vs raw copies, overlap benchmark
#
# Call 1 builds in place with CUDA_HOME taken from nvcc and stops at once if the extension lacks
# CUDA; HOCCL_GPU_CHECK_SKIP_BUILD=1 skips the build (call 2 never builds). Both calls stop at the
# first failure of the driver stage (nothing after it can work). Each pytest stage gives every
# test its own pytest-timeout and is itself under `timeout -s INT`, so a stuck stage still prints
# pytest's failure summary. Output: $OUT/gpu_check_<call>.log (+ overlap JSON); without $OUT, /tmp.
# Exit status: the number of failed stages.
set -uo pipefail

CALL="${1:-}"
case "$CALL" in 1|2) ;; *) echo "usage: $0 1|2" >&2; exit 64 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DIR="${OUT:-/tmp}"
mkdir -p "$DIR"
LOG="$DIR/gpu_check_$CALL.log"
: > "$LOG"
FAILED=0
export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HOCCL_TEST_WORLDS=2

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# stage NAME SECONDS CMD...: runs CMD under timeout (SIGINT first: pytest still reports), output
# to the log; returns CMD's status.
stage() {
  local name="$1" secs="$2" start=$SECONDS rc=0
  shift 2
  log "=== $name (limit ${secs}s): $*"
  timeout -s INT --kill-after=10 "$secs" "$@" >> "$LOG" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    log "--- $name: PASS ($((SECONDS - start)) s)"
  else
    [ "$rc" -eq 124 ] && log "--- $name: TIMEOUT after ${secs}s" || log "--- $name: FAIL rc=$rc ($((SECONDS - start)) s)"
    FAILED=$((FAILED + 1))
  fi
  return "$rc"
}

finish() {
  log "summary (call $CALL): $FAILED stage(s) failed; log: $LOG"
  grep -E '^\[.*\] --- |^rank .*: (OK|FAIL)|Error: hoccl|PASSED|FAILED|TFLOP|ratio' "$LOG" | tail -80
  exit "$FAILED"
}

# pytest STAGE SECONDS PER_TEST FILES... [-- extra args]
pytest_stage() {
  local name="$1" secs="$2" per="$3"
  shift 3
  stage "$name" "$secs" python3 -m pytest -v -rs -p no:cacheprovider --timeout="$per" "$@"
}

log "hoccl gpu_check call $CALL on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ), kernel $(uname -r), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv 2>&1 || true; } >> "$LOG"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' >> "$LOG" 2>&1 || true

if [ "$CALL" = 1 ] && [ -z "${HOCCL_GPU_CHECK_SKIP_BUILD:-}" ]; then
  NVCC="$(command -v nvcc || true)"
  [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
  if [ -z "$NVCC" ]; then log "nvcc not found: cannot build the CUDA pieces"; FAILED=1; finish; fi
  export CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
  stage build 200 env MAX_JOBS="${MAX_JOBS:-16}" python3 setup.py -q build_ext --inplace || finish
fi
stage "extension has CUDA" 20 python3 -c '
import torch
from hoccl_backend import _C, cuda_ext
assert _C.built_with_cuda, "hoccl_backend._C was built without cuda.h: set CUDA_HOME and rebuild"
print("reduce kernel", cuda_ext.cuda_module().reduce_kernel_info())
' || finish
stage "driver (first CUDA call)" 20 python3 -c '
import torch
from hoccl_backend import cuda_ext
print(cuda_ext.cuda_module().cuda_driver_status())
' || finish

if [ "$CALL" = 1 ]; then
  stage "probe (register, stream_flag, ipc_copy)" 50 python3 scripts/gpu_checks.py probe --deadline 10
  # Worst case inside, every wait timing out: warm-up 5.5 s, 3 s to fill the SMs, 5 copies x 0.5 s,
  # a 5 s drain, plus the torch import; normally a few seconds.
  stage "sm_free (copies while a kernel fills every SM)" 25 python3 scripts/gpu_checks.py sm_free \
    --start-deadline 3 --copy-deadline 0.5 --json "$DIR/sm_free.json"
  pytest_stage "cpu-side checks" 40 30 tests/test_cuda_build.py
  HOCCL_CE_PATH=host pytest_stage "host path: primitives" 115 60 tests/test_cuda_ce.py
  HOCCL_CE_PATH=host pytest_stage "host path: collectives" 100 60 tests/test_cuda_collectives.py
else
  HOCCL_CE_PATH=p2p pytest_stage "p2p path (direct-read plans): primitives + collectives" 110 60 tests/test_cuda_ce.py \
    tests/test_cuda_collectives.py
  # One spawn of 4 ranks serves the whole file (a module fixture): startup dominates.
  pytest_stage "multi-host CUDA via host staging" 20 20 tests/test_cuda_multihost.py
  HOCCL_CE_PATH=host stage "profile path=host" 40 python3 scripts/gpu_checks.py profile --world 2
  HOCCL_CE_PATH=host stage "bandwidth path=host" 40 python3 scripts/gpu_checks.py bandwidth --world 2 --mbytes 256
  HOCCL_CE_PATH=p2p stage "bandwidth path=p2p" 40 python3 scripts/gpu_checks.py bandwidth --world 2 --mbytes 256
  stage "overlap benchmark" 50 python3 -m hoccl_backend.bench_overlap --world 2 --gemm 8192 --iters 20 \
    --msg-mb 32 --repeats 2 --json "$DIR/overlap.json"
fi
finish
