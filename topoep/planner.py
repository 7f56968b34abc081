"""TopoEP planner: deterministic, host-sync-free expert replication and token rerouting.

Everything here is integer tensor arithmetic on fixed shapes: no ``.item()``, ``.tolist()``,
``nonzero()``, boolean-mask indexing or other data-dependent shapes, so a plan never
synchronizes the host and every rank (and CPU vs GPU) computes bitwise-identical plans.

Algorithm (per candidate target load ``T``; several candidates are planned in one batch and the
one with the lowest resulting max GPU load wins, ties to the first):

1. Inter-host stage: hosts whose home load exceeds ``gpus_per_host * T`` give away their
   largest experts' tokens; a cumulative cut hands those pieces to hosts with room.
2. Intra-host stage (batched over hosts): overloaded GPUs give away their largest experts'
   tokens; together with the pieces the host received in stage 1 they are apportioned to the
   host's GPUs with room, one piece per GPU per round, ``slots_per_gpu`` rounds. In a round each
   receiver takes the piece that covers the midpoint of its spare-capacity interval, and a
   piece is split over its receivers in proportion to their spare capacity (exact integers).
3. Token split: for every expert, tokens of each source rank go to copies on the same host
   first (north-west-corner cut inside the host), and only the remainder crosses hosts.
"""
from __future__ import annotations

import torch

# Candidate plans, tried in one batch; the lowest max GPU load wins, ties to the earliest.
# (num, den, mode): target T = ceil(total * num / (R * den)); num = 0 means no replication.
# mode "cap": one piece per GPU per round, a receiver never exceeds T; "unc": the same but a
# piece is split over its receivers even if that overshoots T; "cut": one cumulative cut of
# all pieces over the GPUs, each GPU keeps its slots_per_gpu largest overlaps.
_APPORTION = ((0, 1, True), (1, 1, True), (1, 1, False), (129, 128, True), (33, 32, True))
_CUT = ((1, 1, False), (129, 128, False), (33, 32, False),
        (1, 1, True), (129, 128, True), (33, 32, True))  # True: donors give whole experts
# and the receivers that are home to a piece are ordered last (see _cut_slots)
_BIG = 1 << 62


class TopoEPPlan:
    """A plan. All fields are tensors on the device of the input counts.

    slot_expert: LongTensor [R, S], expert held by each replica slot (-1 = empty).
    slot_tokens: LongTensor [R, S], tokens the slot processes (summed over sources).
    tokens:      LongTensor [R, E, R], tokens[r, e, g] from source rank r for expert e on GPU g.
                 Built on first access from the compact form (``flow`` int32 [R, C]: tokens of each
                 source for each expert copy; ``copy_index`` [C] = e * R + g of each copy),
                 so planning itself never writes the R*E*R dense tensor.
    expert_gpu:  LongTensor [E, R], tokens of expert e processed on GPU g (= tokens.sum(0)).
    load:        LongTensor [R], tokens processed per GPU after rerouting.
    home_load:   LongTensor [R], tokens per GPU without balancing.
    candidate:   LongTensor [] index of the winning candidate (diagnostic).
    """

    def __init__(self, slot_expert, slot_tokens, expert_gpu, load, home_load, candidate,
                 hosts: int, gpus_per_host: int, flow=None, copy_index=None, tokens=None):
        self.slot_expert, self.slot_tokens = slot_expert, slot_tokens
        self.expert_gpu, self.load, self.home_load = expert_gpu, load, home_load
        self.candidate, self.hosts, self.gpus_per_host = candidate, hosts, gpus_per_host
        self.flow, self.copy_index, self._tokens = flow, copy_index, tokens

    @property
    def tokens(self) -> torch.Tensor:
        if self._tokens is None:
            r = self.flow.shape[0]
            e = self.expert_gpu.shape[0]
            t = torch.zeros((r, e * r), dtype=torch.long, device=self.flow.device)
            t.scatter_add_(1, self.copy_index.expand(r, -1), self.flow.long())
            self._tokens = t.view(r, e, r)
        return self._tokens

    def sent_by(self, r: int) -> torch.Tensor:
        """tokens[r] ([E, R]) without building the dense tensor."""
        if self._tokens is not None:
            return self._tokens[r]
        e, g = self.expert_gpu.shape
        return torch.zeros(e * g, dtype=torch.long, device=self.flow.device).scatter_add_(
            0, self.copy_index, self.flow[r].long()).view(e, g)

    def received_by(self, g: int) -> torch.Tensor:
        """tokens[:, :, g] ([R, E]) without building the dense tensor."""
        if self._tokens is not None:
            return self._tokens[:, :, g]
        e, r = self.expert_gpu.shape
        here = (self.copy_index % r == g).to(self.flow.dtype)
        return torch.zeros((r, e), dtype=torch.long, device=self.flow.device).scatter_add_(
            1, (self.copy_index // r).expand(r, -1), self.flow.long() * here)

    def imbalance(self) -> torch.Tensor:
        """max GPU load / mean GPU load after rerouting (float tensor, 1.0 = perfect)."""
        return _imbalance(self.load)

    def balancedness(self) -> torch.Tensor:
        """mean / max, as EPLB reports it."""
        return 1.0 / self.imbalance()

    def cross_host_fraction(self) -> torch.Tensor:
        """Fraction of tokens whose source rank and processing GPU are on different hosts."""
        if self._tokens is not None:
            return cross_host_fraction(self._tokens, self.hosts, self.gpus_per_host)
        r = self.flow.shape[0]
        host = torch.arange(r, device=self.flow.device) // self.gpus_per_host
        cross = host[:, None] != (self.copy_index % r // self.gpus_per_host)[None, :]
        moved = (self.flow.long() * cross).sum()
        return moved.to(torch.float64) / self.flow.sum().to(torch.float64).clamp(min=1.0)

    def num_replicas(self) -> torch.Tensor:
        return (self.slot_expert >= 0).sum()

    def replica_bytes(self, expert_bytes: int) -> torch.Tensor:
        """Bytes of expert weights copied into replica slots for this plan."""
        return self.num_replicas() * expert_bytes

    def tokens_moved_off_home(self) -> torch.Tensor:
        """Tokens that replicas took away from their experts' home GPUs (the saving the
        replicated bytes buy); compare with ``replica_bytes``."""
        return self.slot_tokens.clamp(min=0).sum()


def _imbalance(load: torch.Tensor) -> torch.Tensor:
    load = load.to(torch.float64)
    return load.max() / load.mean().clamp(min=1e-30)


def cross_host_fraction(tokens: torch.Tensor, hosts: int, gpus_per_host: int) -> torch.Tensor:
    """Fraction of the tokens in a [R, E, R] token tensor that cross a host boundary."""
    r = hosts * gpus_per_host
    host = torch.arange(r, device=tokens.device) // gpus_per_host
    cross = (host[:, None] != host[None, :]).to(tokens.dtype)  # [src, dst]
    moved = (tokens.sum(1) * cross).sum()
    return moved.to(torch.float64) / tokens.sum().to(torch.float64).clamp(min=1.0)


def default_placement(num_experts: int, ranks: int, device=None) -> torch.Tensor:
    """Contiguous blocks: expert e lives on GPU e // (E / R)."""
    if num_experts % ranks:
        raise ValueError(f"topoep: {num_experts} experts are not divisible over {ranks} ranks")
    return torch.arange(num_experts, device=device) // (num_experts // ranks)


# --------------------------------------------------------------------------- building blocks


def _sort_desc(x: torch.Tensor):
    return torch.sort(x, dim=-1, descending=True, stable=True)


def _group_before(values: torch.Tensor, group: torch.Tensor, ngroups: int,
                  o1: torch.Tensor) -> torch.Tensor:
    """For items [B, P] in groups (LongTensor [P]), the sum of the values of the items of the
    same group that precede each item in the order ``o1`` ([P], e.g. load desc), shared."""
    b, p = values.shape
    _, o2 = torch.sort(group[o1], stable=True)
    order = o1[o2]
    vals = values.index_select(1, order)
    grp = group[order]
    excl = vals.cumsum(1) - vals
    base = torch.full((b, ngroups), _BIG, dtype=values.dtype, device=values.device)
    base = base.scatter_reduce(1, grp.expand(b, p), excl, reduce="amin", include_self=True)
    before = excl - base.index_select(1, grp)
    return torch.empty_like(before).index_copy_(1, order, before)


def _cut(pieces: torch.Tensor, cap: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Cumulative cut: pieces [B, P] laid out in ``order`` ([P], shared) against capacities
    [B, N] (desc) -> [B, P, N] amounts."""
    ps = pieces.index_select(1, order)
    cs, co = _sort_desc(cap)
    ap = ps.cumsum(1)
    ar = cs.cumsum(1)
    lo = torch.maximum((ap - ps)[:, :, None], (ar - cs)[:, None, :])
    hi = torch.minimum(ap[:, :, None], ar[:, None, :])
    ov = (hi - lo).clamp(min=0)
    out = torch.empty_like(ov).index_copy_(1, order, ov)
    return torch.empty_like(out).scatter_(2, co[:, None, :].expand_as(out), out)


def _apportion(ps: torch.Tensor, spare: torch.Tensor, capped: torch.Tensor):
    """One round: each receiver (spare [B, N]) takes at most one piece.

    ``ps`` [B, P] are the piece amounts in a fixed (roughly descending) order; receivers are
    sorted by spare descending. A receiver takes the piece covering the midpoint of its
    cumulative spare interval, and a piece is split over its receivers in proportion to their
    spare (exact integers). Returns (piece position [B, N], -1 = nothing; amount [B, N]).
    """
    b, p = ps.shape
    ss, so = _sort_desc(spare)
    ap2 = 2 * ps.cumsum(1)
    ar = ss.cumsum(1)
    arp = ar - ss
    idx = torch.searchsorted(ap2, ar + arp, right=True)
    idx = torch.where(ss > 0, idx, p)
    valid = idx < p
    idxc = idx.clamp(max=p - 1)
    pamt = (ps.gather(1, idxc) * (valid))
    grp_spare = torch.zeros((b, p + 1), dtype=ss.dtype, device=ss.device)
    grp_spare = grp_spare.scatter_add(1, idx, ss)
    # receivers of one piece are contiguous; the first one has the smallest arp
    base = torch.full((b, p + 1), _BIG, dtype=ss.dtype, device=ss.device)
    base = base.scatter_reduce(1, idx, arp, reduce="amin", include_self=True)
    gb = base.gather(1, idx)
    den = grp_spare.gather(1, idx).clamp(min=1)
    amt = pamt * (ar - gb) // den - pamt * (arp - gb) // den
    amt = torch.where(capped[:, None], torch.minimum(amt, ss), amt)
    amt = amt.clamp(min=0)
    pos = torch.where(amt > 0, idxc, -1)
    out_p = torch.empty_like(pos).scatter_(1, so, pos)
    out_a = torch.empty_like(amt).scatter_(1, so, amt)
    return out_p, out_a


def _cut_slots(ps: torch.Tensor, spare: torch.Tensor, slots: int, home_local: torch.Tensor,
               homes_last: torch.Tensor):
    """Cumulative cut of pieces [B, P] (fixed order) over receivers [B, N] (spare desc); each
    receiver keeps its ``slots`` largest overlaps (ties: earlier piece); overlaps with the
    piece's own home GPU (``home_local`` [B, P], -1 = other host) stay at home. Returns
    (piece position [B, N, slots], -1 = none; amount [B, N, slots]).

    Rows with ``homes_last``: receivers that are home to a piece come after all others, in
    piece order, so each such piece's remainder lands on its home (a chain: the home GPU gave
    its expert away and takes a piece of the next one in its slot)."""
    b, p = ps.shape
    n = spare.shape[1]
    dev = ps.device
    parange = torch.arange(p, device=dev).expand(b, p)
    first = torch.full((b, n + 1), p, dtype=torch.long, device=dev).scatter_reduce(
        1, torch.where(home_local >= 0, home_local, n),
        torch.where(ps > 0, parange, p), reduce="amin", include_self=True)[:, :n]
    rkey = torch.where(homes_last[:, None] & (first < p), _BIG // 2 + first, -spare)
    _, so = torch.sort(rkey, dim=1, stable=True)
    ss = spare.gather(1, so)
    ap = ps.cumsum(1)
    ar = ss.cumsum(1)
    lo = torch.maximum((ap - ps)[:, :, None], (ar - ss)[:, None, :])
    hi = torch.minimum(ap[:, :, None], ar[:, None, :])
    ov = (hi - lo).clamp(min=0)  # [B, P, N]
    # a piece landing on its expert's home GPU needs no slot: it stays unassigned (= home)
    at_home = home_local[:, :, None] == so[:, None, :]
    home_amt = (ov * (at_home)).sum(1)  # [B, N] spare used by own experts
    ov = torch.where(at_home, 0, ov)
    key = ov * p + (p - 1 - torch.arange(p, device=dev))[None, :, None]
    if p < slots:  # fewer pieces than slots: pad with empty (zero-amount) pieces
        key = torch.cat([key, key.new_zeros((b, slots - p, n))], 1)
    kv, _ = torch.topk(key, slots, dim=1)  # [B, slots, N]; keys are unique
    amt = kv // p
    pos = torch.where(amt > 0, p - 1 - kv % p, -1)
    pos = pos.transpose(1, 2)
    amt = amt.transpose(1, 2)
    out_p = torch.empty_like(pos).scatter_(1, so[:, :, None].expand_as(pos), pos)
    out_a = torch.empty_like(amt).scatter_(1, so[:, :, None].expand_as(amt), amt)
    out_h = torch.empty_like(home_amt).scatter_(1, so, home_amt)
    return out_p, out_a, out_h


# --------------------------------------------------------------------------- planner


class TopoEPPlanner:
    """Validated, reusable planner for a fixed topology and expert placement.

    All argument checks happen here, at construction; calling the planner never syncs.
    ``min_piece`` (tokens) is the price of a replica expressed in tokens: a piece of fewer
    tokens is not worth copying an expert's weights for and is left at home.
    """

    def __init__(self, num_experts: int, hosts: int, gpus_per_host: int, slots_per_gpu: int,
                 placement: torch.Tensor | None = None, min_piece: int = 1):
        for name, v in (("num_experts", num_experts), ("hosts", hosts),
                        ("gpus_per_host", gpus_per_host), ("slots_per_gpu", slots_per_gpu)):
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"topoep: {name} must be an int, got {type(v).__name__}")
        if hosts < 1 or gpus_per_host < 1:
            raise ValueError(f"topoep: need hosts >= 1 and gpus_per_host >= 1, got "
                             f"{hosts} x {gpus_per_host}")
        if slots_per_gpu < 1:
            raise ValueError(f"topoep: replica budget too small: slots_per_gpu={slots_per_gpu}, "
                             "need at least one replica slot per GPU")
        r = hosts * gpus_per_host
        if num_experts < 1:
            raise ValueError(f"topoep: num_experts must be >= 1, got {num_experts}")
        if placement is None:
            placement = default_placement(num_experts, r)
        else:
            if not isinstance(placement, torch.Tensor) or placement.dtype != torch.long:
                raise TypeError("topoep: placement must be a LongTensor [E]")
            if tuple(placement.shape) != (num_experts,):
                raise ValueError(f"topoep: placement has shape {tuple(placement.shape)}, "
                                 f"expected ({num_experts},)")
            pc = placement.detach().cpu()
            if bool((pc < 0).any()) or bool((pc >= r).any()):
                raise ValueError(f"topoep: placement values must lie in [0, {r})")
            per = torch.bincount(pc, minlength=r)
            if bool((per != per[0]).any()):
                raise ValueError(f"topoep: {num_experts} experts are not divisible over {r} "
                                 f"ranks (placement gives per-rank counts {per.tolist()})")
        if num_experts % r:
            raise ValueError(f"topoep: {num_experts} experts are not divisible over {r} ranks")
        self.E, self.H, self.G, self.S, self.R = num_experts, hosts, gpus_per_host, slots_per_gpu, r
        self.placement = placement.detach().cpu().clone()
        self.min_piece = int(min_piece)
        self._dev_cache: dict = {}

    def _consts(self, device):
        key = str(device)
        if key not in self._dev_cache:
            home = self.placement.to(device)
            cands = [(n, d, c) for n, d, c in _APPORTION] + [(n, d, True) for n, d, _ in _CUT]
            whole = torch.tensor([False] * len(_APPORTION) + [w for _, _, w in _CUT],
                                 device=device)
            num = torch.tensor([n for n, _, _ in cands], device=device)
            den = torch.tensor([d for _, d, _ in cands], device=device)
            capped = torch.tensor([c for _, _, c in _APPORTION], device=device)
            self._dev_cache[key] = (home, home // self.G, num, den, capped, whole)
        return self._dev_cache[key]

    def _grouped(self, device):
        """Experts grouped by home GPU: [R, E/R] expert ids (placement is balanced)."""
        key = ("grouped", str(device))
        if key not in self._dev_cache:
            order = torch.sort(self.placement, stable=True).indices
            self._dev_cache[key] = order.view(self.R, self.E // self.R).to(device)
        return self._dev_cache[key]

    def check_counts(self, counts: torch.Tensor) -> None:
        if not isinstance(counts, torch.Tensor):
            raise TypeError("topoep: counts must be a torch.LongTensor [R, E]")
        if counts.dtype != torch.long:
            raise TypeError(f"topoep: counts must have dtype torch.int64, got {counts.dtype}")
        if tuple(counts.shape) != (self.R, self.E):
            raise ValueError(f"topoep: counts has shape {tuple(counts.shape)}, expected "
                             f"[R={self.R}, E={self.E}] (R = hosts x gpus_per_host)")

    def __call__(self, counts: torch.Tensor) -> TopoEPPlan:
        self.check_counts(counts)
        with torch.inference_mode():  # integer work only: skip autograd bookkeeping per op
            p = self._plan(counts)
        # hand out ordinary tensors (inference tensors cannot be saved for backward later)
        for name in ("slot_expert", "slot_tokens", "expert_gpu", "load", "home_load",
                     "candidate", "flow", "copy_index"):
            setattr(p, name, getattr(p, name).clone())
        return p

    def _plan(self, counts: torch.Tensor) -> TopoEPPlan:
        dev = counts.device
        E, H, G, S, R = self.E, self.H, self.G, self.S, self.R
        home, home_host, num, den, capped, whole = self._consts(dev)
        V = num.shape[0]

        c = counts.sum(0)  # [E]
        total = c.sum()
        L = torch.zeros(R, dtype=torch.long, device=dev).scatter_add(0, home, c)
        # per-candidate target; num == 0 -> no replication
        T = (total * num + R * den - 1) // (R * den)
        T = torch.where(num > 0, T, torch.full_like(T, _BIG // (4 * R)))  # [V]

        cv = c.expand(V, E)
        _, by_load = _sort_desc(c)  # experts by load desc, ties to the lower id
        # ---- stage 1: across hosts
        if H > 1:
            HL = L.view(H, G).sum(1)  # [H]
            HT = T * G  # [V]
            hx = (HL[None, :] - HT[:, None]).clamp(min=0)  # host excess [V, H]
            before = _group_before(c[None, :], home_host, H, by_load)  # same for all
            off1 = torch.minimum(cv, (hx.index_select(1, home_host) - before).clamp(min=0))
            hspare = (HT[:, None] - HL[None, :]).clamp(min=0)
            inc = _cut(off1, hspare, by_load)  # [V, E, H]
            rem = cv - off1
        else:
            inc = torch.zeros((V, E, 1), dtype=torch.long, device=dev)
            rem = cv
        # ---- stage 2: inside each host
        L1 = torch.zeros((V, R), dtype=torch.long, device=dev).scatter_add(
            1, home.expand(V, E), rem)
        gx = (L1 - T[:, None]).clamp(min=0)
        before = _group_before(rem, home, R, by_load)
        need = gx.gather(1, home.expand(V, E)) - before
        off2 = torch.where(whole[:, None], (rem * (need > 0)),
                           torch.minimum(rem, need.clamp(min=0)))
        L1 = L1 - torch.zeros_like(L1).scatter_add(1, home.expand(V, E), off2)  # after giving
        pieces = torch.zeros((V, H, E), dtype=torch.long, device=dev)
        pieces.scatter_(1, home_host.expand(V, E)[:, None, :], off2[:, None, :])
        pieces = pieces + inc.transpose(1, 2)  # [V, H, E]
        # one fixed piece order per candidate (total piece size desc, then expert id)
        # keep each host's K largest pieces (desc, ties to the lower expert id): a host has
        # G * S slots, plus its G home GPUs where a whole-expert piece may return
        K = min(E, G * (S + 1))
        pkey = pieces * E + (E - 1 - torch.arange(E, device=dev))
        kv, _ = torch.topk(pkey.reshape(V * H, E), K, dim=1)  # keys are unique
        porder_b = E - 1 - kv % E  # [V*H, K] expert of each piece position
        pieces = kv // E
        spare = (T[:, None] - L1).clamp(min=0).reshape(V * H, G)
        va = len(_APPORTION) * H
        cap_b = capped[:, None].expand(-1, H).reshape(-1)
        pa, pc = pieces[:va], pieces[va:]
        sa, sc = spare[:va], spare[va:]
        slot_pos, slot_a = [], []
        for _ in range(S):  # apportion candidates: S rounds, one piece per GPU per round
            eff = (pa * (pa >= self.min_piece))
            p_k, a_k = _apportion(eff, sa, cap_b)
            slot_pos.append(p_k)
            slot_a.append(a_k)
            pa = pa - torch.zeros_like(pa).scatter_add(1, p_k.clamp(min=0), a_k)
            sa = (sa - a_k).clamp(min=0)
        # cut candidates
        eff = (pc * (pc >= self.min_piece))
        pe = porder_b[va:]
        hl = torch.where(home_host[pe] == torch.arange(V * H, device=dev)[va:, None] % H,
                         home[pe] % G, -1)
        last = whole[len(_APPORTION):, None].expand(-1, H).reshape(-1)
        cpos, camt, chome = _cut_slots(eff, sc, S, hl, last)
        for k in range(S):
            slot_pos[k] = torch.cat([slot_pos[k], cpos[:, :, k]])
            slot_a[k] = torch.cat([slot_a[k], camt[:, :, k]])
            pc = pc - torch.zeros_like(pc).scatter_add(1, cpos[:, :, k].clamp(min=0),
                                                         camt[:, :, k])
        sc = (sc - camt.sum(2) - chome).clamp(min=0)
        pieces = torch.cat([pa, pc])
        spare = torch.cat([sa, sc])
        # top-up: what is left of a piece goes to GPUs of the host that already hold a slot
        # for that expert (no extra slot), up to their spare; done on the last slot column
        # only (on the others it did not change a result in our sweeps, and costs ~20 ops)
        for k in range(S - 1, S):
            p_k = slot_pos[k]
            has = p_k >= 0
            left = pieces.gather(1, p_k.clamp(min=0))  # piece remainder seen by each slot
            sp = (spare * (has))
            # cut each piece's remainder over its holders in GPU order
            key = torch.where(has, p_k, K)
            _, o = torch.sort(key, dim=1, stable=True)
            sp_o = sp.gather(1, o)
            key_o = key.gather(1, o)
            cs = sp_o.cumsum(1)
            tot = torch.zeros((V * H, K + 1), dtype=torch.long, device=dev).scatter_add(
                1, key_o, sp_o)
            start = (tot.cumsum(1) - tot).gather(1, key_o)
            incl = cs - start
            left_o = left.gather(1, o)
            give_o = (torch.minimum(incl, left_o) - (incl - sp_o)).clamp(min=0)
            give = torch.empty_like(give_o).scatter_(1, o, give_o)
            give = (give * (has))
            slot_a[k] = slot_a[k] + give
            pieces = pieces - torch.zeros_like(pieces).scatter_add(1, p_k.clamp(min=0), give)
            spare = spare - give
        slot_e = [torch.where(p >= 0, porder_b.gather(1, p.clamp(min=0)), -1) for p in slot_pos]
        slot_expert = torch.stack(slot_e, -1).reshape(V, R, S)
        slot_tokens = torch.stack(slot_a, -1).reshape(V, R, S)
        if S == 1:
            ge, gt = _greedy_one_slot(c, L, T[1], self._grouped(dev))
            slot_expert = torch.cat([slot_expert, ge[None, :, None]])
            slot_tokens = torch.cat([slot_tokens, gt[None, :, None]])
            V += 1
        # ---- per-candidate GPU loads: home load minus what replicas took, plus replica work
        moved = torch.zeros((V, E + 1), dtype=torch.long, device=dev).scatter_add(
            1, (slot_expert % (E + 1)).reshape(V, R * S), slot_tokens.reshape(V, R * S))[:, :E]
        load = torch.zeros((V, R), dtype=torch.long, device=dev).scatter_add(
            1, home.expand(V, E), c - moved) + slot_tokens.sum(2)
        best = torch.argmin(load.max(1).values, dim=0, keepdim=True)  # first min
        slot_expert = slot_expert.index_select(0, best)[0]
        slot_tokens = slot_tokens.index_select(0, best)[0]
        load = load.index_select(0, best)[0]
        moved = moved.index_select(0, best)[0]
        flow, flat, q = _split_tokens(counts, c - moved, home, slot_expert, slot_tokens, H, G)
        return TopoEPPlan(slot_expert=slot_expert, slot_tokens=slot_tokens, flow=flow,
                          copy_index=flat,
                          expert_gpu=q, load=load, home_load=L, candidate=best[0],
                          hosts=H, gpus_per_host=G)


def _greedy_one_slot(c: torch.Tensor, L: torch.Tensor, T: torch.Tensor, grouped: torch.Tensor):
    """Sequential greedy for one replica slot per GPU: R steps, each moves tokens of the most
    loaded GPU's largest remaining home expert into the free slot with the most room (the whole
    expert if it fits, so a donor may drop below T and its own slot takes a later piece: chains).

    With one slot per GPU the batched apportion/cut candidates often strand a donor's remainder
    with no free slot that fits; this greedy reaches the optimum on most such inputs. Each step
    is ~15 small ops, so it runs only for slots_per_gpu == 1. Returns (expert [R], tokens [R])
    of each GPU's slot (-1 / 0 = empty)."""
    R, m = grouped.shape
    dev = c.device
    rem = c.index_select(0, grouped.reshape(-1)).view(R, m)  # home tokens not yet moved
    load = L.clone()
    # spare of GPUs whose slot is still free; a used slot is pushed far below any real spare
    room = T - load
    used = torch.tensor([-_BIG], device=dev)
    steps = []
    for _ in range(R):
        d = load.argmax().view(1)  # first max: ties to the lower GPU
        top, xl = rem.index_select(0, d).max(1)  # the donor's largest remaining expert
        s, r = room.max(0, keepdim=True)
        amt = torch.minimum(top, s).clamp(min=0) * (load.index_select(0, d) > T)
        rem.index_put_((d, xl), -amt, accumulate=True)
        load.index_add_(0, d, -amt)
        load.index_add_(0, r, amt)
        room.index_add_(0, d, amt)
        room.index_add_(0, r, torch.where(amt > 0, used - amt, 0))
        steps.append(torch.stack([r, d * m + xl, amt]))
    r, xg, amt = torch.cat(steps, 1)
    # every GPU's slot is filled at most once; steps that moved nothing write a spare column
    dst = torch.where(amt > 0, r, R)
    expert = torch.full((R + 1,), -1, dtype=torch.long, device=dev).scatter_(
        0, dst, grouped.reshape(-1).index_select(0, xg))
    tokens = torch.zeros(R + 1, dtype=torch.long, device=dev).scatter_(0, dst, amt)
    return expert[:R], tokens[:R]


def _split_tokens(counts, home_amt, home, slot_expert, slot_tokens, H: int, G: int):
    """tokens[r, e, g]: per expert, sources fill the copies on their own host first
    (north-west-corner cut inside each host), only the remainder crosses hosts.

    Works on the list of copies (E home copies + R*S slot copies), so the cost is O(R * C)
    plus writing the [R, E, R] result."""
    R, E = counts.shape
    S = slot_expert.shape[1]
    dev = counts.device
    gpu = torch.cat([home, torch.arange(R * S, device=dev) // S])  # [C]
    exp = torch.cat([torch.arange(E, device=dev), slot_expert.reshape(-1) % (E + 1)])
    # int32 inside (token counts per layer < 2**31): half the memory traffic
    amt = torch.cat([home_amt, slot_tokens.reshape(-1)]).to(torch.int32)
    ghost = gpu // G
    # order copies by (expert, host, gpu); empty slots (expert E) go last
    key = (exp * H + ghost) * R + gpu
    _, order = torch.sort(key, stable=True)
    gpu, exp, amt, ghost = (t.index_select(0, order) for t in (gpu, exp, amt, ghost))
    # work in [copy, source rank] layout (row gathers are fast); expert E = empty slot
    cnt = torch.cat([counts.t().to(torch.int32),
                     torch.zeros((1, R), dtype=torch.int32, device=dev)])  # [E+1, R]
    src_host = torch.arange(R, device=dev) // G
    # -- pass 1: inside each host. Supply of source r (host h) for expert e, cumulated in host.
    a_in = cnt.view(E + 1, H, G).cumsum(2, dtype=torch.int32).view(E + 1, R)  # inclusive, per host
    a_in_prev = a_in - cnt
    sup_tot = a_in.view(E + 1, H, G)[:, :, G - 1]  # [E+1, H]
    # copy amounts cumulated inside their (expert, host) group
    eh = exp * H + ghost  # group id, sorted ascending
    dem_eh = torch.zeros((E + 1) * H, dtype=amt.dtype, device=dev).scatter_add(0, eh, amt)
    grp_start = dem_eh.cumsum(0, dtype=torch.int32) - dem_eh
    b_in = amt.cumsum(0, dtype=torch.int32) - grp_start.index_select(0, eh)  # inclusive within group
    lim = torch.minimum(sup_tot.reshape(-1), dem_eh).index_select(0, eh)  # [C]
    hi = torch.minimum(torch.minimum(a_in.index_select(0, exp), b_in[:, None]), lim[:, None])
    lo = torch.maximum(a_in_prev.index_select(0, exp), (b_in - amt)[:, None])
    flow = (hi - lo).clamp(min=0)  # [C, R]
    if H > 1:
        flow = flow * (ghost[:, None] == src_host[None, :])
        # -- pass 2: the remainder, across hosts (north-west corner per expert)
        cnt2 = cnt - torch.zeros_like(cnt).index_add_(0, exp, flow)
        amt2 = amt - flow.sum(1, dtype=torch.int32)
        a2 = cnt2.cumsum(1, dtype=torch.int32)
        dem_e = torch.zeros(E + 1, dtype=amt.dtype, device=dev).scatter_add(0, exp, amt2)
        b2 = amt2.cumsum(0, dtype=torch.int32) - (dem_e.cumsum(0, dtype=torch.int32) - dem_e).index_select(0, exp)
        hi2 = torch.minimum(a2.index_select(0, exp), b2[:, None])
        lo2 = torch.maximum((a2 - cnt2).index_select(0, exp), (b2 - amt2)[:, None])
        flow = flow + (hi2 - lo2).clamp(min=0)
    flow = flow.t()  # [R, C] (a view)
    # empty slots carry no tokens: fold their (zero) flow onto a real index
    flat = exp.clamp(max=E - 1) * R + gpu
    q = torch.zeros(E * R, dtype=torch.long, device=dev).scatter_add(0, flat, amt.long())
    return flow, flat, q.view(E, R)


def plan(counts: torch.Tensor, hosts: int, gpus_per_host: int, slots_per_gpu: int,
         placement: torch.Tensor | None = None, min_piece: int = 1) -> TopoEPPlan:
    """Plan replicas and token routing for one layer/microbatch (see module docstring).

    counts: LongTensor [R, E], tokens rank r routes to expert e (R = hosts * gpus_per_host).
    placement: LongTensor [E], home GPU of each expert (default: contiguous blocks).
    Returns a :class:`TopoEPPlan` with ``slot_expert`` [R, slots_per_gpu] and ``tokens``
    [R, E, R] on counts' device.
    """
    if not isinstance(counts, torch.Tensor) or counts.dim() != 2:
        raise ValueError("topoep: counts must be a 2-D LongTensor [R, E]")
    planner = TopoEPPlanner(counts.shape[1], hosts, gpus_per_host, slots_per_gpu, placement,
                            min_piece=min_piece)
    return planner(counts)
