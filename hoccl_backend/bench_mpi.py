"""hoccl beside Open MPI (and optionally gloo), taking turns round by round: `bench --vs mpi`.

Open MPI runs an osu-style C loop (mpi_loop.c beside this file) over malloc'ed buffers reused
between calls, for the same op, element count and world as hoccl's ranks. Both sets of ranks live
for the whole world size; the parent process drives them cell by cell and round by round, so that
while one side runs the other sleeps in a blocking read and both meet the same machine load. Each
side's calls per round are calibrated so that its rounds last about ROUND_SECONDS; a side's figure
is the best over rounds of its slowest rank's mean time per call.

torch's floor is what one torch call costs with no communication at all: `dist.all_reduce` of 8
bytes on a world-1 hoccl group. No torch backend can go under MPI's time plus that floor, which is
the fair target for hoccl at small sizes. It is measured like a backend, in every cell, taking
its turn with the others, on every rank at once (each on its own world-1 group) and reported as
the slowest rank's mean: this machine's speed moves by tens of percent within a minute, and a
floor measured once would compare cells against a different machine.

Open MPI comes from the system's packages (Debian's openmpi-bin and libopenmpi-dev, installed with
apt-get when mpicc or mpirun is missing); the loop is compiled on first use into
$HOCCL_CACHE_DIR (default ~/.cache/hoccl), keyed by its source.
"""
from __future__ import annotations

import hashlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

from hoccl_backend.bench import (_buffers, _run_op, _time_round, backend_columns, backend_columns_head, bus_factor,
                                  copy_fraction, memcpy_bandwidth, parse_size)

MPI_PACKAGES = ["openmpi-bin", "libopenmpi-dev"]
DEFAULT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
LOOP_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi_loop.c")
FLOOR = "torch floor"  # backend name of the floor's row


def cache_dir() -> str:
    d = os.environ.get("HOCCL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "hoccl")
    os.makedirs(d, exist_ok=True)
    return d


def ensure_open_mpi() -> None:
    """Installs Open MPI from the system's packages when mpicc or mpirun is missing."""
    if shutil.which("mpicc") and shutil.which("mpirun"):
        return
    if not shutil.which("apt-get"):
        raise RuntimeError("bench --vs mpi needs Open MPI (mpicc, mpirun) and there is no apt-get to install it")
    sys.stderr.write(f"installing Open MPI: apt-get install -y {' '.join(MPI_PACKAGES)}\n")
    quiet = {"stdout": subprocess.DEVNULL, "env": dict(os.environ, DEBIAN_FRONTEND="noninteractive")}
    subprocess.run(["apt-get", "update"], check=True, **quiet)
    subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *MPI_PACKAGES], check=True, **quiet)
    if not (shutil.which("mpicc") and shutil.which("mpirun")):
        raise RuntimeError(f"installed {MPI_PACKAGES} but mpicc/mpirun are still not on PATH")


def build_loop() -> str:
    """Path of the compiled MPI loop, built with mpicc on first use (per source and compiler)."""
    ensure_open_mpi()
    with open(LOOP_SOURCE, "rb") as f:
        source = f.read()
    version = subprocess.run(["mpicc", "--version"], capture_output=True).stdout
    key = hashlib.sha1(source + version).hexdigest()[:16]
    exe = os.path.join(cache_dir(), f"mpi_loop-{key}")
    if not os.path.exists(exe):
        tmp = f"{exe}.{os.getpid()}.tmp"
        subprocess.run(["mpicc", "-O2", "-o", tmp, LOOP_SOURCE], check=True)
        os.replace(tmp, exe)
    return exe


def mpirun_command(world: int, exe: str, ctl_dir: str) -> tuple[list[str], dict]:
    """mpirun line and environment. Open MPI's default placement (ranks bound to cores while they
    fit, which is its fastest setup on an idle machine; hoccl's ranks are not pinned),
    oversubscription allowed where there are more ranks than cores (Open MPI then yields the CPU
    while it polls), root allowed (containers)."""
    cmd = ["mpirun", "-np", str(world)]
    if world > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    env = dict(os.environ)
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return cmd + [exe, ctl_dir], env


class MpiRanks:
    """A running `mpirun` of the loop, commanded through FIFOs (see mpi_loop.c)."""

    def __init__(self, world: int, timeout: float = 600.0):
        exe = build_loop()
        self.world, self.timeout = world, timeout
        self._dir = tempfile.mkdtemp(prefix="hoccl-mpi-")
        for name in [f"cmd.{r}" for r in range(world)] + ["result"]:
            os.mkfifo(os.path.join(self._dir, name))
        # Read-write: opening never blocks and a read waits for data, not for a writer.
        self._result = os.open(os.path.join(self._dir, "result"), os.O_RDWR)
        self._log = tempfile.TemporaryFile()
        cmd, env = mpirun_command(world, exe, self._dir)
        self._proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self._cmds = [self._open_writer(f"cmd.{r}") for r in range(world)]

    def _failure(self, what: str) -> RuntimeError:
        self._log.seek(0)
        log = self._log.read().decode(errors="replace")[-3000:]
        return RuntimeError(f"Open MPI loop (world {self.world}) {what}; mpirun said:\n{log}")

    def _open_writer(self, name: str) -> int:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return os.open(os.path.join(self._dir, name), os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet: the rank has not started
                if self._proc.poll() is not None:
                    raise self._failure(f"exited with {self._proc.returncode} before opening {name}")
                if time.monotonic() > deadline:
                    raise self._failure(f"did not open {name} within {self.timeout:.0f} s")
                time.sleep(0.01)

    def _command(self, line: str) -> str:
        for fd in self._cmds:
            os.write(fd, (line + "\n").encode())
        answer = b""
        deadline = time.monotonic() + self.timeout
        while not answer.endswith(b"\n"):
            ready, _, _ = select.select([self._result], [], [], 0.5)
            if ready:
                answer += os.read(self._result, 256)
            elif self._proc.poll() is not None:
                raise self._failure(f"exited with {self._proc.returncode} during {line!r}")
            elif time.monotonic() > deadline:
                raise self._failure(f"gave no answer to {line!r} within {self.timeout:.0f} s")
        return answer.decode().strip()

    def cell(self, op: str, count: int, warmup: int) -> None:
        self._command(f"cell {op} {count} {warmup}")

    def round(self, iters: int) -> float:
        return float(self._command(f"run {iters}"))

    def close(self) -> None:
        try:
            for fd in self._cmds:
                os.write(fd, b"quit\n")
            self._proc.wait(timeout=60)
        finally:
            if self._proc.poll() is None:
                self._proc.kill()
                self._proc.wait()
            for fd in self._cmds + [self._result]:
                os.close(fd)
            shutil.rmtree(self._dir, ignore_errors=True)


ROUND_SECONDS = 0.01  # every backend's round lasts about this long


def _iters_per_round(nbytes: int) -> int:
    """Calls of the first round: about 128 MiB moved, between 3 and 400 calls."""
    return int(max(3, min(400, (128 << 20) // max(nbytes, 1))))


def _calibrated(seconds_per_call: float) -> int:
    """Calls that fill ROUND_SECONDS (at least 3). Equal-length rounds meet the same share of
    preemptions by other processes: with a fixed count, MPI's 0.5 us calls would fill rounds of
    0.2 ms that a busy machine rarely interrupts, beside hoccl's rounds of several ms."""
    return int(max(3, min(100_000, ROUND_SECONDS / max(seconds_per_call, 1e-9))))


def _floor_round(x, group, iters: int) -> float:
    """Seconds per call of torch's floor: an 8-byte all_reduce on this rank's world-1 group."""
    import torch.distributed as dist

    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x, group=group)
    return (time.perf_counter() - start) / iters


def _torch_rank(rank, world, backends, port, conn, shared, busy=0):
    """One torch rank, a group per backend plus world-1 hoccl groups, serving the parent's commands:
    ("cell", op, nbytes, warmup), ("round", backend, iters), ("floor", iters), ("quit",)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    import hoccl_backend  # noqa: F401
    from hoccl_backend.bench_busy import ComputeThreads

    torch.set_num_threads(1)
    dist.init_process_group(backends[0], rank=rank, world_size=world)
    # --busy: they keep running while Open MPI takes its turn, so its ranks meet the same compute.
    compute = ComputeThreads(busy)
    groups = {b: dist.group.WORLD if i == 0 else dist.new_group(backend=b) for i, b in enumerate(backends)}
    alone = [dist.new_group([r], backend="hoccl") for r in range(world)][rank]
    floor_x = torch.ones(2)  # 8 bytes
    bufs, op = {}, None
    while True:
        msg = conn.recv()
        if msg[0] == "cell":
            _, op, nbytes, warmup = msg
            bufs = {b: _buffers(op, nbytes, world, shared) for b in backends}
            for b in backends:
                for _ in range(warmup):
                    _run_op(op, bufs[b], groups[b])
            x = bufs[backends[0]]
            conn.send(x["out"].numel() if op == "all_gather" else x["x"].numel())
        elif msg[0] == "round":
            _, b, iters = msg
            conn.send(_time_round(op, bufs[b], groups[b], iters))
        elif msg[0] == "floor":
            conn.send(_floor_round(floor_x, alone, msg[1]))
        else:
            break
    compute.close()
    dist.destroy_process_group()
    conn.send("done")


class TorchRanks:
    def __init__(self, world: int, backends: list[str], shared: bool, busy: int = 0):
        import multiprocessing as mp
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        self._conns, self._procs = [], []
        for r in range(world):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_torch_rank, args=(r, world, backends, port, theirs, shared, busy))
            p.start()
            self._conns.append(mine)
            self._procs.append(p)

    def ask(self, *msg) -> list:
        for c in self._conns:
            c.send(msg)
        return [c.recv() for c in self._conns]

    def close(self) -> None:
        for c in self._conns:
            c.send(("quit",))
        for c in self._conns:
            c.recv()
        for p in self._procs:
            p.join()


def _row(backend, world, op, nbytes, samples, iters):
    return {"backend": backend, "world": world, "op": op, "bytes": nbytes, "time_us": min(samples) * 1e6,
            "median_us": sorted(samples)[len(samples) // 2] * 1e6, "stat": "best", "rounds": len(samples),
            "iters_per_round": iters}


def run_world(torch_backends: list[str], world: int, ops, sizes, rounds: int = 5, show_progress=True,
              shared=False, busy=0) -> list[dict]:
    """Rows for every (backend, op, size) at this world size, MPI's under backend "mpi", and per
    cell a row for torch's floor measured in turn with them (backend FLOOR, op all_reduce, 8 bytes,
    world 1; `floor_for` = (world, op, size) of its cell)."""
    torch_ranks = TorchRanks(world, torch_backends, shared, busy)
    mpi = MpiRanks(world)
    rows = []
    try:
        torch_ranks.ask("floor", 400)  # warm-up
        names = torch_backends + ["mpi", FLOOR]
        total, done = len(ops) * len(sizes), 0
        for op in ops:
            for nbytes in sizes:
                iters = _iters_per_round(nbytes)
                warmup = max(2, iters // 2)
                count = torch_ranks.ask("cell", op, nbytes, warmup)[0]
                mpi.cell(op, count, warmup)
                def timed(b, n):
                    if b == FLOOR:
                        return max(torch_ranks.ask("floor", n))
                    return mpi.round(n) if b == "mpi" else max(torch_ranks.ask("round", b, n))

                calls = {b: _calibrated(timed(b, iters)) for b in names}
                samples = {b: [] for b in names}
                for r in range(rounds):
                    for b in names if r % 2 == 0 else names[::-1]:
                        samples[b].append(timed(b, calls[b]))
                rows += [_row(b, world, op, count * 4, samples[b], calls[b]) for b in names if b != FLOOR]
                rows.append(dict(_row(FLOOR, 1, "all_reduce", 8, samples[FLOOR], calls[FLOOR]),
                                 floor_for=[world, op, count * 4]))
                done += 1
                if show_progress:
                    bar = "#" * int(30 * done / total)
                    sys.stderr.write(f"\r  world={world} [{bar:<30s}] {done}/{total} {op} {nbytes}B   ")
                    sys.stderr.flush()
        if show_progress:
            sys.stderr.write("\n")
    finally:
        mpi.close()
        torch_ranks.close()
    for row in rows:
        row["algbw_GBps"] = row["bytes"] / (row["time_us"] * 1e-6) / 1e9
        row["busbw_GBps"] = row["algbw_GBps"] * bus_factor(row["op"], row["world"])
    return rows


def floor_us(rows: list[dict], world: int, op: str, nbytes: int) -> float:
    """torch's floor measured in turn with this cell's backends."""
    return next(r["time_us"] for r in rows if r["backend"] == FLOOR and r.get("floor_for") == [world, op, nbytes])


def floor_range(rows: list[dict], world: int) -> str:
    """The floors of one world size's cells, as "lo-hi"."""
    floors = [r["time_us"] for r in rows if r["backend"] == FLOOR and r["floor_for"][0] == world]
    return f"{min(floors):.1f}-{max(floors):.1f}" if floors else "?"


def print_table(rows: list[dict], memcpy_GBps: float) -> None:
    keyed = {(r["backend"], r["world"], r["op"], r["bytes"]): r for r in rows if r["backend"] != FLOOR}
    backends = [b for b in ("hoccl", "gloo", "mpi") if any(r["backend"] == b for r in rows)]
    ops = list(dict.fromkeys(r["op"] for r in rows if r["backend"] != FLOOR))
    for world in sorted({r["world"] for r in rows if r["backend"] != FLOOR}):
        for op in ops:
            print(f"\n# {op}  world={world}  (best of rounds; torch floor per cell, {floor_range(rows, world)} us)")
            head = backend_columns_head(backends)
            head += f" | {'mpi+floor us':>12s} | busbw x mpi | hoccl / (mpi+floor) | hoccl copy%"
            print(head)
            for nbytes in sorted({r["bytes"] for r in rows if r["world"] == world and r["op"] == op}):
                line = backend_columns(keyed, backends, world, op, nbytes)
                h, m = keyed.get(("hoccl", world, op, nbytes)), keyed.get(("mpi", world, op, nbytes))
                if h and m:
                    target = m["time_us"] + floor_us(rows, world, op, nbytes)
                    line += (f" | {target:12.1f} | {m['time_us'] / h['time_us']:10.2f}x"
                             f" | {h['time_us'] / target:18.2f}x | {100 * copy_fraction(h, memcpy_GBps):10.0f}%")
                print(line)


def main(args, peers: list[str], worlds: list[int], ops: list[str]) -> dict:
    """Runs the comparison for bench's parsed arguments; returns what --json writes."""
    torch_backends = ["hoccl"] + [p for p in peers if p != "mpi"]
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    rows = []
    before = memcpy_bandwidth()
    for world in worlds:
        rows += run_world(torch_backends, world, ops, sizes, args.rounds,
                          show_progress=not args.no_progress, shared=args.shared_buffers,
                          busy=getattr(args, "busy", 0))
    after = memcpy_bandwidth()
    mc = (before + after) / 2
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    mpi_version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()
    print(f"# machine: {os.cpu_count()} cores; single-core memcpy {mc:.2f} GB/s (before {before:.2f}, "
          f"after {after:.2f}); load average {load}; {mpi_version[0] if mpi_version else 'Open MPI'}; "
          f"buffers: {'hoccl_backend.empty (shared)' if args.shared_buffers else 'torch.empty'} / malloc (MPI)")
    if getattr(args, "busy", 0):
        print(f"# busy: {args.busy} compute thread(s) per torch rank (256x256 float32 GEMM loops), running "
              f"through every backend's turn, Open MPI's included")
    print_table(rows, mc)
    return {"busy": getattr(args, "busy", 0), "memcpy_GBps": mc, "memcpy_before_after_GBps": [before, after], "peers": peers,
            "shared_buffers": args.shared_buffers, "rows": rows}


def print_markdown(rows: list[dict]) -> None:
    """The comparison as markdown, one table per world size: a column per size, and per op the rows
    hoccl, MPI (gloo where measured) and hoccl ÷ (MPI + torch's floor), below 1 where hoccl meets
    the target."""
    keyed = {(r["backend"], r["world"], r["op"], r["bytes"]): r for r in rows if r["backend"] != FLOOR}
    peers = [b for b in ("mpi", "gloo") if any(r["backend"] == b for r in rows)]
    label = {"mpi": "MPI", "gloo": "gloo"}
    for world in sorted({r["world"] for r in rows if r["backend"] != FLOOR}):
        sizes = sorted({r["bytes"] for r in rows if r["world"] == world and r["backend"] != FLOOR})
        print(f"\n**world {world}** (best of rounds, µs per call; torch floor {floor_range(rows, world)} µs, "
              "measured in every cell)\n")
        print("| op | | " + " | ".join(_size_label(n) for n in sizes) + " |")
        print("|---|---|" + "---:|" * len(sizes))
        for op in dict.fromkeys(r["op"] for r in rows if r["backend"] != FLOOR):
            def cells(fn):
                return " | ".join(fn(n) for n in sizes)

            def time_of(b):
                return lambda n: f"{keyed[(b, world, op, n)]['time_us']:.1f}" if (b, world, op, n) in keyed else ""

            def ratio(n):
                h, m = keyed.get(("hoccl", world, op, n)), keyed.get(("mpi", world, op, n))
                return f"{h['time_us'] / (m['time_us'] + floor_us(rows, world, op, n)):.2f}" if h and m else ""

            print(f"| {op} | hoccl | {cells(time_of('hoccl'))} |")
            for b in peers:
                print(f"| | {label[b]} | {cells(time_of(b))} |")
            print(f"| | hoccl ÷ (MPI + floor) | {cells(ratio)} |")


def _size_label(nbytes: int) -> str:
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"
