"""The collective benchmark runs end to end (both backends in the same ranks) and its figures are
self-consistent. It asserts nothing about speed: figures are for people to read."""
import json
import subprocess
import sys

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
