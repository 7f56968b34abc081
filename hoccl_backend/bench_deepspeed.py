"""hoccl beside DeepSpeed's shared-memory all_reduce, taking turns in the same ranks.

    python -m hoccl_backend.bench --vs deepspeed [--world 2,4] [--sizes 4K,1M] [--dtypes bf16,fp32]

DeepSpeed's CPU accelerator ships an in-place shared-memory all_reduce for tensor-parallel
inference (``torch.ops.deepspeed.inference_all_reduce_``, JIT-built from its
``csrc/cpu/comm/shm.cpp`` on first use; vLLM's and SGLang's CPU backends derive theirs from it).
Each rank runs, cell by cell and round by round, in turn:

* ``hoccl``: ``dist.all_reduce`` on the hoccl default group;
* ``hoccl direct``: ``torch.ops.hoccl.all_reduce_`` on the same group (no c10d per-call path);
* ``deepspeed``: ``torch.ops.deepspeed.inference_all_reduce_``;
* ``gloo``: ``dist.all_reduce`` on a gloo group of the same ranks (fp32 only: its bf16 sum is
  not what the others compute);
* ``torch floor``: ``dist.all_reduce`` of 8 bytes on a world-1 hoccl group, what one c10d call
  costs with no communication.

Buffers are reused; every column reads the same input. A figure is the best round of the
slowest rank's mean time per call. DeepSpeed installs with ``DS_BUILD_OPS=0 pip install
--no-build-isolation deepspeed`` (and runs with ``DS_ACCELERATOR=cpu``, which this sets); its
bf16 kernel needs AVX-512BW (on a CPU without it the rank dies of SIGILL, so the bf16 rows leave
DeepSpeed out there), its fp32 kernel AVX2. A rank that dies ends the run at once, named.
"""
from __future__ import annotations

import argparse
import contextlib
import glob
import os
import queue
import signal
import socket
import time

import torch
import torch.multiprocessing as mp

DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
ROUND_SECONDS = 0.15


def parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    return int(t[:-1]) * mult[t[-1]] if t[-1] in mult else int(t)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _groups(rank, world):
    import torch.distributed as dist
    gloo = dist.new_group(backend="gloo")
    floor = None
    for r in range(world):  # every rank takes part in creating every world-1 group
        g = dist.new_group([r])
        if r == rank:
            floor = g
    return gloo, floor


def _callers(dtype, n, gloo, floor, handle):
    import torch.distributed as dist
    x = torch.ones(n, dtype=dtype)
    tiny = torch.ones(2)
    calls = {
        "hoccl": lambda: dist.all_reduce(x),
        "hoccl direct": lambda: torch.ops.hoccl.all_reduce_(x, handle),
        "torch floor": lambda: dist.all_reduce(tiny, group=floor),
    }
    if dtype != torch.bfloat16 or cpu_has("avx512bw"):
        calls["deepspeed"] = lambda: torch.ops.deepspeed.inference_all_reduce_(x)
    if dtype == torch.float32:
        calls["gloo"] = lambda: dist.all_reduce(x, group=gloo)
    return x, calls


def cpu_has(flag: str) -> bool:
    """Whether /proc/cpuinfo lists this instruction-set flag (Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


def _time(fn, iters, group):
    import torch.distributed as dist
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    mean = torch.tensor([(time.perf_counter() - t0) / iters])
    dist.all_reduce(mean, op=dist.ReduceOp.MAX, group=group)  # the slowest rank
    return float(mean)


def _calibrate(fn, group):
    import torch.distributed as dist
    fn()
    t = torch.tensor([_time(fn, 3, group)])
    dist.broadcast(t, 0, group=group)  # the same count on every rank
    return max(3, min(20000, int(ROUND_SECONDS / max(float(t), 1e-7))))


def _rank_main(rank, world, port, sizes, dtypes, rounds, out_q):
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
                       "LOCAL_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
                       "DS_ACCELERATOR": "cpu"})
    torch.set_num_threads(1)
    import torch.distributed as dist

    import deepspeed
    import hoccl_backend
    dist.init_process_group("hoccl")
    deepspeed.init_distributed()  # keeps the hoccl group; builds and maps DeepSpeed's shm op
    if not hasattr(torch.ops.deepspeed, "inference_all_reduce_"):
        raise RuntimeError("DeepSpeed did not build its shared-memory all_reduce on this machine")
    gloo, floor = _groups(rank, world)
    handle = hoccl_backend.direct_handle()
    rows = []
    for dname in dtypes:
        for nbytes in sizes:
            dtype = DTYPES[dname]
            n = max(1, nbytes // torch.empty((), dtype=dtype).element_size())
            x, calls = _callers(dtype, n, gloo, floor, handle)
            iters = {name: _calibrate(fn, gloo) for name, fn in calls.items()}
            best = {name: float("inf") for name in calls}
            for _ in range(rounds):
                for name, fn in calls.items():
                    x.fill_(1)
                    best[name] = min(best[name], _time(fn, iters[name], gloo))
            rows.append((dname, nbytes, {k: v * 1e6 for k, v in best.items()}))
    if rank == 0:
        out_q.put(rows)
    dist.barrier(group=gloo)
    dist.destroy_process_group()


def run(world: int, sizes, dtypes, rounds: int):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, sizes, dtypes, rounds, q))
             for r in range(world)]
    for p in procs:
        p.start()
    try:
        rows = _results(q, procs)
        for r, p in enumerate(procs):
            p.join(60)
            if p.exitcode:
                raise RuntimeError(f"rank {r} of the DeepSpeed bench {_ended(p.exitcode)}")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        remove_deepspeed_segments(port)
    return rows


def _ended(exitcode: int) -> str:
    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with {exitcode}"


def _results(q, procs, limit_s: float = 1800.0):
    """Rank 0's rows; raises as soon as a rank ends without them, naming it, since its peers
    would otherwise wait in the next collective for as long as the limit."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            return q.get(timeout=0.5)
        for r, p in enumerate(procs):
            if p.exitcode:
                raise RuntimeError(f"rank {r} of the DeepSpeed bench {_ended(p.exitcode)} before the results")
    raise RuntimeError(f"the DeepSpeed bench gave no results within {limit_s:.0f} s")


def remove_deepspeed_segments(port: int) -> None:
    """DeepSpeed's shared-memory all_reduce leaves its buffers in /dev/shm after the job (named
    by MASTER_ADDR and MASTER_PORT); the benchmark removes the ones its run made."""
    for path in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_127.0.0.1_{port}_*"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


COLUMNS = ("hoccl", "hoccl direct", "deepspeed", "torch floor", "gloo")


def print_table(world, rows) -> None:
    print(f"\nworld {world}: µs per in-place all_reduce (best round of the slowest rank's mean)")
    print(f"{'dtype':>5} {'bytes':>9} " + " ".join(f"{c:>13}" for c in COLUMNS)
          + f" {'hoccl<=ds+floor':>16} {'direct<=ds':>11}")
    for dname, nbytes, t in rows:
        cells = " ".join(f"{t[c]:13.1f}" if c in t else f"{'-':>13}" for c in COLUMNS)
        ok1 = ok2 = "-"
        if "deepspeed" in t:
            ok1 = "yes" if t["hoccl"] <= t["deepspeed"] + t["torch floor"] else "no"
            ok2 = "yes" if t["hoccl direct"] <= t["deepspeed"] else "no"
        print(f"{dname:>5} {nbytes:>9} {cells} {ok1:>16} {ok2:>11}", flush=True)
    if any(d == "bf16" and "deepspeed" not in t for d, _, t in rows):
        print("(no DeepSpeed bf16 column: its bf16 kernel needs AVX-512BW, which this CPU lacks)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="hoccl_backend.bench --vs deepspeed",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--vs", default="deepspeed", help="(accepted for the bench dispatcher)")
    ap.add_argument("--world", default="2")
    ap.add_argument("--sizes", default=None, help="comma list, e.g. 4K,1M (default 4K..16M)")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--rounds", type=int, default=5)
    args, _ = ap.parse_known_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    dtypes = [d.strip() for d in args.dtypes.split(",")]
    for d in dtypes:
        if d not in DTYPES:
            ap.error(f"unknown dtype {d!r}; choose from {', '.join(DTYPES)}")
    for world in (int(w) for w in args.world.split(",")):
        print_table(world, run(world, sizes, dtypes, args.rounds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
