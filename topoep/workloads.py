"""Synthetic routing workloads: Zipf skew, "X% of tokens to N hot experts", drifting skew.

Each returns LongTensor counts [R, E]: tokens (token-expert assignments, i.e. tokens x top_k)
that rank r routes to expert e. Which experts are hot is a seeded random permutation, so hot
experts land on arbitrary home GPUs. Every rank draws its own multinomial sample of the same
distribution.
"""
from __future__ import annotations

import numpy as np
import torch


def _sample(p: np.ndarray, ranks: int, per_rank: int, rng: np.random.Generator) -> torch.Tensor:
    p = p / p.sum()
    return torch.from_numpy(rng.multinomial(per_rank, p, size=ranks).astype(np.int64))


def zipf_probs(experts: int, s: float, rng: np.random.Generator) -> np.ndarray:
    p = 1.0 / np.arange(1, experts + 1, dtype=np.float64) ** s
    return p[rng.permutation(experts)]


def hot_probs(experts: int, frac: float, n_hot: int, rng: np.random.Generator) -> np.ndarray:
    hot = rng.permutation(experts)[:n_hot]
    p = np.full(experts, (1.0 - frac) / (experts - n_hot))
    p[hot] = frac / n_hot
    return p


def zipf(ranks: int, experts: int, s: float, per_rank: int = 8192, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return _sample(zipf_probs(experts, s, rng), ranks, per_rank, rng)


def hot(ranks: int, experts: int, frac: float, n_hot: int = 4, per_rank: int = 8192,
        seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return _sample(hot_probs(experts, frac, n_hot, rng), ranks, per_rank, rng)


def drifting(ranks: int, experts: int, steps: int = 8, s: float = 1.2, per_rank: int = 8192,
             seed: int = 0) -> list[torch.Tensor]:
    """Zipf(s) whose popularity ranking rotates by E/steps experts per step and whose hot set
    differs per rank group (half the ranks see a shifted ranking), drifting over steps."""
    rng = np.random.default_rng(seed)
    base = zipf_probs(experts, s, rng)
    out = []
    for t in range(steps):
        shift = (t * experts) // steps
        p0 = np.roll(base, shift)
        p1 = np.roll(base, shift + experts // 3)
        a = _sample(p0, ranks - ranks // 2, per_rank, rng)
        b = _sample(p1, ranks // 2, per_rank, rng)
        out.append(torch.cat([a, b], 0))
    return out


def traffic_cases(ranks: int, experts: int, seed: int = 0, per_rank: int = 8192):
    """The bench's traffic patterns: list of (name, [counts per step])."""
    cases = []
    for s in (0.8, 1.2, 1.6):
        cases.append((f"zipf{s}", [zipf(ranks, experts, s, per_rank, seed)]))
    for x in (30, 50, 80, 95):
        cases.append((f"hot{x}", [hot(ranks, experts, x / 100, 4, per_rank, seed)]))
    cases.append(("drift", drifting(ranks, experts, 8, 1.2, per_rank, seed)))
    return cases
