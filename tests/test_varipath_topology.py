"""VarioPath topology model: presets, routing, JSON, nvidia-smi parsing, bad input."""
import json
import os

import pytest

import varipath
from varipath.topology import Topology, flat
from varipath.smi import from_smi, parse_matrix

DATA = os.path.join(os.path.dirname(varipath.__file__), "data")


def _check_path(topo, s, d):
    p = topo.path(s, d)
    assert p[0][0] == topo.gpus[s] and p[-1][1] == topo.gpus[d]
    for (a, b), (c, _) in zip(p, p[1:]):
        assert b == c  # contiguous
    assert len({l for l in p}) == len(p)  # no link twice
    for l in p:
        assert topo.bandwidth(l) > 0


@pytest.mark.parametrize("name", Topology.presets())
@pytest.mark.parametrize("hosts", [1, 2])
def test_presets_route_every_pair(name, hosts):
    topo = Topology.preset(name, hosts)
    n = topo.num_gpus
    assert n == {"gen4-4sw-2skt": 8, "gen5-2sw": 8, "direct4": 4}[name] * hosts
    for s in range(n):
        for d in range(n):
            if s != d:
                _check_path(topo, s, d)
    assert set(topo.links()) == {l for s in range(n) for d in range(n) if s != d for l in topo.path(s, d)} | set(topo.links())


def test_gen4_routing_rules():
    t = Topology.preset("gen4-4sw-2skt")
    assert t.path(0, 1) == [("h0.gpu0", "h0.sw0"), ("h0.sw0", "h0.gpu1")]  # same switch
    assert ("h0.sw0", "h0.rc0") in t.path(0, 2) and ("h0.rc0", "h0.rc1") not in t.path(0, 2)
    assert ("h0.rc0", "h0.rc1") in t.path(0, 7)  # across sockets
    assert t.pair_rate(0, 7) == 20e9 and t.pair_rate(0, 1) == 25e9
    t2 = Topology.preset("gen4-4sw-2skt", hosts=2)
    p = t2.path(2, 15)  # GPU2 sits on switch 1 -> NIC1; GPU15 on host 1 switch 3 -> NIC3
    assert p[:3] == [("h0.gpu2", "h0.sw1"), ("h0.sw1", "h0.nic1"), ("h0.nic1", "net")]
    assert p[-3:] == [("net", "h1.nic3"), ("h1.nic3", "h1.sw3"), ("h1.sw3", "h1.gpu15")]


def test_flat_is_one_ideal_switch():
    t = flat(5)
    assert t.num_gpus == 5 and len(t.path(0, 3)) == 2
    assert t.bandwidth(("gpu0", "sw")) == 4 * t.pair_bandwidth()


def test_json_round_trip(tmp_path):
    t = Topology.preset("gen5-2sw", 2)
    f = tmp_path / "t.json"
    t.to_json(str(f))
    u = Topology.from_json(str(f))
    assert u.num_gpus == t.num_gpus and u.links() == t.links()
    for l in t.links():
        assert u.bandwidth(l) == pytest.approx(t.bandwidth(l))
    for s in range(t.num_gpus):
        for d in range(t.num_gpus):
            if s != d:
                assert u.path(s, d) == t.path(s, d)


def _mini():
    return {"name": "mini", "gpus": ["g0", "g1"],
            "nodes": [{"id": "g0", "type": "gpu"}, {"id": "g1", "type": "gpu"}, {"id": "sw", "type": "switch"}],
            "links": [{"a": "g0", "b": "sw", "bw_GBps": 10}, {"a": "g1", "b": "sw", "bw_GBps": 10}]}


def test_json_errors():
    ok = Topology.from_dict(_mini())
    assert ok.pair_rate(0, 1) == 10e9
    bad = _mini()
    bad["links"].append({"a": "g0", "b": "ghost", "bw_GBps": 1})
    with pytest.raises(ValueError, match="unknown node 'ghost'"):
        Topology.from_dict(bad)
    bad = _mini()
    bad["nodes"].append({"id": "lonely", "type": "switch"})
    with pytest.raises(ValueError, match="disconnected"):
        Topology.from_dict(bad)
    bad = _mini()
    bad["nodes"].append({"id": "g2", "type": "gpu"})
    bad["nodes"].append({"id": "sw2", "type": "switch"})
    bad["gpus"].append("g2")
    bad["links"].append({"a": "g2", "b": "sw2", "bw_GBps": 1})
    with pytest.raises(ValueError, match="disconnected"):
        Topology.from_dict(bad)
    bad = _mini()
    bad["nodes"][2]["type"] = "toaster"
    with pytest.raises(ValueError, match="unknown type"):
        Topology.from_dict(bad)
    bad = _mini()
    del bad["links"]
    with pytest.raises(ValueError, match="missing field"):
        Topology.from_dict(bad)
    with pytest.raises(ValueError, match="unknown topology preset"):
        Topology.preset("nvswitch9000")


def _rates(t):
    n = t.num_gpus
    return [[t.pair_rate(s, d) if s != d else 0 for d in range(n)] for s in range(n)]


@pytest.mark.parametrize("fname,preset", [("dgx-like-gen4-8gpu.txt", "gen4-4sw-2skt"),
                                          ("workstation-4gpu-direct.txt", "direct4")])
def test_smi_samples_match_presets(fname, preset):
    with open(os.path.join(DATA, fname)) as f:
        t = from_smi(f.read())
    p = Topology.preset(preset)
    assert t.num_gpus == p.num_gpus
    assert _rates(t) == _rates(p)
    # same sharing structure: two pairs share a link in one iff they do in the other
    n = t.num_gpus
    pairs = [(s, d) for s in range(n) for d in range(n) if s != d]
    for a in pairs:
        for b in pairs:
            assert bool(set(t.path(*a)) & set(t.path(*b))) == bool(set(p.path(*a)) & set(p.path(*b)))


def test_smi_gen5_sample_and_errors():
    with open(os.path.join(DATA, "gen5-2switch-8gpu.txt")) as f:
        m = parse_matrix(f.read())
    assert len(m) == 8 and m[0][1] == "PIX" and m[0][4] == "SYS"
    with pytest.raises(ValueError, match="NVLink"):
        parse_matrix("\tGPU0\tGPU1\nGPU0\t X \tNV12\nGPU1\tNV12\t X \n")
    with pytest.raises(ValueError, match="no GPU columns"):
        parse_matrix("hello\nworld\n")
