"""The `torch` backend: dequantize, then matmul. Exact, runs everywhere; the fallback and the oracle."""

from __future__ import annotations

import torch

from anybit.backends.base import Prepared, Problem
from anybit.quant.activations import dequantize_activation, quantize_activation
from anybit.quant.weights import QuantizedWeight


class TorchBackend:
    name = "torch"

    def supports(self, problem: Problem) -> tuple[bool, str]:
        return True, "dequantize + torch.matmul runs every scheme on every device"

    def prepare(self, qweight: QuantizedWeight) -> Prepared:
        return Prepared(self.name, qweight, None)

    def gemm(self, x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None = None) -> torch.Tensor:
        qw = prepared.qweight
        act = qw.scheme.act
        xf = dequantize_activation(*quantize_activation(x, act), act) if act.quantized else x.float()
        # fp32 matmul of the exact dequantized values; the output takes the activations' dtype
        y = xf @ qw.dequantize(torch.float32).T
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype)
