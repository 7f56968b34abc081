"""TopoEP around an MoE layer: ``TopoEPMoE`` (the expert-parallel module) and ``attach`` (hook).

Which layers it takes, and how it reads their experts and routing, is ``topoep.adapters``'s
business: transformers 5's MoE blocks (their ``experts`` module is replaced; the block keeps
routing), hoccl's own router layers (``SimpleMoE``: ``router``, ``top_k``, stacked ``w1, b1, w2,
b2`` or a ModuleList ``experts``; ``route(x)`` when present, else softmax then top-k), and what
``register_adapter`` adds. Beside DDP or FSDP2, see ``topoep.prepare``.

Per forward, on every rank of the process group (one rank = one "GPU" of the topology):
  1. routing counts [E] -> one all_gather -> counts [R, E];
  2. ``planner(counts)`` -> the same plan on every rank (no host sync);
  3. replicas: each slot's expert weights come from the owner (one all_to_all, even splits);
  4. dispatch: every (token, k) assignment goes to a copy of its expert as the plan says;
     ``exact``: uneven all_to_all_single after one host read of the split sizes;
     ``padded``: fixed capacity per peer, even splits, no host sync; overflow is dropped and
     counted on device (``last_stats['overflow']``);
  5. experts compute; results return by the reverse all_to_all; the source combines with
     its gate weights.
Backward runs the same collectives in reverse; replica gradients return to the owner (summed
into the owner's parameters).
"""
from __future__ import annotations

import math
import warnings
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .adapters import PROTOCOL_HINT, describe, module_caller
from .parallel import check_data_parallel_use
from .planner import TopoEPPlan, TopoEPPlanner, default_placement
from .policy import ReplacementPolicy
from .rebalance import ReplacementMixin

# --------------------------------------------------------------------------- reference MoE


class FFN(nn.Module):
    """One expert: Linear -> GELU -> Linear."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class SimpleMoE(nn.Module):
    """A plain single-process MoE layer (the reference TopoEP must reproduce)."""

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int = 2,
                 stacked: bool = True):
        super().__init__()
        self.num_experts, self.top_k, self.stacked = num_experts, top_k, stacked
        self.router = nn.Linear(d_model, num_experts, bias=False)
        if stacked:
            self.w1 = nn.Parameter(torch.randn(num_experts, d_model, d_ff) / math.sqrt(d_model))
            self.b1 = nn.Parameter(torch.randn(num_experts, d_ff) * 0.02)
            self.w2 = nn.Parameter(torch.randn(num_experts, d_ff, d_model) / math.sqrt(d_ff))
            self.b2 = nn.Parameter(torch.randn(num_experts, d_model) * 0.02)
        else:
            self.experts = nn.ModuleList(FFN(d_model, d_ff) for _ in range(num_experts))

    def route(self, x):
        probs = torch.softmax(self.router(x).float(), dim=-1)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        return idx, w.to(x.dtype)

    def expert(self, e: int, x):
        if self.stacked:
            return stacked_ffn(x, {"w1": self.w1[e], "b1": self.b1[e], "w2": self.w2[e],
                                   "b2": self.b2[e]})
        return self.experts[e](x)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        idx, w = self.route(x)
        out = torch.zeros_like(x)
        for e in range(self.num_experts):
            tok, slot = torch.where(idx == e)
            if tok.numel():
                out = out.index_add(0, tok, self.expert(e, x[tok]) * w[tok, slot, None])
        return out.reshape(shape)


def stacked_ffn(x, p):
    return F.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


# --------------------------------------------------------------------------- collectives

# torch 2.13 names it all_gather_single and deprecates all_gather_into_tensor; torch 2.11 (the
# GPU machines) has only the latter
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _A2A(torch.autograd.Function):
    """Differentiable all_to_all_single (backward = the reverse exchange)."""

    @staticmethod
    def forward(ctx, x, out_rows, out_splits, in_splits, group):
        ctx.group, ctx.in_rows = group, x.shape[0]
        ctx.out_splits, ctx.in_splits = out_splits, in_splits
        out = x.new_empty((out_rows,) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        gi = g.new_empty((ctx.in_rows,) + tuple(g.shape[1:]))
        dist.all_to_all_single(gi, g.contiguous(), ctx.in_splits, ctx.out_splits,
                               group=ctx.group)
        return gi, None, None, None, None


class _Replicate(torch.autograd.Function):
    """Owner -> replica slots of expert weights; backward sums replica grads to the owner.

    owned [E_loc + 1, P] (last row zeros), send_idx [R, S] (row of ``owned`` this rank sends
    for peer p's slot s: the owned expert's local index, or E_loc if not the owner),
    back_idx [R, S] (for each source's slot: where its gradient lands here, E_loc if not
    ours), owner_of_my_slot [S]. Even splits, no host sync."""

    @staticmethod
    def forward(ctx, owned, send_idx, back_idx, my_owner, group):
        r, s = send_idx.shape
        p = owned.shape[1]
        send = owned.index_select(0, send_idx.reshape(-1)).contiguous()  # [R*S, P]
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        ctx.save_for_backward(back_idx, my_owner)
        ctx.shape, ctx.group = (r, s, p, owned.shape[0]), group
        return recv.view(r, s, p).sum(0)  # only the owner's row is nonzero

    @staticmethod
    def backward(ctx, g):
        back_idx, my_owner = ctx.saved_tensors
        r, s, p, rows = ctx.shape
        onehot = (torch.arange(r, device=g.device)[:, None] == my_owner[None, :]).to(g.dtype)
        send = (onehot[:, :, None] * g[None]).reshape(r * s, p).contiguous()
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=ctx.group)
        grad = torch.zeros((rows, p), dtype=g.dtype, device=g.device)
        grad.index_add_(0, back_idx.reshape(-1), recv)
        grad[rows - 1] = 0
        return grad, None, None, None, None


# --------------------------------------------------------------------------- the wrapper


def home_plan(counts: torch.Tensor, placement: torch.Tensor, hosts: int,
              gpus_per_host: int) -> TopoEPPlan:
    """No balancing: every token to its expert's home (same object as a TopoEP plan)."""
    r, e = counts.shape
    tokens = torch.zeros((r, e, r), dtype=torch.long, device=counts.device)
    tokens.scatter_(2, placement.to(counts.device).expand(r, e)[:, :, None], counts[:, :, None])
    load = tokens.sum((0, 1))
    return TopoEPPlan(slot_expert=torch.full((r, 1), -1, dtype=torch.long, device=counts.device),
                      slot_tokens=torch.zeros((r, 1), dtype=torch.long, device=counts.device),
                      tokens=tokens, expert_gpu=tokens.sum(0), load=load, home_load=load,
                      candidate=torch.zeros((), dtype=torch.long), hosts=hosts,
                      gpus_per_host=gpus_per_host)


def group_hosts(group=None) -> int:
    """How many hosts a group's ranks sit on, from a hoccl group's host table: hosts x ranks per
    host when every host holds the same number of consecutive ranks (the layout TopoEP plans
    for), else 1 (flat) with a warning; 1 for groups of other backends."""
    pg = group or dist.distributed_c10d._get_default_group()
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except (RuntimeError, ValueError):
        return 1
    if not hasattr(backend, "hosts"):
        return 1
    ranks_of = backend.hosts()
    width = len(ranks_of[0])
    if all(r == list(range(h * width, (h + 1) * width)) for h, r in enumerate(ranks_of)):
        return len(ranks_of)
    warnings.warn(f"topoep: the group's hosts hold ranks {ranks_of}, not equal consecutive blocks; "
                  "planning as one host (pass hosts= to override)", stacklevel=3)
    return 1


class TopoEPMoE(ReplacementMixin, nn.Module):
    """Expert-parallel execution of a standard MoE layer with TopoEP balancing.

    Every rank passes the same full ``moe`` (same weights, e.g. same seed or loaded
    checkpoint); the wrapper keeps the router and this rank's experts (its home experts under
    ``placement``). ``forward(x)`` takes this rank's tokens and returns their outputs.

    Home experts live in physical rows: row p is local row p % m of rank p // m (m = E / world).
    ``logical_at`` [E] is the user's expert at each row, ``phys_of`` its inverse; the router's
    expert ids stay the user's and are mapped to rows on the way in, so a re-placement
    (``rebalance``) only permutes rows. Plans (``last_plan``) are in row ids.

    Args:
      hosts: number of hosts in the topology (world = hosts x gpus_per_host); default: the
        group's own hosts on hoccl (``group_hosts``), 1 otherwise.
      slots_per_gpu: replica slots per rank (>= 1), or give ``budget_bytes`` (bytes of expert
        weights per rank for replicas; must hold at least one expert).
      mode: ``"exact"`` or ``"padded"`` (then ``capacity``: rows per peer per layer, default
        ceil(2 * tokens * top_k / world)).
      balance: False runs the same dispatch with no replicas (the "none" baseline).
      replacement: a ``ReplacementPolicy``: the slow path moves home experts when it says
        (see ``rebalance``); needs ``balance=True``.
      optimizer: the optimizer that trains the expert parameters; the policy is then applied
        after each of its steps, moving its state with the rows (see ``bind_optimizer``).
    """

    def __init__(self, moe: nn.Module, group=None, hosts: int | None = None, slots_per_gpu: int | None = None,
                 budget_bytes: int | None = None, mode: str = "exact", capacity: int | None = None,
                 placement: torch.Tensor | None = None, balance: bool = True,
                 min_piece: int = 1, replacement: ReplacementPolicy | None = None,
                 optimizer: torch.optim.Optimizer | None = None,
                 adapter: Callable | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("topoep: TopoEPMoE needs an initialized torch.distributed group")
        if mode not in ("exact", "padded"):
            raise ValueError(f"topoep: mode must be 'exact' or 'padded', got {mode!r}")
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if hosts is None:
            hosts = group_hosts(group)
        if self.world % hosts:
            raise ValueError(f"topoep: world size {self.world} is not divisible by hosts={hosts}")
        self.hosts, self.gpus_per_host = hosts, self.world // hosts
        spec = describe(moe) if adapter is None else adapter(moe)
        self.kind = spec.kind
        self.num_experts = E = spec.num_experts
        self.top_k = spec.top_k
        if spec.router is not None:
            self.router = spec.router
        self._route: Callable | None = spec.route
        self._install, self._export_prefix = spec.install, spec.export_prefix
        self._export = spec.export
        m = self.experts_per_rank = E // self.world
        if placement is None:
            default_placement(E, self.world)  # raises if not divisible
            logical_at = torch.arange(E)
        else:  # checked by the planner's own placement checks
            TopoEPPlanner(E, self.hosts, self.gpus_per_host, 1, placement, jit=False)
            logical_at = torch.sort(placement.detach().cpu(), stable=True).indices
        # the current placement is state: a checkpoint must know which expert each row holds
        self.register_buffer("logical_at", logical_at)
        self.register_buffer("phys_of", torch.empty_like(logical_at).scatter_(
            0, logical_at, torch.arange(E)))
        self.register_buffer("_home_gpu", torch.arange(E) // m, persistent=False)  # row -> rank
        owned = logical_at[self.rank * m:(self.rank + 1) * m].tolist()
        self._hold_experts(spec, owned)
        if slots_per_gpu is None:
            if budget_bytes is None:
                slots_per_gpu = 2
            else:
                slots_per_gpu = int(budget_bytes) // self.expert_bytes
                if slots_per_gpu < 1:
                    raise ValueError(f"topoep: replica budget too small: {budget_bytes} bytes "
                                     f"cannot hold one expert ({self.expert_bytes} bytes)")
        self.balance = balance
        self.slots = slots_per_gpu
        self.planner = TopoEPPlanner(E, self.hosts, self.gpus_per_host, slots_per_gpu,
                                     min_piece=min_piece) if balance else None
        self.mode, self.capacity = mode, capacity
        self.last_stats: dict = {}
        self.last_plan: TopoEPPlan | None = None
        # fully_shard replaces parameters it shards: the ones we made tell them apart
        self._expert_ids = frozenset(id(p) for _, p in self.expert_named_parameters())
        self._init_replacement(replacement, optimizer)

    def _hold_experts(self, spec, owned: list) -> None:
        """This rank's experts (``owned``, in row order) as parameters of the wrapper, and the
        flat view [E_loc, P] the replica and dispatch code works on."""
        if spec.stacked:
            oi = torch.tensor(owned)
            for n, t in spec.stacked.items():
                if hasattr(self, n):
                    raise TypeError(f"topoep: the experts' tensor name {n!r} clashes with an "
                                    "attribute of TopoEPMoE; " + PROTOCOL_HINT)
                setattr(self, n, nn.Parameter(t.detach()[oi].clone(),
                                              requires_grad=t.requires_grad))
            self._names = list(spec.stacked)
            self._shapes = [tuple(getattr(self, n).shape[1:]) for n in self._names]
            self._fn = spec.fn
            self.experts = None
        else:
            self.experts = nn.ModuleList(spec.modules[e] for e in owned)
            template = spec.modules[0]
            self._names = [n for n, _ in template.named_parameters()]
            self._shapes = [tuple(p.shape) for _, p in template.named_parameters()]
            self._fn = spec.fn or module_caller(template)
        self._numel = [math.prod(s) for s in self._shapes]
        self.expert_numel = sum(self._numel)
        first = (getattr(self, self._names[0]) if self.experts is None
                 else next(self.experts.parameters()))
        self.expert_bytes = self.expert_numel * first.element_size()

    # ------------------------------------------------------------------ pieces
    def _owned_flat(self):
        if self.experts is None:
            parts = [getattr(self, n).reshape(self.experts_per_rank, -1) for n in self._names]
            return torch.cat(parts, 1)
        return torch.stack([torch.cat([p.reshape(-1) for p in ex.parameters()])
                            for ex in self.experts])

    def _unflat(self, v):
        out, o = {}, 0
        for n, s, k in zip(self._names, self._shapes, self._numel):
            out[n] = v[o:o + k].view(s)
            o += k
        return out

    @property
    def local_index(self) -> torch.Tensor:
        """Row -> this rank's local row (-1: another rank's). Derived, never a buffer: it
        differs between ranks, and DDP broadcasts rank 0's buffers to every rank."""
        m = self.experts_per_rank
        rows = torch.arange(self.num_experts, device=self._home_gpu.device)
        return torch.where(self._home_gpu == self.rank, rows % m, -1)

    def route(self, x):
        if self._route is not None:
            return self._route(x)
        if getattr(self, "router", None) is None:
            raise TypeError(f"topoep: rank {self.rank}: this TopoEPMoE wraps {self.kind}, "
                            "which routes in its own forward: call it as "
                            "(hidden_states, top_k_index, top_k_weights)")
        probs = torch.softmax(self.router(x).float(), dim=-1)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        return idx, w.to(x.dtype)

    def make_plan(self, counts: torch.Tensor) -> TopoEPPlan:
        if self.balance:
            return self.planner(counts)
        return home_plan(counts, self._home_gpu, self.hosts, self.gpus_per_host)

    # ------------------------------------------------------------------ checkpoints
    def gather_experts(self) -> dict:
        """Every expert's weights in the user's expert order, gathered from all ranks (a
        collective: every rank of the group calls it): stacked name -> [E, ...], or for
        ModuleList experts ``"{e}.{param}"`` -> tensor. Replica slots play no part."""
        with torch.no_grad():
            flat = self._owned_flat().detach().contiguous()
            rows = flat.new_empty((self.world * flat.shape[0], flat.shape[1]))
            all_gather_single(rows, flat, group=self.group)
            full = rows.index_select(0, self.phys_of.to(rows.device))  # [E, P] user order
        out, o = {}, 0
        for n, s, k in zip(self._names, self._shapes, self._numel):
            part = full[:, o:o + k]
            o += k
            if self.experts is None:
                out[n] = part.reshape((self.num_experts,) + s).clone()
            else:
                out.update({f"{e}.{n}": part[e].reshape(s).clone()
                            for e in range(self.num_experts)})
        return self._export(out) if self._export is not None else out

    # ------------------------------------------------------------------ forward
    def forward(self, x, top_k_index=None, top_k_weights=None):
        """``x`` [..., d]; routing from the layer's own router, or as given (``top_k_index``
        and ``top_k_weights`` [n, k], the call transformers 5's blocks make to experts)."""
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        dev, E, R, me = x.device, self.num_experts, self.world, self.rank
        check_data_parallel_use(self)
        local_index = self.local_index
        if top_k_index is None:
            idx, gate = self.route(x)
        else:
            idx, gate = top_k_index.reshape(x.shape[0], -1), top_k_weights.reshape(
                x.shape[0], -1)
        n, k = idx.shape
        e_a = self.phys_of.index_select(0, idx.reshape(-1))  # the user's ids -> home rows
        local_counts = torch.zeros(E, dtype=torch.long, device=dev).scatter_add_(
            0, e_a, torch.ones_like(e_a))
        counts = torch.empty(R * E, dtype=torch.long, device=dev)
        all_gather_single(counts, local_counts, group=self.group)
        counts = counts.view(R, E)
        plan = self.make_plan(counts)
        self.last_plan = plan
        due = self._record_step(counts, plan)  # (device flag for the threshold policy)

        # ---- weights of this rank's copies: owned experts, then replica slots
        owned = self._owned_flat()
        e_loc = owned.shape[0]
        slot_e = plan.slot_expert  # [R, S]
        S = slot_e.shape[1] if self.balance else 0
        weights = owned
        if self.balance:
            owner = torch.where(slot_e >= 0, self._home_gpu[slot_e.clamp(min=0)], -1)
            mine = owner == me
            loc = local_index[slot_e.clamp(min=0)]
            send_idx = torch.where(mine, loc, e_loc)
            owned_pad = torch.cat([owned, owned.new_zeros((1, owned.shape[1]))])
            if self.mode == "padded":  # even splits, no host sync
                replicas = _Replicate.apply(owned_pad, send_idx, send_idx, owner[me],
                                            self.group)
                weights = torch.cat([owned, replicas])  # [E_loc + S, P]
        # weight row used here for expert e (home row, else first slot holding it, else -1)
        widx = local_index.clone()
        if self.balance:
            for s in reversed(range(S)):
                es = slot_e[me, s]
                hit = (torch.arange(E, device=dev) == es) & (widx < 0)
                widx = torch.where(hit, e_loc + s, widx)

        # ---- order my (token, k) assignments by (destination, expert, rank within expert)
        tok_a = torch.arange(n * k, device=dev) // k  # token of each assignment
        _, o1 = torch.sort(e_a, stable=True)
        es = e_a[o1]
        start = local_counts.cumsum(0) - local_counts
        r_a = torch.arange(n * k, device=dev) - start[es]
        sent = plan.sent_by(me)  # [E, R]
        cum_g = sent.cumsum(1)
        dest = torch.searchsorted(cum_g[es], r_a[:, None], right=True)[:, 0]
        _, o2 = torch.sort(dest * E + es, stable=True)
        order = o1[o2]
        dest = dest[o2]
        rows = x.index_select(0, tok_a[order])
        send_cnt = sent.sum(0)  # [R] rows to each peer
        recv_cnt_se = plan.received_by(me)  # [R(src), E]

        if self.mode == "exact":
            nw = e_loc + S
            per_w = torch.zeros(nw + 1, dtype=torch.long, device=dev).scatter_add_(
                0, torch.where(widx >= 0, widx, nw), recv_cnt_se.sum(0))[:nw]
            if self.balance:  # replica weights: only the owners' rows travel
                w_in = mine.sum(1)  # [R] rows I send to each rank
                w_out = torch.zeros(R, dtype=torch.long, device=dev).scatter_add_(
                    0, owner[me].clamp(min=0), (owner[me] >= 0).long())
            else:
                w_in = w_out = torch.zeros(R, dtype=torch.long, device=dev)
            extra = [] if due is None else [due.long().view(1)]
            meta = torch.cat([send_cnt, recv_cnt_se.sum(1), w_in, w_out, per_w] + extra
                             ).tolist()
            # ^ the one host read of this layer (the re-placement flag rides along)
            if due is not None:
                self._due_host = bool(meta.pop())
            in_splits, out_splits = meta[:R], meta[R:2 * R]
            w_in_h, w_out_h, per_w = meta[2 * R:3 * R], meta[3 * R:4 * R], meta[4 * R:]
            if self.balance:
                ar = torch.arange(R * S, device=dev)
                _, so = torch.sort(torch.where(mine.reshape(-1), ar, R * S + ar))
                send_rows = send_idx.reshape(-1).index_select(0, so[:sum(w_in_h)])
                wsend = owned_pad.index_select(0, send_rows)
                wrecv = _A2A.apply(wsend, sum(w_out_h), w_out_h, w_in_h, self.group)
                s_ar = torch.arange(S, device=dev)
                om = owner[me]
                _, ro = torch.sort(torch.where(om >= 0, om * S + s_ar, R * S + s_ar))
                replicas = owned.new_zeros((S, owned.shape[1])).index_copy(
                    0, ro[:sum(w_out_h)], wrecv)
                weights = torch.cat([owned, replicas])
            recv = _A2A.apply(rows, sum(out_splits), out_splits, in_splits, self.group)
            row_w = torch.repeat_interleave(widx.repeat(R), recv_cnt_se.reshape(-1),
                                            output_size=recv.shape[0])
            _, ow = torch.sort(row_w, stable=True)
            xs = recv.index_select(0, ow)
            outs, o = [], 0
            for j, c in enumerate(per_w):
                if c:
                    outs.append(self._fn(xs[o:o + c], self._unflat(weights[j])))
                    o += c
            ys = torch.cat(outs) if outs else recv.new_zeros((0, recv.shape[1]))
            y = torch.zeros_like(recv).index_copy(0, ow, ys) if recv.shape[0] else recv
            back = _A2A.apply(y, rows.shape[0], in_splits, out_splits, self.group)
            overflow = torch.zeros((), dtype=torch.long, device=dev)
        else:
            cap = self.capacity or max(1, math.ceil(2 * n * k / R))
            blk = torch.cumsum(send_cnt, 0) - send_cnt
            pos = torch.arange(n * k, device=dev) - blk[dest]
            keep = pos < cap
            slot = torch.where(keep, dest * cap + pos, R * cap)
            send = torch.zeros((R * cap + 1, x.shape[1]), dtype=x.dtype, device=dev)
            send = send.index_add(0, slot, rows)[:R * cap]
            overflow = (send_cnt - cap).clamp(min=0).sum()
            recv = _A2A.apply(send, R * cap, None, None, self.group)
            # expert of each received row from its position inside the source's block
            cum_e = recv_cnt_se.cumsum(1)  # [R, E]
            i = torch.arange(cap, device=dev)
            e_row = torch.searchsorted(cum_e, i.expand(R, cap).contiguous(), right=True)
            valid = e_row < E
            w_row = torch.where(valid, widx[e_row.clamp(max=E - 1)], -1).reshape(-1)
            y = torch.zeros_like(recv)
            for j in range(e_loc + S):
                m = (w_row == j).to(recv.dtype)[:, None]
                y = y + m * self._fn(recv, self._unflat(weights[j]))
            back_all = _A2A.apply(y, R * cap, None, None, self.group)
            back_all = torch.cat([back_all, back_all.new_zeros((1, x.shape[1]))])
            back = back_all.index_select(0, slot)
        # ---- combine at the source with the gate weights
        g_a = gate.reshape(-1)[order]
        # the gate multiplies in the promoted dtype, then rounds to x's, as the models do
        out = torch.zeros_like(x).index_add(0, tok_a[order],
                                            (back * g_a[:, None]).to(x.dtype))
        self.last_stats = {
            "imbalance": plan.imbalance(),
            "home_imbalance": _imb(plan.home_load),
            "overflow": overflow,
            "replicas": plan.num_replicas() if self.balance else torch.zeros(()),
            "replica_bytes": (plan.num_replicas() * self.expert_bytes) if self.balance
            else torch.zeros(()),
            "tokens_moved": plan.tokens_moved_off_home() if self.balance else torch.zeros(()),
        }
        return out.reshape(shape)


def _imb(load):
    load = load.to(torch.float64)
    return load.max() / load.mean().clamp(min=1e-30)


def attach(module: nn.Module, group=None, **kwargs):
    """Hook TopoEP into MoE layers in place; returns the wrapper (``module`` is one layer) or
    the list of wrappers (``module`` holds MoE layers, e.g. a whole transformers model).

    How each layer is hooked depends on its kind (``topoep.adapters``): a layer that routes in
    its own forward (transformers 5's MoE blocks) gets its ``experts`` replaced by the wrapper,
    so its routing, shared experts and jitter stay its own; a router layer (``SimpleMoE``)
    has its forward replaced and its full expert tensors dropped (the wrapper, registered as
    ``layer.topoep``, holds this rank's rows). Keyword arguments go to ``TopoEPMoE``."""
    if isinstance(module, TopoEPMoE) or isinstance(getattr(module, "topoep", None), TopoEPMoE) \
            or isinstance(getattr(module, "experts", None), TopoEPMoE):
        raise ValueError(f"topoep: {type(module).__name__} already runs TopoEP")
    from .adapters import is_moe_layer
    if is_moe_layer(module):
        return _attach_one(module, group, kwargs)
    layers = moe_layers(module)
    if not layers:
        describe(module)  # raises, naming what each adapter looked for
    return [_attach_one(layer, group, kwargs) for layer in layers]


def _attach_one(layer, group, kwargs):
    wrapper = TopoEPMoE(layer, group=group, **kwargs)
    wrapper._install(layer, wrapper)
    return wrapper


def moe_layers(model: nn.Module) -> list:
    """The outermost MoE layers TopoEP recognises inside ``model``, in module order."""
    from .adapters import is_moe_layer
    found, inside = [], []
    for name, mod in model.named_modules():
        if any(name.startswith(p + ".") for p in inside) or isinstance(mod, TopoEPMoE):
            continue
        if is_moe_layer(mod):
            found.append(mod)
            inside.append(name)
    return found
