"""The configuration table: every HOCCL_* variable the code reads is in it (and in the README's
table), bad values fail group creation with the variable's name, and HOCCL_DEBUG=INFO prints the
configuration a group runs with."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dist_utils import run_ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE_DIRS = ("cuda", "hoccl_backend", "varipath", "topoep", "scripts", "examples", "setup.py")
# Macros of the C++ sources that share the prefix but are not environment variables.
NOT_VARIABLES = re.compile(r"HOCCL_(WITH_CUDA|CASE|FOR_DTYPES|OP_\w+|SCALE_\w+|INT_COMBINE|STR2?|CU_\w+|HAVE_\w+|REDUCE_MAX_SRCS|REDUCE_KERNEL|REDUCE|ACC_\w+|REDUCE_MAX_THREADS|SPIN_MAX_THREADS)$")


def table():
    import torch  # noqa: F401
    from hoccl_backend import _C

    return {row["name"]: row for row in _C.config_table()}


def variables_in_code():
    out = subprocess.run(["git", "grep", "-h", "-o", "-I", "-E", r"HOCCL_[A-Z0-9_]*[A-Z0-9]", "--", *CODE_DIRS],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {v for v in out if not NOT_VARIABLES.match(v)}


def test_every_variable_the_code_reads_is_in_the_table():
    missing = variables_in_code() - set(table())
    assert not missing, f"HOCCL_* variables used in the code but absent from cuda/common/config.cpp: {sorted(missing)}"


def test_readme_table_lists_exactly_the_config_table():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"<!-- config-table:start -->(.*?)<!-- config-table:end -->", text, re.S)
    assert m, "README.md has no configuration table between the config-table markers"
    rows = set(re.findall(r"^\|\s*`(HOCCL_[A-Z0-9_]+)`", m.group(1), re.M))
    assert rows == set(table()), (f"README lacks {sorted(set(table()) - rows)}; "
                                  f"README has unknown {sorted(rows - set(table()))}")


def _value(name, value):
    code = ("import torch\nfrom hoccl_backend import _C\n"
            f"print(repr(_C.config_value({name!r})))")
    env = dict(os.environ)
    env.pop(name, None)
    if value is not None:
        env[name] = value
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name,value,expected", [
    ("HOCCL_ALLTOALL_ALGO", None, "varipath"), ("HOCCL_ALLTOALL_ALGO", "pairwise", "pairwise"),
    ("HOCCL_SHM_SLOT_BYTES", "8M", "8M"), ("HOCCL_DEBUG", None, "off")])
def test_values_and_defaults(name, value, expected):
    r = _value(name, value)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == repr(expected)


def create_group(rank, world):
    import torch.distributed as dist
    from datetime import timedelta

    try:
        dist.init_process_group("hoccl", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    except Exception as e:  # noqa: BLE001
        return str(e)
    dist.destroy_process_group()
    return "created"


@pytest.mark.parametrize("name,value,words", [
    ("HOCCL_ALLTOALL_ALGO", "fastest", ["HOCCL_ALLTOALL_ALGO=fastest", "varipath", "pairwise"]),
    ("HOCCL_SHM_SLOT_BYTES", "12Q", ["HOCCL_SHM_SLOT_BYTES=12Q", "K/M/G"]),
    ("HOCCL_SHM_SLOT_BYTES", "1K", ["HOCCL_SHM_SLOT_BYTES=1K", "4096"]),
    ("HOCCL_ALLTOALL_PLAN_CACHE", "-1", ["HOCCL_ALLTOALL_PLAN_CACHE=-1"]),
    ("HOCCL_DEBUG", "LOUD", ["HOCCL_DEBUG=LOUD", "INFO", "TRACE"]),
])
def test_bad_value_fails_group_creation_naming_the_variable(name, value, words):
    results = run_ranks(create_group, 2, backend=None, env={name: value}, timeout=120)
    for msg in results:
        for w in words:
            assert w in msg, msg


def print_config(rank, world):
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    dist.init_process_group("hoccl", rank=rank, world_size=world, timeout=timedelta(seconds=30))
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


def test_debug_info_prints_the_configuration(capfd):
    env = {"HOCCL_DEBUG": "INFO", "HOCCL_SHM_SLOT_BYTES": "1M", "HOCCL_NOT_A_SETTING": "1"}
    assert run_ranks(print_config, 2, backend=None, env=env, timeout=120) == [[2.0] * 3] * 2
    err = capfd.readouterr().err
    assert "HOCCL_SHM_SLOT_BYTES=1M  (from the environment)" in err
    assert "HOCCL_ALLTOALL_ALGO=varipath" in err
    assert "HOCCL_NOT_A_SETTING: unknown to hoccl" in err
