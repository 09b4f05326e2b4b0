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


FRESH = """
import sys, torch, transformers, anybit
cfg = transformers.LlamaConfig.from_pretrained(sys.argv[1])
model = anybit.load_quantized(sys.argv[1], transformers.LlamaForCausalLM(cfg)).cuda().bfloat16().eval()
ids = torch.tensor([[1, 5, 9, 13]], device="cuda")
out = model.generate(ids, max_new_tokens=8, do_sample=False)
print(",".join(str(t) for t in out[0].tolist()))
"""


@pytest.mark.parametrize("scheme", ["w4a16", "nvfp4"])
def test_quantize_on_gpu_save_load_in_a_fresh_process_and_generate(tmp_path, scheme):
    """The issue's 'done when': quantize a transformers model on the GPU, save it, load it in a new
    process and generate the same greedy tokens."""
    import subprocess
    import sys

    transformers = pytest.importorskip("transformers")
    import anybit

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).cuda().bfloat16().eval()
    anybit.quantize_model(model, scheme, exclude=["lm_head"], progress=False)
    ids = torch.tensor([[1, 5, 9, 13]], device="cuda")
    want = model.generate(ids, max_new_tokens=8, do_sample=False)[0].tolist()
    anybit.save_quantized(model, str(tmp_path))
    cfg.save_pretrained(str(tmp_path))
    run = subprocess.run([sys.executable, "-c", FRESH, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == ",".join(str(t) for t in want)
