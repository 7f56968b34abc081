"""DDP training on CPU over hoccl.

    torchrun --nproc_per_node=4 examples/ddp_train.py            # hoccl
    torchrun --nproc_per_node=4 examples/ddp_train.py --backend gloo

Importing hoccl_backend is optional: torch loads it through its backend entry point.
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="hoccl")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    model = DDP(build_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1234 + rank)  # each rank sees its own shard of data
    teacher = torch.Generator().manual_seed(99)
    w_true = torch.randn(64, 10, generator=teacher)
    start = time.perf_counter()
    for step in range(args.steps):
        x = torch.randn(args.batch, 64, generator=gen)
        y = (x @ w_true).argmax(dim=1)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_avg = loss.detach().clone()
        dist.all_reduce(loss_avg, op=dist.ReduceOp.AVG)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step:3d}  loss {loss_avg.item():.4f}", flush=True)
    elapsed = time.perf_counter() - start
    # Every rank must hold identical parameters after DDP's gradient averaging.
    checksum = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum()
    sums = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(sums, checksum.view(1))
    if rank == 0:
        same = all(torch.equal(s, sums[0]) for s in sums)
        print(f"backend={args.backend} world={world} steps={args.steps} time={elapsed:.2f}s "
              f"param_checksum={checksum.item():.6f} identical_across_ranks={same}", flush=True)
        if not same:
            raise SystemExit("parameters diverged across ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
