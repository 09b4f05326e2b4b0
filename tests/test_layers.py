"""QuantLinear, quantize_model, save/load — against the exact torch path, on the CPU."""

import pytest
import torch
from torch import nn

import anybit
from anybit import QuantLinear, load_quantized, quantize_model, save_quantized
from anybit.errors import CheckpointError
from tests.tolerances import GEMM_REL_ERR, rel_err


@pytest.mark.parametrize("scheme", ["w4a16", "nvfp4", "w8a16", "w4a16-zp", "w8a8-fp8"])
def test_quantlinear_matches_the_exact_path(scheme):
    lin = nn.Linear(256, 96, bias=True)
    q = QuantLinear.from_float(lin, scheme, backend="torch")
    x = torch.randn(2, 5, 256).half()  # leading dims
    y = q(x)
    ref = anybit.gemm(x, anybit.prepare(q.quantized(), backend="torch")).double() + lin.bias.detach().double()
    assert y.shape == (2, 5, 96) and y.dtype == torch.float16
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]
    assert "scheme=" in repr(q) and "backend=torch" in repr(q)


def test_state_dict_round_trip_is_bitwise():
    a = QuantLinear.from_float(nn.Linear(128, 64), "mxfp4")
    b = QuantLinear(anybit.QuantizedWeight.empty("mxfp4", (64, 128)), torch.zeros(64))
    b.load_state_dict(a.state_dict())
    for name, t in a.state_dict().items():
        assert torch.equal(t, b.state_dict()[name])
    x = torch.randn(3, 128)
    assert torch.equal(a(x), b(x))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(128, 256)
        self.down = nn.Linear(256, 128, bias=False)
        self.head = nn.Linear(128, 32)

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(x))))


def test_quantize_model_per_module_schemes_exclude_and_save_load(tmp_path):
    torch.manual_seed(0)
    model = Tiny()
    quantize_model(model, {"up": "w4a16", "*": "w8a16"}, exclude=["head"], progress=False)
    assert isinstance(model.up, QuantLinear) and isinstance(model.down, QuantLinear)
    assert isinstance(model.head, nn.Linear)
    assert str(model.up.scheme).startswith("w4a16") and str(model.down.scheme).startswith("w8a16")
    x = torch.randn(4, 128)
    y = model(x)
    save_quantized(model, str(tmp_path))
    fresh = load_quantized(str(tmp_path), Tiny())
    assert torch.equal(fresh(x), y)
    with pytest.raises(CheckpointError, match="is 256x128 in the checkpoint"):
        other = Tiny()
        other.up = nn.Linear(128, 200)
        load_quantized(str(tmp_path), other)


def test_transformers_llama_quantized_end_to_end(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 128, (1, 12))
    with torch.no_grad():
        ref = model(ids).logits
    quantize_model(model, "w8a16", exclude=["lm_head"], progress=False)
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 2 * 7
    with torch.no_grad():
        out = model(ids).logits
        assert rel_err(out, ref) < 2e-2  # 8-bit weights per channel
        gen = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert gen.shape == (1, 16)
    save_quantized(model, str(tmp_path))
    fresh = load_quantized(str(tmp_path), transformers.LlamaForCausalLM(cfg).eval())
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, out)


def test_fp32_activations_on_the_triton_backend_take_the_exact_path(interpret):
    q = QuantLinear.from_float(nn.Linear(128, 40), "w4a16", backend="triton")
    x = torch.randn(3, 128)
    exact = anybit.gemm(x, anybit.prepare(q.quantized(), backend="torch")) + q.bias
    assert torch.equal(q(x), exact)


def test_torch_compile_fullgraph_traces_through_quantized_layers():
    torch.manual_seed(0)
    model = quantize_model(Tiny(), "w4a16", progress=False)
    x = torch.randn(4, 128)
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x), eager)
    q = model.up
    torch.library.opcheck(torch.ops.anybit.linear.default, (x, q._handle, q.out_features, q.bias))


@pytest.mark.parametrize("scheme", ["w8a8-fp8", "nvfp4", "w4a16"])
def test_dtype_casts_of_the_model_keep_the_quantized_tensors(scheme):
    """`model.bfloat16()` after quantizing must not round fp32 scales (or any quantized tensor)."""
    torch.manual_seed(0)
    layer = QuantLinear.from_float(torch.nn.Linear(256, 64, bias=True), scheme, backend="torch")
    before = {n: t.clone() for n, t in layer.quantized().tensors().items()}
    x = torch.randn(5, 256).half()
    ref = layer(x)
    layer.bfloat16().half()
    after = layer.quantized().tensors()
    assert all(after[n].dtype == t.dtype and torch.equal(after[n], t) for n, t in before.items())
    assert layer.bias.dtype == torch.float16
    assert rel_err(layer(x), ref) < GEMM_REL_ERR[torch.float16]  # the bias went through bf16


def test_static_input_scale_is_part_of_the_layer_state():
    from anybit.quant.weights import QuantizedWeight

    qw = anybit.quantize(torch.randn(32, 128), "w8a8:e4m3:ch:fp32:e4m3-static", input_scale=0.25)
    layer = QuantLinear.from_quantized(qw)
    assert float(layer.state_dict()["input_scale"]) == 0.25
    fresh = QuantLinear.from_quantized(QuantizedWeight.empty(qw.scheme, (32, 128)))
    fresh.load_state_dict(layer.state_dict())
    assert float(fresh.quantized().input_scale) == 0.25
    x = torch.randn(4, 128).half()
    assert torch.equal(fresh.bfloat16().half()(x), layer(x))
