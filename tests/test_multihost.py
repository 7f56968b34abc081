"""hoccl groups spanning hosts: every op on real namespaced hosts (hoccl_backend.testbed.hosts), checked
against independent references; training across hosts against gloo; faults.

Layouts: 2x2, three hosts with 2, 1 and 2 ranks, two hosts of one rank, and an interleaved
placement (group ranks 0 and 2 on one host, 1 and 3 on the other: a group built over a
permutation of the job's ranks)."""
import os
import re
import time

import pytest

from hoccl_backend.testbed.hosts import Hosts, leftovers, wait_for_files

SLOTS = {"HOCCL_SHM_SLOT_BYTES": "64K"}  # staging slots the large sizes overflow
# check_auto_form checks the cost model's choice at two extremes, which hold for any link rate
# but not for any per-message cost: a loaded machine can measure milliseconds. Pin that one; the
# link rate is still measured.
AUTO_COSTS = {"HOCCL_NET_MESSAGE_US": "250"}


def every_op_default_group(rank, world):
    import torch
    import torch.distributed as dist

    from multihost.checks import check_all_to_all_forms, check_auto_form, every_op

    pg = dist.group.WORLD._get_backend(torch.device("cpu"))
    counts = every_op(pg, rank, world)
    counts["algorithm"] = pg.last_algorithm()
    counts["hosts"] = pg.hosts()
    counts["backend"] = (type(pg).__name__, pg.spans_hosts(), pg.last_core_sharing())
    counts["all_gather"] = all_gather_algorithms(pg, world)
    if os.environ.get("HOCCL_CHECK_ACROSS_HOSTS") != "0":  # auto needs the exchanged split matrix
        counts["auto_form"] = check_auto_form(pg, rank, world, pg.hosts())
    counts["forms"] = check_all_to_all_forms(lambda form: _group_over(f"form-{form}", rank, world), rank, world)
    return counts


def all_gather_algorithms(pg, world):
    """What all_gather ran with 16-byte and 1 MB blocks per rank, each result checked."""
    import torch

    names = []
    for n in (4, 1 << 18):
        x = torch.arange(n, dtype=torch.float32) + pg.rank() * n
        out = torch.empty(n * world)
        pg._allgather_base(out, x).wait()
        assert torch.equal(out, torch.arange(n * world, dtype=torch.float32)), f"all_gather of {n} floats"
        names.append(pg.last_algorithm())
    return names


def expected_all_gather_algorithms(ranks):
    """The plan goes host first for small blocks, and at every size where no host has two ranks
    (nothing to hand on); otherwise its rail form."""
    return ["allgather/hosts-first", "allgather/hosts-first" if max(ranks) == 1 else "allgather/hosts"]


def _group_over(prefix, group_rank, world):
    """Another hoccl group over the job's ranks (a store prefix of its own)."""
    from datetime import timedelta

    import torch.distributed as dist

    from hoccl_backend._registration import _create

    store = dist.PrefixStore(prefix, dist.distributed_c10d._get_default_store())
    return _create(store, group_rank, world, timedelta(seconds=60))


def every_op_interleaved(rank, world):
    """A second hoccl group over the same ranks with group rank = (rank % 2) * 2 + rank // 2 on
    2x2, so group ranks 0 and 2 sit on host 0 and 1 and 3 on host 1."""
    from datetime import timedelta

    import torch.distributed as dist

    from hoccl_backend._registration import _create
    from multihost.checks import check_all_to_all_forms, check_auto_form, every_op

    half = world // 2
    group_rank = (rank % half) * 2 + rank // half
    store = dist.PrefixStore("interleaved", dist.distributed_c10d._get_default_store())
    pg = _create(store, group_rank, world, timedelta(seconds=60))
    counts = every_op(pg, group_rank, world)
    counts["hosts"] = pg.hosts()
    counts["auto_form"] = check_auto_form(pg, group_rank, world, pg.hosts())
    pg.shutdown()
    counts["forms"] = check_all_to_all_forms(lambda form: _group_over(f"interleaved-{form}", group_rank, world),
                                             group_rank, world)
    return group_rank, counts


def _check_clean(hosts):
    if hosts.isolated:
        for h in range(hosts.count):
            assert hosts.shm_files(h) == [], f"host {h} kept {hosts.shm_files(h)}"


# Every collective across hosts is one plan; the layouts: even, uneven, and one rank per host
# without the cross-host check (all_to_all from each rank's own splits).
LAYOUTS = [([2, 2], "1"), ([2, 1, 2], "1"), ([1, 1], "0"), ([2, 1], "0")]
LAYOUT_IDS = ["2x2", "3hosts-2-1-2", "2x1-unchecked", "2-1-unchecked"]


@pytest.mark.parametrize("ranks,check", LAYOUTS, ids=LAYOUT_IDS)
def test_every_op_across_hosts(ranks, check):
    with Hosts(count=len(ranks), ranks=ranks) as hosts:
        env = dict(SLOTS, **AUTO_COSTS, HOCCL_CHECK_ACROSS_HOSTS=check)
        results = hosts.run_ranks(every_op_default_group, backend="hoccl", pg_timeout=60, env=env, timeout=400)
        expected_hosts = [list(hosts.ranks_of(h)) for h in range(hosts.count)]
        for rank, counts in enumerate(results):
            assert counts["hosts"] == expected_hosts, f"rank {rank}: {counts['hosts']}"
            # One backend class on every layout, with what the group on one host reports too.
            assert counts["backend"][:2] == ("ProcessGroupHOCCL", True), counts["backend"]
            assert counts["backend"][2] in ("none", "among_ranks", "with_other_work"), counts["backend"]
            assert counts["all_gather"] == expected_all_gather_algorithms(ranks), f"rank {rank}"
            fan_in = hosts.world - 1 if rank == hosts.world - 1 else 0
            assert counts["reductions"] > 100 and counts["send_recv"] == 2 * (hosts.world - 1) + 1 + fan_in
        print(f"{hosts.describe()}: every op checked on {hosts.world} ranks: {results[0]}")
        _check_clean(hosts)
        run_id = hosts.run_id
    assert leftovers(run_id) == []


def test_every_op_interleaved_placement():
    with Hosts(count=2, ranks=[2, 2]) as hosts:
        results = hosts.run_ranks(every_op_interleaved, backend="hoccl", pg_timeout=60,
                                  env=dict(SLOTS, **AUTO_COSTS), timeout=400)
        for rank, (group_rank, counts) in enumerate(results):
            assert counts["hosts"] == [[0, 2], [1, 3]], f"rank {rank}: {counts['hosts']}"
        print(f"{hosts.describe()}: interleaved placement, every op checked")
        _check_clean(hosts)


def _costs_lines(job, count):
    """Per rank, the costs line of each group it created, in creation order."""
    lines = [l for h in range(count) for l in job.log(h).splitlines() if "costs across hosts" in l]
    pattern = (r"\[hoccl rank (\d+)\] costs across hosts: message (\d+) us \((\S+)\), link ([\d.]+) GB/s \((\S+)\), "
               r"relay copies ([\d.]+) GB/s \((\S+)\)")
    printed = {}
    for m in (re.search(pattern, l) for l in lines):
        if m:
            printed.setdefault(int(m[1]), []).append((int(m[2]), m[3], float(m[4]), m[5], float(m[6]), m[7]))
    return printed


# Elements (float32) rank s sends to rank d on 2x2: skewed, with empty pairs on and off the host.
A2A_ELEMS = [[3, 0, 700, 5], [0, 9, 11, 2000], [40, 1, 0, 8], [6, 300, 7, 0]]
# Set costs, one group each after the default group's measured ones: (HOCCL_NET_MESSAGE_US,
# HOCCL_NET_RELAY_MBYTES or None for the default), the link at HOCCL_NET_LINK_MBIT=8000.
COST_SETTINGS = [(1, None), (100_000, None), (1000, 1), (1000, None)]


def test_costs_across_hosts_are_measured_at_creation_and_agree():
    """The per-message cost and link rate VarioPath weighs all_to_all's forms by: measured once
    (rank 0 with a rank of the other host), the same bits on every rank (net_costs()); a setting
    replaces its measurement. The link is shaped to 1 Gbit/s, so the measured rate must sit near
    0.125 GB/s. Each rank runs one skewed all_to_all on each group: its form must be the cheaper of
    the documented estimates under the costs the group holds (test_plan_hosts_movement's
    estimated_seconds), with measured costs (the default group) and with set costs (one group
    created under each setting, as a job started with it would), where a per-message cost of 1 us
    and of 0.1 s must flip the choice, and at 1 ms a relay copy rate of 1 MB/s
    (HOCCL_NET_RELAY_MBYTES) against the default 1 GB/s."""
    from test_plan_hosts_movement import estimated_seconds

    with Hosts(count=2, ranks=[2, 2], link_gbit=1) as hosts:
        host_of = [hosts.host_of(r) for r in range(hosts.world)]
        m = [[4 * e for e in row] for row in A2A_ELEMS]
        job = hosts.start(costs_and_alltoall, COST_SETTINGS, backend="hoccl", pg_timeout=60,
                          env={"HOCCL_DEBUG": "INFO"})
        per_rank = job.wait(timeout=180)
        printed = _costs_lines(job, hosts.count)
        assert sorted(printed) == [0, 1, 2, 3], printed
        assert all(len(lines) == 1 + len(COST_SETTINGS) for lines in printed.values()), printed
        forms = []
        for g in range(1 + len(COST_SETTINGS)):
            results = [r[g] for r in per_rank]
            assert len({r["costs"] for r in results}) == 1, f"group {g}: ranks disagree: {[r['costs'] for r in results]}"
            costs = {k: float.fromhex(v) for k, v in results[0]["costs"]}
            triple = (costs["message_s"], costs["link_bytes_per_s"], costs["copy_bytes_per_s"])
            form = min(("direct", "rail"), key=lambda f: estimated_seconds(host_of, m, f, triple))
            assert [r["algorithm"] for r in results] == [f"multihost_{form}"] * hosts.world, (g, results, costs)
            lines = {printed[r][g] for r in printed}
            assert len(lines) == 1, f"group {g}: ranks disagree: {lines}"
            line = lines.pop()
            if g == 0:
                assert 0 <= costs["message_s"] < 1 and 0.05e9 < costs["link_bytes_per_s"] < 0.3e9, costs
                assert line[1] == line[3] == "measured", line
                assert line[4:] == (1.0, "default") and costs["copy_bytes_per_s"] == 1e9, (line, costs)
                continue
            message_us, relay_mbytes = COST_SETTINGS[g - 1]
            relay = relay_mbytes * 1e6 if relay_mbytes else 1e9
            assert triple == (message_us * 1e-6, 1e9, relay), costs
            assert line == (message_us, "HOCCL_NET_MESSAGE_US", 1.0, "HOCCL_NET_LINK_MBIT", round(relay / 1e9, 2),
                            "HOCCL_NET_RELAY_MBYTES" if relay_mbytes else "default"), line
            forms.append(form)
        assert forms == ["direct", "rail", "direct", "rail"], forms
        engines = sorted({hit.groups() for h in range(hosts.count) for l in job.log(h).splitlines()
                          if (hit := re.search(r"\[hoccl rank (\d+)\] network engine across hosts: (\S+)", l))})
        assert engines == [(str(r), "gloo") for r in range(4)], engines
        _check_clean(hosts)


def costs_and_alltoall(rank, world, settings):
    """The costs and all_to_all form of the default group (measured costs), then of one group
    per setting, each created with the setting in the environment."""
    import torch

    pg = torch.distributed.group.WORLD._get_backend(torch.device("cpu"))
    seen = [_costs_and_form(pg, rank, world)]
    os.environ["HOCCL_NET_LINK_MBIT"] = "8000"
    for i, (message_us, relay_mbytes) in enumerate(settings):
        os.environ["HOCCL_NET_MESSAGE_US"] = str(message_us)
        if relay_mbytes:
            os.environ["HOCCL_NET_RELAY_MBYTES"] = str(relay_mbytes)
        else:
            os.environ.pop("HOCCL_NET_RELAY_MBYTES", None)
        group = _group_over(f"costs-{i}", rank, world)
        seen.append(_costs_and_form(group, rank, world))
        group.shutdown()
    return seen


def _costs_and_form(pg, rank, world):
    import torch
    import torch.distributed as dist

    from collective_checks import assert_close, make_input

    m = A2A_ELEMS
    inputs = [[make_input(s, 31 * s + d, m[s][d], torch.float32) for d in range(world)] for s in range(world)]
    out = torch.empty(sum(m[s][rank] for s in range(world)))
    pg.alltoall_base(out, torch.cat(inputs[rank]), [m[s][rank] for s in range(world)], m[rank],
                     dist.AllToAllOptions()).wait()
    assert_close(out, torch.cat([inputs[s][rank] for s in range(world)]), f"all_to_all_single on rank {rank}")
    # Bits, not values: every rank must hold the same doubles.
    costs = tuple(sorted((k, float(v).hex()) for k, v in pg.net_costs().items()))
    return {"costs": costs, "algorithm": pg.last_algorithm()}


def test_ddp_and_fsdp2_across_hosts_match_gloo():
    """DDP and FSDP2 on hoccl spanning the hosts against both on a gloo group of the same job."""
    import torch

    from test_training import _compare, _model, train_on_both_backends

    with Hosts(count=2, ranks=[2, 2]) as hosts:
        results = hosts.run_ranks(train_on_both_backends, backend="hoccl", pg_timeout=60, timeout=300)
        for i in range(2):  # DDP, FSDP2
            hoccl = [r["hoccl"][i] for r in results]
            for rank in range(hosts.world):
                _compare(hoccl[rank], hoccl[0])
            _compare(hoccl[0], results[0]["gloo"][i])
            assert any(not torch.equal(p, q) for p, q in zip(hoccl[0], _model().parameters()))
        _check_clean(hosts)


def test_moe_example_with_topoep_across_hosts():
    with Hosts(count=2, ranks=[2, 2]) as hosts:
        example = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "examples", "moe_train.py")
        job = hosts.start_script([example, "--topoep", "--steps", "3"])
        job.wait(timeout=300)
        logs = "\n".join(job.log(h) for h in range(hosts.count))
        assert "Traceback" not in logs, logs[-3000:]
        assert "hosts=2" in logs and "summary:" in logs, logs[-3000:]  # TopoEP read the group's hosts
        _check_clean(hosts)


def mismatches_across_hosts(rank, world):
    """Collectives whose arguments differ across hosts, each on a fresh group over every rank;
    returns per case what this rank raised and how long it took."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from hoccl_backend._registration import _create

    host, local = int(os.environ["GROUP_RANK"]), int(os.environ["LOCAL_RANK"])
    send_extra = [0] * world
    send_extra[world - 1] = 1  # rank 0 sends one row too many to the last rank (another host)

    def a2a(pg):
        inp = torch.ones(world + (1 if rank == 0 else 0))
        out = torch.empty(world)
        splits = [1 + (e if rank == 0 else 0) for e in send_extra]
        return pg.alltoall_base(out, inp, [1] * world, splits)

    cases = {
        "all_reduce, size by host": lambda pg: pg.allreduce([torch.ones(1000 + host)]),
        "all_reduce, one rail differs": lambda pg: pg.allreduce([torch.ones(70000 + (host == 1 and local == 1))]),
        "all_reduce against broadcast": lambda pg: (pg.allreduce([torch.ones(8)]) if host == 0 else
                                                     pg.broadcast([torch.ones(8)], dist.BroadcastOptions())),
        "broadcast, dtype by host": lambda pg: pg.broadcast([torch.ones(64, dtype=torch.float32 if host else
                                                                         torch.float64)], dist.BroadcastOptions()),
        "all_to_all_single, splits": a2a,
    }
    seen = {}
    for i, (name, call) in enumerate(cases.items()):
        store = dist.PrefixStore(f"mismatch{i}", dist.distributed_c10d._get_default_store())
        pg = _create(store, rank, world, timedelta(seconds=30))
        started = time.monotonic()
        try:
            call(pg).wait()
            seen[name] = ("no error", time.monotonic() - started)
        except Exception as e:  # noqa: BLE001 - the message is the result
            seen[name] = (str(e), time.monotonic() - started)
        pg.shutdown()
    t = torch.ones(5)
    dist.all_reduce(t)  # the default group is untouched
    seen["default group after"] = (str(t.tolist()), 0.0)
    return seen


def test_mismatch_across_hosts_raises_everywhere():
    """gloo does not check a leg's sizes (a mismatch ends the receiving process); hoccl checks
    every op's arguments across hosts first, so each rank raises at once, naming both sides."""
    with Hosts(count=2, ranks=[2, 2]) as hosts:
        results = hosts.run_ranks(mismatches_across_hosts, backend="hoccl", pg_timeout=60, timeout=300)
    for rank, seen in enumerate(results):
        assert seen.pop("default group after")[0] == str([4.0] * 5)
        for name, (error, took) in seen.items():
            assert "disagree across hosts" in error, f"rank {rank}, {name}: {error}"
            assert took < 10, f"rank {rank}, {name}: raised after {took:.1f} s"
    assert "rank 0 on host" in results[2]["all_reduce, size by host"][0]
    assert "1000 Float elements" in results[2]["all_reduce, size by host"][0]
    assert "different collective (broadcast)" in results[0]["all_reduce against broadcast"][0]
    assert f"rank 0 sends 8 bytes to rank {hosts.world - 1}, which expects 4" in \
        results[1]["all_to_all_single, splits"][0]
    print({name: error for name, (error, _) in results[0].items()})


def unchecked_split_mismatch_inside_a_host(rank, world):
    """HOCCL_CHECK_ACROSS_HOSTS=0: every split kind of all_to_all checked against its reference,
    then rank 2 sends rank 3 (its host peer) one row more than rank 3 expects. Returns how many
    all_to_all were checked, what the mismatch raised (or "no error") and how long it took."""
    import torch
    import torch.distributed as dist

    from multihost.checks import check_all_to_all

    checked = check_all_to_all(dist.group.WORLD._get_backend(torch.device("cpu")), rank, world)
    extra = 1 if rank == 2 else 0
    inp = torch.ones(world + extra)
    splits = [1 + (extra if d == 3 else 0) for d in range(world)]
    started = time.monotonic()
    try:
        dist.all_to_all_single(torch.empty(world), inp, [1] * world, splits)
        seen = "no error"
    except Exception as e:  # noqa: BLE001 - the message is the result
        seen = str(e)
    return checked, seen, time.monotonic() - started


@pytest.mark.parametrize("cma", ["auto", "0"], ids=["host-reads-peers", "staged"])
def test_unchecked_all_to_all_checks_the_splits_inside_each_host(cma):
    """Without the check across hosts each rank plans all_to_all from its own splits: read in
    place inside the host, or (without cross-memory reads) staged after the host's ranks trade
    their splits. Results match the reference either way; nothing crosses a host to compare
    splits, but the ranks of one host compare theirs in shared memory for free: a mismatch there
    raises on that host, naming the ranks of the whole group."""
    with Hosts(count=2, ranks=[2, 2]) as hosts:
        results = hosts.run_ranks(unchecked_split_mismatch_inside_a_host, backend="hoccl", pg_timeout=60,
                                  env={"HOCCL_CHECK_ACROSS_HOSTS": "0", "HOCCL_SHM_CMA": cma}, timeout=300)
    assert all(checked > 0 for checked, _, _ in results), results
    for rank in (2, 3):
        _, error, took = results[rank]
        assert "split sizes disagree" in error and "rank 2 sends 8 bytes to rank 3 but rank 3 expects 4" in error, \
            f"rank {rank}: {error}"
        assert took < 10, f"rank {rank}: raised after {took:.1f} s"


def send_recv_sizes_across_hosts(rank, world):
    """Rank 0 (host 0) sends rank 1 (host 1) messages longer and shorter than the recvs expect,
    small (inline in the header) and large (a payload of its own), then correct ones in several
    forms; returns per step what this rank raised or received and how long it took."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    peer = 1 - rank
    seen = {}
    BIG = 70_000  # floats: 280 KB, far above what rides inline

    def step(name, fn):
        started = time.monotonic()
        try:
            seen[name] = ("ok", fn(), time.monotonic() - started)
        except Exception as e:  # noqa: BLE001 - the message is the result
            seen[name] = ("raised", str(e), time.monotonic() - started)

    def pattern(n, k):
        return torch.arange(n, dtype=torch.float32) + 1000 * k

    def received(t, k, src=0, tag=0):
        got = dist.recv(t, src, tag=tag)
        return torch.equal(t, pattern(t.numel(), k)) and got == 0

    def crossed():  # each rank posts in the other's order; a small and a large message per side
        outs = [pattern(n, 10 + rank) for n in (300, BIG)]
        gots = [torch.empty(300), torch.empty(BIG)]
        ops = [dist.P2POp(dist.isend, t, peer) for t in outs] + [dist.P2POp(dist.irecv, t, peer) for t in gots]
        for w in dist.batch_isend_irecv(ops if rank else ops[2:] + ops[:2]):
            w.wait()
        return all(torch.equal(g, pattern(g.numel(), 10 + peer)) for g in gots)

    def withdrawn():  # a recv that times out is withdrawn; the late message meets the next one
        if rank == 0:
            dist.barrier()
            dist.send(pattern(8, 6), 1, tag=5)
            return True
        try:
            dist.irecv(torch.empty(8), 0, tag=5).wait(timedelta(seconds=1))
        except Exception as e:  # noqa: BLE001
            dist.barrier()
            return str(e), received(torch.empty(8), 6, tag=5)
        return "no error"

    if rank == 0:
        step("longer", lambda: dist.send(pattern(251, 1), 1))
        step("shorter", lambda: dist.send(pattern(249, 2), 1))
        step("longer, large", lambda: dist.send(pattern(BIG + 1, 1), 1))
        step("shorter, large", lambda: dist.send(pattern(BIG - 1, 2), 1))
        step("after, non-contiguous recv", lambda: dist.send(pattern(BIG, 3), 1))
        step("tags out of order", lambda: [w.wait() for w in (dist.isend(pattern(4, 4), 1, tag=7),
                                                              dist.isend(pattern(4, 5), 1, tag=8))])
    else:
        step("longer", lambda: dist.recv(torch.empty(250), 0))
        step("shorter", lambda: dist.recv(torch.empty(250)))  # any source
        step("longer, large", lambda: dist.recv(torch.empty(BIG), 0))
        step("shorter, large", lambda: dist.recv(torch.empty(BIG)))
        step("after, non-contiguous recv", lambda: received(torch.empty(BIG, 2)[:, 0], 3))
        step("tags out of order", lambda: (received(torch.empty(4), 5, tag=8), received(torch.empty(4), 4, tag=7)))
    step("crossed batch", crossed)
    step("timeout withdraws", withdrawn)
    t = torch.ones(5)
    dist.all_reduce(t)
    seen["all_reduce after"] = ("ok", t.tolist(), 0.0)
    seen["listeners"] = ("ok", _listeners(), 0.0)
    from hoccl_backend._registration import _create  # a second group's listener ends with it

    pg = _create(dist.PrefixStore("p2p", dist.distributed_c10d._get_default_store()), rank, world,
                 timedelta(seconds=30))
    t = torch.zeros(3)
    (pg.send([torch.ones(3)], peer, 0) if rank == 0 else pg.recv([t], peer, 0)).wait()
    during = _listeners()
    pg.shutdown()
    seen["second group"] = ("ok", (t.tolist(), during, _listeners()), 0.0)
    return seen


def _listeners():
    """This process's hoccl send/recv listener threads."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return names.count("hoccl-p2p")


def same_host_point_to_point(rank, world):
    """On an interleaved group (group ranks 0 and 2 on host 0, 1 and 3 on host 1): group ranks 0
    and 2 exchange through their host's shared memory (no gloo listener starts for it), a size
    mismatch between them names the group's ranks, a recv from any source that times out leaves
    the next message of either engine to the next recv, and a fan-in of any-source recvs takes
    one message from each rank."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from hoccl_backend._registration import _create

    half = world // 2
    me = (rank % half) * 2 + rank // half
    store = dist.PrefixStore("same-host-p2p", dist.distributed_c10d._get_default_store())
    pg = _create(store, me, world, timedelta(seconds=4))
    seen = {}
    big = torch.arange(300_000, dtype=torch.float32)
    if me in (0, 2):
        peer = 2 - me
        got = torch.empty_like(big)
        works = [pg.recv([got], peer, 1), pg.send([big + me], peer, 1)]
        for w in works:
            w.wait()
        seen["exchange"] = torch.equal(got, big + peer)
        seen["listeners"] = _listeners()
        if me == 0:
            try:
                pg.recv([torch.empty(250)], 2, 2).wait()
                seen["mismatch"] = "no error"
            except Exception as e:  # noqa: BLE001 - the message is the result
                seen["mismatch"] = str(e)
        else:
            pg.send([torch.ones(251)], 0, 2).wait()
    # The waits around the timeout below go through the default group (60 s): this group's
    # own barrier would time out beside it.
    dist.barrier()
    if me == 0:  # nothing is sent with tag 3 until this recv has given up
        started = time.monotonic()
        try:
            pg.recv_anysource([torch.empty(3)], 3).wait()
            seen["any timeout"] = "no error"
        except Exception as e:  # noqa: BLE001 - the message is the result
            seen["any timeout"] = (str(e), time.monotonic() - started)
    dist.barrier()
    if me in (1, 2):  # one sender on the host of rank 0, one on the other
        pg.send([torch.full((3,), float(me))], 0, 3).wait()
    if me == 0:
        for src in (1, 2):
            t = torch.empty(3)
            pg.recv([t], src, 3).wait()
            seen[f"after timeout from {src}"] = t.tolist()
    pg.barrier().wait()
    from multihost.checks import check_any_source_fan_in

    seen["fan in"] = check_any_source_fan_in(pg, me, world)
    pg.shutdown()
    return me, seen


def test_send_recv_between_ranks_of_one_host_use_its_shared_memory():
    with Hosts(count=2, ranks=[2, 2]) as hosts:
        results = dict(hosts.run_ranks(same_host_point_to_point, backend="hoccl", pg_timeout=60, timeout=200))
    for me in (0, 2):
        assert results[me]["exchange"] is True, f"group rank {me}: {results[me]}"
        assert results[me]["listeners"] == 0, f"group rank {me}: a gloo listener started: {results[me]}"
    error = results[0]["mismatch"]
    assert "on rank 0: rank 2 sent 1004 bytes with tag 2 but this recv expects 1000 bytes with tag 2" in error, error
    error, took = results[0]["any timeout"]
    assert "hoccl recv on rank 0: no message from any rank with tag 3 within the timeout of 4000 ms" in error, error
    assert took < 20, took
    assert results[0]["after timeout from 1"] == [1.0] * 3 and results[0]["after timeout from 2"] == [2.0] * 3
    assert results[3]["fan in"] == 3


def test_send_recv_size_mismatch_across_hosts_raises_on_the_receiver():
    """A recv checks the sender's header first: a longer or shorter message raises on the
    receiver, naming both sides, while the sender completes and the pair stays aligned."""
    with Hosts(count=2, ranks=[1, 1]) as hosts:
        results = hosts.run_ranks(send_recv_sizes_across_hosts, backend="hoccl", pg_timeout=30, timeout=120)
    sender, receiver = results
    for name, sent, expects in (("longer", 251, 250), ("shorter", 249, 250), ("longer, large", 70_001, 70_000),
                                ("shorter, large", 69_999, 70_000)):
        assert sender[name][0] == "ok", f"sender, {name}: {sender[name]}"
        kind, error, took = receiver[name]
        assert kind == "raised" and took < 10, f"receiver, {name}: {receiver[name]}"
        assert f"hoccl recv on rank 1: rank 0 sent {4 * sent} bytes ({sent} Float elements), this recv expects " \
               f"{4 * expects} bytes ({expects} Float elements)" in error, error
    for rank, seen in enumerate(results):
        for name in ("after, non-contiguous recv", "tags out of order", "crossed batch"):
            assert seen[name][0] == "ok" and seen[name][1] is not False, f"rank {rank}, {name}: {seen[name]}"
        assert seen["all_reduce after"][1] == [2.0] * 5
    assert receiver["after, non-contiguous recv"][1] is True
    assert receiver["tags out of order"][1] == (True, True)
    for rank, seen in enumerate(results):  # one listener per group that received, none after shutdown
        assert seen["listeners"][1] == 1, f"rank {rank}: {seen['listeners']}"
        assert seen["second group"][1][1:] == (1 + rank, 1), f"rank {rank}: {seen['second group']}"
    assert receiver["second group"][1][0] == [1.0] * 3
    error, late = receiver["timeout withdraws"][1]
    assert "no message from rank 0 with tag 5 within the timeout of 1000 ms" in error and late, error
    print({name: value[1] for name, value in receiver.items()})


def collectives_until_failure(rank, world, started_dir):
    """all_reduce and all_gather_into_tensor in turn until one raises."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    with open(os.path.join(started_dir, f"rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    t = torch.ones(1 << 18)
    gathered = torch.empty(world << 16)
    started = time.monotonic()
    while time.monotonic() - started < 300:
        try:
            dist.all_reduce(t)
            t.fill_(1.0)
            dist.all_gather_into_tensor(gathered, t[: 1 << 16])
        except Exception as e:  # noqa: BLE001 - what the survivor saw is the result
            return ("raised", str(e), time.monotonic())
    return ("no error", "", time.monotonic())


def test_killed_host_is_named_by_every_survivor(tmp_path):
    pg_timeout = 20
    with Hosts(count=2, ranks=[2, 2]) as hosts:
        job = hosts.start(collectives_until_failure, str(tmp_path), backend="hoccl", pg_timeout=pg_timeout)
        wait_for_files(tmp_path, hosts.world, timeout=120)
        time.sleep(1.0)  # well inside the loop of all_reduces
        killed = time.monotonic()
        hosts.kill_host(1)
        results = job.wait(timeout=pg_timeout + 60, expect_errors=True)
        for rank in hosts.ranks_of(0):
            kind, message, when = results[rank]
            assert kind == "raised", f"rank {rank}: {results[rank]}"
            assert "ranks 2, 3" in message and hosts.names[1] in message, f"rank {rank}: {message}"
            assert when - killed < pg_timeout + 5, f"rank {rank} raised {when - killed:.1f}s after the kill"
        assert all(results[r][0] == "missing" for r in hosts.ranks_of(1))
        print(f"survivors named the lost host: {results[0][1].splitlines()[0]}")
        _check_clean(hosts)


def test_cut_link_raises_within_the_timeout(tmp_path):
    pg_timeout = 10
    with Hosts(count=2, ranks=[1, 1]) as hosts:
        if not hosts.isolated:
            print(f"process-group hosts have no link to cut; {hosts.describe()}")
            return
        job = hosts.start(collectives_until_failure, str(tmp_path), backend="hoccl", pg_timeout=pg_timeout)
        wait_for_files(tmp_path, hosts.world, timeout=120)
        time.sleep(1.0)
        cut = time.monotonic()
        hosts.cut_link(1)
        results = job.wait(timeout=pg_timeout + 60, expect_errors=True)
        for rank in range(hosts.world):
            kind, message, when = results[rank]
            assert kind == "raised", f"rank {rank}: {results[rank]}"
            other = hosts.names[1 - hosts.host_of(rank)]
            assert other in message and "inter-host" in message, f"rank {rank}: {message}"
            assert when - cut < pg_timeout + 5, f"rank {rank} raised {when - cut:.1f}s after the cut"
        print(f"cut link: {results[0][1].splitlines()[0]}")
        hosts.restore_link(1)
        _check_clean(hosts)
