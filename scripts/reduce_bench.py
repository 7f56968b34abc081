"""Host reduction micro-benchmark: reduceInto on every instruction set this CPU has, side by side.

    PYTHONPATH=$PWD python3 scripts/reduce_bench.py [--sizes 64K,1M,16M] [--sources 2,4]
                                                    [--dtypes bf16,fp16,fp32] [--op SUM]

One process, one thread, separate destination. A figure is GB/s of memory touched, (sources + 1)
x size / time, best of --rounds rounds of enough calls to fill about 20 ms each: short rounds and
the best of many, so that on a shared machine some rounds run undisturbed; the instruction sets
take turns within a round, so drift hits them alike. "size" is one tensor's bytes. Prints the
machine's load average with the table; asserts nothing.
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from hoccl_backend import _C
from hoccl_backend.bench import parse_size

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def seconds_per_call(dst, srcs, op, isa, calls) -> float:
    t0 = time.perf_counter()
    _C._reduce_into_on(dst, srcs, op, isa, calls)
    return (time.perf_counter() - t0) / calls


def calls_for(dst, srcs, op, isa, target_s=0.02) -> int:
    calls = 1
    while True:
        if seconds_per_call(dst, srcs, op, isa, calls) * calls >= target_s / 4 or calls >= 1 << 20:
            return max(1, calls * 4)
        calls *= 4


def measure(dtype, nbytes, nsrc, op, isas, rounds) -> dict[str, float]:
    n = max(1, nbytes // torch.empty((), dtype=dtype).element_size())
    srcs = [torch.randn(n).to(dtype) for _ in range(nsrc)]
    dst = torch.empty_like(srcs[0])
    calls = {isa: calls_for(dst, srcs, op, isa) for isa in isas}
    best = {isa: float("inf") for isa in isas}
    for r in range(rounds):
        for isa in (isas if r % 2 == 0 else list(reversed(isas))):
            best[isa] = min(best[isa], seconds_per_call(dst, srcs, op, isa, calls[isa]))
    touched = (nsrc + 1) * n * dst.element_size()
    return {isa: touched / best[isa] / 1e9 for isa in isas}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64K,1M,16M")
    ap.add_argument("--sources", default="2,4")
    ap.add_argument("--dtypes", default="bf16,fp16,fp32")
    ap.add_argument("--op", default="SUM", help="c10d spelling: SUM, PRODUCT, MIN, MAX")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    info = _C.reduce_isas()
    isas = info["available"]
    print(f"# reduceInto {args.op}, GB/s of memory touched; reduceInto uses {info['used']}; "
          f"load average {' '.join(open('/proc/loadavg').read().split()[:3])}; {os.cpu_count()} cores")
    header = f"{'dtype':>5} {'size':>6} {'srcs':>4} " + " ".join(f"{i:>9}" for i in isas)
    print(header + "  " + " ".join(f"{i + '/portable':>16}" for i in isas[1:]))
    for dname in args.dtypes.split(","):
        for size in args.sizes.split(","):
            for nsrc in (int(s) for s in args.sources.split(",")):
                gbs = measure(DTYPES[dname], parse_size(size), nsrc, args.op, isas, args.rounds)
                cells = " ".join(f"{gbs[i]:9.2f}" for i in isas)
                ratios = " ".join(f"{gbs[i] / gbs['portable']:15.2f}x" for i in isas[1:])
                print(f"{dname:>5} {size:>6} {nsrc:>4} {cells}  {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
