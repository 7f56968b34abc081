"""TopoEPMoE's slow path: apply the re-placement policy between steps and move the rows.

``rebalance(optimizer=...)`` (or, with a bound optimizer, a hook after each of its steps)
asks the policy whether a re-placement is due; if so the ``HomeReplacer`` computes a new
placement from the window of gathered counts (the same bits on every rank) and one
fixed-shape all_to_all moves every expert row whose home changes: its weights, its gradients
if any, and the optimizer state that belongs to it (Adam's moments, ...), so training
continues exactly as if nothing had moved. Nothing here reads the device from the host,
except the threshold policy's one flag in padded mode (exact mode reads it with the split
sizes it reads anyway).
"""
from __future__ import annotations

import torch

from .migrate import exchange_plan, move_rows
from .policy import ReplacementClock, ReplacementPolicy
from .replace import HomeReplacer


class ReplacementMixin:
    """Re-placement methods of ``TopoEPMoE`` (which provides the experts, the group and the
    row buffers ``logical_at`` / ``phys_of``)."""

    def _init_replacement(self, policy, optimizer):
        self.replacement, self._optimizer, self._hook = policy, None, None
        self.clock = self.replacer = None
        self._due_host, self._due_dev = False, None
        self.last_replacement: dict | None = None
        if policy is None:
            if optimizer is not None:
                raise ValueError("topoep: TopoEPMoE optimizer= is used to move optimizer state "
                                 "on re-placement; pass replacement=ReplacementPolicy(...) "
                                 "too")
            return
        if not isinstance(policy, ReplacementPolicy):
            raise TypeError(f"topoep: replacement must be a topoep.ReplacementPolicy, got "
                            f"{type(policy).__name__}")
        if not self.balance:
            raise ValueError("topoep: replacement needs balance=True (the re-placement is "
                             "judged by the imbalance the fast path leaves)")
        self.clock = ReplacementClock(policy, self.num_experts)
        self.replacer = HomeReplacer(self.num_experts, self.hosts, self.gpus_per_host,
                                     self.slots, max_moves=policy.max_moves,
                                     pair_cap=policy.pair_cap, tolerance=policy.tolerance,
                                     min_gain=policy.min_gain, horizon=policy.horizon)
        if optimizer is not None:
            self.bind_optimizer(optimizer)

    # ------------------------------------------------------------------ views
    @property
    def owned(self) -> list:
        """The user's experts this rank holds now, in row order (reads the device)."""
        m = self.experts_per_rank
        return self.logical_at[self.rank * m:(self.rank + 1) * m].tolist()

    @property
    def placement(self) -> torch.Tensor:
        """LongTensor [E]: home rank of each of the user's experts now."""
        return self.phys_of // self.experts_per_rank

    def expert_named_parameters(self) -> list:
        """(name, parameter) of this rank's expert rows."""
        if self.experts is None:
            return [(n, getattr(self, n)) for n in self._names]
        return [(f"experts.{n}", p) for n, p in self.experts.named_parameters()]

    # ------------------------------------------------------------------ optimizer
    def _check_optimizer(self, optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"topoep: rank {self.rank}: optimizer must be a "
                            f"torch.optim.Optimizer, got {type(optimizer).__name__}")
        have = {id(p) for g in optimizer.param_groups for p in g["params"]}
        missing = [n for n, p in self.expert_named_parameters() if id(p) not in have]
        if missing:
            raise ValueError(
                f"topoep: rank {self.rank}: the optimizer does not own the expert parameters "
                f"{', '.join(missing[:6])}{' ...' if len(missing) > 6 else ''} of this "
                "TopoEPMoE, so a re-placement could not move their state; build it over the "
                "wrapper's parameters (e.g. model.parameters() after attach)")

    def bind_optimizer(self, optimizer) -> None:
        """Apply the policy after each ``optimizer.step()``, moving its state with the rows.
        The optimizer must own this layer's expert parameters (checked here)."""
        if self.replacer is None:
            raise ValueError("topoep: bind_optimizer needs a replacement policy")
        self._check_optimizer(optimizer)
        if self._hook is not None:
            self._hook.remove()
        self._optimizer = optimizer
        self._hook = optimizer.register_step_post_hook(lambda *_: self.rebalance())

    # ------------------------------------------------------------------ steps
    def _record_step(self, counts: torch.Tensor, plan):
        """After the plan of a training step: record the step; the threshold policy's device
        flag (None for every-K, in eval mode or without a policy)."""
        if self.clock is None or not self.training:
            return None
        if self.clock.loads.device != counts.device:
            self.clock.to(counts.device)
        self.clock.record(counts.sum(0).index_select(0, self.phys_of), plan.imbalance())
        self._due_dev = self.clock.due_flag()
        return self._due_dev

    def rebalance(self, optimizer=None, force: bool = False) -> dict | None:
        """Between steps: re-place home experts if the policy says so (``force``: now).

        Moves the expert rows' weights, gradients and the state ``optimizer`` (or the bound
        one) keeps for them. Returns None when nothing was due, else the re-placement's
        stats (device tensors unless noted): ``moved`` / ``cross_host_moved`` experts,
        ``moved_bytes`` (their weights), ``exchange_bytes`` (int: what this rank's
        all_to_all sent, padding, gradients and optimizer state included), and
        ``imbalance_before`` / ``imbalance_after`` (the fast path on the window's steps).

        Rows keep their tensors and take new contents: with ``ModuleList`` experts the modules
        this rank holds (the user's own module objects) then hold the experts of their rows,
        as ``logical_at`` names them; checkpoint the wrapper (its rows and ``logical_at``)."""
        if self.replacer is None:
            raise RuntimeError("topoep: rebalance needs TopoEPMoE(..., replacement="
                               "ReplacementPolicy(...))")
        if optimizer is not None:
            self._check_optimizer(optimizer)
        else:
            optimizer = self._optimizer
        if not force:
            flag = self._due_host if self.mode == "exact" else self._due_dev
            if not self.clock.due(flag):  # (reads the padded-mode flag only when it counts)
                return None
        return self._replace(optimizer)

    def _replace(self, optimizer) -> dict:
        out = self.replacer(self.clock.window_loads().to(self.logical_at.device),
                            self.logical_at)
        send_index, take = exchange_plan(self.logical_at, out.logical_at, self.rank,
                                         self.world, self.replacer.pair_cap)
        sent = move_rows(expert_row_fields(self, optimizer), send_index, take, self.group)
        with torch.no_grad():
            self.logical_at.copy_(out.logical_at)
            self.phys_of.scatter_(0, self.logical_at, torch.arange(
                self.num_experts, device=self.phys_of.device))
        self.clock.reset()
        self.last_replacement = {
            "moved": out.moved, "cross_host_moved": out.cross_host_moved,
            "moved_bytes": out.moved * self.expert_bytes, "exchange_bytes": sent,
            "imbalance_before": out.imbalance_before, "imbalance_after": out.imbalance_after}
        return self.last_replacement


def expert_row_fields(layer, optimizer) -> list:
    """Every tensor that belongs to the layer's expert rows, as ``migrate`` fields: weights,
    gradients (if any) and per-row optimizer state. State shared by the whole tensor (a
    stacked parameter's step count) stays; anything else raises."""
    fields = []
    state = optimizer.state if optimizer is not None else {}
    where = f"topoep: rebalance on rank {layer.rank}"
    if layer.experts is None:  # stacked: one tensor [m, ...] per weight
        for name in layer._names:
            p = getattr(layer, name)
            fields.append(p)
            if p.grad is not None:
                fields.append(p.grad)
            for key, v in sorted(state.get(p, {}).items()):
                if not isinstance(v, torch.Tensor) or v.dim() == 0:
                    continue  # shared by all rows
                if v.shape != p.shape:
                    raise ValueError(f"{where}: optimizer state {key!r} of {name} has shape "
                                     f"{tuple(v.shape)}, not the parameter's "
                                     f"{tuple(p.shape)}: cannot split it by expert row")
                fields.append(v)
        return fields
    for name in layer._names:  # ModuleList: one tensor per expert and weight
        ps = [ex.get_parameter(name) for ex in layer.experts]
        fields.append(ps)
        grads = [p.grad for p in ps]
        if all(g is not None for g in grads):
            fields.append(grads)
        elif any(g is not None for g in grads):
            raise ValueError(f"{where}: some experts' {name} have a gradient and others not; "
                             "call rebalance between steps (after zero_grad) or give every "
                             "expert a gradient")
        states = [state.get(p, {}) for p in ps]
        keys = sorted(states[0])
        if any(sorted(s) != keys for s in states):
            raise ValueError(f"{where}: the optimizer keeps different state for different "
                             f"experts' {name}; step it over all experts before rebalancing")
        for key in keys:
            vs = [s[key] for s in states]
            if not isinstance(vs[0], torch.Tensor):
                if any(v != vs[0] for v in vs):
                    raise ValueError(f"{where}: optimizer state {key!r} of {name} differs "
                                     "between experts and is not a tensor")
                continue
            if vs[0].shape == ps[0].shape or vs[0].device == ps[0].device:
                fields.append(vs)  # per element, or a per-expert scalar on the device
            elif any(not torch.equal(v, vs[0]) for v in vs):  # (host tensors: no device read)
                raise ValueError(f"{where}: optimizer state {key!r} of {name} differs between "
                                 f"experts and lives on {vs[0].device}, not with the weights")
    return fields
