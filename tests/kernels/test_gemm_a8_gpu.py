"""FP8 activations on the GPU: bitwise quantizer, bf16 GEMMs at real sizes, CUDA-graph replay."""

import pytest
import torch

from anybit import prepare, quantize
from anybit.backends import get_backend
from anybit.formats.scheme import ActMode, Scheme
from anybit.kernels.quant_act import quantize_act
from anybit.quant.activations import quantize_activation
from tests.kernels.test_gemm_a8 import A8_FORMATS, a8_reference
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("text", ["w8a8-fp8", "fp8-block", "w8a8:e5m2:ch:bf16:e5m2-token"])
@pytest.mark.parametrize("m, k", [(33, 4096), (1, 28672), (16, 7168), (200, 8192), (300, 7168), (5, 40064)])
@pytest.mark.parametrize("split", [0, 128])
def test_quantizer_is_bitwise_the_reference(monkeypatch, text, m, k, split):
    """Rows read in one step (decode, up to 32768 long; past the decode up to 8192 long, `quantize_rows`) and in steps
    (more rows, longer rows) alike; `split`: a row over several programs (`SPLIT_MAX_M`)."""
    from anybit.kernels import quant_act

    monkeypatch.setattr(quant_act, "SPLIT_MAX_M", split)
    spec = Scheme.parse(text).act
    x = torch.randn(m, k, device="cuda").bfloat16() * 5
    x[m // 2] = 0
    xq, xs = quantize_act(x, spec)
    rq, rs = quantize_activation(x, spec)
    assert torch.equal(xs, rs) and torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))
    if spec.mode is ActMode.TOKEN:  # the frag kernel's block sums agree with the codes
        _, _, sums = quantize_act(x, spec, block_sums=True)
        ref = torch.nn.functional.pad(rq.float(), (0, -k % 128)).reshape(m, -1, 128).sum(-1).T
        assert torch.allclose(sums, ref, rtol=1e-6, atol=1e-3)


@pytest.mark.parametrize("m, k", [(300, 4096), (200, 8192), (300, 7168)])
def test_blockwise_quantizer_is_bitwise_the_reference(m, k):
    """FP8-block's 1x128 x scales M-major, as the block-scaled cuBLAS route reads them (past the decode, K a power of
    two: `quantize_rows`' per-group form; else `_quant_act_kernel`): the reference's codes and scales."""
    spec = Scheme.parse("fp8-block").act
    x = torch.randn(m, k, device="cuda").bfloat16() * 5
    x[m // 2, :256] = 0
    xq, xs = quantize_act(x, spec, blockwise=True)
    rq, rs = quantize_activation(x, spec)
    assert xs.stride() == (1, m) and torch.equal(xs, rs)
    assert torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))


@pytest.mark.parametrize("text", A8_FORMATS)
@pytest.mark.parametrize("m", [1, 13, 100, 257, 2048])  # 100: the codes path's 128-token tiles
def test_bf16_every_fp8_scheme(text, m):
    g = torch.Generator(device="cuda").manual_seed(m)
    w = torch.randn(1000, 4096, generator=g, device="cuda") * 0.05
    x = torch.randn(m, 4096, generator=g, device="cuda").bfloat16()
    qw = quantize(w, text)
    p = prepare(qw, backend="triton")
    y = get_backend("triton").gemm(x, p)
    assert y.dtype == torch.bfloat16
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y, get_backend("triton").gemm(x, p))  # relaunch: bit for bit


@pytest.mark.parametrize("text", ["w4a8", "w4a8-mxfp4"])
@pytest.mark.parametrize("m", [1, 64])
def test_fp8_cuda_graph_replay(text, m):
    qw = quantize(torch.randn(4096, 4096, device="cuda") * 0.02, text)
    p = prepare(qw, backend="triton")
    be = get_backend("triton")
    static_x = torch.randn(m, 4096, device="cuda").bfloat16()
    be.gemm(static_x, p)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = be.gemm(static_x, p)
    for _ in range(3):
        static_x.copy_(torch.randn(m, 4096, device="cuda").bfloat16())
        graph.replay()
        assert rel_err(y, a8_reference(static_x, qw)) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("m", [1, 16, 64, 100])
def test_mxfp4_under_fp8_x_on_the_fp8_mma_matches_the_codes_path(monkeypatch, m):
    """MXFP4 under e4m3 x: the FP8 MMA on look-up-table e4m3 weights (`e2m1_a8`) against x's codes on the A16 MMA
    (ANYBIT_E2M1_A8=0), both against the product of the quantized x; N and K off the tiles."""
    g = torch.Generator(device="cuda").manual_seed(m)
    qw = quantize(torch.randn(3000, 5120 + 96, generator=g, device="cuda") * 0.05, "w4a8-mxfp4")
    x = torch.randn(m, qw.shape[1], generator=g, device="cuda").bfloat16()
    lut = prepare(qw, backend="triton")
    monkeypatch.setenv("ANYBIT_E2M1_A8", "0")
    codes = prepare(qw, backend="triton")
    assert lut.data.e2m1_a8 and codes.data.codes_a16
    ref = a8_reference(x, qw)
    be = get_backend("triton")
    for p in (lut, codes):
        assert rel_err(be.gemm(x, p), ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("m", [1, 128, 256])
def test_mxfp4_on_the_fp8_mma_accumulating_the_whole_k_stays_as_exact(monkeypatch, m):
    """e2m1 under e4m3 x with the FP8 MMA accumulating all of a long K (`frag.A8_MMA_ACC`, the 128/256-token tiles
    from M = 65) against a product per 128-K block added in fp32: both within the bf16 budget of the exact product,
    the whole-K one at most 1.5x the other's error (the MMA's accumulator is not plain fp32). The register-operand
    stream-K form, which takes such a weight at 65-256 rows by default, is off: the frag kernel's tiles run."""
    from anybit.kernels import frag

    monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", "0")
    g = torch.Generator(device="cuda").manual_seed(7 + m)
    qw = quantize(torch.randn(4096, 28672, generator=g, device="cuda") * 0.05, "w4a8-mxfp4")
    x = torch.randn(m, qw.shape[1], generator=g, device="cuda").bfloat16()
    ref, be = a8_reference(x, qw), get_backend("triton")
    errs = {}
    for acc in (True, False):
        monkeypatch.setattr(frag, "A8_MMA_ACC", acc)
        p = prepare(qw, backend="triton")  # its tile per M is picked (and kept) under this setting
        y = be.gemm(x, p)
        errs[acc] = rel_err(y, ref)
        assert torch.equal(y, be.gemm(x, p)), "a relaunch must give the same bits"
    assert max(errs.values()) < GEMM_REL_ERR[torch.bfloat16] and errs[True] <= 1.5 * errs[False] + 1e-4, errs


@pytest.mark.parametrize("m", [150, 192])
def test_three_64_token_tiles_on_one_decode_in_bf16(monkeypatch, m):
    """`FRAG_SUBS` (block_m 192: three 64-token tiles against one decode) gives the bits of 64-token tiles of the
    same warps launched apart, and the route that takes it (129-192 rows, many weight tiles) is within budget and
    relaunches bit for bit (the register-operand stream-K form, the default there, off)."""
    from anybit.kernels import frag
    from anybit.kernels.frag import gemm_frag

    monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", "0")
    g = torch.Generator(device="cuda").manual_seed(m)
    qw = quantize(torch.randn(16384 + 64, 8192 + 96, generator=g, device="cuda") * 0.05, "w4a8-mxfp4")  # many N tiles
    x = torch.randn(m, qw.shape[1], generator=g, device="cuda").bfloat16()
    p, be = prepare(qw, backend="triton"), get_backend("triton")
    xq, xs = quantize_act(x, qw.scheme.act)
    kw = dict(block_n=128, num_warps=8, num_stages=3, x_scales=xs, out_dtype=torch.bfloat16)
    y = gemm_frag(xq, p.data, block_m=192, **kw)
    assert torch.equal(y, gemm_frag(xq, p.data, block_m=64, **kw))
    monkeypatch.setattr(frag, "FRAG_SUBS", True)
    routed = prepare(qw, backend="triton")
    y = be.gemm(x, routed)
    assert routed.data.configs[m].block_m == 192 and torch.equal(y, be.gemm(x, routed))
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]


def test_static_scale_quantizer_and_gemm_in_a_graph():
    """Static scales: the quantizer is bitwise the reference; the torch backend's `_scaled_mm` path
    and the Triton kernel agree; the call captures (the scale is read on the device)."""
    from tests.kernels.test_gemm_a8 import STATIC

    qw = quantize(torch.randn(4096, 4096, device="cuda") * 0.02, STATIC[0], input_scale=4.0 / 448)
    x = torch.randn(16, 4096, device="cuda").bfloat16()
    xq, xs = quantize_act(x, qw.scheme.act, qw.input_scale)
    rq, rs = quantize_activation(x, qw.scheme.act, qw.input_scale)
    assert torch.equal(xq.view(torch.uint8), rq.view(torch.uint8)) and torch.equal(xs[:, 0], rs.expand(16))
    p, be = prepare(qw, backend="triton"), get_backend("triton")
    y = be.gemm(x, p)
    assert rel_err(y, get_backend("torch").gemm(x, prepare(qw, backend="torch"))) < GEMM_REL_ERR[torch.bfloat16]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = be.gemm(x, p)
    graph.replay()
    assert torch.equal(yg, y)


@pytest.mark.parametrize("m", [1, 13])
def test_fp8_decode_deep_k_tiles(m):
    """The 256-deep decode tile on FP8 weights as stored (`a8_config`), N and K off the tile, against the reference."""
    from anybit.backends.triton import pick_config

    g = torch.Generator(device="cuda").manual_seed(m)
    qw = quantize(torch.randn(4000, 16640, generator=g, device="cuda") * 0.05, "w8a8-fp8")
    x = torch.randn(m, 16640, generator=g, device="cuda").bfloat16()
    c = pick_config(m, 4000, 16640, qw.scheme, torch.cuda.get_device_properties(0).multi_processor_count, False, True)
    assert c.block_k == 256
    p = prepare(qw, backend="triton")
    y = get_backend("triton").gemm(x, p)
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y, get_backend("triton").gemm(x, p))


@pytest.mark.parametrize("n, k", [(4096, 4096), (6144, 4096), (4096, 14336)])
@pytest.mark.parametrize("m", [1, 16, 48, 64, 100, 160, 256, 600, 2048])
def test_int4_w4a8_as_codes(monkeypatch, n, k, m):
    """ANYBIT_W4A8_CODES=1 (int4 W4A8, N < 8192, on the A16 kernels: frag decode, register-operand and
    warp-specialised kernels with x's row scales, the block-scaled GEMM from the A16 order above 1024 rows): within
    the bf16 budget of the product of the quantized x and the bf16-rounded scales, bit for bit relaunched and under a
    CUDA graph."""
    import dataclasses

    monkeypatch.setenv("ANYBIT_W4A8_CODES", "1")
    g = torch.Generator(device="cuda").manual_seed(m + n)
    qw = quantize(torch.randn(n, k, generator=g, device="cuda") * 0.05, "w4a8")
    x = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    p = prepare(qw, backend="triton")
    assert p.data.codes_a16 and p.data.a16 is not None
    y = get_backend("triton").gemm(x, p)
    rounded = dataclasses.replace(qw, scales=qw.scales.to(torch.bfloat16).to(qw.scales.dtype))
    assert rel_err(y, a8_reference(x, rounded)) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y, get_backend("triton").gemm(x, p))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = get_backend("triton").gemm(x, p)
    graph.replay()
    assert torch.equal(yg, y)
