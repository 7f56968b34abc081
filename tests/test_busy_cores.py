"""Shared cores (issue 33): ranks decide from the whole job and the machine whether their cores are
shared (no spinning, no yields beside the job's own compute, plans across hosts on a worker
thread), and all_reduce stages in one round unless told otherwise. Results must not depend on
the mode: every size around the thresholds the mode moves is checked bitwise against an
independent rank-order reference and against the other mode, at worlds 2, 3 and 4. None of these
tests is timed; the benchmark (`bench --busy`) measures."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from dist_utils import run_ranks

KIB = 1 << 10
# Bytes around every threshold the mode moves: the one-shot limit (64K), the idle round (128K),
# several idle rounds (1M + a remainder), and the start of direct reads (HOCCL_ALLREDUCE_CMA_MIN_BYTES,
# 4M); odd element counts leave a remainder in the last round and uneven parts per rank.
SIZES = [4, 64 * KIB - 4, 64 * KIB + 4, 128 * KIB - 2, 128 * KIB, 128 * KIB + 6, 1024 * KIB + 12,
         4096 * KIB - 4, 4096 * KIB, 4096 * KIB + 8]


def _rank_input(rank: int, numel: int, dtype, case: int):
    import torch

    g = torch.Generator().manual_seed(7919 * case + 104729 * rank + 3)
    return torch.randn(numel, generator=g, dtype=torch.float32).to(dtype)


def _reference(world: int, numel: int, dtype, case: int):
    """Rank order, one element at a time as IEEE adds: 16-bit types accumulate in float and round
    once at the end, float32 adds in float32 (what every plan must reproduce bit for bit)."""
    import torch

    acc = _rank_input(0, numel, dtype, case).float()
    for r in range(1, world):
        acc = acc + _rank_input(r, numel, dtype, case).float()
    return acc.to(dtype)


def _group_with_policy(policy: str):
    """A hoccl group over every rank whose configuration was read with HOCCL_WAIT_POLICY=policy."""
    import torch.distributed as dist

    os.environ["HOCCL_WAIT_POLICY"] = policy
    try:
        return dist.new_group(backend="hoccl")
    finally:
        os.environ.pop("HOCCL_WAIT_POLICY", None)


def all_reduce_in_both_modes(rank, world, sizes, dtype_names):
    import torch
    import torch.distributed as dist

    groups = {p: _group_with_policy(p) for p in ("busy", "idle")}
    for g in groups.values():  # a group agrees on its mode at one op and applies it from the next
        dist.all_reduce(torch.ones(4), group=g)
    mismatches = []
    for case, (nbytes, name) in enumerate((n, d) for n in sizes for d in dtype_names):
        dtype = getattr(torch, name)
        numel = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
        expected = _reference(world, numel, dtype, case)
        for policy, g in groups.items():
            x = _rank_input(rank, numel, dtype, case)
            dist.all_reduce(x, group=g)
            if not torch.equal(x.view(torch.int16 if dtype.itemsize == 2 else torch.int32),
                               expected.view(torch.int16 if dtype.itemsize == 2 else torch.int32)):
                bad = (x != expected).nonzero()
                mismatches.append(f"{policy} {name} {nbytes}B: {bad.numel()} elements differ, first at "
                                  f"{bad[0].item()}: {x[bad[0]].item()} vs {expected[bad[0]].item()}")
    return mismatches


@pytest.mark.parametrize("world", [2, 3, 4])
def test_all_reduce_is_bitwise_the_rank_order_reference_in_busy_and_idle_modes(world):
    results = run_ranks(all_reduce_in_both_modes, world, SIZES, ["float32", "bfloat16"], timeout=600,
                        pg_timeout=300)
    assert results == [[]] * world, results[0][:5]


def traced_all_reduces(rank, world, nbytes, ops):
    import torch
    import torch.distributed as dist

    x = torch.ones(nbytes // 4)
    for _ in range(ops):
        dist.all_reduce(x)
    return x[0].item()


def _barriers_per_op(stderr: str, nbytes: int) -> list[int]:
    """Barrier counts of the traced all_reduces of this size (HOCCL_DEBUG=TRACE lines)."""
    pattern = rf"all_reduce #\d+ algo=\S+ transport=\S+ bytes={nbytes} .*?barriers [\d.]+ in (\d+)"
    return [int(n) for n in re.findall(pattern, stderr)]


@pytest.mark.parametrize("policy,rounds,barriers",
                         [("busy", "auto", 2), ("idle", "auto", 2), ("idle", "128K", 16), ("busy", "128K", 16)])
def test_a_1mib_all_reduce_stages_in_one_round_unless_told_otherwise(capfd, policy, rounds, barriers):
    # rs-ag: 2 barriers per round, one round of the whole slot by default, 8 of 128 KiB when set.
    env = {"HOCCL_DEBUG": "TRACE", "HOCCL_WAIT_POLICY": policy, "HOCCL_STAGED_ROUND_BYTES": rounds}
    assert run_ranks(traced_all_reduces, 2, 1 << 20, 3, env=env, timeout=180) == [8.0, 8.0]  # 1 doubled 3 times
    counts = _barriers_per_op(capfd.readouterr().err, 1 << 20)
    assert counts == [barriers] * 6, counts  # 3 ops on 2 ranks


def subgroup_after_the_job(rank, world, nbytes):
    """The 2-rank subgroup of a 4-rank job on 2 CPUs: its own size fits the CPUs, the job does not."""
    import torch
    import torch.distributed as dist
    from hoccl_backend import _C

    pair = dist.new_group([0, 1], backend="hoccl")
    ranks_seen = _C.job_ranks_on_host()
    if rank < 2:
        x = torch.ones(nbytes // 4)
        for _ in range(3):
            dist.all_reduce(x, group=pair)
        assert x[0].item() == 8.0  # 1 doubled by 3 all_reduces
    dist.barrier()
    return ranks_seen


def _on_two_cpus():
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to pin the ranks to")
    return cpus[:2]


def _pinned_job(rank, world, cpus, nbytes):
    import torch.distributed as dist
    from datetime import timedelta

    import hoccl_backend  # noqa: F401  (registers "hoccl" where torch does not autoload it)

    os.environ.pop("LOCAL_WORLD_SIZE", None)
    os.sched_setaffinity(0, cpus)
    dist.init_process_group("hoccl", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    try:
        return subgroup_after_the_job(rank, world, nbytes)
    finally:
        dist.destroy_process_group()


def test_a_subgroup_treats_cores_as_shared_when_the_job_outnumbers_them(capfd):
    cpus = _on_two_cpus()
    env = {"HOCCL_DEBUG": "TRACE"}
    assert run_ranks(_pinned_job, 4, cpus, 1 << 20, backend=None, env=env, timeout=300) == [4] * 4
    # The pair's ops after its first: one round (2 barriers), as the 4-rank job shares 2 CPUs.
    counts = _barriers_per_op(capfd.readouterr().err, 1 << 20)
    assert len(counts) == 6, counts
    assert counts[2:] == [2] * 4, counts


def test_runnable_threads_is_read_from_proc_loadavg():
    code = ("import torch\nfrom hoccl_backend import _C\n"
            "print(_C.runnable_threads_now(), open('/proc/loadavg').read().split()[3].split('/')[0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    mine, theirs = (int(v) for v in out.stdout.split())
    # Two reads a moment apart: both count at least the reader, and agree up to the machine's churn.
    assert mine >= 1 and theirs >= 1 and abs(mine - theirs) <= max(4, os.cpu_count())


@pytest.mark.parametrize("name,value", [("HOCCL_WAIT_POLICY", "sometimes"), ("HOCCL_SHARED_YIELD_US", "-5")])
def test_bad_wait_settings_fail_group_creation_naming_the_variable(name, value):
    results = run_ranks(traced_all_reduces, 2, 16, 1, env={name: value}, expect_errors=True, timeout=120)
    for status in results:
        assert status[0] == "error" and name in status[1], status


# --- whose threads compete for a waiter's core -------------------------------------------------

_SCAN_SCRIPT = r"""
import hashlib, json, os, threading, time
import torch
torch.set_num_threads(1)
from hoccl_backend import _C

def scans(n):
    return [_C.other_runnable_threads_in_process() for _ in range(n)]

# A sleeping thread whose name looks like a runnable one's stat line: "tid (a) R (b) S ...".
asleep, named = threading.Event(), threading.Event()
def sleeper():
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write("a) R (b")
    named.set()
    asleep.wait()
threading.Thread(target=sleeper).start()
named.wait()
def state(tid):  # read here without hoccl: the letter after the last ')'
    with open(f"/proc/self/task/{tid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
sleeper_tid = next(t for t in os.listdir("/proc/self/task") if open(f"/proc/self/task/{t}/comm").read() == "a) R (b\n")
while state(sleeper_tid) != "S":  # on a loaded machine it may wait for a core before it sleeps
    time.sleep(0.001)
idle = scans(5)

# Two threads hashing 16 MiB at a time (the GIL released inside): runnable whenever scanned.
stop, data = threading.Event(), b"x" * (16 << 20)
def hasher():
    while not stop.is_set():
        hashlib.sha256(data).digest()
hashers = [threading.Thread(target=hasher) for _ in range(2)]
for t in hashers:
    t.start()
busy = scans(20)
stop.set()
for t in hashers:
    t.join()
# An exited thread may stay runnable a moment on its way out (the kernel's side of the exit).
after = scans(1)
for _ in range(2000):
    if after[-1] == 0:
        break
    after += scans(1)
asleep.set()
print(json.dumps([idle, busy, after[-1]]))
"""


def test_a_scan_counts_this_process_s_runnable_threads_but_not_sleeping_ones():
    out = subprocess.run([sys.executable, "-c", _SCAN_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    idle, busy, after = json.loads(out.stdout.strip().splitlines()[-1])
    # Neither the caller nor a sleeper named like "(a) R (b" counts (another thread of torch's
    # may wake meanwhile: one scan of none is enough).
    assert min(idle) == 0, idle
    assert min(busy) >= 1 and max(busy) == 2, busy  # one holds the GIL or hashes at any moment
    assert after == 0, after  # threads that left are not read through files kept open for them


@pytest.mark.parametrize("ranks,cpus,loaded,compute,grouped,expected", [
    (2, 2, False, False, True, "none"),               # a core per rank, nothing else runs
    (4, 16, False, True, True, "none"),               # compute beside ranks that have cores: spin
    (4, 2, False, False, True, "among_ranks"),        # more ranks than CPUs
    (4, 2, True, False, True, "among_ranks"),         # other sessions' load: a yield still goes to a rank
    (2, 2, True, False, True, "among_ranks"),
    (2, 2, True, False, False, "with_other_work"),    # the scheduler hands yields to anyone's load
    (2, 2, True, True, True, "with_other_work"),      # the job's compute beside the ranks
    (4, 2, False, True, True, "with_other_work"),     # the load not seen yet: the compute is enough
])
def test_the_wait_policy_decides_from_ranks_per_cpu_load_and_the_job_s_compute(ranks, cpus, loaded, compute,
                                                                             grouped, expected):
    from hoccl_backend import _C

    assert _C.decide_core_sharing(ranks, cpus, loaded, compute, grouped) == expected


def test_the_compute_sampler_scans_when_cpu_time_says_the_answer_may_have_changed():
    from hoccl_backend import _C

    # (ms, CPU us the other threads took since the previous step, runnable threads a scan
    # finds) -> (scanned, computing).
    steps = [
        (0, 0, 0, True, False),      # the first op scans; the next unprompted scan is 50 ms on
        (1, 0, 0, False, False),
        (2, 500, 1, True, True),     # other threads took half a core: scan; compute counts at once...
        (3, 900, 1, True, True),     # ...and is still there a millisecond later
        (5, 800, 1, False, True),
        (8, 0, 1, False, True),      # quiet for 3 ms: within a clock tick's lag
        (10, 0, 1, True, True),      # quiet for 5 ms: scan; still runnable (a false prompt)...
        (12, 0, 0, False, True),     # ...which mutes prompts for 10 ms
        (21, 0, 0, True, True),      # quiet, prompts back: nothing runnable...
        (22, 0, 0, True, False),     # ...nor a millisecond later: compute stopped
        (23, 2000, 0, False, False),  # another backend's threads ran: a scan, 2 ms after the last
        (24, 0, 0, True, False),     # nothing runnable at the op: a false prompt, muted 10 ms
        (25, 3000, 0, False, False),
        (35, 0, -1, False, False),
        (74, 0, -1, True, False),    # 50 ms after the last full scan; unreadable changes nothing
        (80, 1000, 1, True, True),   # a thread still finishing as the op starts counts...
        (81, 0, 0, True, False),     # ...until it is gone a millisecond later
    ]
    got = _C.replay_compute_sampler([(ms, cpu, found) for ms, cpu, found, _, _ in steps])
    assert got == [(scanned, computing) for *_, scanned, computing in steps], got


def test_the_load_sampler_needs_two_of_five_samples_and_pauses_age_them_out():
    from hoccl_backend import _C

    # (ms, the machine over its CPUs at that op) -> (sampled, loaded). A sample every 50 ms at
    # most; loaded while two of the last five intervals' samples were over.
    steps = [
        (0, False, True, False),    # the first op samples: an idle machine
        (10, True, False, False),   # within the interval: no sample
        (50, True, True, False),    # one stray sample over does not flip it...
        (100, False, True, False),
        (150, True, True, True),    # ...a second within five intervals does
        (200, False, True, True),
        (250, False, True, True),
        (300, False, True, False),  # the sample at 50 left the last five
        (350, False, True, False),
        (400, True, True, False),
        (450, True, True, True),    # a lasting load flips it within two samples
        (2000, False, True, False),  # intervals without ops count as not loaded: a pause ages
        (2100, True, True, False),   # the history out, and one sample after it flips nothing...
        (2130, False, False, False),
        (2160, True, True, True),    # ...a second within the window does
        (2300, False, True, True),   # two intervals, one unsampled: both over still in the last five
        (2420, False, True, False),  # two more: the sample at 2100 leaves them
    ]
    got = _C.replay_load_sampler([(ms, over) for ms, over, _, _ in steps])
    assert got == [(sampled, loaded) for *_, sampled, loaded in steps], got


def modes_around_compute(rank, world, cpu, ops):
    """The wait policy each op of this rank saw: before, with and after a GEMM thread beside it,
    every rank on one CPU (more ranks than CPUs: cores shared whatever else runs)."""
    import threading
    import time

    import torch
    import torch.distributed as dist

    from hoccl_backend.bench_busy import ComputeThreads

    os.sched_setaffinity(0, [cpu])
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    x = torch.ones(1024)

    def phase():
        seen = []
        for _ in range(ops):
            dist.all_reduce(x)
            seen.append(backend.last_core_sharing())
            time.sleep(0.002)  # every phase spans over 100 ms: unprompted scans come every 50
        return seen

    before = phase()
    compute = ComputeThreads(1)
    during = phase()
    compute.close()
    after = phase()
    assert threading.active_count() == 1
    return before[-1], during[-1], after[-1]


def test_ranks_stop_yielding_while_the_job_s_own_compute_runs_beside_them():
    from hoccl_backend import _C

    cpu = _on_two_cpus()[0]
    results = run_ranks(modes_around_compute, 2, cpu, 60, timeout=300)
    quiet = "among_ranks" if _C.tasks_grouped() else None  # ungrouped: anyone's load takes the yields
    for before, during, after in results:
        assert during == "with_other_work", results
        if quiet:
            assert before == after == quiet, results


def test_a_yield_that_fed_work_outside_the_op_closes_the_gate_for_a_second():
    from hoccl_backend import _C

    # (ms when the yield ended, us it took, the awaited word moved) -> the gate open after it.
    steps = [
        (0.0, 100, False, True),      # a short yield: a peer rank's turn
        (1.0, 3000, True, True),      # a long one during which the peer arrived: it served the op
        (2.0, 600, False, False),     # long, and nothing moved: it fed something else
        (500.0, 10, False, False),    # closed for a second...
        (1002.5, 10, False, True),    # ...then open again
        (1003.0, 499, False, True),   # under the limit
        (1004.0, 2000, False, False),
    ]
    got = _C.replay_yield_gate([(ms, us, moved) for ms, us, moved, _ in steps])
    assert got == [open_ for *_, open_ in steps], got


def yields_beside_processes_of_the_session(rank, world, ops):
    """`ops` 4 KiB all_reduces beside CPU-bound processes of the same session (started by the
    test, one per CPU): (results right, lost yields, seconds, the wait mode of the last op)."""
    import time

    import torch
    import torch.distributed as dist
    from hoccl_backend import _C

    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    right = True
    lost = _C.lost_yields()
    start = time.monotonic()
    for i in range(ops):
        x = torch.full((1024,), float(rank + i))
        dist.all_reduce(x)
        right = right and bool((x == float(world * i + world * (world - 1) // 2)).all())
    return right, _C.lost_yields() - lost, time.monotonic() - start, backend.last_core_sharing()


def test_ranks_stop_yielding_to_cpu_bound_processes_of_their_own_session():
    """sched_yield feeds the yielder's whole scheduling group; where the scheduler groups tasks by
    session, a CPU-bound process started from the job's shell takes a yield for a whole time slice
    (world 2 on 2 CPUs beside two of them: 17-198 such yields in 1,000 ops before the gate, ~2 ms
    an op). The first one closes the gate for a second: each waiting thread loses at most one
    yield per second afterwards (caller and worker may both be waiting: two)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in os.sched_getaffinity(0)]
    try:
        results = run_ranks(yields_beside_processes_of_the_session, 2, 1000, timeout=300)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    for right, lost, seconds, _ in results:
        assert right, results
        assert lost <= 2 * (int(seconds) + 2), results
