"""`QuantMoE`: expert-stacked quantized gate/up and down projections computing
y[t] = sum_j w[t, j] * down_e(silu(gate_e(x[t])) * up_e(x[t])) with e = ids[t, j].

Today every expert runs through `anybit.gemm` on its rows (the exact reference the grouped kernels
will be checked against); ids of -1 (dropped or non-local experts) contribute nothing."""

from __future__ import annotations

import torch
from torch import nn

from anybit.backends.registry import gemm, prepare
from anybit.errors import AnybitError
from anybit.formats.scheme import Scheme
from anybit.quant.weights import QuantizedWeight, quantize


class QuantMoE(nn.Module):
    def __init__(self, gate_up: QuantizedWeight, down: QuantizedWeight, backend: str = "auto"):
        super().__init__()
        if len(gate_up.shape) != 3 or len(down.shape) != 3:
            raise AnybitError(f"expert stacks must be (E, N, K): gate_up {gate_up.shape}, down {down.shape}")
        e, two_i, h = gate_up.shape
        if two_i % 2 or down.shape != (e, h, two_i // 2):
            raise AnybitError(
                f"gate_up {gate_up.shape} (gate rows, then up rows) and down {down.shape} must be "
                f"(E, 2I, H) and (E, H, I)"
            )
        self.num_experts, self.hidden, self.intermediate = e, h, two_i // 2
        self.gate_up, self.down, self.backend = gate_up, down, backend
        self._prepared: dict[int, tuple] = {}

    @classmethod
    def from_float(cls, gate_up: torch.Tensor, down: torch.Tensor, scheme: Scheme | str, backend="auto") -> QuantMoE:
        return cls(quantize(gate_up, scheme), quantize(down, scheme), backend)

    @classmethod
    def from_quantized(cls, gate_up: QuantizedWeight, down: QuantizedWeight) -> QuantMoE:
        return cls(gate_up, down)

    def _expert(self, e: int) -> tuple:
        if e not in self._prepared:
            self._prepared[e] = (
                prepare(self.gate_up.expert(e), self.backend),
                prepare(self.down.expert(e), self.backend),
            )
        return self._prepared[e]

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        if (
            x.dim() != 2
            or x.shape[1] != self.hidden
            or topk_ids.shape != topk_weights.shape
            or topk_ids.shape[0] != x.shape[0]
        ):
            raise AnybitError(
                f"x {tuple(x.shape)} must be [T, {self.hidden}] with topk_weights/topk_ids "
                f"{tuple(topk_weights.shape)}/{tuple(topk_ids.shape)} of shape [T, k]"
            )
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        ids = topk_ids.long()
        for e in torch.unique(ids[ids >= 0]).tolist():
            if e >= self.num_experts:
                raise AnybitError(f"expert id {e} out of range for {self.num_experts} experts")
            tok, slot = (ids == e).nonzero(as_tuple=True)
            gu, dn = self._expert(e)
            hidden = gemm(x[tok], gu)
            act = (
                torch.nn.functional.silu(hidden[:, : self.intermediate].float())
                * hidden[:, self.intermediate :].float()
            )
            y = gemm(act.to(x.dtype), dn).float()
            out.index_add_(0, tok, y * topk_weights[tok, slot].float()[:, None])
        return out.to(x.dtype)
