#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main demo: DDP training on 4 CPU ranks over hoccl.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m torch.distributed.run --nproc_per_node=4 examples/ddp_train.py --backend hoccl "$@"
