"""The cross-host benchmark's byte accounting, on real namespaced hosts: the links' own tx
counters, read inside each host, against the hierarchical minimum computed independently
(bench_hosts.minimum_cross_bytes). Bytes, not time: speed is the benchmark's business."""
from hoccl_backend import bench_hosts
from hoccl_backend.testbed.hosts import Hosts

SIZE = 4 << 20


def test_hoccl_crosses_hosts_with_the_minimum_bytes():
    with Hosts(count=2, ranks=[2, 2], mtu=9000) as hosts:
        results = hosts.run_ranks(bench_hosts.measure, bench_hosts.OPS, [SIZE], 1, backend="hoccl",
                                  pg_timeout=120, timeout=600)
        isolated = hosts.isolated
    rows = bench_hosts.summarize(results, 2, 2, bench_hosts.OPS, [SIZE], None)
    bench_hosts.print_table(rows)
    if not isolated:
        assert all(r["crossed_bytes"] is None for r in rows)  # no links to count
        print("no namespaces here: nothing crossed a link to count")
        return
    for r in rows:
        ratio = r["crossed_bytes"] / r["min_cross_bytes"]
        if r["backend"] == "hoccl":
            assert 1.0 <= ratio <= 1.05, f"hoccl {r['op']}: {ratio:.3f}x the minimum"
        else:
            assert ratio >= 0.999, f"gloo {r['op']} crossed less than the minimum: {ratio:.3f}x"


def test_skewed_all_to_all_bench_times_every_form_and_reports_the_choice():
    """bench --hosts N --ops all_to_all_skewed: every rank derives the same Zipf matrix, hoccl
    runs it on a group per form (auto, direct, rail) beside gloo, and auto's form is reported."""
    from hoccl_backend import bench_alltoall_hosts as skewed

    m = skewed.skewed_matrix(4, 1 << 16)
    assert m == skewed.skewed_matrix(4, 1 << 16) and min(map(min, m)) >= 0
    column = [sum(m[s][d] for s in range(4)) for d in range(4)]
    assert max(column) > 2 * min(column), f"not skewed: {column}"
    with Hosts(count=2, ranks=[2, 2], mtu=9000) as hosts:
        results = hosts.run_ranks(skewed.measure, [1 << 16], 1, backend="hoccl", pg_timeout=120,
                                  timeout=600)
    for r in results:
        assert r[("form", 1 << 16)] in ("multihost_direct", "multihost_rail"), r[("form", 1 << 16)]
        for name in skewed.FORMS + ("gloo",):
            assert len(r[(name, 1 << 16)]) == 1 and r[(name, 1 << 16)][0] > 0
    assert len({r[("form", 1 << 16)] for r in results}) == 1
