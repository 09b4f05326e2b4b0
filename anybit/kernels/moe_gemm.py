"""Indexed grouped GEMM for MoE: the rows `moe_align` sorted by expert, each block of BLOCK_M rows
multiplied by its expert's quantized weight, in one launch.

    y[r, :] = x[r // TOP_K, :] @ dequantize(W[expert(block of r)])^T     for every valid row r

x rows are gathered by token (TOP_K > 1: the gate_up input, one row per token) or by flat slot
(TOP_K = 1: the down input, one row per token×slot); y has one row per flat slot. Blocks past the
padded total and blocks of expert -1 (not on this rank) are skipped; padding rows are masked.
Weights use the dense Triton layout per expert, stacked along a leading E axis. Formats and scale
placements are the dense kernel's decode (`SCALE_AT` 0/1/2; 2/4-bit ints two per instruction, `PAIRS`);
FP8 activations per token (`x_scales`), the weight cast to FP8 where exact.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from anybit import settings
from anybit.errors import AnybitError
from anybit.kernels import frag as frag_switches
from anybit.kernels.dequant import cdiv, decode_weight, load_codes, load_pairs, load_scale, next_pow2, plane_args
from anybit.kernels.frag import (
    RESCALE_MIN_ROWS,
    frag_constexprs,
    frag_fold,
    frag_group_k,
    frag_mma_acc,
    frag_pairs,
    frag_ptx,
    frag_range,
    frag_range_two,
    frag_rescale,
    frag_scale_w,
    frag_settle,
    pair_stages,
    target_sm,
    two_parts,
)
from anybit.kernels.frag_layout import FRAG_PANEL, frag_mask
from anybit.kernels.gemm import group_scaled, scale_at, scale_zero
from anybit.kernels.launch import Launcher
from anybit.kernels.moe_rows import block_ids, block_live, block_rows, finish_rows


# fmt: off
@triton.jit
def _moe_gemm_kernel(
    x_ptr, p0_ptr, p1_ptr, p2_ptr, s_ptr, z_ptr, gs_ptr, y_ptr, sorted_ptr, expert_ptr, total_ptr, rw_ptr, xs_ptr,
    ws_ptr, cnt_ptr, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_p0, stride_p1, stride_p2, stride_se,
    stride_s, stride_xs, SPLIT_K: tl.constexpr, TOP_K: tl.constexpr, SILU_MUL: tl.constexpr, MUL_ROUTED: tl.constexpr,
    FP8_X: tl.constexpr,
    W_BITS: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W_FLOAT: tl.constexpr,
    W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr, SCALE_KIND: tl.constexpr,
    S_EXP: tl.constexpr, S_MAN: tl.constexpr, ZP: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr,
    SCALE_AT: tl.constexpr, HAS_GS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PAIRS: tl.constexpr, W_NK: tl.constexpr = False, X_GROUP: tl.constexpr = 0,
    TAIL_HALF: tl.constexpr = False, E=1, SLOTS: tl.constexpr = False, SUM_SLOTS: tl.constexpr = 0,
    CHECK_E: tl.constexpr = False, N_FIRST: tl.constexpr = False,
):
    """The grouped GEMM for bit-plane experts (and FP8 experts read as stored, `W_NK`): each block of rows
    against its expert's weight tile, decoded in registers. TAIL_HALF (no split-K): a block whose second
    half is padding (an expert's last, short block) runs on its first half only. SLOTS: no alignment, block
    pid_m is flat slot pid_m and expert_ptr the top-k ids (E experts; ids >= E stop the kernel with CHECK_E, else
    are skipped as -1 is);
    SUM_SLOTS: y's rows are tokens, each the sum of its SUM_SLOTS slots (`sum_partials`); N_FIRST: `block_ids`."""
    pid_m, pid_n = block_ids(N_FIRST)
    e = tl.load(expert_ptr + pid_m)
    if block_live(e, E, total_ptr, y_ptr, ws_ptr, cnt_ptr, pid_m, N, stride_ym, SLOTS, SUM_SLOTS, SPLIT_K, BLOCK_M,
                  BLOCK_N, CHECK_E):  # fmt: skip
        mid = pid_m * BLOCK_M + BLOCK_M // 2  # sorted rows pad each expert's run at its end
        if TAIL_HALF and SPLIT_K == 1 and tl.load(sorted_ptr + mid, mask=mid < n_sorted, other=num_rows) >= num_rows:
            _moe_plane_rows(x_ptr, p0_ptr, p1_ptr, p2_ptr, s_ptr, z_ptr, gs_ptr, y_ptr, sorted_ptr, rw_ptr, xs_ptr,
                            ws_ptr, cnt_ptr, e, pid_m, pid_n, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_p0,
                            stride_p1, stride_p2, stride_se, stride_s, stride_xs, SPLIT_K, TOP_K, SILU_MUL, MUL_ROUTED,
                            FP8_X, W_BITS, W0, W1, W2, W_FLOAT, W_SIGNED, W_EXP, W_MAN, SCALE_KIND, S_EXP, S_MAN, ZP,
                            GROUP_K, GROUP_N, SCALE_AT, HAS_GS, BLOCK_M, BLOCK_M // 2, BLOCK_N, BLOCK_K, PAIRS, W_NK,
                            X_GROUP)
        else:
            _moe_plane_rows(x_ptr, p0_ptr, p1_ptr, p2_ptr, s_ptr, z_ptr, gs_ptr, y_ptr, sorted_ptr, rw_ptr, xs_ptr,
                            ws_ptr, cnt_ptr, e, pid_m, pid_n, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_p0,
                            stride_p1, stride_p2, stride_se, stride_s, stride_xs, SPLIT_K, TOP_K, SILU_MUL, MUL_ROUTED,
                            FP8_X, W_BITS, W0, W1, W2, W_FLOAT, W_SIGNED, W_EXP, W_MAN, SCALE_KIND, S_EXP, S_MAN, ZP,
                            GROUP_K, GROUP_N, SCALE_AT, HAS_GS, BLOCK_M, BLOCK_M, BLOCK_N, BLOCK_K, PAIRS, W_NK,
                            X_GROUP, SLOTS, SUM_SLOTS)


@triton.jit
def _moe_plane_rows(
    x_ptr, p0_ptr, p1_ptr, p2_ptr, s_ptr, z_ptr, gs_ptr, y_ptr, sorted_ptr, rw_ptr, xs_ptr, ws_ptr, cnt_ptr, e, pid_m,
    pid_n, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_p0, stride_p1, stride_p2, stride_se, stride_s,
    stride_xs,
    SPLIT_K: tl.constexpr, TOP_K: tl.constexpr, SILU_MUL: tl.constexpr, MUL_ROUTED: tl.constexpr, FP8_X: tl.constexpr,
    W_BITS: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr, W2: tl.constexpr, W_FLOAT: tl.constexpr,
    W_SIGNED: tl.constexpr, W_EXP: tl.constexpr, W_MAN: tl.constexpr, SCALE_KIND: tl.constexpr,
    S_EXP: tl.constexpr, S_MAN: tl.constexpr, ZP: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr,
    SCALE_AT: tl.constexpr, HAS_GS: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PAIRS: tl.constexpr, W_NK: tl.constexpr, X_GROUP: tl.constexpr,
    SLOTS: tl.constexpr = False, SUM_SLOTS: tl.constexpr = 0,
):
    """The first ROWS rows of block pid_m (blocks BLOCK_M rows apart) against expert e's weight tile of N tile
    pid_n and this program's K split; the epilogue of `finish_rows`."""
    pid_k = tl.program_id(2)
    rows, mask_m, src = block_rows(sorted_ptr, pid_m, n_sorted, num_rows, TOP_K, BLOCK_M, ROWS, 0, SLOTS)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    cols_n = offs_n // GROUP_N
    e64 = e.to(tl.int64)
    p0, p1, p2 = p0_ptr + e64 * stride_p0, p1_ptr + e64 * stride_p1, p2_ptr + e64 * stride_p2
    se, ze = s_ptr + e64 * stride_se, z_ptr + e64 * stride_se
    if W_NK and ROWS <= 32:  # FP8 as stored, few rows: the weight on the MMA's 64-row side
        acc = _nk_swapped(x_ptr, p0, xs_ptr, se, ze, src, mask_m, offs_n, mask_n, cols_n, K, stride_xm, stride_s,
                          stride_xs, pid_k, SPLIT_K, SCALE_KIND, S_EXP, S_MAN, ZP, GROUP_K, SCALE_AT, ROWS, BLOCK_N,
                          BLOCK_K, X_GROUP)
    else:
        acc = _plane_loop(x_ptr, p0, p1, p2, xs_ptr, se, ze, src, mask_m, offs_n, mask_n, cols_n, K, N, stride_xm,
                          stride_s, stride_xs, pid_k, SPLIT_K, W_BITS, W0, W1, W2, W_FLOAT, W_SIGNED, W_EXP, W_MAN,
                          SCALE_KIND, S_EXP, S_MAN, ZP, GROUP_K, SCALE_AT, ROWS, BLOCK_N, BLOCK_K, PAIRS, W_NK,
                          X_GROUP)
    if SCALE_AT == 0:
        s, z = scale_zero(se, ze, 0, cols_n, mask_n, stride_s, SCALE_KIND, S_EXP, S_MAN, ZP)
        acc = acc * s[None, :]
    finish_rows(acc, e, gs_ptr, xs_ptr, rw_ptr, y_ptr, ws_ptr, cnt_ptr, rows, src, mask_m, offs_n, mask_n, pid_m,
                pid_n, pid_k, N, stride_ym, HAS_GS, FP8_X and X_GROUP == 0, MUL_ROUTED, SILU_MUL, SPLIT_K,
                ROWS, BLOCK_N, SUM_SLOTS)


@triton.jit
def _k_tiles(K, pid_k, SPLIT_K: tl.constexpr, BLOCK_K: tl.constexpr):
    """The K tiles [lo, hi) of split pid_k."""
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    return pid_k * per_split, tl.minimum(pid_k * per_split + per_split, k_tiles)


@triton.jit
def _x_tile(x_ptr, src, mask_m, stride_xm, kt, K, BLOCK_K: tl.constexpr):
    """K tile kt of the block's x rows (gathered by `src`; padding rows and the K tail 0) and its columns."""
    offs_k = kt * BLOCK_K + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + src[:, None] * stride_xm + offs_k[None, :], mask=mask_m[:, None] & (offs_k < K)[None, :],
                other=0.0)
    return x, offs_k


@triton.jit
def _nk_swapped(x_ptr, p0, xs_ptr, se, ze, src, mask_m, offs_n, mask_n, cols_n, K, stride_xm, stride_s, stride_xs,
                pid_k, SPLIT_K: tl.constexpr, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
                ZP: tl.constexpr, GROUP_K: tl.constexpr, SCALE_AT: tl.constexpr, ROWS: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, X_GROUP: tl.constexpr):
    """The FP8-as-stored K loop computed transposed: W [BLOCK_N, BLOCK_K] (as stored) times x^T, so the
    weight rows take the MMA's 64-row side and a few token rows its narrow side (an FP8 wgmma; x rows on
    the 64-row side make it convert both operands to fp16 for mma.sync). Returns [ROWS, BLOCK_N]."""
    acc = tl.zeros((BLOCK_N, ROWS), dtype=tl.float32)
    lo, hi = _k_tiles(K, pid_k, SPLIT_K, BLOCK_K)
    for kt in range(lo, hi):
        x, offs_k = _x_tile(x_ptr, src, mask_m, stride_xm, kt, K, BLOCK_K)
        w = tl.load(p0 + offs_n[:, None] * K + offs_k[None, :], mask=mask_n[:, None] & (offs_k < K)[None, :],
                    other=0.0)
        if X_GROUP or SCALE_AT == 1:  # the K tile's partial scaled per x group and/or weight group
            part = tl.dot(w, tl.trans(x))
            if X_GROUP:  # the K tile lies in one x group
                xs = tl.load(xs_ptr + src * stride_xs + (kt * BLOCK_K) // X_GROUP, mask=mask_m, other=0.0)
                part = part * xs[None, :]
            if SCALE_AT == 1:
                s, z = scale_zero(se, ze, (kt * BLOCK_K) // GROUP_K, cols_n, mask_n, stride_s, SCALE_KIND, S_EXP,
                                  S_MAN, ZP)
                part = part * s[:, None]
            acc += part
        else:
            acc = tl.dot(w, tl.trans(x), acc)
    return tl.trans(acc)


@triton.jit
def _plane_loop(x_ptr, p0, p1, p2, xs_ptr, se, ze, src, mask_m, offs_n, mask_n, cols_n, K, N, stride_xm, stride_s,
                stride_xs, pid_k, SPLIT_K: tl.constexpr, W_BITS: tl.constexpr, W0: tl.constexpr, W1: tl.constexpr,
                W2: tl.constexpr, W_FLOAT: tl.constexpr, W_SIGNED: tl.constexpr, W_EXP: tl.constexpr,
                W_MAN: tl.constexpr, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
                ZP: tl.constexpr, GROUP_K: tl.constexpr, SCALE_AT: tl.constexpr, ROWS: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PAIRS: tl.constexpr, W_NK: tl.constexpr,
                X_GROUP: tl.constexpr):
    """The K loop of `_moe_plane_rows` over this program's K split: [ROWS, BLOCK_N] fp32, weight scales
    applied per K tile where they vary along K (SCALE_AT 1/2; 0: the caller scales once)."""
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    if x_ptr.dtype.element_ty == tl.bfloat16:
        magic_off = 128.0
    else:
        magic_off = 1024.0
    if W_SIGNED:
        magic_off += 1 << (W_BITS - 1)
    lo, hi = _k_tiles(K, pid_k, SPLIT_K, BLOCK_K)
    for kt in range(lo, hi):
        x, offs_k = _x_tile(x_ptr, src, mask_m, stride_xm, kt, K, BLOCK_K)
        if PAIRS:  # the dense kernel's two-per-instruction decode: MAGIC + code in x's dtype, exact
            v = load_pairs(p0, kt * BLOCK_K, offs_n, mask_n, K, N, BLOCK_K, W0, x_ptr.dtype.element_ty)
            s, z = scale_zero(se, ze, (kt * BLOCK_K) // GROUP_K, cols_n, mask_n, stride_s, SCALE_KIND, S_EXP,
                              S_MAN, ZP)
            w = v - (z + magic_off).to(x_ptr.dtype.element_ty)[None, :]
            if SCALE_AT == 1:
                acc += tl.dot(x, w) * s[None, :]
            else:
                acc = tl.dot(x, w, acc)
        elif W_NK:  # the expert's weight is x's FP8 dtype already, [N, K]: its [BLOCK_K, BLOCK_N] view
            w = tl.load(p0 + offs_n[None, :] * K + offs_k[:, None], mask=(offs_k < K)[:, None] & mask_n[None, :],
                        other=0.0)
            if X_GROUP or SCALE_AT == 1:  # the K tile's partial scaled per x group and/or weight group
                part = tl.dot(x, w)
                if X_GROUP:  # x scaled per row and X_GROUP columns (FP8-block): the K tile lies in one group
                    xs = tl.load(xs_ptr + src * stride_xs + (kt * BLOCK_K) // X_GROUP, mask=mask_m, other=0.0)
                    part = part * xs[:, None]
                if SCALE_AT == 1:
                    s, z = scale_zero(se, ze, (kt * BLOCK_K) // GROUP_K, cols_n, mask_n, stride_s, SCALE_KIND,
                                      S_EXP, S_MAN, ZP)
                    part = part * s[None, :]
                acc += part
            else:
                acc = tl.dot(x, w, acc)
        else:
            q = decode_weight(load_codes(p0, p1, p2, kt * BLOCK_K, offs_n, mask_n, K, N, BLOCK_K, W0, W1, W2),
                              W_BITS, W_FLOAT, W_SIGNED, W_EXP, W_MAN)
            if SCALE_AT == 2:
                w = group_scaled(q, se, ze, kt * BLOCK_K, K, mask_n, cols_n, stride_s, GROUP_K, BLOCK_K, BLOCK_N,
                                 SCALE_KIND, S_EXP, S_MAN, ZP)
                acc += tl.dot(x, w.to(x.dtype))
            else:
                s, z = scale_zero(se, ze, (kt * BLOCK_K) // GROUP_K, cols_n, mask_n, stride_s, SCALE_KIND, S_EXP,
                                  S_MAN, ZP)
                part = tl.dot(x, (q - z[None, :]).to(x.dtype))
                if SCALE_AT == 1:
                    acc += part * s[None, :]
                else:
                    acc += part
    return acc


@triton.jit(do_not_specialize=["MASK"])
def _moe_frag_kernel(
    x_ptr, xs_ptr, xsum_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, rs_ptr, y_ptr, sorted_ptr, expert_ptr, total_ptr, rw_ptr,
    ws_ptr, cnt_ptr, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_we, stride_wn, stride_se, stride_s, MASK,
    SPLIT_K: tl.constexpr, TOP_K: tl.constexpr, SILU_MUL: tl.constexpr, MUL_ROUTED: tl.constexpr, W_BITS: tl.constexpr,
    W_FLOAT: tl.constexpr,
    SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr, ZP: tl.constexpr, W_SIGNED: tl.constexpr,
    GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, HAS_GS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NW: tl.constexpr, STAGES: tl.constexpr, PANEL: tl.constexpr, PTX: tl.constexpr, FOLD: tl.constexpr,
    PDL: tl.constexpr = False, SCALE_W: tl.constexpr = False, TAIL_HALF: tl.constexpr = False,
    SETTLE: tl.constexpr = False, HAS_XS: tl.constexpr = False, HAS_RS: tl.constexpr = False,
    PAIRS: tl.constexpr = False, MMA_ACC: tl.constexpr = False, BM2: tl.constexpr = 0, E=1,
    SLOTS: tl.constexpr = False, SUM_SLOTS: tl.constexpr = 0, CHECK_E: tl.constexpr = False,
    N_FIRST: tl.constexpr = False,
):
    """The grouped GEMM for fragment-layout experts (`anybit.kernels.frag`): each block of rows is
    computed transposed, its expert's weight rows decoded straight into the MMA's registers. PDL: launched
    as a programmatic dependent, it waits for the kernel before it ahead of any read. TAIL_HALF: a block
    whose second half is padding (an expert's last, short block) runs its MMA on the first half only
    (without split-K: the split workspace is laid out by whole blocks). BM2 > 0 (no split-K; 4-bit codes,
    `two_part_why_not`): BLOCK_M is a power of two and BM2 (48 = 32 + 16, 80 = 64 + 16, 144 = 128 + 16), two MMAs on
    each decoded K block (`frag_range_two`), or the first part alone where the second is all padding. HAS_XS: x's
    rows carry per-token scales (FP8 x as e4m3, or its codes in bf16/fp16 for `codes_a16` experts). HAS_RS: each
    expert's rows' powers of two (fp32 [E, N]: e2m1 experts on the FP8 MMA, `unpack_e2m1_a8`). SLOTS, SUM_SLOTS,
    CHECK_E: no alignment, and N_FIRST (`block_ids`), as `_moe_gemm_kernel`'s."""
    if PDL:
        gdc_wait()
    pid_m, pid_n = block_ids(N_FIRST)
    e = tl.load(expert_ptr + pid_m)
    BM1: tl.constexpr = BLOCK_M - BM2  # the power-of-two part
    if block_live(e, E, total_ptr, y_ptr, ws_ptr, cnt_ptr, pid_m, N, stride_ym, SLOTS, SUM_SLOTS, SPLIT_K, BLOCK_M,
                  BLOCK_N, CHECK_E):  # fmt: skip
        # sorted rows pad each expert's run at its end: a block's first padding row says how many it holds
        mid = pid_m * BLOCK_M + (BM1 if BM2 else BLOCK_M // 2)
        short = tl.load(sorted_ptr + mid, mask=mid < n_sorted, other=num_rows) >= num_rows
        if BM2 > 0 and not short:
            _moe_frag_two(x_ptr, xs_ptr, xsum_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, rs_ptr, y_ptr, sorted_ptr, rw_ptr, e,
                          pid_m, pid_n, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_we, stride_wn, stride_se,
                          stride_s, MASK, TOP_K, SILU_MUL, MUL_ROUTED, W_FLOAT, SCALE_KIND, S_EXP, S_MAN, ZP, W_SIGNED,
                          GROUP_K, GROUP_N, HAS_GS, BLOCK_M, BM1, BM2, BLOCK_N, NW, STAGES, PANEL, PTX, FOLD, SETTLE,
                          SCALE_W, HAS_XS, HAS_RS, MMA_ACC)
        elif BM2 > 0:
            _moe_frag_rows(x_ptr, xs_ptr, xsum_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, rs_ptr, y_ptr, sorted_ptr, rw_ptr,
                           ws_ptr, cnt_ptr, e, pid_m, pid_n, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_we,
                           stride_wn, stride_se, stride_s, MASK, SPLIT_K, TOP_K, SILU_MUL, MUL_ROUTED, W_BITS, W_FLOAT,
                           SCALE_KIND, S_EXP, S_MAN, ZP, W_SIGNED, GROUP_K, GROUP_N, HAS_GS, BLOCK_M, BM1,
                           BLOCK_N, NW, STAGES, PANEL, PTX, FOLD, SCALE_W, SETTLE, HAS_XS, HAS_RS, PAIRS,
                           MMA_ACC)
        elif TAIL_HALF and SPLIT_K == 1 and short:
            _moe_frag_rows(x_ptr, xs_ptr, xsum_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, rs_ptr, y_ptr, sorted_ptr, rw_ptr,
                           ws_ptr, cnt_ptr, e, pid_m, pid_n, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_we,
                           stride_wn, stride_se, stride_s, MASK, SPLIT_K, TOP_K, SILU_MUL, MUL_ROUTED, W_BITS, W_FLOAT,
                           SCALE_KIND, S_EXP, S_MAN, ZP, W_SIGNED, GROUP_K, GROUP_N, HAS_GS, BLOCK_M, BLOCK_M // 2,
                           BLOCK_N, NW, STAGES, PANEL, PTX, FOLD, SCALE_W, SETTLE, HAS_XS, HAS_RS, PAIRS,
                           MMA_ACC)
        else:
            _moe_frag_rows(x_ptr, xs_ptr, xsum_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, rs_ptr, y_ptr, sorted_ptr, rw_ptr,
                           ws_ptr, cnt_ptr, e, pid_m, pid_n, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_we,
                           stride_wn, stride_se, stride_s, MASK, SPLIT_K, TOP_K, SILU_MUL, MUL_ROUTED, W_BITS, W_FLOAT,
                           SCALE_KIND, S_EXP, S_MAN, ZP, W_SIGNED, GROUP_K, GROUP_N, HAS_GS, BLOCK_M, BLOCK_M,
                           BLOCK_N, NW, STAGES, PANEL, PTX, FOLD, SCALE_W, SETTLE, HAS_XS, HAS_RS, PAIRS,
                           MMA_ACC, SLOTS, SUM_SLOTS)


@triton.jit
def _moe_frag_rows(x_ptr, xs_ptr, xsum_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, rs_ptr, y_ptr, sorted_ptr, rw_ptr, ws_ptr,
                   cnt_ptr,
                   e, pid_m, pid_n, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_we, stride_wn, stride_se,
                   stride_s, MASK, SPLIT_K: tl.constexpr, TOP_K: tl.constexpr, SILU_MUL: tl.constexpr,
                   MUL_ROUTED: tl.constexpr, W_BITS: tl.constexpr, W_FLOAT: tl.constexpr, SCALE_KIND: tl.constexpr,
                   S_EXP: tl.constexpr, S_MAN: tl.constexpr, ZP: tl.constexpr, W_SIGNED: tl.constexpr,
                   GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, HAS_GS: tl.constexpr, BLOCK_M: tl.constexpr,
                   ROWS: tl.constexpr, BLOCK_N: tl.constexpr, NW: tl.constexpr, STAGES: tl.constexpr,
                   PANEL: tl.constexpr, PTX: tl.constexpr, FOLD: tl.constexpr, SCALE_W: tl.constexpr,
                   SETTLE: tl.constexpr, HAS_XS: tl.constexpr, HAS_RS: tl.constexpr, PAIRS: tl.constexpr,
                   MMA_ACC: tl.constexpr, SLOTS: tl.constexpr = False, SUM_SLOTS: tl.constexpr = 0):
    """The first ROWS rows of block pid_m (blocks BLOCK_M rows apart) against expert e's weight rows of
    N tile pid_n and this program's K split, decoded into the MMA's registers; the epilogue of `finish_rows`."""
    pid_k = tl.program_id(2)
    rows, mask_m, src = block_rows(sorted_ptr, pid_m, n_sorted, num_rows, TOP_K, BLOCK_M, ROWS, 0, SLOTS)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    e64 = e.to(tl.int64)
    k_blocks = tl.cdiv(K, 512 // W_BITS)
    per = tl.cdiv(k_blocks, SPLIT_K)
    lo = pid_k * per
    acc = frag_range(x_ptr, src, mask_m, stride_xm, w_ptr + e64 * stride_we, s_ptr + e64 * stride_se,
                     z_ptr + e64 * stride_se, offs_n, mask_n, K, stride_wn, stride_s, lo,
                     tl.minimum(lo + per, k_blocks), MASK, W_BITS, W_FLOAT, SCALE_KIND, S_EXP, S_MAN, ZP, W_SIGNED,
                     GROUP_K, GROUP_N, BLOCK_N, ROWS, NW, STAGES, PANEL, PTX, FOLD, xsum_ptr,
                     num_rows // TOP_K, SCALE_W, SETTLE, PAIRS, MMA_ACC)  # sums: [blocks, rows of x]
    if GROUP_K >= 1 << 30:  # one scale over all of K
        acc = acc * load_scale(s_ptr + e64 * stride_se, 0, offs_n // GROUP_N, mask_n, stride_s, SCALE_KIND,
                               S_EXP, S_MAN)[:, None]
    if HAS_RS:
        acc = acc * tl.load(rs_ptr + e64 * N + offs_n, mask=mask_n, other=0.0)[:, None]
    finish_rows(tl.trans(acc), e, gs_ptr, xs_ptr, rw_ptr, y_ptr, ws_ptr, cnt_ptr, rows, src, mask_m, offs_n,
                mask_n, pid_m, pid_n, pid_k, N, stride_ym, HAS_GS, HAS_XS, MUL_ROUTED, SILU_MUL, SPLIT_K, ROWS,
                BLOCK_N, SUM_SLOTS)


@triton.jit
def _moe_frag_two(x_ptr, xs_ptr, xsum_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, rs_ptr, y_ptr, sorted_ptr, rw_ptr, e, pid_m,
                  pid_n, num_rows, n_sorted, N, K, stride_xm, stride_ym, stride_we, stride_wn, stride_se, stride_s,
                  MASK,
                  TOP_K: tl.constexpr, SILU_MUL: tl.constexpr, MUL_ROUTED: tl.constexpr, W_FLOAT: tl.constexpr,
                  SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr, ZP: tl.constexpr,
                  W_SIGNED: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, HAS_GS: tl.constexpr,
                  BLOCK_M: tl.constexpr, BM1: tl.constexpr, BM2: tl.constexpr, BLOCK_N: tl.constexpr,
                  NW: tl.constexpr, STAGES: tl.constexpr, PANEL: tl.constexpr, PTX: tl.constexpr, FOLD: tl.constexpr,
                  SETTLE: tl.constexpr, SCALE_W: tl.constexpr, HAS_XS: tl.constexpr, HAS_RS: tl.constexpr,
                  MMA_ACC: tl.constexpr):
    """Block pid_m's BM1 + BM2 rows against expert e's weight rows of this program's N tile (4-bit codes, no
    split-K): each K block decoded once into two MMAs (`frag_range_two`), each part's epilogue."""
    rows, mask_m, src = block_rows(sorted_ptr, pid_m, n_sorted, num_rows, TOP_K, BLOCK_M, BM1)
    rows2, mask_m2, src2 = block_rows(sorted_ptr, pid_m, n_sorted, num_rows, TOP_K, BLOCK_M, BM2, BM1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    e64 = e.to(tl.int64)
    se = s_ptr + e64 * stride_se
    a1, a2 = frag_range_two(x_ptr, src, mask_m, src2, mask_m2, stride_xm, w_ptr + e64 * stride_we, se,
                            z_ptr + e64 * stride_se, offs_n, mask_n, K, stride_wn, stride_s, 0, tl.cdiv(K, 128), MASK,
                            W_FLOAT, SCALE_KIND, S_EXP, S_MAN, ZP, W_SIGNED, GROUP_K, GROUP_N, BLOCK_N, BM1, BM2, NW,
                            STAGES, PANEL, PTX, FOLD, SETTLE, SCALE_W, MMA_ACC, xsum_ptr, num_rows // TOP_K)
    if GROUP_K >= 1 << 30:  # one scale over all of K
        s = load_scale(se, 0, offs_n // GROUP_N, mask_n, stride_s, SCALE_KIND, S_EXP, S_MAN)[:, None]
        a1 = a1 * s
        a2 = a2 * s
    if HAS_RS:
        r = tl.load(rs_ptr + e64 * N + offs_n, mask=mask_n, other=0.0)[:, None]
        a1 = a1 * r
        a2 = a2 * r
    finish_rows(tl.trans(a1), e, gs_ptr, xs_ptr, rw_ptr, y_ptr, y_ptr, y_ptr, rows, src, mask_m, offs_n, mask_n,
                pid_m, pid_n, 0, N, stride_ym, HAS_GS, HAS_XS, MUL_ROUTED, SILU_MUL, 1, BM1, BLOCK_N)
    finish_rows(tl.trans(a2), e, gs_ptr, xs_ptr, rw_ptr, y_ptr, y_ptr, y_ptr, rows2, src2, mask_m2, offs_n, mask_n,
                pid_m, pid_n, 0, N, stride_ym, HAS_GS, HAS_XS, MUL_ROUTED, SILU_MUL, 1, BM2, BLOCK_N)


# fmt: on


@triton.jit
def _moe_sum_kernel(y_ptr, ids_ptr, out_ptr, H, E, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = the sum of y's rows t*TOP_K + j whose expert id is in [0, E) (the rows the down GEMM wrote)."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        e = tl.load(ids_ptr + t * TOP_K + j + tl.zeros_like(offs))  # the slot's id on every lane
        row = tl.load(y_ptr + (t * TOP_K + j) * H + offs, mask=(offs < H) & (e >= 0) & (e < E), other=0.0)
        acc += row.to(tl.float32)
    tl.store(out_ptr + t * H + offs, acc.to(out_ptr.dtype.element_ty), mask=offs < H)


def moe_sum(y: torch.Tensor, topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """y [T*k, H] (one row per token x slot, rows of dropped slots never written) -> [T, H]: each token's
    rows of a valid expert summed in fp32 — no zero-filled y needed (H200 DeepSeek-V3 M=4096: a 470 MB
    memset), one launch."""
    t, k = topk_ids.shape
    h = y.shape[1]
    out = torch.empty((t, h), device=y.device, dtype=y.dtype)
    block_h = min(1024, next_pow2(h))
    _moe_sum_kernel[(t, cdiv(h, block_h))](y, topk_ids.contiguous(), out, h, num_experts, TOP_K=k, BLOCK_H=block_h)
    return out


def _pairs_format(tw) -> bool:
    return not tw.fmt["W_FLOAT"] and len(tw.plane_bits) == 1 and tw.plane_bits[0] in (2, 4) and tw.fmt["ZP"] != 2


def check_aligned(sorted_ids, expert_ids, block_m: int) -> None:
    """The grouped GEMMs' inputs must come from one `moe_align(..., block_m)` call: one expert id per block."""
    if expert_ids.numel() != cdiv(sorted_ids.numel(), block_m):
        have = f"{expert_ids.numel()} expert ids for {sorted_ids.numel()} sorted rows"
        raise ValueError(f"{have}: not one moe_align call with block_m={block_m}")


def moe_grid_m(num_rows: int, n_sorted: int, n_blocks: int, block_m: int) -> int:
    """Blocks the launch covers: at most cdiv(rows, block_m) full blocks plus one partial block per
    expert that has rows — a static bound, so the launch stays graph-capturable (at decode ~10 blocks,
    where moe_align leaves room for E * (block_m - 1) padding rows)."""
    experts = (n_sorted - num_rows) // (block_m - 1) if block_m > 1 else 0
    return min(n_blocks, cdiv(num_rows, block_m) + min(experts, num_rows))


def moe_plan_grid_m(num_rows: int, experts: int, block_m: int) -> int:
    """`moe_grid_m` of a call of num_rows token x slot rows over `experts` experts before it is aligned (a plan's
    view: `moe_align`'s sorted length leaves each expert block_m - 1 rows of padding)."""
    return moe_grid_m(num_rows, num_rows + experts * (block_m - 1), 1 << 30, block_m)


# The grid's most blocks of rows on its second axis (CUDA's limit for grid y).
GRID_Y_MAX = 65535


def moe_n_first(grid_m: int, split_k: int, slots: bool, sum_slots: int, n_first: bool | None = None) -> bool:
    """Whether a launch runs N tiles fastest (`moe_rows.block_ids`): the CTAs resident together then cover a few blocks
    of rows and all their N tiles, so a block's x rows and its expert's weights are read from HBM about once. Blocks
    fastest (the order before) streamed every block's x rows once per N tile — DeepSeek-V3 down at 4096 tokens: the
    [32768, 2048] intermediate (134 MB) 28 times. Not for split-K or slot blocks (their partials count tiles by the
    blocks-first grid). n_first: the caller's choice where allowed (None: always)."""
    if split_k > 1 or slots or sum_slots or grid_m > GRID_Y_MAX:
        return False
    return True if n_first is None else bool(n_first)


def moe_decode_plan(
    num_rows: int, experts: int, n: int, k: int, tiles: dict, sms: int, frag: bool = False, narrow: bool = False,
    split_ok: bool = True,
) -> tuple[int, int, int | None]:  # fmt: skip
    """(block_n, split_k, maxnreg) for a launch that would leave the GPU idle (decode). `narrow` (frag-layout
    weights, no fused silu): a launch of < 3 CTAs per SM takes 64-row tiles first — H200, one token: Qwen3-30B-A3B
    down (1.1 CTAs an SM) 7.2 -> 6.1 µs (the fused gate_up ran slower so: 45.2 -> 53.9 unsplit). Above that the
    64-row tiles lost (session 45, the threshold was 6): Qwen3 4 tokens (4.1 CTAs an SM) down w4a16 / W4A8 / NVFP4
    11.3 / 9.4 / 13.0 µs at 128 rows against 12.2 / 10.9 / 13.6 at 64, DeepSeek-V3 one token (3.8) W4A8 19.6 vs
    23.0, w4a16 23.4 vs 23.6, NVFP4 28.1 vs 27.2. Then K is split until the launch puts ~3 CTAs on each SM, keeping >= 4
    K tiles per split: DeepSeek-V3 gate_up 58.7 -> 44.8 µs split in 2 (45.3 in 4; ncu unsplit: 288
    CTAs, SMs busy 67 % of the time at 2.09 TB/s), while splitting a launch that already holds enough
    CTAs costs 5–50 % (DeepSeek down 27.1 -> 29.5 in 2; tools/moe_bench.py --splits/--tiles). Not `split_ok`
    (FP8 experts read as stored under per-token FP8 x, `launch_plan`): unsplit, the layer ran faster (session 45,
    layer µs planned split -> unsplit: DeepSeek-V3 W8A8 one token 100.0 -> 95.7, 99.5 -> 95.1 in another process;
    Qwen3-30B-A3B one / two tokens 24.1 / 35.0 -> 22.8 / 32.0) though its GEMMs alone were even (DeepSeek gate_up
    59.7 -> 59.4). Frag decode tiles whose CTAs each walk >= 2048 K are capped at 128 registers (4 CTAs per SM instead
    of 3, spill-free): DeepSeek-V3 M=1/4 gate_up 44.9/138.1 -> 41.2/133.5 µs, down 26.3 -> 24.0, Qwen3
    gate_up M=16 45.5 -> 43.7; short CTAs lose by it (Qwen3 gate_up M=1/4, 1024 K each: 9.9/18.9 ->
    11.2/23.2), so they keep the compiler's count."""
    block_m, block_n = tiles["block_m"], tiles["block_n"]
    grid_m = moe_plan_grid_m(num_rows, experts, block_m)
    if narrow and block_n > 64 and grid_m * cdiv(n, block_n) < 3 * sms:
        block_n = 64
    ctas, k_tiles, split = grid_m * cdiv(n, block_n), cdiv(k, tiles["block_k"]), 1
    while split_ok and split * 2 * 4 <= k_tiles and split < 16 and ctas * split < 3 * sms:
        split *= 2
    maxnreg = 128 if frag and block_m == 16 and cdiv(k, split) >= 2048 else None
    return block_n, split, maxnreg


def moe_wide_tile(tw, x_dtype: torch.dtype) -> bool:
    """Whether 128-row blocks of these experts take 256 weight rows (8 warps, 128 rows per warpgroup, x
    read half as often) without spilling: fragment-layout 4-bit experts under bf16/fp16 x whose K loop
    keeps one accumulator — group scales on the decoded weights (`frag_scale_w`), e2m1 with groups
    shorter than the block (scaled in registers), or channel scales. H200 M=4096, DeepSeek-V3 and
    Qwen3-30B-A3B, w4a16/mxfp4/nvfp4: 10-23 % faster than 128 rows (A8 experts and 128-K groups of
    the other formats spill there). Hopper only: for sm_80 the tile spills and needs more shared memory
    than an A100 block has."""
    if not tw.frag or tw.scheme.act.quantized or tw.fmt["W_BITS"] != 4:  # `codes_a16`: its x-scale epilogue spills
        return False
    if not settings.triton_interpret() and target_sm() < 90:
        return False
    registers = tw.fmt["W_FLOAT"] and tw.group_k < 128
    return registers or tw.group_k >= tw.k or frag_scale_w(tw, x_dtype, 128)


def moe_tile_kind(tw, x_dtype: torch.dtype) -> str:
    """What `anybit.moe.layer.moe_tiles` picks tiles by: "wide" (`moe_wide_tile`), "a8-acc" (e2m1 experts on the FP8
    MMA accumulating the whole K, `frag_mma_acc`), "a8-rescale" (integer experts accumulating there in units of each
    block's scale from 32-row blocks on, `frag_rescale`), "a8" (other fragment-layout experts under FP8 x on the FP8
    MMA; `codes_a16` experts take the A16 kinds), "fp8" / "fp8-block" (FP8 experts read as stored under per-token /
    per-group FP8 x: no decode, a deep K tile), or ""."""
    if moe_wide_tile(tw, x_dtype):
        return "wide"
    act = tw.scheme.act
    if tw.frag and tw.mma_a8:
        return "a8-acc" if frag_mma_acc(tw) else "a8-rescale" if frag_rescale(tw, RESCALE_MIN_ROWS) else "a8"
    if tw.nk and act.quantized:
        return "fp8-block" if act.group else "fp8"
    return ""


def moe_block_n(tw, block_n: int, num_warps: int) -> int:
    """The N tile the kernel runs: fragment-layout experts put weight rows on the MMA's 64-row side
    (>= 16 rows per warp), and a 256-K block of 2-bit codes is decoded whole, so 16 rows per warp."""
    if not tw.frag:
        return block_n
    return 16 * num_warps if tw.fmt["W_BITS"] == 2 else max(block_n, 16 * num_warps)


def moe_block_k(tw, block_k: int, fp8_x: bool = False) -> int:
    """The K tile the kernel runs: groups smaller than the tile shrink it to the group (one scale per K
    tile) for 2/4-bit ints (keeps the two-per-instruction decode) and under FP8 activations (the
    weight must reach the FP8 MMA unscaled, so exact)."""
    if (fp8_x or _pairs_format(tw)) and 16 <= tw.group_k < block_k:
        return max(tw.group_k, 32) if fp8_x else tw.group_k
    return block_k


# Blocks of two parts from which group scales multiply the decoded weights wherever exact (`frag_scale_w`): at 80
# and 96 rows the fresh fp32 product a part and K block spilled (sm_90a, w4a16 96 rows: 248 bytes; H200 Qwen3-30B-A3B
# M=1024 96-row blocks 240 / 150 µs -> 155 / 92 with it); at 48 rows the multiply costs more than it saves
# (DeepSeek-V3 M=1024 w4a16 gate_up / down 1776 / 1015 -> 1892 / 1068 µs with it).
TWO_SCALE_W_ROWS = 80


def two_part_block(block_m: int) -> bool:
    """Whether a grouped-GEMM block of block_m rows is one of two parts (48 = 32 + 16 …: not a power of two), which
    runs without split-K, tail_half or slot blocks (`two_part_why_not`)."""
    return block_m & (block_m - 1) != 0


def two_part_why_not(tw, block_m: int, split_k: int = 1, tail_half: bool = False) -> str | None:
    """None where `moe_gemm` runs blocks of block_m = a power of two + a smaller one (`frag.two_parts`: 48 = 32 + 16,
    80 = 64 + 16) as two MMAs on each decoded K block (`frag_range_two`): fragment-layout 4-bit codes (bf16/fp16 x,
    or FP8 x on the FP8 MMA or as codes), without split-K or tail_half (the first part alone runs the blocks whose
    second part is padding); else why not, for the caller's error."""
    try:
        two_parts(block_m)
    except ValueError as ex:
        return str(ex)
    if not tw.frag or tw.fmt["W_BITS"] != 4:
        return f"blocks of two parts take fragment-layout 4-bit experts, not {tw.scheme}; use a power of two"
    if split_k > 1 or tail_half:
        return f"blocks of two parts run without split-K or tail_half, got split_k={split_k}, tail_half={tail_half}"
    return None


def slot_blocks_why_not(ids, total, num_rows: int, block_m: int, tail_half: bool = False, silu_mul: bool = False,
                        sum_slots: int = 0) -> str | None:  # fmt: skip
    """None where `moe_gemm(sorted_ids=None)` runs one block per flat slot (expert_ids = `ids`, the flat top-k ids),
    else why not, for the caller's error."""
    if total is not None:
        return "slot blocks (sorted_ids=None) take no total: pass moe_align's three outputs or the top-k ids alone"
    if ids.dim() != 1 or ids.numel() != num_rows or ids.dtype not in (torch.int32, torch.int64):
        return f"slot blocks take the flat top-k ids, int32/int64 [{num_rows}], got {ids.dtype} {tuple(ids.shape)}"
    if two_part_block(block_m) or tail_half:
        return f"slot blocks take a power-of-two block_m without tail_half, got {block_m=}, {tail_half=}"
    if sum_slots and (silu_mul or num_rows % sum_slots):
        return f"sum_slots={sum_slots} sums the down GEMM's slots: no silu_mul, rows ({num_rows}) a multiple of it"
    return None


# the arguments of `_moe_frag_kernel` a call changes: x, its scales and block sums, y, the alignment (sorted ids,
# expert ids, total), routed weights, workspace, counters, rows, slots, x's and y's row strides
_MOE_FRAG_LIVE = (0, 1, 2, 8, 9, 10, 11, 12, 13, 14, 15, 16, 19, 20)


def _moe_frag_launch(tw, x_dtype: torch.dtype, key: tuple, slot_consts: dict) -> Launcher:
    """The `Launcher` of `moe_gemm`'s fragment-layout calls with this key (tile, flags, settings), its constexprs
    worked out once per stacked weight (an eager call's host time); slot_consts: the slot blocks' (`E`, `SLOTS` …)."""
    _, block_m, block_n, split_k, num_warps, num_stages, maxnreg, top_k, silu_mul, no_routed, fp8_x, _, pdl, \
        scale_w, tail_half, ptx, settle, fold, *_ = key  # fmt: skip
    pairs = frag_pairs(tw, block_m, maxnreg)  # two K blocks an iteration (`frag.FRAG_PAIRS`)
    bm2 = two_parts(block_m)[1]
    consts = dict(
        SPLIT_K=split_k, TOP_K=top_k, SILU_MUL=silu_mul, MUL_ROUTED=not no_routed, **frag_constexprs(tw),
        GROUP_K=frag_group_k(tw, num_warps), GROUP_N=tw.group_n, HAS_GS=tw.global_scale is not None, BLOCK_M=block_m,
        BLOCK_N=block_n, NW=num_warps, STAGES=pair_stages(num_stages) if pairs else num_stages, PANEL=FRAG_PANEL,
        PTX=ptx, FOLD=fold, PDL=pdl, SETTLE=settle,
        SCALE_W=frag_scale_w(tw, x_dtype, block_m if bm2 == 0 or block_m < TWO_SCALE_W_ROWS else 128)
        if scale_w is None else scale_w,
        TAIL_HALF=tail_half,
        HAS_XS=fp8_x, HAS_RS=tw.e2m1_a8, PAIRS=pairs, MMA_ACC=frag_mma_acc(tw) or frag_rescale(tw, block_m), BM2=bm2,
        **slot_consts,
        num_warps=num_warps,
        maxnreg=maxnreg, launch_pdl=pdl,
    )  # fmt: skip
    return Launcher(_moe_frag_kernel, consts, _MOE_FRAG_LIVE)


def moe_gemm(
    x,
    tw,
    sorted_ids,
    expert_ids,
    total,
    *,
    block_m: int,
    num_rows: int,
    top_k: int,
    out=None,
    silu_mul: bool = False,
    routed_weights=None,
    x_scales=None,
    x_group: int = 0,
    x_sums=None,
    out_dtype=None,
    split_k: int = 1,
    workspace=None,
    counters=None,
    block_n: int = 64,
    block_k: int = 32,
    num_warps: int = 4,
    num_stages: int = 3,
    maxnreg: int | None = None,
    pdl: bool = False,
    scale_w: bool | None = None,
    tail_half: bool = False,
    sum_slots: int = 0,
    check_ids: bool = True,
    n_first: bool | None = None,
):
    """x [T or T*k, K]; tw: `anybit.backends.triton_layout.stack_experts` result; sorted_ids,
    expert_ids, total: `anybit.moe.moe_align(..., block_m)`. Returns y [num_rows, N] (row = flat slot;
    rows of no valid slot are left as they were).

    Without alignment (decode: `slot_blocks_why_not`): sorted_ids and total None and expert_ids the flat top-k ids
    [num_rows] (int32/int64; -1 = no expert): each flat slot is a block of its own, on the block's first row — no
    `moe_align` launch, and an expert's weights read once per slot (so once at one token: its top-k experts
    differ). check_ids: an id >= E stops the kernel (a device-side trap: "unspecified launch failure"; the interpreter
    raises before the launch), else it is skipped as -1 is.
    sum_slots = k (no silu_mul): y is [num_rows / k, N], each token's k slots summed in fp32 in the same launch
    (through `workspace` and `counters` as split-K; dropped slots add nothing) — no `moe_sum` launch.

    silu_mul: W's rows interleave gate and up (`anybit.moe.layer.interleave_gate_up`); y is
    silu(gate) * up, [num_rows, N / 2]. routed_weights: fp32 [num_rows], multiplied into each row.
    x_scales: x is FP8 (`quantize_act` per token; `codes_a16` experts: its codes in bf16/fp16,
    `quantize_act(codes_dtype=...)`) with these fp32 [rows of x, 1] scales, or with
    `x_group` > 0 per row and x_group columns ([rows of x, K / x_group]; experts that are x's FP8 dtype
    already, e.g. FP8-block, whose K tile then lies in one group); the weight is
    cast to x's FP8 dtype in registers (exact: the backend's `fp8_unsupported` rule) and y is
    `out_dtype` (bf16/fp16); fragment-layout experts also take x's per-128-K-block sums `x_sums`
    (`quantize_act(block_sums=True)`, [blocks, rows of x]; without them each x tile is summed in the
    loop). split_k > 1: K is cut into that many parts reduced in the same launch
    (decode: more CTAs than the few touched experts give), with `workspace` fp32 >= split_k * grid rows
    * N and zeroed int32 `counters` >= grid tiles (`moe_decode_plan` sizes them). maxnreg: cap the
    registers per thread of the fragment-layout kernel (more CTAs per SM; ptxas spills past the cap). pdl:
    the fragment-layout kernel launches as a programmatic dependent of the kernel before it. scale_w:
    group scales multiply the decoded weights before the MMA (`frag_scale_w`; None: its rule). tail_half
    (no split-K): blocks whose second half is padding run half-width (`QuantMoE`'s plan for blocks of >= 32
    rows). block_m: a power of two, or for fragment-layout 4-bit experts under bf16/fp16 x the sum of two (48 =
    32 + 16, 80 = 64 + 16, 144 = 128 + 16: two MMAs on each decoded K block, `two_part_why_not`). n_first: the
    launch order (`moe_n_first`; None: its rule)."""
    slots = sorted_ids is None
    if slots:
        why = slot_blocks_why_not(expert_ids, total, num_rows, block_m, tail_half, silu_mul, sum_slots)
        if why:
            raise ValueError(why)
        sorted_ids = total = expert_ids  # (not read: n_sorted = 0 masks every load of sorted_ids)
    else:
        check_aligned(sorted_ids, expert_ids, block_m)
        if sum_slots:
            raise ValueError(f"sum_slots={sum_slots} takes slot blocks (sorted_ids=None), not moe_align's blocks")
    n, k = tw.n, tw.k
    if tail_half and split_k > 1:
        raise ValueError(f"tail_half runs without split-K (the split workspace holds whole blocks), got {split_k=}")
    if two_part_block(block_m):
        two_why = two_part_why_not(tw, block_m, split_k, tail_half)
        if two_why:
            raise ValueError(f"block_m={block_m}: {two_why}")
    if silu_mul and (n % 2 or block_n % 2):
        raise ValueError(f"silu_mul needs an even N and N tile, got N={n}, block_n={block_n}")
    n_out = n // 2 if silu_mul else n
    fp8_x = x_scales is not None
    y_rows = num_rows // sum_slots if sum_slots else num_rows
    y = out if out is not None else torch.empty((y_rows, n_out), device=x.device, dtype=out_dtype or x.dtype)
    if sum_slots and tuple(y.shape) != (y_rows, n_out):
        raise ValueError(f"out must be [{y_rows}, {n_out}] (tokens) with sum_slots={sum_slots}, got {tuple(y.shape)}")
    block_n = moe_block_n(tw, block_n, num_warps)
    # blocks that can hold rows
    grid_m = num_rows if slots else moe_grid_m(num_rows, sorted_ids.numel(), expert_ids.numel(), block_m)
    n_sorted = 0 if slots else sorted_ids.numel()
    tiles = grid_m * cdiv(n, block_n)
    if split_k > 1 or sum_slots:
        need = split_k * grid_m * block_m * n
        if workspace is None or workspace.numel() < need or counters is None or counters.numel() < tiles:
            why = f"split_k={split_k}" + (f" with sum_slots={sum_slots}" if sum_slots else "")
            raise ValueError(f"{why} needs an fp32 workspace >= {need} and >= {tiles} counters")
    # an id >= E stops a slot launch on the GPU; the interpreter cannot trap, the host checks its CPU ids
    experts = tw.planes[0].shape[0]
    check_e = slots and check_ids and not settings.triton_interpret()
    if slots and check_ids and not check_e and bool((expert_ids >= experts).any()):
        raise AnybitError(f"expert id {int(expert_ids.max())} out of range for {experts} experts")
    order = moe_n_first(grid_m, split_k, slots, sum_slots, n_first)
    slot_consts = dict(E=experts, SLOTS=slots, SUM_SLOTS=sum_slots, CHECK_E=check_e, N_FIRST=order)
    grid = (cdiv(n, block_n), grid_m, 1) if order else (grid_m, cdiv(n, block_n), split_k)
    dummy = tw.scales
    if tw.frag:
        if fp8_x != tw.scheme.act.quantized or (x.dtype == torch.float8_e4m3fn) != tw.mma_a8:
            raise ValueError(f"{tw.scheme} experts were packed for {tw.x_wants} activations (with x_scales for FP8 "
                             f"schemes), got {x.dtype}{' with' if fp8_x else ' without'} x_scales")  # fmt: skip
        rows_x = num_rows // top_k  # the kernel reads the sums as [blocks, rows of x]
        if x_sums is not None and (x_sums.shape != (cdiv(k, 128), rows_x) or not x_sums.is_contiguous()):
            want = f"contiguous fp32 [{cdiv(k, 128)}, {rows_x}] (quantize_act of x's {rows_x} rows)"
            raise ValueError(f"x_sums must be {want}, got {tuple(x_sums.shape)}")
        key = (
            "moe",
            block_m,
            block_n,
            split_k,
            num_warps,
            num_stages,
            maxnreg,
            top_k,
            silu_mul,
            routed_weights is None,
            fp8_x,
            x.dtype,
            pdl,
            scale_w,
            tail_half,
            frag_ptx(),
            frag_settle(),
            frag_fold(tw, x.dtype),
            frag_switches.FRAG_PAIRS,
            frag_switches.A8_MMA_ACC,
            frag_switches.A8_RESCALE,
            frag_switches.RESCALE_MIN_ROWS,
            slots,
            sum_slots,
            check_e,
            order,
        )  # every setting and switch it reads (and `slot_consts`, whose E is the weight's)
        launch = tw.launches.get(key)
        if launch is None:
            launch = tw.launches[key] = _moe_frag_launch(tw, x.dtype, key, slot_consts)
        rows = tw.rowwise[1] if tw.e2m1_a8 else None  # e2m1 on the FP8 MMA: its scales are row-relative codes
        # fmt: off
        launch(
            grid, x, x_scales if fp8_x else dummy,
            x_sums if fp8_x and tw.mma_a8 else None, tw.planes[0], tw.scales,
            tw.zeros if tw.zeros is not None else dummy, tw.global_scale if tw.global_scale is not None else dummy,
            rows if rows is not None else dummy, y,
            sorted_ids, expert_ids, total, routed_weights if routed_weights is not None else dummy,
            workspace if split_k > 1 or sum_slots else dummy, counters if split_k > 1 or sum_slots else dummy,
            num_rows, n_sorted, n, k, x.stride(0), y.stride(0),
            tw.planes[0].stride(0), tw.planes[0].stride(1), tw.scales.stride(0), tw.scales.stride(1),
            frag_mask(tw.fmt["W_BITS"]),
        )
        # fmt: on
        return y
    block_k = moe_block_k(tw, block_k, fp8_x)
    if x_group and (tw.frag or not tw.nk or not fp8_x or x_group % block_k or x_scales.shape[1] != cdiv(k, x_group)):
        raise ValueError(
            f"x_group={x_group} takes FP8 experts read as stored and x scales [rows, K/{x_group}] "
            f"with K tiles inside one group, got block_k={block_k}, scales {tuple(x_scales.shape)}"
        )
    sa = scale_at(tw.group_k, k, block_k)
    pairs = _pairs_format(tw) and sa != 2 and not fp8_x
    p, w = plane_args(tw.planes, tw.plane_bits)
    # fmt: off
    _moe_gemm_kernel[grid](
        x, p[0], p[1], p[2], tw.scales, tw.zeros if tw.zeros is not None else dummy,
        tw.global_scale if tw.global_scale is not None else dummy, y, sorted_ids, expert_ids, total,
        routed_weights if routed_weights is not None else dummy, x_scales if fp8_x else dummy,
        workspace if split_k > 1 or sum_slots else dummy, counters if split_k > 1 or sum_slots else dummy, num_rows,
        n_sorted, n, k, x.stride(0), y.stride(0), p[0].stride(0), p[1].stride(0), p[2].stride(0),
        tw.scales.stride(0), tw.scales.stride(1), x_scales.stride(0) if fp8_x else 0, SPLIT_K=split_k, TOP_K=top_k,
        SILU_MUL=silu_mul,
        MUL_ROUTED=routed_weights is not None, FP8_X=fp8_x, W0=w[0], W1=w[1], W2=w[2], GROUP_K=tw.group_k,
        GROUP_N=tw.group_n, SCALE_AT=sa, HAS_GS=tw.global_scale is not None, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, PAIRS=pairs, W_NK=tw.nk, X_GROUP=x_group, TAIL_HALF=tail_half, num_warps=num_warps,
        num_stages=num_stages, **slot_consts,
        **tw.fmt,
    )
    # fmt: on
    return y
