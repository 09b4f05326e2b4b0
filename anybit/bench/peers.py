"""The systems anybit is measured against, each built from the same float weight: torch bf16
(cuBLAS), torch FP8 `_scaled_mm` (per-channel weight, per-token activations quantized inside the
call), torch's int4 tinygemm, and humming-kernels when it imports. A peer that cannot run a cell says
why; nothing is skipped silently."""

from __future__ import annotations

from collections.abc import Callable

import torch

from anybit.formats.dtypes import FloatType, IntType
from anybit.formats.scheme import ActMode, ScaleKind, Scheme


class Unsupported(RuntimeError):
    """This peer cannot run this cell (format, device); reported as such, not as a failure."""


# peers that do not depend on the anybit scheme: timed once per (shape, M)
SCHEME_FREE = ("torch-bf16", "torch-fp8")


def torch_bf16(w: torch.Tensor) -> Callable:
    wb = w.to(torch.bfloat16 if w.is_cuda else torch.float16)  # the bench's activation dtype there
    return lambda x: x @ wb.T


def torch_fp8(w: torch.Tensor) -> Callable:
    if not w.is_cuda or torch.cuda.get_device_capability(w.device) < (8, 9):
        raise Unsupported("FP8 _scaled_mm needs an sm_89+ GPU")
    sw = (w.abs().amax(dim=1, keepdim=True).float() / 448.0).clamp(min=1e-12)
    wq = (w / sw).to(torch.float8_e4m3fn)
    wt, swt = wq.t(), sw.t().contiguous()

    def call(x):
        sx = (x.abs().amax(dim=1, keepdim=True).float() / 448.0).clamp(min=1e-12)
        xq = (x / sx).to(torch.float8_e4m3fn)
        return torch._scaled_mm(xq, wt, sx, swt, out_dtype=torch.bfloat16)

    return call


def tinygemm(w: torch.Tensor, scheme: Scheme) -> Callable:
    """torch's `_weight_int4pack_mm`: uint4 with bf16 scale and zero per group of 128."""
    g = scheme.granularity
    if not (
        isinstance(scheme.weight, IntType) and scheme.weight.bits == 4 and g.kind is ScaleKind.GROUP and g.k == 128
    ):
        raise Unsupported("tinygemm runs int4 with groups of 128 only")
    if not w.is_cuda:
        raise Unsupported("tinygemm needs a CUDA GPU")
    n, k = w.shape
    g = w.float().reshape(n, k // 128, 128)
    s = (g.abs().amax(dim=-1) / 7.0).clamp(min=1e-8)
    u = (torch.round(g / s[..., None]).clamp(-8, 7) + 8).to(torch.int32).reshape(n, k)
    packed = (u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8)
    w4 = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
    st = s.t().contiguous()
    sz = torch.stack([st, -8 * st], dim=-1).to(torch.bfloat16)  # w = (u - 8) s = u s + (-8 s)
    return lambda x: torch.ops.aten._weight_int4pack_mm(x, w4, 128, sz)


def humming_configs(scheme: Scheme) -> tuple[dict, dict | None]:
    """humming-kernels' weight and input configs moving the same bytes per weight as `scheme`."""
    w, gran = scheme.weight, scheme.granularity
    if gran.kind not in (ScaleKind.CHANNEL, ScaleKind.GROUP):
        raise Unsupported(f"humming has no {gran.token()} scales")
    group = {} if gran.kind is ScaleKind.CHANNEL else {"group_size": gran.k}
    if isinstance(w, IntType):
        wc = {"dtype": f"uint{w.bits}", **group}
    elif isinstance(w, FloatType) and w.name in ("e2m1", "e4m3", "e5m2", "e2m3", "e3m2"):
        names = {
            "e2m1": "float4e2m1",
            "e4m3": "float8e4m3",
            "e5m2": "float8e5m2",
            "e2m3": "float6e2m3",
            "e3m2": "float6e3m2",
        }
        wc = {"dtype": names[w.name], **group}
        if scheme.scale_dtype.name in ("e4m3", "ue8m0"):
            wc["scale_dtype"] = "float8e4m3" if scheme.scale_dtype.name == "e4m3" else "float8e8m0"
        if scheme.global_scale:
            wc["weight_scale_2_type"] = "tensor"
    else:
        raise Unsupported(f"no humming weight dtype for {w}")
    ic = None
    if scheme.act.quantized:
        if scheme.act.dtype.name != "e4m3" or scheme.act.mode is not ActMode.TOKEN:
            raise Unsupported(f"humming's FP8 input is dynamic per token e4m3, not {scheme.act.token()}")
        ic = {"dtype": "float8e4m3", "quant_mode": "dynamic_token"}
    return wc, ic


def humming(w: torch.Tensor, scheme: Scheme) -> Callable:
    from humming.layer import HummingLayer  # optional extra: anybit[humming]

    wc, ic = humming_configs(scheme)
    n, k = w.shape
    layer = HummingLayer(shape_n=n, shape_k=k, weight_config=wc, input_config=ic, torch_dtype=torch.bfloat16)
    layer = layer.to(w.device)
    layer.load_from_unquantized(w.to(torch.bfloat16))
    layer.transform()
    return layer
