"""hoccl's driver table and the CPU driver model's entry points, against the CUDA headers.

On a GPU hoccl takes every entry point from cuGetProcAddress_v2, which returns, for a base name and
a CUDA version, the newest ABI of that name (cuda.h; the ABIs are cudaTypedefs.h's
PFN_<name>_v<version>). These tests check, without a GPU: that each prototype hoccl's table is
typed with is the ABI that call returns; that the model serves the same ABIs (so CI runs the path
the GPU will) and that hoccl's dlsym fallback still works when the lookup fails; and the model's
documented kernel limits (occupancy from the function's attributes, launches past its
__launch_bounds__) and page-locking failures, called directly as hoccl calls them.
"""
from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
import tempfile

import pytest

from cuda_test_utils import build_cuda_model, cuda_include_dir, model_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INC = cuda_include_dir()

pytestmark = pytest.mark.skipif(
    INC is None or not os.path.exists(os.path.join(INC or "", "cudaTypedefs.h")),
    reason="the CUDA headers (cuda.h, cudaTypedefs.h) are not installed here")

CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701


def _header(name: str) -> str:
    with open(os.path.join(INC, name)) as f:
        return f.read()


def _abi_versions() -> dict[str, set[int]]:
    """base name -> the CUDA versions that introduced an ABI of it (per-thread variants aside)."""
    out: dict[str, set[int]] = {}
    for name, version in re.findall(r"\*PFN_(cu\w+?)_v(\d+)\)", _header("cudaTypedefs.h")):
        out.setdefault(name, set()).add(int(version))
    return out


def _header_version() -> int:
    return int(re.search(r"#define CUDA_VERSION (\d+)", _header("cuda.h")).group(1))


def _versioned_by_macro(name: str) -> bool:
    """cuda.h renames `name` to a versioned symbol (cuMemAlloc -> cuMemAlloc_v2)."""
    pattern = r"#define\s+%s\s+(?:__CUDA_API_PT[SD]Z\()?%s_v\d+\b" % (name, name)
    return re.search(pattern, _header("cuda.h")) is not None


def _hoccl_table() -> list[str]:
    with open(os.path.join(ROOT, "cuda", "transport", "ce", "cuda_driver.h")) as f:
        return re.findall(r"X\((cu\w+)\)", f.read())


def test_hoccl_table_is_typed_with_the_abi_cuGetProcAddress_returns():
    """A name with several ABIs up to the headers' version and no cuda.h macro is declared with
    its first ABI while cuGetProcAddress returns its newest (13.0's two-argument cuCtxGetDevice):
    calling through the table would pass the wrong arguments."""
    versions, top = _abi_versions(), _header_version()
    bad = [n for n in _hoccl_table()
           if len({v for v in versions.get(n, ()) if v <= top}) > 1 and not _versioned_by_macro(n)]
    assert not bad, f"typed with an older ABI than cuGetProcAddress returns at {top}: {bad}"
    assert all(n in versions for n in _hoccl_table()), [n for n in _hoccl_table() if n not in versions]


def _model_abis(lib: str) -> dict[str, dict[int, bool]]:
    cdll = ctypes.CDLL(lib)
    cdll.hoccl_model_abi_table.restype = ctypes.c_char_p
    out: dict[str, dict[int, bool]] = {}
    for line in cdll.hoccl_model_abi_table().decode().split("\n"):
        if line:
            base, version, implemented = line.split()
            out.setdefault(base, {})[int(version)] = implemented == "1"
    return out


def test_the_models_entry_points_are_the_headers_abis():
    model, header, top = _model_abis(build_cuda_model()), _abi_versions(), _header_version()
    for base, abis in model.items():
        assert set(abis) == header[base], (base, sorted(abis), sorted(header[base]))
        newest = max(v for v in abis if v <= top)
        assert abis[newest], f"the model lacks {base}'s newest ABI ({newest}), which hoccl asks for"
    assert set(_hoccl_table()) <= set(model), set(_hoccl_table()) - set(model)


def _status(lib: str, **knobs) -> str:
    code = ("import torch\nfrom hoccl_backend import cuda_ext\nfrom cuda_test_utils import model_counter\n"
            "s = cuda_ext.cuda_module().cuda_driver_status()\n"
            "print('FALLBACKS', s['dlsym_fallbacks'])\nprint('LOOKUPS', model_counter('proc_address_lookups'))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]), **model_env(lib, **knobs))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_hoccl_takes_every_entry_point_from_cuGetProcAddress():
    out = _status(build_cuda_model())
    assert "FALLBACKS []" in out, out
    assert int(out.split("LOOKUPS ")[1]) >= len(_hoccl_table()) - 1, out  # batch copy: optional


def test_the_dlsym_fallback_names_why_and_still_loads():
    out = _status(build_cuda_model(), HOCCL_MODEL_FAIL_PROC_ADDRESS=801)  # CUDA_ERROR_NOT_SUPPORTED
    assert "LOOKUPS 0" in out, out
    assert "cuLaunchKernel: cuGetProcAddress_v2 returned 801" in out, out


# ---- the model's kernel limits and page-locking, called as hoccl calls them ---------------------

class _Model:
    """The model's driver API through ctypes, with a current primary context on this thread."""

    def __init__(self, lib: str):
        self.lib = ctypes.CDLL(lib)
        assert self.lib.cuInit(0) == 0
        ctx = ctypes.c_void_p()
        assert self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        assert self.lib.cuCtxPushCurrent_v2(ctx) == 0
        module = ctypes.c_void_p()
        image = ctypes.create_string_buffer(b"\x50\xed\x55\xba" + b"\0" * 60)  # the fatbin magic
        assert self.lib.cuModuleLoadData(ctypes.byref(module), image) == 0
        self.module = module

    def function(self, name: str) -> ctypes.c_void_p:
        f = ctypes.c_void_p()
        assert self.lib.cuModuleGetFunction(ctypes.byref(f), self.module, name.encode()) == 0
        return f

    def occupancy(self, f, threads: int) -> int:
        n = ctypes.c_int(-1)
        assert self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), f, threads, ctypes.c_size_t(0)) == 0
        return n.value

    def launch(self, f, threads: int) -> int:
        args = ctypes.create_string_buffer(512)  # nsrc 0: refused before anything would run
        params = (ctypes.c_void_p * 1)(ctypes.cast(args, ctypes.c_void_p))
        return self.lib.cuLaunchKernel(f, 1, 1, 1, threads, 1, 1, 0, None, params, None)


def _in_fresh_process(fn_name: str, lib: str, **env) -> None:
    """Runs this module's <fn_name>(lib) in a fresh interpreter: the model reads
    its knobs once per process."""
    code = f"import sys; sys.path[:0] = {[os.path.join(ROOT, 'tests')]!r}\nimport test_cuda_driver_model as t\nt.{fn_name}({lib!r})\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=ROOT, **env), cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def check_occupancy_and_launch_bounds(lib: str) -> None:
    m = _Model(lib)
    regs = int(os.environ.get("HOCCL_MODEL_KERNEL_REGS", "32"))
    reduce, spin = m.function("hoccl_reduce_Float"), m.function("hoccl_spin_until_flag")
    # 32 registers: thread slots decide (2048 per SM); 64: registers do (65536 per SM).
    assert m.occupancy(spin, 1024) == (2 if regs <= 32 else 1)
    assert m.occupancy(reduce, 512) == (4 if regs <= 32 else 2)
    # Past the reductions' __launch_bounds__(512): never resident, and the launch is refused.
    assert m.occupancy(reduce, 1024) == 0
    assert m.launch(reduce, 1024) == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    assert m.launch(reduce, 512) != CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES


@pytest.mark.parametrize("regs", [32, 64])
def test_occupancy_follows_the_functions_registers_and_launch_bounds(regs):
    _in_fresh_process("check_occupancy_and_launch_bounds", build_cuda_model(), HOCCL_MODEL_KERNEL_REGS=str(regs))


def check_registration_needs_backed_pages(lib: str) -> None:
    m = _Model(lib)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    with tempfile.TemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as f:
        os.ftruncate(f.fileno(), 4096)
        # Two pages over a one-page file: the second has no backing, as on a full /dev/shm.
        p = libc.mmap(None, 8192, 3, 1, f.fileno(), 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
        assert p not in (None, ctypes.c_void_p(-1).value)
        devicemap = 2
        assert m.lib.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(8192), devicemap) == CUDA_ERROR_OUT_OF_MEMORY
        assert m.lib.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(4096), devicemap) == 0


def test_host_registration_fails_where_pages_cannot_be_backed():
    _in_fresh_process("check_registration_needs_backed_pages", build_cuda_model())
