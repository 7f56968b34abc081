"""The host reduction's vector paths (AVX2+F16C, AVX-512) write the portable path's bits.

Every instruction set this CPU has runs through `_C._reduce_into_on` and is compared bit for bit
with the portable path, and the portable path with an independent torch reference (the sources
combined in float32 in rank order, then one `.to(dtype)`). Inputs: random values, every 16-bit
pattern, NaNs with payloads and signs, infinities, signed zeros, subnormals, sums that sit exactly
between two representable values, overflow to infinity; counts around the vector widths, unaligned
pointers, 1 to 8 sources, the destination aliasing each source. Real ranks then check that an
all_reduce on the path in use gives every rank the reference's bits.
"""
from __future__ import annotations

import zlib

import pytest
import torch
import torch.distributed as dist

from hoccl_backend import _C
from dist_utils import run_ranks

ISAS = _C.reduce_isas()
VECTOR_ISAS = [pytest.param(i, marks=pytest.mark.skipif(i not in ISAS["available"], reason=f"this CPU has no {i}"))
               for i in ("avx2", "avx512")]
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
OPS = ("SUM", "PRODUCT", "MIN", "MAX")
COUNTS = (0, 1, 7, 15, 16, 17, 31, 33, 1000, 4099)
BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS[t.dtype])


def reduce_on(isa: str, srcs: list[torch.Tensor], op: str, dst: torch.Tensor | None = None) -> torch.Tensor:
    dst = torch.empty_like(srcs[0]) if dst is None else dst
    _C._reduce_into_on(dst, srcs, op, isa)
    return dst


def torch_reference(srcs: list[torch.Tensor], op: str) -> torch.Tensor:
    """Rank order in float32, one rounding at the end; min and max keep the earlier value unless
    the later one compares smaller (larger), as the C++ comparison does."""
    acc = srcs[0].float()
    for s in srcs[1:]:
        x = s.float()
        if op == "SUM":
            acc = acc + x
        elif op == "PRODUCT":
            acc = acc * x
        elif op == "MIN":
            acc = torch.where(x < acc, x, acc)
        else:
            acc = torch.where(acc < x, x, acc)
    return acc.to(srcs[0].dtype)


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    diff = (bits(got) != bits(want)).nonzero().flatten()
    if len(diff):
        i = int(diff[0])
        raise AssertionError(f"{what}: {len(diff)} of {got.numel()} elements differ, first at {i}: "
                             f"{int(bits(got)[i]) & 0xFFFFFFFF:#x} vs {int(bits(want)[i]) & 0xFFFFFFFF:#x}")


def assert_matches_reference(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bits equal, except that torch's own conversions may keep a NaN's payload: NaN where torch
    has NaN is all that is asked there."""
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), f"{what}: NaNs differ from the torch reference"
    assert_same_bits(got[~nan], want[~nan], what + " vs the torch reference")


def special_values(dtype: torch.dtype) -> torch.Tensor:
    info = torch.finfo(dtype)
    vals = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), info.max, -info.max, info.tiny, -info.tiny,
            info.smallest_normal / 2, info.smallest_normal * 0.75, 2.0 ** (-149 if dtype == torch.float32 else -133),
            1.0, -1.0, 1.0 + info.eps, 3.0, 0.5]
    if dtype == torch.float16:
        vals += [2.0 ** -24, -(2.0 ** -24), 65504.0, 65520.0, 2.0 ** -14]
    t = torch.tensor(vals, dtype=torch.float32).to(dtype)
    payload_nans = {torch.bfloat16: [0x7FC1, 0xFFC0, 0x7F81, 0xFF90],  # quiet and signalling, both signs
                    torch.float16: [0x7E01, 0xFE00, 0x7C01, 0xFD55],
                    torch.float32: [0x7FC00001, 0xFFC00000, 0x7F800001, 0xFF800001]}[dtype]
    top = 1 << (8 * dtype.itemsize)
    signed = [v - top if v >= top // 2 else v for v in payload_nans]
    return torch.cat([t, torch.tensor(signed, dtype=BITS[dtype]).view(dtype)])


def rounding_ties(g: torch.Generator, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs a, b whose float sum lies exactly halfway between two neighbours of dtype: b is half
    of a's last place, so round-to-nearest-even decides (odd a rounds away, even a stays)."""
    mant = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]
    a = (torch.randn(n, generator=g) * 4).to(dtype)
    a = torch.where(a == 0, torch.ones_like(a), a)
    _, e = torch.frexp(a.float())
    b = torch.ldexp(torch.sign(a.float()), e - mant - 1).to(dtype)
    return a, b


def random_sources(g: torch.Generator, count: int, nsrc: int, dtype: torch.dtype, offset: int) -> list[torch.Tensor]:
    """Sources at `offset` elements into their allocation (so vector loads are unaligned), each
    element drawn from random bits, scaled normals or special values."""
    specials = special_values(dtype)
    out = []
    for _ in range(nsrc):
        half_range = 2 ** (8 * dtype.itemsize - 1)
        rand_bits = torch.randint(-half_range, half_range, (count,), generator=g).to(BITS[dtype])
        normals = (torch.randn(count, generator=g) * 10.0 ** torch.randint(-6, 6, (count,), generator=g)).to(dtype)
        pick = torch.randint(0, 3, (count,), generator=g)
        vals = torch.where(pick == 0, rand_bits.view(dtype), normals)
        vals = torch.where(pick == 2, specials[torch.randint(0, len(specials), (count,), generator=g)], vals)
        buf = torch.empty(count + offset, dtype=dtype)
        buf[offset:] = vals
        out.append(buf[offset:])
    return out


@pytest.mark.parametrize("isa", VECTOR_ISAS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_path_writes_the_portable_bits(isa, dtype, op):
    g = torch.Generator().manual_seed(zlib.crc32(f"{isa} {dtype} {op}".encode()))
    for count in COUNTS:
        for nsrc in range(1, 9):
            offset = (count + nsrc) % 4
            srcs = random_sources(g, count, nsrc, dtype, offset)
            want = reduce_on("portable", srcs, op)
            assert_same_bits(reduce_on(isa, srcs, op), want, f"{isa} {dtype} {op} count={count} nsrc={nsrc}")


@pytest.mark.parametrize("isa", ["portable"] + VECTOR_ISAS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_path_matches_the_torch_reference(isa, dtype, op):
    g = torch.Generator().manual_seed(7 + OPS.index(op))
    for count in (17, 4099):
        for nsrc in (1, 2, 3, 8):
            srcs = random_sources(g, count, nsrc, dtype, offset=1)
            assert_matches_reference(reduce_on(isa, srcs, op), torch_reference(srcs, op),
                                     f"{isa} {dtype} {op} count={count} nsrc={nsrc}")


@pytest.mark.parametrize("isa", ["portable"] + VECTOR_ISAS)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_every_16bit_pattern_alone_and_with_partners(isa, dtype):
    every = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    partners = torch.cat([special_values(dtype), torch.tensor([1e-3, -7.0, 1e4]).to(dtype)])
    cases = [("SUM", [every])] + [(op, [every, p.expand(every.numel()).contiguous()]) for op in OPS for p in partners]
    for op, srcs in cases:
        got = reduce_on(isa, srcs, op)
        assert_same_bits(got, reduce_on("portable", srcs, op), f"{isa} {dtype} {op} partner={srcs[-1][0]}")
        assert_matches_reference(got, torch_reference(srcs, op), f"{isa} {dtype} {op} partner={srcs[-1][0]}")


@pytest.mark.parametrize("isa", ["portable"] + VECTOR_ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_round_to_even_and_overflow_reaches_infinity(isa, dtype):
    g = torch.Generator().manual_seed(11)
    a, b = rounding_ties(g, 4099, dtype)
    exact = a.double() + b.double()
    assert torch.all(exact.to(dtype).double() != exact), "every pair should need rounding"
    got = reduce_on(isa, [a, b], "SUM")
    assert_same_bits(got, torch_reference([a, b], "SUM"), f"{isa} {dtype} ties")
    assert torch.any(got != a) and torch.any(got == a), "ties should round both ways (to even)"
    big = torch.full((33,), torch.finfo(dtype).max, dtype=dtype)
    for op in ("SUM", "PRODUCT"):
        assert torch.all(reduce_on(isa, [big, big], op) == float("inf")), op
    if dtype == torch.float16:  # 65504 + 16 is the tie between 65504 and where infinity starts
        x, y = torch.full((17,), 65504.0, dtype=dtype), torch.full((17,), 16.0, dtype=dtype)
        assert torch.all(reduce_on(isa, [x, y], "SUM") == float("inf"))


@pytest.mark.parametrize("isa", ["portable"] + VECTOR_ISAS)
def test_destination_may_be_any_source(isa):
    g = torch.Generator().manual_seed(5)
    for dtype in DTYPES:
        for nsrc in (1, 2, 5):
            srcs = random_sources(g, 1000, nsrc, dtype, offset=3)
            for op in OPS:
                want = torch_reference(srcs, op)
                for k in range(nsrc):
                    copies = [s.clone() for s in srcs]
                    reduce_on(isa, copies, op, dst=copies[k])
                    assert_matches_reference(copies[k], want, f"{isa} {dtype} {op} dst=srcs[{k}] of {nsrc}")


@pytest.mark.parametrize("isa", ["portable"] + VECTOR_ISAS)
def test_avg_and_premul_sum_reduce_as_sum(isa):
    g = torch.Generator().manual_seed(3)
    for dtype in DTYPES:
        srcs = random_sources(g, 4099, 3, dtype, offset=0)
        want = reduce_on(isa, srcs, "SUM")
        for op in ("AVG", "PREMUL_SUM"):
            assert_same_bits(reduce_on(isa, srcs, op), want, f"{isa} {dtype} {op}")


def test_other_dtypes_and_ops_still_reduce():
    """Pairs without a vector path (integers, double, bitwise ops) take the portable one whatever
    the instruction set is asked for."""
    a = torch.arange(-500, 533, dtype=torch.int64)
    b = a.flip(0) * 3
    for isa in ISAS["available"]:
        assert torch.equal(reduce_on(isa, [a, b], "BXOR"), a ^ b)
        assert torch.equal(reduce_on(isa, [a.double(), b.double()], "SUM"), a.double() + b.double())
        assert torch.equal(reduce_on(isa, [a.int(), b.int()], "MIN"), torch.minimum(a, b).int())


def test_the_path_in_use_is_the_widest_this_cpu_has():
    assert ISAS["available"][0] == "portable"
    assert ISAS["used"] == ISAS["available"][-1]


def test_bad_calls_name_the_mismatch():
    x = torch.ones(8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="unknown instruction set 'sse9'"):
        _C._reduce_into_on(x, [x], "SUM", "sse9")
    with pytest.raises(ValueError, match="unknown reduce op"):
        _C._reduce_into_on(x, [x], "sum", "portable")
    with pytest.raises(ValueError, match="a source has dtype Float, dst BFloat16"):
        _C._reduce_into_on(x, [x, x.float()], "SUM", "portable")
    with pytest.raises(ValueError, match="a source has 7 elements, dst 8"):
        _C._reduce_into_on(x, [x, x[:7]], "SUM", "portable")
    with pytest.raises(ValueError, match="BXOR needs an integer or bool dtype"):
        _C._reduce_into_on(x, [x], "BXOR", "portable")
    for isa in ("avx2", "avx512"):
        if isa not in ISAS["available"]:
            with pytest.raises(ValueError, match=f"cannot run the {isa} reduction path"):
                _C._reduce_into_on(x, [x], "SUM", isa)


def _all_reduce_bits(rank, world, dtype, counts):
    g = torch.Generator().manual_seed(1000 + rank)
    results = []
    for count in counts:
        x = (torch.randn(count, generator=g) * 100).to(dtype)
        inputs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(inputs, x)
        dist.all_reduce(x)
        results.append((x, inputs))
    return results


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_on_real_ranks_gives_the_reference_bits(dtype):
    counts = (1, 33, 4099, 300_001)  # one-shot and reduce-scatter sized
    per_rank = run_ranks(_all_reduce_bits, 3, dtype, counts)
    for i, count in enumerate(counts):
        inputs = per_rank[0][i][1]
        want = torch_reference(inputs, "SUM")
        for rank in range(3):
            assert_same_bits(per_rank[rank][i][0], want, f"all_reduce {dtype} count={count} rank {rank}")
