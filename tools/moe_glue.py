"""The glue a serving engine puts around a MoE whose GEMMs fuse nothing (Humming's indexed MoE in vLLM): silu(gate) * up
of the gate_up output in one pass (vLLM's `silu_and_mul`), and the top-k weighted sum of the down output in one pass
(what vLLM's `moe_sum` does after a down GEMM that multiplied the weights in). tools/moe_bench.py builds Humming's whole
layer with these, so the layer comparison times a peer's glue at its minimal traffic, not torch's multi-kernel ops
(session 42: torch's float casts, silu, mul and sum cost ~0.45 ms of Humming's DeepSeek-V3 layer at M=1024 and ~1.8 ms
at 4096, which our fused epilogues do not pay). A peer's glue for timing, not part of the library."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(h_ptr, out_ptr, inter, stride_h, stride_o, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(h_ptr + row * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(h_ptr + row * stride_h + inter + cols, mask=mask, other=0.0).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + cols, act.to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(h: torch.Tensor) -> torch.Tensor:
    """[R, 2I] (gate columns, then up) -> silu(gate) * up [R, I] in h's dtype, fp32 inside; one read, one write."""
    r, two_i = h.shape
    if two_i % 2 or h.stride(1) != 1:
        raise ValueError(f"h must be [R, 2I] with contiguous rows, got {tuple(h.shape)} strides {h.stride()}")
    inter = two_i // 2
    out = torch.empty((r, inter), device=h.device, dtype=h.dtype)
    block = min(1024, triton.next_power_of_2(inter))
    _silu_mul_kernel[(r, triton.cdiv(inter, block))](h, out, inter, h.stride(0), out.stride(0), BLOCK=block)
    return out


@triton.jit
def _weighted_sum_kernel(y_ptr, w_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        w = tl.load(w_ptr + t * TOP_K + k).to(tl.float32)
        acc += w * tl.load(y_ptr + (t * TOP_K + k) * hidden + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def weighted_sum(y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """y [T * k, H] (slot t * k + j holds token t's j-th expert's output), weights [T, k] -> sum_j weights[t, j] *
    y[t * k + j] [T, H] in y's dtype, fp32 inside; one read of y, one write."""
    t, k = weights.shape
    if y.shape[0] != t * k or not y.is_contiguous() or not weights.is_contiguous():
        raise ValueError(f"y {tuple(y.shape)} must be contiguous [T * k, H] for weights {tuple(weights.shape)}")
    hidden = y.shape[1]
    out = torch.empty((t, hidden), device=y.device, dtype=y.dtype)
    block = min(1024, triton.next_power_of_2(hidden))
    _weighted_sum_kernel[(t, triton.cdiv(hidden, block))](y, weights, out, hidden, TOP_K=k, BLOCK=block)
    return out
