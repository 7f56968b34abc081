"""Times collectives on whatever backend torchrun's job uses.

    torchrun --nproc_per_node=4 examples/collective_bench.py                 # hoccl
    torchrun --nproc_per_node=4 examples/collective_bench.py --backend gloo
    torchrun --nproc_per_node=4 examples/collective_bench.py --shared   # hoccl_backend.empty buffers

For a side-by-side table of hoccl and gloo in one run, use `python -m hoccl_backend.bench`.
"""
import argparse
import time

import torch
import torch.distributed as dist

from hoccl_backend.compat import all_gather_single, reduce_scatter_single


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="hoccl")
    parser.add_argument("--sizes", default="8,65536,1048576,16777216", help="bytes, comma separated")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--shared", action="store_true",
                        help="buffers from hoccl_backend.empty(): hoccl's peers map them instead of copying")
    args = parser.parse_args()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    if args.shared:
        import hoccl_backend

        empty = hoccl_backend.empty
    else:
        empty = torch.empty
    if rank == 0:
        print(f"backend={args.backend} world={world} buffers={'shared' if args.shared else 'torch.empty'}")
        print(f"{'op':>16s} {'bytes':>10s} {'time_us':>10s} {'busbw_GBps':>11s}")
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for nbytes in (int(s) for s in args.sizes.split(",")):
            n = max(world, nbytes // 4 // world * world)
            x = empty(n).fill_(1.0)
            out = empty(n) if op in ("all_gather", "all_to_all") else empty(n // world)

            def run():
                if op == "all_reduce":
                    dist.all_reduce(x)
                elif op == "all_gather":
                    all_gather_single(out, x[: n // world])
                elif op == "reduce_scatter":
                    reduce_scatter_single(out, x)
                else:
                    dist.all_to_all_single(out, x)

            run()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.iters):
                run()
            t = torch.tensor([(time.perf_counter() - start) / args.iters], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            factor = 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world
            if rank == 0:
                busbw = n * 4 / t.item() / 1e9 * factor
                print(f"{op:>16s} {n * 4:>10d} {t.item() * 1e6:>10.1f} {busbw:>11.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
