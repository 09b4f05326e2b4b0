"""Reference activation quantization for every `ActSpec` (the kernels' fused versions match it).

``quantize_activation(x, spec)`` takes x [..., K] (fp32/bf16/fp16) and returns ``(xq, scales)``:
xq has x's shape in torch.float8_e4m3fn / float8_e5m2 / int8, and scales is fp32 —
[..., 1] per token, [..., K/g] per group, [] static — such that ``x ≈ xq * scales`` (broadcast per
group). A zero row gets the smallest scale, never NaN; values saturate at the format's max.
"""

from __future__ import annotations

import torch

from anybit.errors import QuantizationError
from anybit.formats.dtypes import FloatType, torch_float8
from anybit.formats.scheme import ActMode, ActSpec


def act_qmax(spec: ActSpec) -> float:
    return spec.dtype.max


def min_act_scale(spec: ActSpec) -> float:
    """Floor of dynamic scales so an all-zero row divides by a positive number (as vLLM does)."""
    return 1.0 / (act_qmax(spec) * 512.0)


def act_storage_dtype(spec: ActSpec) -> torch.dtype:
    if isinstance(spec.dtype, FloatType):
        return torch_float8(spec.dtype)
    return torch.int8


def quantize_activation(
    x: torch.Tensor, spec: ActSpec, static_scale: torch.Tensor | float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    if not spec.quantized:
        raise QuantizationError("this activation spec keeps activations in bf16/fp16; nothing to quantize")
    if not x.is_floating_point():
        raise QuantizationError(f"activations must be a float tensor, got {x.dtype}")
    if not bool(torch.isfinite(x).all()):
        raise QuantizationError("activations hold NaN or Inf; cannot quantize them")
    qmax = act_qmax(spec)
    xf = x.float()
    if spec.mode is ActMode.STATIC:
        if static_scale is None:
            raise QuantizationError(f"activation spec {spec.token()} needs a static (calibrated) scale")
        scales = torch.as_tensor(static_scale, dtype=torch.float32, device=x.device).reshape(())
        if not bool(scales > 0):
            raise QuantizationError(f"static activation scale must be positive, got {float(scales)}")
        expanded = scales
    elif spec.mode is ActMode.TOKEN:
        scales = (xf.abs().amax(dim=-1, keepdim=True) / qmax).clamp(min=min_act_scale(spec))
        expanded = scales
    else:
        k, g = x.shape[-1], spec.group
        if k % g:
            raise QuantizationError(f"K={k} is not a multiple of the activation group size {g}")
        grouped = xf.reshape(*x.shape[:-1], k // g, g)
        scales = (grouped.abs().amax(dim=-1) / qmax).clamp(min=min_act_scale(spec))
        expanded = scales.repeat_interleave(g, dim=-1)
    y = (xf / expanded).clamp(-qmax, qmax)
    if isinstance(spec.dtype, FloatType):
        return y.to(act_storage_dtype(spec)), scales
    return torch.round(y).to(torch.int8), scales


def dequantize_activation(xq: torch.Tensor, scales: torch.Tensor, spec: ActSpec) -> torch.Tensor:
    """fp32 values xq * scales (scales broadcast per token / group / tensor)."""
    if spec.mode is ActMode.GROUP:
        scales = scales.repeat_interleave(spec.group, dim=-1)
    return xq.float() * scales
