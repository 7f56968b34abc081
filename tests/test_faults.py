"""Bad input and faults: every surviving rank raises a clear error (op, rank, what mismatched)
within the group's timeout, and no shared-memory segment outlives the job."""
from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from dist_utils import run_ranks


def hoccl_segments() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("hoccl-")}


def expect_error(fn, *needles):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        msg = str(exc)
        for n in needles:
            assert n in msg, f"expected {n!r} in error: {msg}"
        return msg
    raise AssertionError(f"no error raised; expected one mentioning {needles}")


def mismatches(rank, world):
    msgs = {}
    # different element counts
    t = torch.ones(10 + rank)
    msgs["numel"] = expect_error(lambda: dist.all_reduce(t), "all_reduce", f"rank {rank}", "elements")
    # different dtypes
    t = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)
    msgs["dtype"] = expect_error(lambda: dist.all_reduce(t), "all_reduce", "dtype")
    # different ops
    msgs["kind"] = expect_error(
        lambda: dist.broadcast(torch.ones(3), 0) if rank == 0 else dist.all_reduce(torch.ones(3)),
        f"rank {rank}", "called")
    # split sizes that disagree between sender and receiver
    inp = torch.ones(world * 2)
    out = torch.empty(world * 2 + (1 if rank == 0 else 0))
    osplits = [2] * world
    if rank == 0:
        osplits[1] += 1
    msgs["splits"] = expect_error(
        lambda: dist.all_to_all_single(out, inp, output_split_sizes=osplits, input_split_sizes=[2] * world),
        "all_to_all_single", "rank 1 sends 8 bytes to rank 0 but rank 0 expects 12 bytes")
    # every rank's blocks are even, but rank 0's are larger than its peers'
    inp = torch.ones(world * (3 if rank == 0 else 2))
    msgs["even"] = expect_error(lambda: dist.all_to_all_single(torch.empty_like(inp), inp),
                                "all_to_all_single", f"rank {rank}", "rank 0 sends 12 bytes to rank 1 but rank 1 "
                                "expects 8 bytes from rank 0")
    # local errors, raised before anything is sent
    msgs["sum"] = expect_error(
        lambda: dist.all_to_all_single(torch.empty(4), torch.ones(4), [1] * world, [3] * world),
        "all_to_all_single", f"rank {rank}", "split sizes sum to")
    msgs["band"] = expect_error(lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND),
                                "all_reduce", "BAND needs an integer")
    msgs["list"] = expect_error(lambda: dist.all_gather([torch.empty(2)] * (world + 1), torch.ones(2)),
                                "all_gather", "output list has")
    msgs["agbase"] = expect_error(lambda: dist.all_gather_into_tensor(torch.empty(3), torch.ones(2)),
                                  "all_gather_into_tensor", "world_size x input")
    # the group still works after the mismatches above
    t = torch.full((5,), float(rank))
    dist.all_reduce(t)
    assert torch.all(t == sum(range(world)))
    # send/recv size mismatch is reported by the receiver
    if rank == 0:
        dist.send(torch.ones(5), 1)
    elif rank == 1:
        msgs["p2p"] = expect_error(lambda: dist.recv(torch.empty(4), 0), "recv from rank 0", "sent 20 bytes",
                                   "expects 16 bytes")
    dist.barrier()
    return msgs


def test_mismatched_arguments_raise_clear_errors():
    before = hoccl_segments()
    results = run_ranks(mismatches, 3, timeout=180)
    for rank, msgs in enumerate(results):
        assert f"on rank {rank}" in msgs["numel"]
    assert hoccl_segments() == before


def never_arrives(rank, world):
    if rank == world - 1:
        time.sleep(8)  # far longer than the group's 3 s timeout
        return "slept"
    start = time.monotonic()
    msg = expect_error(lambda: dist.all_reduce(torch.ones(100)), "all_reduce", f"rank {rank}")
    return msg, time.monotonic() - start


def test_rank_that_never_arrives_times_out():
    before = hoccl_segments()
    results = run_ranks(never_arrives, 3, pg_timeout=3, timeout=120)
    for rank in range(2):
        msg, elapsed = results[rank]
        assert "Timed out after 3000 ms" in msg or "aborted" in msg, msg
        assert elapsed < 3 + 5, f"rank {rank} took {elapsed:.1f}s to report a 3 s timeout"
    assert hoccl_segments() == before


def killed_mid_collective(rank, world):
    # Segments are mapped but already unlinked once the group exists.
    maps = open("/proc/self/maps").read()
    lines = [line for line in maps.splitlines() if "/dev/shm/hoccl-" in line]
    assert lines, "the group's segment should be mapped"
    assert all("(deleted)" in line for line in lines), lines
    addr = lines[0].split()[0]
    mode = os.stat(f"/proc/self/map_files/{addr}").st_mode & 0o777
    name = lines[0].split("/dev/shm/")[1].split()[0]
    assert mode == 0o600, oct(mode)
    assert len(name) >= len("hoccl-") + 24, name
    dist.all_reduce(torch.ones(10))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    msg = expect_error(lambda: [dist.all_reduce(torch.ones(1 << 20)) for _ in range(50)], "all_reduce")
    return msg, time.monotonic() - start


def test_rank_killed_mid_collective():
    before = hoccl_segments()
    results = run_ranks(killed_mid_collective, 3, pg_timeout=30, timeout=120, expect_errors=True)
    assert results[1][0] == "error"  # the killed rank
    for rank in (0, 2):
        assert results[rank][0] != "error", f"rank {rank} failed: {results[rank][1]}"
        msg, elapsed = results[rank]
        assert "rank 1" in msg and ("has exited" in msg or "aborted" in msg), msg
        assert elapsed < 10, f"rank {rank} needed {elapsed:.1f}s to notice a dead peer (timeout 30 s)"
    assert hoccl_segments() == before


def recv_without_sender(rank, world):
    if rank == 0:
        start = time.monotonic()
        msg = expect_error(lambda: dist.recv(torch.empty(3), 1), "recv from rank 1", "Timed out")
        return msg, time.monotonic() - start
    time.sleep(4)
    return None


def test_recv_without_sender_times_out():
    results = run_ranks(recv_without_sender, 2, pg_timeout=2, timeout=60)
    assert results[0][1] < 2 + 3


def monitored_barriers(rank, world):
    import hoccl_backend

    out = {}
    hoccl_backend.monitored_barrier(timeout=timedelta(seconds=20))  # everyone arrives
    # Rank 2 stays away: rank 0 names it, rank 1 learns rank 0 failed.
    if rank != 2:
        out["one"] = expect_error(lambda: hoccl_backend.monitored_barrier(timeout=timedelta(seconds=1)),
                                  f"Rank {rank}")
    # Ranks 1 and 2 stay away; with wait_all_ranks rank 0 names both.
    if rank == 0:
        start = time.monotonic()
        out["all"] = expect_error(
            lambda: hoccl_backend.monitored_barrier(timeout=timedelta(seconds=1), wait_all_ranks=True),
            "Ranks 1, 2 failed to pass monitoredBarrier")
        out["all_s"] = time.monotonic() - start
    dist.barrier()  # the group is still usable after refused monitored barriers
    t = torch.ones(4)
    dist.all_reduce(t)
    out["sum"] = t
    return out


def test_monitored_barrier_names_missing_ranks():
    results = run_ranks(monitored_barriers, 3, pg_timeout=30, timeout=120)
    assert "Rank 2 failed to pass monitoredBarrier" in results[0]["one"]
    assert "Rank 1 successfully reached monitoredBarrier" in results[1]["one"]
    assert "rank 0" in results[1]["one"]
    assert "Ranks 1, 2 failed" in results[0]["all"] and results[0]["all_s"] < 5
    for r in results:
        assert torch.equal(r["sum"], torch.full((4,), 3.0))
