"""How close can any phase plan get to the lower bound under a simulator model?  A time-sharing LP.

Under ``contention`` (or ``fluid``) the rates of the flows running at a moment depend only on
which flows run (max-min sharing, eta(k) per link).  A plan's execution is therefore a sequence
of intervals, each with a fixed set of running transfers (a *configuration*) at that set's
rates, so its data time is at least the optimum of the LP

    minimise sum_c x_c   subject to   sum_c x_c * rate_c(p) >= demand(p) for every pair p,  x >= 0

over all configurations c (x_c: time spent in c).  Phase start latencies come on top.

* ``--exact`` enumerates every configuration (2^pairs - 1: 4 GPUs, 12 pairs).  The LP optimum is
  then a lower bound on every plan (latencies aside), tighter than the link bound when sharing
  costs eta.
* Otherwise column generation with a greedy pricing step (add the pair that raises the
  configuration's dual value most, until none does) finds good configurations on 8 GPUs.  Its
  value is not a bound (the pricing is heuristic), but the plan built from it (one phase per
  configuration used, bytes = time x rate, trimmed to the demand) is simulated, so it shows
  what is reachable.

Needs scipy (``pip install scipy``).  An analysis tool: minutes per case in Python, not a planner.

usage: python scripts/varipath_lp_bound.py PRESET [--model contention] [--traffic zipf1.2,hot4-80]
                                           [--size 256M] [--exact] [--rounds 60]
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from varipath import lower_bound, scheduler_for, simulate  # noqa: E402
from varipath.simulate import _eta_vec, _incidence, _maxmin, check_demand  # noqa: E402
from varipath.topology import Topology  # noqa: E402
from varipath.traffic import make  # noqa: E402


class Configurations:
    """Rates of sets of concurrent pairs under the model, as the simulator computes them."""

    def __init__(self, topo: Topology, model: str) -> None:
        if model not in ("fluid", "contention"):
            raise SystemExit("the time-sharing LP needs rates that depend only on the running set: "
                             "fluid or contention (dma queues depend on the order)")
        self.model = model
        self.inc = _incidence(topo)
        n = topo.num_gpus
        self.pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
        self.paths = [self.inc.path(s, d) for s, d in self.pairs]

    def rates(self, members: list) -> np.ndarray:
        fidx = np.concatenate([np.full(len(self.paths[i]), k) for k, i in enumerate(members)])
        lidx = np.concatenate([self.paths[i] for i in members])
        cap = self.inc.bw
        if self.model == "contention":
            cap = cap * _eta_vec(np.bincount(lidx, minlength=len(cap)))
        return _maxmin(fidx, lidx, len(members), cap)

    def column(self, members) -> np.ndarray:
        members = sorted(set(members))
        col = np.zeros(len(self.pairs))
        col[members] = self.rates(members)
        return col


def solve(columns: list, demand: np.ndarray, active: list):
    from scipy.optimize import linprog

    a = np.array(columns).T
    res = linprog(np.ones(a.shape[1]), A_ub=-a[active], b_ub=-demand[active], bounds=(0, None), method="highs")
    if res.status != 0:
        raise SystemExit(f"LP failed: {res.message}")
    duals = np.zeros(len(demand))
    duals[active] = -res.ineqlin.marginals
    return a, res, duals


def price(conf: Configurations, duals: np.ndarray, active: list):
    """Greedy: grow a configuration by the pair that raises sum(duals * rates) most."""
    members: list = []
    value = 0.0
    while True:
        best = None
        for p in active:
            if p in members:
                continue
            v = float(np.dot(duals[members + [p]], conf.rates(members + [p])))
            if v > value * (1 + 1e-9) and (best is None or v > best[0]):
                best = (v, p)
        if best is None:
            return members, value
        value, members = best[0], members + [best[1]]


def plan_from(conf: Configurations, a: np.ndarray, x: np.ndarray, demand: np.ndarray, active: list) -> list:
    """One phase per configuration used, longest first; bytes = time x rate, trimmed to what is left."""
    left = demand.copy()
    phases = []
    for c in sorted(np.flatnonzero(x > 1e-9 * x.sum()), key=lambda c: -x[c]):
        phase = []
        for i in np.flatnonzero(a[:, c] > 0):
            b = int(round(min(left[i], x[c] * a[i, c])))
            if b > 0:
                phase.append((*conf.pairs[i], b))
                left[i] -= b
        if phase:
            phases.append(phase)
    rest = [(*conf.pairs[i], int(left[i])) for i in active if left[i] >= 1]
    return phases + ([rest] if rest else [])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("preset")
    ap.add_argument("--hosts", type=int, default=1)
    ap.add_argument("--model", default="contention")
    ap.add_argument("--traffic", default="zipf1.2,zipf1.6,hot4-80")
    ap.add_argument("--size", default="256M")
    ap.add_argument("--exact", action="store_true", help="enumerate every configuration (<= 4 GPUs)")
    ap.add_argument("--rounds", type=int, default=60, help="column-generation rounds")
    args = ap.parse_args(argv)
    size = int(float(args.size[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[args.size[-1]]) \
        if args.size[-1] in "KMG" else int(args.size)
    topo = Topology.preset(args.preset, args.hosts)
    n = topo.num_gpus
    conf = Configurations(topo, args.model)
    if args.exact and len(conf.pairs) > 16:
        raise SystemExit("--exact enumerates 2^pairs configurations: 4 GPUs at most")
    every = None
    if args.exact:
        every = [conf.column(list(m)) for k in range(1, len(conf.pairs) + 1)
                 for m in itertools.combinations(range(len(conf.pairs)), k)]
    print(f"{args.preset} x{args.hosts} ({n} GPUs), {args.model}, {args.size} per rank; "
          f"{'exact: all ' + str(len(every)) + ' configurations' if every else 'column generation'}")
    for traffic in args.traffic.split(","):
        t0 = time.time()
        dem = check_demand(make(traffic, n, size), n)
        demand = np.array([dem[s, d] for s, d in conf.pairs], dtype=float)
        active = [i for i in range(len(conf.pairs)) if demand[i] > 0]
        lb = lower_bound(topo, dem)
        vp = simulate(topo, scheduler_for(topo, args.model).plan(dem.ravel().tolist()), args.model)
        if every is not None:
            a, res, _ = solve(every, demand, active)
            rounds = 0
        else:
            columns = [conf.column([i]) for i in active]
            idx = {p: i for i, p in enumerate(conf.pairs)}
            for phase in scheduler_for(topo, args.model).plan(dem.ravel().tolist()):  # a warm start
                columns.append(conf.column([idx[(s, d)] for s, d, b in phase if b > 0]))
            for rounds in range(1, args.rounds + 1):
                a, res, duals = solve(columns, demand, active)
                members, value = price(conf, duals, active)
                if value <= 1 + 1e-6:
                    break
                columns.append(conf.column(members))
        phases = plan_from(conf, a, res.x, demand, active)
        sim = simulate(topo, phases, args.model)
        kind = "LP optimum (a bound)" if every is not None else "LP value (heuristic pricing)"
        print(f"  {traffic:9s} VarioPath {vp / lb:.3f} x LB | {kind} {res.fun / lb:.3f} | its plan simulated "
              f"{sim / lb:.3f} ({len(phases)} phases) | {rounds} rounds, {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
