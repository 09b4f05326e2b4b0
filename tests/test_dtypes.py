"""Exhaustive value tables and bit-for-bit agreement with torch's own small-float dtypes."""

import pytest
import torch

from anybit.errors import FormatError
from anybit.formats.dtypes import FloatSpecial, FloatType, IntType, TorchFloatType, parse_dtype

TORCH_FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "ue8m0": torch.float8_e8m0fnu}


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "ue8m0"])
def test_table_matches_torch_for_every_code(name):
    t = parse_dtype(name)
    codes = torch.arange(256, dtype=torch.uint8)
    ref = codes.view(TORCH_FP8[name]).double()
    ours = t.values()
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    finite = ~torch.isnan(ref)
    assert torch.equal(ours[finite], ref[finite])


def _random_floats(t, n=20000, seed=0):
    g = torch.Generator().manual_seed(seed)
    v = t.values()
    v = v[torch.isfinite(v)]
    # every value, every midpoint (ties), and random values across and beyond the range
    pos = torch.unique(v.abs())
    mids = (pos[1:] + pos[:-1]) / 2
    scale = torch.exp2(torch.randint(-20, 20, (n,), generator=g).double())
    rnd = torch.randn(n, generator=g, dtype=torch.float64) * scale
    x = torch.cat([v, mids, -mids, rnd, torch.tensor([0.0, -0.0, 1e30, -1e30], dtype=torch.float64)])
    return x.float()


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
def test_encode_matches_torch_rne_saturating(name):
    t = parse_dtype(name)
    x = _random_floats(t)
    ours = t.encode(x)
    # torch's e5m2 cast overflows to inf; anybit saturates, so compare against torch on clamped input
    ref = x.clamp(-t.max, t.max).to(TORCH_FP8[name]).view(torch.uint8)
    assert torch.equal(ours, ref)


def test_ue8m0_encode_matches_torch_in_fp32_normal_range():
    t = parse_dtype("ue8m0")
    x = _random_floats(t).abs()
    # torch treats fp32 subnormal inputs (< 2**-126) as if normal; compare where fp32 is normal
    x = x[(x >= 2.0**-126) & (x <= 2.0**127)]
    assert torch.equal(t.encode(x), x.to(torch.float8_e8m0fnu).view(torch.uint8))


def test_e2m1_table_matches_ocp():
    expect = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert parse_dtype("e2m1").values().tolist() == expect + [-v for v in expect]


@pytest.mark.skipif(not hasattr(torch, "float4_e2m1fn_x2"), reason="this torch has no float4_e2m1fn_x2")
def test_e2m1_agrees_with_torch_fp4_bits():
    # torch's fp4 dtype is a bit container (no arithmetic): check the nibble order of its packing
    t = parse_dtype("e2m1")
    codes = t.encode(torch.tensor([1.5, -6.0]))
    packed = (codes[0] | (codes[1] << 4)).reshape(1).view(torch.float4_e2m1fn_x2)
    assert packed.view(torch.uint8).item() == 0x3 | (0xF << 4)


@pytest.mark.parametrize("name", ["e2m1", "e2m2", "e2m3", "e3m2", "e3m3", "e4m2", "e3m4", "ue5m3", "ue4m4"])
def test_small_float_encode_is_nearest_ties_even(name):
    t = parse_dtype(name)
    x = _random_floats(t, n=5000).double()
    codes = t.encode(x)
    got = t.decode(codes).double()
    v = t.values()
    finite = v[torch.isfinite(v)]
    target = x.clamp(float(finite.min()), float(finite.max()))
    dist = (finite[None, :] - target[:, None]).abs()
    best = dist.min(dim=1).values
    assert torch.equal((got - target).abs(), best)
    # ties between two different values go to the even code
    near = dist == best[:, None]
    tie = torch.tensor([len(torch.unique(finite[row])) > 1 for row in near])
    assert bool((codes[tie].long() % 2 == 0).all())


@pytest.mark.parametrize("name", ["int2", "int4", "int8", "uint1", "uint5", "e2m1", "e3m2", "e4m3", "e5m2", "ue8m0"])
def test_decode_encode_round_trips_every_code(name):
    t = parse_dtype(name)
    v = t.values()
    finite = torch.isfinite(v)
    codes = torch.arange(t.num_codes)[finite]
    back = t.encode(v[finite].float())
    assert torch.equal(t.decode(back), v[finite].float())
    nonzero = v[finite] != 0  # +0 and -0 are both zero
    assert torch.equal(back[nonzero].long(), codes[nonzero])


def test_int_tables_and_saturation():
    assert IntType(4).values().tolist() == list(range(0, 8)) + list(range(-8, 0))
    assert IntType(3, signed=False).values().tolist() == list(range(8))
    t = IntType(4)
    assert t.decode(t.encode(torch.tensor([2.5, 3.5, -2.5, 100.0, -100.0]))).tolist() == [2, 4, -2, 7, -8]


def test_special_values():
    e5m2, e4m3 = parse_dtype("e5m2"), parse_dtype("e4m3")
    assert e5m2.special is FloatSpecial.IEEE and e4m3.special is FloatSpecial.FN
    assert e4m3.max == 448 and e5m2.max == 57344
    assert e4m3.encode(torch.tensor([float("inf")])).item() == 0x7E  # saturates
    assert torch.isnan(e4m3.decode(e4m3.encode(torch.tensor([float("nan")])))).all()
    with pytest.raises(FormatError, match="no NaN"):
        parse_dtype("e2m1").encode(torch.tensor([float("nan")]))


def test_names_round_trip_and_errors():
    for name in ["int4", "uint8", "e2m1", "e4m3", "e5m2", "ue8m0", "e4m3ieee", "e2m1fn", "bf16", "fp32"]:
        assert parse_dtype(name).name == name
    assert parse_dtype("fp4") == FloatType(2, 1)
    assert parse_dtype("fp16") == TorchFloatType("fp16")
    with pytest.raises(FormatError, match="allowed"):
        parse_dtype("int9")
    with pytest.raises(FormatError, match="sign\\+exp\\+man <= 8"):
        parse_dtype("e5m3")
    with pytest.raises(FormatError, match="unknown number format"):
        parse_dtype("nf5")
