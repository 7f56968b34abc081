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
