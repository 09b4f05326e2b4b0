"""The large-M FP8 route through cuBLAS's block-scaled GEMM (`anybit.backends.blockscaled`) on the CPU:
which weights take it, the W4A8 codes it is fed (Triton dequantizer under the interpreter), and the
scales' shapes and strides, against an emulation of the cuBLAS call's arithmetic."""

import pytest
import torch

from anybit import quantize
from anybit.backends import blockscaled
from anybit.backends.blockscaled import blockscaled_recipe
from anybit.backends.triton_layout import stored_codes, to_triton_layout
from anybit.formats.scheme import Scheme
from anybit.kernels.frag_dequant import dequantize_frag
from anybit.kernels.quant_act import quantize_act
from anybit.quant.activations import dequantize_activation
from tests.tolerances import GEMM_REL_ERR, rel_err


@pytest.mark.parametrize(
    "text,n,want",
    [
        ("w4a8", 256, "1x128"),
        ("w4a8:uint4:g128:fp32:zp-int:e4m3-token", 256, "1x128"),
        ("w4a8:int4:g128:bf16:e4m3-token", 256, "1x128"),
        ("fp8-block", 256, "128x128"),
        ("fp8-block", 200, None),  # N not whole 128-row blocks
        ("w4a8", 200, None),  # N not a multiple of 16
        ("w4a8:int4:g64:fp32:e4m3-token", 256, None),  # groups of 64
        ("w4a8:int4:ch:fp32:e4m3-token", 256, None),  # channel scales: the Triton kernel's epilogue
        ("w8a8-fp8", 256, None),
        ("w4a8-mxfp4", 256, None),  # ue8m0 scales per 32
        ("w4a16", 256, None),
    ],
)
def test_which_weights_take_the_block_scaled_gemm(text, n, want):
    tw = to_triton_layout(quantize(torch.randn(n, 384) * 0.05, text))
    assert tw.blockscaled == want and (tw.blockscaled_scales is None) == (want is None)
    if want == "1x128" and tw.scales.dtype == torch.float32:  # cuBLAS reads the fp32 scales in place
        assert tw.blockscaled_scales.data_ptr() == tw.scales.data_ptr()
    assert blockscaled_recipe(Scheme.parse("w4a8:int4:g128:fp32:e4m3-static"), 256, 384, False, True) is None


def test_explain_names_the_block_scaled_route_or_why_not():
    from anybit.tools.explain import triton_plan

    plan = triton_plan(Scheme.parse("w4a8"), 300, 4096, 4096, torch.device("cpu"), torch.bfloat16)
    assert "cuBLAS block-scaled GEMM not used: cuBLAS needs a CUDA device" in plan
    assert "not used" not in triton_plan(Scheme.parse("w4a8"), 64, 4096, 4096, torch.device("cpu"), torch.bfloat16)


def test_explain_names_the_int4_codes_route(monkeypatch):
    """ANYBIT_W4A8_CODES=1: int4 W4A8 with N < 8192 explained as the A16 path it takes (the same tile as W4A16's),
    the FP8 route from N = 8192 on; off, the FP8 route."""
    from anybit.tools.explain import triton_plan

    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    assert "A16 kernels" not in triton_plan(Scheme.parse("w4a8"), 16, 4096, 4096, cpu, bf16)
    monkeypatch.setenv("ANYBIT_W4A8_CODES", "1")
    plan = triton_plan(Scheme.parse("w4a8"), 16, 4096, 4096, cpu, bf16)
    assert plan.startswith("int4 W4A8 laid out for the A16 kernels")
    assert plan.endswith(triton_plan(Scheme.parse("w4a16"), 16, 4096, 4096, cpu, bf16))
    assert "A16 kernels" not in triton_plan(Scheme.parse("w4a8"), 16, 8192, 4096, cpu, bf16)
    assert "A16 kernels" not in triton_plan(Scheme.parse("w4a8-nvfp4"), 16, 4096, 4096, cpu, bf16)


@pytest.mark.parametrize("text", ["w4a8", "w4a8:uint4:g128:fp32:zp-int:e4m3-token"])
def test_w4a8_codes_dequantize_exactly_to_e4m3(interpret, text):
    """`dequantize_frag` of an FP8-MMA-packed weight: q - bias - z unscaled, in e4m3 (exact for 4 bits)."""
    qw = quantize(torch.randn(80, 384, generator=torch.Generator().manual_seed(1)) * 0.05, text)
    tw = to_triton_layout(qw)
    q = stored_codes(qw).float() - (8 if qw.scheme.weight.signed else 0)
    if qw.zeros is not None:
        q = q - qw.zeros.float().repeat_interleave(128, dim=1)[:, :384]
    codes = dequantize_frag(tw, dtype=torch.float8_e4m3fn)
    assert codes.dtype == torch.float8_e4m3fn and torch.equal(codes.float(), q)
    with pytest.raises(ValueError, match="float8_e4m3fn, not torch.float16"):
        dequantize_frag(tw, dtype=torch.float16)


def _emulated_scaled_mm(xq, sx, wq, sw, recipe, out_dtype):
    """cuBLAS's block-scaled arithmetic on the CPU, reading the scales in the layouts it requires."""
    m, k = xq.shape
    n, g = wq.shape[0], k // 128
    assert sx.shape == (m, g) and sx.stride(0) == 1, "x scales must be [M, K/128], M-major"
    if recipe == "1x128":
        assert sw.shape == (n, g) and sw.stride(0) == 1, "1x128 weight scales must be [N, K/128], N-major"
        swn = sw
    else:
        assert sw.shape[0] % 4 == 0 and sw.shape[1] == n // 128 and sw.stride(0) == 1
        swn = sw[:g].t().repeat_interleave(128, dim=0)  # [N, K/128]
    xb, wb = xq.double().view(m, g, 128), wq.double().view(n, g, 128)
    y = torch.einsum("mgk,ngk,mg,ng->mn", xb, wb, sx.double(), swn.double())
    return y.to(out_dtype)


@pytest.mark.parametrize("text", ["w4a8", "w4a8:uint4:g128:fp32:zp-int:e4m3-token", "fp8-block"])
def test_block_scaled_call_against_its_emulation(interpret, monkeypatch, text):
    """The route's own work — x quantized per the scheme, the weight's codes and scales in cuBLAS's
    layouts — with the cuBLAS call emulated: equals the product of the quantized x and dequantize()."""
    g = torch.Generator().manual_seed(3)
    qw = quantize(torch.randn(256, 640, generator=g) * 0.05, text)
    tw = to_triton_layout(qw)
    monkeypatch.setattr(blockscaled, "_scaled_mm", _emulated_scaled_mm)
    x = torch.randn(70, 640, generator=g).half()
    bias = torch.randn(256, generator=g).half()
    y = blockscaled.blockscaled_gemm(x, tw, bias)
    xq, xs = quantize_act(x, qw.scheme.act)
    ref = dequantize_activation(xq, xs, qw.scheme.act).double() @ qw.dequantize().double().T + bias.double()
    assert y.dtype == torch.float16 and rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("lut", [True, False])
def test_mxfp4_rows_as_e4m3_times_a_power_of_two_exactly(interpret, lut):
    """MXFP4 under FP8 x: each row's codes times its groups' powers of two relative to the row's largest are e4m3
    values (the row-wise route's W), and the row scales give back `dequantize()` bit for bit — from the A16 words
    (`codes_a16`) and from the FP8 words with their look-up tables (`e2m1_a8`: values 2**6 higher, rows 2**-6)."""
    qw = quantize(torch.randn(80, 384) * 0.05, "w4a8-mxfp4")
    tw = to_triton_layout(qw, allow_e2m1_a8=lut)
    assert tw.e2m1_a8 == lut and tw.codes_a16 != lut and tw.rowwise is not None
    rel, rows = tw.rowwise
    wq = dequantize_frag(tw, dtype=torch.float8_e4m3fn, scales=rel)
    assert torch.equal(wq.float() * rows[:, None], qw.dequantize())


def test_mxfp4_rows_spanning_more_than_8_binades_keep_the_a16_kernels():
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    # one group of row 3 fourteen binades below the rest: past the FP8 MMA's 11 and e4m3's 8 whatever the groups' own
    # maxima (twelve were within 11 for some draws: seeds 3, 18, 37 of the global generator)
    w[3, :32] *= 2.0**-14
    tw = to_triton_layout(quantize(w, "w4a8-mxfp4"))
    assert tw.codes_a16 and not tw.e2m1_a8 and tw.rowwise is None
    assert "8 binades" in blockscaled.rowwise_why_not(tw, torch.device("cuda"), torch.bfloat16)
    assert to_triton_layout(quantize(torch.randn(32, 256), "w4a8:e2m1:g16:e4m3:gs:e4m3-token")).rowwise is None


def test_mxfp4_rows_spanning_11_binades_and_every_code_decode_exactly_on_the_fp8_words(interpret, monkeypatch):
    """The look-up tables at every relative code the FP8 words take (a row's groups 0-11 binades below its largest)
    and all 16 e2m1 codes (signed zero too): e4m3 values times the row scales give `dequantize()` bit for bit. The
    codes path's row-wise route takes only 8 binades."""
    g = torch.Generator().manual_seed(5)
    w = (torch.rand(64, 12 * 32 * 2, generator=g) * 1.9 - 0.95) * 0.05
    w[:, ::32] = 0.05  # every group's largest: the scales are 2**-g times one row scale
    w = w * (2.0 ** -torch.arange(12).repeat_interleave(32).repeat(2))[None, :]  # groups 0..11 binades down
    w[:, 5] = 0.0
    w[:, 6] = -0.0
    qw = quantize(w, "w4a8-mxfp4")
    assert set(stored_codes(qw).unique().tolist()) == set(range(16))
    tw = to_triton_layout(qw)
    rel, rows = tw.rowwise
    assert tw.e2m1_a8 and set(rel.unique().tolist()) == set(range(116, 128))
    wq = dequantize_frag(tw, dtype=torch.float8_e4m3fn)
    assert torch.equal(wq.float() * rows[:, None], qw.dequantize())
    monkeypatch.setenv("ANYBIT_E2M1_A8", "0")
    assert to_triton_layout(qw).rowwise is None


@pytest.mark.parametrize("lut", [True, False])
@pytest.mark.parametrize("m", [1, 13, 200])
def test_rowwise_call_against_the_product_of_its_quantized_x(interpret, m, lut):
    """`rowwise_gemm` end to end on the CPU (torch's CPU `_scaled_mm`): against float64 x_q s_x @ W^T with the
    quantizer's own codes (W from either word order)."""
    g = torch.Generator().manual_seed(m)
    qw = quantize(torch.randn(48, 256, generator=g) * 0.05, "w4a8-mxfp4")
    x = torch.randn(m, 256, generator=g).half()
    bias = torch.randn(48, generator=g).half()
    y = blockscaled.rowwise_gemm(x, to_triton_layout(qw, allow_e2m1_a8=lut), bias)
    xq, xs = quantize_act(x, qw.scheme.act)
    ref = dequantize_activation(xq, xs, qw.scheme.act).double() @ qw.dequantize().double().T + bias.double()
    assert y.dtype == torch.float16 and rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


def test_mxfp4_groups_of_zeros_do_not_count_against_the_row_spread(interpret):
    """A quantizer gives an all-zero group the smallest scale (code 0): such groups take their row's largest, so
    pruned or padded weights keep the row-wise / FP8-MMA paths, exactly (a row of zeros too)."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(32, 256, generator=g) * 0.05
    w[1, 32:64] = 0.0
    w[2] = 0.0
    qw = quantize(w, "w4a8-mxfp4")
    assert int(qw.scales[1, 1]) == 0 and bool((qw.scales[2] == 0).all())
    tw = to_triton_layout(qw)
    assert tw.e2m1_a8 and tw.rowwise is not None
    wq = dequantize_frag(tw, dtype=torch.float8_e4m3fn)
    assert torch.equal(wq.float() * tw.rowwise[1][:, None], qw.dequantize())


def test_mxfp4_on_the_fp8_mma_keeps_one_copy_of_its_scales():
    """`e2m1_a8` weights hold the row-relative codes as their scales (no second copy): their bytes are the codes
    path's less one byte a group."""
    qw = quantize(torch.randn(64, 512) * 0.05, "w4a8-mxfp4")
    lut, codes = to_triton_layout(qw), to_triton_layout(qw, allow_e2m1_a8=False)
    assert lut.e2m1_a8 and lut.scales is lut.rowwise[0]
    assert lut.nbytes == codes.nbytes - qw.scales.numel()
