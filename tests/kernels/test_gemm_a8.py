"""FP8 activations in the Triton backend: the quantizer against the reference, the GEMM against float64
references built from the kernel's own quantized activations (the interpreter's fp32 -> fp8 rounding
misses a few carries, so the quantizer is held bitwise only on the GPU), and honest refusals."""

import pytest
import torch

from anybit import prepare, quantize
from anybit.backends import get_backend
from anybit.backends.base import Problem
from anybit.backends.registry import choose, explain
from anybit.formats.scheme import Scheme
from anybit.kernels.dequant import cdiv
from anybit.kernels.quant_act import quantize_act
from anybit.quant.activations import dequantize_activation, quantize_activation
from tests.tolerances import GEMM_REL_ERR, rel_err

A8_FORMATS = [
    "w4a8",  # int4 g128, e4m3 per token
    "w8a8-fp8",  # e4m3 weights (bytes fed to the dot as they are), per channel
    "fp8-block",  # e4m3 128x128 blocks, e4m3 per token and group of 128
    "w4a8-mxfp4",  # e2m1 g32 ue8m0 (e4m3 by look-up tables on the FP8 MMA, `e2m1_a8`)
    "w4a8-nvfp4",  # e2m1 g16 e4m3 + global scale, FP8 x (codes on the A16 kernels)
    "w4a8:uint4:g64:fp16:zp-int:e4m3-token",
    "w4a8:e2m1:g64:bf16:e5m2-token",
    "w6a8:e3m2:ch:bf16:e4m3-token",
    "w4a8:int4:g128:bf16:e4m3-g128",
]
REFUSED = {
    "w4a8:int4:g16:bf16:e4m3-token": "every 16 along K",
    "w8a8:int8:ch:bf16:e4m3-token": "not exact in e4m3",
    "w4a8:int4:g128:bf16:int8-token": "int8 activations",
    "w4a8:uint4:g64:fp16:zp-float:e4m3-token": "float zero point",
}


def a8_reference(x, qw):
    """float64 x_q·s_x @ dequantize(W)^T with the kernel's own quantized activations."""
    xq, xs = quantize_act(x, qw.scheme.act, qw.input_scale)
    return dequantize_activation(xq, xs, qw.scheme.act).double() @ qw.dequantize().double().T


@pytest.mark.parametrize("text", ["w8a8-fp8", "fp8-block", "w8a8:e5m2:ch:bf16:e5m2-token"])
@pytest.mark.parametrize("m, k", [(7, 384), (3, 5120), (130, 4224)])  # one step; a wide row in one; steps
def test_quantizer_matches_reference(interpret, text, m, k):
    spec = Scheme.parse(text).act
    x = torch.randn(m, k).half() * 3
    x[2] = 0  # a zero row: the smallest scale, zero codes, no NaN
    xq, xs = quantize_act(x, spec)
    rq, rs = quantize_activation(x, spec)
    assert xq.dtype == rq.dtype and torch.equal(xs, rs)
    assert (xq[2].float() == 0).all() and not torch.isnan(xq.float()).any()
    # equal, but for the interpreter's fp32 -> fp8 conversion: it drops a rounding carry into the
    # exponent (127.4 -> 64, not 128) and breaks some ties the other way (168 -> 176, not 160); the GPU
    # test holds the quantizer bit for bit
    a, r = xq.float(), rq.float()
    binade = 2.0 ** torch.log2(r.abs().clamp(min=2.0**-9)).floor()
    lost_carry = (r.abs() == binade) & (a == r / 2)
    tie = (a - r).abs() == binade * 2.0**-spec.dtype.man
    # ... and rounds subnormal results by up to one step (0.00194 -> 0, not 2**-9: ~6 % of random inputs)
    min_normal = 2.0 ** (2 - 2 ** (spec.dtype.exp - 1))
    subnormal = (r.abs() < min_normal) & ((a - r).abs() <= min_normal * 2.0**-spec.dtype.man)
    assert ((a == r) | lost_carry | tie | subnormal).all()


@pytest.mark.parametrize("text", ["w8a8-fp8", "fp8-block"])
def test_quantizer_writes_cublas_blockwise_scales(interpret, text):
    """blockwise=True: the same codes, scales [M, K/128] with strides (1, M) (per-token ones repeated
    per 128 columns) — what cuBLAS's 1x128 block-scaled GEMM reads; bad specs / K are named."""
    spec = Scheme.parse(text).act
    x = torch.randn(9, 640).half() * 3
    xq, xs = quantize_act(x, spec)
    bq, bs = quantize_act(x, spec, blockwise=True)
    assert torch.equal(bq.float(), xq.float()) and bs.shape == (9, 5) and bs.stride() == (1, 9)
    assert torch.equal(bs, xs.expand(9, 5) if xs.shape[1] == 1 else xs)
    with pytest.raises(ValueError, match="K=600"):
        quantize_act(x[:, :600], spec, blockwise=True)


@pytest.mark.parametrize("text", A8_FORMATS)
@pytest.mark.parametrize("m", [1, 13, 257])
def test_every_fp8_scheme_matches_reference(interpret, text, m):
    g = torch.Generator().manual_seed(m)
    w = torch.randn(40, 256, generator=g) * 0.05
    x = torch.randn(m, 256, generator=g).half()
    qw = quantize(w, text)
    p = prepare(qw, backend="triton")
    assert p.backend == "triton"
    y = get_backend("triton").gemm(x, p)
    assert y.dtype == torch.float16 and y.shape == (m, 40)
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("text", ["w4a8", "w4a8:int4:ch:fp32:e4m3-token", "w4a8:int4:g256:bf16:e4m3-token"])
@pytest.mark.parametrize("m", [1, 13, 100, 257])  # decode, split-K, the 128-token mid tile, dequantize + matmul
def test_int4_w4a8_as_codes_on_the_a16_kernels(interpret, monkeypatch, text, m):
    """ANYBIT_W4A8_CODES=1: int4 W4A8 weights with N < 8192 are laid out for the A16 kernels (their scales rounded
    once to bf16) and take x's e4m3 codes in x's dtype, x's scales per row after the MMA: against the product of the
    kernel's own quantized x and bf16-rounded scales within the fp16 budget, against the exact scales within bf16's;
    N off the tile, a bias; off (the default), the FP8 MMA's layout."""
    import dataclasses

    g = torch.Generator().manual_seed(m)
    w = torch.randn(200, 512, generator=g) * 0.05
    x = torch.randn(m, 512, generator=g).half()
    b = torch.randn(200, generator=g).half()
    qw = quantize(w, text)
    assert not prepare(qw, backend="triton").data.codes_a16  # off by default
    monkeypatch.setenv("ANYBIT_W4A8_CODES", "1")
    p = prepare(qw, backend="triton")
    tw = p.data
    assert tw.codes_a16 and not tw.mma_a8 and tw.a16 is not None and tw.scales.dtype == torch.bfloat16
    y = get_backend("triton").gemm(x, p, b)
    rounded = dataclasses.replace(qw, scales=qw.scales.to(torch.bfloat16).to(qw.scales.dtype))
    assert rel_err(y, a8_reference(x, rounded) + b.double()) < GEMM_REL_ERR[torch.float16]
    assert rel_err(y, a8_reference(x, qw) + b.double()) < GEMM_REL_ERR[torch.bfloat16]
    assert not prepare(quantize(torch.randn(8192, 256) * 0.05, text), backend="triton").data.codes_a16  # N >= 8192


def test_int4_w4a8_codes_pass_for_the_block_scaled_gemm(interpret, monkeypatch):
    """Above ANYBIT_FRAG_WS_MAX_M rows the codes weights take cuBLAS's block-scaled FP8 GEMM (a GPU): their e4m3
    integers come from the A16 order scaled by ones — the same as the FP8 layout's codes pass."""
    from anybit.backends.triton_layout import to_triton_layout
    from anybit.kernels.frag_dequant import dequantize_frag

    qw = quantize(torch.randn(208, 512) * 0.05, "w4a8")  # (cuBLAS's recipe: N a multiple of 16)
    fp8 = to_triton_layout(qw)
    monkeypatch.setenv("ANYBIT_W4A8_CODES", "1")
    codes = to_triton_layout(qw, allow_int4_codes=True)
    assert codes.blockscaled == fp8.blockscaled == "1x128"
    assert torch.equal(codes.blockscaled_scales, fp8.blockscaled_scales)  # from the exact fp32 scales
    a = dequantize_frag(fp8, dtype=torch.float8_e4m3fn).float()
    assert torch.equal(dequantize_frag(codes, dtype=torch.float8_e4m3fn, scales=codes.unit_scales).float(), a)


@pytest.mark.parametrize("lut", [True, False])
@pytest.mark.parametrize("m", [1, 13])
def test_mxfp4_under_fp8_x_on_either_mma(interpret, monkeypatch, lut, m):
    """MXFP4 under e4m3 x per token: on the FP8 MMA with e4m3 weights from look-up tables (`e2m1_a8`, the default)
    or with x's codes on the A16 MMA (ANYBIT_E2M1_A8=0); K off the 128-K block, N off the tile, a bias."""
    monkeypatch.setenv("ANYBIT_E2M1_A8", "1" if lut else "0")
    g = torch.Generator().manual_seed(m)
    qw = quantize(torch.randn(72, 352, generator=g) * 0.05, "w4a8-mxfp4")
    x = torch.randn(m, 352, generator=g).half()
    bias = torch.randn(72, generator=g).half()
    p = prepare(qw, backend="triton")
    assert p.data.e2m1_a8 == lut and p.data.codes_a16 != lut
    y = get_backend("triton").gemm(x, p, bias)
    assert rel_err(y, a8_reference(x, qw) + bias.double()) < GEMM_REL_ERR[torch.float16]


def test_mxfp4_rows_spanning_11_binades_on_the_fp8_mma(interpret):
    """Every look-up table the FP8 path builds (groups 0-11 binades below their row's largest) through the kernel."""
    g = torch.Generator().manual_seed(7)
    w = (torch.rand(40, 12 * 32, generator=g) * 1.9 - 0.95) * 0.05
    w[:, ::32] = 0.05
    w = w * (2.0 ** -torch.arange(12).repeat_interleave(32))[None, :]
    qw = quantize(w, "w4a8-mxfp4")
    p = prepare(qw, backend="triton")
    assert p.data.e2m1_a8
    x = torch.randn(5, 12 * 32, generator=g).half()
    assert rel_err(get_backend("triton").gemm(x, p), a8_reference(x, qw)) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("text, why", REFUSED.items())
def test_inexact_fp8_schemes_are_refused_with_a_reason_and_fall_back(interpret, text, why):
    problem = Problem(Scheme.parse(text), 64, 256, 1, torch.device("cpu"))
    rows = dict((name, (ok, reason)) for name, ok, reason in explain(problem))
    assert rows["triton"][0] is False and why in rows["triton"][1]
    assert choose(problem).name == "torch"


STATIC = ["w8a8:e4m3:ch:fp32:e4m3-static", "w4a8:int4:g128:bf16:e4m3-static", "w8a8:e4m3:tensor:fp32:e4m3-static"]


@pytest.mark.parametrize("text", STATIC)
@pytest.mark.parametrize("m", [1, 13])
def test_static_activation_scales(interpret, text, m):
    """A calibrated input scale carried with the weight: the Triton kernel and the torch backend (its
    `_scaled_mm` path for FP8 channel/tensor weights) agree with the reference; values beyond the
    calibrated range saturate."""
    g = torch.Generator().manual_seed(m)
    w = torch.randn(48, 256, generator=g) * 0.05
    x = torch.randn(m, 256, generator=g).half()
    x[0, :3] = torch.tensor([40.0, -40.0, 0.0])  # past the calibrated range: saturates at +-448 * s
    qw = quantize(w, text, input_scale=3.0 / 448)
    assert qw.input_scale.shape == () and qw.input_scale.dtype == torch.float32
    y = get_backend("triton").gemm(x, prepare(qw, backend="triton"))
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.float16]
    rq, rs = quantize_activation(x, qw.scheme.act, qw.input_scale)
    assert float(dequantize_activation(rq, rs, qw.scheme.act)[0, 0]) == 3.0  # saturated
    ref = dequantize_activation(rq, rs, qw.scheme.act).double() @ qw.dequantize().double().T
    assert rel_err(get_backend("torch").gemm(x, prepare(qw, backend="torch")), ref) < GEMM_REL_ERR[torch.float16]


def test_static_scheme_without_input_scale_says_what_is_missing(interpret):
    from anybit.errors import QuantizationError

    qw = quantize(torch.randn(48, 256), "w8a8:e4m3:ch:fp32:e4m3-static")
    for backend in ("triton", "torch"):
        with pytest.raises(QuantizationError, match="no input_scale.*checkpoint"):
            get_backend(backend).gemm(torch.randn(2, 256).half(), prepare(qw, backend=backend))
    with pytest.raises(QuantizationError, match="positive and finite"):
        quantize(torch.randn(48, 256), "w8a8:e4m3:ch:fp32:e4m3-static", input_scale=float("nan"))
    with pytest.raises(QuantizationError, match="input_scale given"):
        quantize(torch.randn(48, 256), "w8a8-fp8", input_scale=0.1)


@pytest.mark.parametrize(
    ("text", "m", "n", "k", "block_k"),
    [
        ("w8a8-fp8", 1, 28672, 8192, 256),  # one K range a CTA: 256-deep tiles
        ("w8a8-fp8", 16, 8192, 28672, 256),  # split 4, 7168 K a split
        ("w8a8-fp8", 1, 4096, 4096, 128),  # split 8: 512 K a split, too short for 256-deep tiles
        ("w8a8-fp8", 64, 28672, 8192, 128),  # M = 64: the prefill-side tile
        ("fp8-block", 1, 28672, 8192, 128),  # per-tile scales: K tiles stay within a 128 group
    ],
)
def test_fp8_decode_tiles_go_deep_on_long_k(text, m, n, k, block_k):
    """Decode on FP8 weights read as stored takes 256-deep K tiles of 3 stages where each split walks >= 2048 K."""
    from anybit.backends.triton import pick_config

    c = pick_config(m, n, k, Scheme.parse(text), 132, interpret=False, nk=True)
    assert c.block_k == block_k and (c.num_stages == 3 or block_k == 128)


@pytest.mark.parametrize(
    ("m", "n", "k", "tile"),
    [
        (16, 8192, 8192, (16, 128, 4)),  # decode tiles as before
        (96, 8192, 8192, (128, 128, 8)),  # few weight tiles: 128 x 128 capped at 128 registers, two CTAs an SM
        (128, 28672, 8192, (128, 128, 8)),  # 128 tokens x 128 rows, one wave
        (200, 28672, 8192, (256, 128, 8)),  # above 128 rows: 256-token tiles
    ],
)
def test_mxfp4_on_the_fp8_mma_takes_token_tiles_of_128_and_256(monkeypatch, m, n, k, tile):
    """e2m1 under FP8 x accumulating the whole K in the MMA (`frag.A8_MMA_ACC`) fits 128/256-token tiles (one
    accumulator); with a product per block added in fp32 it keeps the 64-token tiles (two accumulators spill)."""
    from anybit.backends.triton import pick_config
    from anybit.kernels import frag

    c = pick_config(m, n, k, Scheme.parse("w4a8-mxfp4"), 132, interpret=False, nk=True, a8=True)
    assert (c.block_m, c.block_n, c.num_warps) == tile
    per_sm = 2 if c.maxnreg == 128 else 1
    assert (c.maxnreg == 128) == (m > 64 and n <= 8192)
    assert m <= 64 or c.split_k == 1 or cdiv(m, c.block_m) * cdiv(n, c.block_n) * c.split_k <= per_sm * 132
    monkeypatch.setattr(frag, "A8_MMA_ACC", False)
    assert pick_config(m, n, k, Scheme.parse("w4a8-mxfp4"), 132, interpret=False, nk=True, a8=True).block_m <= 64


@pytest.mark.parametrize("text", ["w4a8", "w4a8-mxfp4"])
def test_the_quantizer_triggers_its_gemms_early_launch_only_for_a_few_rows(interpret, monkeypatch, text):
    """PDL's early trigger up to QUANT_EARLY_MAX_M rows (H200 M=16: the GEMM's CTAs landed on the SMs the quantizer
    CTAs left free, up to 1.3x slower); the GEMM itself still launches as a dependent. Launches recorded, run plain."""
    import anybit.backends.triton as triton_backend

    seen, real_gemm = [], triton_backend.gemm_frag

    def recorded_quantizer(*args, pdl=False, **kw):
        seen.append(("quantizer", pdl))
        return quantize_act(*args, **kw)

    def recorded_gemm(*args, pdl=False, **kw):
        seen.append(("gemm", pdl))
        return real_gemm(*args, **kw)

    monkeypatch.setattr(triton_backend, "pdl_launch", lambda device: True)
    monkeypatch.setattr(triton_backend, "quantize_act", recorded_quantizer)
    monkeypatch.setattr(triton_backend, "gemm_frag", recorded_gemm)
    p = prepare(quantize(torch.randn(48, 256) * 0.05, text), backend="triton")
    for m in (triton_backend.QUANT_EARLY_MAX_M, triton_backend.QUANT_EARLY_MAX_M + 12):
        seen.clear()
        get_backend("triton").gemm(torch.randn(m, 256).half(), p)
        assert seen == [("quantizer", m <= triton_backend.QUANT_EARLY_MAX_M), ("gemm", True)]


@pytest.mark.parametrize("text", ["w8a8-fp8", "fp8-block", "w8a8:e5m2:ch:bf16:e5m2-token", "w4a8-mxfp4"])
@pytest.mark.parametrize("m, k", [(3, 5120), (5, 2176)])  # the last program of a row short
def test_quantizer_with_a_row_over_several_programs_writes_the_same(interpret, monkeypatch, text, m, k):
    """`SPLIT_MAX_M`: each of a row's programs casts SPLIT_CHUNK columns (per token: with the row's amax taken by
    each) — bit for bit what one program a row writes, codes, scales and block sums."""
    from anybit.kernels import quant_act

    spec = Scheme.parse(text).act
    x = torch.randn(m, k).half() * 3
    kw = dict(block_sums=spec.mode.name == "TOKEN" and text != "w4a8-mxfp4")
    kw["codes_dtype"] = torch.float16 if text == "w4a8-mxfp4" else None
    one = quantize_act(x, spec, **kw)
    monkeypatch.setattr(quant_act, "SPLIT_MAX_M", 128)
    monkeypatch.setattr(quant_act, "SPLIT_CHUNK", 1024)
    split = quantize_act(x, spec, **kw)
    assert all(torch.equal(a.float(), b.float()) for a, b in zip(one, split, strict=True))


@pytest.mark.parametrize("text", ["w8a8-fp8", "w8a8:e5m2:ch:bf16:e5m2-token"])
@pytest.mark.parametrize("m, k, rows", [(13, 200, 2), (257, 96, 4), (5, 1000, 4), (1, 128, 1)])
def test_quantizer_rows_kernel_writes_the_same(interpret, monkeypatch, text, m, k, rows):
    """`quantize_rows` (several rows a program, each held whole; `quantize_act`'s route past WIDE_MAX_M rows up to
    ROWS_MAX_K columns) writes bit for bit what `_quant_act_kernel` writes: codes (FP8, and in fp16 for `codes_a16`),
    per-token scales; rows past M and columns past K masked."""
    from anybit.kernels import quant_act
    from anybit.kernels.quant_act import quantize_rows

    spec = Scheme.parse(text).act
    x = torch.randn(m, k).half() * 3
    x[m // 2] = 0  # an all-zero row: the smallest scale, zero codes
    for codes in (None, torch.float16):
        monkeypatch.setattr(quant_act, "ROWS_MAX_K", 0)  # `_quant_act_kernel` at every M
        one = quantize_act(x, spec, codes_dtype=codes)
        many = quantize_rows(x, spec, rows, 4, codes_dtype=codes)
        assert all(torch.equal(a.float(), b.float()) for a, b in zip(one, many, strict=True))
        monkeypatch.setattr(quant_act, "ROWS_MAX_K", 8192)
        routed = quantize_act(x, spec, codes_dtype=codes)  # past WIDE_MAX_M rows: the rows kernel
        assert all(torch.equal(a.float(), b.float()) for a, b in zip(one, routed, strict=True))
    with pytest.raises(ValueError, match="per-token or per-group"):
        quantize_rows(x, Scheme.parse("w8a8:e4m3:ch:bf16:e4m3-static").act, rows, 4)


@pytest.mark.parametrize("text, blockwise", [("fp8-block", False), ("fp8-block", True),
                                             ("w8a8:e4m3:ch:bf16:e5m2-g32", False)])  # fmt: skip
@pytest.mark.parametrize("m, k, rows", [(13, 384, 2), (257, 128, 4), (3, 1024, 1)])
def test_quantizer_rows_kernel_per_group_writes_the_same(interpret, monkeypatch, text, blockwise, m, k, rows):
    """`quantize_rows` with per-group scales (routed past WIDE_MAX_M rows up to `ROWS_GROUP_MAX_K` columns, K a power
    of two): bit for bit `_quant_act_kernel`'s codes and scales, cuBLAS's M-major 1x128 scales too; a K off the group
    is refused."""
    from anybit.kernels import quant_act
    from anybit.kernels.quant_act import quantize_rows

    spec = Scheme.parse(text).act
    x = torch.randn(m, k).half() * 3
    x[m // 2, : spec.group] = 0  # an all-zero group
    monkeypatch.setattr(quant_act, "ROWS_GROUP_MAX_K", 0)  # `_quant_act_kernel` at every M
    one = quantize_act(x, spec, blockwise=blockwise)
    many = quantize_rows(x, spec, rows, 4, blockwise=blockwise)
    monkeypatch.setattr(quant_act, "ROWS_GROUP_MAX_K", 8192)
    routed = quantize_act(x, spec, blockwise=blockwise)  # past WIDE_MAX_M rows: the rows kernel
    for got in (many, routed):
        assert all(torch.equal(a.float(), b.float()) for a, b in zip(one, got, strict=True))
        assert one[1].stride() == got[1].stride()
    with pytest.raises(ValueError, match="multiple of the group"):
        quantize_rows(x[:, :-16], spec, rows, 4)


@pytest.mark.parametrize("text, blockwise", [("fp8-block", False), ("fp8-block", True),
                                             ("w8a8:e4m3:ch:bf16:e5m2-g32", False)])  # fmt: skip
def test_quantizer_per_group_steps_of_4096_columns_write_the_same(interpret, monkeypatch, text, blockwise):
    """`GROUP_BLOCK`: rows past the decode (here WIDE_MAX_M = 0) cast 4096 instead of 1024 columns a step — bit for
    bit the same codes and scales (K = 7168: the last step part masked; groups of 128 and of 32; cuBLAS's M-major
    1x128 scales)."""
    from anybit.kernels import quant_act

    spec = Scheme.parse(text).act
    monkeypatch.setattr(quant_act, "WIDE_MAX_M", 0)
    x = torch.randn(5, 7168).half() * 3
    one = quantize_act(x, spec, blockwise=blockwise)
    monkeypatch.setattr(quant_act, "GROUP_BLOCK", 4096)
    wide = quantize_act(x, spec, blockwise=blockwise)
    assert all(torch.equal(a.float(), b.float()) for a, b in zip(one, wide, strict=True))


def test_a_decode_row_is_split_where_it_was_measured_faster():
    """`split_chunk`: per token not past SPLIT_MAX_REREAD bytes of re-read rows, not past
    SPLIT_MAX_EARLY_PROGRAMS programs when the GEMM launches early; per group and static rows need no re-read."""
    from anybit.kernels.quant_act import SPLIT_CHUNK, split_chunk

    assert split_chunk(16, 28672, 0, False) == SPLIT_CHUNK  # 12 MB re-read
    assert split_chunk(64, 28672, 0, False) == 0  # 48 MB
    assert split_chunk(64, 28672, 128, False) == split_chunk(64, 28672, -1, False) == SPLIT_CHUNK
    assert split_chunk(1, 8192, 0, True) == SPLIT_CHUNK and split_chunk(1, 28672, 0, True) == 0
    assert split_chunk(65, 8192, 128, False) == split_chunk(16, SPLIT_CHUNK, 0, False) == 0
    assert split_chunk(4, 8192, 96, False) == 0  # a chunk of whole groups only
