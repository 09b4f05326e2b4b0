"""The bf16 baseline peer of tools/moe_bench.py: an indexed grouped GEMM over bf16 expert weights
[E, N, K] in plain Triton (what a vLLM-style fused-MoE kernel does without quantization), on the
same alignment as anybit's kernel. A peer for timing, not part of the library."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


# fmt: off
@triton.jit
def _bf16_moe_kernel(x_ptr, w_ptr, y_ptr, sorted_ptr, expert_ptr, total_ptr, num_rows, n_sorted, N, K, stride_xm,
                     stride_we, stride_wn, stride_ym, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(expert_ptr + pid_m)
    if pid_m * BLOCK_M < tl.load(total_ptr) and e >= 0:
        pos = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = tl.load(sorted_ptr + pos, mask=pos < n_sorted, other=num_rows)
        mask_m = rows < num_rows
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + (rows // TOP_K)[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
        w_ptrs = w_ptr + e.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            mk = (k0 + offs_k) < K
            x = tl.load(x_ptrs + k0, mask=mask_m[:, None] & mk[None, :], other=0.0)
            w = tl.load(w_ptrs + k0, mask=mk[:, None] & (offs_n < N)[None, :], other=0.0)
            acc = tl.dot(x, w, acc)
        y_ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & (offs_n < N)[None, :])
# fmt: on


def bf16_moe_gemm(x, w, sorted_ids, expert_ids, total, *, num_rows: int, top_k: int, block_m: int, out=None):
    """y [num_rows, N] = x[row // top_k] @ w[expert]^T for the aligned rows (w: bf16 [E, N, K])."""
    e, n, k = w.shape
    y = out if out is not None else torch.empty((num_rows, n), device=x.device, dtype=x.dtype)
    big = block_m >= 64
    bn, bk, warps, stages = (128, 64, 8 if block_m >= 128 else 4, 3) if big else (64, 128, 4, 4)
    grid = (expert_ids.numel(), triton.cdiv(n, bn))
    _bf16_moe_kernel[grid](x, w, y, sorted_ids, expert_ids, total, num_rows, sorted_ids.numel(), n, k, x.stride(0),
                           w.stride(0), w.stride(1), y.stride(0), TOP_K=top_k, BLOCK_M=block_m, BLOCK_N=bn,
                           BLOCK_K=bk, num_warps=warps, num_stages=stages)  # fmt: skip
    return y


def bf16_weights(e: int, n: int, k: int, device) -> torch.Tensor:
    return (torch.randn(e, n, k, device=device) * 0.02).bfloat16()
