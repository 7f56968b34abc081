#!/usr/bin/env bash
# Installs what is missing for hoccl on a fresh machine, then builds the C++ extension against
# the torch that is installed. Idempotent: a second run does only the (incremental) build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# pip's warning about running as root is noise in CI logs; silencing it here, instead of
# filtering pip's output, keeps pip's exit status (a failed build must fail this script: a
# stale extension from an earlier build would otherwise pass the import check below).
export PIP_ROOT_USER_ACTION=ignore
# The checks below import torch; with a stale hoccl install (its directory removed) torch's
# autoload of backends would make every one of them fail. The last line checks autoload again.
export TORCH_DEVICE_BACKEND_AUTOLOAD=0

need() { ! $PY -c "import $1" >/dev/null 2>&1; }
if need torch; then
  # The CPU wheel of torch 2.13.0 (a bare `pip install torch` would pull a multi-GB CUDA build).
  $PY -m pip install -q "torch==2.13.0"
fi
missing=()
for mod in ninja numpy scipy networkx pytest; do need "$mod" && missing+=("$mod"); done
if [ ${#missing[@]} -gt 0 ]; then $PY -m pip install -q "${missing[@]}"; fi
if need expecttest; then $PY -m pip install -q expecttest || true; fi   # torch's conformance suite
if need matplotlib; then $PY -m pip install -q matplotlib || true; fi   # --plot only
# The MoE models TopoEP must wrap, and the trainers that must accept the backend (tests build
# tiny models from configs; nothing is downloaded at run time)
if need transformers || need accelerate; then $PY -m pip install -q "transformers>=5" accelerate; fi
# DeepSpeed's MoE layer (TopoEP's adapter tests) and its shared-memory all_reduce (bench --vs
# deepspeed): optional, as DeepSpeed documents its CPU install; its shm op is JIT-built on first
# use, so build it here rather than inside a test (about 2 minutes, once per machine).
if need deepspeed; then
  DS_BUILD_OPS=0 $PY -m pip install -q --no-build-isolation deepspeed \
    || echo "install.sh: deepspeed did not install; its tests will skip and say why" >&2
fi
if ! need deepspeed; then
  DS_ACCELERATOR=cpu $PY -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B; B().load(verbose=False)" >/dev/null \
    || echo "install.sh: DeepSpeed's shared-memory op did not build; bench --vs deepspeed needs it" >&2
fi
# Without build isolation the build uses this environment's setuptools: it needs one with
# editable wheels (64+; Python 3.12+ venvs have none at all), and before 70.1 setuptools takes
# bdist_wheel from the separate `wheel` package (Python 3.11's venvs ship 65.5 without it).
if ! $PY -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 64)" >/dev/null 2>&1; then
  $PY -m pip install -q "setuptools>=64"
fi
if ! $PY -c "import setuptools.command.bdist_wheel" >/dev/null 2>&1 && need wheel; then
  $PY -m pip install -q wheel
fi
# Build against the installed torch (no build isolation: the extension must match its ABI).
MAX_JOBS=${MAX_JOBS:-2} $PY -m pip install -q --no-build-isolation --no-deps -e .
TORCH_DEVICE_BACKEND_AUTOLOAD=1 $PY -c "import torch, hoccl_backend; hoccl_backend.load_extension()"
