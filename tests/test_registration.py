"""Backend registration: the torch entry point, device-mapped backend strings, group names."""
from __future__ import annotations

import os
import re
from datetime import timedelta

import torch
import torch.distributed as dist

from dist_utils import run_ranks


def _init(backend, rank, world):
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=60))


def without_import(rank, world):
    import sys

    # torch loaded hoccl through its `torch.backends` entry point; the user imported nothing.
    assert "hoccl" in dist.Backend.backend_list
    assert "hoccl_backend._C" not in sys.modules  # registration alone must not load the extension
    _init("hoccl", rank, world)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    assert t.item() == world * (world + 1) / 2
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert backend.__class__.__name__ == "ProcessGroupHOCCL"
    dist.destroy_process_group()
    return True


def test_entry_point_registers_without_import():
    assert run_ranks(without_import, 2, backend=None, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}) == [True, True]


def device_strings(rank, world, spec):
    import hoccl_backend  # noqa: F401

    _init(spec, rank, world)
    t = torch.full((4,), float(rank))
    dist.all_reduce(t)
    assert torch.all(t == sum(range(world)))
    cpu_backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    name = cpu_backend.__class__.__name__
    dist.destroy_process_group()
    return name


def test_cpu_hoccl_string():
    assert run_ranks(device_strings, 2, "cpu:hoccl", backend=None) == ["ProcessGroupHOCCL"] * 2


def test_mixed_string_uses_gloo_for_cpu():
    # hoccl serves CUDA only here, so CPU tensors go through gloo and no hoccl group is built.
    assert run_ranks(device_strings, 2, "cpu:gloo,cuda:hoccl", backend=None) == ["ProcessGroupGloo"] * 2


def test_autoload_is_cheap_and_safe():
    import subprocess
    import sys

    code = ("import time; t=time.perf_counter(); import torch; "
            "import torch.distributed as d; print('hoccl' in d.Backend.backend_list)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def debug_log(rank, world):
    import tempfile

    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        dist.all_reduce(torch.ones(1000))
        dist.all_gather_into_tensor(torch.empty(2 * world * 100000), torch.ones(2 * 100000))
        import hoccl_backend

        dist.all_gather_into_tensor(torch.empty(2 * world * 100000), hoccl_backend.zeros(2 * 100000))
        dist.all_to_all_single(torch.empty(world * 100000), torch.ones(world * 100000))
        for _ in range(3):
            dist.all_reduce(torch.ones(1000))
        dist.destroy_process_group()  # INFO prints its summary here
    finally:
        os.dup2(saved, 2)
    log.seek(0)
    return log.read().decode()


def test_debug_info_prints_where_the_time_went_at_shutdown():
    logs = run_ranks(debug_log, 2, env={"HOCCL_DEBUG": "INFO"})
    phases = re.compile(r"mean ([\d.]+) us: barriers ([\d.]+) \(([\d.]+) per op\), copies ([\d.]+), "
                        r"peer reads ([\d.]+), reductions ([\d.]+), other (-?[\d.]+)")
    for rank, text in enumerate(logs):
        assert "#1 algo=" not in text, "per-op lines are TRACE's: " + text
        lines = {line.split(" mean ")[0]: line for line in text.splitlines() if " mean " in line}
        one_shot = lines[f"[hoccl rank {rank}] all_reduce allreduce/one-shot bytes=4000 ops=4"]
        mean, barrier, per_op, copies, reads, reductions, other = map(float, phases.search(one_shot).groups())
        assert per_op == 1.0 and reads == 0.0, one_shot  # one barrier, no cross-memory reads
        assert copies > 0 and reductions > 0, one_shot
        assert abs(barrier + copies + reductions + other - mean) < 0.2, one_shot
        gather = lines[f"[hoccl rank {rank}] all_gather all_gather/direct-read bytes=800000 ops=2"]
        assert float(phases.search(gather).group(5)) > 0, gather  # process_vm_readv of the plain tensor
        assert f"[hoccl rank {rank}] all_to_all_single alltoall/varipath bytes=800000 ops=1" in lines, text


def test_debug_trace_logs_algorithm_transport_bytes_time():
    logs = run_ranks(debug_log, 2, env={"HOCCL_DEBUG": "TRACE"})
    for rank, text in enumerate(logs):
        assert f"[hoccl rank {rank}] all_reduce #1 algo=allreduce/one-shot transport=shm bytes=4000 mapped=0 time=" in text, text
        assert "all_gather #2 algo=all_gather/direct-read transport=shm+cma bytes=800000 mapped=0 " in text, text
        # the peer's input is a shared tensor: read through a mapping, not process_vm_readv
        assert "all_gather #3 algo=all_gather/direct-read transport=shm+cma bytes=800000 mapped=800000 " in text, text
        # all_to_all's phased plan reads peers directly too, whatever its algorithm's name
        assert "all_to_all_single #4 algo=alltoall/varipath transport=shm+cma bytes=800000 " in text, text
        assert "(barriers " in text and ", peer reads " in text, text


def test_debug_trace_prints_the_plan():
    logs = run_ranks(debug_log, 2, env={"HOCCL_DEBUG": "TRACE"})
    assert "plan allreduce/one-shot: 3 steps, 1 barriers" in logs[0], logs[0]
    assert "reduce out[0]+0 <- slot[r0,b0]+0 slot[r1,b0]+0 x1000 finalize" in logs[0], logs[0]


def test_setup_runs_while_a_stale_install_breaks_torch_import(tmp_path):
    """Reinstalling is how a user repairs a hoccl install whose directory is gone; setup.py must not
    autoload backends, or that broken entry point stops the reinstall as it stops `import torch`."""
    import subprocess
    import sys

    # A distribution like a stale editable install: its torch.backends entry point names a
    # module that no longer exists anywhere on the path.
    info = tmp_path / "stale_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stale-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nstale = module_removed_since:autoload\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "1"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    broken = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                            timeout=120, env=env, cwd=tmp_path)
    assert broken.returncode != 0 and "Failed to load the backend extension" in broken.stderr
    out = subprocess.run([sys.executable, "setup.py", "--name"], capture_output=True, text=True,
                         timeout=300, env=env, cwd=root)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "hoccl"
