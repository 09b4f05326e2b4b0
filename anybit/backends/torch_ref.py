"""The `torch` backend: dequantize, then matmul. Exact, runs everywhere; the fallback and the oracle.

FP8 weights with per-channel (or per-tensor) fp32 scales and dynamic per-token e4m3 activations go
through `torch._scaled_mm` instead: the same FP8 operands and scales, products summed in fp32 — the
exact result without materialising the fp32 weight (sm_89+ GPUs with bf16 activations, and CPUs)."""

from __future__ import annotations

import torch

from anybit.backends.base import Prepared, Problem
from anybit.formats.scheme import ActMode, ScaleKind, Scheme
from anybit.quant.activations import dequantize_activation, quantize_activation
from anybit.quant.weights import QuantizedWeight


def scaled_mm_operands(qw: QuantizedWeight) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(FP8 weight [N, K], fp32 scales [1, N]) when `_scaled_mm` computes this scheme exactly, else None."""
    s: Scheme = qw.scheme
    if not (
        s.weight.name == "e4m3"
        and s.act.quantized
        and s.act.dtype.name == "e4m3"
        and s.act.mode in (ActMode.TOKEN, ActMode.STATIC)
        and s.granularity.kind in (ScaleKind.CHANNEL, ScaleKind.TENSOR)
        and s.scale_dtype.name == "fp32"
        and qw.zeros is None
        and qw.global_scale is None
        and not qw.lead
    ):
        return None
    w = qw.codes().view(torch.float8_e4m3fn)
    sv = qw.scale_values().reshape(-1)
    sw = sv.repeat(qw.n // sv.numel()).reshape(1, qw.n)  # per tensor: one value repeated per channel
    return w, sw


def _fp8_mma(device: torch.device, n: int, k: int) -> bool:
    """cuBLAS's FP8 GEMM: sm_89+, N and K multiples of 16."""
    return torch.cuda.get_device_capability(device) >= (8, 9) and n % 16 == 0 and k % 16 == 0


class TorchBackend:
    name = "torch"

    def supports(self, problem: Problem) -> tuple[bool, str]:
        return True, "dequantize + torch.matmul runs every scheme on every device"

    def prepare(self, qweight: QuantizedWeight) -> Prepared:
        return Prepared(self.name, qweight, scaled_mm_operands(qweight))

    def gemm(self, x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None = None) -> torch.Tensor:
        qw = prepared.qweight
        act = qw.scheme.act
        static = qw.require_input_scale() if act.quantized and act.mode is ActMode.STATIC else None
        fp8 = prepared.data if prepared.backend == self.name else None  # (triton hands fp32 x here)
        if fp8 is not None and (not x.is_cuda or (x.dtype == torch.bfloat16 and _fp8_mma(x.device, qw.n, qw.k))):
            xq, sx = quantize_activation(x.reshape(-1, qw.k), act, static)
            sx = sx.reshape(1, 1).repeat(xq.shape[0], 1) if sx.dim() == 0 else sx  # static: one per row
            # row-wise scaled FP8 GEMMs on CUDA return bf16 only (one rounding, as the final cast does)
            out = torch.bfloat16 if x.is_cuda else torch.float32
            y = torch._scaled_mm(xq, fp8[0].t(), sx, fp8[1], out_dtype=out)
            y = y.reshape(*x.shape[:-1], qw.n)
        else:
            xf = dequantize_activation(*quantize_activation(x, act, static), act) if act.quantized else x.float()
            # fp32 matmul of the exact dequantized values; the output takes the activations' dtype
            y = xf @ qw.dequantize(torch.float32).T
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype)
