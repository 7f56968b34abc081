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


# --------------------------------------------------------------------------- over steps
# Workloads for the bench over steps: one counts tensor [R, E] per step. "Homed on" refers to
# the default placement (contiguous blocks of E / R experts per GPU), so a region of GPUs is a
# contiguous range of experts.


def _region(experts: int, width: float, start: float) -> np.ndarray:
    """Share of each expert e in the real interval [start, start + width) (cyclic): the
    overlap of [e, e + 1) with it, so a region can slide by fractions of an expert."""
    e = np.arange(experts, dtype=np.float64)
    w = np.zeros(experts)
    for s in (start % experts, start % experts - experts):
        w += np.clip(np.minimum(e + 1, s + width) - np.maximum(e, s), 0.0, 1.0)
    return w


def _skewed(experts: int, hot: np.ndarray, frac: float, rng: np.random.Generator,
            spread: np.ndarray) -> np.ndarray:
    """frac of the tokens to the experts weighted by ``hot``, the rest to all; inside each
    part the experts' popularity varies by the fixed factors ``spread``."""
    cold = spread / spread.sum()
    h = hot * spread
    return frac * h / h.sum() + (1.0 - frac) * cold


def step_workloads(ranks: int, experts: int, hosts: int, steps: int, switch_at: int,
                   per_rank: int = 8192, seed: int = 0, frac: float = 0.8):
    """The bench's workloads over ``steps`` steps: list of (name, kind, [counts per step]).

    - ``half-gpus`` (stationary): ``frac`` of the tokens to the experts homed on half the
      GPUs of host 0 (on one host: half its GPUs);
    - ``one-host`` (stationary, only with several hosts): ``frac`` to the experts of host 0;
    - ``dirichlet`` (stationary): Dirichlet(0.2) popularity, each rank's own fixed noise;
    - ``drift`` (drifting): ``frac`` to a region as wide as ``half-gpus`` that slides across
      half the experts over the run;
    - ``switch`` (switching): ``half-gpus`` until ``switch_at``, then the same skew on
      another region (the other half of the GPUs on one host, else host H-1's first half);
    - ``zipf-drift`` (drifting): Zipf 1.2 whose ranking rotates by one expert per step, half
      the ranks with a ranking shifted by E/3.
    Every rank draws its own multinomial sample per step."""
    rng = np.random.default_rng(seed)
    m, g = experts // ranks, ranks // hosts
    spread = rng.uniform(0.5, 1.5, experts)  # fixed popularity differences inside a part
    half = max(1, g // 2) * m  # experts on half a host's GPUs
    out = []

    def stationary(p):
        return [_sample(p, ranks, per_rank, rng) for _ in range(steps)]

    out.append(("half-gpus", "stationary",
                stationary(_skewed(experts, _region(experts, half, 0), frac, rng, spread))))
    if hosts > 1:
        out.append(("one-host", "stationary",
                    stationary(_skewed(experts, _region(experts, g * m, 0), frac, rng,
                                       spread))))
    pop = rng.dirichlet(np.full(experts, 0.2))
    noise = np.exp(0.5 * rng.standard_normal((ranks, experts)))
    out.append(("dirichlet", "stationary",
                [torch.cat([_sample(pop * noise[r], 1, per_rank, rng) for r in range(ranks)])
                 for _ in range(steps)]))
    out.append(("drift", "drifting",
                [_sample(_skewed(experts, _region(experts, half, t * experts / (2 * steps)),
                                 frac, rng, spread), ranks, per_rank, rng)
                 for t in range(steps)]))
    other = half if hosts == 1 else (hosts - 1) * g * m
    out.append(("switch", "switching",
                [_sample(_skewed(experts, _region(experts, half, 0 if t < switch_at else other),
                                 frac, rng, spread), ranks, per_rank, rng)
                 for t in range(steps)]))
    base = zipf_probs(experts, 1.2, rng)
    out.append(("zipf-drift", "drifting",
                [torch.cat([_sample(np.roll(base, t), ranks - ranks // 2, per_rank, rng),
                            _sample(np.roll(base, t + experts // 3), ranks // 2, per_rank,
                                    rng)])
                 for t in range(steps)]))
    return out
