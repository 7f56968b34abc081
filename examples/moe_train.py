"""MoE training on CPU ranks with TopoEP expert balancing (expert parallel + data parallel).

    torchrun --nproc_per_node=4 examples/moe_train.py                 # hoccl, TopoEP on
    torchrun --nproc_per_node=4 examples/moe_train.py --no-topoep     # hoccl, no balancing
    torchrun --nproc_per_node=4 examples/moe_train.py --backend gloo  # same on gloo
    torchrun --nproc_per_node=4 examples/moe_train.py --hot-experts 4 --replace-every 4
    torchrun --nproc_per_node=2 examples/moe_train.py --hf qwen3_moe   # a transformers model
        # skew on the experts of half the ranks: the slow path moves home experts every 4
        # steps (Adam's state moves with them), on top of the per-step replicas

Each rank holds E / world experts (expert parallel) and a copy of the dense layers and the
router (data parallel: their gradients are averaged with all_reduce). The router starts biased
towards a few hot experts (``--skew``), so without balancing the hot experts' owners do most
of the work. Every step prints the loss, the GPU-load imbalance (max/mean tokens per rank
after TopoEP's rerouting, and what it would be without), and the step time. With
``--replace-every K`` or ``--replace-threshold T`` the layer also re-places home experts
between steps (after ``opt.step()``, through the optimizer it is bound to) and prints each
re-placement.

``--hf FAMILY`` (mixtral, qwen2_moe, qwen3_moe, olmoe, deepseek_v3) trains a tiny transformers
causal LM of that family instead (built from a config, random weights): ``topoep.attach`` on
the whole model, ``topoep.prepare`` and DDP, next-token loss on random tokens whose router
rows are biased towards a few hot experts; imbalance is the mean over its MoE layers.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import topoep
from topoep.moe import SimpleMoE


class Net(nn.Module):
    def __init__(self, d_in, d_model, d_ff, experts, top_k):
        super().__init__()
        self.inp = nn.Linear(d_in, d_model)
        self.moe = SimpleMoE(d_model, d_ff, experts, top_k, stacked=True)
        self.out = nn.Linear(d_model, 1)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return self.out(h + self.moe(h)).squeeze(-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="hoccl", help="hoccl (default) or gloo")
    ap.add_argument("--topoep", dest="topoep", action="store_true", default=True)
    ap.add_argument("--no-topoep", dest="topoep", action="store_false",
                    help="run the same expert-parallel layer without balancing")
    ap.add_argument("--mode", choices=["exact", "padded"], default="exact")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per rank per step")
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--d-ff", type=int, default=512)
    ap.add_argument("--slots", type=int, default=2, help="replica slots per rank")
    ap.add_argument("--hosts", type=int, default=None,
                    help="hosts in the topology (default: the group's hosts on hoccl, else 1)")
    ap.add_argument("--skew", type=float, default=2.0, help="router bias towards hot experts")
    ap.add_argument("--hot-experts", type=int, default=None,
                    help="experts the router is biased towards (default experts // 8); the "
                         "first ones, homed on the first ranks")
    ap.add_argument("--replace-every", type=int, default=None, metavar="K",
                    help="re-place home experts every K steps (TopoEP's slow path)")
    ap.add_argument("--replace-threshold", type=float, default=None, metavar="T",
                    help="re-place when the imbalance after replication stays above T for "
                         "--replace-window steps")
    ap.add_argument("--replace-window", type=int, default=4, metavar="W")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hf", default=None, metavar="FAMILY",
                    help="train a tiny transformers MoE LM of this family (e.g. qwen3_moe)")
    ap.add_argument("--seq", type=int, default=64, help="with --hf: tokens per sequence")
    args = ap.parse_args()
    if args.hf:
        return train_hf(args)

    torch.set_num_threads(args.threads)
    if args.backend == "hoccl":
        import hoccl_backend  # noqa: F401  (registers the "hoccl" backend)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # same initial weights on every rank
    d_in = 32
    net = Net(d_in, args.d_model, args.d_ff, args.experts, args.top_k)
    with torch.no_grad():  # a few hot experts: bias their router rows towards the data mean
        for j in range(args.hot_experts or max(1, args.experts // 8)):
            net.moe.router.weight[j].add_(torch.full((args.d_model,), args.skew / args.d_model))
    policy = None
    if args.replace_every is not None:
        policy = topoep.ReplacementPolicy(every=args.replace_every)
    elif args.replace_threshold is not None:
        policy = topoep.ReplacementPolicy(threshold=args.replace_threshold,
                                          window=args.replace_window)
    layer = topoep.attach(net.moe, hosts=args.hosts, slots_per_gpu=args.slots, mode=args.mode,
                          capacity=2 * args.tokens * args.top_k // world,
                          balance=args.topoep, replacement=policy)
    dense = [p for n, p in net.named_parameters() if not n.startswith("moe.")] + \
        list(layer.router.parameters())
    experts = [p for n, p in layer.named_parameters() if not n.startswith("router.")]
    opt = torch.optim.Adam(dense + experts, lr=args.lr)
    if policy is not None:
        layer.bind_optimizer(opt)  # the policy runs after each opt.step(), moving Adam's state
    target_w = torch.randn(d_in, generator=torch.Generator().manual_seed(1))

    gen = torch.Generator().manual_seed(1000 + rank)
    times, imbs, homes = [], [], []
    if rank == 0:
        print(f"backend={args.backend} world={world} experts={args.experts} top_k={args.top_k} "
              f"tokens/rank={args.tokens} topoep={'on' if args.topoep else 'off'} "
              f"mode={args.mode} slots={args.slots} hosts={layer.hosts}", flush=True)
    for step in range(args.steps):
        x = torch.randn(args.tokens, d_in, generator=gen) + 1.0
        y = torch.tanh(x @ target_w / d_in ** 0.5)
        dist.barrier()
        t0 = time.perf_counter()
        loss = ((net(x) - y) ** 2).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        for p in dense:  # data-parallel parts: average
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        for p in experts:  # expert grads already hold every rank's contribution
            p.grad.div_(world)
        opt.step()
        dist.barrier()
        dt = (time.perf_counter() - t0) * 1e3
        st = layer.last_stats
        rep, layer.last_replacement = layer.last_replacement, None
        if rep is not None and rank == 0:
            print(f"  re-placement after step {step}: {int(rep['moved'])} experts moved "
                  f"({int(rep['moved_bytes']) / 1e6:.1f} MB of weights; the exchange sent "
                  f"{rep['exchange_bytes'] / 1e6:.1f} MB per rank with gradients and Adam "
                  f"state), fast path on the window {float(rep['imbalance_before']):.3f} -> "
                  f"{float(rep['imbalance_after']):.3f}", flush=True)
        lv = loss.detach().clone()
        dist.all_reduce(lv)
        if rank == 0:
            imb, home = float(st["imbalance"]), float(st["home_imbalance"])
            times.append(dt)
            imbs.append(imb)
            homes.append(home)
            print(f"step {step:3d} loss {float(lv) / world:.4f} imbalance {imb:.3f} "
                  f"(none: {home:.3f}) replicas {int(st['replicas'])} "
                  f"overflow {int(st['overflow'])} step {dt:.1f} ms", flush=True)
    if rank == 0:
        print_summary("", args.topoep, times, imbs, homes)
    dist.destroy_process_group()


def print_summary(model: str, topoep_on: bool, times, imbs, homes) -> None:
    """The closing line: mean imbalance with and without balancing, median step after warm-up."""
    warm = times[2:] or times
    print(f"summary: {model}topoep={'on' if topoep_on else 'off'} mean imbalance "
          f"{statistics.mean(imbs):.3f} (without balancing {statistics.mean(homes):.3f}), "
          f"median step {statistics.median(warm):.1f} ms", flush=True)


def train_hf(args):
    """The same loop on a transformers MoE causal LM (see the module docstring)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hf_moe_models import causal_lm
    torch.set_num_threads(args.threads)
    if args.backend == "hoccl":
        import hoccl_backend  # noqa: F401
    dist.init_process_group(args.backend, timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = causal_lm(args.hf, experts=args.experts, top_k=args.top_k, hidden=args.d_model,
                      ffn=args.d_ff // 4)
    layers = topoep.attach(model, hosts=args.hosts, slots_per_gpu=args.slots, mode=args.mode,
                           capacity=2 * args.tokens * args.top_k // world,
                           balance=args.topoep)
    with torch.no_grad():  # hot experts: their router rows lean towards every hidden state
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p[:args.hot_experts or max(1, args.experts // 8)] += args.skew / args.d_model
    topoep.prepare(model)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1000 + rank)
    batch = max(1, args.tokens // args.seq)
    if rank == 0:
        print(f"backend={args.backend} world={world} model={args.hf} moe_layers={len(layers)} "
              f"experts={args.experts} top_k={args.top_k} tokens/rank={batch * args.seq} "
              f"topoep={'on' if args.topoep else 'off'} mode={args.mode}", flush=True)
    times, imbs, homes = [], [], []
    for step in range(args.steps):
        ids = torch.randint(0, model.config.vocab_size, (batch, args.seq), generator=gen)
        dist.barrier()
        t0 = time.perf_counter()
        loss = ddp(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        dist.barrier()
        dt = (time.perf_counter() - t0) * 1e3
        imb = statistics.mean(float(w.last_stats["imbalance"]) for w in layers)
        home = statistics.mean(float(w.last_stats["home_imbalance"]) for w in layers)
        lv = loss.detach().clone()
        dist.all_reduce(lv)
        if rank == 0:
            times.append(dt)
            imbs.append(imb)
            homes.append(home)
            print(f"step {step:3d} loss {float(lv) / world:.4f} imbalance {imb:.3f} "
                  f"(none: {home:.3f}) step {dt:.1f} ms", flush=True)
    if rank == 0:
        print_summary(f"model={args.hf} ", args.topoep, times, imbs, homes)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
