#!/usr/bin/env bash
# GPU-machine check of the cuda-ce transport (issue 3). Offline; torch 2.11+cu130 preinstalled.
#
#   bash scripts/gpu_check.sh            # log to stdout (and $OUT/gpu_check.log when $OUT is set)
#
# Stages (each under `timeout`; total budget ~8 minutes after the build):
#   build       pip install --no-build-isolation --no-deps -e .
#   driver      hoccl's dlopen'ed driver table, the embedded reduction kernel
#   tests       tests/test_cuda_*.py with 2 and 4 ranks on the one GPU, HOCCL_CE_PATH=p2p and host
#   profile     torch.profiler: no kernel in all_gather/all_to_all/broadcast, only the bounded
#               reduction kernel in all_reduce
#   bandwidth   each path's all_gather vs raw cudaMemcpyAsync of the same bytes (floor 90%)
#   overlap     python -m hoccl_backend.bench --overlap (GEMM TFLOP/s alone / hoccl / SM copy)
#   topoep      the planner on CUDA counts: bitwise equal to the CPU plan with torch's sync-debug
#               mode set to "error"; the quick TopoEP bench (GPU planner time, gpu_bitwise_equal)
# A failing stage is logged and the script goes on; the exit status is the number of failed stages.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LOG="${OUT:+$OUT/gpu_check.log}"
LOG="${LOG:-/tmp/hoccl_gpu_check.log}"
mkdir -p "$(dirname "$LOG")"
: > "$LOG"
FAILED=0
export PYTHONUNBUFFERED=1

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

# stage NAME SECONDS CMD...: runs CMD under timeout, output to the log; never aborts the script.
stage() {
  local name="$1" secs="$2"
  shift 2
  log "=== $name (timeout ${secs}s): $*"
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$secs" "$@" >> "$LOG" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    log "--- $name: PASS ($((SECONDS - start)) s)"
  else
    [ "$rc" -eq 124 ] && log "--- $name: TIMEOUT after ${secs}s" || log "--- $name: FAIL rc=$rc ($((SECONDS - start)) s)"
    FAILED=$((FAILED + 1))
  fi
}

log "hoccl gpu_check on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv 2>&1 || true; } >> "$LOG"
python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' >> "$LOG" 2>&1 || true

export MAX_JOBS="${MAX_JOBS:-16}"
stage build 420 pip install --no-build-isolation --no-deps -e .
stage driver 60 python -c '
import torch
from hoccl_backend import _C, cuda_ext
m = cuda_ext.cuda_module()
print("built_with_cuda", _C.built_with_cuda)
print("driver", m.cuda_driver_status())
print("reduce kernel", m.reduce_kernel_info())
'
REDUCE_AVAILABLE=$(python -c 'import torch; from hoccl_backend import cuda_ext; print(int(cuda_ext.cuda_module().reduce_kernel_info()["available"]))' 2>/dev/null || echo 0)
log "GPU reduction kernel embedded: $REDUCE_AVAILABLE (0: setup.py lacks the embed step or nvcc was absent; reductions use the host)"

stage "tests cpu-side" 60 python -m pytest -q -rs tests/test_cuda_build.py
for path in p2p host; do
  stage "tests path=$path worlds=2,4" 120 env HOCCL_CE_PATH=$path HOCCL_TEST_WORLDS=2,4 \
    python -m pytest -q -rs tests/test_cuda_ce.py tests/test_cuda_collectives.py
done

stage "profile (zero SM) path=host" 45 env HOCCL_CE_PATH=host HOCCL_REDUCE_CTAS=4 python scripts/gpu_checks.py profile --world 2
stage "profile (zero SM) path=p2p" 45 env HOCCL_CE_PATH=p2p HOCCL_REDUCE_CTAS=4 python scripts/gpu_checks.py profile --world 2
stage "bandwidth path=host" 45 env HOCCL_CE_PATH=host python scripts/gpu_checks.py bandwidth --world 2 --mbytes 256
stage "bandwidth path=p2p" 45 env HOCCL_CE_PATH=p2p python scripts/gpu_checks.py bandwidth --world 2 --mbytes 256

# The core's bench.py dispatches --overlap to bench_overlap.main; call it directly if it does not yet.
if python -c 'import sys, hoccl_backend.bench as b; sys.exit(0 if "overlap" in open(b.__file__).read() else 1)' 2>/dev/null; then
  OVERLAP=(python -m hoccl_backend.bench --overlap)
else
  OVERLAP=(python -m hoccl_backend.bench_overlap)
fi
stage "overlap benchmark" 120 "${OVERLAP[@]}" --world 2 --gemm 8192 --iters 40 --msg-mb 32 \
  ${OUT:+--json "$OUT/overlap.json"}

stage "topoep gpu plan = cpu plan, no host sync" 120 python -m pytest -q -rs tests/test_topoep_planner.py -k gpu
stage "topoep bench (gpu planner time)" 150 python -m topoep.bench --quick ${OUT:+--json "$OUT/topoep_gpu.json"}

log "summary: $FAILED stage(s) failed; full log: $LOG"
grep -E '^\[.*\] --- |PASS|FAIL|TFLOP|ratio' "$LOG" | tail -60 || true
exit "$FAILED"
