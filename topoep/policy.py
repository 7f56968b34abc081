"""When TopoEP's slow path re-places home experts: the policy and its device-side history.

``ReplacementPolicy(every=K)`` re-places every K steps; ``ReplacementPolicy(threshold=t,
window=W)`` re-places when the imbalance the fast path left (max / mean GPU load after
replication) stayed above ``t`` for W steps in a row. Either way the new placement is computed
from the routing counts of the last ``window`` steps, out of ``history`` steps kept.

``ReplacementClock`` keeps that history on the device (a ring of per-step expert loads and
imbalances, written in place: no host sync) and says when the policy is due. The step counter
is on the host: "every K" is decided without reading the device; the threshold test is one
device flag, which the MoE wrapper reads together with the split sizes it reads anyway (exact
mode).
"""
from __future__ import annotations

import torch


class ReplacementPolicy:
    """When to re-place home experts, and how much of a move is allowed.

    Args:
      every: re-place every ``every`` steps (K >= 1); or
      threshold: re-place when the imbalance left after replication stayed above this
        (> 1.0) for ``window`` consecutive steps.
      window: steps of routing counts the new placement is computed from (default: ``every``,
        or 4 with ``threshold``); with ``threshold`` also the steps that must stay above it.
      history: steps of counts kept (default ``window``; must be >= window).
      max_moves: experts a GPU may give away (and take) in one re-placement (default: all).
      pair_cap: experts one GPU may send to one peer; the weight exchange carries
        ranks x pair_cap rows per rank (default: about one rank's experts in all, at least 1
        per peer).
      min_gain: a move must lower the predicted max GPU load by more than this fraction of
        the mean (default 0.005): smaller gains do not pay for the bytes.
      tolerance: a host (GPU) within this fraction above the mean load stops giving experts
        away (default 0.01).
      horizon: steps a new placement is expected to serve (default ``every``, or 16): among
        equally balanced placements the one that copies the fewest weights wins, counting
        its moves and the replicas the fast path copies per step over this many steps.
    """

    def __init__(self, every: int | None = None, threshold: float | None = None,
                 window: int | None = None, history: int | None = None,
                 max_moves: int | None = None, pair_cap: int | None = None,
                 min_gain: float = 0.005, tolerance: float = 0.01,
                 horizon: int | None = None):
        if (every is None) == (threshold is None):
            raise ValueError("topoep: ReplacementPolicy needs exactly one of every=K or "
                             "threshold=t")
        if every is not None:
            if not isinstance(every, int) or isinstance(every, bool) or every < 1:
                raise ValueError(f"topoep: ReplacementPolicy every=K needs an int K >= 1, "
                                 f"got {every!r}")
        elif not isinstance(threshold, (int, float)) or not threshold > 1.0:
            raise ValueError(f"topoep: ReplacementPolicy threshold must be a number > 1.0 "
                             f"(imbalance = max / mean GPU load), got {threshold!r}")
        if window is None:
            window = every if every is not None else 4
        if horizon is None:
            horizon = every if every is not None else 16
        for name, v in (("window", window), ("history", history), ("horizon", horizon)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(f"topoep: ReplacementPolicy {name} must be an int >= 1, "
                                 f"got {v!r}")
        history = window if history is None else history
        if window > history:
            raise ValueError(f"topoep: ReplacementPolicy window={window} is longer than the "
                             f"history kept ({history} steps): raise history or shorten "
                             "the window")
        self.every, self.threshold = every, None if threshold is None else float(threshold)
        self.window, self.history = window, history
        self.max_moves, self.pair_cap = max_moves, pair_cap
        self.min_gain, self.tolerance, self.horizon = min_gain, tolerance, horizon

    def __repr__(self):
        when = (f"every={self.every}" if self.every is not None
                else f"threshold={self.threshold}")
        return f"ReplacementPolicy({when}, window={self.window}, history={self.history})"


class ReplacementClock:
    """Per-step history of one layer on the device, and the policy's verdict.

    ``record(load, imbalance)`` after each step (``load`` LongTensor [E]: tokens per user
    expert; ``imbalance``: 0-dim float tensor, max / mean GPU load after replication);
    ``due_flag()``: 0-dim bool tensor (threshold policy) or None (every-K: host only);
    ``due(flag)``: the verdict given the flag's host value; ``window_loads()``: tokens per
    expert in each of the last ``window`` steps; ``reset()`` after a re-placement."""

    def __init__(self, policy: ReplacementPolicy, num_experts: int, device=None):
        self.policy = policy
        self.loads = torch.zeros((policy.history, num_experts), dtype=torch.long,
                                 device=device)
        self.imbalance = torch.zeros(policy.history, dtype=torch.float64, device=device)
        h = policy.history
        # ring rows of the last `window` steps, for each ring row the latest step went to
        # (built once: a host list turned into a device tensor would wait for the device)
        self._recent = torch.tensor([[(i - j) % h for j in range(policy.window)]
                                     for i in range(h)], dtype=torch.long, device=device)
        self.steps = 0  # steps recorded
        self.since = 0  # steps since the last re-placement

    def to(self, device):
        self.loads, self.imbalance = self.loads.to(device), self.imbalance.to(device)
        self._recent = self._recent.to(device)
        return self

    def record(self, load: torch.Tensor, imbalance: torch.Tensor) -> None:
        i = self.steps % self.policy.history
        self.loads[i].copy_(load)
        self.imbalance[i].copy_(imbalance)
        self.steps += 1
        self.since += 1

    def _last(self) -> torch.Tensor:
        """Ring rows of the last ``window`` steps (rows never written hold zeros)."""
        return self._recent[(self.steps - 1) % self.policy.history]

    def due_flag(self) -> torch.Tensor | None:
        p = self.policy
        if p.threshold is None:
            return None
        if self.since < p.window:
            return torch.zeros((), dtype=torch.bool, device=self.loads.device)
        return (self.imbalance.index_select(0, self._last()) > p.threshold).all()

    def due(self, flag: bool | None = None) -> bool:
        p = self.policy
        if p.every is not None:
            return self.since >= p.every
        return self.since >= p.window and bool(flag)

    def window_loads(self) -> torch.Tensor:
        """[window, E]: tokens per expert in each of the last ``window`` steps."""
        return self.loads.index_select(0, self._last())

    def reset(self) -> None:
        self.since = 0
