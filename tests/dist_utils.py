"""Run a function on real ranks: one process per rank, a real TCPStore, a real backend.

Ranks are forked from a fork server that has imported torch once (multiprocessing's
"forkserver" context with torch preloaded): each rank is still its own process with its own
memory, but skips the import, ~1 s of CPU a rank on the 2-core VM, most of a small job's time.
Each rank starts from the test process's environment, working directory, stdout and stderr as
they are at the call (the server keeps the ones it started with), then applies its `env`: all of
it after the fork, so it reaches everything hoccl reads (at group creation and later), not what
torch itself reads while it is imported.

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


class _TestStdio:
    """The test process's stdout and stderr as they are now (pytest's capture, when a test
    captures), for a rank: its fork server keeps the ones it was started with. Pickled with the
    rank's arguments, each travels as a duplicated descriptor."""

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return (_received_fds, (DupFd(1), DupFd(2)))


def _received_fds(out, err):
    return out.detach(), err.detach()


def _rank_main(fn, rank, world, port, backend, pg_timeout, env, args, queue, stdio, parent_env):
    for fd, target in zip(stdio, (1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    # The fork server's environment is the test process's when the server started; a rank starts
    # from the test process's as it is now, as a spawned one would (multiprocessing itself
    # carries the working directory and the main module).
    os.environ.clear()
    os.environ.update(parent_env)
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


def _context():
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed"])  # no-op once the server runs
    return ctx


def run_ranks(fn: Callable[..., Any], world: int, *args, backend: str | None = "hoccl",
              timeout: float = 120.0, pg_timeout: float = 60.0, env: dict | None = None,
              expect_errors: bool = False) -> list:
    """Run fn(rank, world, *args) on `world` ranks; return per-rank results.

    With expect_errors=True, a rank's exception is returned as ("error", text) instead of
    failing, so tests can assert on the message every rank raised.
    """
    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    parent_env = dict(os.environ)
    procs = [ctx.Process(target=_rank_main,
                         args=(fn, r, world, port, backend, pg_timeout, env or {}, args, queue, _TestStdio(),
                               parent_env))
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
