"""torch's own c10d conformance suite (distributed_test.py) against a chosen backend.

    BACKEND=hoccl WORLD_SIZE=2 python -m pytest tests/conformance/torch_suite.py -q
    BACKEND=gloo  WORLD_SIZE=2 python -m pytest tests/conformance/torch_suite.py -q   # comparison

    HOCCL_AS_GLOO=1 BACKEND=gloo WORLD_SIZE=2 python -m pytest tests/conformance/torch_suite.py -k ...
        # tests the suite gates on the name "gloo", run on hoccl process groups

Not part of the default suite (a full 2-rank run takes ~10 minutes per backend on 2 cores);
scripts/conformance.sh runs both backends and writes the per-test comparison.
"""
import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "hoccl")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    tmp = tempfile.mkdtemp(prefix="hoccl-conformance-")
    for sub in ("barrier", "test_dir", "init_dir"):
        os.makedirs(os.path.join(tmp, sub), exist_ok=True)
    os.environ["TEMP_DIR"] = tmp

import hoccl_backend  # noqa: E402,F401  (registers "hoccl" in every spawned rank too)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ.get("HOCCL_AS_GLOO") == "1":
    # Run the tests the suite gates on the name "gloo" against hoccl: the suite sees
    # BACKEND=gloo, every process group it creates is a hoccl one.
    import torch.distributed as _dist

    _init = _dist.init_process_group

    def _init_as_hoccl(*args, **kwargs):
        if kwargs.get("backend") == "gloo":
            kwargs["backend"] = "hoccl"
        return _init(*args, **kwargs)

    _dist.init_process_group = _init_as_hoccl
    # torch's dist.monitored_barrier checks the backend's name before calling the backend;
    # hoccl_backend.monitored_barrier is the same call without that gate.
    _dist.monitored_barrier = hoccl_backend.monitored_barrier
    os.environ["BACKEND"] = "gloo"

if os.environ["BACKEND"] == "hoccl":
    # Unlock the tests gated on backend features hoccl implements on CPU.
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("hoccl")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    sys.exit(run_tests())
