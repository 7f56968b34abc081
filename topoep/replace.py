"""TopoEP slow path: a new home placement of the experts from a window of routing counts.

The fast path (``TopoEPPlanner``) balances every microbatch with a few replica slots around
fixed home experts. When the skew is persistent and sits on one part of the cluster, a few
slots cannot carry enough load away; then the homes themselves have to move. A new placement is
a permutation of experts over the physical expert rows (row p lives on GPU p // m, m = E / R),
so every rank keeps m home experts and every tensor keeps its shape.

How a placement is found (integer tensor arithmetic on fixed shapes, no host sync, the same
bits on every rank):

1. **Across hosts** (``cross_host_swaps`` iterations, only with several hosts): the most loaded
   host's most loaded GPU swaps one of its experts with an expert of another host, the swap
   that lowers the larger of the two host loads the most (taking it from the hottest GPU
   balances GPUs along with hosts); only while that host is above ``1 + tolerance`` times the
   mean.
2. **Inside each host** (``intra_host_swaps`` iterations, batched over hosts): the most loaded
   GPU of every host swaps one expert with another GPU of its host, the same way.
3. Caps: what travels is decided by the final placement only (each expert goes straight
   from its first GPU to its last), so a swap is allowed if afterwards no GPU holds more than
   ``max_moves`` foreign experts and no (first GPU, last GPU) pair carries more than
   ``pair_cap``: the weight exchange is then one all_to_all with ``pair_cap`` rows per peer
   (see ``migrate``).
4. **Choice**: the placement after 0, 1, 2, 4, ... swaps of each stage is planned by the fast
   path on every step of the window. The smallest max GPU load (summed over the steps: noise
   included) wins; every prefix within ``min_gain`` of it is as good, and among those the one
   that copies the fewest weights wins: its moves now plus the replicas the fast path would
   copy per step over ``horizon`` steps (then fewer cross-host moves, then fewer swaps; the
   current placement first). Homes that leave the fast path less to do also leave it more
   room when the routing shifts.

Swaps follow the loads *before* replication; step 4 judges them by the imbalance *left after*
the fast path, which is what a step pays.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from .planner import TopoEPPlanner

_FRAC = 1 << 16  # fixed-point unit for tolerances
_LOAD_BITS = 24  # window loads are scaled to at most 2**24 tokens (no int64 overflow)
_BIG = 1 << 62


def default_pair_cap(experts_per_gpu: int, ranks: int) -> int:
    """Rows a GPU may exchange with one peer: enough for a GPU to trade all its experts when
    it spreads them over the other ranks, so the exchange buffer (ranks x pair_cap rows) stays
    near one rank's experts on small worlds; 1 on large ones."""
    return max(1, math.ceil(experts_per_gpu / max(1, ranks - 1)))


def _int_arg(name: str, v, low: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"topoep: {name} must be an int, got {type(v).__name__}")
    if v < low:
        raise ValueError(f"topoep: {name} must be >= {low}, got {v}")
    return v


class HomeReplacer:
    """Computes new home placements (see the module docstring). Arguments are checked here;
    calls never sync the host.

    ``__call__(loads, logical_at)``: ``loads`` LongTensor [W, E] (or [E]), tokens per (user)
    expert in each step of the window; ``logical_at`` LongTensor [E], the expert at each
    physical row now. Returns a namespace with ``logical_at`` (the new rows), ``moved`` /
    ``cross_host_moved`` (experts whose GPU / host changes), ``imbalance_before`` /
    ``imbalance_after`` (the max GPU load the fast path leaves, summed over the window's
    steps, over their summed mean load) and ``candidate`` (the prefix chosen).
    """

    def __init__(self, num_experts: int, hosts: int, gpus_per_host: int, slots_per_gpu: int,
                 max_moves: int | None = None, pair_cap: int | None = None,
                 tolerance: float = 0.01, min_gain: float = 0.005,
                 cross_host_swaps: int | None = None, intra_host_swaps: int | None = None,
                 horizon: int = 16, jit: bool = True):
        E = _int_arg("num_experts", num_experts, 1)
        H = _int_arg("hosts", hosts, 1)
        G = _int_arg("gpus_per_host", gpus_per_host, 1)
        R = H * G
        if E % R:
            raise ValueError(f"topoep: {E} experts are not divisible over {R} ranks")
        m = E // R
        self.E, self.H, self.G, self.R, self.m = E, H, G, R, m
        self.max_moves = m if max_moves is None else _int_arg("max_moves", max_moves, 1)
        self.pair_cap = (default_pair_cap(m, R) if pair_cap is None
                         else _int_arg("pair_cap", pair_cap, 1))
        self.cross_host_swaps = ((E // 2 if H > 1 else 0) if cross_host_swaps is None
                                 else _int_arg("cross_host_swaps", cross_host_swaps, 0))
        self.intra_host_swaps = (G * m // 2 if intra_host_swaps is None
                                 else _int_arg("intra_host_swaps", intra_host_swaps, 0))
        for name, v in (("tolerance", tolerance), ("min_gain", min_gain)):
            if not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise ValueError(f"topoep: {name} must be a fraction in [0, 1), got {v!r}")
        self.tol, self.gain = int(round(tolerance * _FRAC)), int(round(min_gain * _FRAC))
        self.horizon = _int_arg("horizon", horizon, 0)
        self.planner = TopoEPPlanner(E, H, G, slots_per_gpu, jit=jit)  # checks slots
        t1, t2 = self.cross_host_swaps, self.intra_host_swaps
        marks = {0, t1, t1 + t2}
        marks |= {1 << i for i in range(t1.bit_length()) if 1 << i <= t1}
        marks |= {t1 + (1 << i) for i in range(t2.bit_length()) if 1 << i <= t2}
        self.checkpoints = sorted(marks)  # swap iterations after which a placement is judged
        self._consts: dict = {}

    # ------------------------------------------------------------------ constants
    def _k(self, device):
        key = str(device)
        if key not in self._consts:
            E, H, G, R, m = self.E, self.H, self.G, self.R, self.m
            eh = G * m
            row = torch.arange(E, device=device)
            k = SimpleNamespace(row=row, row_gpu=row // m, row_host=row // eh)
            k.host_rows = torch.arange(H, device=device)[:, None] * eh + torch.arange(
                eh, device=device)  # [H, eh]
            k.gpu_rows = torch.arange(m, device=device)  # a GPU's rows, offset by gpu * m
            k.host_first_gpu = torch.arange(H, device=device) * G
            k.pairs1 = torch.arange(m * E, device=device).view(m, E)
            k.pairs2 = torch.arange(m * eh, device=device).view(1, m, eh)
            k.counts = torch.zeros((R, E), dtype=torch.long, device=device)
            self._consts[key] = k
        return self._consts[key]

    # ------------------------------------------------------------------ call
    def __call__(self, loads: torch.Tensor, logical_at: torch.Tensor) -> SimpleNamespace:
        E = self.E
        if not isinstance(loads, torch.Tensor) or loads.dtype != torch.long or \
                loads.dim() not in (1, 2) or loads.shape[-1] != E:
            raise ValueError(f"topoep: replacer loads must be a LongTensor [E={E}] or "
                             f"[steps, E={E}]")
        if not isinstance(logical_at, torch.Tensor) or logical_at.dtype != torch.long or \
                tuple(logical_at.shape) != (E,):
            raise ValueError(f"topoep: replacer logical_at must be a LongTensor [{E}]")
        with torch.inference_mode():
            out = self._run(loads.view(-1, E), logical_at)
        return SimpleNamespace(**{n: (t.clone() if t.is_inference() else t)
                                  for n, t in out.items()})

    def _run(self, loads, la0):
        k = self._k(loads.device)
        E = self.E
        # scale so that the window holds at most 2**24 tokens: products stay in int64
        steps = loads // (loads.sum() // (1 << _LOAD_BITS) + 1)
        w = steps.sum(0)
        tot = w.sum()
        st = SimpleNamespace(la=la0.clone(), wp=w.index_select(0, la0),
                             orig=k.row_gpu.clone(),  # GPU each row's content started on
                             foreign=torch.zeros(self.R, dtype=torch.long, device=w.device),
                             pair=torch.zeros(self.R * self.R, dtype=torch.long,
                                              device=w.device))
        st.L = st.wp.view(self.R, self.m).sum(1)
        snaps = [st.la.clone()]  # checkpoint 0: the current placement
        it = 0
        for _ in range(self.cross_host_swaps):
            self._cross_host_step(k, st, tot)
            it += 1
            if it in self.checkpoints:
                snaps.append(st.la.clone())
        for _ in range(self.intra_host_swaps):
            self._intra_host_step(k, st, tot)
            it += 1
            if it in self.checkpoints:
                snaps.append(st.la.clone())
        cand = torch.stack(snaps)  # [C, E]
        # judged step by step: a step pays its own max load, noise included
        maxl, reps = (torch.stack(t) for t in zip(*(self._fast_path(k, steps, c)
                                                    for c in snaps)))  # [C] each
        # as good as the best: within min_gain of the mean GPU load
        slack = (tot * self.gain) // (self.R * _FRAC)
        ok = maxl <= maxl.min() + slack
        pos0 = torch.empty_like(la0).scatter_(0, la0, k.row)  # expert -> row now
        was = pos0.index_select(0, cand.view(-1)).view(cand.shape)  # old row of new content
        moved = (k.row_gpu.index_select(0, was.view(-1)).view(cand.shape) != k.row_gpu
                 ).sum(1)
        cross = (k.row_host.index_select(0, was.view(-1)).view(cand.shape) != k.row_host
                 ).sum(1)
        c, n = cand.shape[0], steps.shape[0]
        # weights copied: the moves now, and the fast path's replicas over the horizon
        cost = moved * n + reps * self.horizon
        key = torch.where(ok, (cost * (E + 1) + cross) * c + torch.arange(c, device=w.device),
                          _BIG)
        best = key.argmin()
        mean = tot.to(torch.float64).clamp(min=1.0) / self.R
        pick = best.view(1)
        return {"logical_at": cand.index_select(0, pick)[0],
                "moved": moved.index_select(0, pick)[0],
                "cross_host_moved": cross.index_select(0, pick)[0],
                "imbalance_before": maxl[0].to(torch.float64) / mean,
                "imbalance_after": maxl.index_select(0, pick)[0].to(torch.float64) / mean,
                "candidate": best}

    def _fast_path(self, k, steps, la):
        """Sums over the steps [W, E] of the max GPU load the fast path leaves with experts at
        rows ``la`` and of the replicas it copies. A plan's loads depend only on the experts'
        totals, so one source row carries them all."""
        top = reps = 0
        for i in range(steps.shape[0]):
            counts = k.counts.clone()
            counts[0] = steps[i].index_select(0, la)
            p = self.planner(counts)
            top, reps = top + p.load.max(), reps + p.num_replicas()
        return top, reps

    # ------------------------------------------------------------------ swap steps
    def _allowed(self, st, x, y, a, b):
        """Swapping the contents of rows x and y (on GPUs a and b; broadcast shapes) keeps the
        final exchange within its caps. What travels is decided by the final placement only
        (each row's content goes straight from its original GPU to its last one), so the caps
        count rows by (original GPU -> current GPU): at most ``pair_cap`` per GPU pair and
        ``max_moves`` foreign rows per GPU."""
        R = self.R
        oa = st.orig.index_select(0, x.reshape(-1)).view(x.shape)
        ob = st.orig.index_select(0, y.reshape(-1)).view(y.shape)
        same = oa == ob
        p_ab = (st.pair.index_select(0, (oa * R + b).reshape(-1)).view(
            torch.broadcast_shapes(oa.shape, b.shape)) + (oa != b).long()
            - (same & (ob != b)).long())
        p_ba = (st.pair.index_select(0, (ob * R + a).reshape(-1)).view(
            torch.broadcast_shapes(ob.shape, a.shape)) + (ob != a).long()
            - (same & (oa != a)).long())
        f_a = (st.foreign.index_select(0, a.reshape(-1)).view(a.shape)
               - (oa != a).long() + (ob != a).long())
        f_b = (st.foreign.index_select(0, b.reshape(-1)).view(b.shape)
               - (ob != b).long() + (oa != b).long())
        return (((p_ab <= self.pair_cap) | (oa == b)) & ((p_ba <= self.pair_cap) | (ob == a))
                & (f_a <= self.max_moves) & (f_b <= self.max_moves))

    def _cross_host_step(self, k, st, tot):
        H, G, m = self.H, self.G, self.m
        hl = st.L.view(H, G).sum(1)
        a = hl.argmax().view(1)  # most loaded host (first)
        top = hl.index_select(0, a)  # its load [1]
        # the host's most loaded GPU gives: host and GPU balance improve together
        ga = (st.L.view(H, G).index_select(0, a).argmax(1) + a * G)  # [1]
        xr = ga * m + k.gpu_rows  # its rows [m]
        d = st.wp.index_select(0, xr)[:, None] - st.wp[None, :]  # [m, E]
        hb = hl.index_select(0, k.row_host)[None, :]
        newmax = torch.maximum(top - d, hb + d)
        valid = ((d > 0) & (newmax < top) & (k.row_host[None, :] != a)
                 & self._allowed(st, xr[:, None], k.row[None, :], ga[:, None],
                                 k.row_gpu[None, :])
                 & (top * H * _FRAC > (_FRAC + self.tol) * tot))
        key = torch.where(valid, newmax * (m * self.E) + k.pairs1, _BIG).view(-1)
        kmin, j = key.min(0, keepdim=True)
        x = xr.index_select(0, j // self.E)
        y = torch.where(kmin < _BIG, j % self.E, x)  # no valid swap: x with itself (no-op)
        self._swap(k, st, x, y)

    def _intra_host_step(self, k, st, tot):
        H, G, R, m = self.H, self.G, self.R, self.m
        eh = G * m
        da = st.L.view(H, G).argmax(1) + k.host_first_gpu  # most loaded GPU per host [H]
        top = st.L.index_select(0, da)[:, None, None]
        xr = da[:, None] * m + k.gpu_rows  # [H, m]
        yr = k.host_rows  # [H, eh]
        d = (st.wp.index_select(0, xr.view(-1)).view(H, m, 1)
             - st.wp.index_select(0, yr.view(-1)).view(H, 1, eh))
        gb = k.row_gpu.index_select(0, yr.view(-1)).view(H, 1, eh)
        lb = st.L.index_select(0, gb.view(-1)).view(H, 1, eh)
        newmax = torch.maximum(top - d, lb + d)
        ga = da.view(H, 1, 1)
        valid = ((d > 0) & (newmax < top) & (gb != ga)
                 & self._allowed(st, xr.view(H, m, 1), yr.view(H, 1, eh), ga, gb)
                 & (top * R * _FRAC > (_FRAC + self.tol) * tot))
        key = torch.where(valid, newmax * (m * eh) + k.pairs2, _BIG).view(H, m * eh)
        kmin, j = key.min(1)
        x = xr.gather(1, (j // eh)[:, None])[:, 0]
        y = torch.where(kmin < _BIG, yr.gather(1, (j % eh)[:, None])[:, 0], x)
        self._swap(k, st, x, y)

    def _swap(self, k, st, x, y):
        """Swap the contents of rows x and y ([n] each, disjoint pairs; x == y: a no-op)."""
        R = self.R
        idx, src = torch.cat([x, y]), torch.cat([y, x])
        d = st.wp.index_select(0, x) - st.wp.index_select(0, y)
        a, b = k.row_gpu.index_select(0, x), k.row_gpu.index_select(0, y)
        oa, ob = st.orig.index_select(0, x), st.orig.index_select(0, y)
        one = (x != y).long()
        # (origin -> GPU) counts: oa leaves a for b, ob leaves b for a (o == g is no move)
        pk = torch.cat([oa * R + a, oa * R + b, ob * R + b, ob * R + a])
        pv = torch.cat([-(oa != a).long(), (oa != b).long(), -(ob != b).long(),
                        (ob != a).long()]) * one.repeat(4)
        st.pair = st.pair.index_add(0, pk, pv)
        st.foreign = st.foreign.index_add(0, torch.cat([a, b, b, a]), pv)
        for name in ("la", "wp", "orig"):
            t = getattr(st, name)
            setattr(st, name, t.index_put((idx,), t.index_select(0, src)))
        st.L = st.L.index_add(0, torch.cat([a, b]), torch.cat([-d, d]))
