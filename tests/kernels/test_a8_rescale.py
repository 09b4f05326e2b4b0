"""FP8 GEMMs at large M with the accumulator rescaled per 128-K block (`anybit.kernels.a8_rescale`, opt-in): W4A8 on
its e4m3 codes and FP8-block weights as stored, against float64 references of the kernel's own quantized x, awkward
shapes, the route's switch and refusals."""

import pytest
import torch

from anybit import prepare, quantize
from anybit.backends import get_backend
from anybit.kernels.a8_rescale import a8_rescale_why_not, block_rescale_why_not, gemm_a8_rescale, gemm_block_rescale
from anybit.kernels.frag_dequant import dequantize_frag
from anybit.kernels.quant_act import quantize_act
from tests.kernels.test_gemm_a8 import a8_reference
from tests.tolerances import GEMM_REL_ERR, rel_err

SMALL = dict(block_n=64, block_m=32, num_warps=4, num_stages=1, group_t=2)  # (interpreter-sized)


@pytest.mark.parametrize("text", ["w4a8", "w4a8:uint4:g128:fp16:zp-int:e4m3-token", "w4a8:int4:g256:bf16:e4m3-token"])
@pytest.mark.parametrize("m", [1, 13, 70])
def test_rescaled_codes_gemm_matches_reference(interpret, text, m):
    """Group scales spread over 20 binades along K, N off the tile, M off the token tile, a bias; unwritten
    outputs would stay NaN (y comes from torch.empty: the comparison covers every element)."""
    g = torch.Generator().manual_seed(m)
    k, n = 768, 200
    spread = 2.0 ** (20 * torch.rand(k // 128, generator=g) - 10)
    qw = quantize(torch.randn(n, k, generator=g) * 0.05 * spread.repeat_interleave(128)[None, :], text)
    p = prepare(qw, backend="triton")
    assert a8_rescale_why_not(p.data) is None
    x = torch.randn(m, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    xq, xs = quantize_act(x, qw.scheme.act)
    y = gemm_a8_rescale(xq, xs, dequantize_frag(p.data, dtype=torch.float8_e4m3fn), p.data, bias,
                        out_dtype=torch.float16, **SMALL)  # fmt: skip
    assert y.shape == (m, n) and y.dtype == torch.float16
    assert rel_err(y, a8_reference(x, qw) + bias.double()) < GEMM_REL_ERR[torch.float16]


def test_the_route_takes_it_only_when_asked(interpret, monkeypatch):
    """ANYBIT_A8_RESCALE_MIN_M=M: calls of >= M rows go through it (the interpreter's tile); 0 (default): never."""
    from anybit.kernels import a8_rescale

    g = torch.Generator().manual_seed(5)
    qw = quantize(torch.randn(72, 256, generator=g) * 0.05, "w4a8")
    p = prepare(qw, backend="triton")
    x = torch.randn(40, 256, generator=g).half()
    calls = []
    real = a8_rescale.gemm_a8_rescale
    monkeypatch.setattr(a8_rescale, "gemm_a8_rescale", lambda *a, **kw: calls.append(1) or real(*a, **(kw | SMALL)))
    be = get_backend("triton")
    be.gemm(x, p)
    assert not calls
    monkeypatch.setenv("ANYBIT_A8_RESCALE_MIN_M", "32")
    y = be.gemm(x, p)
    assert calls and rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.float16]


def test_refusals_say_why(interpret):
    """Weights it cannot run: a zero group scale, channel scales, an A16 scheme — and a wrong x."""
    w = torch.randn(64, 256) * 0.05
    w[:, :128] = 0.0
    assert "scales" in a8_rescale_why_not(prepare(quantize(w, "w4a8"), backend="triton").data)
    assert "group" in a8_rescale_why_not(prepare(quantize(w + 1, "w4a8:int4:ch:fp32:e4m3-token"),
                                                 backend="triton").data)  # fmt: skip
    assert "W4A8" in a8_rescale_why_not(prepare(quantize(w, "w4a16"), backend="triton").data)
    p = prepare(quantize(torch.randn(64, 256), "w4a8"), backend="triton")
    with pytest.raises(ValueError, match="xq must be"):
        gemm_a8_rescale(torch.zeros(4, 256), torch.ones(4, 1), torch.zeros(64, 256).to(torch.float8_e4m3fn), p.data)


def test_explain_names_the_opt_in(monkeypatch, capsys):
    """`anybit explain` says when the opt-in takes a call (and that it is not yet timed)."""
    from anybit.cli import main

    monkeypatch.setenv("ANYBIT_A8_RESCALE_MIN_M", "512")
    assert main(["explain", "--scheme", "w4a8", "--shape", "1024,8192,8192", "--device", "cpu"]) == 0
    assert "ANYBIT_A8_RESCALE_MIN_M=512 (opt-in, not yet timed)" in capsys.readouterr().out


@pytest.mark.parametrize("m", [1, 13, 70])
def test_fp8_block_rescaled_matches_reference(interpret, m):
    """FP8-block (e4m3 as stored, 128 x 128 scale blocks spread over 20 binades along K, x per token and 128
    columns): N off the tile and off the 128-row block's end, M off the token tile, a bias."""
    g = torch.Generator().manual_seed(m)
    k, n = 768, 200
    spread = 2.0 ** (20 * torch.rand(k // 128, generator=g) - 10)
    qw = quantize(torch.randn(n, k, generator=g) * 0.05 * spread.repeat_interleave(128)[None, :], "fp8-block")
    p = prepare(qw, backend="triton")
    assert block_rescale_why_not(p.data) is None
    x = torch.randn(m, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    xq, xs = quantize_act(x, qw.scheme.act)
    y = gemm_block_rescale(xq, xs, p.data, bias, out_dtype=torch.float16, block_m=32, block_n=64, num_warps=4,
                           num_stages=1, group_t=2)  # fmt: skip
    assert rel_err(y, a8_reference(x, qw) + bias.double()) < GEMM_REL_ERR[torch.float16]


def test_fp8_block_through_the_route_and_refusals(interpret, monkeypatch):
    """The route's switch takes FP8-block calls too; W8A8 (channel scales, x per token) is refused with a reason, and
    so is a block tile that would span two weight scale blocks."""
    from anybit.kernels import a8_rescale

    g = torch.Generator().manual_seed(9)
    qw = quantize(torch.randn(256, 384, generator=g) * 0.05, "fp8-block")
    p = prepare(qw, backend="triton")
    x = torch.randn(40, 384, generator=g).half()
    monkeypatch.setenv("ANYBIT_A8_RESCALE_MIN_M", "32")
    monkeypatch.setitem(a8_rescale.BLOCK_RESCALE_TILE, "block_m", 32)
    monkeypatch.setitem(a8_rescale.BLOCK_RESCALE_TILE, "num_warps", 4)
    monkeypatch.setitem(a8_rescale.BLOCK_RESCALE_TILE, "num_stages", 1)
    calls, real = [], a8_rescale.gemm_block_rescale
    monkeypatch.setattr(a8_rescale, "gemm_block_rescale", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    assert rel_err(get_backend("triton").gemm(x, p), a8_reference(x, qw)) < GEMM_REL_ERR[torch.float16] and calls
    w8 = prepare(quantize(torch.randn(256, 384, generator=g), "w8a8-fp8"), backend="triton")
    assert "128x128 scale blocks" in block_rescale_why_not(w8.data)
    xq, xs = quantize_act(x, qw.scheme.act)
    with pytest.raises(ValueError, match="block_n must divide 128"):
        gemm_block_rescale(xq, xs, p.data, block_n=256)
