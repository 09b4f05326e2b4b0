"""FP8 GEMMs at large M whose accumulator is rescaled per 128-K block (opt-in, session 48): W4A8 on its e4m3 codes,
and FP8-block weights (e4m3, 128 x 128 scale blocks, x per token and 128 columns) read as stored.

W4A8 (`gemm_a8_rescale`): y [M, N] = x [M, K] @ (W · s)^T for x quantized to e4m3 per token (scales [M, 1]) and W's
integer codes q - z as e4m3 [N, K] (the codes pass, `dequantize_frag(tw, dtype=float8_e4m3fn)`), group scales
s [K/GROUP_K, N] along K. The products are computed transposed (weight rows on the MMA's 64-row side, tokens on its N
side), both operands from shared memory (an FP8 wgmma without decoding), and the accumulator counts in units of the
current K block's scale: before each block's MMA it is multiplied by the last block's scale over this one's — a
value per accumulator row, two a thread — instead of a fresh product per block scaled and added in fp32
(`frag.frag_rescale` does the same in the grouped MoE kernel). Weights whose scales allow it only
(`TritonWeight.rescale`).

FP8-block (`gemm_block_rescale`): tokens on the MMA's M side, weight rows on its N side (a tile's BN rows lie in one
128-row scale block), so the block's scale x_scale[token] · w_scale is again a value per accumulator row.

Both replace cuBLAS's block-scaled GEMMs (`anybit.backends.blockscaled`) where `ANYBIT_A8_RESCALE_MIN_M` asks."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from anybit.kernels.dequant import cdiv, decode_scale
from anybit.kernels.frag_decode import RESCALE_SPREAD
from anybit.kernels.launch import Launcher


@triton.jit
def token_major_tile(M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_T: tl.constexpr):
    """(token tile, weight tile) of this program: groups of GROUP_T token tiles run every weight tile in turn, the
    group's token tiles side by side (they share the weight tile in L2)."""
    pid = tl.program_id(0)
    per_group = GROUP_T * tl.cdiv(N, BN)
    first_m = (pid // per_group) * GROUP_T
    size = tl.minimum(tl.cdiv(M, BM) - first_m, GROUP_T)
    return first_m + (pid % per_group) % size, (pid % per_group) // size


# fmt: off
@triton.jit
def _a8_rescale_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, bias_ptr, y_ptr, M, N, K, stride_xm, stride_xs, stride_wn,
                       stride_s, stride_ym, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
                       GROUP_K: tl.constexpr, HAS_BIAS: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                       GROUP_T: tl.constexpr, STAGES: tl.constexpr):
    """One [BN weight rows, BM tokens] tile over all of K, 128 K a step; tiles ordered in groups of GROUP_T token
    tiles sharing their weight rows in L2."""
    pid_m, pid_n = token_major_tile(M, N, BM, BN, GROUP_T)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_k = tl.arange(0, 128)
    mask_n = offs_n < N
    mask_m = offs_m < M
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm + offs_k[:, None]  # x^T [128, BM], K contiguous
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    s_prev = tl.full((BN,), 1.0, tl.float32)
    for kt in tl.range(0, tl.cdiv(K, 128), num_stages=STAGES):
        w = tl.load(w_ptrs + kt * 128, mask=mask_n[:, None], other=0.0)
        xt = tl.load(x_ptrs + kt * 128, mask=mask_m[None, :], other=0.0)
        s = tl.load(s_ptr + ((kt * 128) // GROUP_K) * stride_s + offs_n, mask=mask_n, other=1)
        s = tl.where(mask_n, decode_scale(s, SCALE_KIND, S_EXP, S_MAN), 1.0)  # (rows past N: a finite ratio)
        acc = tl.dot(w, xt, acc * (s_prev / s)[:, None])
        s_prev = s
    acc = acc * s_prev[:, None]
    acc = acc * tl.load(xs_ptr + offs_m * stride_xs, mask=mask_m, other=0.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, tl.trans(acc).to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
# fmt: on


A8_RESCALE_TILE = dict(block_n=128, block_m=256, num_warps=8, num_stages=3, group_t=8)
BLOCK_RESCALE_TILE = dict(block_m=256, block_n=128, num_warps=8, num_stages=3, group_t=8)


# fmt: off
@triton.jit
def _block_rescale_kernel(x_ptr, xs_ptr, w_ptr, s_ptr, bias_ptr, y_ptr, M, N, K, stride_xm, stride_xsm, stride_xsg,
                          stride_wn, stride_s, stride_ym, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          GROUP_T: tl.constexpr, STAGES: tl.constexpr):
    """One [BM tokens, BN weight rows] tile (BN divides 128: one weight scale block) over all of K, 128 K a step."""
    pid_m, pid_n = token_major_tile(M, N, BM, BN, GROUP_T)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, 128)
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]  # W^T [128, BN], K contiguous
    s_blk = s_ptr + (pid_n * BN) // 128
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    u_prev = tl.full((BM,), 1.0, tl.float32)
    for kt in tl.range(0, tl.cdiv(K, 128), num_stages=STAGES):
        xt = tl.load(x_ptrs + kt * 128, mask=mask_m[:, None], other=0.0)
        wt = tl.load(w_ptrs + kt * 128, mask=mask_n[None, :], other=0.0)
        sx = tl.load(xs_ptr + offs_m * stride_xsm + kt * stride_xsg, mask=mask_m, other=1.0)
        u = sx * tl.load(s_blk + kt * stride_s).to(tl.float32)  # the block's scale per token
        acc = tl.dot(xt, wt, acc * (u_prev / u)[:, None])
        u_prev = u
    acc = acc * u_prev[:, None]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
# fmt: on


def block_rescale_why_not(tw) -> str | None:
    """None where `gemm_block_rescale` runs this prepared weight (FP8-block: e4m3 read as stored, 128 x 128 scale
    blocks all positive, in [2**-96, 2**96] and within `RESCALE_SPREAD` binades of each other), else why not."""
    act = tw.scheme.act
    if not (tw.nk and act.quantized and act.group == 128 and (tw.group_n, tw.group_k) == (128, 128)):
        return f"{tw.scheme}: FP8 weights read as stored with 128x128 scale blocks and x per 128 columns only"
    ok = tw.ws_ok.get("block_rescale")
    if ok is None:
        s = tw.scales.float()
        lo, hi = float(s.min()), float(s.max())
        ok = tw.ws_ok["block_rescale"] = 2.0**-96 <= lo and hi <= 2.0**96 and hi <= lo * 2.0**RESCALE_SPREAD
    return (
        None if ok else "the weight's block scales do not allow a rescaled accumulator (positive, normal, 64 binades)"
    )


def gemm_block_rescale(xq: torch.Tensor, xs: torch.Tensor, tw, bias: torch.Tensor | None = None, *,
                       out_dtype: torch.dtype = torch.bfloat16, block_m: int = 256, block_n: int = 128,
                       num_warps: int = 8, num_stages: int = 3, group_t: int = 8) -> torch.Tensor:  # fmt: skip
    """y [M, N] in out_dtype from xq e4m3 [M, K] with per-(token, 128 columns) scales xs fp32 [M, K/128] (any strides)
    and an FP8-block weight (`block_rescale_why_not`), a bias [N] or None."""
    why = block_rescale_why_not(tw)
    if why is not None:
        raise ValueError(why)
    m, k = xq.shape
    if xq.dtype != tw.planes[0].dtype or k != tw.k or xq.stride(1) != 1:
        raise ValueError(f"xq must be {tw.planes[0].dtype} [M, {tw.k}] with contiguous rows, got {xq.dtype} "
                         f"{tuple(xq.shape)}")  # fmt: skip
    if xs.dtype != torch.float32 or tuple(xs.shape) != (m, cdiv(k, 128)):
        raise ValueError(f"xs must be fp32 [{m}, {cdiv(k, 128)}] (a scale per token and 128 columns), got {xs.dtype} "
                         f"{tuple(xs.shape)}")  # fmt: skip
    if 128 % block_n:
        raise ValueError(f"block_n must divide 128 (one weight scale block a tile), got {block_n}")
    y = torch.empty((m, tw.n), device=xq.device, dtype=out_dtype)
    key = ("block_rescale", block_m, block_n, num_warps, num_stages, group_t, bias is None, out_dtype)
    launch = tw.launches.get(key)
    if launch is None:
        consts = dict(HAS_BIAS=bias is not None, BM=block_m, BN=block_n, GROUP_T=group_t, STAGES=num_stages,
                      num_warps=num_warps)  # fmt: skip
        launch = tw.launches[key] = Launcher(_block_rescale_kernel, consts, live=(0, 1, 4, 5, 6, 9, 10, 11, 14))
    grid = (cdiv(tw.n, block_n) * cdiv(m, block_m),)
    w = tw.planes[0]
    launch(grid, xq, xs, w, tw.scales, bias if bias is not None else xs, y, m, tw.n, tw.k, xq.stride(0),
           xs.stride(0), xs.stride(1), w.stride(0), tw.scales.stride(0), y.stride(0))  # fmt: skip
    return y


def a8_rescale_why_not(tw) -> str | None:
    """None where `gemm_a8_rescale` runs this prepared weight, else why not."""
    if not (tw.frag and tw.takes_sums):
        return f"{tw.scheme}: integer weights packed for the FP8 MMA (W4A8) only"
    if not tw.rescale:
        return "the weight's scales do not allow a rescaled accumulator (not all positive, normal, within 64 binades)"
    if tw.group_k % 128 or tw.group_k >= tw.k or tw.group_n != 1 or tw.k % 128:
        return f"group scales along K of a multiple of 128 only (groups {tw.group_n}x{tw.group_k}, K={tw.k})"
    return None


def gemm_a8_rescale(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, tw, bias: torch.Tensor | None = None, *,
                    out_dtype: torch.dtype = torch.bfloat16, block_n: int = 128, block_m: int = 256,
                    num_warps: int = 8, num_stages: int = 3, group_t: int = 8) -> torch.Tensor:  # fmt: skip
    """y [M, N] in out_dtype from xq e4m3 [M, K] (per-token scales xs fp32 [M, 1]) and the weight's codes wq e4m3
    [N, K] (`dequantize_frag`), its group scales `tw.scales`, a bias [N] or None."""
    why = a8_rescale_why_not(tw)
    if why is not None:
        raise ValueError(why)
    m, k = xq.shape
    if xq.dtype != torch.float8_e4m3fn or k != tw.k or xq.stride(1) != 1:
        raise ValueError(f"xq must be float8_e4m3fn [M, {tw.k}] with contiguous rows, got {xq.dtype} {tuple(xq.shape)}")
    if wq.dtype != torch.float8_e4m3fn or tuple(wq.shape) != (tw.n, tw.k) or wq.stride(1) != 1:
        raise ValueError(f"wq must be float8_e4m3fn [{tw.n}, {tw.k}] (dequantize_frag), got {wq.dtype} "
                         f"{tuple(wq.shape)}")  # fmt: skip
    if xs.dtype != torch.float32 or xs.numel() != m:
        raise ValueError(f"xs must be fp32 with one scale a row of x ({m}), got {xs.dtype} {tuple(xs.shape)}")
    y = torch.empty((m, tw.n), device=xq.device, dtype=out_dtype)
    key = ("a8_rescale", block_n, block_m, num_warps, num_stages, group_t, bias is None, out_dtype)
    launch = tw.launches.get(key)
    if launch is None:
        fmt = tw.fmt
        consts = dict(SCALE_KIND=fmt["SCALE_KIND"], S_EXP=fmt["S_EXP"], S_MAN=fmt["S_MAN"], GROUP_K=tw.group_k,
                      HAS_BIAS=bias is not None, BN=block_n, BM=block_m, GROUP_T=group_t, STAGES=num_stages,
                      num_warps=num_warps)  # fmt: skip
        launch = tw.launches[key] = Launcher(_a8_rescale_kernel, consts, live=(0, 1, 2, 4, 5, 6, 9, 10, 13))
    grid = (cdiv(tw.n, block_n) * cdiv(m, block_m),)
    launch(grid, xq, xs, wq, tw.scales, bias if bias is not None else xs, y, m, tw.n, tw.k, xq.stride(0),
           xs.stride(0), wq.stride(0), tw.scales.stride(0), y.stride(0))  # fmt: skip
    return y


def rescale_why_not(tw) -> str | None:
    """None where `rescale_gemm` runs this prepared weight (W4A8 or FP8-block), else why not."""
    return block_rescale_why_not(tw) if tw.nk else a8_rescale_why_not(tw)


def rescale_gemm(x: torch.Tensor, tw, bias: torch.Tensor | None = None, **tile) -> torch.Tensor:
    """The route's call (`ANYBIT_A8_RESCALE_MIN_M`): x [M, K] bf16/fp16 quantized as the scheme says; W4A8: the
    weight's codes written once (N*K e4m3 bytes, as for the block-scaled GEMM), then `gemm_a8_rescale`
    (`A8_RESCALE_TILE`); FP8-block: `gemm_block_rescale` on the weight as stored (`BLOCK_RESCALE_TILE`)."""
    from anybit.kernels.frag_dequant import dequantize_frag
    from anybit.kernels.quant_act import quantize_act

    xq, xs = quantize_act(x, tw.scheme.act)
    if tw.nk:
        return gemm_block_rescale(xq, xs, tw, bias, out_dtype=x.dtype, **(BLOCK_RESCALE_TILE | tile))
    wq = dequantize_frag(tw, dtype=torch.float8_e4m3fn)
    return gemm_a8_rescale(xq, xs, wq, tw, bias, out_dtype=x.dtype, **(A8_RESCALE_TILE | tile))
