"""Compute beside the collectives, for `bench --busy N`: N threads per rank, each multiplying
256x256 float32 matrices in a loop (one torch thread each, the GIL released inside every
product), as a model's own compute or DDP's backward runs beside its gradient collectives.

The threads run for the whole benchmark, also while another backend or Open MPI takes its turn
(those ranks then share the machine with the same compute), and can be parked for the rounds
that time a backend on idle cores ("hoccl idle": the same ranks, the same buffers, no compute).
"""
from __future__ import annotations

import threading
import time

GEMM_SIZE = 256  # ~34 MFLOP a product: about a millisecond on one core, so parking is quick


class ComputeThreads:
    """`count` GEMM loops in this process; pause() parks them all before it returns."""

    def __init__(self, count: int):
        if count < 0:
            raise ValueError(f"compute threads per rank must be >= 0, got {count}")
        self._run = threading.Event()
        self._stop = threading.Event()
        self._parked = threading.Semaphore(0)
        self._lock = threading.Lock()
        self.products = 0
        self.busy_seconds = 0.0
        self._resumed_at = None
        self._threads = [threading.Thread(target=self._loop, name=f"bench-compute-{i}", daemon=True)
                         for i in range(count)]
        for t in self._threads:
            t.start()
        self.resume()

    def _loop(self):
        import torch

        a = torch.randn(GEMM_SIZE, GEMM_SIZE)
        b = torch.randn(GEMM_SIZE, GEMM_SIZE)
        c = torch.empty(GEMM_SIZE, GEMM_SIZE)
        done = 0
        while not self._stop.is_set():
            if not self._run.is_set():
                with self._lock:
                    self.products += done
                done = 0
                self._parked.release()
                self._run.wait()
                continue
            torch.mm(a, b, out=c)
            done += 1
        with self._lock:
            self.products += done

    def pause(self) -> None:
        if not self._threads or not self._run.is_set():
            return
        self._run.clear()
        for _ in self._threads:
            self._parked.acquire()
        self.busy_seconds += time.perf_counter() - self._resumed_at

    def resume(self) -> None:
        if not self._threads or self._run.is_set():
            return
        self._resumed_at = time.perf_counter()
        self._run.set()

    def gflops_per_thread(self) -> float:
        """GEMM rate per thread while running (products counted at each pause)."""
        if not self._threads or self.busy_seconds <= 0:
            return 0.0
        return self.products * 2 * GEMM_SIZE ** 3 / self.busy_seconds / len(self._threads) / 1e9

    def close(self) -> None:
        self.pause()
        self._stop.set()
        self._run.set()
        for t in self._threads:
            t.join()
