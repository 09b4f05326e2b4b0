"""Dense GEMM with bf16/fp16 activations and weights of any format, dequantized in registers.

y[M, N] = x[M, K] @ dequantize(W)[N, K]^T (+ bias), fp32 accumulation, output in x's dtype.

One kernel, specialised at compile time by the weight format (bits, int/float, exponent/mantissa,
sign), the scale dtype and layout, the zero point and the tile. Scales are applied where it is
cheapest and exact: after the dot for the whole K range (per-channel / per-tensor scales,
``SCALE_AT=0``), after each K tile's dot when a tile lies inside one scale group
(``group_k % BLOCK_K == 0``, ``SCALE_AT=1``: the dot then sees integer or small-float weight values,
exact in bf16/fp16), or per element before the dot (groups smaller than a tile, ``SCALE_AT=2``).

Integer formats of one 2- or 4-bit plane with whole-tile scales (``PAIRS``) skip fp32 entirely: two
codes per shift+LOP3 become ``MAGIC + code`` in x's dtype (bf16 128, fp16 1024), and one packed
subtraction of MAGIC, the sign bias and an integer zero point leaves the exact integer weight.

Split-K for small M: ``SPLIT_K`` programs share an output tile; each writes its fp32 partial to a
workspace, and the last to arrive (an atomic counter per tile) sums them, applies the epilogue and
resets its counter — one launch, no host synchronisation, replayable in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from anybit.kernels.dequant import cdiv, decode_weight, load_codes, load_pairs, load_scale, plane_args
from anybit.kernels.splitk import store_or_reduce


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    pairs: bool | None = None  # 2/4-bit ints decoded two per instruction (None: where the format allows)
    maxnreg: int | None = None  # frag kernel: registers per thread capped (more CTAs per SM); None: ptxas's count


def fewer_stages(error: OutOfResources, tile):
    """`tile` (a GemmConfig or a launch dict with num_stages) one pipeline stage shallower, after its launch
    asked more shared memory per block than this GPU has (sm_86/sm_89: 99 KB, where the Hopper M=64 and
    MoE prefill tiles ask 108-117 KB). The launch never ran, so the caller retries; other resources, and
    tiles at 2 stages already, re-raise."""
    stages = tile["num_stages"] if isinstance(tile, dict) else tile.num_stages
    if error.name != "shared memory" or stages <= 2:
        raise error
    return dict(tile, num_stages=stages - 1) if isinstance(tile, dict) else replace(tile, num_stages=stages - 1)


@triton.jit
def scale_zero(
    s_ptr,
    z_ptr,
    rows,
    cols,
    mask,
    stride_s,
    SCALE_KIND: tl.constexpr,
    S_EXP: tl.constexpr,
    S_MAN: tl.constexpr,
    ZP: tl.constexpr,
):
    s = load_scale(s_ptr, rows, cols, mask, stride_s, SCALE_KIND, S_EXP, S_MAN)
    if ZP == 0:
        z = tl.zeros_like(s)
    else:
        z = tl.load(z_ptr + rows * stride_s + cols, mask=mask, other=0).to(tl.float32)
    return s, z


@triton.jit
def group_scaled(q, s_ptr, z_ptr, k0, K, mask_n, cols_n, stride_s, GROUP_K: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_N: tl.constexpr, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
                 ZP: tl.constexpr):  # fmt: skip
    """(q - z) * s for a [BLOCK_K, BLOCK_N] tile holding several scale groups along K (groups smaller
    than the tile): one scale (and zero) per group row, broadcast over its GROUP_K rows."""
    g_rows = k0 // GROUP_K + tl.arange(0, BLOCK_K // GROUP_K)
    g_mask = (g_rows * GROUP_K < K)[:, None] & mask_n[None, :]
    s, z = scale_zero(s_ptr, z_ptr, g_rows[:, None], cols_n[None, :], g_mask, stride_s, SCALE_KIND, S_EXP, S_MAN, ZP)
    q3 = tl.reshape(q, (BLOCK_K // GROUP_K, GROUP_K, BLOCK_N))
    return tl.reshape((q3 - z[:, None, :]) * s[:, None, :], (BLOCK_K, BLOCK_N))


@triton.jit
def _gemm_kernel(
    x_ptr,
    xs_ptr,
    p0_ptr,
    p1_ptr,
    p2_ptr,
    s_ptr,
    z_ptr,
    gs_ptr,
    bias_ptr,
    y_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_ym,
    stride_s,
    stride_xs,
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
    SCALE_AT: tl.constexpr,
    HAS_GS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PAIRS: tl.constexpr,
    ACT: tl.constexpr,
    X_GROUP: tl.constexpr,
    W_NK: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: GROUP_M row-tiles share weight tiles while they are in L2
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    rows_in_group = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % rows_in_group
    pid_n = (pid % width) // rows_in_group

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < N
    cols_n = offs_n // GROUP_N

    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    kt_start = pid_k * per_split
    kt_end = tl.minimum(kt_start + per_split, k_tiles)

    if x_ptr.dtype.element_ty == tl.bfloat16:
        magic_off = 128.0
    else:
        magic_off = 1024.0
    if W_SIGNED:
        magic_off += 1 << (W_BITS - 1)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kt in range(kt_start, kt_end):
        offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0
        )
        if PAIRS:
            # integer codes as MAGIC + code in x's dtype, two per instruction; subtracting MAGIC, the
            # sign bias and an integer zero point stays exact in bf16/fp16
            v = load_pairs(p0_ptr, kt * BLOCK_K, offs_n, mask_n, K, N, BLOCK_K, W0, x_ptr.dtype.element_ty)
            row = (kt * BLOCK_K) // GROUP_K
            s, z = scale_zero(s_ptr, z_ptr, row, cols_n, mask_n, stride_s, SCALE_KIND, S_EXP, S_MAN, ZP)
            w = v - (z + magic_off).to(x_ptr.dtype.element_ty)[None, :]
            if SCALE_AT == 1:
                acc += tl.dot(x, w) * s[None, :]
            else:
                acc = tl.dot(x, w, acc)
        elif SCALE_AT == 2:
            codes = load_codes(p0_ptr, p1_ptr, p2_ptr, kt * BLOCK_K, offs_n, mask_n, K, N, BLOCK_K, W0, W1, W2)
            q = decode_weight(codes, W_BITS, W_FLOAT, W_SIGNED, W_EXP, W_MAN)
            w = group_scaled(q, s_ptr, z_ptr, kt * BLOCK_K, K, mask_n, cols_n, stride_s, GROUP_K, BLOCK_K, BLOCK_N,
                             SCALE_KIND, S_EXP, S_MAN, ZP)  # fmt: skip
            acc += tl.dot(x, w.to(x.dtype))
        else:
            row = (kt * BLOCK_K) // GROUP_K  # 0 for SCALE_AT == 0, where GROUP_K >= K
            s, z = scale_zero(s_ptr, z_ptr, row, cols_n, mask_n, stride_s, SCALE_KIND, S_EXP, S_MAN, ZP)
            if W_NK:
                # the weight is x's FP8 dtype already, stored [N, K]: load the [BLOCK_K, BLOCK_N] view
                w_ptrs = p0_ptr + offs_n[None, :] * K + offs_k[:, None]
                w = tl.load(w_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            else:
                codes = load_codes(p0_ptr, p1_ptr, p2_ptr, kt * BLOCK_K, offs_n, mask_n, K, N, BLOCK_K, W0, W1, W2)
                q = decode_weight(codes, W_BITS, W_FLOAT, W_SIGNED, W_EXP, W_MAN)
                if ZP != 0:
                    q = q - z[None, :]
                w = q.to(x.dtype)  # exact: the backend admits only weights whose values x's dtype holds
            if SCALE_AT == 0 and ACT != 2:
                acc = tl.dot(x, w, acc)  # nothing to scale per tile: accumulate in the MMA
            else:
                part = tl.dot(x, w)
                if ACT == 2:
                    # activations scaled per row and X_GROUP columns: the K tile lies in one of them
                    xs = tl.load(xs_ptr + offs_m * stride_xs + (kt * BLOCK_K) // X_GROUP, mask=mask_m, other=0.0)
                    part = part * xs[:, None]
                if SCALE_AT == 1:
                    acc += part * s[None, :]
                else:
                    acc += part
    if SCALE_AT == 0:
        s, z = scale_zero(s_ptr, z_ptr, 0, cols_n, mask_n, stride_s, SCALE_KIND, S_EXP, S_MAN, ZP)
        acc = acc * s[None, :]
    if HAS_GS:
        acc = acc * tl.load(gs_ptr)
    if ACT == 1:
        acc = acc * tl.load(xs_ptr + offs_m * stride_xs, mask=mask_m, other=0.0)[:, None]

    tile = pid_m * num_n + pid_n
    store_or_reduce(
        acc, y_ptr, ws_ptr, cnt_ptr, bias_ptr, offs_m, offs_n, M, N, stride_ym, tile, pid_k, HAS_BIAS, SPLIT_K
    )


def scale_at(group_k: int, k: int, block_k: int) -> int:
    """0: one scale over all of K; 1: per K tile (the tile lies in one group); 2: per element."""
    if group_k >= k:
        return 0
    return 1 if group_k % block_k == 0 else 2


def gemm_dense(
    x: torch.Tensor,
    tw,
    bias: torch.Tensor | None,
    *,
    config: GemmConfig,
    workspace: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    x_scales: torch.Tensor | None = None,
    x_group: int = 0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x: [M, K] bf16/fp16, or FP8 with `x_scales` (fp32 [M, 1] per token, or [M, K/x_group] per
    group of x_group columns) from `anybit.kernels.quant_act`; last dim contiguous. tw: the prepared
    weight (`anybit.backends.triton_layout.TritonWeight`). Returns
    y [M, N] in out_dtype (default x's dtype; bf16 for FP8 x). Split-K needs `workspace` (fp32,
    >= split_k*M*N) and zeroed int32 `counters` (>= number of output tiles); they are left ready for
    the next call. `out` ([M, N]) is written in place when given. With FP8 x, the weight's decoded
    values must be exact in x's dtype and its scales whole-tile (the backend's `supports` checks)."""
    m, k = x.shape
    n, scales, zeros, global_scale = tw.n, tw.scales, tw.zeros, tw.global_scale
    group_k, group_n, fmt, nk = tw.group_k, tw.group_n, tw.fmt, tw.nk
    if tw.frag:
        raise ValueError("this weight is in the fragment layout (anybit.kernels.frag): use gemm_frag")
    planes, plane_bits = tw.planes, tw.plane_bits
    c = config
    if c.block_k < 32 or c.block_k & (c.block_k - 1):
        raise ValueError(f"block_k={c.block_k}: the packed-word tiles need a power of two >= 32")
    fp8 = x.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    if fp8 != (x_scales is not None):
        raise ValueError("FP8 activations come with their scales (x_scales), bf16/fp16 ones without")
    dtype = out_dtype or (torch.bfloat16 if fp8 else x.dtype)
    y = out if out is not None else torch.empty((m, n), device=x.device, dtype=dtype)
    grid = (cdiv(m, c.block_m) * cdiv(n, c.block_n), c.split_k)
    if c.split_k > 1 and (workspace is None or counters is None):
        raise ValueError("split_k > 1 needs a workspace and counters")
    p, w = plane_args(planes, plane_bits)
    dummy = scales
    sa = scale_at(group_k, k, c.block_k)
    pairs = sa != 2 and not fmt["W_FLOAT"] and len(plane_bits) == 1 and plane_bits[0] in (2, 4) and fmt["ZP"] != 2
    pairs = pairs and c.pairs is not False and not fp8
    if fp8 and sa == 2:
        raise ValueError(f"FP8 activations need whole-tile weight scales: group {group_k} < block_k {c.block_k}")
    if x_group and x_group % c.block_k:
        raise ValueError(f"activation groups of {x_group} must be a multiple of block_k={c.block_k}")
    if nk and planes[0].dtype != x.dtype:
        raise ValueError(f"an [N, K] weight of {planes[0].dtype} needs activations of that dtype, got {x.dtype}")
    _gemm_kernel[grid](
        x,
        x_scales if x_scales is not None else dummy,
        p[0],
        p[1],
        p[2],
        scales,
        zeros if zeros is not None else dummy,
        global_scale if global_scale is not None else dummy,
        bias if bias is not None else dummy,
        y,
        workspace if workspace is not None else y,
        counters if counters is not None else y,
        m,
        n,
        k,
        x.stride(0),
        y.stride(0),
        scales.stride(0),
        x_scales.stride(0) if x_scales is not None else 0,
        W0=w[0],
        W1=w[1],
        W2=w[2],
        GROUP_K=group_k,
        GROUP_N=group_n,
        SCALE_AT=sa,
        PAIRS=pairs,
        ACT=0 if not fp8 else (2 if x_group else 1),
        X_GROUP=max(x_group, 1),
        W_NK=nk,
        HAS_GS=global_scale is not None,
        HAS_BIAS=bias is not None,
        BLOCK_M=c.block_m,
        BLOCK_N=c.block_n,
        BLOCK_K=c.block_k,
        SPLIT_K=c.split_k,
        GROUP_M=c.group_m,
        num_warps=c.num_warps,
        num_stages=c.num_stages,
        **fmt,
    )
    return y
