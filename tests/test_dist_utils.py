"""run_ranks forks its ranks from a server that started earlier, under another test perhaps: each
rank must still start from the calling test's environment, directory and output streams."""
import os
import sys

from dist_utils import run_ranks


def _seen(rank, world):
    print(f"rank {rank} writes to stderr", file=sys.stderr, flush=True)
    return os.environ.get("HOCCL_TEST_MARK"), os.getcwd()


def test_ranks_start_from_the_callers_environment_directory_and_streams(monkeypatch, tmp_path, capfd):
    run_ranks(_seen, 1, backend=None)  # the fork server runs from here on, if it did not already
    monkeypatch.setenv("HOCCL_TEST_MARK", "set after the server started")
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    assert run_ranks(_seen, 2, backend=None) == [("set after the server started", str(tmp_path))] * 2
    err = capfd.readouterr().err
    assert "rank 0 writes to stderr" in err and "rank 1 writes to stderr" in err, err
    monkeypatch.delenv("HOCCL_TEST_MARK")
    assert run_ranks(_seen, 1, backend=None)[0][0] is None
