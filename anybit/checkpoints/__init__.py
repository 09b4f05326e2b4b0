"""Quantized checkpoints in the wild -> `QuantizedWeight`s, lazily, tensor by tensor.

    for layer in anybit.checkpoints.load("path/to/model"):
        layer.name, layer.qweight, layer.bias, layer.act_perm

`config.json`'s `quantization_config` (or ModelOpt's `hf_quant_config.json`, or AutoGPTQ's
`quantize_config.json`) picks the format:
GPTQ (act-order included), AWQ (GEMM), FP8 (block / channel / tensor), ModelOpt NVFP4, gpt-oss
MXFP4, compressed-tensors (pack-quantized, naive-quantized, float-quantized). Unknown methods and
malformed files raise `CheckpointError` naming the file and tensor.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from anybit.checkpoints import formats
from anybit.checkpoints.reader import Reader
from anybit.errors import CheckpointError
from anybit.formats.scheme import ActMode
from anybit.quant.weights import QuantizedWeight


@dataclass
class LoadedLayer:
    name: str  # the module's name, e.g. model.layers.0.self_attn.q_proj (gpt-oss: ...experts.gate_up_proj)
    qweight: QuantizedWeight
    bias: torch.Tensor | None = None
    act_perm: torch.Tensor | None = None  # act-order: compute x[..., act_perm] @ W^T
    input_scale: torch.Tensor | None = None  # a static activation scale, where the checkpoint has one


# method -> (converter, the tensor suffix that marks a quantized module)
_METHODS = {
    "gptq": (formats.gptq, ".qweight"),
    "awq": (formats.awq, ".qweight"),
    "fp8": (formats.fp8, ".weight_scale_inv"),
    "modelopt": (formats.nvfp4, ".weight_scale_2"),
    "mxfp4": (formats.mxfp4, "_blocks"),
    "compressed-tensors": (formats.compressed_tensors, ".weight_scale"),
}


def quantization_config(model_dir: str) -> dict:
    """The checkpoint's quantization config, with `quant_method` normalised."""
    cfg = {}
    path = os.path.join(model_dir, "config.json")
    if os.path.exists(path):
        try:
            with open(path) as f:
                cfg = json.load(f).get("quantization_config") or {}
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: not readable JSON ({e})") from None
    modelopt = os.path.join(model_dir, "hf_quant_config.json")
    if not cfg and os.path.exists(modelopt):
        with open(modelopt) as f:
            cfg = {"quant_method": "modelopt", **json.load(f).get("quantization", {})}
    legacy_gptq = os.path.join(model_dir, "quantize_config.json")  # AutoGPTQ before config.json carried it
    if not cfg and os.path.exists(legacy_gptq):
        with open(legacy_gptq) as f:
            cfg = {"quant_method": "gptq", **json.load(f)}
    method = str(cfg.get("quant_method", "")).lower()
    if not method:
        raise CheckpointError(f"{model_dir}: no quantization_config in config.json (nor hf_quant_config.json)")
    if method == "modelopt" and str(cfg.get("quant_algo", "NVFP4")).upper() != "NVFP4":
        raise CheckpointError(f"{model_dir}: ModelOpt quant_algo {cfg.get('quant_algo')!r}; supported: NVFP4")
    if method not in _METHODS:
        raise CheckpointError(f"{model_dir}: quant_method {method!r} is not supported; supported: {sorted(_METHODS)}")
    return {**cfg, "quant_method": method}


def _matches(pattern: str, name: str) -> bool:
    """compressed-tensors targets: 're:<regex>' on the module name, else a layer class or exact name
    (class names match every quantized module: the checkpoint has no classes)."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return pattern == name or pattern.endswith("Linear") or pattern == name.rsplit(".", 1)[-1]


def _ct_group(cfg: dict, prefix: str) -> dict | None:
    if any(_matches(p, prefix) and not p.endswith("Linear") for p in cfg.get("ignore") or []):
        return None
    for group in (cfg.get("config_groups") or {}).values():
        if any(_matches(t, prefix) for t in group.get("targets", [])):
            return group
    return None


def load(model_dir: str) -> Iterator[LoadedLayer]:
    """Every quantized layer of the checkpoint, one at a time (only its tensors are read)."""
    cfg = quantization_config(model_dir)
    convert, marker = _METHODS[cfg["quant_method"]]
    if cfg["quant_method"] == "fp8" and not cfg.get("weight_block_size"):
        marker = ".weight_scale"
    reader = Reader(model_dir)
    prefixes = sorted(name[: -len(marker)] for name in reader.names() if name.endswith(marker))
    if not prefixes:
        raise CheckpointError(f"{model_dir}: quant_method {cfg['quant_method']!r} but no tensor ends in {marker!r}")
    for prefix in prefixes:
        if cfg["quant_method"] == "compressed-tensors":
            group = _ct_group(cfg, prefix)
            if group is None:
                continue  # in `ignore`, or no config group targets it: not quantized
            qweight, perm = convert(reader, prefix, {**cfg, "_group": group})
        else:
            qweight, perm = convert(reader, prefix, cfg)
        bias_name = f"{prefix}_bias" if marker == "_blocks" else f"{prefix}.bias"
        bias = reader.get(bias_name) if bias_name in reader else None
        scale_name = f"{prefix}.input_scale"
        input_scale = reader.get(scale_name) if scale_name in reader else None
        act = qweight.scheme.act
        if act.quantized and act.mode is ActMode.STATIC:
            if input_scale is None:
                raise CheckpointError(f"{model_dir}: {scale_name} missing; scheme {qweight.scheme} needs it")
            if input_scale.numel() != 1:
                raise CheckpointError(f"{scale_name} has {input_scale.numel()} values; a static scale is one number")
            qweight.input_scale = input_scale.float().reshape(qweight.lead)
            qweight.validate()
        yield LoadedLayer(prefix, qweight, bias, perm, input_scale)


def load_quantized_hf(model_dir: str, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"):
    """A transformers causal LM from a quantized checkpoint directory, its quantized linear layers as
    anybit `QuantLinear`s (act-order permutations kept), every other tensor loaded as is.
    Dense models; expert-stacked MoE weights need the MoE layers (not built yet) and are refused."""
    import transformers

    from anybit.layers import QuantLinear, _set_module

    config = transformers.AutoConfig.from_pretrained(model_dir)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # anybit quantizes; transformers must not re-quantize
    model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=dtype)
    quantized = set()
    for layer in load(model_dir):
        if len(layer.qweight.shape) != 2:
            raise CheckpointError(f"{layer.name}: expert-stacked weights need anybit's MoE layers (not built yet)")
        try:
            old = model.get_submodule(layer.name)
        except AttributeError:
            where = type(model).__name__
            raise CheckpointError(f"{model_dir}: quantized layer {layer.name!r} is not in {where}") from None
        if (getattr(old, "out_features", None), getattr(old, "in_features", None)) != tuple(layer.qweight.shape):
            raise CheckpointError(f"{layer.name}: checkpoint weight {layer.qweight.shape} does not fit {old}")
        bias = layer.bias.to(dtype) if layer.bias is not None else None
        _set_module(model, layer.name, QuantLinear.from_quantized(layer.qweight, bias, layer.act_perm))
        quantized.add(layer.name)
    reader = Reader(model_dir)
    state = {}
    for name in reader.names():
        module = name.rsplit(".", 1)[0]
        if module in quantized:
            continue
        state[name] = reader.get(name)
    missing, unexpected = model.load_state_dict(state, strict=False)
    own = {n for n, _ in model.named_buffers()} | {n for n, _ in model.named_parameters()}
    missing = [m for m in missing if m.rsplit(".", 1)[0] not in quantized and m in own]
    tied = getattr(config, "tie_word_embeddings", False)
    missing = [m for m in missing if not (tied and m == "lm_head.weight")]
    if missing or unexpected:
        raise CheckpointError(f"{model_dir}: tensors missing {missing[:8]} / unexpected {unexpected[:8]}")
    if tied:
        model.tie_weights()
    return model.to(device).eval()


__all__ = ["LoadedLayer", "load", "load_quantized_hf", "quantization_config"]
