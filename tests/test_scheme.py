import json

import pytest

from anybit import PRESETS, Scheme, SchemeError
from anybit.formats import ActMode, ScaleKind, ZeroPoint


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_round_trip(name):
    s = Scheme.parse(name)
    assert Scheme.parse(str(s)) == s
    assert Scheme.from_dict(s.to_dict()) == s
    assert Scheme.from_json(json.dumps(s.to_dict())) == s


def test_preset_contents():
    nv = Scheme.parse("nvfp4")
    assert (nv.weight.name, nv.granularity.k, nv.scale_dtype.name, nv.global_scale) == ("e2m1", 16, "e4m3", True)
    mx = Scheme.parse("mxfp4")
    assert (mx.weight.name, mx.granularity.k, mx.scale_dtype.name) == ("e2m1", 32, "ue8m0")
    blk = Scheme.parse("fp8-block")
    assert blk.granularity.kind is ScaleKind.BLOCK and (blk.granularity.n, blk.granularity.k) == (128, 128)
    assert blk.act.mode is ActMode.GROUP and blk.act.group == 128
    w4a8 = Scheme.parse("w4a8")
    assert w4a8.act.mode is ActMode.TOKEN and w4a8.act.dtype.name == "e4m3"
    assert str(Scheme.parse("w8a8-fp8")) == "w8a8:e4m3:ch:fp32:e4m3-token"


@pytest.mark.parametrize(
    "text",
    [
        "w4a16:int4:g128:bf16",
        "w4a16:uint4:g64:fp16:zp-int",
        "w4a16:uint4:g32:bf16:zp-float",
        "w3a16:int3:ch:fp32",
        "w8a8:e4m3:tensor:fp32:e4m3-static",
        "w8a8:int8:ch:fp32:int8-token",
        "w4a8:e2m1:g16:e4m3:gs:e5m2-token",
        "w6a16:e3m2:b64x64:bf16",
    ],
)
def test_strings_round_trip(text):
    assert str(Scheme.parse(text)) == text


def test_prefix_fills_from_preset_and_aliases():
    assert str(Scheme.parse("w4a16:g64")) == "w4a16:int4:g64:bf16"
    assert str(Scheme.parse("w4a8:e2m1:g32:ue8m0:fp8-token")) == "w4a8:e2m1:g32:ue8m0:e4m3-token"
    assert Scheme.parse("W4A16") == Scheme.parse("w4a16")


@pytest.mark.parametrize(
    "text, match",
    [
        ("w4a16:int4:g100:bf16", "powers of two"),
        ("w4a16:int4:g128:int8", "scale dtype 'int8' is not allowed"),
        ("w4a16:int4:g128:bf16:zp-int", "unsigned integer weight"),
        ("w4a16:e2m1:g128:bf16:zp-int", "unsigned integer weight"),
        ("w4a16:int4:g128:bf16:gs", "8-bit float scales"),
        ("w8a16:int4:g128", "prefix w8a16 disagrees"),
        ("w4a16:int4:g128:bf16:e4m3-token", "disagrees"),
        ("w4a16:int4:g128:bf16:wat", "token 'wat'"),
        ("int4:g128", "must start with w<bits>a<bits>"),
        ("w4a12", "a12"),
        ("w4a8:int4:g128:bf16:int8-g128", "per token only"),
        ("w4a16:int4:g128:bf16:fp16:fp32", "more than two dtypes"),
    ],
)
def test_invalid_schemes_name_the_field(text, match):
    with pytest.raises(SchemeError, match=match):
        Scheme.parse(text)


def test_dict_errors():
    d = Scheme.parse("w4a16").to_dict()
    with pytest.raises(SchemeError, match="version"):
        Scheme.from_dict({**d, "version": 99})
    with pytest.raises(SchemeError, match="keys"):
        Scheme.from_dict({**d, "extra": 1})


def test_effective_bits():
    assert Scheme.parse("w4a16").effective_bits() == 4 + 16 / 128
    assert Scheme.parse("w4a16-zp").effective_bits() == 4 + (16 + 8) / 128
    assert Scheme.parse("mxfp4").effective_bits() == 4.25
    assert Scheme.parse("w8a16").effective_bits(k=8192) == 8 + 16 / 8192
    assert Scheme.parse("w4a16-zp").zero_point is ZeroPoint.INT
