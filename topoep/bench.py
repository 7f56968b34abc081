"""TopoEP benchmark: imbalance, cross-host token fraction and planner time.

    python -m topoep.bench [--quick] [--slots 2] [--json FILE] [--no-jit]
    python -m topoep.bench --steps N [--every K] [--window W] [--threshold T]  # over steps


For skewed synthetic routing (Zipf s = 0.8/1.2/1.6, "X% of tokens to 4 hot experts" for
X = 30/50/80/95, drifting skew over 8 steps), 64 and 256 experts, 8/16/64 GPUs on 1/2/8 hosts,
it compares no balancing, the EPLB-style baseline (same replica budget: E + R * slots physical
experts) and TopoEP. imbalance = max GPU load / mean GPU load (balancedness = 1 / imbalance);
drifting cases report the mean over steps. plan_ms is TopoEP's planner time on CPU (median;
one thread), also on GPU when one is present; the EPLB column times its host reference code.
The planner object is reused as in training, so from its second call it replays the traced
plan (``--no-jit``: eager every call); the one-time trace is not in plan_ms.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from .eplb import eplb_balance, no_balance
from .planner import TopoEPPlanner
from .workloads import traffic_cases

TOPOLOGIES = ((8, 1), (16, 2), (64, 8))  # (GPUs, hosts)
EXPERTS = (64, 256)


def _time_ms(fn, repeats: int, sync=None, clock=time.perf_counter) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t = clock()
        fn()
        if sync:
            sync()
        ts.append((clock() - t) * 1e3)
    return statistics.median(ts)


def run(slots: int = 2, quick: bool = False, per_rank: int = 8192, seed: int = 0,
        progress=True, jit: bool = True) -> list[dict]:
    torch.set_num_threads(1)
    has_gpu = torch.cuda.is_available()
    records = []
    cases = [(e, r, h) for e in EXPERTS for r, h in TOPOLOGIES]
    for ci, (e, r, h) in enumerate(cases):
        g = r // h
        planner = TopoEPPlanner(e, h, g, slots, jit=jit)
        for name, steps in traffic_cases(r, e, seed, per_rank):
            if quick and name == "drift":
                steps = steps[:3]
            acc = {m: {"imbalance": 0.0, "cross_host_fraction": 0.0, "plan_ms": 0.0}
                   for m in ("none", "eplb", "topoep")}
            extra = {"replicas": 0.0, "worse_than_eplb": 0, "plan_ms_gpu": None,
                     "gpu_bitwise_equal": None}
            for counts in steps:
                cn = counts.numpy()
                nb = no_balance(cn, h, g)
                t = time.perf_counter()
                eb = eplb_balance(cn, h, g, slots)
                eplb_ms = (time.perf_counter() - t) * 1e3
                p = planner(counts)
                ms = _time_ms(lambda: planner(counts), 3 if quick else 15)
                # CPU time of this process: less sensitive to other jobs on a shared machine
                cpu_ms = _time_ms(lambda: planner(counts), 3 if quick else 15,
                                  clock=time.process_time)
                extra["plan_cpu_ms"] = extra.get("plan_cpu_ms", 0.0) + cpu_ms / len(steps)
                topo_imb = float(p.imbalance())
                for m, imb, ch, pm in (("none", nb.imbalance, nb.cross_host_fraction, 0.0),
                                       ("eplb", eb.imbalance, eb.cross_host_fraction, eplb_ms),
                                       ("topoep", topo_imb, float(p.cross_host_fraction()), ms)):
                    acc[m]["imbalance"] += imb / len(steps)
                    acc[m]["cross_host_fraction"] += ch / len(steps)
                    acc[m]["plan_ms"] += pm / len(steps)
                extra["replicas"] += float(p.num_replicas()) / len(steps)
                extra["worse_than_eplb"] += int(float(p.load.max()) > eb.gpu_load.max() + 1)
                if has_gpu:
                    cg = counts.cuda()
                    pg = planner(cg)
                    extra["gpu_bitwise_equal"] = bool(
                        torch.equal(pg.tokens.cpu(), p.tokens)
                        and torch.equal(pg.slot_expert.cpu(), p.slot_expert))
                    extra["plan_ms_gpu"] = _time_ms(lambda: planner(cg), 5 if quick else 20,
                                                    torch.cuda.synchronize)
            for m, vals in acc.items():
                rec = {"experts": e, "gpus": r, "hosts": h, "traffic": name, "method": m,
                       "imbalance": round(vals["imbalance"], 4),
                       "balancedness": round(1.0 / vals["imbalance"], 4),
                       "cross_host_fraction": round(vals["cross_host_fraction"], 4),
                       "plan_ms": round(vals["plan_ms"], 3), "slots_per_gpu": slots,
                       "steps": len(steps)}
                if m == "topoep":
                    rec.update({k: v for k, v in extra.items()})
                records.append(rec)
            if progress:
                print(f"\r[{ci + 1}/{len(cases)}] E={e} R={r} H={h} {name}      ", end="",
                      file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return records


def table(records: list[dict]) -> str:
    by = {}
    for rec in records:
        by.setdefault((rec["experts"], rec["gpus"], rec["hosts"], rec["traffic"]), {})[
            rec["method"]] = rec
    gpu = any(r.get("plan_ms_gpu") for r in records if r["method"] == "topoep")
    head = ("| experts | GPUs | hosts | traffic | none | EPLB | TopoEP | cross-host none / "
            "EPLB / TopoEP | TopoEP plan ms (CPU) |" + (" plan ms (GPU) |" if gpu else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for (e, r, h, t), m in by.items():
        row = (f"| {e} | {r} | {h} | {t} | {m['none']['imbalance']:.3f} | "
               f"{m['eplb']['imbalance']:.3f} | **{m['topoep']['imbalance']:.3f}** | "
               f"{m['none']['cross_host_fraction']:.2f} / {m['eplb']['cross_host_fraction']:.2f}"
               f" / {m['topoep']['cross_host_fraction']:.2f} | {m['topoep']['plan_ms']:.2f} |")
        if gpu:
            row += f" {m['topoep'].get('plan_ms_gpu') or 0:.2f} |"
        lines.append(row)
    return "\n".join(lines)


def summary(records: list[dict]) -> str:
    topo = [r for r in records if r["method"] == "topoep"]
    eplb = {(r["experts"], r["gpus"], r["hosts"], r["traffic"]): r for r in records
            if r["method"] == "eplb"}
    worse = [r for r in topo if r["imbalance"] > eplb[(r["experts"], r["gpus"], r["hosts"],
                                                       r["traffic"])]["imbalance"] + 1e-3]
    over = [r for r in topo if r["imbalance"] > 1.05]
    big = [r["plan_ms"] for r in topo if r["experts"] == 256 and r["gpus"] == 64]
    big_cpu = [r["plan_cpu_ms"] for r in topo if r["experts"] == 256 and r["gpus"] == 64]
    out = [f"cases: {len(topo)}; TopoEP imbalance > 1.05 in {len(over)}; worse than EPLB "
           f"(by > 0.001) in {len(worse)}",
           f"TopoEP max imbalance {max(r['imbalance'] for r in topo):.3f}; EPLB max "
           f"{max(r['imbalance'] for r in eplb.values()):.3f}",
           f"planner 256 experts x 64 GPUs, CPU: median {statistics.median(big):.2f} ms, "
           f"max {max(big):.2f} ms wall; median {statistics.median(big_cpu):.2f} ms process "
           f"CPU time; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"]
    for r in over:
        out.append(f"  > 1.05: E={r['experts']} R={r['gpus']} H={r['hosts']} {r['traffic']}: "
                   f"{r['imbalance']:.3f}")
    for r in worse:
        out.append(f"  worse than EPLB: E={r['experts']} R={r['gpus']} H={r['hosts']} "
                   f"{r['traffic']}: {r['imbalance']:.3f}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m topoep.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=2, help="replica slots per GPU (default 2)")
    ap.add_argument("--quick", action="store_true", help="fewer timing repeats and drift steps")
    ap.add_argument("--tokens", type=int, default=8192,
                    help="token-expert assignments per rank (default 8192)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE", help="write one record per case and method")
    ap.add_argument("--no-jit", dest="jit", action="store_false",
                    help="plan eagerly every call (default: replay the traced plan from the "
                         "second call, as a reused TopoEPPlanner does)")
    ap.add_argument("--steps", type=int, metavar="N",
                    help="benchmark over N steps (stationary, drifting and switching "
                         "workloads; none / EPLB every K / TopoEP / TopoEP + re-placement), "
                         "see topoep.bench_steps")
    ap.add_argument("--every", type=int, default=16, metavar="K",
                    help="with --steps: EPLB re-places every K steps; also the warm-up "
                         "(default 16)")
    ap.add_argument("--window", type=int, default=4, metavar="W",
                    help="with --steps: TopoEP re-places when the imbalance stays above "
                         "--threshold for W steps, from their counts (default 4)")
    ap.add_argument("--threshold", type=float, default=1.02,
                    help="with --steps: see --window (default 1.02)")
    ap.add_argument("--expert-mb", type=float, default=None,
                    help="with --steps: bytes of one expert's weights in MB (default 17.3: "
                         "SwiGLU, d_model 2048, d_ff 1408, bf16)")
    args = ap.parse_args(argv)
    if args.steps is not None:
        if args.steps < 1:
            ap.error("--steps must be >= 1")
        from . import bench_steps
        return bench_steps.main(args)
    t0 = time.time()
    records = run(args.slots, args.quick, args.tokens, args.seed, jit=args.jit)
    report(f"# TopoEP bench: slots/GPU={args.slots}, {args.tokens} assignments/rank, "
           f"planner {'traced (jit)' if args.jit else 'eager'}, "
           f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
           f"{time.strftime('%Y-%m-%d')}", table(records), summary(records), t0, records,
           args.json)
    return 0


def report(header: str, table_text: str, summary_text: str, t0: float, records: list,
           json_path: str | None, indent: int = 1) -> None:
    """Print a bench's header, table, summary and run time; write its records as JSON."""
    print(header)
    print(table_text)
    print()
    print(summary_text)
    print(f"({time.time() - t0:.1f} s)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(records, f, indent=indent)


if __name__ == "__main__":
    sys.exit(main())
