"""The systems anybit is measured against, each built from the same float weight: torch bf16
(cuBLAS), torch FP8 `_scaled_mm` (per-channel weight, per-token activations quantized inside the
call), torch's int4 tinygemm, and humming-kernels when it imports. A peer that cannot run a cell says
why; nothing is skipped silently."""

from __future__ import annotations

from collections.abc import Callable

import torch

from anybit import errors
from anybit.backends.humming import humming_configs
from anybit.formats.dtypes import IntType
from anybit.formats.scheme import ScaleKind, Scheme

# a peer that cannot run a cell (format, device) raises this; reported as such, not as a failure
Unsupported = errors.Unsupported


# peers that do not depend on the anybit scheme: timed once per (shape, M)
SCHEME_FREE = ("torch-bf16", "torch-fp8", "torch-fp8-mm")


def torch_bf16(w: torch.Tensor) -> Callable:
    wb = w.to(torch.bfloat16 if w.is_cuda else torch.float16)  # the bench's activation dtype there
    return lambda x: x @ wb.T


def torch_fp8(w: torch.Tensor, quantize_x: bool = True) -> Callable:
    """FP8 `_scaled_mm` (per-channel weight, per-token activations). `quantize_x=False` (the
    "torch-fp8-mm" peer): the activations are quantized once, outside the timed calls — the bare GEMM
    the FP8 targets are stated against."""
    if not w.is_cuda or torch.cuda.get_device_capability(w.device) < (8, 9):
        raise Unsupported("FP8 _scaled_mm needs an sm_89+ GPU")
    sw = (w.abs().amax(dim=1, keepdim=True).float() / 448.0).clamp(min=1e-12)
    wq = (w / sw).to(torch.float8_e4m3fn)
    wt, swt = wq.t(), sw.t().contiguous()

    def quant(x):
        sx = (x.abs().amax(dim=1, keepdim=True).float() / 448.0).clamp(min=1e-12)
        return (x / sx).to(torch.float8_e4m3fn), sx

    def call(x):
        xq, sx = quant(x)
        return torch._scaled_mm(xq, wt, sx, swt, out_dtype=torch.bfloat16)

    if quantize_x:
        return call
    cached: dict = {}

    def call_mm(x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in cached:  # the bench times one x per cell: quantized at the warm-up call
            cached.clear()
            cached[key] = quant(x)
        xq, sx = cached[key]
        return torch._scaled_mm(xq, wt, sx, swt, out_dtype=torch.bfloat16)

    return call_mm


def tinygemm(w: torch.Tensor, scheme: Scheme) -> Callable:
    """torch's `_weight_int4pack_mm` (on the CPU its `_for_cpu` twin): uint4 with a bf16 scale and zero per group of
    128. The kernel computes (u - 8) s + z, so symmetric int4 takes z = 0 (session 54's first GPU eval read a relative
    error of 3 with z = -8 s)."""
    g = scheme.granularity
    if not (
        isinstance(scheme.weight, IntType) and scheme.weight.bits == 4 and g.kind is ScaleKind.GROUP and g.k == 128
    ):
        raise Unsupported("tinygemm runs int4 with groups of 128 only")
    n, k = w.shape
    g = w.float().reshape(n, k // 128, 128)
    s = (g.abs().amax(dim=-1) / 7.0).clamp(min=1e-8)
    u = (torch.round(g / s[..., None]).clamp(-8, 7) + 8).to(torch.int32).reshape(n, k)
    st = s.t().contiguous()
    sz = torch.stack([st, torch.zeros_like(st)], dim=-1).to(torch.bfloat16)  # [K/128, N, (scale, zero)]
    if not w.is_cuda:
        w4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u, 1)
        return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, w4, 128, sz)
    packed = (u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8)
    w4 = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
    return lambda x: torch.ops.aten._weight_int4pack_mm(x, w4, 128, sz)


def humming(w: torch.Tensor, scheme: Scheme) -> Callable:
    from humming.layer import HummingLayer  # optional extra: anybit[humming]

    wc, ic = humming_configs(scheme, exact_scales=False)  # humming quantizes the float weight itself
    n, k = w.shape
    layer = HummingLayer(shape_n=n, shape_k=k, weight_config=wc, input_config=ic, torch_dtype=torch.bfloat16)
    layer = layer.to(w.device)
    layer.load_from_unquantized(w.to(torch.bfloat16))
    layer.transform()
    return layer
