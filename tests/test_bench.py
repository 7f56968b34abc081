"""The collective benchmark runs end to end (the torch backends in the same ranks; Open MPI in its
own, taking turns with them) and its figures are self-consistent. It asserts nothing about speed: figures are for people to read."""
import contextlib
import glob
import io
import json
import subprocess
import sys

import pytest

from hoccl_backend.bench import OPS, bus_factor


def test_bench_rows_cover_every_op_backend_and_size(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "hoccl_backend.bench", "--world", "2", "--sizes", "8,4K",
                           "--rounds", "2", "--no-progress", "--thp", "--shared-buffers", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "busbw x gloo" in proc.stdout
    assert "(THP_MEM_ALLOC_ENABLE): on" in proc.stdout
    result = json.loads(out.read_text())
    assert result["thp"] is True
    assert "buffers: hoccl_backend.empty (shared)" in proc.stdout and result["shared_buffers"] is True
    rows = result["rows"]
    keys = {(r["backend"], r["op"], r["bytes"]) for r in rows}
    # 8 bytes rounds up to one float32 per rank for the sharded ops (2 ranks -> 8 bytes).
    assert keys == {(b, op, n) for b in ("hoccl", "gloo") for op in OPS for n in (8, 4096)}
    for r in rows:
        assert r["world"] == 2 and r["rounds"] == 2 and r["time_us"] > 0
        algbw = r["bytes"] / (r["time_us"] * 1e-6) / 1e9
        assert abs(r["algbw_GBps"] - algbw) <= 1e-9 * max(1.0, algbw)
        assert abs(r["busbw_GBps"] - algbw * bus_factor(r["op"], 2)) <= 1e-9 * max(1.0, algbw)


def test_bench_vs_mpi_puts_open_mpi_and_torch_floor_beside_hoccl(tmp_path):
    from hoccl_backend import bench_mpi

    try:
        bench_mpi.ensure_open_mpi()  # apt-get install, as the benchmark itself does
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"Open MPI cannot be installed here: {e}")
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "hoccl_backend.bench", "--vs", "mpi,gloo", "--world", "2",
                           "--sizes", "4K,64K", "--rounds", "2", "--no-progress", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = proc.stdout.split("\n# ")[1:]
    assert [t.split()[0] for t in tables] == OPS
    for table in tables:
        head, *lines = table.strip().splitlines()
        assert "torch floor per cell" in head and "world=2" in head
        assert [c.split()[0] for c in lines[0].split("|")] == ["bytes", "hoccl", "gloo", "mpi", "mpi+floor",
                                                               "busbw", "hoccl", "hoccl"]
        assert [int(line.split("|")[0]) for line in lines[1:]] == [4096, 65536]
        for line in lines[1:]:
            assert len(line.split("|")) == 8 and all(c.strip() for c in line.split("|"))
    result = json.loads(out.read_text())
    assert result["peers"] == ["mpi", "gloo"]
    rows = result["rows"]
    # torch's floor: one row per cell, measured in turn with that cell's backends.
    floor = {tuple(r["floor_for"][1:]): r for r in rows if r["backend"] == bench_mpi.FLOOR}
    assert set(floor) == {(op, n) for op in OPS for n in (4096, 65536)}
    for r in floor.values():
        assert r["floor_for"][0] == 2 and r["bytes"] == 8 and r["rounds"] == 2 and r["time_us"] > 0
    timed = [r for r in rows if r["backend"] != bench_mpi.FLOOR]
    assert {(r["backend"], r["op"], r["bytes"]) for r in timed} == {
        (b, op, n) for b in ("hoccl", "gloo", "mpi") for op in OPS for n in (4096, 65536)}
    for r in timed:
        assert r["world"] == 2 and r["rounds"] == 2 and r["stat"] == "best"
        assert 0 < r["time_us"] <= r["median_us"]
        assert abs(r["busbw_GBps"] - r["bytes"] / (r["time_us"] * 1e-6) / 1e9 * bus_factor(r["op"], 2)) <= 1e-9 * max(
            1.0, r["busbw_GBps"])
    # The table's target column is MPI's time plus the floor measured in the same cell.
    mpi = {(r["op"], r["bytes"]): r["time_us"] for r in timed if r["backend"] == "mpi"}
    hoccl = {(r["op"], r["bytes"]): r["time_us"] for r in timed if r["backend"] == "hoccl"}
    for table in tables:
        op = table.split()[0]
        for line in table.strip().splitlines()[2:]:
            cells = line.split("|")
            cell = (op, int(cells[0]))
            assert abs(float(cells[4]) - (mpi[cell] + floor[cell]["time_us"])) < 0.11
    # The markdown form (--markdown) of the same rows: per op, hoccl, MPI and gloo rows and the ratio.
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        bench_mpi.print_markdown(rows)
    lines = text.getvalue().splitlines()
    assert "| op | | 4 KB | 64 KB |" in lines
    for op in OPS:
        i = next(k for k, line in enumerate(lines) if line.startswith(f"| {op} | hoccl |"))
        assert [line.split("|")[2].strip() for line in lines[i:i + 4]] == ["hoccl", "MPI", "gloo", "hoccl ÷ (MPI + floor)"]
        ratio = float(lines[i + 3].split("|")[3])
        assert abs(ratio - hoccl[(op, 4096)] / (mpi[(op, 4096)] + floor[(op, 4096)]["time_us"])) < 0.006


def test_bench_busy_times_hoccl_beside_gloo_and_beside_its_own_idle_time(tmp_path):
    from hoccl_backend.bench import IDLE

    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "hoccl_backend.bench", "--busy", "1", "--world", "2", "--ops",
                           "all_reduce", "--sizes", "4K,64K", "--rounds", "2", "--no-progress", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "# busy: 1 compute thread(s) per rank" in proc.stdout and "GFLOP/s per thread" in proc.stdout
    table = proc.stdout.split("\n# all_reduce  world=2\n")[1]
    head, *lines = table.strip().splitlines()
    assert [c.split(" us")[0].strip() for c in head.split("|")[1:4]] == ["hoccl", "gloo", IDLE]
    assert "busbw x gloo" in head and "busy / idle" in head and "median call b/i" in head
    assert [int(line.split("|")[0]) for line in lines] == [4096, 65536]
    result = json.loads(out.read_text())
    assert result["busy"] == 1
    rows = {(r["backend"], r["bytes"]): r for r in result["rows"]}
    assert set(rows) == {(b, n) for b in ("hoccl", "gloo", IDLE) for n in (4096, 65536)}
    for line in lines:
        cells = line.split("|")
        n = int(cells[0])
        # The busy / idle column is hoccl's busy time over its idle time, from the same rows.
        assert abs(float(cells[5].rstrip("x ")) - rows[("hoccl", n)]["time_us"] / rows[(IDLE, n)]["time_us"]) < 0.006
        # The median-call column is hoccl's median call busy over idle, from the same rows.
        ratio = rows[("hoccl", n)]["median_call_us"] / rows[(IDLE, n)]["median_call_us"]
        assert abs(float(cells[6].rstrip("x ")) - ratio) < 0.006
    assert all(r["busy_threads"] == (0 if r["backend"] == IDLE else 1) for r in result["rows"])
    assert all(r["compute_gflops_per_thread"] > 0 for r in result["rows"])
    assert all(r["median_call_us"] > 0 for r in result["rows"])


@pytest.mark.parametrize("args,message", [(["--busy", "-1"], "--busy takes a number"),
                                          (["--busy", "1", "--hosts", "2"], "--busy runs with")])
def test_bench_busy_rejects_bad_arguments(args, message):
    proc = subprocess.run([sys.executable, "-m", "hoccl_backend.bench", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]


def test_bench_vs_deepspeed_puts_its_shm_all_reduce_beside_hoccl_and_the_direct_op():
    """The table's shape and every column's presence (DeepSpeed optional: skipped, saying why)."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (scripts/install.sh "
                        "installs it where it installs without a GPU)")
    leftovers = sorted(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*"))  # other jobs'
    proc = subprocess.run([sys.executable, "-m", "hoccl_backend.bench", "--vs", "deepspeed",
                           "--world", "2", "--sizes", "4K", "--dtypes", "fp32", "--rounds", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("dtype"))
    for col in ("hoccl", "hoccl direct", "deepspeed", "torch floor", "gloo", "direct<=ds"):
        assert col in lines[head], lines[head]
    cells = lines[head + 1].split()
    assert cells[:2] == ["fp32", "4096"]
    assert all(float(c) > 0 for c in cells[2:7]), cells
    assert sorted(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*")) == leftovers, \
        "the benchmark left DeepSpeed's shared-memory buffers behind"


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())


def test_bench_vs_deepspeed_bf16_runs_on_any_cpu():
    """DeepSpeed's bf16 kernel needs AVX-512BW (a rank dies of SIGILL without it): the bf16 row
    has DeepSpeed's figure where the CPU has it and leaves it out, saying why, where it has not."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (scripts/install.sh installs it)")
    proc = subprocess.run([sys.executable, "-m", "hoccl_backend.bench", "--vs", "deepspeed",
                           "--world", "2", "--sizes", "4K", "--dtypes", "bf16", "--rounds", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("dtype"))
    cells = dict(zip(lines[head].replace("hoccl direct", "hoccl_direct").replace("torch floor", "torch_floor")
                     .split(), lines[head + 1].split()))
    assert (cells["dtype"], cells["bytes"]) == ("bf16", "4096")
    assert float(cells["hoccl"]) > 0 and float(cells["hoccl_direct"]) > 0
    if "avx512bw" in _cpu_flags():
        assert float(cells["deepspeed"]) > 0, lines[head + 1]
    else:
        assert cells["deepspeed"] == "-" and "needs AVX-512BW" in proc.stdout, proc.stdout


def _die_of_sigill():
    import os
    import signal
    os.kill(os.getpid(), signal.SIGILL)


def _wait_forever():
    import time
    time.sleep(600)


def test_bench_vs_deepspeed_names_a_rank_that_dies_at_once():
    """A rank killed by a signal ends the run within seconds, naming the rank and the signal,
    instead of leaving the parent waiting for rows that will never come."""
    import multiprocessing as mp
    import time

    from hoccl_backend.bench_deepspeed import _results
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_wait_forever), ctx.Process(target=_die_of_sigill)]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="rank 1 of the DeepSpeed bench was killed by SIGILL"):
            _results(q, procs, limit_s=60)
        assert time.monotonic() - t0 < 30
    finally:
        for p in procs:
            p.kill()
            p.join()


def test_bench_training_runs_zero2_and_hsdp_on_hoccl_and_gloo():
    """Both training jobs launch on each backend and report a step time per backend and their
    ratio (world 2, one timed step: this checks the command, not the figures)."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (scripts/install.sh installs it)")
    out = subprocess.run([sys.executable, "-m", "hoccl_backend.bench_training", "--world", "2", "--steps", "1",
                          "--warmup", "1", "--rounds", "1"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split("|")[0].strip(): line for line in out.stdout.splitlines() if "|" in line}
    assert set(rows) == {"zero2", "hsdp"}, out.stdout
    for line in rows.values():
        cells = [c.split() for c in line.split("|")[1:3]]
        assert [c[0] for c in cells] == ["hoccl", "gloo"] and all(float(c[1]) > 0 for c in cells), line
        assert "gloo / hoccl" in line, line


@pytest.mark.parametrize("args, message", [(["--jobs", "zero3"], "unknown job"),
                                           (["--jobs", "hsdp", "--world", "3", "--steps", "1"], "even world")])
def test_bench_training_rejects_bad_arguments(args, message):
    out = subprocess.run([sys.executable, "-m", "hoccl_backend.bench_training", *args], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode != 0 and message in out.stderr + out.stdout, out.stderr[-2000:]
