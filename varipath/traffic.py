"""Synthetic alltoallv demand matrices (bytes), deterministic for a given seed.

Every generator returns an ``n x n`` int64 matrix whose rows each sum to about
``bytes_per_rank`` before the diagonal (data a rank keeps) is zeroed.
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np

TRAFFICS = ("uniform", "zipf0.8", "zipf1.2", "zipf1.6", "hot4-50", "hot4-80", "moe-top2")


def _rows(weights: np.ndarray, bytes_per_rank: int) -> np.ndarray:
    w = weights / weights.sum(axis=1, keepdims=True)
    out = np.floor(w * bytes_per_rank).astype(np.int64)
    np.fill_diagonal(out, 0)
    return out


def uniform(n: int, bytes_per_rank: int, rng: np.random.Generator) -> np.ndarray:
    """Every rank sends bytes_per_rank / n to every rank."""
    return _rows(np.ones((n, n)), bytes_per_rank)


def zipf(s: float) -> Callable[[int, int, np.random.Generator], np.ndarray]:
    """Destination popularity ~ 1/rank^s over a random global ranking (shared hot GPUs)."""
    def gen(n: int, bytes_per_rank: int, rng: np.random.Generator) -> np.ndarray:
        order = rng.permutation(n)
        pop = 1.0 / (np.arange(1, n + 1) ** s)
        w = np.tile(pop[np.argsort(order)], (n, 1))
        return _rows(w, bytes_per_rank)
    return gen


def hot(experts: int, share: float, experts_per_gpu: int = 4) -> Callable[[int, int, np.random.Generator], np.ndarray]:
    """Of ``experts_per_gpu * n`` experts, ``experts`` random hot ones take ``share`` of every
    rank's tokens; the other experts split the rest evenly.  A GPU's load is its experts' sum."""
    def gen(n: int, bytes_per_rank: int, rng: np.random.Generator) -> np.ndarray:
        e = experts_per_gpu * n
        hot_ids = rng.choice(e, size=experts, replace=False)
        load = np.full(e, (1 - share) / (e - experts))
        load[hot_ids] = share / experts
        per_gpu = load.reshape(n, experts_per_gpu).sum(axis=1)
        return _rows(np.tile(per_gpu, (n, 1)), bytes_per_rank)
    return gen


def moe_topk(k: int = 2, experts_per_gpu: int = 2, tokens: int = 0, skew: float = 1.0):
    """MoE routing: each rank routes ``tokens`` tokens to top-k of E experts sampled from a
    softmax gate whose per-expert logit bias ~ N(0, skew) (random gate skew, Gumbel top-k).
    ``tokens=0`` picks max(256, 16384 // n) tokens per rank."""
    def gen(n: int, bytes_per_rank: int, rng: np.random.Generator) -> np.ndarray:
        e = n * experts_per_gpu
        ntok = tokens or max(256, 16384 // n)
        bias = rng.normal(0.0, skew, size=e)
        counts = np.zeros((n, n))
        for src in range(n):
            logits = bias + rng.gumbel(size=(ntok, e))
            top = np.argpartition(-logits, k, axis=1)[:, :k] // experts_per_gpu
            counts[src] = np.bincount(top.ravel(), minlength=n)
        return _rows(counts + 1e-12, bytes_per_rank)
    return gen


GENERATORS: Dict[str, Callable[[int, int, np.random.Generator], np.ndarray]] = {
    "uniform": uniform, "zipf0.8": zipf(0.8), "zipf1.2": zipf(1.2), "zipf1.6": zipf(1.6),
    "hot4-50": hot(4, 0.5), "hot4-80": hot(4, 0.8), "moe-top2": moe_topk(),
}


def make(name: str, n: int, bytes_per_rank: int, seed: int = 0) -> np.ndarray:
    """Demand matrix for traffic ``name``."""
    if name not in GENERATORS:
        raise ValueError(f"unknown traffic {name!r}; choose from {TRAFFICS}")
    return GENERATORS[name](n, int(bytes_per_rank), np.random.default_rng(seed))
