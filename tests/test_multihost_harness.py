"""The multi-host harness: real hosts on one machine, each with its own network, IPC, mount,
PID and UTS namespaces; jobs launched on them with torchrun and c10d rendezvous.

Where namespaces cannot be made, the harness runs hosts as process groups with HOCCL_HOSTNAME;
these tests then check what that mode can show and print that they did. torch is imported inside
the functions so that ranks of jobs without a process group start without it.
"""
import os
import socket
import subprocess
import time

import pytest

from hoccl_backend.testbed.hosts import Hosts, HostsError, leftovers, wait_for_files


def probe(rank, world, marker):
    """Collectives across hosts plus what this rank can see of its host."""
    import torch
    import torch.distributed as dist

    creator = int(os.environ["GROUP_RANK"]) == 0 and int(os.environ["LOCAL_RANK"]) == 0
    if creator:
        with open(f"/dev/shm/{marker}", "w") as f:
            f.write(socket.gethostname())
    dist.barrier()
    summed = torch.arange(5, dtype=torch.float64) + 10 * rank
    dist.all_reduce(summed)
    gathered = [torch.empty(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([rank, rank * rank]))
    seen = {
        "hostname": socket.gethostname(),
        "hoccl_hostname": os.environ.get("HOCCL_HOSTNAME"),
        "shm": sorted(os.listdir("/dev/shm")),
        "ns": {kind: os.readlink(f"/proc/self/ns/{kind}") for kind in ("pid", "ipc", "mnt",
                                                                        "uts", "net")},
        "master_addr": os.environ["MASTER_ADDR"],
        "group_rank": int(os.environ["GROUP_RANK"]),
        "summed": summed,
        "gathered": torch.stack(gathered),
    }
    dist.barrier()  # every rank has listed /dev/shm before the marker may go
    if creator and os.environ.get("HOCCL_HOSTNAME"):
        os.unlink(f"/dev/shm/{marker}")  # process-group hosts share the machine's /dev/shm
    return seen


def root_links():
    """Names of the machine's own network interfaces."""
    if os.geteuid() != 0:
        return set()
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10).stdout
    return {line.split(":")[1].strip() for line in out.splitlines() if line.strip()}


def check_probe(hosts, results, marker):
    import torch

    world = hosts.world
    expected_sum = torch.arange(5, dtype=torch.float64) * world + 10 * sum(range(world))
    expected_gather = torch.tensor([[r, r * r] for r in range(world)])
    assert results.mode == hosts.mode
    for rank, seen in enumerate(results):
        h = hosts.host_of(rank)
        assert seen["group_rank"] == h, f"rank {rank}"
        assert torch.equal(seen["summed"], expected_sum), f"rank {rank}"
        assert torch.equal(seen["gathered"], expected_gather), f"rank {rank}"
        assert seen["master_addr"] == hosts.addr(0)
    by_host = [[results[r] for r in hosts.ranks_of(h)] for h in range(hosts.count)]
    if not hosts.isolated:
        print(f"process-group hosts: checked names only ({hosts.describe()})")
        for h, ranks in enumerate(by_host):
            assert {s["hoccl_hostname"] for s in ranks} == {hosts.names[h]}
        return
    for h, ranks in enumerate(by_host):
        assert {s["hostname"] for s in ranks} == {hosts.names[h]}
        assert all(s["ns"] == ranks[0]["ns"] for s in ranks), f"host {h} ranks differ"
        assert (marker in ranks[0]["shm"]) == (h == 0), f"host {h} sees {ranks[0]['shm']}"
        assert hosts.shm_files(h) == ([marker] if h == 0 else [])
        bytes_ = hosts.link_bytes(h)
        assert bytes_.tx > 0 and bytes_.rx > 0, f"host {h}: {bytes_}"
    for a in range(hosts.count):
        for b in range(a + 1, hosts.count):
            for kind in ("pid", "ipc", "mnt", "uts", "net"):
                assert by_host[a][0]["ns"][kind] != by_host[b][0]["ns"][kind], (a, b, kind)
    assert marker not in os.listdir("/dev/shm"), "host 0's file reached the machine's /dev/shm"


def assert_gone(run_id, links_before, marker=None):
    assert leftovers(run_id) == []
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           timeout=10).stdout if os.geteuid() == 0 else ""
    assert run_id not in netns
    assert root_links() <= links_before
    if marker:
        assert marker not in os.listdir("/dev/shm")


@pytest.mark.parametrize("ranks", [[2, 2], [2, 1, 2]], ids=["2x2", "3hosts-2-1-2"])
def test_gloo_across_hosts(ranks):
    links = root_links()
    with Hosts(count=len(ranks), ranks=ranks) as hosts:
        marker = f"{hosts.run_id}-probe"
        results = hosts.run_ranks(probe, marker, backend="gloo", pg_timeout=30)
        check_probe(hosts, results, marker)
        run_id = hosts.run_id
    assert_gone(run_id, links, marker)


def hoccl_init(rank, world):
    import torch
    import torch.distributed as dist

    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    return t.tolist()


def test_hoccl_group_spans_hosts():
    """hoccl accepts a group across hosts (tests/test_multihost.py checks every op)."""
    links = root_links()
    with Hosts(count=2, ranks=[2, 2]) as hosts:
        results = hosts.run_ranks(hoccl_init, backend="hoccl", pg_timeout=30, timeout=120)
        assert all(r == [6.0] * 3 for r in results), results
        if hosts.isolated:
            for h in range(hosts.count):
                assert hosts.shm_files(h) == [], f"host {h} kept {hosts.shm_files(h)}"
        run_id = hosts.run_id
    assert_gone(run_id, links)


def sleeper(rank, world, started_dir):
    with open(os.path.join(started_dir, f"rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)


def test_teardown_after_failure_inside_with(tmp_path):
    links = root_links()
    with pytest.raises(RuntimeError, match="failure inside the hosts"):
        with Hosts(count=2, ranks=[1, 1]) as hosts:
            run_id = hosts.run_id
            job = hosts.start(sleeper, str(tmp_path), backend=None)
            wait_for_files(tmp_path, hosts.world)
            with pytest.raises(TimeoutError, match="did not finish"):
                job.wait(timeout=1)
            assert not job.running()
            second = tmp_path / "second"
            second.mkdir()
            hosts.start(sleeper, str(second), backend=None)
            wait_for_files(second, hosts.world)
            pids = [pid for h in range(hosts.count) for pid in hosts.host_pids(h)]
            assert len(pids) >= 2 * hosts.count  # torchrun and its rank on every host
            raise RuntimeError("failure inside the hosts")
    assert_gone(run_id, links)
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


def test_links_cut_and_shaped():
    with Hosts(count=2, link_gbit=2) as hosts:
        if not hosts.isolated:
            print(f"process-group hosts have no links to cut; {hosts.describe()}")
            with pytest.raises(HostsError, match="needs network namespaces"):
                hosts.cut_link(1)
            assert hosts.link_bytes(1) is None
            return
        assert "rate 2Gbit" in hosts.exec(0, ["tc", "qdisc", "show", "dev", "eth0"]).stdout
        connect = ["python3", "-c",
                   f"import socket; socket.create_connection(('{hosts.addr(0)}', 9), timeout=5)"]
        assert "ConnectionRefusedError" in hosts.exec(1, connect, check=False).stderr
        hosts.cut_link(1)
        assert "Network is unreachable" in hosts.exec(1, connect, check=False).stderr
        hosts.restore_link(1)
        assert "ConnectionRefusedError" in hosts.exec(1, connect, check=False).stderr


def test_process_group_hosts_when_namespaces_are_unavailable():
    """The fallback mode runs the same jobs, and says it is the fallback."""
    with Hosts(count=2, ranks=[1, 1], isolate=False) as hosts:
        assert hosts.mode == "process-groups" and "PLAIN PROCESS GROUPS" in hosts.describe()
        marker = f"{hosts.run_id}-probe"
        results = hosts.run_ranks(probe, marker, backend="gloo", pg_timeout=30)
        check_probe(hosts, results, marker)
        summed = hosts.run_ranks(hoccl_init, backend="hoccl", pg_timeout=30)
        assert all(r == [1.0] * 3 for r in summed), summed
        run_id = hosts.run_id
    assert leftovers(run_id) == []


def blocked_in_all_reduce(rank, world, started_dir):
    import torch
    import torch.distributed as dist

    dist.barrier()
    with open(os.path.join(started_dir, f"rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if rank == 0:
        dist.all_reduce(torch.ones(4))  # host 1 never joins: it is killed meanwhile
    else:
        time.sleep(120)
    return rank


def test_kill_host_mid_collective(tmp_path):
    with Hosts(count=2, ranks=[1, 1]) as hosts:
        job = hosts.start(blocked_in_all_reduce, str(tmp_path), backend="gloo", pg_timeout=20)
        wait_for_files(tmp_path, hosts.world)
        hosts.kill_host(1)
        assert hosts.host_pids(1) == []
        survivor, lost = job.wait(timeout=60, expect_errors=True)
        assert survivor[0] == "error", survivor
        assert lost[0] == "missing", lost
        print(f"survivor of a killed host raised: {survivor[1].splitlines()[0]}")
