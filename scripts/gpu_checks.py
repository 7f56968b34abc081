#!/usr/bin/env python3
"""GPU-machine checks of the cuda-ce transport, run by scripts/gpu_check.sh.

    python3 scripts/gpu_checks.py probe                   # what the runtime allows, item by item
    python3 scripts/gpu_checks.py sm_free   [--device 0]  # copies finish while a kernel fills every SM
    python3 scripts/gpu_checks.py profile   [--world 2]   # zero kernels in the torch profiler
    python3 scripts/gpu_checks.py bandwidth [--world 2] [--paths host,p2p]  # vs the same copies, raw
    python3 scripts/gpu_checks.py machine                 # commit, machine, driver, torch (the log header)

`probe` needs no CUDA build of torch: it drives hoccl's own driver table (raw-pointer hooks), so
it runs against the CPU driver model too (HOCCL_LIBCUDA). Each item runs in 2 real processes under
a host-side deadline and reports OK, or the failing call with its CUresult name:
  register    cuMemHostRegister (device-mapped) of a /dev/shm mapping in every process
  stream_flag a cuStreamWriteValue32 in one process releasing a cuStreamWaitValue32 in another
              (host-path collectives: their barrier flags live in that shared memory)
  ipc_copy    cuIpcGetMemHandle / cuIpcOpenMemHandle and a copy through the mapping (p2p path)

`sm_free` also needs no CUDA build of torch (and runs on the driver model). It proves what the
profiler cannot: a same-device D2D copy that the driver runs as a kernel still shows as "Memcpy
DtoD", not as a kernel. It launches hoccl_spin_until_flag with enough blocks to take every thread
slot of every SM, waits until all of them report running, then issues each copy the transport
makes (through its own functions) on another stream and polls an event behind it: a copy that
completes while every SM is held ran on a copy engine. It prints one row per direction and exits
1 if a direction the chosen path uses (HOCCL_CE_PATH, auto by default: host d2h+h2d between ranks
on one GPU; p2p d2d, including the own-block copy of p2p collectives across GPUs) needed SMs, if
the SMs could not be filled, or on any CUDA error; 3 without a driver.

Collectives go through torch.distributed (backend "hoccl") when the core accepts CUDA tensors,
else through the cuda-ce reference collectives (_C _CeGroup: all_gather, all_to_all,
broadcast, all_reduce), and the
output says which. Ranks print each verdict line (flushed) the moment it is known, so a check cut
short by its stage's limit keeps the lines it had; the spawned ranks get the stage's limit
(HOCCL_STAGE_LIMIT_S, set by gpu_check.sh) minus a margin. Exit status 0 only if every check passed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

UNROUTED = "moves CPU tensors only"
STAMP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu_check_commit.txt")


def say(lines: list, line: str) -> None:
    """Prints one verdict line now (a later hang must not lose it) and keeps it for the caller."""
    print(line, flush=True)
    lines.append(line)


def ranks_timeout(fallback: float) -> float:
    """Seconds the spawned ranks may take: the stage's limit less 5 s for reporting, else fallback."""
    limit = os.environ.get("HOCCL_STAGE_LIMIT_S")
    return max(5.0, float(limit) - 5.0) if limit else fallback
ZERO_SM_OPS = ("all_gather", "all_to_all", "broadcast")


def _ops(rank, world, dev, nbytes):
    """name -> zero-argument callable running one collective on CUDA tensors, and the route used."""
    import torch
    import torch.distributed as dist

    from hoccl_backend.compat import all_gather_single
    n = max(1, nbytes // 4)
    inp = torch.ones(n, device=dev)
    out = torch.empty(world * n, device=dev)
    a2a_in = torch.ones(world * n, device=dev)
    red = torch.ones(n, device=dev)
    try:
        all_gather_single(out, inp)
        torch.cuda.synchronize()
        return {
            "all_gather": lambda: all_gather_single(out, inp),
            "all_to_all": lambda: dist.all_to_all_single(out, a2a_in),
            "broadcast": lambda: dist.broadcast(inp, src=0),
            "all_reduce": lambda: dist.all_reduce(red),
        }, "torch.distributed hoccl", (out, inp)
    except RuntimeError as e:
        if UNROUTED not in str(e):
            raise
    from hoccl_backend import cuda_ext

    g = cuda_ext.cuda_module()._CeGroup(dist.distributed_c10d._get_default_store(), "gpu_checks", rank, world,
                                        dev.index, 0)
    s = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731
    a2a_out = torch.empty(world * n, device=dev)
    return {
        "all_gather": lambda: g.all_gather(out, inp, s()),
        "all_to_all": lambda: g.all_to_all(a2a_out, a2a_in, s()),
        "broadcast": lambda: g.broadcast(inp, 0, s()),
        "all_reduce": lambda: g.all_reduce(red, "sum", 1.0, s()),
    }, "cuda-ce reference _CeGroup (core not routing CUDA yet) paths " + g.paths(), (out, inp)


def _kernels_in(prof):
    """(name, grid) of every GPU kernel in a profile, from its Chrome trace."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    kernels, copies = [], []
    for ev in trace.get("traceEvents", []):
        cat = str(ev.get("cat", "")).lower()
        if cat == "kernel":
            kernels.append((ev.get("name"), ev.get("args", {}).get("grid")))
        elif cat == "gpu_memcpy":
            copies.append(ev.get("name"))
    return kernels, copies


def _rank_profile(rank, world):
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from hoccl_backend import cuda_ext

    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    ops, route, _ = _ops(rank, world, dev, 8 << 20)
    max_ctas = int(os.environ.get("HOCCL_REDUCE_CTAS", "4"))
    lines = []
    say(lines, f"rank {rank}: route: {route}; reduce: {cuda_ext.cuda_module().reduce_kernel_info()}")
    ok = True
    for name, fn in ops.items():
        fn()  # warm-up: registration, module load
        torch.cuda.synchronize()
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        kernels, copies = _kernels_in(prof)
        if name in ZERO_SM_OPS:
            good = not kernels
            why = "no kernel" if good else f"kernels launched: {sorted(set(k for k, _ in kernels))}"
        else:
            bad = [(k, g) for k, g in kernels
                   if not str(k).startswith("hoccl_reduce_") or (g and int(g[0]) > max_ctas)]
            good = not bad
            why = (f"only hoccl_reduce_* with grid <= {max_ctas}: {sorted(set((k, str(g)) for k, g in kernels))}"
                   if good else f"unexpected kernels: {bad}")
        same_dev_d2d = [c for c in set(copies) if "DtoD" in str(c)]
        note = f"; memcpys {sorted(set(map(str, copies)))}"
        if same_dev_d2d:
            note += " (DtoD on one device may run on SMs whatever the profiler says: see sm_free)"
        say(lines, f"rank {rank}: {'PASS' if good else 'FAIL'} {name}: {why}{note}")
        ok = ok and good
    return ok, lines


def _rank_bandwidth(rank, world, mbytes):
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    nbytes = int(mbytes * (1 << 20))
    ops, route, (out, inp) = _ops(rank, world, dev, nbytes)
    path = os.environ.get("HOCCL_CE_PATH", "auto")
    iters = 5

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        dist.barrier()  # CPU barrier: ranks start together (they share the GPU)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / 1e3 / iters

    blocks = out.view(world, -1)
    if path == "host":
        bounce = torch.empty(inp.numel(), dtype=inp.dtype, pin_memory=True)
        slot = torch.empty(inp.numel(), dtype=inp.dtype, pin_memory=True)

        def raw():  # the host plan's copies, without its barriers: the own block D2H + H2D through
            bounce.copy_(inp, non_blocking=True)  # the bounce buffer, one D2H into the staging
            blocks[rank].copy_(bounce, non_blocking=True)  # slot, and an H2D per peer out of
            slot.copy_(inp, non_blocking=True)  # a slot (here: the own one)
            for r in range(world):
                if r != rank:
                    blocks[r].copy_(slot, non_blocking=True)
    else:
        def raw():  # the p2p plan's copies: world D2D of one block
            for r in range(world):
                blocks[r].copy_(inp, non_blocking=True)

    t_hoccl = timed(ops["all_gather"])
    t_raw = timed(raw)
    ratio = t_raw / t_hoccl
    gbps = world * nbytes / t_hoccl / 1e9
    good = ratio >= 0.9
    lines = []
    say(lines, f"rank {rank}: {'PASS' if good else 'FAIL'} all_gather path={path} {mbytes:g} MiB/rank: "
               f"hoccl {t_hoccl * 1e3:.2f} ms ({gbps:.1f} GB/s into out), the same copies raw (cudaMemcpyAsync) "
               f"{t_raw * 1e3:.2f} ms, ratio {ratio:.2f} (floor 0.90); route {route}")
    return good, lines


def _probe_item(name, fn):
    import time

    t0 = time.monotonic()
    try:
        detail = fn()
        return f"OK   {name} ({(time.monotonic() - t0) * 1e3:.0f} ms){': ' + detail if detail else ''}"
    except Exception as e:  # noqa: BLE001 - every failure is a result to report
        return f"FAIL {name} ({(time.monotonic() - t0) * 1e3:.0f} ms): {type(e).__name__}: {e}"


def _rank_probe(rank, world, deadline_s):
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from cuda_test_utils import RawDevice
    from hoccl_backend import cuda_ext

    m = cuda_ext.cuda_module()
    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=timedelta(seconds=deadline_s))
    timeout_ms = int(deadline_s * 1000)
    dev = RawDevice()
    groups = {}

    def register():
        groups["host"] = m._CeGroup(store, "probe_host", rank, world, 0, 1 << 20, reduce_on="host", path="host",
                                    timeout_ms=timeout_ms)
        return "shared staging and flag regions page-locked and device-mapped"

    def gather(path):
        n = 1 << 18
        x = dev.put(torch.full((n,), float(rank + 1)))
        out = dev.alloc(world * n * 4)
        g = groups[path]
        g.all_gather_raw(out, x, n * 4, dev.stream)
        g.synchronize(deadline_s)  # host-side deadline: reports unsatisfied flags instead of hanging
        got = dev.get(out, world * n, torch.float32)
        want = torch.cat([torch.full((n,), float(r + 1)) for r in range(world)])
        if not torch.equal(got, want):
            raise AssertionError("wrong data after the collective")
        return g.paths()

    def ipc():
        groups["p2p"] = m._CeGroup(store, "probe_p2p", rank, world, 0, 1 << 20, reduce_on="host", path="p2p",
                                   timeout_ms=timeout_ms)
        return gather("p2p")

    lines = []
    say(lines, f"rank {rank}: driver {m.cuda_driver_status()}")
    say(lines, f"rank {rank}: " + _probe_item("register", register))
    if "host" in groups:
        say(lines, f"rank {rank}: " + _probe_item("stream_flag", lambda: gather("host")))
    say(lines, f"rank {rank}: " + _probe_item("ipc_copy", ipc))
    return all(ln.split(": ", 1)[1].startswith("OK") for ln in lines[1:]), lines


def probe(deadline_s: float) -> int:
    from dist_utils import run_ranks
    from hoccl_backend import cuda_ext

    err = cuda_ext.cuda_module().cuda_driver_error()  # the first CUDA call: dlopen + cuInit
    if err:
        print(f"FAIL driver: {err}")
        return 3
    res = run_ranks(_rank_probe, 2, deadline_s, backend=None, timeout=ranks_timeout(deadline_s * 4 + 30))
    return _verdict("probe", res)


def _verdict(check: str, res) -> int:
    """The ranks printed their lines as they went; this is the one line for the whole check."""
    ok = all(good for good, _ in res)
    print(f"{'PASS' if ok else 'FAIL'} {check}: {sum(good for good, _ in res)}/{len(res)} ranks passed", flush=True)
    return 0 if ok else 1


# The copies each path issues, by sm_check direction. p2p's D2D into another GPU's buffer is not
# measured here (one device); its own-block copy is the same-device d2d.
PATH_DIRECTIONS = {"host": ("d2h", "h2d"), "p2p": ("d2d",)}


def _paths_in_use(m, rep) -> set[str]:
    """The paths HOCCL_CE_PATH picks for ranks on this GPU, and for ranks on a peer GPU if any."""
    mode = os.environ.get("HOCCL_CE_PATH", "") or "auto"
    paths = {m.ce_choose_path(mode, True, False, rep["driver_version"])}
    if rep["peer_access"]:
        paths.add(m.ce_choose_path(mode, False, True, rep["driver_version"]))
    return paths


def _sm_free_table(rep) -> list[str]:
    lines = [f"sm_free: device {rep['device']}, driver {rep['driver_version']}, {rep['sms']} SMs x "
             f"{rep['blocks_per_sm']} blocks x {rep['threads_per_block']} threads ({rep['max_threads_per_sm']} "
             f"thread slots per SM; {rep['occupancy_source'] or '?'}): {rep['blocks_resident']}/{rep['blocks']} "
             f"blocks resident, SMs full: {'yes' if rep['sms_full'] else 'NO'}, "
             f"blocks timed out: {rep['blocks_timed_out']}"]
    lines.append(f"{'direction':<11} {'used by':<7} {'call':<19} {'bytes':>10} {'while SMs full':<14} "
                 f"{'us':>10}  error")
    for r in rep["rows"]:
        us = f"{r['microseconds']:.0f}" if r["microseconds"] >= 0 else "never"
        verdict = "yes" if r["completed_while_sms_full"] else ("no (needed SMs)" if r["completed"] else "no")
        lines.append(f"{r['direction']:<11} {r['used_by'] or '-':<7} {r['call'] or '-':<19} {r['bytes']:>10} "
                     f"{verdict:<14} {us:>10}  {r['error']}")
    lines += [f"error: {e}" for e in rep["errors"]]
    return lines


def sm_free(device: int, mbytes: float, start_s: float, copy_s: float, json_path: str | None) -> int:
    from hoccl_backend import cuda_ext

    m = cuda_ext.cuda_module()
    err = m.cuda_driver_error()  # the first CUDA call: dlopen + cuInit
    if err:
        print(f"FAIL driver: {err}")
        return 3
    rep = m.sm_check(device, int(mbytes * (1 << 20)), start_s, copy_s, 5.0)
    print("\n".join(_sm_free_table(rep)))
    rows = {r["direction"]: r for r in rep["rows"]}
    paths = _paths_in_use(m, rep)
    needed = sorted({d for p in paths for d in PATH_DIRECTIONS[p]})
    bad = [d for d in needed if d not in rows or not rows[d]["completed_while_sms_full"]]
    ok = rep["sms_full"] and not rep["errors"] and not bad
    print(f"{'PASS' if ok else 'FAIL'} sm_free: paths in use {sorted(paths)} (HOCCL_CE_PATH="
          f"{os.environ.get('HOCCL_CE_PATH', '') or 'auto'}) issue {needed}; "
          + (f"needed SMs or failed: {bad}" if bad else "all completed while every SM was held"))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(rep, paths=sorted(paths), needed=needed, ok=ok), f, indent=1)
    return 0 if ok else 1


def _commit() -> str:
    """The commit under test: HOCCL_COMMIT, else git, else (the copy sent to the GPU machine has
    no .git) the stamp `gpu_check.sh --stamp` wrote before sending."""
    import subprocess

    if os.environ.get("HOCCL_COMMIT"):
        return os.environ["HOCCL_COMMIT"] + " (HOCCL_COMMIT)"
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                           cwd=os.path.dirname(STAMP))
        if r.returncode == 0:
            return r.stdout.strip() + " (git)"
    except (OSError, subprocess.SubprocessError):
        pass
    if os.path.exists(STAMP):
        with open(STAMP) as f:
            return "; ".join(f.read().split("\n")).strip("; ") + " (stamp)"
    return "UNKNOWN: run `bash scripts/gpu_check.sh --stamp` before sending, or set HOCCL_COMMIT"


def _command(cmd: list[str]) -> str:
    import subprocess

    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=8)
        return (r.stdout.strip() or r.stderr.strip()).replace("\n", " | ")
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({type(e).__name__}: {e})"


def machine() -> int:
    """The log's header: what the results belong to. Imports no torch (the gates do)."""
    import importlib.metadata as md
    import platform
    import socket
    import time

    def version(pkg):
        try:
            return md.version(pkg)
        except md.PackageNotFoundError:
            return "absent"

    rows = [
        ("commit", _commit()),
        ("date", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())),
        ("host", socket.gethostname()),
        ("nproc", f"{len(os.sched_getaffinity(0))} usable of {os.cpu_count()}"),
        ("kernel (uname -r)", platform.release()),
        ("gpu, driver", _command(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode",
                                  "--format=csv,noheader"])),
        ("nvcc", _command(["nvcc", "--version"]).split(" | ")[-1]),
        ("python", platform.python_version()),
        ("torch", version("torch")),
        ("pytest-timeout", version("pytest-timeout")),
        ("ninja", version("ninja")),
    ]
    rows += [(k, os.environ.get(k, "unset")) for k in ("CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF",
                                                       "PYTORCH_ALLOC_CONF", "HOCCL_LIBCUDA")]
    for k, v in rows:
        print(f"{k}: {v}", flush=True)
    return 0


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("check", choices=["probe", "sm_free", "profile", "bandwidth", "machine"])
    ap.add_argument("--deadline", type=float, default=10.0, help="probe: seconds per wait")
    ap.add_argument("--device", type=int, default=0, help="sm_free: the GPU")
    ap.add_argument("--copy-mbytes", type=float, default=32.0, help="sm_free: MiB per copy")
    ap.add_argument("--start-deadline", type=float, default=5.0, help="sm_free: seconds for the SMs to fill")
    ap.add_argument("--copy-deadline", type=float, default=1.0, help="sm_free: seconds per copy while they are full")
    ap.add_argument("--json", default=None, help="sm_free: also write the report here")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--mbytes", type=float, default=256.0)
    ap.add_argument("--paths", default="", help="bandwidth: HOCCL_CE_PATH values to run in turn (default: as set)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = _parse(argv)
    if args.check == "machine":
        return machine()
    if args.check == "probe":
        return probe(args.deadline)
    if args.check == "sm_free":
        return sm_free(args.device, args.copy_mbytes, args.start_deadline, args.copy_deadline, args.json)
    import torch

    from dist_utils import run_ranks

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device", file=sys.stderr)
        return 2
    if args.check == "profile":
        return _verdict("profile", run_ranks(_rank_profile, args.world, timeout=ranks_timeout(240)))
    paths = [p for p in args.paths.split(",") if p] or [os.environ.get("HOCCL_CE_PATH", "auto")]
    failed = 0
    for p in paths:  # each path in fresh ranks: HOCCL_CE_PATH is read when a group is made
        try:
            res = run_ranks(_rank_bandwidth, args.world, args.mbytes, timeout=ranks_timeout(240) / len(paths),
                            env={"HOCCL_CE_PATH": p})
        except (AssertionError, RuntimeError, TimeoutError) as e:  # a failed path must not hide the next
            print(f"FAIL bandwidth path={p}: {type(e).__name__}: {e}", flush=True)
            failed += 1
            continue
        failed += _verdict(f"bandwidth path={p}", res)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
