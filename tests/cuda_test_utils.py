"""Shared helpers of the CUDA tests (tests/test_cuda_*.py): skips, worlds, exact references."""
from __future__ import annotations

import os

import torch

NO_CUDA_REASON = ("no CUDA device visible (torch.cuda.is_available() is False): the cuda-ce tests "
                  "run on a GPU machine, e.g. via scripts/gpu_check.sh")


def worlds() -> list[int]:
    """Rank counts to test, all on the visible GPU(s): HOCCL_TEST_WORLDS='2,4' (default 2)."""
    return [int(w) for w in os.environ.get("HOCCL_TEST_WORLDS", "2").split(",") if w.strip()]


def device_for(rank: int) -> torch.device:
    """Several ranks share one GPU when fewer GPUs than ranks are visible."""
    return torch.device("cuda", rank % torch.cuda.device_count())


def rank_data(rank: int, n: int, dtype: torch.dtype, op: str = "sum") -> torch.Tensor:
    """Deterministic per-rank input on the CPU, small enough that products do not overflow."""
    g = torch.Generator().manual_seed(1000 + rank)
    if dtype.is_floating_point:
        lo, hi = (0.5, 1.5) if op == "product" else (-4.0, 4.0)
        return (torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    lo, hi = (1, 3) if op == "product" else (0 if dtype == torch.uint8 else -20, 20)
    return torch.randint(lo, hi, (n,), generator=g).to(dtype)


def all_reduce_results(rank: int, dev, dtype: torch.dtype, n: int):
    """The all_reduce part every op comparison starts with (sum, max, and avg for floats), on
    tensors on `dev`. Returns (t, out): t(r=rank, k=n, op="sum") makes rank r's input of k
    elements on `dev`, and out maps each op's name to its result tensors, for the caller to add
    its other ops to. Needs an initialised process group."""
    import torch.distributed as dist

    def t(r=rank, k=n, op="sum"):
        return rank_data(r, k, dtype, op).to(dev)

    out = {}
    x = t()
    dist.all_reduce(x)
    out["all_reduce_sum"] = [x]
    x = t(op="max")
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = [x]
    if dtype.is_floating_point:
        x = t()
        dist.all_reduce(x, op=dist.ReduceOp.AVG)
        out["all_reduce_avg"] = [x]
    return t, out


def exact_reduce(srcs: list[torch.Tensor], op: str, factor: float = 1.0) -> torch.Tensor:
    """hoccl's reduction semantics, bit for bit: rank order, 16-bit floats accumulate in float32
    and round once, AVG/PREMUL_SUM scale after rounding to the dtype (integers truncate)."""
    dtype = srcs[0].dtype
    acc_t = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    acc = srcs[0].to(acc_t).clone()
    for s in srcs[1:]:
        s = s.to(acc_t)
        if op in ("sum", "avg", "premul_sum"):
            acc = acc + s
        elif op == "product":
            acc = acc * s
        elif op == "min":
            acc = torch.where(s < acc, s, acc)
        elif op == "max":
            acc = torch.where(acc < s, s, acc)
        elif op == "band":
            acc = acc & s
        elif op == "bor":
            acc = acc | s
        elif op == "bxor":
            acc = acc ^ s
        else:
            raise ValueError(op)
    out = acc.to(dtype)
    if op == "avg":
        if dtype.is_floating_point:
            out = (out.to(acc_t) / len(srcs)).to(dtype)
        else:
            out = torch.div(out, len(srcs), rounding_mode="trunc").to(dtype)
    elif op == "premul_sum":
        out = (out.to(acc_t) * torch.tensor(factor, dtype=acc_t)).to(dtype)
    return out


# ---- the CPU model of the CUDA driver (tests/cuda_model) -------------------------------------

MODEL_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_model")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cuda_include_dir() -> str | None:
    """Where cuda.h is (the same search as setup.py), or None."""
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr"):
        if root and os.path.exists(os.path.join(root, "include", "cuda.h")):
            return os.path.join(root, "include")
    return None


def build_cuda_model() -> str:
    """Compiles tests/cuda_model/*.cpp into a driver library (cached by source hash under the
    temp dir) and returns its path; raises RuntimeError with the compiler output on failure."""
    import fcntl
    import hashlib
    import glob
    import shutil
    import subprocess
    import tempfile

    inc = cuda_include_dir()
    cxx = shutil.which("g++") or shutil.which("c++")
    if inc is None or cxx is None:
        raise RuntimeError(f"cannot build the CUDA driver model: cuda.h at {inc}, C++ compiler {cxx}")
    sources = sorted(glob.glob(os.path.join(MODEL_DIR, "*.cpp")))
    deps = sources + sorted(glob.glob(os.path.join(MODEL_DIR, "*.h"))) + [
        *sorted(glob.glob(os.path.join(ROOT, "cuda", "transport", "ce", "kernels", "*.h"))), os.path.join(inc, "cuda.h")]
    h = hashlib.sha256()
    for path in deps:
        with open(path, "rb") as f:
            h.update(f.read())
    out_dir = os.path.join(tempfile.gettempdir(), "hoccl_cuda_model", h.hexdigest()[:16])
    lib = os.path.join(out_dir, "libcuda_model.so")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(lib):
            tmp = lib + f".{os.getpid()}.tmp"
            cmd = [cxx, "-std=c++17", "-O1", "-g", "-shared", "-fPIC", "-pthread", "-Wall", "-Werror",
                   "-Wno-unused-parameter", "-I", inc, "-I", os.path.join(ROOT, "cuda"), "-o", tmp, *sources]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if r.returncode != 0:
                raise RuntimeError(f"building the CUDA driver model failed:\n{' '.join(cmd)}\n{r.stderr}")
            os.replace(tmp, lib)
    return lib


def model_env(lib: str, **extra) -> dict:
    """Environment that makes hoccl load the model instead of libcuda.so.1."""
    env = {"HOCCL_LIBCUDA": lib}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def model_counter(name: str) -> int:
    """A counter of the driver model loaded in this process (HOCCL_LIBCUDA)."""
    import ctypes

    lib = ctypes.CDLL(os.environ["HOCCL_LIBCUDA"])
    lib.hoccl_model_counter.restype = ctypes.c_longlong
    return int(lib.hoccl_model_counter(name.encode()))


def model_set_capture(stream: int, status: int) -> None:
    import ctypes

    lib = ctypes.CDLL(os.environ["HOCCL_LIBCUDA"])
    lib.hoccl_model_set_capture(ctypes.c_void_p(stream), ctypes.c_int(status))


class RawDevice:
    """Device memory and one stream of the driver hoccl loaded (a GPU, or the model), through the
    raw-pointer hooks: needs no CUDA build of torch."""

    def __init__(self):
        from hoccl_backend import cuda_ext

        self.m = cuda_ext.cuda_module()
        self.stream = self.m._ce_raw_stream_create()
        self.live: list[int] = []

    def alloc(self, nbytes: int, fill: int = 0x5A) -> int:
        p = self.m._ce_raw_alloc(max(1, nbytes))
        self.m._ce_raw_upload(p, torch.full((max(1, nbytes),), fill, dtype=torch.uint8), self.stream)
        self.live.append(p)
        return p

    def put(self, t: torch.Tensor) -> int:
        p = self.alloc(t.numel() * t.element_size())
        self.m._ce_raw_upload(p, t.contiguous(), self.stream)
        return p

    def get(self, p: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(n, dtype=dtype)
        self.m._ce_raw_download(out, p, self.stream)
        return out

    def free_all(self):
        self.m._ce_raw_stream_sync(self.stream)
        for p in self.live:
            self.m._ce_raw_free(p)
        self.live = []
