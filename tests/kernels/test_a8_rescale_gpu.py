"""The rescaled FP8 GEMMs at large M (`anybit.kernels.a8_rescale`, opt-in) on the GPU in bf16 at real sizes: W4A8 on
its codes and FP8-block as stored, each tile the probe times, against the exact product of the kernel's own quantized
x, a relaunch bit for bit, and through the route from a CUDA graph."""

import pytest
import torch

from anybit import prepare, quantize
from anybit.backends import get_backend
from anybit.kernels.a8_rescale import A8_RESCALE_TILE, BLOCK_RESCALE_TILE, rescale_gemm
from tests.graphs import replayed
from tests.kernels.test_gemm_a8 import a8_reference
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = pytest.mark.gpu

TILES = [{}, dict(block_m=128, num_stages=3)]


@pytest.mark.parametrize("text", ["w4a8", "w4a8:uint4:g128:bf16:zp-int:e4m3-token", "fp8-block"])
@pytest.mark.parametrize("m", [300, 2048])
@pytest.mark.parametrize("tile", TILES)
def test_rescaled_gemms_in_bf16(text, m, tile):
    """N = 4224 (off the 128/256 tiles), K = 7168 (56 blocks of ratios), group scales spread over 16 binades."""
    g = torch.Generator(device="cuda").manual_seed(m)
    n, k = 4224, 7168
    spread = 2.0 ** (16 * torch.rand(k // 128, generator=g, device="cuda") - 8)
    qw = quantize(torch.randn(n, k, generator=g, device="cuda") * 0.05 * spread.repeat_interleave(128), text)
    p = prepare(qw, backend="triton")
    x = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    bias = torch.randn(n, generator=g, device="cuda").bfloat16()
    y = rescale_gemm(x, p.data, bias, **tile)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    assert rel_err(y, a8_reference(x, qw) + bias.double()) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y, rescale_gemm(x, p.data, bias, **tile)), "a relaunch must give the same bits"


@pytest.mark.parametrize("text", ["w4a8", "fp8-block"])
def test_the_route_in_a_cuda_graph(monkeypatch, text):
    """ANYBIT_A8_RESCALE_MIN_M=256: a 1024-row call takes the rescaled GEMM (its default tile) and replays from a
    graph bit for bit."""
    monkeypatch.setenv("ANYBIT_A8_RESCALE_MIN_M", "256")
    g = torch.Generator(device="cuda").manual_seed(3)
    qw = quantize(torch.randn(4096, 4096, generator=g, device="cuda") * 0.05, text)
    p = prepare(qw, backend="triton")
    x = torch.randn(1024, 4096, generator=g, device="cuda").bfloat16()
    be = get_backend("triton")
    y = be.gemm(x, p)
    direct = rescale_gemm(x, p.data, **(BLOCK_RESCALE_TILE if p.data.nk else A8_RESCALE_TILE))
    assert torch.equal(y, direct) and rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(replayed(lambda: be.gemm(x, p)), y)
