"""Overlap benchmark: how much GEMM throughput do collectives cost?

    python -m hoccl_backend.bench --overlap [--world 2] [--gemm 8192] [--msg-mb 32]
    python -m hoccl_backend.bench_overlap ...            (same, without the dispatcher)

Spawns `--world` ranks on one GPU (torch.multiprocessing). Rank 0 runs a bf16 GEMM loop on its
main stream:
  1. alone;
  2. while every rank runs a stream of hoccl all_gather (then all_to_all) on a side stream;
  3. while every rank moves the same bytes with an SM copy (same-device `Tensor.copy_`, which
     runs on SMs on CUDA 13.0, or `--sm-copy add`: an elementwise kernel).
It reports rank 0's GEMM TFLOP/s in each case and the slowdown against case 1 (issue floor:
hoccl <= 3%). If the backend does not accept CUDA tensors yet, the collectives fall back to the
cuda-ce reference collectives (hoccl_backend._C _CeGroup); the output says which was used.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import timedelta

from hoccl_backend.compat import all_gather_single

UNROUTED = "moves CPU tensors only"


def _parse(argv):
    ap = argparse.ArgumentParser(prog="hoccl_backend.bench --overlap", description=__doc__.splitlines()[0])
    ap.add_argument("--overlap", action="store_true", help="(accepted for the bench dispatcher)")
    ap.add_argument("--world", type=int, default=2, help="ranks on the GPU (default 2)")
    ap.add_argument("--gemm", type=int, default=8192, help="M=N=K of the bf16 GEMM (default 8192)")
    ap.add_argument("--iters", type=int, default=60, help="GEMMs per measurement (default 60)")
    ap.add_argument("--repeats", type=int, default=3, help="measurements per case; median reported")
    ap.add_argument("--msg-mb", type=float, default=32.0, help="MiB each rank contributes per op (default 32)")
    ap.add_argument("--ops", default="all_gather,all_to_all", help="collectives to overlap")
    ap.add_argument("--sm-copy", choices=["copy", "add"], default="copy", help="SM baseline kind")
    ap.add_argument("--json", default=None, help="write results as JSON here")
    ap.add_argument("--port", type=int, default=0)
    return ap.parse_args(argv)


class _Comm:
    """One collective on CUDA tensors: through the backend, or the cuda-ce reference fallback."""

    def __init__(self, op, rank, world, dev, nbytes):
        import torch
        import torch.distributed as dist

        self.op, self.rank, self.world = op, rank, world
        n = max(1, int(nbytes) // 2)
        self.inp = torch.ones(n * (world if op == "all_to_all" else 1), dtype=torch.bfloat16, device=dev)
        self.out = torch.empty(n * world, dtype=torch.bfloat16, device=dev)
        self.bytes_moved = self.out.numel() * 2
        self.fallback = None
        try:
            self._dist_call()
            torch.cuda.synchronize()
            self.via = "hoccl (torch.distributed)"
        except RuntimeError as e:
            if UNROUTED not in str(e):
                raise
            from hoccl_backend import cuda_ext

            store = dist.distributed_c10d._get_default_store()
            self.fallback = cuda_ext.cuda_module()._CeGroup(store, "bench_overlap/" + op, rank, world, dev.index, 0)
            self.via = "cuda-ce reference (_CeGroup), core not routing CUDA yet"

    def _dist_call(self):
        import torch.distributed as dist

        if self.op == "all_gather":
            all_gather_single(self.out, self.inp)
        elif self.op == "all_to_all":
            dist.all_to_all_single(self.out, self.inp)
        else:
            raise ValueError(self.op)

    def __call__(self):
        import torch

        if self.fallback is not None:
            stream = torch.cuda.current_stream().cuda_stream
            if self.op == "all_gather":
                self.fallback.all_gather(self.out, self.inp, stream)
            else:
                self.fallback.all_to_all(self.out, self.inp, stream)
        else:
            self._dist_call()


def _time_gemms(a, b, iters):
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        torch.mm(a, b)
    end.record()
    return start, end


def _rank(rank, world, args, port, queue):
    import torch
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    import hoccl_backend  # noqa: F401

    dist.init_process_group("hoccl", rank=rank, world_size=world, timeout=timedelta(seconds=300))
    try:
        queue.put((rank, _measure(rank, world, args, dev)))
    except BaseException as e:  # noqa: BLE001
        import traceback

        queue.put((rank, {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}))
        raise
    finally:
        dist.destroy_process_group()


def _measure(rank, world, args, dev):
    import torch
    import torch.distributed as dist

    n = args.gemm
    flops = 2.0 * n * n * n * args.iters
    a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
    side = torch.cuda.Stream(device=dev)
    nbytes = args.msg_mb * (1 << 20)
    results = {"rank": rank, "world": world, "gemm": n, "iters": args.iters, "msg_bytes": int(nbytes), "cases": {}}

    def gemm_case(background):
        """Rank 0: GEMMs on the main stream, `background` on the side stream; others: background."""
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            torch.cuda.synchronize()
            if rank == 0:
                start, end = _time_gemms(a, b, args.iters)
            with torch.cuda.stream(side):
                background()
            torch.cuda.synchronize()
            if rank == 0:
                times.append(start.elapsed_time(end) / 1e3)
        return times

    for _ in range(3):  # warm-up: cuBLAS heuristics, clocks
        torch.mm(a, b)
    torch.cuda.synchronize()
    alone = gemm_case(lambda: None)
    gemm_s = statistics.median(alone) if rank == 0 else 0.0
    count_t = torch.tensor([gemm_s])
    dist.broadcast(count_t, src=0)  # CPU tensor: every rank learns the GEMM window
    gemm_s = float(count_t[0])
    results["cases"]["alone"] = {"tflops": flops / gemm_s / 1e12 if rank == 0 else None}

    for op in [o for o in args.ops.split(",") if o]:
        comm = _Comm(op, rank, world, dev, nbytes)
        if comm.via is None:
            results["cases"][op] = {"skipped": "backend does not accept CUDA tensors yet; no reference " + op}
            continue
        # Size the stream of ops to cover the GEMM window (measured alone, same on every rank).
        dist.barrier()
        torch.cuda.synchronize()
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record()
        for _ in range(3):
            comm()
        t1.record()
        torch.cuda.synchronize()
        per_op = torch.tensor([t0.elapsed_time(t1) / 3e3])
        dist.all_reduce(per_op, op=dist.ReduceOp.MAX)  # CPU tensor
        count = max(1, int(gemm_s / float(per_op[0])) + 1)
        times = gemm_case(lambda: [comm() for _ in range(count)])
        results["cases"][op] = {"via": comm.via, "ops": count, "op_s": float(per_op[0]),
                                "algbw_GBps": comm.bytes_moved / float(per_op[0]) / 1e9,
                                "tflops": flops / statistics.median(times) / 1e12 if rank == 0 else None}
        # SM baseline: the same bytes per op, moved by a kernel.
        src = torch.ones(comm.bytes_moved // 2, dtype=torch.bfloat16, device=dev)
        dst = torch.empty_like(src)

        def sm_copy():
            for _ in range(count):
                if args.sm_copy == "copy":
                    dst.copy_(src)
                else:
                    torch.add(src, 0, out=dst)

        times = gemm_case(sm_copy)
        results["cases"][op + "+sm_copy"] = {"tflops": flops / statistics.median(times) / 1e12 if rank == 0 else None,
                                             "kind": args.sm_copy}
    return results


def _report(res, out=sys.stdout):
    base = res["cases"]["alone"]["tflops"]
    print(f"# hoccl overlap benchmark: world {res['world']} on one GPU, bf16 GEMM {res['gemm']}^3 x "
          f"{res['iters']}, {res['msg_bytes'] / 2**20:.0f} MiB per rank per op", file=out)
    print(f"{'case':<24}{'GEMM TFLOP/s':>14}{'vs alone':>10}  note", file=out)
    for name, c in res["cases"].items():
        if "skipped" in c:
            print(f"{name:<24}{'-':>14}{'-':>10}  skipped: {c['skipped']}", file=out)
            continue
        rel = (c["tflops"] / base - 1.0) * 100.0
        note = ""
        if "via" in c:
            note = f"{c['ops']} ops, {c['algbw_GBps']:.1f} GB/s alone, via {c['via']}"
        elif "kind" in c:
            note = f"SM copy ({c['kind']}) of the same bytes"
        print(f"{name:<24}{c['tflops']:>14.1f}{rel:>+9.1f}%  {note}", file=out)


def main(argv=None) -> int:
    import torch
    import torch.multiprocessing as mp

    args = _parse(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        print("bench --overlap needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    if args.world < 2:
        print("--world must be at least 2", file=sys.stderr)
        return 2
    port = args.port
    if not port:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, args.world, args, port, queue)) for r in range(args.world)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(args.world):
            rank, res = queue.get(timeout=900)
            results[rank] = res
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    errors = {r: v["error"] for r, v in results.items() if "error" in v}
    if errors:
        for r, e in errors.items():
            print(f"rank {r} failed:\n{e}", file=sys.stderr)
        return 1
    _report(results[0])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results[0], f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
