"""Channel enumeration, symmetry compression and working sets against independent checks."""
import itertools

import pytest

from varipath import analyzer as an
from varipath import catalog as cat
from varipath.topology import Topology


@pytest.fixture(scope="module")
def _cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("hoccl-cache")


@pytest.fixture(autouse=True)
def _cache(_cache_dir, monkeypatch):
    monkeypatch.setenv("HOCCL_CACHE_DIR", str(_cache_dir))


def _sets(chs):
    return sorted(tuple(sorted(c)) for c in chs)


def test_maximal_channels_match_brute_force_direct4():
    t = Topology.preset("direct4")
    assert _sets(an.maximal_channels(t)) == _sets(an.brute_force_channels(t))


def test_contention_free_recomputed_from_paths():
    t = Topology.preset("gen4-4sw-2skt")
    for ch in an.maximal_channels(t):
        load = {}
        for s, d in ch:
            for l in t.path(s, d):
                load[l] = load.get(l, 0) + t.pair_rate(s, d)
        assert all(v <= t.bandwidth(l) * (1 + 1e-9) for l, v in load.items())
        # maximal: no other pair can join
        n = t.num_gpus
        for p in itertools.product(range(n), range(n)):
            if p[0] != p[1] and p not in ch:
                assert not an.is_contention_free(t, list(ch) + [p])


def test_automorphisms_preserve_routing():
    t = Topology.preset("gen4-4sw-2skt")
    group = an.gpu_automorphisms(t)
    assert len(group) == 128  # 2^4 inside switches * 2^2 switch swaps * 2 socket swap
    n = t.num_gpus
    for g in group:
        for s in range(n):
            for d in range(n):
                if s != d:
                    assert t.pair_rate(s, d) == t.pair_rate(g[s], g[d])
                    assert len(t.path(s, d)) == len(t.path(g[s], g[d]))


@pytest.mark.parametrize("name", ["direct4", "gen4-4sw-2skt"])
def test_symmetry_expansion_equals_enumeration(name):
    t = Topology.preset(name)
    chans = an.maximal_channels(t)
    group = an.gpu_automorphisms(t)
    reps = an.orbit_representatives(chans, group)
    assert len(reps) < len(chans)
    assert _sets(an.expand(reps, group)) == _sets(chans)
    # catalog (cached path) reports the same sizes
    c = cat.catalog(t)
    assert c["all"] == len(chans) and c["reps"] == len(reps)


def test_cross_catalog_and_family_size():
    c = cat.catalog(Topology.preset("direct4", 2))
    # direct4: one NIC per socket, 2 GPUs each: 2 NIC bijections * (2*2)^2 GPU choices
    assert c["cross_all"] == 32
    i, x = c["intra_all"], c["cross_all"]
    assert cat.family_size(2, i, x) == i * i + x * x  # both intra, or swap hosts
    assert cat.family_size(3, i, x) == i ** 3 + 3 * i * x * x + 2 * x ** 3
    c32 = cat.catalog(Topology.preset("direct4", 32))
    assert c32["reps"] == c["reps"] and c32["all"] > 10 ** 40


@pytest.mark.parametrize("name,hosts", [("direct4", 1), ("direct4", 3), ("gen4-4sw-2skt", 2)])
def test_working_set_is_contention_free_and_covers_all_pairs(name, hosts):
    t = Topology.preset(name, hosts)
    ws = cat.working_set(t)
    n = t.num_gpus
    covered = set()
    for ch in ws:
        assert an.is_contention_free(t, ch)
        covered |= set(ch)
    assert covered == {(s, d) for s in range(n) for d in range(n) if s != d}


def test_cache_dir_is_used(_cache_dir):
    t = Topology.preset("direct4")
    cat.working_set(t)
    assert any(p.name.startswith("varipath-") for p in _cache_dir.iterdir())


def _catalog_after_barrier(cache_dir, barrier, results):
    import os

    os.environ["HOCCL_CACHE_DIR"] = cache_dir
    barrier.wait()
    results.put(cat.catalog(Topology.preset("direct4", 2)))


def test_processes_that_miss_the_cache_together_build_once(tmp_path):
    """The ranks of a fresh job miss the cache at the same moment: one process builds and the
    others read its file, so all get the same catalog, build timings included (each build times
    itself, so two builds would differ) and of the same types (the builder's too), and no
    temporary file stays behind."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_catalog_after_barrier, args=(str(tmp_path), barrier, results)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got[0]["build_s"] > 0 and all(g == got[0] for g in got), [g["build_s"] for g in got]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
