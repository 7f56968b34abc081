"""The copy-engine collectives on a CPU model of the CUDA driver, across real processes.

hoccl dlopens the driver named by HOCCL_LIBCUDA; these tests point it at tests/cuda_model (built
here with g++), which implements the documented driver semantics on host memory: streams are
worker threads with random delays, device memory is memfd-backed so legacy IPC works between
processes, registered host memory gets a different device address, stream memory operations
follow cuda.h's conditions, and hoccl's reduction kernels run on the CPU. The group (`_CeGroup`)
is driven through raw-pointer hooks, so no CUDA build of torch is needed. Results are checked
against references computed independently on the CPU (cuda_test_utils.exact_reduce).

What these cannot show: copy-engine vs SM placement on a real driver (tests/test_ce_sm_check.py
runs the check that measures it, on this model), real DMA timing, and the driver's behaviour where
the documentation is silent (scripts/gpu_check.sh probes those on a GPU).
"""
from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch

from cuda_test_utils import RawDevice as Dev
from cuda_test_utils import build_cuda_model, exact_reduce, model_counter, model_env, rank_data
from dist_utils import run_ranks

pytestmark = pytest.mark.skipif(
    not __import__("hoccl_backend", fromlist=["_C"])._C.built_with_cuda,
    reason="hoccl was built without cuda.h, so the copy-engine pieces are not compiled in")

SLOT = 4096  # the smallest staging slot (page-rounded): every size below crosses slot boundaries
WRAP = 2**32 - 5  # sequence numbers wrap within the first ops
FLOAT_OPS = ["sum", "avg", "product", "min", "max", "premul_sum"]
INT_OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]


@pytest.fixture(scope="session")
def model():
    return build_cuda_model()


def _env(lib, **extra):
    return model_env(lib, HOCCL_MODEL_MAX_DELAY_US=100, **extra)


# ---- rank-side helpers (run in the spawned ranks) -------------------------------------------

def _store(rank, world):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, rank == 0,
                         timeout=timedelta(seconds=60))


def _group(store, prefix, rank, world, **kw):
    from hoccl_backend import cuda_ext

    return cuda_ext.cuda_module()._CeGroup(store, prefix, rank, world, 0, SLOT, **kw)


def _sizes(elem: int) -> list[int]:
    per_slot = SLOT // elem
    return [1, per_slot - 1, per_slot, per_slot + 1, 2 * per_slot + 3]


def _check_all_gather(g, dev, rank, world, dtype, n, bad):
    x = dev.put(rank_data(rank, n, dtype))
    out = dev.alloc(world * n * dtype.itemsize)
    g.all_gather_raw(out, x, n * dtype.itemsize, dev.stream)
    got = dev.get(out, world * n, dtype)
    if not torch.equal(got, torch.cat([rank_data(r, n, dtype) for r in range(world)])):
        bad.append(("all_gather", str(dtype), n))


def _check_all_to_all(g, dev, rank, world, dtype, n, bad):
    x = dev.put(rank_data(rank, world * n, dtype))
    out = dev.alloc(world * n * dtype.itemsize)
    g.all_to_all_raw(out, x, n * dtype.itemsize, dev.stream)
    expected = torch.cat([rank_data(r, world * n, dtype)[rank * n:(rank + 1) * n] for r in range(world)])
    if not torch.equal(dev.get(out, world * n, dtype), expected):
        bad.append(("all_to_all", str(dtype), n))


def _check_broadcast(g, dev, rank, world, dtype, n, bad):
    for root in range(world):
        b = dev.put(rank_data(rank, n, dtype))
        g.broadcast_raw(b, n * dtype.itemsize, root, dev.stream)
        if not torch.equal(dev.get(b, n, dtype), rank_data(root, n, dtype)):
            bad.append(("broadcast", str(dtype), n, root))


def _check_all_reduce(g, dev, rank, world, dtype, n, bad):
    for op in (FLOAT_OPS if dtype.is_floating_point else INT_OPS):
        b = dev.put(rank_data(rank, n, dtype, op))
        g.all_reduce_raw(b, n, torch.empty(0, dtype=dtype), op, 0.5, dev.stream)
        expected = exact_reduce([rank_data(r, n, dtype, op) for r in range(world)], op, 0.5)
        if not torch.equal(dev.get(b, n, dtype), expected):
            bad.append(("all_reduce", str(dtype), op, n))


def _pipelined(g, dev, rank, world, bad, rounds=6):
    """Ops back to back with no host sync between them: the host runs ahead of the streams, and
    each op rewrites buffers that peers read in the op before (all_to_all A -> B -> A, a
    broadcast into A right after an all_gather read it, in-place all_reduce of B), with small
    one-slot all_reduces in between so plan shapes alternate. Once a round, A is rewritten by a
    copy of the caller's right after the all_gather that peers read it in: only the op's final
    barrier keeps that copy from racing the peers' reads. Checked at the end against a
    simulation of every rank's buffers on the CPU."""
    n = SLOT // 4 + 3  # A and B hold world blocks of n: every op spans more than one slot
    data = [rank_data(r, world * n, torch.float32) for r in range(world)]
    small = [rank_data(r + 50, 5, torch.float32) for r in range(world)]
    a, c = dev.put(data[rank]), dev.put(small[rank])
    b = dev.alloc(world * n * 4)
    gathered = [dev.alloc(world * n * 4) for _ in range(rounds)]
    like = torch.empty(0, dtype=torch.float32)

    def a2a(src):  # rank r's block s = rank s's block r
        return [torch.cat([src[s][r * n:(r + 1) * n] for s in range(world)]) for r in range(world)]

    A, B, C, G = data, None, small, []
    for i in range(rounds):
        op = ("sum", "max")[i % 2]
        g.all_to_all_raw(b, a, n * 4, dev.stream)
        B = a2a(A)
        g.all_gather_raw(gathered[i], a, n * 4, dev.stream)
        G.append(torch.cat([A[s][:n] for s in range(world)]))
        fresh = [rank_data(r + 10 * (i + 1), world * n, torch.float32) for r in range(world)]
        dev.m._ce_raw_upload(a, fresh[rank], dev.stream)  # pageable: the stream drains, then it copies
        A = fresh
        g.broadcast_raw(a, world * n * 4, i % world, dev.stream)
        A = [A[i % world]] * world
        g.all_reduce_raw(b, world * n, like, op, 1.0, dev.stream)
        B = [exact_reduce(B, op)] * world
        g.all_reduce_raw(c, 5, like, op, 1.0, dev.stream)
        C = [exact_reduce(C, op)] * world
        g.all_to_all_raw(a, b, n * 4, dev.stream)
        A = a2a(B)
    got = {"A": dev.get(a, world * n, torch.float32), "B": dev.get(b, world * n, torch.float32),
           "C": dev.get(c, 5, torch.float32)}
    want = {"A": A[rank], "B": B[rank], "C": C[rank]}
    for i in range(rounds):
        got[f"G{i}"], want[f"G{i}"] = dev.get(gathered[i], world * n, torch.float32), G[i]
    bad += [("pipelined", k) for k in want if not torch.equal(got[k], want[k])]
    dev.free_all()


def _rank_every_op(rank, world, first_seq, dtypes):
    """Every op x dtypes x sizes around the slot on four groups: host path with GPU-model
    reductions, host path with per-rank mixed reduce locations, the p2p (IPC) path with GPU-model
    reductions, and all_reduce on the p2p path with mixed reduce locations."""
    store = _store(rank, world)
    dev = Dev()
    mixed = ("gpu", "host")[rank % 2]
    groups = {
        "host": _group(store, "host", rank, world, path="host", reduce_on="gpu", first_seq=first_seq),
        "mixed": _group(store, "mixed", rank, world, path="host", reduce_on=mixed, first_seq=first_seq),
        "p2p": _group(store, "p2p", rank, world, path="p2p", reduce_on="gpu", first_seq=first_seq),
        "p2p-mixed": _group(store, "p2p-mixed", rank, world, path="p2p", reduce_on=mixed, first_seq=first_seq),
    }
    bad = []
    algos = {name: {} for name in groups}  # op -> the plans it ran
    for name, g in groups.items():
        mine = []
        for dtype in dtypes:
            sizes = _sizes(dtype.itemsize)
            if name.startswith("p2p"):
                sizes.append(world * (SLOT // dtype.itemsize) + 7)  # every rank's part spans passes
            for n in sizes:
                checks = [_check_all_reduce]
                if name in ("host", "p2p"):
                    checks = [_check_all_gather, _check_all_to_all, _check_broadcast] + checks
                for check in checks:
                    check(g, dev, rank, world, dtype, n, mine)
                    algos[name].setdefault(check.__name__[len("_check_"):], set()).add(g.last_algo())
                dev.free_all()
        if name in ("host", "p2p"):
            _pipelined(g, dev, rank, world, mine)
        bad += [(name,) + b for b in mine]
    paths = {name: g.paths() for name, g in groups.items()}
    hinted = model_counter("batch_copies_prefer_overlap")
    del groups
    return bad, paths, hinted, algos


ALL_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8]
# Larger worlds: one dtype per element size class (4, 2, 1 bytes), to keep CI quick.
SOME_DTYPES = [torch.float32, torch.float16, torch.uint8]


@pytest.mark.parametrize("world,first_seq,dtypes", [(2, 0, ALL_DTYPES), (3, WRAP, SOME_DTYPES),
                                                    (4, WRAP - 1, SOME_DTYPES)], ids=["w2", "w3-wrap", "w4-wrap"])
def test_every_collective_on_the_driver_model(model, world, first_seq, dtypes):
    res = run_ranks(_rank_every_op, world, first_seq, dtypes, backend=None, timeout=150, env=_env(model))
    for rank, (bad, paths, hinted, algos) in enumerate(res):
        assert not bad, (rank, bad[:10], len(bad))
        assert "p2p" in paths["p2p"] and "p2p" not in paths["host"], paths
        # The model reports driver 13.0: no copy carries the prefer-overlap hint (13.1 API).
        assert hinted == 0, hinted
        # The host path runs the CPU transport's plans; all_reduce past one slot on more than two
        # ranks takes reduce-scatter + all-gather (reductions into slots, two barriers a round).
        reduce_plans = {"allreduce/one-shot"} | ({"allreduce/rs-ag"} if world > 2 else set())
        assert algos["host"] == {"all_gather": {"allgather/staged"}, "all_to_all": {"alltoall/phased"},
                                 "broadcast": {"broadcast/staged"}, "all_reduce": reduce_plans}, algos
        assert algos["mixed"] == {"all_reduce": reduce_plans}, algos
        # The p2p path runs the direct-read plans (peers' blocks read through IPC mappings); its
        # all_reduce up to one slot keeps the staged one-shot plan, past it reads peers' slices.
        p2p_reduce = {"allreduce/one-shot", "all_reduce/direct-read"}
        assert algos["p2p"] == {"all_gather": {"all_gather/direct-read"}, "all_to_all": {"alltoall/direct-read"},
                                "broadcast": {"broadcast/direct-read"}, "all_reduce": p2p_reduce}, algos
        assert algos["p2p-mixed"] == {"all_reduce": p2p_reduce}, algos


# ---- one world-2 job for the single-purpose checks (each process start costs seconds) --------

def _copy_kinds(store, dev, rank, world):
    """The zero-SM claims the model can check: which copies and kernels each path issues."""
    g = _group(store, "kinds", rank, world, path="host", reduce_on="host")
    bad = []
    before = {c: model_counter(c) for c in ("copies_d2d", "kernel_launches")}
    _check_all_gather(g, dev, rank, world, torch.float32, 3000, bad)
    _check_all_to_all(g, dev, rank, world, torch.float32, 3000, bad)
    _check_broadcast(g, dev, rank, world, torch.float32, 3000, bad)
    _check_all_reduce(g, dev, rank, world, torch.float32, 3000, bad)
    host = {c: model_counter(c) - before[c] for c in before}
    p = _group(store, "kinds_p2p", rank, world, path="p2p", reduce_on="host")
    b0 = model_counter("batch_copies_prefer_overlap")
    _check_all_gather(p, dev, rank, world, torch.float32, 3000, bad)
    hinted = model_counter("batch_copies_prefer_overlap") - b0
    dev.free_all()
    return bad, host, hinted


def _ipc_cache(store, dev, rank, world):
    """A fresh source allocation every op (what peers map now that they read in place): freed
    after the op, mappings and Store keys must not pile up; kept alive, the mappings per peer stay
    bounded and an evicted one maps again."""
    g = _group(store, "ipc", rank, world, path="p2p", reduce_on="host")
    bad, mappings, keys = [], [], []
    n = 4000
    out = dev.alloc(world * n * 4)
    expected = torch.cat([rank_data(r, n, torch.float32) for r in range(world)])

    def gather(x, i):
        g.all_gather_raw(out, x, n * 4, dev.stream)
        if not torch.equal(dev.get(out, world * n, torch.float32), expected):
            bad.append(i)

    for i in range(12):
        x = dev.m._ce_raw_alloc(n * 4)
        dev.m._ce_raw_upload(x, rank_data(rank, n, torch.float32), dev.stream)
        gather(x, i)
        _barrier(store, f"ipc/{i}", rank, world)  # nobody frees before every rank finished op i
        dev.m._ce_raw_free(x)
        mappings.append((g.ipc_mappings(), model_counter("ipc_open_mappings")))
        keys.append(g.ipc_store_keys())
    kept = []
    for i in range(12):
        kept.append(dev.put(rank_data(rank, n, torch.float32)))
        gather(kept[-1], 100 + i)
        kept_mappings = (g.ipc_mappings(), model_counter("ipc_open_mappings"))
    gather(kept[0], 200)  # its mapping was evicted: mapped again from the handle in the Store
    g.synchronize(30.0)
    _barrier(store, "ipc/kept", rank, world)
    dev.free_all()
    return bad, mappings, keys, kept_mappings


def _teardown(store, dev, rank, world):
    """Destroy each group right after enqueuing: its copies into staging are still queued."""
    bad = []
    for i in range(4):
        g = _group(store, f"teardown{i}", rank, world, path=("host", "p2p")[i % 2], reduce_on="gpu")
        n = 5 * SLOT
        x = dev.put(rank_data(rank, n, torch.float32))
        out = dev.alloc(world * n * 4)
        g.all_gather_raw(out, x, n * 4, dev.stream)
        del g
        if not torch.equal(dev.get(out, world * n, torch.float32),
                           torch.cat([rank_data(r, n, torch.float32) for r in range(world)])):
            bad.append(i)
    dev.free_all()
    return bad


def _capture(store, dev, rank, world):
    from cuda_test_utils import model_set_capture

    g = _group(store, "capture", rank, world, path="host", reduce_on="host")
    x = dev.put(rank_data(rank, 8, torch.float32))
    out = dev.alloc(32 * world)
    model_set_capture(dev.stream, 1)  # CU_STREAM_CAPTURE_STATUS_ACTIVE
    msgs = []
    for call in (lambda: dev.m._ce_raw_refuse_capture(dev.stream, "all_gather"),
                 lambda: g.all_gather_raw(out, x, 32, dev.stream)):
        try:
            call()
            msgs.append("accepted")
        except RuntimeError as e:
            msgs.append(str(e))
    model_set_capture(dev.stream, 0)
    g.all_gather_raw(out, x, 32, dev.stream)  # nothing was half-enqueued: the group still works
    ok = torch.equal(dev.get(out, 8 * world, torch.float32),
                     torch.cat([rank_data(r, 8, torch.float32) for r in range(world)]))
    dev.free_all()
    return msgs, ok


def _chained_reduce(dev):
    n = 1000
    srcs = [rank_data(r, n, torch.float32) for r in range(20)]
    ptrs = [dev.put(s) for s in srcs]
    like = torch.empty(0, dtype=torch.float32)
    out = {}
    dev.m._ce_raw_reduce(ptrs[3], ptrs, n, like, "max", 1.0, 20, dev.stream, 4)  # alias in the first launch
    out["first_launch_alias"] = torch.equal(dev.get(ptrs[3], n, torch.float32), exact_reduce(srcs, "max"))
    try:
        dev.m._ce_raw_reduce(ptrs[17], ptrs, n, like, "max", 1.0, 20, dev.stream, 4)
        out["late_alias"] = "accepted"
    except ValueError as e:
        out["late_alias"] = str(e)
    out["sixteen_bit"] = _chained_16_bit(dev, n)
    dev.free_all()
    return out


def _chained_16_bit(dev, n):
    """17 sources of 16-bit floats: two chained launches, which must still round once (the
    products and sums of the first 16 sources differ from the reference when rounded to 16 bits
    between launches). Returns (dtype, op) -> elements that differ from the reference."""
    diff = {}
    for dtype in (torch.float16, torch.bfloat16):
        for op in ("product", "sum", "avg", "premul_sum"):
            srcs = [rank_data(r, n, dtype, op) for r in range(17)]
            ptrs = [dev.put(s) for s in srcs]
            dst = dev.alloc(n * dtype.itemsize)
            dev.m._ce_raw_reduce(dst, ptrs, n, torch.empty(0, dtype=dtype), op, 0.25, 17, dev.stream, 4)
            got = dev.get(dst, n, dtype)
            diff[(str(dtype), op)] = int((got != exact_reduce(srcs, op, 0.25)).sum())
    return diff


def _barrier(store, key, rank, world):
    store.set(f"{key}/{rank}", "1")
    store.wait([f"{key}/{r}" for r in range(world)])


def _rank_battery(rank, world):
    store = _store(rank, world)
    dev = Dev()
    return {"kinds": _copy_kinds(store, dev, rank, world), "ipc": _ipc_cache(store, dev, rank, world),
            "teardown": _teardown(store, dev, rank, world), "capture": _capture(store, dev, rank, world),
            "chained": _chained_reduce(dev)}


@pytest.fixture(scope="module")
def battery(model):
    # Driver 13.1: the p2p copies may carry the copy-engine hint; long delays expose teardown races.
    return run_ranks(_rank_battery, 2, backend=None, timeout=150,
                     env=model_env(model, HOCCL_MODEL_DRIVER_VERSION=13010, HOCCL_MODEL_MAX_DELAY_US=1000))


def test_host_path_issues_no_d2d_copy_or_kernel_and_p2p_asks_for_copy_engines(battery):
    for r in battery:
        bad, host, hinted = r["kinds"]
        assert not bad, bad
        assert host == {"copies_d2d": 0, "kernel_launches": 0}, host
        assert hinted > 0, hinted  # from CUDA 13.1 the p2p copies carry PREFER_OVERLAP_WITH_COMPUTE


def test_ipc_mappings_follow_allocations_and_are_closed(battery):
    for r in battery:
        bad, mappings, keys, kept = r["ipc"]
        assert not bad, bad
        # The peer's old allocation is retired when its new one is announced and closed once the
        # copies out of it are done: open mappings stay bounded instead of growing with the ops.
        assert all(ours == in_driver for ours, in_driver in mappings), mappings
        assert max(m for m, _ in mappings[4:]) <= 2, mappings
        assert max(keys[4:]) <= 2, keys  # replaced buffers' handles are deleted from the Store
        # Twelve live allocations of one peer: at most 8 cached (the least recently used is
        # retired), plus at most one retired mapping not yet closed.
        assert kept[0] == kept[1] and kept[0] <= 9, kept


def test_destroying_a_group_waits_for_its_copies(battery):
    assert all(not r["teardown"] for r in battery), [r["teardown"] for r in battery]


def test_graph_capture_is_refused_before_anything_is_enqueued(battery):
    for r in battery:
        msgs, ok = r["capture"]
        for m in msgs:
            assert "hoccl all_gather: CUDA graph capture is not supported" in m, m
        assert ok


def test_chained_reduction_refuses_a_later_source_as_destination(battery):
    for r in battery:
        out = r["chained"]
        assert out["first_launch_alias"] is True
        assert "source 17 is the destination" in out["late_alias"], out


def test_chained_16_bit_reduction_rounds_once(battery):
    # Past HOCCL_REDUCE_MAX_SRCS sources the launcher chains launches; the running value must stay
    # in float32 between them, as exact_reduce (one rounding at the end) expects.
    for r in battery:
        assert all(v == 0 for v in r["chained"]["sixteen_bit"].values()), r["chained"]["sixteen_bit"]


# ---- failures: registration refused (as a sandbox may), IPC refused, a peer that stops -------

def _attempt(fn):
    try:
        fn()
        return "no error"
    except RuntimeError as e:
        return str(e)


def _rank_failures(rank, world):
    store = _store(rank, world)
    dev = Dev()
    out = {}

    def construct(prefix, path="host"):
        _group(store, prefix, rank, world, path=path, reduce_on="host", timeout_ms=2000)

    os.environ["HOCCL_MODEL_FAIL_REGISTER"] = "801"  # CUDA_ERROR_NOT_SUPPORTED, on every rank
    out["register_all"] = _attempt(lambda: construct("reg_all"))
    if rank == 0:
        del os.environ["HOCCL_MODEL_FAIL_REGISTER"]  # now only rank 1 fails
    out["register_one"] = _attempt(lambda: construct("reg_one"))
    os.environ.pop("HOCCL_MODEL_FAIL_REGISTER", None)
    _barrier(store, "after_register", rank, world)

    g = _group(store, "ipc_fail", rank, world, path="p2p", reduce_on="host", timeout_ms=2000)
    x, out_buf = dev.put(rank_data(rank, 10, torch.float32)), dev.alloc(40 * world)
    os.environ["HOCCL_MODEL_FAIL_IPC_OPEN"] = "801"
    out["ipc_open"] = _attempt(lambda: g.all_gather_raw(out_buf, x, 40, dev.stream))
    del os.environ["HOCCL_MODEL_FAIL_IPC_OPEN"]
    _barrier(store, "after_ipc", rank, world)

    stopping = {path: _group(store, "stop_" + path, rank, world, path=path, reduce_on="host", timeout_ms=1500)
                for path in ("host", "p2p")}
    if rank == world - 1:
        return out  # built the groups, then never joins their collectives
    for path, sg in stopping.items():
        out["stop_" + path] = _attempt(lambda: (sg.all_gather_raw(out_buf, x, 40, dev.stream), sg.synchronize(1.5)))
    return out


@pytest.fixture(scope="module")
def failures(model):
    return run_ranks(_rank_failures, 2, backend=None, timeout=120, env=_env(model))


def test_host_registration_failure_is_reported_clearly(failures):
    for rank, r in enumerate(failures):
        failed = [r["register_all"]] + ([r["register_one"]] if rank == 1 else [])
        for msg in failed:
            for part in ("cuMemHostRegister", "CUDA_ERROR_NOT_SUPPORTED", f"rank {rank}", "/dev/shm",
                         "HOCCL_CUDA_TRANSPORT=host"):
                assert part in msg, (part, msg)
    # Its peer stopped during setup: rank 0 gets a timeout naming what it waited for, not a hang.
    assert "rank 0" in failures[0]["register_one"] and "timed out" in failures[0]["register_one"]


def test_ipc_open_failure_is_reported_clearly(failures):
    for r in failures:
        msg = r["ipc_open"]
        assert "cuIpcOpenMemHandle" in msg and "CUDA_ERROR_NOT_SUPPORTED" in msg, msg
        assert "HOCCL_CE_PATH=host" in msg, msg


def test_a_stopped_peer_is_reported_not_hung_on(failures):
    host, p2p = failures[0]["stop_host"], failures[0]["stop_p2p"]
    # Host path: the stream waits on the peer's flag; the watchdog names the flag and its value.
    assert "rank 0" in host and "BARRIER from rank 1: the stream waits for >= 1, the flag holds 0" in host, host
    # P2P path: the host waits for the peer's buffer announcement.
    assert "rank 1 did not announce its buffer" in p2p, p2p


# ---- past HOCCL_REDUCE_MAX_SRCS ranks: the plan executor chains reduction launches -------------

def _rank_wide_16_bit(rank, world):
    """all_reduce of 16-bit floats with GPU reductions on both paths, one slot and past it (the
    host path then reduce-scatters into slots): every reduction has `world` sources, so the
    executor chains launches and must carry the running value in float between them."""
    store = _store(rank, world)
    dev = Dev()
    bad = []
    for path in ("host", "p2p"):
        g = _group(store, "wide_" + path, rank, world, path=path, reduce_on="gpu")
        for dtype in (torch.float16, torch.bfloat16):
            for n in (7, world * (SLOT // 2) + 5):
                for op in ("sum", "product"):
                    b = dev.put(rank_data(rank, n, dtype, op))
                    g.all_reduce_raw(b, n, torch.empty(0, dtype=dtype), op, 1.0, dev.stream)
                    want = exact_reduce([rank_data(r, n, dtype, op) for r in range(world)], op)
                    got = dev.get(b, n, dtype)
                    if not torch.equal(got, want):
                        bad.append((path, str(dtype), n, op, int((got != want).sum())))
        _barrier(store, "wide_done_" + path, rank, world)
        del g
    dev.free_all()
    # Rank 0 serves the Store: it leaves last, or a slower rank's last wait finds it gone.
    store.set(f"wide_exit/{rank}", "1")
    if rank == 0:
        store.wait([f"wide_exit/{r}" for r in range(world)])
    return bad


def test_16_bit_all_reduce_past_16_ranks_rounds_once(model):
    res = run_ranks(_rank_wide_16_bit, 17, backend=None, timeout=400, env=_env(model))
    assert all(not bad for bad in res), [bad for bad in res if bad][:3]
