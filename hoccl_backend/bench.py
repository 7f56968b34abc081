"""Collective benchmark, nccl-tests style, hoccl side by side with gloo in the same run.

    python -m hoccl_backend.bench                         # hoccl and gloo, world 2 and 4
    python -m hoccl_backend.bench --backend hoccl --world 4 --ops all_reduce
    python -m hoccl_backend.bench --json out.json --plot out.png
    python -m hoccl_backend.bench --thp                   # ranks allocate >= 2 MiB tensors on huge pages
    python -m hoccl_backend.bench --shared-buffers        # buffers from hoccl_backend.empty()
    python -m hoccl_backend.bench --overlap               # GPU only: GEMM slowdown under comm
    python -m hoccl_backend.bench --vs mpi                # hoccl beside Open MPI and torch's floor
    python -m hoccl_backend.bench --busy 1                # 1 GEMM thread per rank beside the collectives
    python -m hoccl_backend.bench --vs deepspeed          # all_reduce beside DeepSpeed's shm op (bench_deepspeed.py)
    python -m hoccl_backend.bench --hosts 2 --link-gbit 4 # across namespaced hosts (bench_hosts.py)
    python -m hoccl_backend.bench --hosts 2 --ops all_to_all_skewed  # VarioPath's form vs each (bench_alltoall_hosts.py)

Each world size runs in one set of spawned ranks holding a group per backend. For each (op,
size) the backends take turns over --rounds rounds (order reversed every other round), so both
meet the same machine load; a backend's time is the median over rounds of the slowest rank's mean
time per iteration. algbw = bytes / time; busbw = algbw x the nccl-tests factor
(all_reduce 2(n-1)/n, the others (n-1)/n). "bytes" is the full buffer: all_reduce's tensor,
all_gather's output, reduce_scatter's input, all_to_all's per-rank input.

--thp sets torch's THP_MEM_ALLOC_ENABLE=1 in the ranks (both backends use the same kind of
tensors): allocations of 2 MiB and more are 2 MiB-aligned and advised onto transparent huge
pages. hoccl's cross-process reads (process_vm_readv) pin the source pages on every call, once
per 4 KiB page without it and once per 2 MiB page with it. Without --thp the ranks inherit the
caller's environment; the header says which applied.

--shared-buffers allocates every benchmarked buffer with hoccl_backend.empty() (shared memory
that hoccl's peers map once and then read with plain loads, like NCCL's registered buffers and
nccl-tests' -R), for both backends; gloo handles them as any CPU tensor.

--busy N runs N compute threads per rank (GEMM loops, bench_busy.py) for the whole run: every
backend is timed with them running, taking turns as usual, and hoccl once more per round with
them parked ("hoccl idle"), so the table shows hoccl's busy time beside gloo's and beside its own
idle time in the same ranks. Each call is timed too: "median call b/i" is hoccl's median call
busy over idle (each call at its slowest rank), which tells a slower data path from a mean made
of a few calls that waited out the compute's scheduler turns. With --vs mpi the threads keep
running while Open MPI takes its turn, so its ranks share the machine with the same compute.

--vs mpi (or --vs mpi,gloo) compares with Open MPI instead (bench_mpi.py: installed from the
system's packages on first use, a C loop over reused malloc buffers, 4 KB - 64 MB by default); the
figures there are the best over rounds, beside MPI's time plus torch's floor (an 8-byte all_reduce
on a world-1 hoccl group, measured in every cell, taking turns with the backends).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

DEFAULT_SIZES = [8, 1 << 10, 32 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
OPS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]


def bus_factor(op: str, world: int) -> float:
    if op == "broadcast":
        return 1.0
    return 2 * (world - 1) / world if op == "all_reduce" else (world - 1) / world


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _iters_for(nbytes: int, budget_bytes: int = 1 << 29) -> int:
    return int(max(5, min(200, budget_bytes // max(nbytes, 1))))


def _vs_deepspeed(parser, args, rest) -> int:
    """--vs deepspeed: all_reduce only, in its own runner (bench_deepspeed)."""
    if args.vs.strip() != "deepspeed" or args.busy:
        parser.error("--vs deepspeed runs alone (it already shows gloo), without --busy")
    from hoccl_backend import bench_deepspeed

    argv = ["--world", args.world, "--rounds", str(args.rounds)]
    return bench_deepspeed.main(argv + (["--sizes", args.sizes] if args.sizes else []) + rest)


def _run_op(op, buf, group):
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(buf["x"], group=group)
    elif op == "all_gather":
        from hoccl_backend.compat import all_gather_single
        all_gather_single(buf["out"], buf["x"], group=group)
    elif op == "reduce_scatter":
        from hoccl_backend.compat import reduce_scatter_single
        reduce_scatter_single(buf["out"], buf["x"], group=group)
    elif op == "all_to_all":
        dist.all_to_all_single(buf["out"], buf["x"], group=group)
    elif op == "broadcast":
        dist.broadcast(buf["x"], src=0, group=group)
    elif op == "gather":  # rank 0 of the job is the root
        dist.gather(buf["x"], buf["blocks"] if dist.get_rank() == 0 else None, dst=0, group=group)
    elif op == "scatter":
        dist.scatter(buf["x"], buf["blocks"] if dist.get_rank() == 0 else None, src=0, group=group)


def _buffers(op, nbytes, world, shared=False):
    import torch

    if shared:
        import hoccl_backend

        empty = hoccl_backend.empty
    else:
        empty = torch.empty

    def ones(k):
        return empty(k).fill_(1.0)

    n = max(1, nbytes // 4)
    n = (n + world - 1) // world * world  # divisible, for the sharded ops
    if op == "all_reduce":
        return {"x": ones(n)}
    if op == "all_gather":
        return {"x": ones(n // world), "out": empty(n)}
    if op in ("gather", "scatter"):  # the root's blocks: n bytes in all, as all_gather's output
        whole = ones(n)
        return {"x": ones(n // world), "out": whole, "blocks": list(whole.chunk(world))}
    if op == "reduce_scatter":
        return {"x": ones(n), "out": empty(n // world)}
    return {"x": ones(n), "out": empty(n)}


def buffer_bytes(op, buf) -> int:
    """The benchmark's "bytes" for buffers from _buffers (all_gather, gather and scatter count
    the whole of every rank's block)."""
    return buf["out"].numel() * 4 if op in ("all_gather", "gather", "scatter") else buf["x"].numel() * 4


def _time_round(op, buf, group, iters, per_call=None):
    """Mean seconds per iteration of `iters` back-to-back calls, started together on every rank;
    with `per_call` (a list), each call's own seconds are appended to it too."""
    import torch.distributed as dist

    dist.barrier(group=group)
    start = time.perf_counter()
    if per_call is None:
        for _ in range(iters):
            _run_op(op, buf, group)
    else:
        last = start
        for _ in range(iters):
            _run_op(op, buf, group)
            now = time.perf_counter()
            per_call.append(now - last)
            last = now
    return (time.perf_counter() - start) / iters


IDLE = "hoccl idle"  # --busy: hoccl timed with the compute threads parked
# hoccl's wait policy (HOCCL_WAIT_POLICY=auto) samples the machine's runnable threads with its
# ops, at most every 50 ms, and calls cores shared while 2 of the last 5 intervals' samples saw
# too many (an interval without ops counts as not): after parking, the idle turn waits out those
# 250 ms, so that no op of the turn sleeps at its barriers as on busy cores.
IDLE_SETTLE_S = 0.3


def timed_turns(backends: list[str], busy: int) -> list[str]:
    """The names timed in each round: the backends, plus hoccl on idle cores when --busy runs."""
    return [*backends, IDLE] if busy and "hoccl" in backends else list(backends)


def _time_turn(name, op, bufs, groups, iters, compute, per_call=None):
    if name != IDLE:
        return _time_round(op, bufs[name], groups[name], iters, per_call)
    compute.pause()
    time.sleep(IDLE_SETTLE_S)
    try:
        return _time_round(op, bufs["hoccl"], groups["hoccl"], iters, per_call)
    finally:
        compute.resume()


def _median_call_us(per_call: list[float]) -> float:
    """The median call of a turn's calls, each call taken at its slowest rank (every rank makes the
    same calls in the same order, so call i is the same collective everywhere)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(per_call, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.median().item() * 1e6


def _rank_job(rank, world, backends, ops, sizes, rounds, port, queue, show_progress, shared, busy=0):
    """One rank: a group per backend, and for each (op, size) the backends take turns, round by
    round, so that every backend meets the same machine load (this VM's speed drifts up to 3x within
    minutes). The figure per backend is the median over rounds of the slowest rank's mean."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    from hoccl_backend.bench_busy import ComputeThreads

    torch.set_num_threads(1)
    if "hoccl" in backends:
        import hoccl_backend  # noqa: F401
    dist.init_process_group(backends[0], rank=rank, world_size=world)
    # The default group serves the first backend; the others get a group each.
    groups = {b: dist.group.WORLD if i == 0 else dist.new_group(backend=b) for i, b in enumerate(backends)}
    names = timed_turns(backends, busy)
    compute = ComputeThreads(busy)
    rows = []
    total = len(ops) * len(sizes)
    done = 0
    for op in ops:
        for nbytes in sizes:
            bufs = {b: _buffers(op, nbytes, world, shared) for b in backends}
            # At least 3 calls per round: one call right after the round's barrier also times the
            # ranks' skew leaving it, and rounds of 64 MB had a single call.
            per_round = max(3, _iters_for(nbytes) // rounds)
            for b in backends:  # warm-up: page faults, first-call setup
                for _ in range(max(2, per_round // 2)):
                    _run_op(op, bufs[b], groups[b])
            samples = {b: [] for b in names}
            # --busy: every call timed too, so that a busy mean made of rare long stalls (the
            # scheduler's turns for the compute) shows beside a median call at its idle speed.
            calls = {b: [] for b in names} if busy else {}
            for r in range(rounds):
                order = names if r % 2 == 0 else names[::-1]
                for b in order:
                    samples[b].append(_time_turn(b, op, bufs, groups, per_round, compute, calls.get(b)))
            for b in names:
                t = torch.tensor(samples[b], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                buf = bufs["hoccl" if b == IDLE else b]
                row = {"backend": b, "world": world, "op": op, "bytes": buffer_bytes(op, buf),
                       "time_us": t.median().item() * 1e6, "rounds": rounds,
                       "iters_per_round": per_round, "busy_threads": 0 if b == IDLE else busy}
                if busy:
                    row["median_call_us"] = _median_call_us(calls[b])
                rows.append(row)
            done += 1
            if rank == 0 and show_progress:
                bar = "#" * int(30 * done / total)
                sys.stderr.write(f"\r  world={world} [{bar:<30s}] {done}/{total} {op} {nbytes}B   ")
                sys.stderr.flush()
    if rank == 0 and show_progress:
        sys.stderr.write("\n")
    compute.close()
    for row in rows:
        row["compute_gflops_per_thread"] = compute.gflops_per_thread()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(rows)


def run_world(backends: list[str], world: int, ops, sizes, rounds: int = 5, show_progress=True,
              shared=False, busy=0) -> list[dict]:
    import multiprocessing as mp
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_job,
                         args=(r, world, backends, ops, sizes, rounds, port, queue, show_progress, shared,
                               busy))
             for r in range(world)]
    for p in procs:
        p.start()
    rows = queue.get(timeout=3600)
    for p in procs:
        p.join()
    for row in rows:
        t = row["time_us"] * 1e-6
        row["algbw_GBps"] = row["bytes"] / t / 1e9
        row["busbw_GBps"] = row["algbw_GBps"] * bus_factor(row["op"], world)
    return rows


def memcpy_bandwidth(nbytes: int = 64 << 20) -> float:
    """Single-core memcpy GB/s on this machine (read + write of nbytes counted once)."""
    import torch

    src, dst = torch.ones(nbytes // 4), torch.empty(nbytes // 4)
    torch.set_num_threads(1)
    for _ in range(3):
        dst.copy_(src)
    start = time.perf_counter()
    reps = 20
    for _ in range(reps):
        dst.copy_(src)
    return nbytes * reps / (time.perf_counter() - start) / 1e9


def min_copy_bytes(op: str, world: int, nbytes: int) -> int:
    """Bytes each rank must copy at least: all_reduce reduces its N/W shard from W inputs and
    gathers the other shards (2N(W-1)/W + N/W); the other ops write their N-byte buffer once."""
    if op == "all_reduce":
        return 2 * nbytes * (world - 1) // world + nbytes // world
    return nbytes


def copy_fraction(row: dict, memcpy_GBps: float) -> float:
    """How close a rank came to copying its minimum bytes at single-core memcpy speed."""
    seconds = row["time_us"] * 1e-6
    return min_copy_bytes(row["op"], row["world"], row["bytes"]) / seconds / (memcpy_GBps * 1e9)


def _by_key(rows: list[dict]) -> dict:
    return {(r["backend"], r["world"], r["op"], r["bytes"]): r for r in rows}


def backend_columns_head(backends: list[str]) -> str:
    """Table header up to the comparison columns: bytes, then time, algbw and busbw per backend."""
    return f"{'bytes':>10s}" + "".join(f" | {b + ' us':>11s} {'algbw':>7s} {'busbw':>7s}" for b in backends)


def backend_columns(keyed: dict, backends: list[str], world: int, op: str, nbytes: int) -> str:
    """One row of those columns (blank where a backend has no figure)."""
    line = f"{nbytes:>10d}"
    for b in backends:
        r = keyed.get((b, world, op, nbytes))
        line += f" | {r['time_us']:11.1f} {r['algbw_GBps']:7.3f} {r['busbw_GBps']:7.3f}" if r else " | " + " " * 27
    return line


def busy_line(busy: int, rows: list[dict]) -> str:
    """The header line of a --busy run: the compute beside each rank and the rate it kept."""
    rates = [r["compute_gflops_per_thread"] for r in rows if r.get("compute_gflops_per_thread")]
    rate = f"{min(rates):.1f}-{max(rates):.1f}" if rates else "?"
    return (f"# busy: {busy} compute thread(s) per rank (256x256 float32 GEMM loops), {rate} GFLOP/s per thread "
            f"while running; '{IDLE}': hoccl in the same ranks with them parked")


def print_table(rows: list[dict], backends: list[str], memcpy_GBps: float) -> None:
    keyed = _by_key(rows)
    worlds = sorted({r["world"] for r in rows})
    ops = [o for o in OPS if any(r["op"] == o for r in rows)]
    for world in worlds:
        for op in ops:
            print(f"\n# {op}  world={world}")
            head = backend_columns_head(backends)
            if "hoccl" in backends and "gloo" in backends:
                head += " | busbw x gloo"
            if IDLE in backends:
                head += " | busy / idle | median call b/i"
            if "hoccl" in backends:
                head += " | hoccl copy%"
            print(head)
            sizes = sorted({r["bytes"] for r in rows if r["world"] == world and r["op"] == op})
            for nbytes in sizes:
                line = backend_columns(keyed, backends, world, op, nbytes)
                h, g = keyed.get(("hoccl", world, op, nbytes)), keyed.get(("gloo", world, op, nbytes))
                idle = keyed.get((IDLE, world, op, nbytes))
                if h and g:
                    line += f" | {h['busbw_GBps'] / g['busbw_GBps']:11.2f}x"
                if h and idle:
                    line += f" | {h['time_us'] / idle['time_us']:10.2f}x"
                    line += f" | {h['median_call_us'] / idle['median_call_us']:14.2f}x"
                if h:
                    line += f" | {100 * copy_fraction(h, memcpy_GBps):10.0f}%"
                print(line)


def print_markdown(rows: list[dict], memcpy_GBps: float) -> None:
    """The README's table: hoccl beside gloo, one table per world size."""
    keyed = _by_key(rows)
    for world in sorted({r["world"] for r in rows}):
        print(f"\n**world {world}** (single-core memcpy {memcpy_GBps:.2f} GB/s in this run)\n")
        print("| op | bytes | hoccl µs | hoccl busbw | gloo µs | gloo busbw | hoccl ÷ gloo | copy % |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for op in OPS:
            for nbytes in sorted({r["bytes"] for r in rows if r["world"] == world and r["op"] == op}):
                h, g = keyed.get(("hoccl", world, op, nbytes)), keyed.get(("gloo", world, op, nbytes))
                if not (h and g):
                    continue
                print(f"| {op} | {nbytes} | {h['time_us']:.1f} | {h['busbw_GBps']:.3f} | {g['time_us']:.1f} | "
                      f"{g['busbw_GBps']:.3f} | {h['busbw_GBps'] / g['busbw_GBps']:.2f}x | "
                      f"{100 * copy_fraction(h, memcpy_GBps):.0f}% |")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    worlds = sorted({r["world"] for r in rows})
    ops = [o for o in OPS if any(r["op"] == o for r in rows)]
    fig, axes = plt.subplots(len(worlds), len(ops), figsize=(4 * len(ops), 3.2 * len(worlds)), squeeze=False)
    for i, world in enumerate(worlds):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            for backend in sorted({r["backend"] for r in rows}):
                pts = sorted((r["bytes"], r["busbw_GBps"]) for r in rows
                             if r["world"] == world and r["op"] == op and r["backend"] == backend)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=backend)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{op} world={world}")
            ax.set_xlabel("bytes")
            ax.set_ylabel("busbw GB/s")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="hoccl,gloo", help="comma list (default: hoccl,gloo)")
    parser.add_argument("--world", default="2,4", help="comma list of world sizes")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--sizes", default=None, help="comma list, e.g. 8,1M,16M")
    parser.add_argument("--json", default=None, help="write every row to this file")
    parser.add_argument("--plot", default=None, help="write a PNG of busbw vs size")
    parser.add_argument("--rounds", type=int, default=5,
                        help="timing rounds per (op, size); backends alternate round by round (default 5)")
    parser.add_argument("--markdown", action="store_true", help="also print the README's markdown table")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--thp", action="store_true",
                        help="ranks allocate tensors of 2 MiB and more on huge pages (torch's THP_MEM_ALLOC_ENABLE=1)")
    parser.add_argument("--shared-buffers", action="store_true",
                        help="allocate the buffers with hoccl_backend.empty() (peers map them once)")
    parser.add_argument("--overlap", action="store_true", help="GPU: GEMM throughput under communication")
    parser.add_argument("--vs", default=None,
                        help="peers to compare hoccl with: gloo (default, same as --backend hoccl,gloo), "
                             "mpi, or mpi,gloo (Open MPI, taking turns with hoccl; see bench_mpi), or "
                             "deepspeed (its shared-memory all_reduce, the direct op and gloo; see "
                             "bench_deepspeed; takes --dtypes)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="N compute threads (GEMM loops) per rank beside the collectives; hoccl is also "
                             "timed with them parked ('hoccl idle')")
    parser.add_argument("--hosts", type=int, default=None,
                        help="run across this many namespaced hosts (root; see bench_hosts)")
    parser.add_argument("--ranks-per-host", type=int, default=2, help="with --hosts (default 2)")
    parser.add_argument("--link-gbit", type=float, default=None,
                        help="with --hosts: shape every host's link to this rate (tc tbf)")
    args, rest = parser.parse_known_args(argv)
    if args.busy < 0:
        parser.error(f"--busy takes a number of compute threads per rank >= 0, got {args.busy}")
    if args.busy and (args.hosts or args.overlap):
        parser.error("--busy runs with the single-host benchmark and --vs, not with --hosts or --overlap")
    if args.hosts:
        from hoccl_backend import bench_alltoall_hosts, bench_hosts

        if rest:
            parser.error(f"unknown arguments {rest}")
        if args.ops == "all_to_all_skewed":
            return bench_alltoall_hosts.main(args)
        return bench_hosts.main(args)
    if args.overlap:
        from hoccl_backend import bench_overlap

        return bench_overlap.main(rest)
    if args.vs and "deepspeed" in args.vs:
        return _vs_deepspeed(parser, args, rest)
    if rest:
        parser.error(f"unknown arguments {rest}")
    peers = [p.strip() for p in args.vs.split(",") if p.strip()] if args.vs else []
    for p in peers:
        if p not in ("gloo", "mpi"):
            parser.error(f"unknown peer {p!r} for --vs; choose from gloo, mpi")
    backends = ["hoccl", *peers] if peers else [b.strip() for b in args.backend.split(",") if b.strip()]
    worlds = [int(w) for w in args.world.split(",")]
    ops = [o.strip() for o in args.ops.split(",")]
    for op in ops:
        if op not in OPS:
            parser.error(f"unknown op {op!r}; choose from {OPS}")
    if args.thp:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # read by torch in the spawned ranks
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE", "0") == "1"
    if "mpi" in peers:
        from hoccl_backend import bench_mpi

        result = bench_mpi.main(args, peers, worlds, ops)
        if args.markdown:
            bench_mpi.print_markdown(result["rows"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(result, thp=thp), f, indent=1)
        if args.plot:
            plot([r for r in result["rows"] if r["backend"] != bench_mpi.FLOOR], args.plot)
            print(f"plot written to {args.plot}")
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    # hoccl's own promotion of reused peer-read buffers onto huge pages (the ranks inherit this).
    promote = os.environ.get("HOCCL_HUGEPAGE_MIN_BYTES", "4M")
    promote = "off" if parse_size(promote) <= 0 else f"buffers >= {promote}"
    rows = []
    before = memcpy_bandwidth()
    for world in worlds:
        rows += run_world(backends, world, ops, sizes, args.rounds, show_progress=not args.no_progress,
                          shared=args.shared_buffers, busy=args.busy)
    after = memcpy_bandwidth()
    mc = (before + after) / 2
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"# machine: {os.cpu_count()} cores; single-core memcpy {mc:.2f} GB/s "
          f"(before {before:.2f}, after {after:.2f}); load average {load}; "
          f"ranks' tensors on huge pages (THP_MEM_ALLOC_ENABLE): {'on' if thp else 'off'}; "
          f"buffers: {'hoccl_backend.empty (shared)' if args.shared_buffers else 'torch.empty'}; "
          f"hoccl huge-page promotion of reused buffers (HOCCL_HUGEPAGE_MIN_BYTES): {promote}")
    if args.busy:
        print(busy_line(args.busy, rows))
    print_table(rows, timed_turns(backends, args.busy), mc)
    if args.markdown and "hoccl" in backends and "gloo" in backends:
        print_markdown(rows, mc)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"memcpy_GBps": mc, "memcpy_before_after_GBps": [before, after], "thp": thp, "busy": args.busy,
                       "shared_buffers": args.shared_buffers, "hugepage_promotion": promote, "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
