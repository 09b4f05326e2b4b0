"""Checkpoint loaders against fixture files written per each format's published layout, checked with
dequantizations written from the formats' documentation (integer loops over the known codes), not
from the loaders."""

import json

import pytest
import torch
from safetensors.torch import save_file

import anybit
from anybit.checkpoints import load, quantization_config
from anybit.errors import CheckpointError
from tests.tolerances import GEMM_REL_ERR, rel_err

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_value(code: torch.Tensor) -> torch.Tensor:
    v = E2M1[(code & 7).long()]
    return torch.where(code & 8 != 0, -v, v)


def write(tmp_path, tensors: dict, qcfg: dict | None, shards: int = 1, config_name="config.json"):
    """A model directory: config.json (+ quantization_config) and 1 or more safetensors shards."""
    if qcfg is not None:
        (tmp_path / config_name).write_text(
            json.dumps({"quantization_config": qcfg} if config_name == "config.json" else qcfg)
        )
    names = sorted(tensors)
    if shards == 1:
        save_file({k: tensors[k].contiguous() for k in names}, str(tmp_path / "model.safetensors"))
        return tmp_path
    weight_map = {}
    for i in range(shards):
        part = {k: tensors[k].contiguous() for k in names[i::shards]}
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(tmp_path / file))
        weight_map.update(dict.fromkeys(part, file))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return tmp_path


# ---- GPTQ: pack per AutoGPTQ (bit stream along K for qweight, along N for qzeros) -----------------
def gptq_pack_rows(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes [R, C] ints < 2**bits -> int32 [R*bits/32, C]: consecutive rows' bits stream LSB first."""
    r, c = codes.shape
    out = torch.zeros(-(-r * bits // 32), c, dtype=torch.int64)
    for i in range(r):
        for b in range(bits):
            pos = i * bits + b
            out[pos // 32] |= ((codes[i].long() >> b) & 1) << (pos % 32)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def gptq_fixture(bits, n, k, g, *, sym, act_order, v2=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 2**bits, (n, k), generator=gen)
    groups = k // g
    zeros = torch.full((groups, n), 2 ** (bits - 1)) if sym else torch.randint(1, 2**bits, (groups, n), generator=gen)
    scales = (torch.rand(groups, n, generator=gen) * 0.01 + 0.001).half()
    g_idx = torch.arange(k) // g
    if act_order:
        g_idx = g_idx[torch.randperm(k, generator=gen)]
    stored_zeros = zeros if v2 else (zeros - 1) & (2**bits - 1)
    tensors = {
        "m.qweight": gptq_pack_rows(codes.t(), bits),
        "m.qzeros": gptq_pack_rows(stored_zeros.t(), bits).t(),
        "m.scales": scales,
        "m.g_idx": g_idx.to(torch.int32),
        "m.bias": torch.randn(n, generator=gen).half(),
    }
    # documentation: W[n, k] = (q[n, k] - zero[g_idx[k], n]) * scale[g_idx[k], n]
    w = (codes - zeros[g_idx, torch.arange(n)[:, None]]).float() * scales[g_idx, torch.arange(n)[:, None]].float()
    return tensors, w


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("sym", [True, False])
def test_gptq(tmp_path, bits, sym):
    tensors, w = gptq_fixture(bits, 64, 256, 64, sym=sym, act_order=False)
    write(tmp_path, tensors, {"quant_method": "gptq", "bits": bits, "group_size": 64, "sym": sym, "desc_act": False})
    (layer,) = load(str(tmp_path))
    assert layer.name == "m" and layer.act_perm is None and layer.bias is not None
    assert torch.equal(layer.qweight.dequantize(), w)
    assert (layer.qweight.scheme.zero_point.value == "none") == sym  # symmetric -> signed, no zeros


def test_gptq_act_order_sharded_and_gemm(tmp_path):
    tensors, w = gptq_fixture(4, 40, 384, 128, sym=False, act_order=True, seed=3)
    write(tmp_path, tensors, {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True}, shards=3)
    (layer,) = load(str(tmp_path))
    perm = layer.act_perm
    assert perm is not None and torch.equal(layer.qweight.dequantize(), w[:, perm])
    x = torch.randn(3, 384).half()
    y = anybit.gemm(x[:, perm], anybit.prepare(layer.qweight, backend="torch"))
    ref = x.double() @ w.double().T
    assert float((y.double() - ref).norm() / ref.norm()) < 2e-3


def test_gptq_legacy_quantize_config(tmp_path):
    tensors, w = gptq_fixture(4, 32, 128, 128, sym=True, act_order=False, seed=9)
    write(tmp_path, tensors, {"bits": 4, "group_size": 128, "desc_act": False}, config_name="quantize_config.json")
    (layer,) = load(str(tmp_path))
    assert torch.equal(layer.qweight.dequantize(), w)


def test_gptq_v1_zero_of_zero_and_v2(tmp_path):
    tensors, _ = gptq_fixture(4, 16, 128, 128, sym=False, act_order=False, seed=5)
    zeros = torch.zeros(1, 16, dtype=torch.long)  # stored as -1 & 15 = 15 by v1 writers: means 16
    tensors["m.qzeros"] = gptq_pack_rows(((zeros - 1) & 15).t(), 4).t()
    write(tmp_path / "", tensors, {"quant_method": "gptq", "bits": 4, "group_size": 128})
    (layer,) = load(str(tmp_path))
    assert (layer.qweight.zeros == 16).all()
    v2 = tmp_path / "v2"
    v2.mkdir()
    tensors, w = gptq_fixture(4, 16, 128, 64, sym=False, act_order=False, v2=True, seed=6)
    write(v2, tensors, {"quant_method": "gptq", "bits": 4, "group_size": 64, "checkpoint_format": "gptq_v2"})
    (layer,) = load(str(v2))
    assert torch.equal(layer.qweight.dequantize(), w)


# ---- AWQ: GEMM layout, nibble i of a word holds column 8*w + [0, 2, 4, 6, 1, 3, 5, 7][i] ----------
def awq_pack(codes: torch.Tensor) -> torch.Tensor:
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    r, c = codes.shape
    out = torch.zeros(r, c // 8, dtype=torch.int64)
    for i in range(8):
        out |= codes[:, torch.arange(c // 8) * 8 + order[i]].long() << (4 * i)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def test_awq(tmp_path):
    gen = torch.Generator().manual_seed(1)
    n, k, g = 64, 256, 128
    codes = torch.randint(0, 16, (k, n), generator=gen)  # AWQ stores [K, N]
    zeros = torch.randint(0, 16, (k // g, n), generator=gen)
    scales = (torch.rand(k // g, n, generator=gen) * 0.01).half()
    tensors = {"m.qweight": awq_pack(codes), "m.qzeros": awq_pack(zeros), "m.scales": scales}
    write(tmp_path, tensors, {"quant_method": "awq", "bits": 4, "group_size": g, "version": "gemm", "zero_point": True})
    (layer,) = load(str(tmp_path))
    gi = torch.arange(k) // g
    w = ((codes - zeros[gi]).float() * scales[gi].float()).t()
    assert torch.equal(layer.qweight.dequantize(), w)


# ---- FP8 --------------------------------------------------------------------------------------
def test_fp8_block_and_channel(tmp_path):
    gen = torch.Generator().manual_seed(2)
    n, k = 200, 384  # N off the 128 block
    w8 = (torch.randn(n, k, generator=gen) * 3).to(torch.float8_e4m3fn)
    s = torch.rand(2, 3, generator=gen) + 0.1
    write(
        tmp_path,
        {"m.weight": w8, "m.weight_scale_inv": s},
        {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    )
    (layer,) = load(str(tmp_path))
    ref = w8.float() * s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
    assert torch.equal(layer.qweight.dequantize(), ref)
    assert str(layer.qweight.scheme).endswith("e4m3-g128")
    ch = tmp_path / "ch"
    ch.mkdir()
    sc = torch.rand(n, 1, generator=gen)
    write(
        ch,
        {"m.weight": w8, "m.weight_scale": sc, "m.input_scale": torch.tensor(0.5)},
        {"quant_method": "fp8", "activation_scheme": "static"},
    )
    (layer,) = load(str(ch))
    assert torch.equal(layer.qweight.dequantize(), w8.float() * sc) and float(layer.input_scale) == 0.5
    # the static scale travels with the weight: the layer computes with it (torch backend's _scaled_mm)
    assert float(layer.qweight.input_scale) == 0.5
    x = torch.randn(3, k).half()
    y = anybit.gemm(x, anybit.prepare(layer.qweight, backend="torch"))
    xs = (x.float() / 0.5).clamp(-448, 448).to(torch.float8_e4m3fn).float() * 0.5
    assert rel_err(y, xs.double() @ (w8.double() * sc.double()).T) < GEMM_REL_ERR[torch.float16]
    missing = tmp_path / "missing"
    missing.mkdir()
    write(missing, {"m.weight": w8, "m.weight_scale": sc}, {"quant_method": "fp8", "activation_scheme": "static"})
    with pytest.raises(CheckpointError, match="m.input_scale missing"):
        list(load(str(missing)))


# ---- ModelOpt NVFP4 ---------------------------------------------------------------------------
def test_modelopt_nvfp4(tmp_path):
    gen = torch.Generator().manual_seed(4)
    n, k = 32, 128
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    s = (torch.rand(n, k // 16, generator=gen) * 2 + 0.01).to(torch.float8_e4m3fn)
    s2 = torch.tensor(0.0123)
    write(
        tmp_path,
        {"m.weight": packed, "m.weight_scale": s, "m.weight_scale_2": s2, "m.input_scale": torch.tensor(1.0)},
        {"quantization": {"quant_algo": "NVFP4", "group_size": 16}},
        config_name="hf_quant_config.json",
    )
    (layer,) = load(str(tmp_path))
    ref = e2m1_value(codes) * s.float().repeat_interleave(16, 1) * s2
    assert torch.equal(layer.qweight.dequantize(), ref)


# ---- gpt-oss MXFP4 ----------------------------------------------------------------------------
def test_gpt_oss_mxfp4_experts(tmp_path):
    gen = torch.Generator().manual_seed(7)
    e, n, k = 3, 16, 64
    codes = torch.randint(0, 16, (e, n, k), generator=gen, dtype=torch.uint8)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(e, n, k // 32, 16)
    scales = torch.randint(120, 130, (e, n, k // 32), generator=gen, dtype=torch.uint8)
    bias = torch.randn(e, n, generator=gen)
    write(
        tmp_path,
        {
            "l.experts.gate_up_proj_blocks": blocks,
            "l.experts.gate_up_proj_scales": scales,
            "l.experts.gate_up_proj_bias": bias,
        },
        {"quant_method": "mxfp4"},
    )
    (layer,) = load(str(tmp_path))
    assert layer.name == "l.experts.gate_up_proj" and layer.qweight.shape == (e, n, k)
    ref = e2m1_value(codes) * torch.pow(2.0, scales.float() - 127).repeat_interleave(32, -1)
    assert torch.equal(layer.qweight.dequantize(), ref) and torch.equal(layer.bias, bias)


# ---- bad input --------------------------------------------------------------------------------
def test_bad_checkpoints_name_file_tensor_and_expectation(tmp_path):
    tensors, _ = gptq_fixture(4, 16, 128, 64, sym=True, act_order=False)
    cfg = {"quant_method": "gptq", "bits": 4, "group_size": 64}
    d = write(tmp_path / "", {k: v for k, v in tensors.items() if k != "m.qzeros"}, cfg)
    with pytest.raises(CheckpointError, match=r"'m.qzeros' is missing"):
        list(load(str(d)))
    bad = tmp_path / "shape"
    bad.mkdir()
    write(bad, {**tensors, "m.qzeros": torch.zeros(3, 2, dtype=torch.int32)}, cfg)
    with pytest.raises(CheckpointError, match=r"m.qzeros.*shape \(3, 2\), expected 2×2"):
        list(load(str(bad)))
    trunc = tmp_path / "trunc"
    trunc.mkdir()
    write(trunc, tensors, cfg)
    f = trunc / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        list(load(str(trunc)))
    for qcfg, match in [
        ({"quant_method": "bitsandbytes"}, "not supported"),
        ({"quant_method": "gptq", "bits": 5}, "bits=5"),
    ]:
        other = tmp_path / qcfg["quant_method"]
        other.mkdir(exist_ok=True)
        write(other, tensors, qcfg)
        with pytest.raises(CheckpointError, match=match):
            list(load(str(other)))
    none = tmp_path / "none"
    none.mkdir()
    (none / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no quantization_config"):
        quantization_config(str(none))


def test_load_quantized_hf_gptq_llama_generates(tmp_path):
    transformers = pytest.importorskip("transformers")
    from anybit.checkpoints import load_quantized_hf

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    ref_model = transformers.LlamaForCausalLM(cfg).eval()
    tensors, gptq = {}, {"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False, "sym": True}
    for name, module in ref_model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            w = module.weight.detach()
            n, k = w.shape
            s = (w.reshape(n, k // 64, 64).abs().amax(-1) / 7).clamp(min=1e-6)  # [N, G]
            q = (torch.round(w / s.repeat_interleave(64, 1)).clamp(-8, 7) + 8).long()  # uint4, zero 8
            tensors[f"{name}.qweight"] = gptq_pack_rows(q.t(), 4)
            tensors[f"{name}.qzeros"] = gptq_pack_rows(torch.full((n, k // 64), 7), 4).t()  # v1: zero - 1
            tensors[f"{name}.scales"] = s.t().half()
            module.weight.data = (q - 8).float() * s.half().float().repeat_interleave(64, 1)  # the exact reference
    for name, t in ref_model.state_dict().items():
        if not any(name.startswith(p.rsplit(".", 1)[0] + ".") for p in tensors) or name.startswith("lm_head"):
            tensors.setdefault(name, t.clone())
    cfg_dict = cfg.to_dict()
    cfg_dict["quantization_config"] = gptq
    write(tmp_path, tensors, None)
    (tmp_path / "config.json").write_text(json.dumps(cfg_dict))
    model = load_quantized_hf(str(tmp_path), dtype=torch.float32)
    assert sum(isinstance(m, anybit.QuantLinear) for m in model.modules()) == 7
    ids = torch.randint(0, 128, (1, 10))
    with torch.no_grad():
        out, ref = model(ids).logits, ref_model(ids).logits
        assert float((out - ref).norm() / ref.norm()) < 1e-5
        assert model.generate(ids, max_new_tokens=3, do_sample=False).shape == (1, 13)
