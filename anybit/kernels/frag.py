"""2-, 4- and 8-bit weights (integer, e2m1) in the MMA's own register order: the fast path for A16 at
small M (and W4A8 opt-in). The packing is `anybit.kernels.frag_layout`, the decoders
`anybit.kernels.frag_decode`; here the block dots, the main loop (`frag_range`, shared with the
grouped MoE kernel), the kernels and their launchers.

Layout (4 bits; `pack_frag`): int32 [N, K_pad/8], K padded to 128; in
each 128-K block of a row the 16 words are numbered w = 4t + c, and code k = e + 2t + 8j + 32c sits
in word 4t + c at nibble j + 4e. A thread of the Hopper wgmma that holds row n and k columns
2t, 2t+1 (+8, +16, ...) as its A fragment loads its four words as one 16-byte vector, and
``(word >> 4j) & 0x000F000F | MAGIC`` turns two codes into the bf16/fp16 pair MAGIC + code that
the fragment wants, in place: no shared-memory staging, no layout conversion.

The products are computed transposed ("swap AB"): acc[BN, BM] = W[BN, K] @ x^T[K, BM], so weight
rows fill the MMA's 64-row M side and the few tokens its N side (>= 16). The loaded [BN, 16] word
tile has rows spread as (register, warp, lane/4); the MMA's A operand as (register, warp, register,
lane/4); `rows_to_mma` renames rows so both agree (a relabel, no data moves), and `rows_from_mma`
renames the accumulator's rows back before the epilogue.

Integer codes are stored biased (sign bit flipped, `triton_layout.stored_codes`): MAGIC + code minus
(MAGIC + bias + integer zero point) is the exact integer weight, and the dot of each 128-K block is
scaled by its group's scale in fp32 (exact; the MMA result is consumed at once, so no wgmma stays
in flight while the next block's weight registers are written).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from anybit import settings
from anybit.formats.dtypes import IntType
from anybit.formats.scheme import ScaleKind, ZeroPoint
from anybit.kernels.dequant import cdiv, decode_scale, load_scale
from anybit.kernels.frag_decode import (
    minus_rows,
    rows_from_mma,
    rows_to_mma,
    times_groups,
    unpack_a8,
    unpack_bytes,
    unpack_e2m1,
    unpack_e2m1_a8,
    unpack_pairs,
    unpack_pairs2,
    unpack_pairs_minus,
    unpack_pairs_minus_rows,
)
from anybit.kernels.frag_layout import FRAG_PANEL, frag_block_k, frag_mask
from anybit.kernels.launch import Launcher
from anybit.kernels.splitk import store_or_reduce


# fmt: off
@triton.jit
def block_meta(ptr, kt, n_groups, offs_gn, mask_n, stride_s, GROUP_K: tl.constexpr, G: tl.constexpr,
               NW: tl.constexpr, KB: tl.constexpr = 128):
    """The stored (undecoded) per-group values (scales or zero points) of K block kt: [BN, G], G groups
    per block (1 when groups are whole blocks). The load reads up to 3 G following groups too, until
    every thread's share is 4 bytes: a narrower load cannot take the asynchronous copy by which the
    pipeliner fetches it stages ahead (as the weight and x tiles), and waiting for it in the block
    that uses it stalled every block on a global-memory round trip."""
    BN: tl.constexpr = offs_gn.shape[0]
    LG: tl.constexpr = min(max(G, 128 * NW // (BN * ptr.dtype.element_ty.primitive_bitwidth // 8)), 4 * G)
    g = (kt * KB) // GROUP_K + tl.arange(0, LG)
    t = tl.load(ptr + g[None, :] * stride_s + offs_gn[:, None], mask=mask_n[:, None] & (g < n_groups)[None, :],
                other=0)
    if LG > G:  # keep the first G groups: split off halves (register renaming only)
        t = tl.permute(tl.reshape(t, (BN, 2, LG // G // 2, G)), (0, 3, 2, 1))
        t, _ = tl.split(t)
        if LG // G > 2:
            t, _ = tl.split(t)
    return tl.reshape(t, (BN, G))


@triton.jit
def block_sums(ptr, kt, n_blocks, src, mask_m, stride, NW: tl.constexpr):
    """The quantizer's per-token sums of K block kt (`quantize_act(block_sums=True)`: fp32 [blocks,
    tokens]) for the tile's tokens src [BM]. Like `block_meta`, the load reads following blocks too (those
    that exist, < n_blocks), until every thread's share is 4 bytes (so the pipeliner fetches it stages
    ahead), and keeps the first."""
    BM: tl.constexpr = src.shape[0]
    LG: tl.constexpr = max(1, min(8, 128 * NW // (BM * 4)))
    blk = kt + tl.arange(0, LG)
    t = tl.load(ptr + blk[None, :] * stride + src[:, None], mask=mask_m[:, None] & (blk < n_blocks)[None, :],
                other=0.0)
    if LG >= 2:
        t, _ = tl.split(tl.permute(tl.reshape(t, (BM, 2, LG // 2)), (0, 2, 1)))
    if LG >= 4:
        t, _ = tl.split(tl.permute(tl.reshape(t, (BM, 2, LG // 4)), (0, 2, 1)))
    if LG >= 8:
        t, _ = tl.split(tl.permute(tl.reshape(t, (BM, 2, 1)), (0, 2, 1)))
    return tl.reshape(t, (BM,))


@triton.jit
def frag_row_words(offs_n, stride_wn, PANEL: tl.constexpr):
    """Word offset of the first block of each weight row in panels of PANEL rows (`to_panels`: block kt
    of the panel's rows, then kt + 1; stride_wn: the words of one row)."""
    n = offs_n.to(tl.int64)
    return (n // PANEL) * (PANEL * stride_wn) + (n % PANEL) * 16


@triton.jit
def frag3_words(lo, hi, kt):
    """4-bit block kt's words (codes 0-7) from its low and high units of the 3-bit layout (`pack_frag3`)."""
    return ((lo >> (2 * (kt % 2))) & 0x33333333) | (((hi >> (kt % 4)) & 0x11111111) << 2)


@triton.jit
def frag3_units(w_ptrs, kt, K, mask_n, PANEL: tl.constexpr):
    """Block kt's low and high units of the 3-bit layout (`pack_frag3`: 2 * ceil(K / 512) low units a row, then the
    high ones; w_ptrs: each row's first unit, 16 words): two [BN, 16] loads."""
    WSTEP: tl.constexpr = 16 * PANEL
    lo = tl.load(w_ptrs + (kt // 2) * WSTEP, mask=mask_n[:, None], other=0)
    hi = tl.load(w_ptrs + (2 * tl.cdiv(K, 512) + kt // 4) * WSTEP, mask=mask_n[:, None], other=0)
    return lo, hi


@triton.jit
def frag_decode16(p, s_raw, zo, off, MASK, W_FLOAT: tl.constexpr, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr,
                  S_MAN: tl.constexpr, ZP: tl.constexpr, GROUP_K: tl.constexpr, BN: tl.constexpr, NW: tl.constexpr,
                  PTX: tl.constexpr, FOLD: tl.constexpr, W_SIGNED: tl.constexpr, dtype: tl.constexpr):
    """One 128-K block of 4-bit codes `p` ([BN, 16] words in MMA row order) decoded to x's dtype (bf16/fp16) [BN,
    128]: e2m1 with groups shorter than the block scaled in registers (exact), integers less their zero points `zo`
    ([BN] in x's dtype, ZP) or the code bias `off`."""
    if W_FLOAT:
        w = unpack_e2m1(p, BN, MASK, dtype, FOLD)
        if GROUP_K < 128:
            G: tl.constexpr = 128 // GROUP_K
            if FOLD == 2:  # scale * 2**118 (fp16 2**6) from its bits (`scale_bits_exact`): e4m3, else ue8m0
                c = s_raw.to(tl.int32)
                if SCALE_KIND == 1:
                    b = c * 16 + 0x7700 if dtype == tl.bfloat16 else c * 128 + 0x3800
                else:  # exponent code e: bf16 field e + 118, fp16 e - 106 (the fold keeps 2**-15 <= scale < 2**9)
                    b = c * 128 + 0x3B00 if dtype == tl.bfloat16 else c * 1024 - 0x1A800
                w = times_groups(w, rows_to_mma(b, BN, NW, G).to(tl.int16).to(dtype, bitcast=True), G, PTX)
            elif FOLD and dtype == tl.bfloat16:  # the codes' rebias rides on the scales (`frag_fold`)
                s = rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN, 118), BN, NW, G).to(dtype)
                w = times_groups(w, s, G, PTX)
            elif FOLD:
                s = rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN, 6), BN, NW, G).to(dtype)
                w = times_groups(w, s, G, PTX)
            else:
                s = rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN), BN, NW, G).to(dtype)
                w = tl.reshape(tl.reshape(w, (BN, G, GROUP_K)) * s[:, :, None], (BN, 128))
    elif ZP != 0:
        # (integer-domain variants of this moved the tile through shared memory, see docs/ARCHITECTURE.md)
        if PTX >= 2:
            w = unpack_pairs_minus_rows(p, zo, BN, dtype)
        else:
            w = minus_rows(unpack_pairs(p, BN, MASK, dtype), zo, PTX)
    elif PTX >= 2:
        w = unpack_pairs_minus(p, BN, dtype, W_SIGNED)
    else:
        w = unpack_pairs(p, BN, MASK, dtype) - off.to(dtype)
    return w


@triton.jit
def rescaled(acc, ratio, bias, xsum, ZP: tl.constexpr):
    """An in-place accumulator of integer codes under FP8 x (`frag_rescale`) made ready for the next K block's MMA:
    from units of 512 x the last block's scale to the next one's (times `ratio` [BN]; None: no group scales), less
    the codes' offset (`bias`: a number, or [BN] with zero points) times the block's x sums [BM] / 512 — the MMA adds
    sum_k (q_k 2**-9) x_k to it."""
    if ZP != 0:  # (bias [BN]: two operations an element)
        if ratio is not None:
            acc = acc * ratio[:, None]
        acc = acc - bias[:, None] * (xsum * 0.001953125)[None, :]
    else:
        c = (-bias * 0.001953125) * xsum  # [BM]
        if ratio is not None:
            acc = tl.fma(acc, ratio[:, None], c[None, :])
        else:
            acc = acc + c[None, :]
    return acc


@triton.jit
def block_ratio(s_raw, s_prev, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr, BN: tl.constexpr,
                NW: tl.constexpr, PTX: tl.constexpr):
    """(the last block's scales over this block's, this block's scales) [BN] in MMA row order, for `rescaled`: the
    reciprocal approximate (MUFU.RCP, 1 ulp; the weight's scales are positive and normal, `rescalable`). Rows past N
    read scale 0, taken as 2**-100: their ratios stay finite and their products come out ~0 after the loop."""
    s = tl.reshape(rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN), BN, NW, 1), (BN,))
    s = tl.maximum(s, 7.888609052210118e-31)
    if PTX >= 1:
        r = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [s], dtype=tl.float32, is_pure=True,
                                      pack=1)  # fmt: skip
    else:
        r = 1.0 / s
    return s_prev * r, s


@triton.jit
def frag_block_dot(w_ptrs, x_ptrs, s_raw, z_raw, kt, mask_n, x_mask, MASK, off, W_FLOAT: tl.constexpr,
                   SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr, ZP: tl.constexpr,
                   GROUP_K: tl.constexpr, PER_BLOCK: tl.constexpr, BN: tl.constexpr, NW: tl.constexpr,
                   PTX: tl.constexpr, FOLD: tl.constexpr = 0, W_SIGNED: tl.constexpr = True, xsum=None,
                   acc=None, SCALE_W: tl.constexpr = False, MMA_ACC: tl.constexpr = False, words=None,
                   W3: tl.constexpr = False, ratio=None):
    """acc plus one 128-K block: the dot of the decoded weight rows [BN, 128] (MMA row order) with x^T
    [128, BM], scaled by the block's group scales (`s_raw`, from `block_meta`) when PER_BLOCK (else
    unscaled). Float codes with groups shorter than the block get their scales in registers (exact:
    e2m1 times an e4m3 or power-of-two scale fits bf16/fp16), like the bit-plane kernel's per-element
    scaling. FP8 x: `xsum` [BM], the block's sums of x from the quantizer (`block_sums`), else the x
    tile's own; e2m1 weights under FP8 x (`unpack_e2m1_a8`): `s_raw` holds the groups' codes relative to
    their row's largest, whose power of two the caller applies after the K loop. SCALE_W (PER_BLOCK,
    bf16/fp16 x): the block's scales multiply the decoded rows instead (each weight rounded once to x's
    dtype, as the dequantize-then-GEMM path does), so every block's MMA accumulates into acc: no wait on
    the MMA and no fp32 multiply-add per block (large-M tiles). MMA_ACC (e2m1 under FP8 x, `frag_mma_acc`): the
    block's FP8 MMA accumulates into acc itself — no fresh tile added in fp32 — as the whole K needs no scale
    between blocks; integer codes under FP8 x with MMA_ACC (`frag_rescale`): acc counts in units of 512 times the
    block's scale — rescaled first by `ratio` [BN] (the last block's scale over this one's; None: no group scales), less
    the codes' offset times the block's x sums, then the MMA accumulates into it. words: the block's words already
    loaded (else read at w_ptrs); W3: 3-bit codes rebuilt as 4-bit words (`frag3_words`), whose signed ones take the
    unpacked decode (the packed one's offset is the 4-bit bias)."""
    dtype: tl.constexpr = x_ptrs.dtype.element_ty
    xt = tl.load(x_ptrs + kt * 128, mask=x_mask, other=0.0)
    if words is None:
        words = tl.load(w_ptrs, mask=mask_n[:, None], other=0)
    ptx: tl.constexpr = min(PTX, 1) if W3 and W_SIGNED else PTX
    p = rows_to_mma(words, BN, NW, 16)
    if ZP != 0:
        zo = tl.reshape(rows_to_mma(z_raw.to(tl.float32) + off, BN, NW, 1), (BN,))
    if dtype == tl.float8e4nv and W_FLOAT:  # e2m1 times 2**(r + 6) a group by its table (row scales after the loop)
        w8 = unpack_e2m1_a8(p, rows_to_mma(s_raw, BN, NW, 128 // GROUP_K), BN, PTX)
        if MMA_ACC:
            acc = tl.dot(w8, xt, acc)
        else:
            part = tl.dot(w8, xt)
    elif dtype == tl.float8e4nv:
        # sum_k (q_k 2**-9) x_k by the FP8 MMA; q - bias - z = the weight: subtract (bias + z) * sum_k x_k
        if xsum is None:  # no sums from the quantizer: the x tile's own (shuffles and a shared-memory trip)
            xsum = tl.sum(xt.to(tl.float32), axis=0)
        if MMA_ACC:  # in place, in units of 512 x the block's scale (`frag_rescale`)
            acc = rescaled(acc, ratio, zo if ZP != 0 else off, xsum, ZP)
            acc = tl.dot(unpack_a8(p, BN, MASK), xt, acc)
        else:
            part = tl.dot(unpack_a8(p, BN, MASK), xt) * 512.0
            if ZP != 0:
                part = part - zo[:, None] * xsum[None, :]
            else:
                part = part - off * xsum[None, :]
    else:
        w = frag_decode16(p, s_raw, zo.to(dtype) if ZP != 0 else None, off, MASK, W_FLOAT, SCALE_KIND, S_EXP, S_MAN,
                          ZP, GROUP_K, BN, NW, ptx, FOLD, W_SIGNED, dtype)
    if SCALE_W:
        s = rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN), BN, NW, 1).to(dtype)
        acc = tl.dot(times_groups(w, s, 1, PTX), xt, acc)
    elif not MMA_ACC:
        if dtype != tl.float8e4nv:
            part = tl.dot(w, xt)
        if PER_BLOCK:
            s = tl.reshape(rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN), BN, NW, 1), (BN,))
            part = part * s[:, None]
        acc = acc + part
    return acc


@triton.jit
def quarters(t, G: tl.constexpr):
    """[BN, G] per-group values of a 256-K block (G = 1, 2 or 4 groups) -> the value of each of its four
    64-K quarters, four [BN] tensors (register renaming only)."""
    if G == 1:
        c0 = tl.reshape(t, (t.shape[0],))
        c1 = c0
        c2 = c0
        c3 = c0
    elif G == 2:
        c0, c2 = tl.split(t)
        c1 = c0
        c3 = c2
    else:
        even, odd = tl.split(tl.reshape(t, (t.shape[0], 2, 2)))  # columns (0, 2) and (1, 3)
        c0, c2 = tl.split(even)
        c1, c3 = tl.split(odd)
    return c0, c1, c2, c3


@triton.jit
def frag_quarter_dots(w_ptrs, x_ptrs, s_raw, z_raw, kt, mask_n, mask_m, offs_k, K, MASK, off,
                      SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr, ZP: tl.constexpr,
                      GROUP_K: tl.constexpr, PER_BLOCK: tl.constexpr, BN: tl.constexpr, NW: tl.constexpr,
                      PTX: tl.constexpr):
    """One 256-K block of 2-bit codes: its 16 words per row are one 16-byte load per thread, as for 4
    bits, and word 4t + q holds thread t's share of the 64-K quarter q. All four quarters are decoded,
    then multiplied with their x^T [64, BM]; groups shorter than the block scale (and shift by their
    zero point) their quarters, in fp32 after the dots (exact)."""
    dtype: tl.constexpr = x_ptrs.dtype.element_ty
    G: tl.constexpr = 256 // GROUP_K if GROUP_K < 256 else 1
    p = rows_to_mma(tl.load(w_ptrs, mask=mask_n[:, None], other=0), BN, NW, 16)
    ql0, ql1 = tl.split(tl.reshape(p, (BN, 4, 2, 2)))  # word 4t + 2a + b: b
    p0, p2 = tl.split(ql0)
    p1, p3 = tl.split(ql1)
    if ZP != 0:
        z0, z1, z2, z3 = quarters(rows_to_mma(z_raw.to(tl.float32) + off, BN, NW, G).to(dtype), G)
        w0 = minus_rows(unpack_pairs2(p0, BN, MASK, dtype), z0, PTX)
        w1 = minus_rows(unpack_pairs2(p1, BN, MASK, dtype), z1, PTX)
        w2 = minus_rows(unpack_pairs2(p2, BN, MASK, dtype), z2, PTX)
        w3 = minus_rows(unpack_pairs2(p3, BN, MASK, dtype), z3, PTX)
    else:
        w0 = unpack_pairs2(p0, BN, MASK, dtype) - off.to(dtype)
        w1 = unpack_pairs2(p1, BN, MASK, dtype) - off.to(dtype)
        w2 = unpack_pairs2(p2, BN, MASK, dtype) - off.to(dtype)
        w3 = unpack_pairs2(p3, BN, MASK, dtype) - off.to(dtype)
    base = kt * 256 + offs_k
    x0 = tl.load(x_ptrs + kt * 256, mask=mask_m[None, :] & (base < K)[:, None], other=0.0)
    x1 = tl.load(x_ptrs + kt * 256 + 64, mask=mask_m[None, :] & (base + 64 < K)[:, None], other=0.0)
    x2 = tl.load(x_ptrs + kt * 256 + 128, mask=mask_m[None, :] & (base + 128 < K)[:, None], other=0.0)
    x3 = tl.load(x_ptrs + kt * 256 + 192, mask=mask_m[None, :] & (base + 192 < K)[:, None], other=0.0)
    d0 = tl.dot(w0, x0)
    d1 = tl.dot(w1, x1)
    d2 = tl.dot(w2, x2)
    d3 = tl.dot(w3, x3)
    if G == 1:
        part = d0 + d1 + d2 + d3
        if PER_BLOCK:
            s = tl.reshape(rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN), BN, NW, 1), (BN,))
            part = part * s[:, None]
    else:
        s0, s1, s2, s3 = quarters(rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN), BN, NW, G), G)
        part = d0 * s0[:, None] + d1 * s1[:, None] + d2 * s2[:, None] + d3 * s3[:, None]
    return part


@triton.jit
def settled(acc):
    """acc, once the wgmma writing it have finished: an identity the MMA pipeliner cannot see through, so it
    waits for every wgmma (pendings=0) before it. Without it Triton 3.6 leaves the block's register-operand wgmma
    in flight (WARPGROUP.DEPBAR.LE gsb0, 3-7) while the next block's decode rewrites their A registers —
    undefined behaviour, seen as runs of 8 wrong weight rows with 8-bit codes on 8/16 warps (H200)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [acc], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def frag_byte_dot(w_ptrs, x_ptrs, s_raw, z_raw, kt, mask_n, mask_m, offs_k, K, MASK, off, SCALE_KIND: tl.constexpr,
                  S_EXP: tl.constexpr, S_MAN: tl.constexpr, ZP: tl.constexpr, PER_BLOCK: tl.constexpr,
                  BN: tl.constexpr, NW: tl.constexpr, PTX: tl.constexpr, acc):
    """acc + one 64-K block of 8-bit codes ([BN, 16] words, one 16-byte load per thread as for 4 bits): the
    decoded rows [BN, 64] (`unpack_bytes`) times x^T [64, BM], scaled by the block's group scales when
    PER_BLOCK (a fresh product, then added); else the MMA accumulates into acc itself."""
    dtype: tl.constexpr = x_ptrs.dtype.element_ty
    p = rows_to_mma(tl.load(w_ptrs, mask=mask_n[:, None], other=0), BN, NW, 16)
    if ZP != 0:
        sub = tl.reshape(rows_to_mma(z_raw.to(tl.float32) + off, BN, NW, 1), (BN,))[:, None]
        w = unpack_bytes(p, BN, MASK, sub, dtype, PTX)
    else:
        w = unpack_bytes(p, BN, MASK, off, dtype, PTX)
    xt = tl.load(x_ptrs + kt * 64, mask=mask_m[None, :] & (kt * 64 + offs_k < K)[:, None], other=0.0)
    if PER_BLOCK:
        s = tl.reshape(rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN), BN, NW, 1), (BN,))
        return acc + tl.dot(w, xt) * s[:, None]
    return tl.dot(w, xt, acc)


@triton.jit
def code_offset(dtype: tl.constexpr, W_BITS: tl.constexpr, W_SIGNED: tl.constexpr):
    """What a decoded code carries beyond its value, for x of `dtype`: the magic of the decode (8-bit codes: fp32's
    2**23; pairs: bf16 128, fp16 1024; FP8 x: none, the codes reach the MMA as they are) plus the storage bias of
    signed codes, 2**(bits-1)."""
    if W_BITS == 8:
        off = 8388608.0
    elif dtype == tl.bfloat16:
        off = 128.0
    elif dtype == tl.float16:
        off = 1024.0
    else:
        off = 0.0
    if W_SIGNED:
        off += 1 << (W_BITS - 1)
    return off


@triton.jit
def frag_range(x_ptr, src, mask_m, stride_xm, w_ptr, s_ptr, z_ptr, offs_n, mask_n, K, stride_wn, stride_s,
               kt_lo, kt_hi, MASK, W_BITS: tl.constexpr, W_FLOAT: tl.constexpr, SCALE_KIND: tl.constexpr,
               S_EXP: tl.constexpr, S_MAN: tl.constexpr, ZP: tl.constexpr, W_SIGNED: tl.constexpr,
               GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, NW: tl.constexpr,
               STAGES: tl.constexpr, PANEL: tl.constexpr, PTX: tl.constexpr, FOLD: tl.constexpr = False,
               xsum_ptr=None, stride_xsum=0, SCALE_W: tl.constexpr = False, SETTLE: tl.constexpr = False,
               PAIRS: tl.constexpr = False, MMA_ACC: tl.constexpr = False):
    """sum over the K blocks [kt_lo, kt_hi) of W[offs_n] . x[src]^T, fp32 [BN, BM] in natural row order,
    group scales applied (per-channel/tensor scales are the caller's: PER_BLOCK only when groups are
    shorter than K; SCALE_W: to the decoded 4-bit weights, `frag_block_dot`).

    The block's scales and zero points are pipelined like its weight and x tiles (`block_meta`), and so
    are the quantizer's per-block sums of FP8 x (`xsum_ptr`: [blocks, tokens], `block_sums`) when given.
    PAIRS (4-bit, no zero points or sums, `frag_pairs`): two blocks an iteration, the second's x masked past
    kt_hi (it adds zero there), in the same order of accumulation. MMA_ACC: e2m1 blocks under FP8 x accumulate
    in the MMA (`frag_mma_acc`), integer ones too in units of the block's scale (`frag_rescale`: times 512 and the
    last block's scales after the loop)."""
    off = code_offset(x_ptr.dtype.element_ty, W_BITS, W_SIGNED)
    KB: tl.constexpr = 128 if W_BITS == 3 else 512 // W_BITS  # K per block: 16 words per row (3 bits: 12)
    PER_BLOCK: tl.constexpr = KB <= GROUP_K and GROUP_K < 1 << 30
    HAS_S: tl.constexpr = GROUP_K < 1 << 30  # else one scale over all of K: the caller's epilogue
    G: tl.constexpr = KB // GROUP_K if GROUP_K < KB else 1
    KX: tl.constexpr = 64 if W_BITS == 2 or W_BITS == 8 else 128  # x rows per dot (2-bit blocks: four quarters)
    offs_k = tl.arange(0, KX)
    x_ptrs = x_ptr + src[None, :].to(tl.int64) * stride_xm + offs_k[:, None]
    w_ptrs = w_ptr + frag_row_words(offs_n, stride_wn, PANEL)[:, None] + tl.arange(0, 16)[None, :]
    WSTEP: tl.constexpr = 16 * PANEL  # words from one block of a row to the next
    offs_gn = offs_n // GROUP_N
    n_groups = tl.cdiv(K, GROUP_K)
    unused = tl.zeros((BN, G), dtype=tl.int8)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    STEP: tl.constexpr = 2 if PAIRS else 1
    # integer codes under FP8 x accumulating in the MMA (`frag_rescale`): acc in units of 512 x the block's scale
    RESCALE: tl.constexpr = MMA_ACC and not W_FLOAT and x_ptr.dtype.element_ty == tl.float8e4nv
    tl.static_assert(not (RESCALE and PAIRS), "rescaled blocks run one an iteration")
    s_prev = tl.full((BN,), 1.0, tl.float32)  # (acc is 0 at the first block: any finite ratio)
    for kt in tl.range(kt_lo, kt_hi, STEP, num_stages=STAGES):
        wb = w_ptrs + kt * WSTEP  # the block's words
        if HAS_S:
            s_raw = block_meta(s_ptr, kt, n_groups, offs_gn, mask_n, stride_s, GROUP_K, G, NW, KB)
        else:
            s_raw = unused
        ratio = None
        if RESCALE and PER_BLOCK:
            ratio, s_prev = block_ratio(s_raw, s_prev, SCALE_KIND, S_EXP, S_MAN, BN, NW, PTX)
        if ZP != 0:
            z_raw = block_meta(z_ptr, kt, n_groups, offs_gn, mask_n, stride_s, GROUP_K, G, NW, KB)
        else:
            z_raw = unused
        if W_BITS == 8:
            acc = frag_byte_dot(wb, x_ptrs, s_raw, z_raw, kt, mask_n, mask_m, offs_k, K, MASK, off, SCALE_KIND,
                                S_EXP, S_MAN, ZP, PER_BLOCK, BN, NW, PTX, acc)
        elif W_BITS == 2:
            acc += frag_quarter_dots(wb, x_ptrs, s_raw, z_raw, kt, mask_n, mask_m, offs_k, K, MASK, off,
                                     SCALE_KIND, S_EXP, S_MAN, ZP, GROUP_K, PER_BLOCK, BN, NW, PTX)
        else:
            x_mask = mask_m[None, :] & (kt * 128 + offs_k < K)[:, None]
            if xsum_ptr is not None:
                xsum = block_sums(xsum_ptr, kt, tl.cdiv(K, 128), src, mask_m, stride_xsum, NW)
            else:
                xsum = None
            if W_BITS == 3:  # block kt's words from its low and high units (`pack_frag3`; PAIRS: kt even, one
                # load of each for both blocks)
                lo_w, hi_w = frag3_units(w_ptrs, kt, K, mask_n, PANEL)
                words = frag3_words(lo_w, hi_w, kt)
            else:
                words = None
            acc = frag_block_dot(wb, x_ptrs, s_raw, z_raw, kt, mask_n, x_mask, MASK, off, W_FLOAT, SCALE_KIND,
                                 S_EXP, S_MAN, ZP, GROUP_K, PER_BLOCK, BN, NW, PTX, FOLD, W_SIGNED, xsum, acc,
                                 SCALE_W and PER_BLOCK, MMA_ACC, words, W_BITS == 3, ratio)
            if PAIRS:  # the next block in the same iteration (x masked past this split's range: it adds zero)
                if SETTLE:
                    acc = settled(acc)
                k2 = kt + 1
                if HAS_S:
                    s2 = block_meta(s_ptr, k2, n_groups, offs_gn, mask_n, stride_s, GROUP_K, G, NW, KB)
                else:
                    s2 = unused
                if ZP != 0:  # (3-bit codes only: `frag_pairs`)
                    z2 = block_meta(z_ptr, k2, n_groups, offs_gn, mask_n, stride_s, GROUP_K, G, NW, KB)
                else:
                    z2 = unused
                x_mask2 = mask_m[None, :] & (k2 * 128 + offs_k < tl.minimum(K, kt_hi * 128))[:, None]
                words2 = frag3_words(lo_w, hi_w, k2) if W_BITS == 3 else None
                acc = frag_block_dot(w_ptrs + k2 * WSTEP, x_ptrs, s2, z2, k2, mask_n, x_mask2, MASK, off,
                                     W_FLOAT, SCALE_KIND, S_EXP, S_MAN, ZP, GROUP_K, PER_BLOCK, BN, NW, PTX, FOLD,
                                     W_SIGNED, None, acc, SCALE_W and PER_BLOCK, MMA_ACC, words2, W_BITS == 3)
        if SETTLE:  # the block's wgmma finish before the next block's decode writes their register operand
            acc = settled(acc)
    if FOLD:
        acc = acc * 256.0  # 2**(126 - 118), fp16 2**(14 - 6): the rest of the e2m1 rebias (`frag_fold`)
    if RESCALE:
        acc = acc * (512.0 * s_prev)[:, None] if PER_BLOCK else acc * 512.0
    return rows_from_mma(acc, BN, NW, BM)


@triton.jit
def frag_range_subs(x_ptr, offs_m, M, stride_xm, w_ptr, s_ptr, offs_n, mask_n, K, stride_wn, stride_s, kt_lo, kt_hi,
                    GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                    NW: tl.constexpr, STAGES: tl.constexpr, PANEL: tl.constexpr, PTX: tl.constexpr,
                    SETTLE: tl.constexpr):
    """`frag_range` for three BM-token tiles at once (tokens offs_m, + BM, + 2 BM) of e2m1 weights under FP8 x
    accumulating in the MMA (`frag_mma_acc`): each K block's weight rows decoded once, three FP8 MMAs into three
    accumulators — a 3 * BM-token tile where Triton's tiles are powers of two (`FRAG_SUBS`). Natural row order."""
    G: tl.constexpr = 128 // GROUP_K
    offs_k = tl.arange(0, 128)
    x0 = x_ptr + offs_m[None, :].to(tl.int64) * stride_xm + offs_k[:, None]
    x1 = x0 + BM * stride_xm
    x2 = x1 + BM * stride_xm
    m0 = (offs_m < M)[None, :]
    m1 = (offs_m + BM < M)[None, :]
    m2 = (offs_m + 2 * BM < M)[None, :]
    w_ptrs = w_ptr + frag_row_words(offs_n, stride_wn, PANEL)[:, None] + tl.arange(0, 16)[None, :]
    offs_gn = offs_n // GROUP_N
    n_groups = tl.cdiv(K, GROUP_K)
    a0 = tl.zeros((BN, BM), dtype=tl.float32)
    a1 = tl.zeros((BN, BM), dtype=tl.float32)
    a2 = tl.zeros((BN, BM), dtype=tl.float32)
    for kt in tl.range(kt_lo, kt_hi, num_stages=STAGES):
        s_raw = block_meta(s_ptr, kt, n_groups, offs_gn, mask_n, stride_s, GROUP_K, G, NW, 128)
        p = rows_to_mma(tl.load(w_ptrs + kt * (16 * PANEL), mask=mask_n[:, None], other=0), BN, NW, 16)
        w8 = unpack_e2m1_a8(p, rows_to_mma(s_raw, BN, NW, G), BN, PTX)
        k_in = (kt * 128 + offs_k < K)[:, None]
        a0 = tl.dot(w8, tl.load(x0 + kt * 128, mask=m0 & k_in, other=0.0), a0)
        a1 = tl.dot(w8, tl.load(x1 + kt * 128, mask=m1 & k_in, other=0.0), a1)
        a2 = tl.dot(w8, tl.load(x2 + kt * 128, mask=m2 & k_in, other=0.0), a2)
        if SETTLE:  # the block's wgmma finish before the next block's decode writes their register operand
            a0 = settled(a0)
            a1 = settled(a1)
            a2 = settled(a2)
    return rows_from_mma(a0, BN, NW, BM), rows_from_mma(a1, BN, NW, BM), rows_from_mma(a2, BN, NW, BM)


@triton.jit
def frag_range_two(x_ptr, src, mask_m, src2, mask_m2, stride_xm, w_ptr, s_ptr, z_ptr, offs_n, mask_n, K, stride_wn,
                   stride_s, kt_lo, kt_hi, MASK, W_FLOAT: tl.constexpr, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr,
                   S_MAN: tl.constexpr, ZP: tl.constexpr, W_SIGNED: tl.constexpr, GROUP_K: tl.constexpr,
                   GROUP_N: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BM2: tl.constexpr, NW: tl.constexpr,
                   STAGES: tl.constexpr, PANEL: tl.constexpr, PTX: tl.constexpr, FOLD: tl.constexpr,
                   SETTLE: tl.constexpr, SCALE_W: tl.constexpr = False, MMA_ACC: tl.constexpr = False,
                   xsum_ptr=None, stride_xsum=0):
    """`frag_range` for two token tiles at once, x rows src [BM] and src2 [BM2] (masked rows read 0), of 4-bit codes
    (`FRAG_TWO`: 48 = 32 + 16 tokens where Triton's tiles are powers of two; the grouped MoE kernel's blocks of such
    sizes): each K block's weight rows decoded once, two MMAs into two accumulators. bf16/fp16 x (`frag_decode16`;
    SCALE_W, group scales per whole block, `frag_scale_w`: the scales multiply the decoded weights and both MMAs
    accumulate in place, no fresh product per block); e4m3 x on the FP8 MMA as `frag_block_dot` takes it (integer
    codes less (bias + zero point) times the quantizer's block sums `xsum_ptr`, or each x tile's own; e2m1 by its
    row-relative table, MMA_ACC accumulating in the MMA, the rows' powers of two the caller's; integer codes with
    MMA_ACC in units of the block's scale, `frag_rescale`). Natural row order."""
    dtype: tl.constexpr = x_ptr.dtype.element_ty
    off = code_offset(dtype, 4, W_SIGNED)
    PER_BLOCK: tl.constexpr = 128 <= GROUP_K and GROUP_K < 1 << 30
    HAS_S: tl.constexpr = GROUP_K < 1 << 30  # else one scale over all of K: the epilogue's
    G: tl.constexpr = 128 // GROUP_K if GROUP_K < 128 else 1
    offs_k = tl.arange(0, 128)
    x1 = x_ptr + src[None, :].to(tl.int64) * stride_xm + offs_k[:, None]
    x2 = x_ptr + src2[None, :].to(tl.int64) * stride_xm + offs_k[:, None]
    m1 = mask_m[None, :]
    m2 = mask_m2[None, :]
    w_ptrs = w_ptr + frag_row_words(offs_n, stride_wn, PANEL)[:, None] + tl.arange(0, 16)[None, :]
    offs_gn = offs_n // GROUP_N
    n_groups = tl.cdiv(K, GROUP_K)
    unused = tl.zeros((BN, G), dtype=tl.int8)
    a1 = tl.zeros((BN, BM), dtype=tl.float32)
    a2 = tl.zeros((BN, BM2), dtype=tl.float32)
    fp8: tl.constexpr = dtype == tl.float8e4nv
    # whether each block makes fresh products added in fp32 (else the MMAs accumulate in place)
    FRESH: tl.constexpr = not ((fp8 and MMA_ACC) or (not fp8 and SCALE_W and PER_BLOCK))
    RESCALE: tl.constexpr = fp8 and MMA_ACC and not W_FLOAT  # integer codes in units of the block's scale
    s_prev = tl.full((BN,), 1.0, tl.float32)
    for kt in tl.range(kt_lo, kt_hi, num_stages=STAGES):
        if HAS_S:
            s_raw = block_meta(s_ptr, kt, n_groups, offs_gn, mask_n, stride_s, GROUP_K, G, NW, 128)
        else:
            s_raw = unused
        ratio = None
        if RESCALE and PER_BLOCK:
            ratio, s_prev = block_ratio(s_raw, s_prev, SCALE_KIND, S_EXP, S_MAN, BN, NW, PTX)
        if ZP != 0:
            z_raw = block_meta(z_ptr, kt, n_groups, offs_gn, mask_n, stride_s, GROUP_K, G, NW, 128)
            zo = tl.reshape(rows_to_mma(z_raw.to(tl.float32) + off, BN, NW, 1), (BN,))
        else:
            zo = None
        k_in = (kt * 128 + offs_k < K)[:, None]
        xt1 = tl.load(x1 + kt * 128, mask=m1 & k_in, other=0.0)
        xt2 = tl.load(x2 + kt * 128, mask=m2 & k_in, other=0.0)
        p = rows_to_mma(tl.load(w_ptrs + kt * (16 * PANEL), mask=mask_n[:, None], other=0), BN, NW, 16)
        if dtype == tl.float8e4nv and W_FLOAT:  # e2m1 times 2**(r + 6) a group by its table
            w8 = unpack_e2m1_a8(p, rows_to_mma(s_raw, BN, NW, G), BN, PTX)
            if MMA_ACC:
                a1 = tl.dot(w8, xt1, a1)
                a2 = tl.dot(w8, xt2, a2)
            else:
                p1 = tl.dot(w8, xt1)
                p2 = tl.dot(w8, xt2)
        elif dtype == tl.float8e4nv:  # sum_k (q_k 2**-9) x_k less (bias + z) * sum_k x_k, as `frag_block_dot`
            wa8 = unpack_a8(p, BN, MASK)
            if xsum_ptr is not None:
                xs1 = block_sums(xsum_ptr, kt, tl.cdiv(K, 128), src, mask_m, stride_xsum, NW)
                xs2 = block_sums(xsum_ptr, kt, tl.cdiv(K, 128), src2, mask_m2, stride_xsum, NW)
            else:
                xs1 = tl.sum(xt1.to(tl.float32), axis=0)
                xs2 = tl.sum(xt2.to(tl.float32), axis=0)
            if RESCALE:
                a1 = tl.dot(wa8, xt1, rescaled(a1, ratio, zo if ZP != 0 else off, xs1, ZP))
                a2 = tl.dot(wa8, xt2, rescaled(a2, ratio, zo if ZP != 0 else off, xs2, ZP))
            else:
                bias = zo[:, None] if ZP != 0 else off
                p1 = tl.dot(wa8, xt1) * 512.0 - bias * xs1[None, :]
                p2 = tl.dot(wa8, xt2) * 512.0 - bias * xs2[None, :]
        else:
            w = frag_decode16(p, s_raw, zo.to(dtype) if ZP != 0 else None, off, MASK, W_FLOAT, SCALE_KIND, S_EXP,
                              S_MAN, ZP, GROUP_K, BN, NW, PTX, FOLD, W_SIGNED, dtype)
            if SCALE_W and PER_BLOCK:
                w = times_groups(w, rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN), BN, NW, 1).to(dtype), 1,
                                 PTX)  # fmt: skip
                a1 = tl.dot(w, xt1, a1)
                a2 = tl.dot(w, xt2, a2)
            else:
                p1 = tl.dot(w, xt1)
                p2 = tl.dot(w, xt2)
        if FRESH:  # the block's own products, its group scales applied (as `frag_block_dot`), added in fp32
            if PER_BLOCK:
                s = tl.reshape(rows_to_mma(decode_scale(s_raw, SCALE_KIND, S_EXP, S_MAN), BN, NW, 1), (BN,))
                p1 = p1 * s[:, None]
                p2 = p2 * s[:, None]
            a1 += p1
            a2 += p2
        if SETTLE:  # the block's wgmma finish before the next block's decode writes their register operand
            a1 = settled(a1)
            a2 = settled(a2)
    if FOLD:
        a1 = a1 * 256.0  # the rest of the e2m1 rebias (`frag_range`)
        a2 = a2 * 256.0
    if RESCALE:
        last = (512.0 * s_prev)[:, None] if PER_BLOCK else 512.0
        a1 = a1 * last
        a2 = a2 * last
    return rows_from_mma(a1, BN, NW, BM), rows_from_mma(a2, BN, NW, BM2)


@triton.jit
def frag_epilogue(acc, offs_m, offs_n, mask_n, M, N, s_ptr, gs_ptr, rs_ptr, xs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr,
                  stride_s, stride_xs, stride_ym, tile, pid_k, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr,
                  S_MAN: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr, HAS_GS: tl.constexpr,
                  HAS_RS: tl.constexpr, HAS_XS: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr):
    """acc [BN, BM] (weight rows offs_n x tokens offs_m) times its scales after the K loop, stored (or reduced)."""
    if GROUP_K >= 1 << 30:  # one scale over all of K
        acc = acc * load_scale(s_ptr, 0, offs_n // GROUP_N, mask_n, stride_s, SCALE_KIND, S_EXP, S_MAN)[:, None]
    if HAS_GS:
        acc = acc * tl.load(gs_ptr)
    if HAS_RS:  # fp32 [N]: each row's power of two (e2m1 under FP8 x, `unpack_e2m1_a8`)
        acc = acc * tl.load(rs_ptr + offs_n, mask=mask_n, other=0.0)[:, None]
    if HAS_XS:  # per-token scales of the FP8 activations (as e4m3, or their codes in x's dtype)
        acc = acc * tl.load(xs_ptr + offs_m * stride_xs, mask=offs_m < M, other=0.0)[None, :]
    store_or_reduce(tl.trans(acc), y_ptr, ws_ptr, cnt_ptr, bias_ptr, offs_m, offs_n, M, N, stride_ym, tile, pid_k,
                    HAS_BIAS, SPLIT_K)


@triton.jit(do_not_specialize=["MASK"])
def _frag_gemm_kernel(x_ptr, xs_ptr, xsum_ptr, w_ptr, s_ptr, z_ptr, gs_ptr, rs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr,
                      M, N, K, stride_xm, stride_xs, stride_ym, stride_wn, stride_s, MASK, W_BITS: tl.constexpr,
                      W_FLOAT: tl.constexpr, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr, S_MAN: tl.constexpr,
                      ZP: tl.constexpr, W_SIGNED: tl.constexpr, GROUP_K: tl.constexpr, GROUP_N: tl.constexpr,
                      HAS_GS: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      SPLIT_K: tl.constexpr, NW: tl.constexpr, STAGES: tl.constexpr, PANEL: tl.constexpr,
                      PTX: tl.constexpr, FOLD: tl.constexpr, PDL: tl.constexpr = False,
                      SCALE_W: tl.constexpr = False, SETTLE: tl.constexpr = False, HAS_XS: tl.constexpr = False,
                      HAS_RS: tl.constexpr = False, PAIRS: tl.constexpr = False, MMA_ACC: tl.constexpr = False,
                      SUBS: tl.constexpr = 1, BM2: tl.constexpr = 0):
    if PDL:  # launched while the quantizer may still write x: nothing is read before it has finished
        gdc_wait()
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_m = pid_m * (SUBS * BM + BM2) + tl.arange(0, BM)
    mask_n = offs_n < N
    k_blocks = tl.cdiv(K, 128 if W_BITS == 3 else 512 // W_BITS)  # (3-bit codes: 4-bit blocks, `pack_frag3`)
    per = tl.cdiv(k_blocks, SPLIT_K)
    if W_BITS == 3 and PAIRS:  # a split's pairs of blocks share their low unit
        per = 2 * tl.cdiv(per, 2)
    lo = pid_k * per
    if SUBS == 3:  # three BM-token tiles on one decode (`FRAG_SUBS`: e2m1 under FP8 x, no split)
        a0, a1, a2 = frag_range_subs(x_ptr, offs_m, M, stride_xm, w_ptr, s_ptr, offs_n, mask_n, K, stride_wn,
                                     stride_s, lo, tl.minimum(lo + per, k_blocks), GROUP_K, GROUP_N, BN, BM, NW,
                                     STAGES, PANEL, PTX, SETTLE)
        tile = pid_m * tl.num_programs(0) + pid_n
        for j in tl.static_range(3):
            acc = a0 if j == 0 else (a1 if j == 1 else a2)
            frag_epilogue(acc, offs_m + j * BM, offs_n, mask_n, M, N, s_ptr, gs_ptr, rs_ptr, xs_ptr, bias_ptr, y_ptr,
                          ws_ptr, cnt_ptr, stride_s, stride_xs, stride_ym, tile, pid_k, SCALE_KIND, S_EXP, S_MAN,
                          GROUP_K, GROUP_N, HAS_GS, HAS_RS, HAS_XS, HAS_BIAS, SPLIT_K)
    elif BM2 > 0:  # a BM + BM2-token tile on one decode (`FRAG_TWO`: 4-bit codes under bf16/fp16 x)
        offs_m2 = pid_m * (BM + BM2) + BM + tl.arange(0, BM2)
        a1, a2 = frag_range_two(x_ptr, offs_m, offs_m < M, offs_m2, offs_m2 < M, stride_xm, w_ptr, s_ptr, z_ptr,
                                offs_n, mask_n, K, stride_wn, stride_s, lo, tl.minimum(lo + per, k_blocks), MASK,
                                W_FLOAT, SCALE_KIND, S_EXP, S_MAN, ZP, W_SIGNED, GROUP_K, GROUP_N, BN, BM, BM2, NW,
                                STAGES, PANEL, PTX, FOLD, SETTLE)
        tile = 2 * (pid_m * tl.num_programs(0) + pid_n)  # a split-K counter for each of the two
        frag_epilogue(a1, offs_m, offs_n, mask_n, M, N, s_ptr, gs_ptr, rs_ptr, xs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr,
                      stride_s, stride_xs, stride_ym, tile, pid_k, SCALE_KIND, S_EXP, S_MAN, GROUP_K, GROUP_N, HAS_GS,
                      HAS_RS, HAS_XS, HAS_BIAS, SPLIT_K)
        frag_epilogue(a2, offs_m2, offs_n, mask_n, M, N, s_ptr, gs_ptr, rs_ptr, xs_ptr, bias_ptr, y_ptr, ws_ptr,
                      cnt_ptr, stride_s, stride_xs, stride_ym, tile + 1, pid_k, SCALE_KIND, S_EXP, S_MAN, GROUP_K,
                      GROUP_N, HAS_GS, HAS_RS, HAS_XS, HAS_BIAS, SPLIT_K)
    else:
        acc = frag_range(x_ptr, offs_m, offs_m < M, stride_xm, w_ptr, s_ptr, z_ptr, offs_n, mask_n, K, stride_wn,
                         stride_s, lo, tl.minimum(lo + per, k_blocks), MASK, W_BITS, W_FLOAT, SCALE_KIND, S_EXP, S_MAN,
                         ZP, W_SIGNED, GROUP_K, GROUP_N, BN, BM, NW, STAGES, PANEL, PTX, FOLD, xsum_ptr, M, SCALE_W,
                         SETTLE, PAIRS, MMA_ACC)  # sums: [blocks, M]
        tile = pid_m * tl.num_programs(0) + pid_n
        frag_epilogue(acc, offs_m, offs_n, mask_n, M, N, s_ptr, gs_ptr, rs_ptr, xs_ptr, bias_ptr, y_ptr, ws_ptr,
                      cnt_ptr, stride_s, stride_xs, stride_ym, tile, pid_k, SCALE_KIND, S_EXP, S_MAN, GROUP_K, GROUP_N,
                      HAS_GS, HAS_RS, HAS_XS, HAS_BIAS, SPLIT_K)


# fmt: on


def frag_constexprs(tw) -> dict:
    """The weight-format constexprs every frag kernel takes (from the prepared weight's `fmt`)."""
    return {name: tw.fmt[name] for name in ("W_BITS", "W_FLOAT", "SCALE_KIND", "S_EXP", "S_MAN", "ZP", "W_SIGNED")}


def frag_ptx() -> int:
    """Inline PTX in the frag decode, the kernels' PTX level (ANYBIT_FRAG_PTX, default 2): 1 — zero points by
    `minus_rows`, bytes by `unpack_bytes`, folded e2m1 scales by `times_groups`; 2 — also nibble words by
    `unpack_pairs_minus(_rows)`. Both GPU-tested bit-equal to the Triton form. 0 for the interpreter (no
    inline PTX), ANYBIT_FRAG_PTX=0, or before sm_90 (`sub.rn.bf16x2`)."""
    if settings.triton_interpret() or target_sm() < 90:
        return 0
    return settings.frag_ptx()


def frag_settle() -> bool:
    """Whether the frag kernels wait for each K block's wgmma before the next block's decode (`settled`,
    ANYBIT_FRAG_SETTLE, default on): sm_90+ compiled code only (no wgmma before Hopper; the interpreter runs no
    inline PTX)."""
    return not settings.triton_interpret() and target_sm() >= 90 and settings.frag_settle()


# `frag_fold` 2 (e4m3 / ue8m0 scales built from their bits: one IMAD a scale instead of a conversion, an fp32
# multiply and a pack) where `TritonWeight.fold_bits`. sm_90a loop, bf16 M=16: NVFP4 475 -> 395 instructions, MXFP4
# 371 -> 363 (grouped MoE NVFP4, 1 row an expert, 483 -> 403), no spill, HAZARD 0; bit for bit in bf16 (GPU) and
# fp16 (CPU). H200, graphs (`tools/probe_toggle.py --switch scale-bits`, session 18): NVFP4 A16 0.92-1.00x the time
# at M = 1-256 on 8192^2 / 28672x8192 / 8192x28672 (M=64 0.92-0.96), W4A8-NVFP4 0.91-1.00x, MXFP4 0.98-1.03x (even)
SCALE_BITS = True

# Two 128-K blocks an iteration of the dense frag kernel's decode tiles (`frag_pairs`): the loop's fixed cost
# (pipeline indices, load predicates, barriers: ~100 instructions a block) paid once for both. sm_90a, M=16, per two
# blocks (3 stages of two instead of 4 of one): w4a16 642 -> 595 instructions, MXFP4 726 -> 679, NVFP4 790 -> 745,
# W4A8-MXFP4 572 -> 528, no spill (M=64 spills: not taken there); the grouped MoE kernel's decode tiles too (w4a16
# 658 -> 609, MXFP4 736 -> 684, W4A8-MXFP4 564 -> 518; integer codes not under its 128-register cap, where w4a16
# spills). Bit for bit on the GPU; off: H200 graphs (`tools/probe_toggle.py --switch pairs`, session 19), M = 1-32,
# on/off 0.94-0.98 on 8192x28672, 1.00-1.06 on 28672x8192 (w4a16) and 1.01-1.06 for W4A8-MXFP4 everywhere
FRAG_PAIRS = False
# 3-bit codes two blocks an iteration by default (`frag_pairs`: one load of the pair's low and high units), where it
# paid on the H200 (session 34, graphs, `tools/probe_toggle.py --switch pairs`, M=1 / 16, one block -> two, µs): int3
# (167 registers either way) 8192^2 17.9 / 18.7 -> 17.1 / 18.2, 28672x8192 50.5 / 53.6 -> 46.3 / 48.7; uint3 with zero
# points (207 registers: 2 CTAs an SM where one block an iteration holds 3) 8192^2 19.4 / 19.9 -> 18.2 / 19.1 (256
# CTAs, one wave either way), 28672x8192 53.3 / 56.6 -> 55.1 / 57.6 (896 CTAs: more waves) — so zero points only
# where the launch's CTAs fit two an SM
FRAG3_PAIRS = True


@functools.cache
def sm_count(device: torch.device) -> int | None:
    """The device's SMs (None off a GPU: the interpreter); the Triton backend's too."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def two_parts(block_m: int) -> tuple[int, int]:
    """A token tile as the frag kernel runs it: (block_m, 0) for a power of two (16 or more), else its two parts, a
    power of two and a smaller one of at least 16 (`FRAG_TWO`: 48 = 32 + 16) — or a clear error."""
    if block_m >= 16 and block_m & (block_m - 1) == 0:
        return block_m, 0
    bm1 = 1 << (block_m.bit_length() - 1)
    bm2 = block_m - bm1
    if block_m < 16 or bm2 < 16 or bm2 & (bm2 - 1):
        raise ValueError(f"block_m must be a power of two or the sum of two (each >= 16, e.g. 48 = 32 + 16), "
                         f"got {block_m}")  # fmt: skip
    return bm1, bm2


def frag_pairs(tw, block_m: int, maxnreg: int | None = None, ctas: int | None = None,
               num_sms: int | None = None) -> bool:  # fmt: skip
    """Whether this launch runs two K blocks an iteration (`FRAG_PAIRS`): 4-bit codes without zero points (3-bit codes
    with or without: one load of the pair's low and high units) on decode
    tiles of <= 32 tokens (64: sm_90a spills, w4a16 384 bytes), not integer codes whose x sums the loop subtracts
    (`takes_sums`: they stay one block an iteration), nor under a cap of <= 128 registers (w4a16 spilled 96 bytes
    there; e2m1 fits). 3-bit codes by default (`FRAG3_PAIRS`): without zero points always, with them where the
    launch's `ctas` (its N tiles times its K splits) fit two on each of `num_sms` SMs."""
    capped = maxnreg is not None and maxnreg <= 128 and not tw.fmt["W_FLOAT"]
    if FRAG3_PAIRS and tw.fmt["W_BITS"] == 3 and block_m <= 32 and not capped:
        return not tw.fmt["ZP"] or (ctas is not None and num_sms is not None and ctas <= 2 * num_sms)
    fits = (tw.fmt["W_BITS"] == 3 or (tw.fmt["W_BITS"] == 4 and tw.fmt["ZP"] == 0)) and block_m <= 32
    return FRAG_PAIRS and fits and not (tw.takes_sums or capped)


# e2m1 weights under FP8 x (`TritonWeight.e2m1_a8`): the FP8 MMA accumulates the whole K range (the row's scale
# comes after the loop), as Humming's fused-ue8m0 MXFP4 path does, instead of a fresh product per 128-K block added
# in fp32 (64-128 FADDs a block and a second tile of registers, which kept 256-token tiles from fitting 8 warps)
A8_MMA_ACC = True


# 129-192 rows of such weights (`frag_mma_acc`) as three 64-token tiles on one decode of each K block
# (`frag_range_subs`, block_m 192) instead of a 256-token tile of which a quarter or more is padding. H200 graphs
# (tools/probe_toggle.py --switch subs), W4A8-MXFP4 28672x8192 M=136 / 160 / 192: 153.0 / 155.6 / 155.9 -> 123.3 /
# 124.5 / 125.7 µs; shapes with few 128-row tiles keep their rule (8192x28672: on/off 1.00-1.01)
FRAG_SUBS = True

# 33-48 rows of 4-bit codes under bf16/fp16 x as one 48-token tile of 32 + 16 tokens on one decode of each K block
# (`frag_range_two`) instead of a 64-token tile a quarter or more padding: the MMA is what grows from 32 to 64 tokens
# (H200 graphs, W4A16 28672x8192 M=32 / 48 / 64: 51.0 / 68.1 / 73.0 µs, session 23's bench)
FRAG_TWO = True


# Integer codes under FP8 x (W4A8) accumulating in the MMA too, in the grouped MoE kernel's blocks of >=
# RESCALE_MIN_ROWS rows: the accumulator counts in units of 512 times the current K block's scale, rescaled by the last
# block's scale over this one's before the block's MMA adds to it (one multiply-add an element, which also subtracts the
# codes' offset times x's sums) and times the last scale after the loop — instead of a fresh product per block scaled
# and added in fp32 (a second tile of registers: sm_90a, 64 x 128 blocks 252 -> 223 registers, loop 369 -> 321
# instructions). Weights whose group scales are positive, normal and within `frag_decode.RESCALE_SPREAD` binades of
# each other (`triton_layout.rescalable`: the accumulator stays far inside fp32's range); others keep the fresh
# products. H200 graphs (session 48, `moe_bench --rescale 0/1`), gate_up / down µs: Qwen3-30B-A3B M=256 (32-row
# blocks) 68.0 / 47.6 -> 63.7 / 41.1, M=1024 129.8 / 86.2 -> 117.2 / 82.7 (80-row blocks of two parts, which the fresh
# products spill), M=4096 404.8 / 263.2 -> 345.8 / 222.5 (128 x 128 blocks); DeepSeek-V3 M=4096 3758 / 2300 -> 3470 /
# 1936. Not on 16-row blocks (DeepSeek-V3 M=256 893 / 478 -> 919 / 491) nor the dense kernel's decode tiles (M = 1-64,
# four shapes: 2-10 % slower, `tools/probe_toggle.py --switch rescale`).
A8_RESCALE = True
RESCALE_MIN_ROWS = 32


def frag_rescale(tw, block_m: int) -> bool:
    """Whether the grouped kernel's blocks of block_m rows accumulate this integer weight under FP8 x in the MMA
    (`A8_RESCALE`)."""
    return A8_RESCALE and tw.rescale and tw.takes_sums and block_m >= RESCALE_MIN_ROWS


def frag_mma_acc(tw) -> bool:
    """Whether the frag kernels' FP8 MMA accumulates this e2m1 weight's whole K range itself (`A8_MMA_ACC`)."""
    return A8_MMA_ACC and tw.e2m1_a8


def pair_stages(num_stages: int) -> int:
    """The pipeline stages of a `frag_pairs` launch, two blocks each: 4 -> 3 (6 blocks of buffers, 4 in flight)."""
    return max(2, (num_stages + 2) // 2)


def frag_fold(tw, x_dtype: torch.dtype) -> int:
    """e2m1 codes decode to value * 2**-126 in bf16 (2**-14 in fp16) and need a packed multiply by
    2**126 (2**14) per pair; with group scales shorter than the block (NVFP4, MXFP4) that rebias rides
    on the scales instead: scale * 2**118 (fp16: * 2**6) in registers, the last 2**8 on the fp32 sum.
    Exact where `TritonWeight.fold` says so (scales small enough to stay finite, and in fp16 large
    enough that every product keeps its last bit). sm_89+ (or the interpreter) only: the folded decode
    converts e4m3 scales in hardware, which Triton does not compile for sm_80. 0: no fold; 1: fold; 2: fold with
    the scales built from their bits (`SCALE_BITS`, `scale_bits_exact`)."""
    if x_dtype not in tw.fold or not (settings.triton_interpret() or target_sm() >= 89):
        return 0
    return 2 if SCALE_BITS and tw.fold_bits else 1


@functools.cache
def target_sm() -> int:
    """The compute capability Triton compiles for (the active driver's target; 0 for a non-CUDA one).
    Read once per process: a machine mixing GPU generations gets the first one's answer."""
    target = triton.runtime.driver.active.get_current_target()
    return target.arch if target.backend == "cuda" and isinstance(target.arch, int) else 0


def frag_scale_w(tw, x_dtype: torch.dtype, block_m: int) -> bool:
    """Whether the frag kernels multiply the decoded weights by their group scales before the MMA
    (`frag_block_dot` SCALE_W): tiles of >= 128 tokens (there the per-block MMA wait and the fp32
    multiply-add of the partial sum hold the tensor cores; a 256-token tile with per-block partials
    also spills), for 4-bit integer codes with groups of >= 128 whose scales are x's dtype (each
    weight is then the dequantized weight rounded once to x's dtype, as in the dequantize-then-GEMM
    path)."""
    return (
        block_m >= 128
        and tw.fmt["W_BITS"] == 4
        and not tw.fmt["W_FLOAT"]
        and tw.scales.dtype == x_dtype
        and 128 <= tw.group_k < tw.k
    )


def scaled_int_why_not(scheme, x_dtype: torch.dtype, bits: int = 4) -> str | None:
    """None for the weights whose decode is one multiply by the scale in x's dtype (the kernels that scale the
    decoded weights: `frag_ws` — 4 and 8 bits —, and the frag kernel's 128-token tiles — 4 bits): `bits`-bit
    integers without zero point or global scale, bf16/fp16 x, scales in x's dtype per channel or per whole blocks
    of the layout (`frag_block_k`: 128 K for 4 bits, 64 for 8); else why not."""
    w, g = scheme.weight, scheme.granularity
    if not isinstance(w, IntType) or w.bits != bits or scheme.act.quantized:
        return f"{bits}-bit integer weights with bf16/fp16 activations only"
    if scheme.zero_point is not ZeroPoint.NONE or scheme.global_scale:
        return "no zero points or global scale yet"
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(scheme.scale_dtype.name)
    if x_dtype not in (torch.bfloat16, torch.float16) or dt != x_dtype:
        return f"scales in x's dtype only (scales {scheme.scale_dtype.name}, x {x_dtype}): the decoder multiplies in it"
    block = frag_block_k(bits)
    if not (g.kind is ScaleKind.CHANNEL or (g.kind is ScaleKind.GROUP and g.k % block == 0)):
        return f"scales per channel or per whole {block}-K blocks only ({g.token()})"
    return None


def scaled_int4_why_not(scheme, x_dtype: torch.dtype) -> str | None:
    """`scaled_int_why_not` of 4-bit integers."""
    return scaled_int_why_not(scheme, x_dtype, 4)


FRAG_WIDE_MIN_N = 8192  # A16, 64 < M <= 128: 128 tokens x 256 weight rows from this N on, else 64 x 128 (H200 sweep)


# 8-bit codes with channel scales on 8/16-warp tiles: the scale applied to each K block's product (one "group"
# longer than any K) — with the channel scale in the epilogue those tiles gave runs of 8 wrong weight rows on the
# H200, while per-block scales ran right (tools/probe_w8_warps.py, session 15)
CHANNEL_AS_BLOCKS = 1 << 29


def frag_group_k(tw, num_warps: int = 4) -> int:
    """GROUP_K as the kernels take it: a huge value stands for "one scale over all of K" (applied after the K loop),
    except for 8-bit codes on more than 4 warps, which scale each K block (`CHANNEL_AS_BLOCKS`)."""
    if tw.group_k < tw.k:
        return tw.group_k
    return CHANNEL_AS_BLOCKS if tw.fmt["W_BITS"] == 8 and num_warps != 4 else 1 << 30


# A CTA's fixed cost (prologue, pipeline fill, the split's reduction) in K blocks of its main loop, for
# `balanced_split`: fitted to the H200 sweep of tiles in [SMs, 2 SMs) (BENCHMARKS.md); e2m1 blocks cost more
# to decode, so the same fixed cost is fewer of them
SPLIT_CTA_COST = 2.0
SPLIT_CTA_COST_FLOAT = 1.0
# ... where 8-bit codes split K in two, which the model does not see: its split 4 left a thin second wave of CTAs, its
# split 1 a slower one (H200 graphs, session 33, `sweep-frag --scheme w8a16`, 28672x8192 M=1 / 16, split 1 / 2 / 4 /
# 8: 62.0 / 60.1 / 73.8 / 61.2 and 63.3 / 63.1 / 77.7 / 71.9 µs, Humming 65.2 / 63.8; the tuning table's 28672x4096
# cells took split 2 as well)
BYTE_SPLIT = 2
# ... and for 4-bit weights on the FP8 MMA (W4A8, MXFP4 under e4m3 x), whose CTA starts and split reductions cost more
# against their main loop: fitted to the H100 sweep (session 54, `sweep-frag --splits 1,2,4,8`, graphs, M=1 / 16,
# split 1 / 2 / 4): 18432x7168 W4A8-MXFP4 35.5 / 31.7 / 31.9 and 37.2 / 34.6 / 37.3, W4A8 32.1 / 31.1 / 33.3 and 34.2
# / 34.0 / 44.0 (-> 2); 28672x8192 W4A8 45.1 / 59.6 / 52.7, MXFP4 46.4 / 48.9 / 54.7 (-> 1), H200 28672x4096 W4A8 M=16
# 22.6 / 25.6 / 28.1 (-> 1)
SPLIT_CTA_COST_A8 = 8.0


def balanced_split(tiles: int, k_blocks: int, num_sms: int, cta_cost: float) -> int:
    """The K split (1, 2, 4, 8; >= 4 K blocks a split) that minimises the busiest SM's work, ceil(tiles *
    split / SMs) CTAs of k_blocks / split + cta_cost blocks each: for launches of one to two CTAs per SM,
    where split 1 leaves some SMs one CTA and others two. H200, M=1 W4A16 / MXFP4 (µs, split 1 -> this):
    28672x8192 42.2 -> 37.9 / 52.8 -> 44.5, 18432x7168 36.9 -> 27.7 / 46.2 -> 27.9, 24576x5120 27.4 ->
    22.6 / 34.1 -> 26.7, 28672x4096 23.0 (split 1 kept) / 28.0 -> 25.3."""
    splits = [s for s in (1, 2, 4, 8) if s == 1 or k_blocks >= 4 * s]
    cost = {s: -(-tiles * s // num_sms) * (k_blocks / s + cta_cost) for s in splits}
    return min(cost, key=lambda s: (cost[s], s))


# 33-64 rows on the FP8 MMA: below this share of two CTAs an SM, the launch takes 64 weight rows a tile (H200 graphs,
# `tools/sweep_frag.py`, M=64: 18432x7168 W4A8 50.4 -> 44.2 µs, W4A8-MXFP4 46.8 -> 41.0 — 144 tiles of 128 rows, one
# split; where 128-row tiles already fill the SMs, 64-row ones were even or slower: 28672x8192 57.7 -> 70.0,
# 8192x28672 66.8 -> 68.8, 8192^2 M=40 23.5 -> 24.8)
A8_NARROW_FILL = 0.6


def frag_tile(
    m: int, n: int, k: int, num_sms: int, interpret: bool, bits: int = 4, mid: bool = False,
    float_codes: bool = False, balance: bool = True, a8: bool = False, two: bool = False, fp8_mma: bool = False,
) -> dict:  # fmt: skip
    """Tile for the dense kernel (BN weight rows x BM tokens) and split-K, from the H200 sweeps
    (`tools/sweep_frag.py`, BENCHMARKS.md): 128-row tiles of 4 warps, 4 stages, K split until the launch
    holds ~2 CTAs per SM (int4, int8, e2m1 and W4A8 alike, every M up to 64); >= 4 K blocks per split; up to
    16 tokens with one to two tiles per SM, the split that balances the SMs (`balanced_split`). 2-bit codes
    take 64-row tiles of 3 stages (a 256-K block decoded whole holds the registers of 128 rows of 4-bit
    codes; at M = 64, 4 stages or 128 rows ran 1.3-3x slower). `mid`, 64 < M <= 128 (A16 4-bit ints with
    scales on the decoded weights, `scaled_int4_why_not`): from N = 8192 on, 128 tokens x 256 weight rows of
    16 warps (four warpgroups on one SM: each of its register-operand wgmmas waits for the last) split until
    one wave; below, 64 x 128 of 8 warps capped at 128 registers (two CTAs per SM), split until two a SM —
    graphs, 8192^2 M=128 45 µs, 28672x8192 117, 8192x28672 114, 4096^2 18, 4096x14336 40 (dequantize +
    cuBLAS or the warp-specialised kernel: 65, 134, 215, 26, 82); `mid`, 128 < M <= 256 (int4 with long K,
    e2m1 on every shape: `FRAG_MID_256`): 256 tokens x 128 weight rows of 8 warps, split until one wave
    (M=256 8192x28672 206 µs, 4096x14336 68). `mid` with `a8` (e2m1 on the FP8 MMA accumulating the whole K,
    `frag_mma_acc`): up to 128 rows 128 tokens x 128 weight rows of 8 warps split until one wave, above the 256-token
    tiles (graphs, M=128: 8192^2 36.9 µs, 28672x8192 79.0, 8192x28672 97.4 — 128 x 256 of 16 warps 42.6 / 86.4 /
    95.4 —; M=256: 56.6 / 150.3 / 153.0, 128-token tiles 52.4 / 156.9 / 169.5); where N has few 128-row tiles
    (<= half the SMs) 128 x 128 capped at 128 registers, two CTAs an SM, split until two a SM (8192x28672 M=128
    97.9 -> 89.0, 8192^2 M=256 57.4 -> 52.1, 8192x28672 M=256 152.8 -> 153.9). `two` (4-bit codes under bf16/fp16
    x): 33-48 rows as a 48-token tile of 32 + 16 (`FRAG_TWO`). `fp8_mma` (the weight runs on the FP8 MMA): 33-64
    rows on 64 weight rows a tile where 128-row tiles fill the SMs poorly (`A8_NARROW_FILL`); up to 16 rows its
    4-bit weights balance their split with a CTA cost of their own (`SPLIT_CTA_COST_A8`), 8-bit ones do not."""
    if interpret:
        return dict(block_m=16, block_n=64, split_k=2 if k > frag_block_k(bits) else 1, num_warps=4, num_stages=1)
    k_blocks = cdiv(k, frag_block_k(bits))

    def split_to(tiles: int, slots: int, min_blocks: int = 4) -> int:
        """K split in powers of two until the launch fills `slots` CTAs, keeping >= min_blocks K blocks per split."""
        split = 1
        while tiles * split * 2 <= slots and split * 2 * min_blocks <= k_blocks and split < 16:
            split *= 2
        return split

    if mid and m > 64 and a8 and 2 * cdiv(n, 128) <= num_sms:  # few weight tiles: 2 CTAs an SM, split to 2 a SM
        tile = dict(block_m=128, block_n=128, num_warps=8, num_stages=3, maxnreg=128)
        return tile | dict(split_k=split_to(cdiv(m, 128) * cdiv(n, 128), 2 * num_sms))
    if mid and m > 64 and a8 and m <= 128:
        tile = dict(block_m=128, block_n=128, num_warps=8, num_stages=3)
        return tile | dict(split_k=split_to(cdiv(m, 128) * cdiv(n, 128), num_sms))
    if mid and a8 and 128 < m <= 192 and FRAG_SUBS:  # three 64-token tiles on one decode, no split
        return dict(block_m=192, block_n=128, split_k=1, num_warps=8, num_stages=3)
    if mid and m > 128:  # long K only (`frag_mid_rows`): 256 tokens x 128 weight rows of 8 warps, one wave
        split = split_to(cdiv(m, 256) * cdiv(n, 128), num_sms)
        return dict(block_m=256, block_n=128, split_k=split, num_warps=8, num_stages=3)
    if mid and m > 64 and bits == 8:  # 8-bit channel ints: 128 x 128 of 4 warps, split until two a SM keeping >= 1024
        # K a split (graphs, M=128: 8192^2 48.7 µs, 28672x8192 141, 8192x28672 141, 4096^2 22.6 — 33.0 at 512 K a split;
        # dequantize + cuBLAS 100, 338, 336, 28)
        tile = dict(block_m=128, block_n=128, num_warps=4, num_stages=3)
        return tile | dict(split_k=split_to(cdiv(m, 128) * cdiv(n, 128), 2 * num_sms, min_blocks=16))
    if mid and m > 64:
        wide = n >= FRAG_WIDE_MIN_N
        bm, bn, warps, per_sm = (128, 256, 16, 1) if wide else (64, 128, 8, 2)
        tile = dict(block_m=bm, block_n=bn, split_k=split_to(cdiv(m, bm) * cdiv(n, bn), per_sm * num_sms),
                    num_warps=warps, num_stages=3)  # fmt: skip
        return tile if wide else tile | dict(maxnreg=128)
    bm = 16 if m <= 16 else (32 if m <= 32 else (48 if m <= 48 and two and FRAG_TWO else 64))
    bn, stages = (64, 3) if bits == 2 else (128, 4)
    tiles = cdiv(n, bn) * cdiv(m, bm)
    split = split_to(tiles, 2 * num_sms)
    if fp8_mma and bm == 64 and bits == 4 and tiles * split < A8_NARROW_FILL * 2 * num_sms:
        narrow = cdiv(n, 64) * cdiv(m, bm)
        if narrow * split_to(narrow, 2 * num_sms) > tiles * split:  # more CTAs in flight, not just smaller ones
            bn, tiles = 64, narrow
            split = split_to(tiles, 2 * num_sms)
    # (M=64: split 1 best, 24576x5120 45.2 vs 51.7 at 2; 8-bit weights on the FP8 MMA not measured balanced)
    if balance and not (fp8_mma and bits != 4) and m <= 16 and num_sms <= tiles < 2 * num_sms:
        cost = SPLIT_CTA_COST_A8 if fp8_mma else SPLIT_CTA_COST_FLOAT if float_codes else SPLIT_CTA_COST
        split = balanced_split(tiles, k_blocks, num_sms, cost)
        if bits == 8 and k_blocks >= 4 * BYTE_SPLIT:
            split = BYTE_SPLIT
    return dict(block_m=bm, block_n=bn, split_k=split, num_warps=4, num_stages=stages)


def gemm_frag(x, tw, bias=None, *, block_m: int, block_n: int, split_k: int = 1, num_warps: int = 4,
              num_stages: int = 4, workspace=None, counters=None, out=None, x_scales=None, x_sums=None,
              out_dtype=None, pdl: bool = False, scale_w: bool | None = None,
              maxnreg: int | None = None) -> torch.Tensor:  # fmt: skip
    """y [M, N] = x [M, K] @ dequantize(W)^T for a prepared weight in the fragment layout
    (`TritonWeight.frag`). x: bf16/fp16, or e4m3 from `quantize_act` per token with its fp32 `x_scales`
    [M, 1] (FP8-activation schemes: their weights are packed in the FP8 MMA's order — MXFP4 as e4m3 by
    look-up tables of row-relative exponents, `TritonWeight.e2m1_a8` —; `codes_a16` weights take
    the codes in bf16/fp16 instead, `quantize_act(codes_dtype=...)`, with their x_scales) and, optionally, its
    per-block sums `x_sums` (`quantize_act(block_sums=True)`: fp32 [ceil(K/128), M]; without them the
    kernel sums each x tile itself, ~100 more instructions per block at M <= 16); y in out_dtype
    (default x's dtype, bf16 for FP8 x). split_k > 1 needs `workspace` (fp32 >= split_k*M*N) and zeroed
    int32 `counters` (>= output tiles), left ready for the next call. pdl: launched as a
    programmatic dependent of the previous kernel (the quantizer), waiting for it before any read. scale_w:
    group scales on the decoded weights (`frag_block_dot` SCALE_W; default `frag_scale_w`, tiles of >= 128
    tokens). maxnreg: a cap on the registers per thread (more CTAs per SM). What a launch's tile and flags decide
    (checks, the kernel's constexprs) is worked out once per weight (`_frag_launch`): an eager call's host time."""
    m, k = x.shape
    n = tw.n
    key = (block_m, block_n, split_k, num_warps, num_stages, x.dtype, x_scales is None, bias is None, out_dtype, pdl,
           scale_w, maxnreg, frag_ptx(), frag_settle(), frag_fold(tw, x.dtype), FRAG_PAIRS, FRAG3_PAIRS,
           A8_MMA_ACC)  # the settings and switches the launch depends on: tests turn them  # fmt: skip
    launch = tw.launches.get(key)
    if launch is None:
        launch = tw.launches[key] = _frag_launch(tw, x.dtype, key)
    dtype, launcher, weight_args = launch
    if x_sums is not None and (x_sums.shape != (cdiv(k, 128), m) or not x_sums.is_contiguous()):
        want = f"contiguous fp32 [{cdiv(k, 128)}, {m}] (quantize_act)"
        raise ValueError(f"x_sums must be {want}, got {tuple(x_sums.shape)}")
    if split_k > 1 and (workspace is None or counters is None):
        raise ValueError("split_k > 1 needs a workspace and counters")
    y = out if out is not None else torch.empty((m, n), device=x.device, dtype=dtype)
    grid = (cdiv(n, block_n), cdiv(m, block_m), split_k)
    dummy = tw.scales
    planes, scales, zeros, gs, rows = weight_args
    # fmt: off
    launcher(
        grid, x, x_scales if x_scales is not None else dummy, x_sums if x.dtype == torch.float8_e4m3fn else None,
        planes, scales, zeros, gs, rows, bias if bias is not None else dummy, y, workspace if split_k > 1 else y,
        counters if split_k > 1 else y, m, n, k, x.stride(0), x_scales.stride(0) if x_scales is not None else 0,
        y.stride(0), planes.stride(-2), scales.stride(-2), frag_mask(tw.fmt["W_BITS"]),
    )
    # fmt: on
    return y


# the arguments of `_frag_gemm_kernel` a call changes: x, its scales and block sums, bias, y, workspace, counters, M,
# x's, x_scales' and y's row strides
_FRAG_LIVE = (0, 1, 2, 8, 9, 10, 11, 12, 15, 16, 17)


def _frag_launch(tw, x_dtype: torch.dtype, key: tuple) -> tuple:
    """(y's dtype, the `Launcher` of the kernel's constexprs and launch options, the weight's tensor arguments) of a
    `gemm_frag` launch with this key (its tile and flags), after the checks that depend on them alone."""
    block_m, block_n, split_k, num_warps, num_stages, _, no_xs, no_bias, out_dtype, pdl, scale_w, maxnreg, ptx, \
        settle, fold, *_ = key  # fmt: skip
    if block_n < 16 * num_warps:
        raise ValueError(f"block_n={block_n} must be >= 16 * num_warps ({16 * num_warps})")
    fp8 = x_dtype == torch.float8_e4m3fn
    if fp8 != tw.mma_a8 or tw.scheme.act.quantized == no_xs:
        raise ValueError(f"{tw.scheme} was packed for {tw.x_wants} activations (with x_scales for FP8 schemes); got "
                         f"{x_dtype}{' without' if no_xs else ' with'} x_scales")  # fmt: skip
    mma_acc = frag_mma_acc(tw)
    subs = 3 if block_m == 192 else 1  # three 64-token tiles on one decode (`FRAG_SUBS`)
    if subs > 1 and not (mma_acc and split_k == 1):
        raise ValueError(f"block_m=192 (three 64-token tiles) takes e2m1 weights under FP8 x accumulating in the MMA "
                         f"(frag_mma_acc) without split-K; got {tw.scheme}, split_k={split_k}")  # fmt: skip
    bm1, bm2 = two_parts(block_m) if subs == 1 else (block_m // 3, 0)
    if bm2 and (fp8 or tw.fmt["W_BITS"] != 4):
        raise ValueError(f"block_m={block_m} (two token tiles, {bm1} + {bm2}) takes 4-bit codes under bf16/fp16 x; got "
                         f"{tw.scheme} with {x_dtype} x")  # fmt: skip
    dtype = out_dtype or (torch.bfloat16 if fp8 else x_dtype)
    dummy = tw.scales
    rows = tw.rowwise[1] if tw.e2m1_a8 else None  # e2m1 under FP8 x: its scales are row-relative codes
    pairs = frag_pairs(tw, block_m, maxnreg, cdiv(tw.n, block_n) * split_k, sm_count(tw.planes[0].device))
    consts = dict(
        frag_constexprs(tw), GROUP_K=frag_group_k(tw, num_warps), GROUP_N=tw.group_n, NW=num_warps,
        HAS_GS=tw.global_scale is not None, HAS_BIAS=not no_bias, BM=bm1, BM2=bm2, BN=block_n, SPLIT_K=split_k,
        STAGES=pair_stages(num_stages) if pairs else num_stages, PANEL=FRAG_PANEL, PTX=ptx, FOLD=fold,
        PDL=pdl, SETTLE=settle, SCALE_W=frag_scale_w(tw, x_dtype, block_m) if scale_w is None else scale_w,
        HAS_XS=not no_xs, HAS_RS=rows is not None, PAIRS=pairs, MMA_ACC=mma_acc, SUBS=subs, num_warps=num_warps,
        launch_pdl=pdl, **({} if maxnreg is None else {"maxnreg": maxnreg}),
    )  # fmt: skip
    zeros, gs = (t if t is not None else dummy for t in (tw.zeros, tw.global_scale))
    weight = (tw.planes[0], tw.scales, zeros, gs, rows if rows is not None else dummy)
    return dtype, Launcher(_frag_gemm_kernel, consts, _FRAG_LIVE), weight
