"""Training steps as a user runs them, hoccl beside gloo, idle or beside compute.

    python -m hoccl_backend.bench_training                      # ZeRO-2 and HSDP, world 4, idle
    python -m hoccl_backend.bench_training --busy 1             # one GEMM thread beside each rank
    python -m hoccl_backend.bench_training --jobs zero2 --world 2 --steps 30 --rounds 3

Each job trains a GPT-2 built from a small config (no weights are downloaded) on random tokens:
  zero2  DeepSpeed ZeRO stage 2 (DS_ACCELERATOR=cpu, torch's AdamW), gradients reduced in
         buckets of --bucket-elems float32 elements (50,000: 200 KB, many small reductions)
  hsdp   FSDP2 on a 2-D mesh (replicate x shard): each block sharded inside a pair of ranks,
         gradients all-reduced across pairs (world must be even)
A run launches the job's ranks once per backend, backends taking turns round by round so both
meet the same machine load; the figure is the median step time of rank 0 over the timed steps
of every round (the first --warmup steps of a launch are not timed). --busy N starts N compute
threads per rank (bench_busy.py) for the whole launch, as a model's own compute shares its cores.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

JOBS = ("zero2", "hsdp")


def _model(seed: int):
    import torch
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    # ~4M parameters (16 MB of float32 gradients a step) over little compute: one short sequence.
    config = GPT2Config(vocab_size=4096, n_positions=128, n_embd=256, n_layer=4, n_head=4,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config), config


def _tokens(config, rank: int, step: int):
    import torch

    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randint(0, config.vocab_size, (1, 32), generator=g)


def _zero2_steps(world: int, steps: int, bucket_elems: int):
    import deepspeed

    model, config = _model(0)
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 2, "reduce_bucket_size": bucket_elems,
                              "allgather_bucket_size": bucket_elems, "overlap_comm": False},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "steps_per_print": 10 ** 9,
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)

    def step(i: int):
        ids = _tokens(config, engine.global_rank, i)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
    return step


def _hsdp_steps(world: int, steps: int, bucket_elems: int):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
    model, config = _model(0)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rank = torch.distributed.get_rank()

    def step(i: int):
        ids = _tokens(config, rank, i)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def _rank(rank, world, job, backend, steps, warmup, busy, bucket_elems, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), DS_ACCELERATOR="cpu")
    import time

    import torch
    import torch.distributed as dist

    from hoccl_backend.bench_busy import ComputeThreads

    torch.set_num_threads(1)
    if backend == "hoccl":
        import hoccl_backend  # noqa: F401
    dist.init_process_group(backend, rank=rank, world_size=world)
    step = {"zero2": _zero2_steps, "hsdp": _hsdp_steps}[job](world, steps, bucket_elems)
    compute = ComputeThreads(busy)
    times = []
    for i in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        step(i)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    compute.close()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(times)
    queue.close()
    queue.join_thread()  # the times are in the pipe before the process goes
    # The groups are gone; skip the interpreter's teardown of DeepSpeed and torch, which once
    # aborted a gloo rank here in CI ("terminate called without an active exception") after its
    # figures were in. hoccl's own teardown is destroy_process_group's, which the suite tests.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(job: str, backend: str, world: int, steps: int, warmup: int, busy: int, bucket_elems: int) -> list[float]:
    """One launch of `world` ranks; rank 0's step times in seconds."""
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, world, job, backend, steps, warmup, busy, bucket_elems, port, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        times = queue.get(timeout=1800)
    finally:
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.kill()
    bad = [p.exitcode for p in procs if p.exitcode]
    if bad:
        raise RuntimeError(f"{job} on {backend}: ranks exited with {bad}")
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hoccl_backend.bench_training", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", default="zero2,hsdp", help=f"comma-separated, of {', '.join(JOBS)}")
    ap.add_argument("--backends", default="hoccl,gloo")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per launch")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="launches per backend, taking turns")
    ap.add_argument("--busy", type=int, default=0, metavar="N", help="compute threads per rank")
    ap.add_argument("--bucket-elems", type=int, default=50_000, help="ZeRO-2 reduce/allgather bucket")
    args = ap.parse_args(argv)
    jobs = [j for j in args.jobs.split(",") if j]
    unknown = [j for j in jobs if j not in JOBS]
    if unknown:
        ap.error(f"unknown job(s) {unknown}; choose from {', '.join(JOBS)}")
    if "hsdp" in jobs and args.world % 2:
        ap.error(f"hsdp needs an even world (replicate x shard pairs), got {args.world}")
    backends = [b for b in args.backends.split(",") if b]
    print(f"# world {args.world}, {os.cpu_count()} cores, busy {args.busy} thread(s) per rank, "
          f"{args.rounds} round(s) x {args.steps} steps; ms per step, median (p10-p90)")
    for job in jobs:
        samples = {b: [] for b in backends}
        for r in range(args.rounds):
            for b in (backends if r % 2 == 0 else backends[::-1]):
                samples[b] += launch(job, b, args.world, args.steps, args.warmup, args.busy, args.bucket_elems)
        cells = []
        for b in backends:
            ms = sorted(t * 1e3 for t in samples[b])
            lo, hi = ms[len(ms) // 10], ms[(len(ms) * 9) // 10]
            cells.append(f"{b} {statistics.median(ms):8.1f} ({lo:.1f}-{hi:.1f})")
        ratio = ""
        if "gloo" in samples and "hoccl" in samples:
            ratio = f" | gloo / hoccl {statistics.median(samples['gloo']) / statistics.median(samples['hoccl']):.2f}x"
        print(f"{job:6s} | " + " | ".join(cells) + ratio)
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
