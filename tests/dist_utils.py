"""Run a function on real ranks: one spawned process per rank, a real TCPStore, a real backend.

Every multi-process test goes through `run_ranks`. Each rank's return value comes back to the
test; an exception in any rank fails the test with that rank's traceback. A job that outlives
`timeout` is killed and reported, so a hang can never stall the suite.
"""
from __future__ import annotations

import io
import multiprocessing as mp
import os
import socket
import traceback
from datetime import timedelta
from typing import Any, Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn, rank, world, port, backend, pg_timeout, env, args, queue):
    os.environ.update(env)
    os.environ.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
         "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)}
    )
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend is not None:
            import hoccl_backend  # noqa: F401  (registers "hoccl")

            dist.init_process_group(backend, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=pg_timeout))
        result = fn(rank, world, *args)
        if backend is not None and dist.is_initialized():
            dist.destroy_process_group()
        # torch.save: tensors travel as bytes, not as shared-memory handles that die with us
        buf = io.BytesIO()
        torch.save(result, buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException as exc:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run_ranks(fn: Callable[..., Any], world: int, *args, backend: str | None = "hoccl",
              timeout: float = 120.0, pg_timeout: float = 60.0, env: dict | None = None,
              expect_errors: bool = False) -> list:
    """Run fn(rank, world, *args) on `world` spawned ranks; return per-rank results.

    With expect_errors=True, a rank's exception is returned as ("error", text) instead of
    failing, so tests can assert on the message every rank raised.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main,
                         args=(fn, r, world, port, backend, pg_timeout, env or {}, args, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, tuple] = {}
    try:
        import queue as queue_mod
        import time

        deadline = time.monotonic() + timeout
        while len(results) < world:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"ranks {sorted(set(range(world)) - set(results))} did not "
                                   f"finish within {timeout}s")
            try:
                rank, status, payload = queue.get(timeout=min(remaining, 1.0))
                results[rank] = (status, payload)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs)
                        if r not in results and p.exitcode not in (None, 0)]
                if dead and not expect_errors:
                    raise RuntimeError(f"rank(s) {dead} exited with codes "
                                       f"{[procs[r].exitcode for r in dead]} without a result")
                if dead and expect_errors:
                    for r in dead:
                        results[r] = ("error", f"exited with code {procs[r].exitcode}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    out = []
    for r in range(world):
        status, payload = results[r]
        if status == "error" and not expect_errors:
            raise AssertionError(f"rank {r} failed:\n{payload}")
        if status == "error":
            out.append(("error", payload))
        else:
            import torch

            out.append(torch.load(io.BytesIO(payload), weights_only=False))
    return out
