"""Large-M grouped MoE GEMMs on the register-operand kernel (`anybit.kernels.moe_rs_kernel`), for experts the dense
`frag_rs` kernel takes (4-bit integers, MXFP4, NVFP4, 8-bit integers; bf16/fp16 x).

The layer (`moe_rs_layer`): x's rows gathered into `moe_align`'s sorted order once (`moe_gather`, zeros in the
padding), so every block's rows come by TMA; gate_up writes its output in that order, silu(gate) * up is taken there
(`moe_silu_sorted`), and down writes each row to its flat slot times the slot's top-k weight, for `moe_sum`. Token
tiles by the rows an expert sees (`moe_rs_block_m`). Off by default (`settings.moe_rs_min_rows`): H200, DeepSeek-V3
w4a16 M=4096 (tools/probe_moe_rs.py, eager µs) gather 289 / gate_up 4517 / silu 451 / down 3400 against
`moe_gemm`'s fused 4867 / 2816 — the gate_up GEMM alone is faster, the rest is not yet.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from anybit import settings
from anybit.kernels.dequant import cdiv
from anybit.kernels.frag_layout import FRAG_PANEL
from anybit.kernels.frag_rs import RS_BITS, rs_consts, rs_token_parts
from anybit.kernels.frag_ws import frag_ws_weight_why_not, weight_descs, x_desc
from anybit.kernels.moe_gemm import check_aligned, moe_grid_m

# Token tiles a block may take, and a block's fixed cost in tokens of MMA work: H200 graphs (session 30,
# tools/probe_ws.py, W4A16, 64 experts of DeepSeek-V3's gate_up as one 262144 x 7168 weight) 32 / 64 / 128 tokens a
# 64-row tile 505 / 677 / 933 µs, about 420 + 4 µs a token: a block costs ~105 tokens more than its MMA.
MOE_RS_TILES = (64, 96, 128, 144, 160, 192)  # (256 tokens, and 8-bit codes' 320, spill 0.5-0.9 KB here: sm_90a)
MOE_RS_BLOCK_COST = 105


@functools.cache
def _kernel():
    from anybit.kernels.moe_rs_kernel import moe_rs_kernel

    return moe_rs_kernel


def moe_rs_why_not(tw, x_dtype: torch.dtype, device: torch.device) -> str | None:
    """None when `moe_gemm_rs` runs these stacked experts (`stack_experts`) with x of `x_dtype` on `device`."""
    if not tw.frag:
        return "fragment-layout experts only"
    if tw.fmt["W_BITS"] not in RS_BITS:
        return f"{tw.fmt['W_BITS']}-bit codes (the register-operand kernel takes {RS_BITS})"
    if tw.scheme.act.quantized:
        return "A16 schemes only (FP8 x: moe_gemm)"
    if tw.n % FRAG_PANEL:
        return f"N={tw.n} must be a multiple of {FRAG_PANEL} (an expert's rows are whole 64-row panels of the stack)"
    # the warp-specialised kernel's weights: no zero points, scales in x's dtype (the dense kernel takes more)
    return frag_ws_weight_why_not(tw, x_dtype, device)


def moe_rs_plan(gate_up, down, rows: int, experts: int, x_dtype: torch.dtype, device: torch.device) -> tuple:
    """(token tile, None) when a `QuantMoE` call of `rows` token x slot rows runs both stacked projections through
    `moe_rs_layer`, else (None, why not): experts `moe_rs_why_not` accepts and at least `settings.moe_rs_min_rows()`
    rows per expert (0, the default: off)."""
    least = settings.moe_rs_min_rows()
    if not least:
        return None, "off (ANYBIT_MOE_RS_MIN_ROWS=0, the default: slower than moe_gemm on the H200)"
    if rows < least * experts:
        return None, f"{rows / experts:.1f} rows per expert < ANYBIT_MOE_RS_MIN_ROWS={least}"
    why = moe_rs_why_not(gate_up, x_dtype, device) or moe_rs_why_not(down, x_dtype, device)
    return (None, why) if why else (moe_rs_block_m(rows, experts), None)


def moe_rs_block_m(rows: int, experts: int) -> int:
    """The token tile for `rows` token x slot rows over `experts` experts: the tile of MOE_RS_TILES with the least
    expected work an expert — its blocks times (tile + MOE_RS_BLOCK_COST) — where an expert's rows are Poisson with
    the mean rows / experts (a uniform router)."""
    mean = rows / experts

    def work(bm: int) -> float:
        # E[ceil(c / bm)] = sum over j >= 0 of P(c > j * bm), c ~ Poisson(mean) (`_poisson_tail`)
        blocks, j = 0.0, 0
        while True:
            tail = _poisson_tail(mean, j * bm)
            if tail < 1e-4:
                break
            blocks += tail
            j += 1
        return max(blocks, 1.0) * (bm + MOE_RS_BLOCK_COST)

    return min(MOE_RS_TILES, key=work)


def _poisson_tail(mean: float, n: int) -> float:
    """P(c > n) for c ~ Poisson(mean): exact sums below 200, a normal approximation above."""
    if mean <= 0:
        return 0.0
    if mean > 200:
        return 0.5 * math.erfc((n + 0.5 - mean) / math.sqrt(2 * mean))
    term = cdf = math.exp(-mean)
    for i in range(1, n + 1):
        term *= mean / i
        cdf += term
    return max(0.0, 1.0 - cdf)


# fmt: off
@triton.jit
def _gather_kernel(x_ptr, y_ptr, rows_ptr, total_ptr, n_rows, num_rows, K, stride_xm, TOP_K: tl.constexpr,
                   BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[p] = x[rows[p] // TOP_K] for the sorted positions p of this program below the padded total; zeros where
    rows[p] is padding (>= num_rows)."""
    r0 = tl.program_id(0) * BLOCK_R
    if r0 >= tl.load(total_ptr):
        return
    pos = r0 + tl.arange(0, BLOCK_R)
    slot = tl.load(rows_ptr + pos, mask=pos < n_rows, other=num_rows)
    ok = slot < num_rows
    src = tl.where(ok, slot // TOP_K, 0).to(tl.int64)
    keep = pos < n_rows
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        v = tl.load(x_ptr + src[:, None] * stride_xm + k[None, :], mask=ok[:, None] & (k < K)[None, :], other=0.0)
        tl.store(y_ptr + pos.to(tl.int64)[:, None] * K + k[None, :], v, mask=keep[:, None] & (k < K)[None, :])


@triton.jit
def _silu_kernel(h_ptr, a_ptr, total_ptr, inter, stride_h, INTERLEAVED: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_I: tl.constexpr):
    """a[r, j] = silu(gate) * up of h's row r below the padded total, in fp32: gate j and up j at columns 2j, 2j + 1
    (INTERLEAVED) or j, inter + j."""
    r0 = tl.program_id(0) * BLOCK_R
    total = tl.load(total_ptr)
    if r0 >= total:
        return
    r = r0 + tl.arange(0, BLOCK_R)
    j = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = (r < total)[:, None] & (j < inter)[None, :]
    row = h_ptr + r.to(tl.int64)[:, None] * stride_h
    if INTERLEAVED:
        gate = tl.load(row + 2 * j[None, :], mask=mask, other=0.0).to(tl.float32)
        up = tl.load(row + 2 * j[None, :] + 1, mask=mask, other=0.0).to(tl.float32)
    else:
        gate = tl.load(row + j[None, :], mask=mask, other=0.0).to(tl.float32)
        up = tl.load(row + inter + j[None, :], mask=mask, other=0.0).to(tl.float32)
    a = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(a_ptr + r.to(tl.int64)[:, None] * inter + j[None, :], a.to(a_ptr.dtype.element_ty), mask=mask)
# fmt: on


def moe_gather(x: torch.Tensor, sorted_ids: torch.Tensor, total: torch.Tensor, top_k: int) -> torch.Tensor:
    """x's rows in `moe_align`'s sorted order: [len(sorted_ids), K], row p = x[sorted_ids[p] // top_k] below the
    padded `total` (zeros where the entry is padding); rows past it are left unwritten (no kernel reads them)."""
    n_rows, k = sorted_ids.numel(), x.shape[1]
    y = torch.empty((n_rows, k), device=x.device, dtype=x.dtype)
    block_r = 16
    _gather_kernel[(cdiv(n_rows, block_r),)](x, y, sorted_ids, total, n_rows, x.shape[0] * top_k, k, x.stride(0),
                                             TOP_K=top_k, BLOCK_R=block_r, BLOCK_K=256)  # fmt: skip
    return y


def moe_silu_sorted(h: torch.Tensor, total: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """silu(gate) * up of gate_up's output h [rows, 2I] in the sorted order, rows below the padded `total` (the
    rest left unwritten): [rows, I] in h's dtype."""
    rows, i = h.shape[0], h.shape[1] // 2
    a = torch.empty((rows, i), device=h.device, dtype=h.dtype)
    block_r, block_i = 16, 256
    _silu_kernel[(cdiv(rows, block_r), cdiv(i, block_i))](h, a, total, i, h.stride(0), INTERLEAVED=interleaved,
                                                          BLOCK_R=block_r, BLOCK_I=block_i)  # fmt: skip
    return a


def moe_gemm_rs(x: torch.Tensor, tw, sorted_ids: torch.Tensor, expert_ids: torch.Tensor, total: torch.Tensor, *,
                block_m: int, num_rows: int, scatter: bool = False, routed_weights: torch.Tensor | None = None,
                out: torch.Tensor | None = None, stages: int | None = None, mma_regs: int = 232):  # fmt: skip
    """x [len(sorted_ids), K] in `moe_align(..., block_m)`'s sorted order (`moe_gather`), contiguous bf16/fp16; tw:
    stacked experts `moe_rs_why_not` accepts. Returns y [len(sorted_ids), N] in the same order (rows of padding
    blocks unwritten), or (scatter) y [num_rows, N] with each row at its flat slot times `routed_weights` (fp32
    [num_rows]), rows of no valid slot left as they were."""
    n, k = tw.n, tw.k
    n_sorted = sorted_ids.numel()
    check_aligned(sorted_ids, expert_ids, block_m)
    if x.shape != (n_sorted, k) or not x.is_contiguous():
        raise ValueError(f"x must be contiguous [{n_sorted}, {k}] (rows in the sorted order), got {tuple(x.shape)}")
    if scatter and routed_weights is None:
        raise ValueError("scatter needs the routed (top-k) weights, one per flat slot")
    consts = rs_consts(tw, block_m, stages, mma_regs)
    bm1, bm2 = rs_token_parts(block_m, tw.fmt["W_BITS"])
    y = out if out is not None else torch.empty((num_rows if scatter else n_sorted, n), device=x.device, dtype=x.dtype)
    w_desc, s_desc = weight_descs(tw, 64)
    words = tw.planes[0]
    gs = tw.global_scale
    grid_m = moe_grid_m(num_rows, n_sorted, expert_ids.numel(), block_m)
    x1 = x_desc(x, bm1)
    # fmt: off
    _kernel()[(grid_m * cdiv(n, 64),)](
        x1, x_desc(x, bm2) if bm2 else x1, w_desc, s_desc, gs if gs is not None else y, y, sorted_ids, expert_ids,
        total, routed_weights if scatter else y, n_sorted, num_rows, n, k, words.shape[-1] // 16, y.stride(0),
        words.stride(0) // 256, tw.scales.shape[1], SCATTER=scatter, **consts,
    )
    # fmt: on
    return y


def moe_rs_layer(x: torch.Tensor, gate_up, down, sorted_ids: torch.Tensor, expert_ids: torch.Tensor,
                 total: torch.Tensor, topk_weights: torch.Tensor, block_m: int, interleaved: bool):  # fmt: skip
    """Both GEMMs of a MoE layer on this kernel: y [T*k, H], each valid flat slot's row down(silu(gate) * up) times
    its top-k weight (the rest unwritten; `moe_sum` skips them)."""
    t, top_k = topk_weights.shape
    rows = t * top_k
    xs = moe_gather(x, sorted_ids, total, top_k)
    h = moe_gemm_rs(xs, gate_up, sorted_ids, expert_ids, total, block_m=block_m, num_rows=rows)
    act = moe_silu_sorted(h, total, interleaved)
    y = torch.empty((rows, down.n), device=x.device, dtype=x.dtype)
    routed = topk_weights.reshape(-1).float().contiguous()
    return moe_gemm_rs(act, down, sorted_ids, expert_ids, total, block_m=block_m, num_rows=rows, scatter=True,
                       routed_weights=routed, out=y)  # fmt: skip
