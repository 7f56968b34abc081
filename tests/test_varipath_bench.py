"""The benchmark CLI writes the documented JSON records."""
import json

from varipath import bench

KEYS = {"preset", "hosts", "traffic", "bytes_per_rank", "model", "algo", "time_s", "lower_bound_s", "plan_us"}


def test_bench_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOCCL_CACHE_DIR", str(tmp_path))
    out = tmp_path / "r.json"
    rc = bench.main(["--presets", "direct4", "--hosts", "1,2", "--traffic", "uniform,hot4-80",
                     "--sizes", "1M,64M", "--plan-repeats", "1", "--no-planning", "--json", str(out)])
    assert rc == 0
    recs = json.loads(out.read_text())
    assert len(recs) == 2 * 2 * 2 * 3 * 4  # hosts * traffic * sizes * models * algos
    for r in recs:
        assert KEYS <= set(r)
        assert r["time_s"] >= r["lower_bound_s"] > 0
    text = capsys.readouterr().out
    assert "VP/LB" in text and "geomean speed-up" in text
