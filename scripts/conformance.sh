#!/usr/bin/env bash
# Runs torch's distributed_test.py suite on hoccl and on gloo (2 ranks, CPU) and writes
# out/conformance-<backend>.xml plus a per-test comparison (out/conformance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out
for backend in ${BACKENDS:-hoccl gloo}; do
  BACKEND=$backend WORLD_SIZE=2 timeout ${CONFORMANCE_TIMEOUT:-2400} python3 -m pytest -q -p no:cacheprovider \
    tests/conformance/torch_suite.py --junitxml=out/conformance-$backend.xml "$@" > out/conformance-$backend.log 2>&1 || true
  tail -n 3 out/conformance-$backend.log
done
python3 scripts/compare_conformance.py out/conformance-hoccl.xml out/conformance-gloo.xml > out/conformance.md
head -n 20 out/conformance.md
