"""The sm_free check (scripts/gpu_checks.py sm_free, cuda_module().sm_check) on the CPU driver model.

On a GPU the check fills every SM with hoccl_spin_until_flag and sees which of the transport's
copies finish while the SMs are held. The model gives its kernels SM slots (tests/cuda_model/
sms.cpp) and runs copies without them, except that HOCCL_MODEL_D2D_ON_SMS=1 makes same-device
D2D copies kernels (one block), a behaviour the driver documentation allows. So these tests show
the check's logic both ways: copies that need no SM are reported as completing while the SMs are
full, and copies that need one are caught, with a non-zero exit when the chosen path uses them.
What they cannot show: which engine a real driver picks (only the GPU run of the check can).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cuda_test_utils import build_cuda_model, model_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_checks.py")
DIRECTIONS = ["d2h", "h2d", "d2d", "d2d_memcpy", "d2d_batch"]

pytestmark = pytest.mark.skipif(
    not __import__("hoccl_backend", fromlist=["_C"])._C.built_with_cuda,
    reason="hoccl was built without cuda.h, so the copy-engine pieces are not compiled in")


@pytest.fixture(scope="module")
def model():
    return build_cuda_model()


def _sm_free(tmp_path, lib, path=None, **model_knobs):
    """Runs `gpu_checks.py sm_free` on the model; returns (exit status, report, stdout)."""
    env = dict(os.environ, PYTHONPATH=ROOT, **model_env(lib, HOCCL_MODEL_MAX_DELAY_US=50, **model_knobs))
    env.pop("HOCCL_CE_PATH", None)
    if path:
        env["HOCCL_CE_PATH"] = path
    out = tmp_path / "sm_free.json"
    r = subprocess.run([sys.executable, SCRIPT, "sm_free", "--copy-mbytes", "1", "--start-deadline", "5",
                        "--copy-deadline", "0.3", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.exists(), r.stdout + r.stderr
    return r.returncode, json.loads(out.read_text()), r.stdout + r.stderr


def _rows(rep):
    return {row["direction"]: row for row in rep["rows"]}


def test_the_spinner_fills_every_sm_of_the_model(tmp_path, model):
    rc, rep, out = _sm_free(tmp_path, model)
    assert rep["spin_kernel_bytes"] > 0, out
    # 132 SMs x 2048 thread slots: 2 blocks of 1024 per SM, all resident at once before any copy.
    assert (rep["sms"], rep["threads_per_block"], rep["blocks_per_sm"]) == (132, 1024, 2), out
    assert rep["occupancy_source"] == "cuOccupancyMaxActiveBlocksPerMultiprocessor", out
    assert rep["blocks"] == rep["blocks_resident"] == 264 and rep["sms_full"], out
    assert rep["blocks_timed_out"] == 0 and rep["errors"] == [], out


def test_copy_engine_copies_complete_while_the_sms_are_full(tmp_path, model):
    rc, rep, out = _sm_free(tmp_path, model)
    rows = _rows(rep)
    assert sorted(rows) == sorted(DIRECTIONS), out
    for d in DIRECTIONS:
        assert rows[d]["completed_while_sms_full"] and rows[d]["error"] == "", (d, out)
        assert rows[d]["bytes"] == 1 << 20 and rows[d]["microseconds"] >= 0, (d, out)
    assert rows["d2h"]["call"] == "cuMemcpyDtoHAsync" and rows["h2d"]["call"] == "cuMemcpyHtoDAsync", out
    assert rows["d2d"]["call"] == "cuMemcpyAsync", out  # driver 13.0: the p2p path sends no hint
    assert rows["d2d_batch"]["call"] == "cuMemcpyBatchAsync", out
    assert rc == 0 and rep["paths"] == ["host"] and rep["needed"] == ["d2h", "h2d"], out
    assert "PASS sm_free" in out, out


@pytest.mark.parametrize("driver", [13000, 13010])
def test_d2d_copies_that_need_sms_are_caught(tmp_path, model, driver):
    """Same-device D2D as a kernel: it cannot start while the spinner holds every SM, so the check
    sees it finish only after the release; with the hint (13.1) too, since a hint may be ignored.
    Forced p2p uses that copy, so the check fails."""
    rc, rep, out = _sm_free(tmp_path, model, path="p2p", HOCCL_MODEL_D2D_ON_SMS=1,
                            HOCCL_MODEL_DRIVER_VERSION=driver)
    rows = _rows(rep)
    for d in ("d2d", "d2d_memcpy", "d2d_batch"):
        assert rows[d]["completed"] and not rows[d]["completed_while_sms_full"], (d, out)
        assert rows[d]["error"] == "", (d, out)
    for d in ("d2h", "h2d"):
        assert rows[d]["completed_while_sms_full"], (d, out)
    assert rows["d2d"]["call"] == ("cuMemcpyBatchAsync" if driver >= 13010 else "cuMemcpyAsync"), out
    assert rep["sms_full"] and rep["errors"] == [], out
    assert rc == 1 and rep["needed"] == ["d2d"], out
    assert "FAIL sm_free" in out and "needed SMs or failed: ['d2d']" in out, out


@pytest.mark.parametrize("driver", [13000, 13010])
def test_auto_keeps_ranks_on_one_gpu_off_the_d2d_copy(tmp_path, model, driver):
    """The same bad driver with HOCCL_CE_PATH=auto: auto takes the host path on one GPU whatever
    the driver version, so the check passes although D2D needed SMs."""
    rc, rep, out = _sm_free(tmp_path, model, HOCCL_MODEL_D2D_ON_SMS=1, HOCCL_MODEL_DRIVER_VERSION=driver)
    assert not _rows(rep)["d2d"]["completed_while_sms_full"], out
    assert rc == 0 and rep["paths"] == ["host"], out


def test_auto_with_a_peer_gpu_also_needs_the_same_device_copy(tmp_path, model):
    """Two model GPUs with peer access: auto takes p2p to the other GPU, whose collectives also copy
    the own block device to device on one GPU, so that copy must be free of SMs too."""
    rc, rep, out = _sm_free(tmp_path, model, HOCCL_MODEL_D2D_ON_SMS=1, HOCCL_MODEL_DEVICES=2)
    assert rep["peer_access"] and rep["paths"] == ["host", "p2p"], out
    assert rc == 1 and rep["needed"] == ["d2d", "d2h", "h2d"], out


def test_without_a_driver_the_check_fails_at_once(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT, HOCCL_LIBCUDA="/nonexistent/libcuda.so.1")
    r = subprocess.run([sys.executable, SCRIPT, "sm_free"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=ROOT)
    assert r.returncode == 3 and "FAIL driver" in r.stdout and "/nonexistent/libcuda.so.1" in r.stdout, r.stdout


def test_the_spinners_occupancy_comes_from_its_registers(tmp_path, model):
    """At 64 registers per thread one block of 1024 takes all of an SM's registers: the occupancy
    answer is 1 block per SM, half the thread slots stay free, and the check says it could not
    fill the SMs (it cannot prove a copy needed none), never a pass. nvcc gives the real spin
    kernel 15 registers on sm_90, so on a GPU thread slots decide."""
    rc, rep, out = _sm_free(tmp_path, model, HOCCL_MODEL_KERNEL_REGS=64)
    assert (rep["threads_per_block"], rep["blocks_per_sm"], rep["blocks"]) == (1024, 1, 132), out
    assert rep["blocks_resident"] == 132 and not rep["sms_full"], out
    assert rc == 1 and any("SMs not full" in e for e in rep["errors"]), out
