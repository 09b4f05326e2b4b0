"""The A16 Triton GEMM on the GPU in bf16 at real sizes: every format family, graphs, relaunch."""

import pytest
import torch

from anybit import prepare, quantize
from anybit.backends import get_backend
from anybit.backends.triton import default_config
from tests.kernels.test_gemm_a16 import FORMATS
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = pytest.mark.gpu


def _case(text, m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(n, k, generator=g, device="cuda") * 0.05
    x = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    qw = quantize(w, text)
    return x, qw, x.double() @ qw.dequantize().double().T


@pytest.mark.parametrize("text", FORMATS)
@pytest.mark.parametrize("m", [1, 13, 257, 1024])
def test_bf16_every_format(text, m):
    x, qw, ref = _case(text, m, 1000, 4096, seed=m)
    y = get_backend("triton").gemm(x, prepare(qw, backend="triton"))
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("m", [1, 16, 64, 256, 4096])
def test_every_default_config_is_correct_and_bitwise_stable(m):
    # K=2880 (a K tail) with groups of 64; N off the tile
    x, qw, ref = _case("w4a16:int4:g64:bf16", m, 2000, 2880, seed=1)
    p = prepare(qw, backend="triton")
    be = get_backend("triton")
    y1 = be.gemm(x, p)
    y2 = be.gemm(x, p)
    assert rel_err(y1, ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y1, y2)
    cfg = default_config(m, 2000, 2880, 4, torch.cuda.get_device_properties(0).multi_processor_count, False)
    assert cfg.block_m >= 16


@pytest.mark.parametrize("m", [1, 16])
def test_cuda_graph_replay(m):
    x, qw, ref = _case("w4a16", m, 4096, 4096, seed=3)
    p = prepare(qw, backend="triton")
    be = get_backend("triton")
    static_x = x.clone()
    be.gemm(static_x, p)  # compile and size the workspace outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = be.gemm(static_x, p)
    for seed in range(3):
        x2, _, _ = _case("w4a16", m, 8, 4096, seed=10 + seed)
        static_x.copy_(x2)
        g.replay()
        ref2 = static_x.double() @ qw.dequantize().double().T
        assert rel_err(y, ref2) < GEMM_REL_ERR[torch.bfloat16]
