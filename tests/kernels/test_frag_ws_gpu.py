"""The warp-specialised large-M Gluon kernel on a Hopper GPU: against float64 products of `dequantize()`,
awkward shapes (M, N off the tile, K off the 128-K block), every tile the chooser can pick, bias, poisoned
outputs, bit-equal relaunches."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import to_triton_layout
from anybit.kernels.frag_ws import frag_ws_weight_why_not, frag_ws_why_not, gemm_frag_ws
from tests.tolerances import GEMM_REL_ERR, rel_err

SM90_GPU = [  # the Gluon kernels' tests (also tests/kernels/test_frag_ws_a8_gpu.py)
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs sm_90"
    ),
]
pytestmark = SM90_GPU


def random_case(text, m, n, k, dtype=torch.bfloat16, seed=0):
    """x [M, K] in `dtype` and a weight [N, K] quantized to `text`, from one seeded CUDA generator."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    qw = quantize(torch.randn(n, k, generator=g, device="cuda") * 0.05, text)
    return torch.randn(m, k, generator=g, device="cuda").to(dtype), qw


def _case(text, m, n, k, dtype=torch.bfloat16, seed=0):
    x, qw = random_case(text, m, n, k, dtype, seed)
    return x, to_triton_layout(qw), x.double() @ qw.dequantize().double().T


@pytest.mark.parametrize("text, dtype", [("w4a16", torch.bfloat16), ("w4a16:int4:g128:fp16", torch.float16),
                                         ("w4a16:uint4:g128:bf16", torch.bfloat16),
                                         ("w4a16:int4:ch:bf16", torch.bfloat16),
                                         ("w4a16:int4:g256:bf16", torch.bfloat16)])  # fmt: skip
@pytest.mark.parametrize("m, n, k", [(1, 256, 512), (13, 4160, 1024), (257, 1000, 1536), (1024, 2048, 4224)])
def test_matches_the_exact_product(text, dtype, m, n, k):
    if "g256" in text:
        k = 2 * 1024
    x, tw, ref = _case(text, m, n, k, dtype, seed=m + n)
    assert frag_ws_why_not(tw.scheme, tw.k, dtype, x.device) is None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    y = gemm_frag_ws(x, tw, out=out)
    assert rel_err(y, ref) < GEMM_REL_ERR[dtype]
    assert torch.equal(y, gemm_frag_ws(x, tw))  # relaunch: the same bits


@pytest.mark.parametrize("text, dtype", [("w8a16", torch.bfloat16), ("w8a16:int8:g128:fp16", torch.float16),
                                         ("w8a16:uint8:g64:bf16", torch.bfloat16),
                                         ("w8a16:int8:ch:fp16", torch.float16)])  # fmt: skip
@pytest.mark.parametrize("m, n, k", [(1, 256, 512), (13, 4160, 1024), (257, 1000, 1472), (1024, 2048, 4224)])
@pytest.mark.parametrize("swap", [False, True])
def test_bytes_match_the_exact_product(text, dtype, m, n, k, swap):
    """8-bit integer codes (W8A16: a 64-K block of the layout is one K step, `_decode_bytes`), row-major and swapped
    tiles: K off the 128-K block (1472 = 23 blocks of 64; g128: 1408), N off the tile, bias, NaN-poisoned output,
    relaunch; two decoders (alternate blocks) give the same bits."""
    if k == 1472 and "g128" in text:
        k = 1408
    x, tw, ref = _case(text, m, n, k, dtype, seed=m + n)
    assert frag_ws_weight_why_not(tw, dtype, x.device) is None
    tile = dict(swap=True, block_m=96, block_n=64, stages=5) if swap else dict(block_m=128, stages=6)
    b = torch.randn(n, device="cuda").to(dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    y = gemm_frag_ws(x, tw, b, out=out, **tile)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[dtype]
    assert torch.equal(y, gemm_frag_ws(x, tw, b, **tile))  # relaunch: the same bits
    two = tile | dict(ndec=2, stages=4, dq_regs=96)  # (shared memory: each decoder has its word ring)
    assert torch.equal(y, gemm_frag_ws(x, tw, b, **two))


@pytest.mark.parametrize("m", [160, 200, 256])
def test_bytes_are_the_route_above_128_rows(m):
    """anybit.gemm of a W8A16 weight above the frag kernel's 128-token tiles takes this kernel where `ws_tile` has a
    tile (28672 rows: every M here, 160 a swapped tile of two decoders; not the register-operand kernel, which
    `rs_tile` gives no more than 128 rows of a weight this tall): a direct launch's bits."""
    from anybit.backends import get_backend
    from anybit.backends.base import Prepared
    from anybit.kernels.frag_rs import rs_tile
    from anybit.kernels.frag_ws import ws_tile

    x, qw = random_case("w8a16", m, 28672, 1024, seed=m)
    tw = to_triton_layout(qw)
    assert rs_tile(m, 28672, 1024, 132, bits=8) is None
    route = get_backend("triton").gemm(x, Prepared("triton", qw, tw))
    assert torch.equal(route, gemm_frag_ws(x, tw, **ws_tile(m, 28672, 132, 1024, bits=8)))
    assert rel_err(route, x.double() @ qw.dequantize().double().T) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("text", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", [(1, 256, 512), (13, 4160, 1024), (257, 1008, 2880), (1024, 2048, 4224)])
def test_e2m1_matches_the_exact_product(text, dtype, m, n, k):
    x, tw, ref = _case(text, m, n, k, dtype, seed=m + n)
    assert frag_ws_weight_why_not(tw, dtype, x.device) is None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    y = gemm_frag_ws(x, tw, b, out=out)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[dtype]
    assert torch.equal(y, gemm_frag_ws(x, tw, b))  # relaunch: the same bits


@pytest.mark.parametrize("tile", [dict(block_m=128, stages=6), dict(block_m=256, stages=4)])
@pytest.mark.parametrize("text, m", [("mxfp4", 512), ("nvfp4", 192), ("w4a16", 96), ("mxfp4", 128)])
def test_is_the_route_above_64_rows(monkeypatch, tile, text, m):
    """anybit.gemm of an NVFP4 / MXFP4 / W4A16 weight at M=96-512 runs this kernel (`ws_over_mid`; swapped tiles at
    65-256 rows of an 8192-row weight) where the register-operand kernel is off: the same bits as a direct launch."""
    monkeypatch.setenv("ANYBIT_FRAG_RS", "0")  # else `frag_rs.rs_tile` takes 65-192 rows here
    from anybit.backends import get_backend
    from anybit.backends.base import Prepared
    from anybit.kernels.frag_ws import ws_tile

    x, qw = random_case(text, m, 8192, 1024, seed=5)
    tw = to_triton_layout(qw)
    route = get_backend("triton").gemm(x, Prepared("triton", qw, tw))
    assert torch.equal(route, gemm_frag_ws(x, tw, **ws_tile(m, 8192, 132, 1024)))
    ref = x.double() @ qw.dequantize().double().T
    assert rel_err(gemm_frag_ws(x, tw, **tile), ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("m", [150, 200, 1000])
def test_fp8_codes_on_e2m1_weights(monkeypatch, m):
    """W4A8-NVFP4 (`codes_a16`: x's e4m3 codes in bf16, its scales per row after the MMA) above 128 rows runs this
    kernel where the register-operand kernel is off (150: a swapped tile of two accumulators and two decoders): the
    exact product of the quantizer's own x, the bits of a direct launch, relaunched alike."""
    monkeypatch.setenv("ANYBIT_FRAG_RS", "0")
    from anybit import prepare
    from anybit.backends import get_backend
    from anybit.kernels.frag_ws import ws_tile
    from anybit.kernels.quant_act import quantize_act
    from tests.kernels.test_gemm_a8 import a8_reference

    x, qw = random_case("w4a8-nvfp4", m, 8192, 2048, seed=m)
    p = prepare(qw, backend="triton")
    b = torch.randn(8192, device="cuda").bfloat16()
    y = get_backend("triton").gemm(x, p, b)
    assert rel_err(y, a8_reference(x, qw) + b.double()) < GEMM_REL_ERR[torch.bfloat16]
    xq, xs = quantize_act(x, qw.scheme.act, codes_dtype=torch.bfloat16)
    assert torch.equal(y, gemm_frag_ws(xq, p.data, b, x_scales=xs, **ws_tile(m, 8192)))
    assert torch.equal(y, get_backend("triton").gemm(x, p, b))


def test_k_tail_half_a_block_and_channel_scales():
    x, tw, ref = _case("w4a16:int4:ch:bf16", 300, 1000, 2880)  # 2880 = 22.5 blocks of 128
    assert rel_err(gemm_frag_ws(x, tw), ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("tile", [dict(stages=3), dict(stages=4), dict(group_m=1), dict(block_m=128),
                                  dict(block_m=128, stages=6), dict(block_m=128, block_n=256, stages=3)])  # fmt: skip
def test_every_tile(tile):
    x, tw, ref = _case("w4a16", 777, 3000, 2048, seed=3)
    b = torch.randn(3000, device="cuda").bfloat16()
    y = gemm_frag_ws(x, tw, b, **tile)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("text", ["w4a16", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("tile", [dict(block_m=64, block_n=64), dict(block_m=96, block_n=64),
                                  dict(block_m=128, block_n=64, stages=6), dict(block_m=160, block_n=64),
                                  dict(block_m=192, block_n=64, stages=6), dict(block_m=192, block_n=128),
                                  dict(block_m=256, block_n=64), dict(block_m=128, block_n=128, stages=6)])  # fmt: skip
def test_every_swapped_tile(text, tile):
    """The weight tile as the wgmma's A operand (`frag_ws_swap_kernel`): M off every tile (two token tiles and a
    part), N off the 64-row tile, K off the block, bias, NaN-poisoned output, bit-equal relaunch."""
    x, tw, ref = _case(text, 333, 1040, 1664, seed=7)
    b = torch.randn(1040, device="cuda").bfloat16()
    out = torch.full((333, 1040), float("nan"), device="cuda", dtype=torch.bfloat16)
    tile = dict(stages=4) | tile
    y = gemm_frag_ws(x, tw, b, out=out, swap=True, **tile)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y, gemm_frag_ws(x, tw, b, swap=True, **tile))


@pytest.mark.parametrize("text", ["w4a16", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("tile", [dict(swap=True, block_m=96, block_n=64, stages=5, dq_regs=96),
                                  dict(swap=True, block_m=192, block_n=64, stages=5, dq_regs=96),
                                  dict(swap=True, block_m=192, block_n=128, depth=2, dq_regs=80),
                                  dict(block_m=256, block_n=128, stages=3, depth=2, dq_regs=80)])  # fmt: skip
@pytest.mark.parametrize("k", [1664, 128])
def test_two_decoders(text, tile, k):
    """Two decoder partitions taking alternate 128-K blocks (`ndec=2`; K = 13 blocks, and 1: the second has none):
    the exact product, and the bits of one decoder (the same decode and accumulation order)."""
    x, tw, ref = _case(text, 333, 1040, k, seed=k)
    out = torch.full((333, 1040), float("nan"), device="cuda", dtype=torch.bfloat16)
    tile = dict(stages=4) | tile
    y = gemm_frag_ws(x, tw, out=out, ndec=2, **tile)
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y, gemm_frag_ws(x, tw, ndec=1, **tile))


def test_not_taken_with_a_reason():
    x, tw, _ = _case("w4a16:uint4:g128:fp16:zp-int", 16, 256, 512, torch.float16)
    assert "zero points" in frag_ws_why_not(tw.scheme, tw.k, torch.float16, x.device)
    x, tw, _ = _case("w4a16", 16, 256, 512)
    assert "scales in x's dtype" in frag_ws_why_not(tw.scheme, tw.k, torch.float16, x.device)
