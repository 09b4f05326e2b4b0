"""Dequantize a prepared weight to a bf16/fp16 matrix Wt [K, N] in one pass (for large M, where
dequantize-then-cuBLAS beats dequantizing in the GEMM's main loop: the weight is expanded once per
call instead of once per M tile). Values equal `QuantizedWeight.dequantize()` rounded once to the
output dtype."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from anybit.kernels.dequant import cdiv, decode_weight, load_codes, load_scale, plane_args


@triton.jit
def _dequant_a16_kernel(
    p0_ptr,
    p1_ptr,
    p2_ptr,
    s_ptr,
    z_ptr,
    gs_ptr,
    out_ptr,
    N,
    K,
    stride_s,
    W_BITS: tl.constexpr,
    W0: tl.constexpr,
    W1: tl.constexpr,
    W2: tl.constexpr,
    W_FLOAT: tl.constexpr,
    W_SIGNED: tl.constexpr,
    W_EXP: tl.constexpr,
    W_MAN: tl.constexpr,
    SCALE_KIND: tl.constexpr,
    S_EXP: tl.constexpr,
    S_MAN: tl.constexpr,
    ZP: tl.constexpr,
    GROUP_K: tl.constexpr,
    GROUP_N: tl.constexpr,
    HAS_GS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    k0 = tl.program_id(0) * BLOCK_K
    offs_k = k0 + tl.arange(0, BLOCK_K)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    mask = (offs_k < K)[:, None] & mask_n[None, :]
    codes = load_codes(p0_ptr, p1_ptr, p2_ptr, k0, offs_n, mask_n, K, N, BLOCK_K, W0, W1, W2)
    q = decode_weight(codes, W_BITS, W_FLOAT, W_SIGNED, W_EXP, W_MAN)
    rows = (offs_k // GROUP_K)[:, None]
    cols = (offs_n // GROUP_N)[None, :]
    s = load_scale(s_ptr, rows, cols, mask, stride_s, SCALE_KIND, S_EXP, S_MAN)
    if ZP != 0:
        q = q - tl.load(z_ptr + rows * stride_s + cols, mask=mask, other=0).to(tl.float32)
    w = q * s
    if HAS_GS:
        w = w * tl.load(gs_ptr)
    tl.store(out_ptr + offs_k[:, None] * N + offs_n[None, :], w.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_a16(tw, *, dtype: torch.dtype, block_k: int = 64, block_n: int = 128) -> torch.Tensor:
    """Prepared weight (`anybit.backends.triton_layout.TritonWeight`) -> Wt [K, N] in `dtype`."""
    n, k, scales, zeros, global_scale = tw.n, tw.k, tw.scales, tw.zeros, tw.global_scale
    if tw.frag:
        raise ValueError("this weight is in the fragment layout (anybit.kernels.frag): use dequantize_frag")
    planes, plane_bits, group_k, group_n, fmt = tw.planes, tw.plane_bits, tw.group_k, tw.group_n, tw.fmt
    out = torch.empty((k, n), device=scales.device, dtype=dtype)
    p, w = plane_args(planes, plane_bits)
    grid = (cdiv(k, block_k), cdiv(n, block_n))
    _dequant_a16_kernel[grid](
        p[0],
        p[1],
        p[2],
        scales,
        zeros if zeros is not None else scales,
        global_scale if global_scale is not None else scales,
        out,
        n,
        k,
        scales.stride(0),
        W0=w[0],
        W1=w[1],
        W2=w[2],
        GROUP_K=group_k,
        GROUP_N=group_n,
        HAS_GS=global_scale is not None,
        BLOCK_K=block_k,
        BLOCK_N=block_n,
        num_warps=4,
        **fmt,
    )
    return out
