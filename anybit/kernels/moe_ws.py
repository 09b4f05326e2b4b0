"""Large-M grouped MoE GEMM on Hopper: `moe_gemm_ws` runs the warp-specialised Gluon kernel
(`anybit.kernels.moe_ws_kernel`) — the dense `frag_ws` kernel's decoder and SS-wgmma loop, with each block's
x rows gathered by cp.async from `moe_align`'s sorted order. Same contract as `anybit.kernels.moe_gemm.moe_gemm`
(y row = flat slot, silu(gate) * up of interleaved gate/up rows, top-k weights), for the experts
`frag_ws_why_not` accepts: 4-bit integer codes, scales in x's dtype per channel or per whole 128-K blocks.
"""

from __future__ import annotations

import functools

import torch

from anybit import settings
from anybit.kernels.dequant import cdiv
from anybit.kernels.frag_layout import FRAG_PANEL
from anybit.kernels.frag_ws import WS_WORD_DEPTH, frag_ws_why_not, weight_descs
from anybit.kernels.moe_gemm import check_aligned, moe_grid_m


@functools.cache
def _kernel():
    from anybit.kernels.moe_ws_kernel import moe_ws_kernel

    return moe_ws_kernel


def moe_ws_why_not(tw, x_dtype: torch.dtype, device: torch.device) -> str | None:
    """None when `moe_gemm_ws` runs these stacked experts (`stack_experts`) with x of `x_dtype`, else why not."""
    if not tw.frag:
        return "fragment-layout experts only"
    return frag_ws_why_not(tw.scheme, tw.k, x_dtype, device, tw.n)


def moe_ws_plan(gate_up, down, rows: int, experts: int, x_dtype: torch.dtype, device: torch.device) -> tuple:
    """(tile, None) when a `QuantMoE` call of `rows` token x slot rows runs both stacked projections through
    `moe_gemm_ws`, else (None, why not): Hopper, experts `moe_ws_why_not` accepts, and at least
    `settings.moe_ws_min_rows()` rows per expert (0, the default: off)."""
    least = settings.moe_ws_min_rows()
    if not least:
        return None, "off (ANYBIT_MOE_WS_MIN_ROWS=0, the default: slower than moe_gemm on the H200)"
    if rows < least * experts:
        return None, f"{rows / experts:.1f} rows per expert < ANYBIT_MOE_WS_MIN_ROWS={least}"
    why = moe_ws_why_not(gate_up, x_dtype, device) or moe_ws_why_not(down, x_dtype, device)
    return (None, why) if why else (moe_ws_tile(rows, experts), None)


def moe_ws_tile(rows: int, experts: int) -> dict:
    """Block of sorted rows and pipeline depth by the average rows per expert: 256-row blocks (as the dense
    kernel) once experts see >= 256 rows, else 128 with a deeper ring (the 128-row x slice is half as big)."""
    if rows >= 256 * experts:
        return dict(block_m=256, block_n=128, stages=4, dq_warps=4, dq_regs=160)
    return dict(block_m=128, block_n=128, stages=6, dq_warps=4, dq_regs=160)


def moe_gemm_ws(x, tw, sorted_ids, expert_ids, total, *, block_m: int, num_rows: int, top_k: int, out=None,
                silu_mul: bool = False, routed_weights=None, out_dtype=None, block_n: int = 128, stages: int = 4,
                dq_warps: int = 4, dq_regs: int = 160):  # fmt: skip
    """x [T or T*k, K] bf16/fp16 with K % 8 == 0; tw: stacked fragment-layout experts `moe_ws_why_not` accepts;
    sorted_ids, expert_ids, total: `anybit.moe.moe_align(..., block_m)` with block_m 128 or 256. Returns y
    [num_rows, N] (or [num_rows, N / 2] with silu_mul) in x's dtype; rows of no valid slot are left as they were."""
    n, k = tw.n, tw.k
    if block_m not in (128, 256):
        raise ValueError(f"block_m must be 128 or 256 (two warpgroups of wgmma rows), got {block_m}")
    check_aligned(sorted_ids, expert_ids, block_m)
    if x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1 or x.stride(0) % 8:
        raise ValueError(f"x must be [rows, {k}] with unit column stride and rows 16-byte aligned, got "
                         f"{tuple(x.shape)} strides {x.stride()}")  # fmt: skip
    if silu_mul and (n % 2 or block_n % 2):
        raise ValueError(f"silu_mul needs an even N, got N={n}")
    if out_dtype not in (None, x.dtype):
        raise ValueError(f"y is in x's dtype ({x.dtype}), got out_dtype={out_dtype}")
    n_out = n // 2 if silu_mul else n
    y = out if out is not None else torch.empty((num_rows, n_out), device=x.device, dtype=x.dtype)
    grid_m = moe_grid_m(num_rows, sorted_ids.numel(), expert_ids.numel(), block_m)
    w_desc, s_desc = weight_descs(tw, block_n)
    words = tw.planes[0]
    # fmt: off
    _kernel()[(grid_m * cdiv(n, block_n),)](
        x, w_desc, s_desc, y, sorted_ids, expert_ids, total, routed_weights if routed_weights is not None else y,
        sorted_ids.numel(), num_rows, n, k, x.stride(0), y.stride(0), words.stride(0) // 256, tw.scales.shape[1],
        words.shape[-1] // 16, BM=block_m, BN=block_n, STAGES=stages, DQ_WARPS=dq_warps,
        DQ_REGS=dq_regs, SCALE_PER_BLOCK=tw.group_k < k, GB=max(1, tw.group_k // 128),
        SIGNED=bool(tw.fmt["W_SIGNED"]), PANEL=FRAG_PANEL, TOP_K=top_k, SILU_MUL=silu_mul,
        MUL_ROUTED=routed_weights is not None, DEPTH=WS_WORD_DEPTH, num_warps=8,
    )
    # fmt: on
    return y
