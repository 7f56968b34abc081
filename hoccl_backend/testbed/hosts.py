"""Real hosts on one machine, for multi-host tests and benchmarks.

`Hosts(count, ranks)` makes `count` hosts and launches jobs on them with torchrun:

    with Hosts(count=2, ranks=[2, 2]) as hosts:
        results = hosts.run_ranks(fn, arg, backend="gloo")   # fn(rank, world, arg) on every rank

Jobs: `run_ranks` (start + wait), `start` -> Job (`wait`, `kill`, `running`, `log`),
`start_script` for a training script. Hosts: `names`, `addr`, `ifname`, `ranks_of`, `host_of`,
`exec`, `command`/`env_for`, `kill_host`, `host_pids`, `cut_link`/`restore_link`, `link_bytes`,
`shm_files`, `mode`/`isolated`/`describe`, `leftovers`. Each host h holds ranks
`ranks_of(h)`: torchrun's agents number nodes in host order and give a node's ranks
consecutively, uneven counts per host included.

Isolated mode (root, iproute2 and util-linux present): every host is its own network namespace
with one interface, `eth0`, a veth whose other end sits on a bridge in one more namespace.
Addresses are 10.77.0.(100+h)/24 and exist only inside these namespaces; no route leads out.
Each host also has one long-lived init process made by
`ip netns exec NS unshare --ipc --mount --pid --uts --fork --mount-proc`, which mounts a private
tmpfs on /dev/shm, bind-mounts a generated hosts file over /etc/hosts and sets the host name;
every command of the host is started inside that init's namespaces with nsenter. So shared
memory, SysV IPC, process ids and host names are per host, and the hosts reach each other only
over TCP. The filesystem stays shared, as on a cluster with network home directories.

Fallback mode (not root, tools missing, or namespaces refused): hosts are plain process groups
on the loopback interface, each told its name through HOCCL_HOSTNAME. `mode` says which mode is
running, a line is printed when the hosts come up, and every result carries the mode.

Everything a run makes is named `hoccl-hx-<pid>-<n>...`; leftovers of runs whose process is gone
are removed when the next run starts. Teardown kills every process of the run and deletes its
namespaces even when the body of the `with` raised.
"""
from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass

PREFIX = "hoccl-hx"
STEP_TIMEOUT = 15.0          # any single setup/teardown command
HOST_ADDR_BASE = 100         # 3-digit last octets: torchrun orders nodes by the string of their
                             # address, so equal-length addresses keep node rank == host index
SUBNET = "10.77.0"
LOOPBACK_SUBNET = "127.77.0"
IFNAME = "eth0"
RDZV_PORT = 29400
RUN_ENV = "TESTBED_HOSTS_RUN"  # marks every process of a run, so teardown finds orphans too
HOST_ENV = "TESTBED_HOST_INDEX"  # the host a process belongs to
JOB_ENV = "TESTBED_JOB_DIR"     # the job a process belongs to; ranks leave results there
AGENT_GRACE = 5.0                # for torchrun agents to exit once every rank is accounted for
HOSTS_PY = os.path.abspath(__file__)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HOSTS_PY)))

_sequence = itertools.count()


class HostsError(RuntimeError):
    """The harness could not build, drive or tear down the hosts."""


@dataclass(frozen=True)
class LinkBytes:
    tx: int
    rx: int


class RankResults(list):
    """Per-rank return values in rank order, plus what the harness saw of the job."""

    def __init__(self, values, mode, returncodes, logs):
        super().__init__(values)
        self.mode = mode                # "namespaces" or "process-groups"
        self.returncodes = returncodes  # torchrun's exit status per host
        self.logs = logs                # torchrun's output per host


# ----------------------------------------------------------------------------- processes

def _run(argv, timeout=STEP_TIMEOUT, check=True) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise HostsError(f"`{' '.join(argv)}` did not finish within {timeout}s") from None
    if check and proc.returncode != 0:
        raise HostsError(f"`{' '.join(argv)}` failed (exit {proc.returncode}): "
                         f"{proc.stderr.strip()}")
    return proc.stdout


_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    # If the test process dies without running teardown, its children get SIGKILL; the host
    # inits run under `unshare --kill-child`, so their whole PID namespace goes with them.
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _spawn(argv, env, log_path):
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)


def _reap(proc, timeout=5.0):
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _marked_pids(run_id: str, **marks) -> list[int]:
    """Pids whose environment carries this run's marker and every NAME=value in `marks`."""
    want = {f"{RUN_ENV}={run_id}".encode()}
    want |= {f"{name}={value}".encode() for name, value in marks.items()}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            found.append(int(entry))
    return found


def _mount_holders(source: str) -> list[int]:
    """Pids whose mount table still has a mount whose line contains `source`."""
    holders = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/mountinfo") as f:
                    if source in f.read():
                        holders.append(int(entry))
            except OSError:
                pass
    return holders


def _kill_all(pids, timeout=5.0):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_is_running(p) for p in pids):
        time.sleep(0.05)


def _is_running(pid: int) -> bool:
    """Alive and not a zombie (a zombie holds no namespace and no memory)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _attempt(errors: list[str], what: str, fn, *args):
    """Run one teardown step; a failure is recorded and the remaining steps still run."""
    try:
        fn(*args)
    except (HostsError, OSError, subprocess.SubprocessError) as exc:
        errors.append(f"{what}: {exc}")


def _tail(path: str, chars: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return ""


# ----------------------------------------------------------------------------- namespaces

def _netns_names() -> list[str]:
    if shutil.which("ip") is None:
        return []
    out = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _netns_pids(ns: str) -> list[int]:
    out = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def _delete_netns(ns: str):
    _kill_all(_netns_pids(ns))
    _run(["ip", "netns", "del", ns], check=False)


def _owner_pid(name: str) -> int | None:
    # hoccl-hx-<pid>-<n>... -> pid of the test process that made it
    rest = name[len(PREFIX) + 1:] if name.startswith(PREFIX + "-") else ""
    head = rest.split("-", 1)[0]
    return int(head) if head.isdigit() else None


def cleanup_stale() -> list[str]:
    """Remove namespaces, processes and run folders of runs whose test process is gone."""
    removed = []
    for ns in _netns_names():
        owner = _owner_pid(ns)
        if owner is not None and not _pid_alive(owner):
            _delete_netns(ns)
            removed.append(f"netns {ns}")
    tmp = tempfile.gettempdir()
    for entry in os.listdir(tmp):
        owner = _owner_pid(entry)
        if owner is not None and not _pid_alive(owner):
            run_id = "-".join(entry.split("-")[:4])
            _kill_all(_marked_pids(run_id))
            shutil.rmtree(os.path.join(tmp, entry), ignore_errors=True)
            removed.append(f"dir {entry}")
    return removed


def leftovers(run_id: str) -> list[str]:
    """What of run `run_id` still exists: namespaces, processes, run folders."""
    found = [f"netns {ns}" for ns in _netns_names() if ns.startswith(run_id + "-")]
    found += [f"pid {pid}" for pid in _marked_pids(run_id) if _is_running(pid)]
    found += [f"/dev/shm tmpfs held by pid {pid}" for pid in _mount_holders(f"{run_id}-shm ")]
    tmp = tempfile.gettempdir()
    found += [f"dir {e}" for e in os.listdir(tmp) if e.startswith(run_id + "-")]
    return found


def wait_for_files(folder, count: int, timeout: float = 60.0) -> None:
    """Waits until `count` ranks have written their `rank*` marker into `folder`."""
    deadline = time.monotonic() + timeout
    while len([f for f in os.listdir(folder) if f.startswith("rank")]) < count:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"only {sorted(os.listdir(folder))} started within {timeout:.0f} s")
        time.sleep(0.1)


def namespaces_unavailable() -> str | None:
    """Why isolated hosts cannot be made here, or None when they probably can."""
    if os.geteuid() != 0:
        return "not root"
    missing = [t for t in ("ip", "unshare", "nsenter", "mount", "tc") if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)}"
    return None


class _Namespaces:
    """Hosts as network + IPC/mount/PID/UTS namespaces joined by a bridge."""

    mode = "namespaces"

    def __init__(self, hosts: "Hosts"):
        self.hosts = hosts
        self.bridge_ns = f"{hosts.run_id}-br"
        self.host_ns = [f"{hosts.run_id}-h{h}" for h in range(hosts.count)]
        self.made: list[str] = []
        self.unshares: list[subprocess.Popen] = []
        self.inits: list[int] = []

    def addr(self, h):
        return f"{SUBNET}.{HOST_ADDR_BASE + h}"

    def ifname(self, h):
        return IFNAME

    def rdzv_endpoint(self, job_index):
        return f"{self.addr(0)}:{RDZV_PORT + job_index}"

    def create(self):
        self._add_ns(self.bridge_ns)
        ip = ["ip", "-n", self.bridge_ns]
        _run(ip + ["link", "add", "br0", "type", "bridge"])
        _run(ip + ["link", "set", "br0", "up"])
        for h, ns in enumerate(self.host_ns):
            self._add_ns(ns)
            _run(ip + ["link", "add", f"v{h}", "type", "veth", "peer", "name", IFNAME,
                       "netns", ns])
            _run(ip + ["link", "set", f"v{h}", "master", "br0", "up"])
            if self.hosts.mtu:
                _run(ip + ["link", "set", f"v{h}", "mtu", str(self.hosts.mtu)])
                _run(["ip", "-n", ns, "link", "set", IFNAME, "mtu", str(self.hosts.mtu)])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addr(h)}/24", "dev", IFNAME])
            _run(["ip", "-n", ns, "link", "set", IFNAME, "up"])
            if self.hosts.link_gbit:
                self._shape(ns, IFNAME)                 # host -> bridge
                self._shape(self.bridge_ns, f"v{h}")    # bridge -> host
        for h in range(self.hosts.count):
            self._start_init(h)

    def _add_ns(self, ns):
        _run(["ip", "netns", "add", ns])
        self.made.append(ns)
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        # IPv4 only: no router solicitations or DAD on the links, so their byte counters
        # count the job's traffic, and gloo cannot pick a link-local IPv6 address.
        _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
              "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
             check=False)

    def _shape(self, ns, dev):
        _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate",
              f"{self.hosts.link_gbit}gbit", "burst", "512kb", "latency", "100ms"])

    def _start_init(self, h):
        hosts = self.hosts
        ready = os.path.join(hosts.dir, f"host{h}.ready")
        argv = ["ip", "netns", "exec", self.host_ns[h], "unshare", "--ipc", "--mount", "--pid",
                "--uts", "--fork", "--mount-proc", "--kill-child=SIGKILL", sys.executable,
                HOSTS_PY, "--init", hosts.names[h], hosts.hosts_file, ready, hosts.run_id]
        proc = _spawn(argv, hosts.env_for(h), os.path.join(hosts.dir, f"host{h}.init.log"))
        self.unshares.append(proc)
        deadline = time.monotonic() + STEP_TIMEOUT
        while not os.path.exists(ready):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise HostsError(f"host {h} did not come up: "
                                 f"{_tail(os.path.join(hosts.dir, f'host{h}.init.log'))}")
            time.sleep(0.02)
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            self.inits.append(int(f.read().split()[0]))

    def command(self, h, argv):
        return ["nsenter", "-t", str(self.inits[h]), "-n", "-m", "-i", "-u", "-p",
                f"--wdns={os.getcwd()}", "--"] + argv

    def host_env(self, h):
        return {}

    def host_pids(self, h):
        """Every process in host h's PID namespace except its init."""
        init = self.inits[h]
        ns = os.readlink(f"/proc/{init}/ns/pid")
        pids = []
        for pid in _netns_pids(self.host_ns[h]):
            try:
                if pid != init and os.readlink(f"/proc/{pid}/ns/pid") == ns:
                    pids.append(pid)
            except OSError:
                pass
        return pids

    def link_bytes(self, h):
        stats = f"/proc/{self.inits[h]}/root/sys/class/net/{IFNAME}/statistics"
        with open(f"{stats}/tx_bytes") as tx, open(f"{stats}/rx_bytes") as rx:
            return LinkBytes(int(tx.read()), int(rx.read()))

    def set_link(self, h, up: bool):
        _run(["ip", "-n", self.host_ns[h], "link", "set", IFNAME, "up" if up else "down"])

    def shm_files(self, h):
        return sorted(os.listdir(f"/proc/{self.inits[h]}/root/dev/shm"))

    def destroy(self):
        errors: list[str] = []
        # The kernel kills every process of a PID namespace with its init, and the host's
        # tmpfs goes with the last process of its mount namespace.
        _attempt(errors, "killing the host inits", _kill_all, self.inits)
        for proc in self.unshares:
            _attempt(errors, f"reaping unshare {proc.pid}", _reap, proc)
        for ns in reversed(self.made):
            _attempt(errors, f"deleting {ns}", _delete_netns, ns)
        remaining = [ns for ns in _netns_names() if ns in self.made]
        if remaining:
            errors.append(f"namespaces {remaining} could not be deleted")
        return errors


class _ProcessGroups:
    """Hosts as plain process groups on loopback, told apart by HOCCL_HOSTNAME."""

    mode = "process-groups"

    def __init__(self, hosts: "Hosts", reason: str):
        self.hosts = hosts
        self.reason = reason

    def addr(self, h):
        return f"{LOOPBACK_SUBNET}.{HOST_ADDR_BASE + h}"

    def ifname(self, h):
        return "lo"

    def rdzv_endpoint(self, job_index):
        with socket.socket() as s:
            s.bind((self.addr(0), 0))
            return f"{self.addr(0)}:{s.getsockname()[1]}"

    def create(self):
        pass

    def command(self, h, argv):
        return argv

    def host_env(self, h):
        return {"HOCCL_HOSTNAME": self.hosts.names[h]}

    def host_pids(self, h):
        return _marked_pids(self.hosts.run_id, **{HOST_ENV: h})

    def link_bytes(self, h):
        return None

    def set_link(self, h, up: bool):
        raise HostsError(f"cutting host {h}'s link needs network namespaces; these hosts are "
                         f"process groups ({self.reason})")

    def shm_files(self, h):
        return sorted(os.listdir("/dev/shm"))  # one /dev/shm shared by every host

    def destroy(self):
        errors: list[str] = []
        _attempt(errors, "killing the hosts' processes", _kill_all,
                 _marked_pids(self.hosts.run_id))
        return errors


# ----------------------------------------------------------------------------- jobs

class Job:
    """One torchrun per host, started together; `wait()` collects what the ranks returned."""

    def __init__(self, hosts: "Hosts", index: int, tail: list[str], env: dict | None,
                 timeout: float, worker: bool):
        self.hosts = hosts
        self.index = index
        self.timeout = timeout
        self.worker = worker
        self.dir = os.path.join(hosts.dir, f"job{index}")
        os.makedirs(self.dir)
        self.lost_hosts: set[int] = set()   # hosts killed while this job ran
        endpoint = hosts._fabric.rdzv_endpoint(index)
        self.procs = []
        for h in range(hosts.count):
            argv = [sys.executable, "-m", "torch.distributed.run",
                    "--nnodes", str(hosts.count), "--node_rank", str(h),
                    "--nproc_per_node", str(hosts.ranks[h]),
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                    "--rdzv-id", f"{hosts.run_id}-job{index}",
                    "--rdzv-conf", f"is_host={int(h == 0)},join_timeout={int(timeout) + 1}",
                    "--local-addr", hosts.addr(h), "--max-restarts", "0",
                    "--monitor-interval", "0.1"] + tail
            job_env = hosts.env_for(h)
            job_env.update(env or {})
            job_env[JOB_ENV] = self.dir
            self.procs.append(_spawn(hosts._fabric.command(h, argv), job_env, self.log_path(h)))

    def log_path(self, h):
        return os.path.join(self.dir, f"host{h}.log")

    def log(self, h) -> str:
        return _tail(self.log_path(h), 1 << 20)

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def kill(self):
        """SIGKILL every process of this job on every host."""
        _kill_all(_marked_pids(self.hosts.run_id, **{JOB_ENV: self.dir}))
        for p in self.procs:
            _reap(p)

    def wait(self, timeout: float | None = None, expect_errors: bool = False) -> RankResults:
        """Wait for every host's torchrun; kill the job and raise TimeoutError past `timeout`.

        Returns rank-ordered values. A rank that raised gives ("error", traceback) and a rank that
        left no result (killed) gives ("missing", its host's log tail) when expect_errors is
        set; otherwise either fails here with the rank's traceback or log.
        """
        budget = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + budget
        while not self._accounted_for():
            if time.monotonic() > deadline:
                self.kill()
                missing = [r for r in range(self.hosts.world) if not self._has_result(r)]
                raise TimeoutError(
                    f"job {self.index} on {self.hosts.count} hosts did not finish within "
                    f"{budget}s; ranks without a result: {missing}\n{self._logs_tail()}")
            time.sleep(0.05)
        self._stop_agents()
        results = RankResults([], self.hosts.mode, [p.returncode for p in self.procs],
                              [self.log(h) for h in range(self.hosts.count)])
        if not self.worker:
            if any(results.returncodes) and not expect_errors:
                raise AssertionError(f"torchrun exit codes {results.returncodes}\n"
                                     f"{self._logs_tail()}")
            return results
        for rank in range(self.hosts.world):
            results.append(self._rank_value(rank, expect_errors))
        return results

    def _accounted_for(self) -> bool:
        if not self.running():
            return True
        return self.worker and all(self._has_result(r) or self.hosts.host_of(r) in self.lost_hosts
                                   for r in range(self.hosts.world))

    def _stop_agents(self):
        # torchrun's agents wait at an exit barrier for every other agent (300 s, not
        # configurable), which never completes once a host has been killed.
        deadline = time.monotonic() + AGENT_GRACE
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))
        if self.running():
            self.kill()

    def _has_result(self, rank):
        return os.path.exists(os.path.join(self.dir, f"rank{rank}.pkl"))

    def _rank_value(self, rank, expect_errors):
        host = self.hosts.host_of(rank)
        if not self._has_result(rank):
            if expect_errors:
                return ("missing", _tail(self.log_path(host)))
            raise AssertionError(f"rank {rank} (host {host}) left no result:\n"
                                 f"{_tail(self.log_path(host))}")
        with open(os.path.join(self.dir, f"rank{rank}.pkl"), "rb") as f:
            record = pickle.load(f)
        if record["host"] != host:
            raise HostsError(f"rank {rank} ran on host {record['host']}, expected host {host}: "
                             f"torchrun did not order nodes by host")
        if record["status"] == "error":
            if expect_errors:
                return ("error", record["text"])
            raise AssertionError(f"rank {rank} (host {host}) failed:\n{record['text']}")
        return record["value"]

    def _logs_tail(self):
        return "\n".join(f"--- host {h} ---\n{_tail(self.log_path(h), 1500)}"
                         for h in range(self.hosts.count))


# ----------------------------------------------------------------------------- hosts

class Hosts:
    """`count` hosts with `ranks[h]` ranks on host h; a context manager.

    isolate=None makes namespaces when it can and falls back to process groups otherwise;
    True insists on namespaces; False forces process groups. link_gbit shapes every host's
    link to that rate in each direction, and mtu sets the links' MTU (namespaces only; 9000
    gives jumbo frames, whose headers add under 1 % to the link counters).
    """

    def __init__(self, count: int = 2, ranks: list[int] | None = None,
                 link_gbit: float | None = None, isolate: bool | None = None,
                 timeout: float = 60.0, mtu: int | None = None):
        ranks = list(ranks) if ranks is not None else [1] * count
        if count < 1 or len(ranks) != count or min(ranks) < 1:
            raise ValueError(f"Hosts: need count >= 1 and one rank count >= 1 per host, got "
                             f"count={count} ranks={ranks}")
        if count > 100:
            raise ValueError(f"Hosts: at most 100 hosts, got {count}")
        self.count = count
        self.ranks = ranks
        self.world = sum(ranks)
        self.link_gbit = link_gbit
        self.mtu = mtu
        self.timeout = timeout
        self.run_id = f"{PREFIX}-{os.getpid()}-{next(_sequence)}"
        self.names = [f"host{h}" for h in range(count)]
        self._isolate = isolate
        self._fabric = None
        self._jobs: list[Job] = []
        self.dir = None

    # -- lifecycle
    def __enter__(self) -> "Hosts":
        cleanup_stale()
        self.dir = tempfile.mkdtemp(prefix=self.run_id + "-")
        try:
            self._fabric = self._make_fabric()
        except BaseException:
            self.close()
            raise
        print(f"hoccl hosts: {self.describe()}", flush=True)
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _make_fabric(self):
        reason = "isolate=False" if self._isolate is False else namespaces_unavailable()
        if reason is None:
            with open(self.hosts_file, "w") as f:
                f.write("127.0.0.1 localhost\n")
                for h, name in enumerate(self.names):
                    f.write(f"{SUBNET}.{HOST_ADDR_BASE + h} {name}\n")
            self._fabric = _Namespaces(self)
            try:
                self._fabric.create()
                return self._fabric
            except HostsError as exc:
                self._fabric.destroy()
                self._fabric = None
                if self._isolate:
                    raise
                reason = f"namespaces failed: {exc}"
        if self._isolate:
            raise HostsError(f"isolated hosts requested but unavailable: {reason}")
        return _ProcessGroups(self, reason)

    def close(self):
        """Kill every process of the run, delete its namespaces and folder; idempotent."""
        errors: list[str] = []
        for job in self._jobs:
            _attempt(errors, f"killing job {job.index}", job.kill)
        if self._fabric is not None:
            errors += self._fabric.destroy()
        _attempt(errors, "killing leftover processes", _kill_all, _marked_pids(self.run_id))
        self._jobs.clear()
        self._fabric = None
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if errors:
            raise HostsError(f"teardown of {self.run_id}: {'; '.join(errors)}")

    # -- description
    @property
    def mode(self) -> str:
        """"namespaces" (isolated hosts) or "process-groups" (HOCCL_HOSTNAME hosts)."""
        return self._fabric.mode

    @property
    def isolated(self) -> bool:
        return self.mode == "namespaces"

    def describe(self) -> str:
        layout = f"{self.count} hosts, ranks {self.ranks}"
        if self.isolated:
            shaped = f", links shaped to {self.link_gbit} Gbit/s" if self.link_gbit else ""
            shaped += f", MTU {self.mtu}" if self.mtu else ""
            return (f"{layout} as network/IPC/mount/PID/UTS namespaces on a bridge "
                    f"({self.run_id}){shaped}")
        return (f"{layout} as PLAIN PROCESS GROUPS with HOCCL_HOSTNAME={self.names} "
                f"(no namespaces: {self._fabric.reason}); shared memory is NOT isolated")

    @property
    def hosts_file(self) -> str:
        return os.path.join(self.dir, "hosts")

    def addr(self, h: int) -> str:
        return self._fabric.addr(h)

    def ifname(self, h: int) -> str:
        return self._fabric.ifname(h)

    def ranks_of(self, h: int) -> range:
        base = sum(self.ranks[:h])
        return range(base, base + self.ranks[h])

    def host_of(self, rank: int) -> int:
        for h in range(self.count):
            if rank in self.ranks_of(h):
                return h
        raise ValueError(f"rank {rank} is outside a world of {self.world}")

    def env_for(self, h: int) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                            "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "HOCCL_HOSTNAME")}
        env.update({RUN_ENV: self.run_id, HOST_ENV: str(h), "GLOO_SOCKET_IFNAME": self.ifname(h),
                    "OMP_NUM_THREADS": "1"})
        env.update(self._fabric.host_env(h) if self._fabric else {})
        return env

    # -- jobs
    def start(self, fn, *args, backend: str | None = "gloo", pg_timeout: float = 30.0,
              env: dict | None = None, timeout: float | None = None) -> Job:
        """Start fn(rank, world, *args) on every rank after init_process_group(backend).

        fn must be a module-level function (ranks import it by name); backend=None skips
        init_process_group. Returns at once; call job.wait().
        """
        module = sys.modules.get(fn.__module__)
        if module is None or fn.__module__ == "__main__" or "<locals>" in fn.__qualname__:
            raise ValueError(f"Hosts.start: {fn.__qualname__} must be a module-level function "
                             f"of an importable module")
        root = os.path.abspath(module.__file__)
        for _ in range(fn.__module__.count(".") + 1):
            root = os.path.dirname(root)
        job_index = len(self._jobs)
        spec = os.path.join(self.dir, f"job{job_index}.pkl")
        with open(spec, "wb") as f:
            pickle.dump((fn, args, backend, pg_timeout), f)
        path = [root, REPO_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p]
        env = dict(env or {})
        env["PYTHONPATH"] = ":".join(dict.fromkeys(path))
        return self._start_job([HOSTS_PY, "--worker", spec], env, timeout, worker=True)

    def start_script(self, argv: list[str], env: dict | None = None,
                     timeout: float | None = None) -> Job:
        """Start a training script (torchrun's `script args...`) on every rank."""
        return self._start_job(list(argv), env, timeout, worker=False)

    def _start_job(self, tail, env, timeout, worker):
        job = Job(self, len(self._jobs), tail, env, timeout or self.timeout, worker)
        self._jobs.append(job)
        return job

    def run_ranks(self, fn, *args, backend: str | None = "gloo", pg_timeout: float = 30.0,
                  env: dict | None = None, timeout: float | None = None,
                  expect_errors: bool = False) -> RankResults:
        """start() then wait(): rank-ordered return values of fn (see Job.wait)."""
        job = self.start(fn, *args, backend=backend, pg_timeout=pg_timeout, env=env,
                         timeout=timeout)
        return job.wait(expect_errors=expect_errors)

    # -- hosts
    def command(self, h: int, argv: list[str]) -> list[str]:
        """argv wrapped to run on host h; start it with env=hosts.env_for(h)."""
        return self._fabric.command(h, list(argv))

    def exec(self, h: int, argv: list[str], timeout: float = STEP_TIMEOUT,
             check: bool = True) -> subprocess.CompletedProcess:
        """Run a command on host h (inside its namespaces, with its environment)."""
        try:
            proc = subprocess.run(self.command(h, argv), env=self.env_for(h),
                                  capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HostsError(f"host {h}: `{' '.join(argv)}` ran past {timeout}s") from None
        if check and proc.returncode != 0:
            raise HostsError(f"host {h}: `{' '.join(argv)}` failed (exit {proc.returncode}): "
                             f"{proc.stderr.strip()}")
        return proc

    def kill_host(self, h: int):
        """SIGKILL every process of host h (its torchrun and all its ranks), like a host dying.

        Running jobs stop waiting for that host's ranks; they come back as ("missing", log).
        """
        for job in self._jobs:
            if job.running():
                job.lost_hosts.add(h)
        _kill_all(self._fabric.host_pids(h))

    def host_pids(self, h: int) -> list[int]:
        """Pids (as this process sees them) of every job process on host h."""
        return self._fabric.host_pids(h)

    def cut_link(self, h: int):
        """Take host h's link down (`ip link set eth0 down`); namespaces only."""
        self._fabric.set_link(h, up=False)

    def restore_link(self, h: int):
        self._fabric.set_link(h, up=True)

    def link_bytes(self, h: int) -> LinkBytes | None:
        """Bytes host h's link has sent and received; None for process-group hosts."""
        return self._fabric.link_bytes(h)

    def shm_files(self, h: int) -> list[str]:
        """Host h's /dev/shm entries (the one shared /dev/shm for process-group hosts)."""
        return self._fabric.shm_files(h)

    def leftovers(self) -> list[str]:
        return leftovers(self.run_id)


# ----------------------------------------------------------------------------- inside hosts

def _init_main(name, hosts_file, ready, run_id):
    """PID 1 of a host: private /dev/shm, its own name, then reap orphans until killed."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", f"{run_id}-shm", "/dev/shm"],
                   check=True, timeout=STEP_TIMEOUT)
    subprocess.run(["mount", "--bind", hosts_file, "/etc/hosts"], check=True,
                   timeout=STEP_TIMEOUT)
    socket.sethostname(name)
    with open(ready, "w") as f:
        f.write(str(os.getpid()))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        try:
            os.wait()
        except ChildProcessError:
            time.sleep(0.2)


def _run_in_group(fn, rank, args, backend, pg_timeout):
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    torch.set_num_threads(1)
    if "hoccl" in backend:
        import hoccl_backend  # noqa: F401  (registers "hoccl")
    dist.init_process_group(backend, timeout=timedelta(seconds=pg_timeout))
    value = fn(rank, int(os.environ["WORLD_SIZE"]), *args)
    if dist.is_initialized():
        dist.destroy_process_group()
    return value


def _worker_main(spec):
    """One rank under torchrun: run the job's function, leave the outcome for the harness."""
    rank = int(os.environ["RANK"])
    record = {"rank": rank, "host": int(os.environ[HOST_ENV])}
    try:
        with open(spec, "rb") as f:
            fn, args, backend, pg_timeout = pickle.load(f)
        if backend is None:  # torch is not imported for jobs that do not need it
            value = fn(rank, int(os.environ["WORLD_SIZE"]), *args)
        else:
            value = _run_in_group(fn, rank, args, backend, pg_timeout)
        record.update(status="ok", value=value)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the test
        record.update(status="error", text=f"{type(exc).__name__}: {exc}\n"
                                           f"{traceback.format_exc()}")
    # Exit 0 even after an error: torchrun would otherwise kill this host's other ranks before
    # they report their own errors.
    out = os.path.join(os.environ[JOB_ENV], f"rank{rank}.pkl")
    with open(out + ".tmp", "wb") as f:
        pickle.dump(record, f)
    os.replace(out + ".tmp", out)
    # The result is out: what is left is the interpreter's teardown of torch, ~1 s for a host's
    # ranks on the 2-core VM, once per job. Skip it, as multiprocessing's forked workers do.
    # hoccl must not need it to clean up (a killed rank gets none either), so the checks for
    # leftovers only get stricter.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "--init":
        _init_main(*sys.argv[2:6])
    elif sys.argv[1] == "--worker":
        _worker_main(sys.argv[2])
    else:
        sys.exit(f"usage: {sys.argv[0]} --init NAME HOSTS_FILE READY RUN_ID | --worker SPEC")
