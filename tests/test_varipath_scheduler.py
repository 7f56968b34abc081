"""C++ online scheduler: exact coverage, channel phases, determinism, cost model, errors."""
import numpy as np
import pytest

import varipath
import varipath.catalog
from varipath import analyzer as an
from varipath._build import load_scheduler
from varipath.catalog import working_set
from varipath.topology import Topology
from varipath.traffic import TRAFFICS, make

MB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HOCCL_CACHE_DIR", str(tmp_path_factory.mktemp("hoccl-cache")))
    yield
    mp.undo()


def _check_cover(phases, demand):
    n = demand.shape[0]
    got = np.zeros_like(demand)
    for ph in phases:
        pairs = [(s, d) for s, d, _ in ph]
        assert len(pairs) == len(set(pairs))  # one transfer per pair per phase
        for s, d, b in ph:
            assert s != d and b > 0
            got[s, d] += b
    want = demand.copy()
    np.fill_diagonal(want, 0)
    assert (got == want).all()


def _check_link_disjoint(phase, topo):
    """At most one transfer of the phase on every directed link (Topology.path)."""
    links = [l for s, d, _ in phase for l in topo.path(s, d)]
    assert len(links) == len(set(links))


@pytest.mark.parametrize("name,hosts", [("direct4", 1), ("gen4-4sw-2skt", 1), ("direct4", 3)])
@pytest.mark.parametrize("model", varipath.MODELS)
def test_covers_demand_exactly(name, hosts, model):
    topo = Topology.preset(name, hosts)
    n = topo.num_gpus
    rng = np.random.default_rng(7)
    cases = [make(t, n, s) for t in TRAFFICS for s in (MB, 256 * MB)]
    sparse = np.zeros((n, n), dtype=np.int64)
    sparse[0, n - 1] = 12345
    skew = (rng.pareto(1.1, (n, n)) * 1e6).astype(np.int64)
    skew[rng.random((n, n)) < 0.3] = 0
    for dem in cases + [sparse, skew, np.zeros((n, n), dtype=np.int64)]:
        _check_cover(varipath.schedule(dem, topo, model), dem)


def _fresh_scheduler(topo, model, **families):
    """A scheduler like varipath.scheduler_for's, not shared with other tests, restricted to
    the named candidate families (all others off)."""
    s = load_scheduler().Scheduler(topo.num_gpus, working_set(topo), topo.phase_start_s(), topo.pair_bandwidth())
    varipath.configure_scheduler(s, topo, model)
    if families:
        s.set_candidates(**{k: families.get(k, False) for k in
                            ("channels", "link_greedy", "peer_rounds", "direct", "time_share", "host_rounds",
                             "backfill")})
    return s


def test_channel_phases_are_contention_free():
    """With only the catalog family and merge factor 1, every phase lies inside one
    contention-free channel of the working set; check the link loads from Topology.path."""
    topo = Topology.preset("gen4-4sw-2skt")
    dem = make("uniform", 8, 256 * MB)
    phases, info = _fresh_scheduler(topo, "contention", channels=True).plan_info(dem.ravel().tolist())
    assert info["candidate"] == "channels"
    assert info["merge_factor"] == 1 and len(phases) == info["channel_phases"]
    chans = [set(c) for c in working_set(topo)]
    for ph in phases:
        pairs = {(s, d) for s, d, _ in ph}
        assert an.is_contention_free(topo, pairs)
        assert any(pairs <= c for c in chans)


@pytest.mark.parametrize("name,hosts,traffic", [("gen4-4sw-2skt", 1, "zipf1.2"), ("gen5-2sw", 2, "hot4-50"),
                                                ("direct4", 3, "moe-top2")])
def test_link_greedy_phases_use_each_link_once(name, hosts, traffic):
    """Link-greedy phases put at most one transfer on every directed link (so each runs alone at
    its full rate) and cover the demand exactly; checked against Topology.path."""
    topo = Topology.preset(name, hosts)
    dem = make(traffic, topo.num_gpus, 64 * MB)
    phases, info = _fresh_scheduler(topo, "contention", link_greedy=True).plan_info(dem.ravel().tolist())
    assert info["candidate"] == "link_greedy" and info["merge_factor"] == 1 and not info["backfilled"]
    _check_cover(phases, dem)
    for ph in phases:
        _check_link_disjoint(ph, topo)
        assert an.is_contention_free(topo, {(s, d) for s, d, _ in ph})


def _check_lasts_longest_alone(phase, topo, model):
    """The Python simulator's duration of one phase equals its longest transfer alone at its
    path's narrowest link (what the scheduler charges a disjoint or backfilled phase)."""
    from varipath.simulate import _incidence, _run_phase

    inc = _incidence(topo)
    alone = max(b / inc.bw[inc.path(s, d)].min() for s, d, b in phase)
    assert _run_phase(inc, phase, model, 2) == pytest.approx(alone, rel=2e-3)


@pytest.mark.parametrize("name,hosts,traffic,size", [("gen5-2sw", 4, "zipf1.6", 1024 * MB),
                                                     ("gen4-4sw-2skt", 4, "hot4-50", 256 * MB),
                                                     ("gen4-4sw-2skt", 1, "hot4-80", 16 * MB)])
def test_backfilled_phases_last_their_longest_transfer(name, hosts, traffic, size):
    """Backfill moves the transfers of short link-greedy phases into longer phases whose links
    they then share, but only where every flow's equal share keeps it within the phase's
    longest transfer alone.  The Python simulator (an independent max-min/eta implementation)
    must find every phase exactly that long, the plan must cover the demand and share some
    links, and the scheduler's estimate must match the simulated time (it charges every phase
    the worst start latency, so it may only be above, by at most one start latency a phase),
    and the plan simulate no slower than the plain link-greedy one."""
    topo = Topology.preset(name, hosts)
    dem = make(traffic, topo.num_gpus, size)
    phases, info = _fresh_scheduler(topo, "contention", link_greedy=True, backfill=True).plan_info(dem.ravel().tolist())
    assert info["candidate"] == "link_greedy" and info["backfilled"] and info["merge_factor"] == 1
    _check_cover(phases, dem)
    shared = 0
    for ph in phases:
        _check_lasts_longest_alone(ph, topo, "contention")
        links = [l for s, d, _ in ph for l in topo.path(s, d)]
        shared += len(links) != len(set(links))
    assert shared > 0  # backfill did put transfers on links already in use
    sim = varipath.simulate(topo, phases, "contention")
    assert sim <= info["est_cost_s"] * (1 + 1e-6)
    assert sim >= info["est_cost_s"] - len(phases) * topo.phase_start_s()
    plain = _fresh_scheduler(topo, "contention", link_greedy=True).plan(dem.ravel().tolist())
    assert sim <= varipath.simulate(topo, plain, "contention")


def test_link_greedy_keeps_bottleneck_busy():
    """Uniform traffic on 4 gen4 hosts: every NIC carries 48 pairs; the link-greedy plan keeps
    the NICs busy with one flow each in nearly every phase (52 phases where 48 would be ideal),
    so the contention-model time (Python simulator) is within 10 % of the link-congestion lower
    bound at 1 GB per rank, where latency is negligible."""
    topo = Topology.preset("gen4-4sw-2skt", 4)
    dem = make("uniform", topo.num_gpus, 1024 * MB)
    phases = _fresh_scheduler(topo, "contention", link_greedy=True).plan(dem.ravel().tolist())
    assert varipath.simulate(topo, phases, "contention") <= 1.10 * varipath.lower_bound(topo, dem)


def test_uniform_one_host_keeps_cross_socket_pairs_whole():
    """gen4, uniform 64 MB: the socket link (20 GB/s) carries 16 pairs each way and is the
    bottleneck; the best plan sends each cross-socket pair whole in one of 16 phases (a slice
    sized for 25 GB/s pairs would leave slivers and double the phase count).  Checked with the
    Python simulator: within start latency of the lower bound."""
    topo = Topology.preset("gen4-4sw-2skt")
    dem = make("uniform", 8, 64 * MB)
    phases = varipath.schedule(dem, topo, "contention")
    assert len(phases) == 16
    lb = varipath.lower_bound(topo, dem)
    assert varipath.simulate(topo, phases, "contention") <= lb + 16 * topo.phase_start_s() * 1.0001


@pytest.mark.parametrize("model", ["contention", "dma"])
def test_estimate_matches_simulator(model):
    """The scheduler's cost model replays the simulator's rules (max-min sharing with eta(k),
    copy-engine queues in phase order), so its estimate of any plan, baselines included, agrees
    with varipath.simulate."""
    topo = Topology.preset("gen4-4sw-2skt")
    s = _fresh_scheduler(topo, model)
    for traffic in ("uniform", "zipf1.2", "hot4-80"):
        dem = make(traffic, 8, 16 * MB)
        for fn in (varipath.baselines.direct, varipath.baselines.pairwise):
            phases = fn(dem, topo)
            assert s.estimate(phases) == pytest.approx(varipath.simulate(topo, phases, model), rel=0.01)


@pytest.mark.parametrize("model", varipath.MODELS)
def test_never_behind_best_baseline(model):
    """Floor 2 of the issue on one host: VarioPath within 2 % of the best baseline."""
    topo = Topology.preset("gen5-2sw")
    for traffic in ("uniform", "zipf1.6", "hot4-80"):
        for size in (MB, 256 * MB):
            dem = make(traffic, 8, size)
            vp = varipath.simulate(topo, varipath.schedule(dem, topo, model), model)
            best = min(varipath.simulate(topo, fn(dem, topo), model) for fn in varipath.baselines.BASELINES.values())
            assert vp <= 1.02 * best


@pytest.mark.parametrize("name", ["gen4-4sw-2skt", "gen5-2sw"])
def test_dma_plan_within_good_enough_of_every_family(name):
    """Under copy-engine queues the search ends at the first simulated plan within 1.5 % of the
    plan floor (a lower bound on every plan), so the chosen plan is at most 1.5 % (plus the
    event model's error against the simulator) slower than what any single candidate family
    (catalog channels, link-greedy, peer rounds, direct) would have chosen; checked with the
    Python simulator."""
    topo = Topology.preset(name)
    full = _fresh_scheduler(topo, "dma")
    alone = [_fresh_scheduler(topo, "dma", **{f: True}) for f in ("channels", "link_greedy", "peer_rounds", "direct")]
    for traffic in ("uniform", "zipf0.8", "zipf1.6", "hot4-80"):
        for size in (MB, 64 * MB):
            flat = make(traffic, 8, size).ravel().tolist()
            got = varipath.simulate(topo, full.plan(flat), "dma")
            best = min(varipath.simulate(topo, s.plan(flat), "dma") for s in alone)
            assert got <= 1.03 * best, (traffic, size, got, best)


def _sim_rates(inc, paths, members, model="contention"):
    """The Python simulator's rates (max-min sharing, eta under contention) of the transfers
    `members` (indices into `paths`, link-index arrays) running together."""
    from varipath.simulate import _eta_vec, _maxmin

    fidx = np.concatenate([np.full(len(paths[i]), j) for j, i in enumerate(members)])
    lidx = np.concatenate([paths[i] for i in members])
    cap = inc.bw * (_eta_vec(np.bincount(lidx, minlength=len(inc.bw))) if model == "contention" else 1.0)
    return _maxmin(fidx, lidx, len(members), cap)


def _time_share_optimum(topo, demand, model="contention"):
    """Reference for the time-sharing LP, independent of the C++ code: every set of concurrent
    transfers at the rates the Python simulator gives it (max-min sharing with eta), and the
    minimum total time that covers the demand (scipy's HiGHS).  A lower bound on the data time of
    any plan under the model."""
    import itertools

    from scipy.optimize import linprog

    from varipath.simulate import _incidence

    inc = _incidence(topo)
    n = topo.num_gpus
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d and demand[s, d] > 0]
    paths = [inc.path(s, d) for s, d in pairs]
    columns = []
    for k in range(1, len(pairs) + 1):
        for members in itertools.combinations(range(len(pairs)), k):
            col = np.zeros(len(pairs))
            col[list(members)] = _sim_rates(inc, paths, members, model)
            columns.append(col)
    a = np.array(columns).T
    want = np.array([demand[s, d] for s, d in pairs], dtype=float)
    res = linprog(np.ones(a.shape[1]), A_ub=-a, b_ub=-want, bounds=(0, None), method="highs")
    assert res.status == 0
    return res.fun


@pytest.mark.parametrize("traffic", ["zipf1.2", "hot4-80", "moe-top2"])
def test_time_share_plans_reach_the_lp_optimum_on_four_gpus(traffic):
    """direct4 under contention at a bandwidth-bound size: the plan is the time-sharing one, the
    Python simulator times it at least at the LP optimum computed independently (a lower bound
    on every plan) and at most 2 % plus its phases' start latencies above it, within 1.15x of
    the link lower bound, and not slower than the best plan without time sharing (backfilled
    link-greedy plans come within 0.4-4 % of it since 2026-12-01; the LP optimum check above is
    what shows the time-sharing plan is the optimal one)."""
    topo = Topology.preset("direct4")
    full = _fresh_scheduler(topo, "contention")
    without = _fresh_scheduler(topo, "contention", channels=True, link_greedy=True, peer_rounds=True, direct=True,
                               backfill=True)
    dem = make(traffic, 4, 256 * MB)
    plan, info = full.plan_info(dem.ravel().tolist())
    assert info["candidate"] == "time_share", info
    _check_cover(plan, dem)
    t = varipath.simulate(topo, plan, "contention")
    optimum = _time_share_optimum(topo, dem)
    latencies = sum(topo.phase_latency_s + max(topo.path_latency(s, d) for s, d, _ in ph) for ph in plan)
    assert optimum * (1 - 1e-6) <= t <= optimum * 1.02 + latencies, (t, optimum, latencies)
    assert t <= 1.15 * varipath.lower_bound(topo, dem)
    assert t <= varipath.simulate(topo, without.plan(dem.ravel().tolist()), "contention")


def test_time_share_search_on_eight_gpus():
    """Past 4 GPUs the time-sharing plan comes from column generation (rounds budgeted by the
    exchange's size): on gen4-4sw-2skt (8 GPUs) at 1 GB per rank under contention it covers the
    demand, two schedulers agree, and the Python
    simulator times it within 1.15x of the lower bound and at least 1 % faster than the plan
    without it (2-4 % before backfilled link-greedy plans narrowed the gap)."""
    topo = Topology.preset("gen4-4sw-2skt")
    a, b = _fresh_scheduler(topo, "contention"), _fresh_scheduler(topo, "contention")
    without = _fresh_scheduler(topo, "contention", channels=True, link_greedy=True, peer_rounds=True, direct=True,
                               backfill=True)
    for traffic in ("zipf1.2", "zipf1.6"):
        dem = make(traffic, 8, 1 << 30)
        flat = dem.ravel().tolist()
        plan, info = a.plan_info(flat)
        assert info["candidate"] == "time_share", info
        assert plan == b.plan(flat)
        _check_cover(plan, dem)
        t = varipath.simulate(topo, plan, "contention")
        assert t <= 1.15 * varipath.lower_bound(topo, dem)
        assert t <= 0.99 * varipath.simulate(topo, without.plan(flat), "contention")


def test_time_share_search_solves_its_lp_exactly():
    """The column generation's LP, checked from outside: on gen4-4sw-2skt (8 GPUs, 56 transfers)
    after 40 pricing rounds the configurations it returns cover every transfer's demand, their
    rates are the Python simulator's max-min/eta rates for those sets, and their total time is
    the optimum that scipy's HiGHS finds over the same configurations plus every transfer alone
    (the search's LP holds those and more, so its optimum can be neither above nor below)."""
    from scipy.optimize import linprog

    from varipath.simulate import _incidence, eta

    topo = Topology.preset("gen4-4sw-2skt")
    inc = _incidence(topo)
    n = topo.num_gpus
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    paths = [inc.path(s, d) for s, d in pairs]
    eta_table = [1.0] + [eta(k) for k in range(1, len(pairs) + 1)]

    def sim_rates(members):
        return _sim_rates(inc, paths, members)

    rng = np.random.default_rng(5)
    demands = [make("zipf1.2", n, 256 * MB), make("hot4-80", n, 256 * MB),
               rng.integers(1 << 20, 1 << 28, (n, n))]
    for dem in demands:
        want = np.array([dem[s, d] for s, d in pairs], dtype=float)
        used = load_scheduler().time_share_search(inc.bw.tolist(), [p.tolist() for p in paths], eta_table,
                                                  want.tolist(), [], 40)
        assert used
        covered = np.zeros(len(pairs))
        for members, rates, seconds in used:
            assert seconds > 0 and members == sorted(set(members))
            np.testing.assert_allclose(rates, sim_rates(members), rtol=1e-9)
            covered[members] += seconds * np.array(rates)
        assert np.all(covered >= want * (1 - 1e-7)), np.min(covered / want)
        columns = []
        for i in range(len(pairs)):  # every transfer alone
            col = np.zeros(len(pairs))
            col[i] = sim_rates([i])[0]
            columns.append(col)
        for members, rates, _ in used:
            col = np.zeros(len(pairs))
            col[members] = rates
            columns.append(col)
        a = np.array(columns).T / want[:, None]  # rows scaled to 1 (HiGHS is then exact to 1e-9)
        ref = linprog(np.ones(a.shape[1]), A_ub=-a, b_ub=-np.ones(len(want)), bounds=(0, None), method="highs")
        assert ref.status == 0
        total = sum(seconds for _, _, seconds in used)
        assert total == pytest.approx(ref.fun, rel=1e-6)


def test_time_share_plans_on_random_demands():
    """Random, sparse and extremely skewed direct4 demands at bandwidth-bound sizes: the plan
    covers the demand exactly (no empty transfer), two schedulers agree, and whenever the
    time-sharing plan is chosen the Python simulator times it no slower than the plan chosen
    without it (within the event model's 0.5 %)."""
    topo = Topology.preset("direct4")
    a, b = _fresh_scheduler(topo, "contention"), _fresh_scheduler(topo, "contention")
    without = _fresh_scheduler(topo, "contention", channels=True, link_greedy=True, peer_rounds=True, direct=True,
                               backfill=True)
    rng = np.random.default_rng(11)
    chosen = 0
    for i in range(48):
        if i % 3 == 0:
            dem = rng.integers(0, 1 << 30, (4, 4))
        elif i % 3 == 1:
            dem = (rng.pareto(1.0, (4, 4)) * 5e7).astype(np.int64) * (rng.random((4, 4)) < 0.7)
        else:
            dem = np.full((4, 4), 1 << 27, dtype=np.int64)
            dem[rng.integers(0, 4)] = rng.integers(1 << 28, 1 << 31)
        np.fill_diagonal(dem, 0)
        flat = dem.ravel().tolist()
        plan, info = a.plan_info(flat)
        assert plan == b.plan(flat)
        _check_cover(plan, dem)
        if info["candidate"] == "time_share":
            chosen += 1
            t = varipath.simulate(topo, plan, "contention")
            assert t <= 1.005 * varipath.simulate(topo, without.plan(flat), "contention")
    assert chosen >= 16, chosen


def test_host_rounds_under_copy_engine_queues_on_several_hosts():
    """4 hosts x 8 GPUs under `dma` at 16 MB per rank: the one-phase host-rotation order (remote
    transfers by host offset, spread over the target host's GPUs, same-host ones interleaved)
    wins where the other families leave the NIC pairs unevenly queued; the Python simulator
    times it within 1.15x of the lower bound and well ahead of the plan without it."""
    cases = (("gen4-4sw-2skt", "uniform", 0.9), ("gen5-2sw", "hot4-50", 0.99))
    for name, traffic, gain in cases:
        topo = Topology.preset(name, 4)
        n = topo.num_gpus
        dem = make(traffic, n, 16 * MB)
        plan, info = _fresh_scheduler(topo, "dma").plan_info(dem.ravel().tolist())
        assert info["candidate"] == "host_rounds", info
        assert len(plan) == 1
        _check_cover(plan, dem)
        hosts = {g: h for h, gs in varipath.catalog.gpu_hosts(topo).items() for g in gs}
        firsts = {}
        for s, d, _ in plan[0]:
            firsts.setdefault(s, d)
        for s, d in firsts.items():  # every source starts on the next host, no two on one GPU
            assert hosts[d] == (hosts[s] + 1) % 4
        assert len(set(firsts.values())) == n
        t = varipath.simulate(topo, plan, "dma")
        assert t <= 1.15 * varipath.lower_bound(topo, dem)
        without = _fresh_scheduler(topo, "dma", channels=True, link_greedy=True, peer_rounds=True, direct=True,
                                   time_share=True, backfill=True)
        assert t <= gain * varipath.simulate(topo, without.plan(dem.ravel().tolist()), "dma")
    with pytest.raises(ValueError, match="one host per GPU"):
        _fresh_scheduler(Topology.preset("direct4"), "dma").set_hosts([0, 1])


def test_time_share_plans_only_where_they_pay():
    """Not built where their start latencies matter (16 MB on direct4, 64 MB on 8 GPUs), on more
    than 8 GPUs, or without eta (fluid, copy-engine queues)."""
    for name, hosts, model, size in (("direct4", 1, "contention", 16 * MB), ("gen4-4sw-2skt", 1, "contention", 64 * MB),
                                     ("direct4", 4, "contention", 1 << 30), ("direct4", 1, "fluid", 256 * MB),
                                     ("direct4", 1, "dma", 256 * MB), ("gen4-4sw-2skt", 1, "dma", 1 << 30)):
        topo = Topology.preset(name, hosts)
        _, info = _fresh_scheduler(topo, model).plan_info(make("zipf1.2", topo.num_gpus, size).ravel().tolist())
        assert info["candidate"] != "time_share", (name, hosts, model, size, info)


def test_fluid_model_prefers_one_phase_and_is_deterministic():
    topo = Topology.preset("gen4-4sw-2skt")
    dem = make("zipf1.2", 8, 16 * MB)
    a = varipath.schedule(dem, topo, "fluid")
    b = varipath.schedule(dem.copy(), topo, "fluid")
    assert a == b
    # under max-min fluid sharing, fusing phases never costs more: one phase is optimal
    assert len(a) == 1


def test_cost_estimate_by_hand():
    mod = load_scheduler()
    s = mod.Scheduler(3, [[(0, 1), (1, 2), (2, 0)], [(0, 2), (1, 0), (2, 1)]], 1e-6, 1e9)
    # default link model: a send and a receive port per GPU at 1 GB/s
    assert s.estimate([[(0, 1, 1000), (1, 2, 3000)]]) == pytest.approx(1e-6 + 3e-6)
    assert s.estimate([[(0, 1, 1000), (0, 2, 1000)], []]) == pytest.approx(1e-6 + 2e-6)
    s.set_cost_model(0.08, 0.7, 0)
    eta2 = 1 - 0.08  # two flows on GPU 0's send port
    assert s.estimate([[(0, 1, 1000), (0, 2, 1000)]]) == pytest.approx(1e-6 + 2000 / (1e9 * eta2))
    # one permutation each: with 1-byte demand latency dominates -> a single fused phase
    ones = [0, 1, 1, 1, 0, 1, 1, 1, 0]
    assert len(s.plan(ones)) == 1
    big = [0, 10**9, 10**9, 10**9, 0, 10**9, 10**9, 10**9, 0]
    plan = s.plan(big)
    assert len(plan) == 2 and sorted(len(p) for p in plan) == [3, 3]


def test_bad_input():
    topo = Topology.preset("direct4")
    with pytest.raises(ValueError, match="4x4"):
        varipath.schedule(np.zeros((3, 3)), topo)
    bad = np.zeros((4, 4))
    bad[1, 2] = -5
    with pytest.raises(ValueError, match="negative"):
        varipath.schedule(bad, topo)
    mod = load_scheduler()
    s = mod.Scheduler(3, [[(0, 1)]], 1e-6, 1e9)
    with pytest.raises(ValueError, match="n\\*n = 9"):
        s.plan([0] * 8)
    with pytest.raises(ValueError, match="negative demand"):
        s.plan([0, -1, 0, 0, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="no channel contains"):
        s.plan([0, 0, 5, 0, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="invalid pair"):
        mod.Scheduler(3, [[(0, 3)]], 1e-6, 1e9)
    with pytest.raises(ValueError):
        mod.Scheduler(3, [[(0, 1)]], 1e-6, 0.0)
    with pytest.raises(ValueError, match="at least one"):
        s.set_candidates(channels=False, link_greedy=False, peer_rounds=False, direct=False, time_share=False,
                         host_rounds=False)
    with pytest.raises(ValueError, match="at least one"):  # backfill is a variant, not a family
        s.set_candidates(channels=False, link_greedy=False, peer_rounds=False, direct=False, time_share=False,
                         host_rounds=False, backfill=True)


def test_backend_config(tmp_path):
    cfg = varipath.backend_config(None, 4)
    assert cfg["channels"] == [[(s, d) for s in range(4) for d in range(4) if s != d]]
    assert cfg["topology"].num_gpus == 4 and cfg["bandwidth_Bps"] > 0 and cfg["phase_latency_s"] > 0
    cfg = varipath.backend_config("gen4-4sw-2skt", 8)
    for ch in cfg["channels"]:
        assert all(isinstance(p, tuple) and len(p) == 2 for p in ch)
        assert an.is_contention_free(cfg["topology"], ch)
    with pytest.raises(ValueError, match="8 GPUs.*world_size=4"):
        varipath.backend_config("gen4-4sw-2skt", 4)
    f = tmp_path / "t.json"
    Topology.preset("direct4", 2).to_json(str(f))
    assert varipath.backend_config(str(f), 8)["topology"].num_hosts == 2
    assert varipath.backend_config("direct4:2", 8)["topology"].num_gpus == 8
    with pytest.raises(ValueError, match="no such topology file"):
        varipath.backend_config(str(tmp_path / "missing.json"), 8)
    # the scheduler accepts the config as is (what the core backend does)
    mod = load_scheduler()
    s = mod.Scheduler(8, cfg["channels"], cfg["phase_latency_s"], cfg["bandwidth_Bps"])
    dem = make("moe-top2", 8, 4 * MB)
    _check_cover(s.plan(dem.ravel().tolist()), dem)


def _plan_key(phases):
    return [[tuple(t) for t in ph] for ph in phases]


@pytest.mark.parametrize("hosts", [1, 8])
@pytest.mark.parametrize("model", varipath.MODELS)
def test_deterministic_across_calls_instances_and_shuffled_input(hosts, model):
    """Every rank must compute the bitwise-same plan: repeated calls, a second scheduler built
    from the same inputs, and a demand list that was shuffled and restored (fresh Python ints,
    another memory layout) all give the identical plan, including at 64 ranks where the work
    budget and split peer rounds apply."""
    topo = Topology.preset("gen4-4sw-2skt", hosts)
    n = topo.num_gpus
    rng = np.random.default_rng(11)
    a = _fresh_scheduler(topo, model)
    b = _fresh_scheduler(topo, model)
    for traffic, size in (("moe-top2", MB), ("zipf1.2", 16 * MB), ("uniform", 64 * MB)):
        flat = make(traffic, n, size).ravel().tolist()
        ref = _plan_key(a.plan(flat))
        assert _plan_key(a.plan(flat)) == ref
        assert _plan_key(b.plan(flat)) == ref
        perm = rng.permutation(len(flat))
        shuffled = [flat[i] for i in perm]
        restored = [0] * len(flat)
        for j, i in enumerate(perm):
            restored[i] = int(shuffled[j])
        assert _plan_key(a.plan(restored)) == ref
        assert a.plan_info(flat)[1] == a.plan_info(restored)[1]


@pytest.mark.parametrize("model", varipath.MODELS)
@pytest.mark.parametrize("traffic", ["moe-top2", "zipf1.6", "hot4-80"])
def test_covers_skewed_demand_at_64_ranks(model, traffic):
    """64 ranks (8 gen4 hosts), skewed demand plus random sparse holes: exact coverage, no
    zero-byte transfer, one transfer per pair per phase, at a latency-bound and a bandwidth-bound
    size."""
    topo = Topology.preset("gen4-4sw-2skt", 8)
    n = topo.num_gpus
    rng = np.random.default_rng(5)
    s = varipath.scheduler_for(topo, model)
    for size in (MB, 256 * MB):
        dem = make(traffic, n, size)
        dem[rng.random((n, n)) < 0.2] = 0
        _check_cover(s.plan(dem.ravel().tolist()), dem)


def _split_peer_rounds_plan(traffic):
    """64 ranks (8 gen4 hosts), 1 GB per rank, `contention`, only the link-greedy family allowed:
    checks that the plan is unfused split peer rounds that cover the demand and put at most one
    transfer on every directed link (Topology.path); returns (phases, info, lower bound)."""
    topo = Topology.preset("gen4-4sw-2skt", 8)
    dem = make(traffic, topo.num_gpus, 1024 * MB)
    phases, info = _fresh_scheduler(topo, "contention", link_greedy=True).plan_info(dem.ravel().tolist())
    assert info["candidate"] == "peer_split" and info["merge_factor"] == 1
    _check_cover(phases, dem)
    for ph in phases:
        _check_link_disjoint(ph, topo)
    return phases, info, varipath.lower_bound(topo, dem)


def test_split_peer_rounds_stand_in_for_link_greedy_past_its_budget():
    """At 64 ranks link-greedy's work (112 pairs on a NIC x 4032 pairs) is over the budget, so
    with only the link-greedy family allowed the planner builds split peer rounds instead: its
    unfused phases put at most one transfer on every directed link (Topology.path), cover the
    demand, and the plan is within 10 % of the lower bound at 1 GB per rank (Python simulator)."""
    _, info, lb = _split_peer_rounds_plan("uniform")
    assert info["est_cost_s"] <= 1.10 * lb


def test_one_host_still_uses_link_greedy():
    """The work budget applies past 32 ranks only: on one host link-greedy is built as before."""
    topo = Topology.preset("gen4-4sw-2skt")
    dem = make("uniform", 8, 1024 * MB)
    _, info = _fresh_scheduler(topo, "contention").plan_info(dem.ravel().tolist())
    assert info["candidate"] == "link_greedy"


@pytest.mark.parametrize("hosts", [1, 8])
def test_fluid_latency_bound_sizes_return_one_phase(hosts):
    """Under fluid, at 1 MB per rank the hot link's pairs alone need more start latency than the
    1.5 % margin allows for any one-transfer-per-link plan, so the one-phase plan (which the cost
    model charges exactly the plan floor) is returned at once; it covers the demand."""
    topo = Topology.preset("gen4-4sw-2skt", hosts)
    dem = make("moe-top2", topo.num_gpus, MB)
    phases, info = _fresh_scheduler(topo, "fluid").plan_info(dem.ravel().tolist())
    assert len(phases) == 1 and info["candidate"] == "direct" and info["candidates"] == 1
    _check_cover(phases, dem)


@pytest.mark.parametrize("model,traffic,size", [("dma", "hot4-80", 16), ("contention", "uniform", 16),
                                                ("contention", "zipf0.8", 64), ("contention", "hot4-50", 256)])
def test_64_ranks_within_2_percent_of_best_baseline(model, traffic, size):
    """Past 32 ranks candidates are ranked by bounds (no event model); the margins on fused
    phases whose bounds are optimistic (kQueueMargin, kFusedMargin) keep the plan within 2 % of
    the best baseline at 8 gen4 hosts, where it was up to 1.30x behind (Python simulator).
    Under `contention` at Zipf 0.8 64 MB and hot experts 256 MB the fused bound passes (and the
    unfused peer-round bound) are stopped early as losers: the plan must still hold."""
    topo = Topology.preset("gen4-4sw-2skt", 8)
    dem = make(traffic, topo.num_gpus, size * MB)
    vp = varipath.simulate(topo, varipath.schedule(dem, topo, model), model)
    best = min(varipath.simulate(topo, fn(dem, topo), model) for fn in varipath.baselines.BASELINES.values())
    assert vp <= 1.02 * best


def test_split_peer_rounds_sliced_under_contention_at_bandwidth_bound_sizes():
    """Under contention, when the hot link's start latencies are a small share of the plan
    (1 GB per rank), split peer rounds are sliced to the span of each phase's first transfer: a
    pair may be spread over several phases, each still link-disjoint, and the demand is covered
    exactly."""
    phases, info, lb = _split_peer_rounds_plan("moe-top2")
    pairs = [(s, d) for ph in phases for s, d, _ in ph]
    assert len(pairs) > len(set(pairs))  # some pair was sliced
    assert info["est_cost_s"] <= 1.35 * lb
