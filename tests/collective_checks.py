"""Checks run inside spawned ranks: every rank builds all ranks' inputs from known seeds, so the
expected result is computed locally with plain torch ops (the independent reference) and
compared with what the backend produced."""
from __future__ import annotations

import torch
import torch.distributed as dist

FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + [torch.bool]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def make_input(rank: int, case: int, numel: int, dtype: torch.dtype, small: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000003 * case + 7919 * rank + 17)
    if dtype.is_floating_point:
        if small:  # products of near-one numbers stay finite
            return (1.0 + 0.1 * torch.rand(numel, generator=g, dtype=torch.float64)).to(dtype)
        return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g).bool()
    lo, hi = (0, 9) if dtype == torch.uint8 else (-9, 10)
    if small:
        lo, hi = (1, 3) if dtype == torch.uint8 else (-2, 3)
    return torch.randint(lo, hi, (numel,), generator=g).to(dtype)


def reference_reduce(tensors: list[torch.Tensor], op: str, world: int) -> torch.Tensor:
    """Reduces in rank order with torch ops; floats in float64."""
    dtype = tensors[0].dtype
    xs = [t.double() if dtype.is_floating_point else t for t in tensors]
    acc = xs[0].clone()
    for x in xs[1:]:
        if op in ("sum", "avg", "premul"):
            acc = acc | x if dtype == torch.bool else acc + x
        elif op == "product":
            acc = acc & x if dtype == torch.bool else acc * x
        elif op == "min":
            acc = torch.minimum(acc, x)
        elif op == "max":
            acc = torch.maximum(acc, x)
        elif op == "band":
            acc = acc & x
        elif op == "bor":
            acc = acc | x
        elif op == "bxor":
            acc = acc ^ x
    if op == "avg":
        acc = acc / world if dtype.is_floating_point else torch.div(acc, world, rounding_mode="trunc")
    if op == "premul":
        acc = acc * 2.5 if dtype.is_floating_point else (acc.double() * 2.5).to(dtype)
    return acc.to(dtype)


def all_to_all_reference(inputs: list[torch.Tensor], splits: torch.Tensor, rank: int) -> torch.Tensor:
    """What all_to_all_single delivers to `rank`: from every source s, in rank order, the rows of
    s's input at s's offset for `rank` (splits[s, d]: rows s sends to d)."""
    parts = []
    for s, tensor in enumerate(inputs):
        off = int(splits[s, :rank].sum())
        parts.append(tensor[off:off + int(splits[s, rank])])
    return torch.cat(parts)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if actual.dtype.is_floating_point:
        tol = TOL[actual.dtype]
        ok = torch.allclose(actual.double(), expected.double(), rtol=tol, atol=tol * 4)
        if not ok:
            diff = (actual.double() - expected.double()).abs().max().item()
            raise AssertionError(f"{what}: max abs diff {diff}")
    else:
        assert torch.equal(actual, expected), f"{what}: {actual[:8].tolist()} != {expected[:8].tolist()}"


def redop(name: str):
    return {
        "sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR,
        "premul": dist._make_nccl_premul_sum(2.5),
    }[name]


def ops_for(dtype: torch.dtype) -> list[str]:
    if dtype == torch.bool:
        return ["sum", "product", "min", "max", "band", "bor", "bxor"]
    ops = ["sum", "avg", "product", "min", "max", "premul"]
    if not dtype.is_floating_point:
        ops += ["band", "bor", "bxor"]
    return ops


SIZES = [0, 1, 7, 1000, 70_001]  # 70_001 elements exceed the tests' 64 KiB staging slots
