"""compressed-tensors checkpoints made by the real library's compressors: our dequantize() must equal
its decompress bit for bit (in the scale dtype it decompresses to)."""

import pytest
import torch

from anybit.checkpoints import load
from tests.checkpoints.test_loaders import write

ct = pytest.importorskip("compressed_tensors")
from compressed_tensors.compressors import (  # noqa: E402
    FloatQuantizationCompressor,
    IntQuantizationCompressor,
    PackedQuantizationCompressor,
)
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.utils import calculate_qparams  # noqa: E402

INT_CASES = [  # (format, compressor, weight args)
    ("pack-quantized", PackedQuantizationCompressor, dict(num_bits=4, symmetric=True, strategy="group", group_size=64)),
    (
        "pack-quantized",
        PackedQuantizationCompressor,
        dict(num_bits=4, symmetric=False, strategy="group", group_size=32),
    ),
    ("pack-quantized", PackedQuantizationCompressor, dict(num_bits=8, symmetric=True, strategy="channel")),
    ("pack-quantized", PackedQuantizationCompressor, dict(num_bits=3, symmetric=False, strategy="channel")),
    ("naive-quantized", IntQuantizationCompressor, dict(num_bits=8, symmetric=True, strategy="channel")),
    ("naive-quantized", IntQuantizationCompressor, dict(num_bits=8, symmetric=False, strategy="group", group_size=64)),
]


def _compress(compressor, args: dict, w: torch.Tensor, act: dict | None = None):
    qargs = QuantizationArgs(**args)
    scheme = QuantizationScheme(
        targets=["Linear"], weights=qargs, input_activations=QuantizationArgs(**act) if act else None
    )
    n, k = w.shape
    g = qargs.group_size if qargs.strategy == "group" else k
    blocks = w.float().reshape(n, k // g, g)
    scale, zp = calculate_qparams(blocks.amin(-1), blocks.amax(-1), qargs)
    sd = {"weight": w, "weight_scale": scale.to(w.dtype), "weight_zero_point": zp}
    compressed = compressor.compress(sd, scheme)
    expected = compressor.decompress(dict(compressed), scheme)["weight"]
    return compressed, expected, scheme.model_dump()


@pytest.mark.parametrize("fmt, compressor, args", INT_CASES)
def test_int_formats_bit_for_bit(tmp_path, fmt, compressor, args):
    w = torch.randn(64, 256, dtype=torch.bfloat16)
    compressed, expected, group = _compress(compressor, args, w)
    write(
        tmp_path,
        {f"layers.0.q_proj.{k}": v for k, v in compressed.items()},
        {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group}, "ignore": []},
    )
    (layer,) = load(str(tmp_path))
    assert layer.name == "layers.0.q_proj"
    assert torch.equal(layer.qweight.dequantize().to(expected.dtype), expected)


def test_fp8_channel_with_dynamic_token_activations_and_ignore(tmp_path):
    w = torch.randn(64, 256, dtype=torch.bfloat16)
    args = dict(num_bits=8, type="float", symmetric=True, strategy="channel")
    act = dict(num_bits=8, type="float", symmetric=True, strategy="token", dynamic=True)
    compressed, expected, group = _compress(FloatQuantizationCompressor, args, w, act)
    tensors = {f"layers.0.o_proj.{k}": v for k, v in compressed.items()}
    tensors.update({f"lm_head.{k}": v.clone() for k, v in compressed.items()})
    cfg = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"g": group},
        "ignore": ["lm_head"],
    }
    write(tmp_path, tensors, cfg)
    (layer,) = load(str(tmp_path))  # lm_head ignored
    assert layer.name == "layers.0.o_proj" and str(layer.qweight.scheme).endswith("e4m3-token")
    assert torch.equal(layer.qweight.dequantize().to(expected.dtype), expected)


def _fp4_case(tmp_path, compressor, args, fmt):
    from compressed_tensors.quantization.utils import generate_gparam

    w = torch.randn(32, 128, dtype=torch.bfloat16)
    qargs = QuantizationArgs(**args)
    scheme = QuantizationScheme(targets=["Linear"], weights=qargs)
    blocks = w.float().reshape(32, 128 // qargs.group_size, qargs.group_size)
    sd = {"weight": w}
    gs = None
    if fmt.startswith("nvfp4"):
        gs = generate_gparam(w.float().amin(), w.float().amax())
        sd["weight_global_scale"] = gs
    scale, _ = calculate_qparams(blocks.amin(-1), blocks.amax(-1), qargs, global_scale=gs)
    sd["weight_scale"] = scale
    compressed = compressor.compress(sd, scheme)
    expected = compressor.decompress(dict(compressed), scheme)["weight"]
    write(
        tmp_path,
        {f"m.{k}": v for k, v in compressed.items()},
        {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"g": scheme.model_dump()}},
    )
    (layer,) = load(str(tmp_path))
    return layer.qweight.dequantize().to(expected.dtype), expected


def test_mxfp4_pack_quantized_bit_for_bit(tmp_path):
    from compressed_tensors.compressors import MXFP4PackedCompressor

    args = dict(num_bits=4, type="float", symmetric=True, strategy="group", group_size=32, scale_dtype=torch.uint8)
    ours, expected = _fp4_case(tmp_path, MXFP4PackedCompressor, args, "mxfp4-pack-quantized")
    assert torch.equal(ours, expected)


def test_nvfp4_pack_quantized_within_one_rounding(tmp_path):
    from compressed_tensors.compressors import NVFP4PackedCompressor

    args = dict(num_bits=4, type="float", symmetric=True, strategy="tensor_group", group_size=16)
    ours, expected = _fp4_case(tmp_path, NVFP4PackedCompressor, args, "nvfp4-pack-quantized")
    # the library divides by the global scale; we multiply by its fp32 reciprocal (as serving kernels do)
    same = ours == expected
    assert same.float().mean() > 0.99
    assert torch.allclose(ours.float(), expected.float(), rtol=2**-7, atol=0)
