"""Reused buffers that peers read with process_vm_readv go onto transparent huge pages the second
time their range is published (cuda/transport/shm/huge_pages.h). The results must stay exactly the references
computed from every rank's known inputs; the kernel's own accounting (/proc/self/smaps) must show
the promoted range on huge pages; a range is promoted at most once; HOCCL_HUGEPAGE_MIN_BYTES=0
turns it off. Where the kernel refuses MADV_COLLAPSE (checked independently below) nothing may
be counted as promoted and the results must still be right."""
from __future__ import annotations

import ctypes
import mmap

import pytest
import torch
import torch.distributed as dist

from collective_checks import assert_close, make_input
from dist_utils import run_ranks

HUGE = 2 << 20
MADV_COLLAPSE = 25


def _promoted():
    from hoccl_backend import _C

    return _C.huge_page_promoted_bytes()


def _kernel_collapses():
    """Independent probe: can this process collapse an anonymous range onto a huge page?"""
    buf = mmap.mmap(-1, 2 * HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # as tensors are
    try:
        base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        buf.write(b"\1" * (2 * HUGE))
        lo = (base + HUGE - 1) // HUGE * HUGE
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(HUGE), MADV_COLLAPSE)
        ok = rc == 0 and _anon_huge_kb(lo) >= HUGE // 1024
        del base
        return ok
    finally:
        try:
            buf.close()
        except BufferError:
            pass


def _anon_huge_kb(address):
    """AnonHugePages (kB) of the mapping holding `address`, from the kernel's smaps."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("AnonHugePages:"):
                return int(line.split()[1])
    return 0


def _interior_huge_pages(t):
    lo = (t.data_ptr() + HUGE - 1) // HUGE * HUGE
    return lo, (t.data_ptr() + t.numel() * t.element_size()) // HUGE * HUGE


def check_reused_buffers(rank, world):
    collapses = _kernel_collapses()
    n = (2 << 20) // world * world  # int64 elements: ~16 MiB per rank
    x = torch.empty(n, dtype=torch.int64)
    y = torch.empty(n, dtype=torch.int64)
    deltas = []
    for i in range(4):
        inputs = [make_input(r, 300 + i, n, torch.int64) for r in range(world)]
        x.copy_(inputs[rank])  # same buffer, new contents
        before = _promoted()
        dist.all_to_all_single(y, x)
        deltas.append(_promoted() - before)
        blk = n // world
        assert_close(y, torch.cat([inputs[s][rank * blk:(rank + 1) * blk] for s in range(world)]),
                     f"all_to_all_single round {i}")
    # The peers read every block but mine: that span's interior went onto huge pages.
    lo, hi = _interior_huge_pages(x)
    huge_kb = _anon_huge_kb(lo)
    # all_gather and the direct-read all_reduce on reused buffers keep their exact results.
    m = 1 << 20
    a = torch.empty(m, dtype=torch.float32)
    out = torch.empty(world * m, dtype=torch.float32)
    for i in range(3):
        ins = [make_input(r, 400 + i, m, torch.float32) for r in range(world)]
        a.copy_(ins[rank])
        dist.all_gather_into_tensor(out, a)
        assert_close(out, torch.cat(ins), f"all_gather round {i}")
        dist.all_reduce(a)
        assert_close(a, sum(t.double() for t in ins).float(), f"all_reduce round {i}")
    return collapses, deltas, huge_kb, hi - lo


@pytest.mark.parametrize("world", [2, 3])
def test_reused_buffer_promoted_once_with_exact_results(world):
    for collapses, deltas, huge_kb, interior in run_ranks(check_reused_buffers, world, timeout=300):
        assert deltas[0] == 0, deltas  # first use: only remembered
        assert deltas[2] == deltas[3] == 0, deltas  # never twice
        if collapses:
            assert deltas[1] >= HUGE, deltas  # second use: promoted
            assert huge_kb * 1024 >= deltas[1], (huge_kb, deltas)
            assert deltas[1] <= interior
        else:
            assert deltas == [0, 0, 0, 0], deltas


def check_fresh_buffers(rank, world):
    n = 2 << 20
    before = _promoted()
    for i in range(6):
        x = torch.full((n,), rank * 100 + i, dtype=torch.int64)
        y = torch.empty(n, dtype=torch.int64)
        dist.all_to_all_single(y, x)
        blk = n // world
        assert torch.equal(y, torch.cat([torch.full((blk,), s * 100 + i, dtype=torch.int64)
                                         for s in range(world)])), f"round {i}"
        del x, y
    return _promoted() - before


def test_fresh_buffers_pay_at_most_once():
    # A new tensor per op may land at the same address (the allocator reuses it): that range is
    # promoted at most once, so a loop of fresh buffers never pays a collapse per op.
    for total in run_ranks(check_fresh_buffers, 2, timeout=300):
        assert total <= 16 << 20, total


def test_off_switch():
    results = run_ranks(check_reused_buffers, 2, env={"HOCCL_HUGEPAGE_MIN_BYTES": "0"}, timeout=300)
    for _, deltas, _, _ in results:
        assert deltas == [0, 0, 0, 0], deltas
