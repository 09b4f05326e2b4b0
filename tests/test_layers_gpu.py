"""Quantized models on the GPU: torch.compile(fullgraph=True) and CUDA-graph replay (device only)."""

import pytest
import torch

from anybit import quantize_model
from tests.test_layers import Tiny
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("scheme", ["w4a16", "w8a8-fp8"])
def test_compile_and_graph_replay_of_a_quantized_model(scheme):
    torch.manual_seed(0)
    model = quantize_model(Tiny(), scheme, progress=False).cuda().bfloat16()
    x = torch.randn(16, 128, device="cuda").bfloat16()
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    assert rel_err(compiled(x), eager) < GEMM_REL_ERR[torch.bfloat16]
    static_x = x.clone()
    model(static_x)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = model(static_x)
    static_x.copy_(torch.randn_like(x))
    graph.replay()
    assert rel_err(y, model(static_x)) < GEMM_REL_ERR[torch.bfloat16]
