"""The A16 Triton GEMM against float64 references built from dequantize(), every format family."""

import pytest
import torch

from anybit import prepare, quantize
from anybit.backends import get_backend
from anybit.kernels.gemm import GemmConfig, gemm_dense
from tests.tolerances import GEMM_REL_ERR, rel_err

FORMATS = [
    "w2a16:int2:g64:fp16",
    "w2a16:uint2:g64:fp16:zp-int",
    "w3a16:int3:g128:bf16",
    "w3a16",
    "w4a16",
    "w4a16-zp",
    "w4a16:uint4:g32:fp16:zp-float",
    "w5a16:int5:g32:fp32",
    "w5a16:uint5:g64:fp16:zp-int",
    "w8a16",
    "w8a16:uint8:g128:fp16:zp-int",
    "w4a16:e2m1:g64:bf16",
    "w6a16:e2m3:g32:fp16",
    "w6a16:e3m2:ch:bf16",
    "w8a16:e4m3:ch:fp32",
    "w8a16:e5m2:g128:fp16",
    "nvfp4",
    "mxfp4",
    "mxfp6",
    "w8a16:e4m3:b128x128:fp32",
    "w4a16:int4:tensor:fp32",
    "w7a16:int7:g64:bf16",
    "w1a16:uint1:g32:fp16:zp-int",
]


def _problem(text, m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    x = torch.randn(m, k, generator=g).half()
    qw = quantize(w, text)
    return x, qw, x.double() @ qw.dequantize().double().T


@pytest.mark.parametrize("text", FORMATS)
@pytest.mark.parametrize("m", [1, 13, 257])
def test_every_format_matches_dequantize(interpret, text, m):
    n, k = 40, 256  # N off every tile; K holds several groups and tiles
    x, qw, ref = _problem(text, m, n, k, seed=m)
    prepared = prepare(qw, backend="triton")
    y = get_backend("triton").gemm(x, prepared)
    assert y.dtype == torch.float16 and y.shape == (m, n)
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("text", ["nvfp4", "mxfp4", "w4a16"])
def test_bit_plane_kernel_for_fragment_formats(interpret, text):
    """4-bit formats run the frag kernel by default; the bit-plane kernel keeps them too (allow_frag=False)."""
    from anybit.backends.base import Prepared
    from anybit.backends.triton_layout import to_triton_layout

    x, qw, ref = _problem(text, 13, 40, 256, seed=3)
    tw = to_triton_layout(qw, allow_frag=False)
    assert not tw.frag
    y = get_backend("triton").gemm(x, Prepared("triton", qw, tw))
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize(
    "cfg", [GemmConfig(16, 32, 32, split_k=1), GemmConfig(16, 16, 64, split_k=3), GemmConfig(32, 32, 32, split_k=4)]
)
def test_tiles_split_k_poisoned_output_and_bias(interpret, cfg):
    x, qw, ref = _problem("w4a16:int4:g64:fp16", 13, 50, 192, seed=7)  # K=192: 3 groups, tile tails
    bias = torch.randn(50).half()
    tw = prepare(qw, backend="triton").data
    ws = torch.empty(cfg.split_k * 13 * 50)
    cnt = torch.zeros(64, dtype=torch.int32)
    for _ in range(2):  # the second call checks the counters were reset
        out = torch.full((13, 50), float("nan"), dtype=torch.float16)
        gemm_dense(x, tw, bias, config=cfg, workspace=ws, counters=cnt, out=out)
        assert not torch.isnan(out).any()
        assert rel_err(out, ref + bias.double()) < GEMM_REL_ERR[torch.float16]
    assert (cnt == 0).all()


def test_leading_dims_and_public_api(interpret):
    import anybit

    qw = quantize(torch.randn(24, 128), "mxfp4")
    x = torch.randn(2, 3, 128).half()
    y = anybit.gemm(x, anybit.prepare(qw))
    ref = x.double() @ qw.dequantize().double().T
    assert y.shape == (2, 3, 24) and rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize(
    "text", ["w3a16", "nvfp4", "mxfp6", "w4a16:uint4:g32:fp16:zp-float", "w8a16:e4m3:b128x128:fp32"]
)
def test_dequantize_kernel_matches_reference(interpret, text):
    from anybit.backends.triton_layout import to_triton_layout
    from anybit.kernels.dequant_a16 import dequantize_a16

    qw = quantize(torch.randn(70, 256), text)
    tw = to_triton_layout(qw, allow_frag=False)  # NVFP4 is frag by default: keep the bit-plane dequantizer tested
    wt = dequantize_a16(tw, dtype=torch.float16, block_k=32, block_n=32)
    assert torch.equal(wt.t(), qw.dequantize(torch.float16))
