"""CPU-only checks of the cuda-ce pieces; they run on every machine.

The CUDA code must be compiled into the extension whenever cuda.h existed at build time, and the
run-time driver loader must fail with a message naming what is missing (the library, or the
entry points) instead of crashing or importing libcuda at load time.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cuda_header_present() -> bool:
    roots = [os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr"]
    return any(r and os.path.exists(os.path.join(r, "include", "cuda.h")) for r in roots)


def _libcuda_installed() -> bool:
    """Whether the loader finds libcuda.so.1 as hoccl's dlopen would: through the ld.so cache or
    LD_LIBRARY_PATH (a GPU image may mount the driver outside the cache)."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def _run(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter: the driver table is loaded once per process."""
    env = dict(os.environ)
    env.pop("HOCCL_LIBCUDA", None)
    env.update(env_extra or {})
    prelude = "import torch\nfrom hoccl_backend import cuda_ext\nm = cuda_ext.cuda_module()\n"
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)


def test_cuda_code_compiled_in():
    if not _cuda_header_present():
        pytest.skip("cuda.h is not installed here, so the CUDA pieces are (correctly) not compiled in")
    import torch  # noqa: F401
    from hoccl_backend import _C, cuda_ext

    assert _C.built_with_cuda is True
    m = cuda_ext.cuda_module()
    for name in ("cuda_driver_status", "cuda_driver_error", "ce_choose_path", "reduce_kernel_info",
                 "_ce_reduce", "_CeGroup"):
        assert hasattr(m, name), name


def test_driver_loader_names_libcuda_when_absent():
    if _libcuda_installed():
        pytest.skip("libcuda.so.1 is installed on this machine")
    r = _run("""
        assert 'libcuda.so.1' in m.cuda_driver_error()
        try:
            m.cuda_driver_status()
        except RuntimeError as e:
            print('RAISED', e)
    """)
    assert r.returncode == 0, r.stderr
    assert "RAISED" in r.stdout and "libcuda.so.1" in r.stdout, r.stdout
    assert "cannot load the CUDA driver library" in r.stdout


def test_driver_loader_names_a_bad_path():
    r = _run("print(m.cuda_driver_error())", {"HOCCL_LIBCUDA": "/nonexistent/libcuda-test.so"})
    assert r.returncode == 0, r.stderr
    assert "/nonexistent/libcuda-test.so" in r.stdout


def test_driver_loader_names_missing_entry_points(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a fake driver library")
    src = tmp_path / "fake_cuda.c"
    src.write_text("int cuDriverGetVersion(int* v) { *v = 13000; return 0; }\n"
                   "int cuInit(unsigned f) { return 0; }\n")
    lib = tmp_path / "libcuda_fake.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    r = _run("print(m.cuda_driver_error())", {"HOCCL_LIBCUDA": str(lib)})
    assert r.returncode == 0, r.stderr
    msg = r.stdout
    assert "lacks required entry point(s)" in msg and str(lib) in msg, msg
    for name in ("cuStreamWaitValue32", "cuIpcOpenMemHandle", "cuLaunchKernel"):
        assert name in msg, msg
    assert "cuInit" not in msg.split("entry point(s):")[1]


def test_driver_too_old_is_reported(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build a fake driver library")
    src = tmp_path / "old_cuda.c"
    src.write_text("int cuDriverGetVersion(int* v) { *v = 11080; return 0; }\n")
    lib = tmp_path / "libcuda_old.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, timeout=60)
    r = _run("print(m.cuda_driver_error())", {"HOCCL_LIBCUDA": str(lib)})
    assert "11080" in r.stdout and "older than" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("mode,same,peer,ver,expected", [
    ("auto", False, True, 13000, "p2p"),    # two GPUs with peer access: one copy-engine D2D
    ("auto", False, False, 13000, "host"),  # no peer access: stage through pinned host memory
    ("auto", True, False, 13000, "host"),   # one GPU: a same-device D2D may run on SMs
    ("auto", True, False, 13010, "host"),   # CUDA 13.1's copy-engine flag is only a hint
    ("", True, False, 13000, "host"),
    ("p2p", True, False, 12080, "p2p"),
    ("host", False, True, 13010, "host"),
])
def test_path_choice(mode, same, peer, ver, expected):
    import torch  # noqa: F401
    from hoccl_backend import cuda_ext

    assert cuda_ext.cuda_module().ce_choose_path(mode, same, peer, ver) == expected


def test_path_mode_is_validated():
    import torch  # noqa: F401
    from hoccl_backend import cuda_ext

    with pytest.raises(ValueError, match="HOCCL_CE_PATH"):
        cuda_ext.cuda_module().ce_choose_path("nvlink", False, True, 13000)


def test_reduce_settings_from_env():
    r = _run("print(m.reduce_kernel_info())", {"HOCCL_REDUCE_CTAS": "7", "HOCCL_REDUCE_ON": "host"})
    assert r.returncode == 0, r.stderr
    assert "'max_ctas': 7" in r.stdout and "'reduce_on': 'host'" in r.stdout
    bad = _run("m.reduce_kernel_info()", {"HOCCL_REDUCE_CTAS": "0"})
    assert bad.returncode != 0 and "HOCCL_REDUCE_CTAS" in bad.stderr


def test_reduce_on_gpu_needs_the_kernel():
    r = _run("""
        import os
        os.environ['HOCCL_REDUCE_ON'] = 'host'
        avail = m.reduce_kernel_info()['available']
        os.environ['HOCCL_REDUCE_ON'] = 'gpu'
        try:
            print('AVAILABLE', avail, m.reduce_kernel_info()['reduce_on'])
        except RuntimeError as e:
            print('AVAILABLE', avail, 'RAISED', e)
    """)
    assert r.returncode == 0, r.stderr
    if "AVAILABLE True" in r.stdout:
        assert "gpu" in r.stdout
    else:
        assert "RAISED" in r.stdout and "HOCCL_REDUCE_ON=host" in r.stdout, r.stdout


GPU_CHECK = os.path.join(ROOT, "scripts", "gpu_check.sh")


def _plan(call: str) -> tuple[int, int, list[tuple[int, int, str]], list[tuple[int, int, str]]]:
    """gpu_check.sh --plan: (budget, start-up, stages, conditional stages) of one call, each stage
    (limit, kill-after grace, name), from the same definitions a real run uses."""
    env = {k: v for k, v in os.environ.items() if k != "HOCCL_GPU_CHECK_SKIP_BUILD"}
    r = subprocess.run(["bash", GPU_CHECK, "--plan", call], capture_output=True, text=True, timeout=20, cwd=ROOT,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    budget = re.search(r"^budget (\d+) startup (\d+)$", r.stdout, re.M)
    stages = [(int(a), int(b), n) for a, b, n in re.findall(r"^stage (\d+) (\d+) (.+)$", r.stdout, re.M)]
    cond = [(int(a), int(b), n) for a, b, n in re.findall(r"^conditional (\d+) (\d+) (.+)$", r.stdout, re.M)]
    return int(budget.group(1)), int(budget.group(2)), stages, cond


def test_gpu_check_stages_fit_the_device_budget():
    """A task's device time is 15 min with the machine's start; the two calls may use 720 s of it
    (call 1 at most 450 s), so a rerun of what failed still fits."""
    b1, start1, s1, c1 = _plan("1")
    b2, start2, s2, c2 = _plan("2")
    total1 = start1 + sum(limit + grace for limit, grace, _ in s1)
    total2 = start2 + sum(limit + grace for limit, grace, _ in s2)
    assert (b1, b2) == (450, 270) and start1 >= 60, (b1, b2, start1)
    assert total1 <= b1 and total2 <= b2 and total1 + total2 <= 720, (total1, total2, s1, s2)
    assert [n for _, _, n in s1][:2] == ["machine", "build"] and not c1, s1
    # Call 2 builds only on a bare machine; then its later stages get what its budget has left.
    assert [n for _, _, n in c2] == ["build (only on a bare machine or a changed tree)"] and c2[0][0] == s1[1][0], c2
    assert all(limit >= 10 for limit, _, _ in s1 + s2), s1 + s2


def test_gpu_check_dry_runs_reach_the_first_cuda_call(tmp_path):
    """Both calls without a driver: each names the commit and machine, skips the build, passes the
    extension gate (or fails it naming the missing kernels), and fails at the first CUDA call
    naming the library, running nothing after it."""
    if not _cuda_header_present():
        pytest.skip("cuda.h is not installed here, so the extension has no CUDA pieces to check")
    import torch  # noqa: F401
    from hoccl_backend import cuda_ext

    kernels = cuda_ext.cuda_module().reduce_kernel_info()["available"]
    env = dict(os.environ, HOCCL_LIBCUDA="/nonexistent/libcuda.so.1", OUT=str(tmp_path), PYTHONPATH=ROOT)
    for call in ("1", "2"):
        r = subprocess.run(["bash", GPU_CHECK, "--dry-run", call], capture_output=True, text=True, timeout=60,
                           env=env, cwd=ROOT)
        log = (tmp_path / f"gpu_check_{call}.log").read_text()
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        assert re.search(r"^commit: [0-9a-f]{40}", log, re.M) and "nproc: " in log, log
        assert "dry run: no build" in log and "=== build" not in log, log
        if not kernels:  # nvcc was absent when this extension was built
            assert "no reduction kernel embedded" in log and "--- extension has CUDA and both kernels: FAIL" in log
            continue
        assert "--- extension has CUDA and both kernels: PASS" in log, log
        assert "--- driver (first CUDA call): FAIL" in log, log
        assert "cannot load the CUDA driver library /nonexistent/libcuda.so.1" in log, log
        assert "=== " not in log.split("driver (first CUDA call): FAIL")[1], log
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check_1.log", "gpu_check_2.log"]


def test_gpu_check_probe_runs_on_the_driver_model():
    """The probe of call 1 against the CPU driver model: every item reports OK, so the probe's own
    logic (registration, cross-process stream flags, IPC copy, deadlines) is exercised in CI."""
    if not _cuda_header_present():
        pytest.skip("cuda.h is not installed here, so the extension has no CUDA pieces to check")
    from cuda_test_utils import build_cuda_model

    env = dict(os.environ, HOCCL_LIBCUDA=build_cuda_model(), PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_checks.py"), "probe", "--deadline", "10"],
                       capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        for item in ("register", "stream_flag", "ipc_copy"):
            assert f"rank {rank}: OK   {item}" in r.stdout, r.stdout




def _documented_ce_plan(kind: str, world: int, nbytes: int, slot: int, mapped: bool) -> str:
    """The copy-engine plan docs/cuda.md's table names for an op: the staged plans through pinned
    host slots, the direct-read plans when every peer is mapped (all_reduce up to one slot keeps
    the staged one-shot plan), reduce-scatter + all-gather past one slot on more than two ranks."""
    if kind == "all_reduce":
        if mapped and nbytes > slot:
            return "all_reduce/direct-read"
        return "allreduce/rs-ag" if world > 2 and nbytes > slot else "allreduce/one-shot"
    if mapped:
        return {"all_to_all": "alltoall/direct-read"}.get(kind, f"{kind}/direct-read")
    return {"all_gather": "allgather/staged", "broadcast": "broadcast/staged", "all_to_all": "alltoall/phased"}[kind]


def _ce_request(kind: str, rank: int, world: int, nbytes: int, slot: int, mapped: bool) -> dict:
    """A request as CeGroup fills it (all_to_all: `nbytes` per block, one phase holding every pair)."""
    req = {"kind": kind, "rank": rank, "world": world, "bytes": nbytes, "elem_size": 4 if kind == "all_reduce" else 1,
           "slot_bytes": slot, "on_copy_engine": True, "every_peer_mapped": mapped}
    if kind == "all_to_all":
        req["phases"] = [[(s, d, nbytes) for s in range(world) for d in range(world)]]
    return req


def test_build_plan_chooses_the_documented_copy_engine_plans():
    """buildPlan's copy-engine branch (plan/copy_engine.cpp) picks the documented plan for every
    op, world, rank and path around the one-slot threshold; the CPU thresholds in the request do
    not sway it, and an op the copy engines do not run is refused by name."""
    import torch  # noqa: F401
    from hoccl_backend import _C

    slot = 1 << 12
    for kind in ("all_gather", "broadcast", "all_to_all", "all_reduce"):
        for world in range(1, 6):
            for nbytes in (4, slot - 4, slot, slot + 4, 3 * slot + 8):
                for mapped in ((False, True) if world > 1 else (False,)):
                    want = _documented_ce_plan(kind, world, nbytes, slot, mapped)
                    for rank in range(world):
                        req = _ce_request(kind, rank, world, nbytes, slot, mapped)
                        got = _C.build_plan(req)["algo"]
                        assert got == want, (req, got)
                        cpu_knobs = dict(req, cross_memory=True, cross_memory_min_bytes=0, one_shot_max_bytes=0)
                        assert _C.build_plan(cpu_knobs)["algo"] == want, cpu_knobs
    with pytest.raises(Exception, match="copy-engine path has no plan for"):
        _C.build_plan({"kind": "reduce", "world": 2, "bytes": 64, "on_copy_engine": True})
