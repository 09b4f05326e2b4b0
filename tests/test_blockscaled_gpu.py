"""GPU: FP8-activation calls above BLOCKSCALED_MIN_M go to cuBLAS's block-scaled GEMM (W4A8 g128 through
its e4m3 codes, FP8-block as stored) and match the exact product of the quantizer's own x, bit-stable,
also when replayed from a CUDA graph."""

import pytest
import torch

from anybit import prepare, quantize
from anybit.backends import get_backend
from anybit.backends.blockscaled import blockscaled_why_not
from anybit.kernels.quant_act import quantize_act
from anybit.quant.activations import dequantize_activation
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = pytest.mark.gpu

SCHEMES = ["w4a8", "w4a8:uint4:g128:fp32:zp-int:e4m3-token", "w4a8:int4:g128:bf16:e4m3-token", "fp8-block"]


@pytest.mark.parametrize("text", SCHEMES)
@pytest.mark.parametrize("m", [65, 300, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_block_scaled_route_matches_the_exact_product(text, m, dtype):
    g = torch.Generator(device="cuda").manual_seed(m)
    qw = quantize(torch.randn(3072, 4096, generator=g, device="cuda") * 0.05, text)
    x = torch.randn(m, 4096, generator=g, device="cuda").to(dtype)
    p = prepare(qw, backend="triton")
    why = blockscaled_why_not(p.data.blockscaled, x.device, x.dtype)
    assert why is None, why
    xq, xs = quantize_act(x, qw.scheme.act)
    ref = dequantize_activation(xq, xs, qw.scheme.act).double() @ qw.dequantize().double().T
    be = get_backend("triton")
    y1, y2 = be.gemm(x, p), be.gemm(x, p)
    assert y1.dtype == dtype and rel_err(y1, ref) < GEMM_REL_ERR[dtype]
    assert torch.equal(y1, y2)


@pytest.mark.parametrize("text", ["w4a8", "fp8-block"])
def test_block_scaled_route_replays_in_a_cuda_graph(text):
    g = torch.Generator(device="cuda").manual_seed(0)
    qw = quantize(torch.randn(2048, 2048, generator=g, device="cuda") * 0.05, text)
    p, be = prepare(qw, backend="triton"), get_backend("triton")
    x = torch.randn(256, 2048, generator=g, device="cuda").bfloat16()
    eager = be.gemm(x, p)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = be.gemm(x, p)
    x.copy_(torch.randn(256, 2048, generator=g, device="cuda").bfloat16())
    graph.replay()
    assert torch.equal(y, be.gemm(x, p)) and not torch.equal(y, eager)
