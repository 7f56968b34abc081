#!/usr/bin/env bash
# Runs torch's distributed_test.py suite on hoccl and on gloo (2 ranks, CPU) and writes
# out/conformance-<backend>.xml plus a per-test comparison (out/conformance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
for backend in ${BACKENDS:-hoccl gloo}; do
  # GPU-only tests would only spawn ranks to skip themselves on a CPU machine.
  BACKEND=$backend WORLD_SIZE=2 timeout ${CONFORMANCE_TIMEOUT:-3600} python3 -m pytest -q -p no:cacheprovider \
    tests/conformance/torch_suite.py -k "not cuda and not nccl and not gpu and not cudagraph" \
    --junitxml=out/conformance-$backend.xml "$@" > out/conformance-$backend.log 2>&1 || true
  tail -n 3 out/conformance-$backend.log
done
python3 scripts/compare_conformance.py out/conformance-hoccl.xml out/conformance-gloo.xml > out/conformance.md
head -n 20 out/conformance.md
