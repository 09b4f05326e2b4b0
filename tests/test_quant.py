"""Reference quantization: nearest-value codes (error within half a step), scale recipes, errors."""

import pytest
import torch

from anybit import QuantizationError, QuantizedWeight, Scheme, quantize
from anybit.formats import ZeroPoint
from anybit.formats.dtypes import WEIGHT_DTYPE_NAMES, parse_dtype
from anybit.quant import dequantize_activation, quantize_activation


def _per_element(qw, per_block):
    bn, bk = qw.block
    return per_block.repeat_interleave(bn, dim=-2)[..., : qw.n, :].repeat_interleave(bk, dim=-1)


def _check_half_step(w, qw):
    """Each code is the value nearest to w/s (+z), so |w - deq| <= s * gap/2 plus any clipping."""
    table = qw.scheme.weight.values()
    table = torch.sort(table[torch.isfinite(table)]).values
    s = _per_element(qw, qw.scale_values().double())
    if qw.global_scale is not None:
        s = s * qw.global_scale.double()[..., None, None]
    z = _per_element(qw, qw.zero_values().double()) if qw.zeros is not None else 0.0
    w = w.double()
    t = torch.where(s > 0, w / torch.where(s > 0, s, 1.0) + z, torch.as_tensor(z, dtype=torch.float64))
    t_c = t.clamp(float(table[0]), float(table[-1]))
    hi = torch.searchsorted(table, t_c.flatten()).clamp(1, len(table) - 1)
    gap = (table[hi] - table[hi - 1]).reshape(t.shape)
    bound = s * (gap / 2 + (t - t_c).abs()) * (1 + 1e-6) + 1e-30
    err = (w - qw.dequantize().double()).abs()
    assert bool((err <= bound).all()), f"max excess {float((err - bound).max())}"


ALL_SCHEMES = [
    "w4a16",
    "w8a16",
    "w4a16-zp",
    "w2a16",
    "w3a16",
    "w4a8",
    "w8a8-fp8",
    "fp8-block",
    "nvfp4",
    "mxfp4",
    "mxfp6",
    "mxfp6-e3m2",
    "mxfp8",
    "w8a8-int8",
    "w5a16:int5:g32:fp32",
    "w6a16:int6:g64:fp16",
    "w7a16:uint7:g128:bf16:zp-int",
    "w1a16:uint1:g32:fp32:zp-int",
    "w4a16:uint4:g32:fp32:zp-float",
    "w4a16:e2m1:g32:bf16",
    "w5a16:e2m2:g64:fp32",
    "w7a16:e3m3:ch:fp32",
    "w8a16:e5m2:g128:bf16",
    "w8a16:int8:tensor:fp32",
    "w4a16:int4:b64x32:fp32",
    "w8a16:e3m4:g16:e5m2:gs",
]


@pytest.mark.parametrize("text", ALL_SCHEMES)
@pytest.mark.parametrize("shape", [(37, 256), (3, 24, 128)])
def test_error_within_half_step(text, shape):
    scheme = Scheme.parse(text)
    if scheme.granularity.block_shape(*shape[-2:])[1] > shape[-1]:
        shape = shape[:-1] + (256,)
    w = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 0.02
    qw = quantize(w, scheme)
    assert qw.dequantize().shape == w.shape
    _check_half_step(w, qw)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_input_dtypes_and_all_zero_groups(dtype):
    w = torch.randn(16, 256, dtype=dtype)
    w[3] = 0
    w[5, 128:] = 0
    for text in ["w4a16", "w4a16-zp", "nvfp4", "mxfp4", "fp8-block"]:
        qw = quantize(w, text)
        deq = qw.dequantize()
        assert torch.isfinite(deq).all() and torch.isfinite(qw.scale_values()).all()
        assert (deq[3] == 0).all() and (deq[5, 128:] == 0).all()
    assert (quantize(torch.zeros(8, 128), "nvfp4").dequantize() == 0).all()


def test_recipes():
    w = torch.randn(64, 256)
    mx = quantize(w, "mxfp4")
    amax = w.reshape(64, 8, 32).abs().amax(-1)
    assert torch.equal(mx.scale_values(), torch.exp2(torch.floor(torch.log2(amax)) - 2))  # e2m1 emax = 2
    nv = quantize(w, "nvfp4")
    assert torch.allclose(nv.global_scale, w.abs().max() / (6 * 448))
    blk = quantize(torch.randn(256, 256), "fp8-block")
    assert blk.scales.shape == (2, 2) and blk.scales.dtype == torch.float32
    zp = quantize(w, "w4a16-zp")
    assert zp.scheme.zero_point is ZeroPoint.INT and zp.zeros.dtype == torch.uint8


def test_clip_search_lowers_error():
    w = torch.randn(64, 512) * torch.rand(64, 512) ** 4  # heavy tails: clipping pays
    plain = (quantize(w, "w3a16").dequantize() - w).pow(2).sum()
    searched = (quantize(w, "w3a16", clip_search=True).dequantize() - w).pow(2).sum()
    assert searched < plain


def test_nbytes_and_codes():
    qw = quantize(torch.randn(32, 256), "w4a16")
    assert qw.nbytes == 32 * 256 // 2 + 32 * 2 * 2
    assert qw.codes().shape == (32, 256) and qw.codes().dtype == torch.uint8


def test_bad_input_errors():
    with pytest.raises(QuantizationError, match="K=200 is not a multiple of the group/block size 128"):
        quantize(torch.randn(8, 200), "w4a16")
    bad = torch.randn(8, 128)
    bad[1, 2] = float("nan")
    with pytest.raises(QuantizationError, match="NaN or Inf"):
        quantize(bad, "w4a16")
    with pytest.raises(QuantizationError, match="float tensor"):
        quantize(torch.randn(128), "w4a16")
    qw = quantize(torch.randn(8, 128), "w4a16")
    with pytest.raises(QuantizationError, match="scales has shape"):
        QuantizedWeight(qw.scheme, qw.shape, qw.qweight, qw.scales[:4])
    with pytest.raises(QuantizationError, match="zeros missing"):
        QuantizedWeight(Scheme.parse("w4a16-zp"), qw.shape, qw.qweight, qw.scales.half())


@pytest.mark.parametrize("act", ["e4m3-token", "e5m2-token", "e4m3-g128", "int8-token", "e4m3-static"])
def test_activation_quantization(act):
    spec = Scheme.parse(f"w4a8:int4:g128:bf16:{act}").act
    x = torch.randn(13, 256)
    x[4] = 0
    xq, scales = quantize_activation(x, spec, static_scale=0.05 if act.endswith("static") else None)
    back = dequantize_activation(xq, scales, spec)
    assert torch.isfinite(back).all() and (back[4] == 0).all()
    if act.endswith("static"):
        return
    rel = (back - x).norm() / x.norm()
    assert rel < {"e4m3": 0.04, "e5m2": 0.08, "int8": 0.01}[spec.dtype.name]
    # the row (group) max maps to the format's max: nothing saturates beyond it
    assert float(xq.float().abs().max()) == spec.dtype.max


def test_activation_errors():
    spec = Scheme.parse("fp8-block").act
    with pytest.raises(QuantizationError, match="K=200 is not a multiple of the activation group size 128"):
        quantize_activation(torch.randn(2, 200), spec)
    with pytest.raises(QuantizationError, match="static"):
        quantize_activation(torch.randn(2, 128), Scheme.parse("w8a8:e4m3:ch:fp32:e4m3-static").act)
    x = torch.randn(2, 128)
    x[0, 0] = float("inf")
    with pytest.raises(QuantizationError, match="NaN or Inf"):
        quantize_activation(x, Scheme.parse("w4a8").act)


@pytest.mark.parametrize("name", WEIGHT_DTYPE_NAMES)
def test_every_weight_dtype_within_half_step(name):

    t = parse_dtype(name)
    zp = ":zp-int" if name.startswith("uint") else ""
    w = torch.randn(19, 128, generator=torch.Generator().manual_seed(3))
    qw = quantize(w, f"w{t.bits}a16:{name}:g32:fp32{zp}")
    _check_half_step(w, qw)
