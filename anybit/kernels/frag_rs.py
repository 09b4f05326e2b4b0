"""A16 with the decoded weight as the wgmma's register operand (`frag_rs_kernel`), for the mid-M calls (33-512 rows)
where the warp-specialised kernel's shared-memory round trip of the decoded tile costs most. The weights the
warp-specialised kernel takes (4- and 8-bit integers, NVFP4, MXFP4; FP8 x as codes with per-row scales), and integer
weights it does not (`rs_int_why_not`): 3- and 4-bit codes with integer zero points (GPTQ / AWQ asymmetric), 3-bit
codes in the dense backend's 3-bit planes, and scales of the other 16-bit float type. Routed by `rs_tile` (the Triton
backend's `ws_route_tile`; ANYBIT_FRAG_RS=0 turns it off).
"""

from __future__ import annotations

import torch

from anybit import settings
from anybit.formats.dtypes import IntType
from anybit.formats.scheme import ScaleKind, ZeroPoint
from anybit.kernels.dequant import cdiv
from anybit.kernels.frag_layout import FRAG_PANEL, frag_block_k
from anybit.kernels.frag_ws import (
    call_output,
    frag_ws_scheme_why_not,
    frag_ws_weight_why_not,
    gluon_hopper_why_not,
    int_descs,
    row_scales,
    swap_block_m,
    swap_parts,
    x_desc,
)
from anybit.kernels.launch import Launcher

# The code widths the route sends to this kernel: 4-bit integers and e2m1, 8-bit integers (`W8`: a 64-K block of
# their layout is one x slice and one wgmma; `rs_tile` sends them 65-256 rows), and 3-bit integers (`W3`: each
# 128-K block's 4-bit words rebuilt from a low and a high unit of the 3-bit planes, `frag_layout.pack_frag3`), and
# 2-bit integers (`W2`: each half of the layout's 256-K block a block of the kernel, its 64-K words decoded straight
# into the 4-bit words' pairs, `frag_ws_kernel._pairs2`)
RS_BITS = (2, 3, 4, 8)
# 2-bit codes here (session 34; GPU-run session 35: tests/kernels/test_frag_rs_gpu.py, and H200 graphs 8192^2 M=128
# 100.1 -> 29.7 µs, 28672x8192 M=128 323.9 -> 120.9 against the frag kernel's decode tiles / dequantize + cuBLAS);
# ANYBIT_RS_W2=0 turns them off (`settings.rs_w2`)


def rs_scheme_why_not(scheme) -> str | None:
    """Why the route does not send a scheme the warp-specialised kernel takes to this kernel (`RS_BITS`), or None."""
    if scheme.weight.bits not in RS_BITS:
        return f"{scheme.weight.bits}-bit codes: the warp-specialised kernel's route (RS_BITS {RS_BITS})"
    return None


def rs_block_k(bits: int) -> int:
    """K per block of the kernel's loop: 64 for 8-bit codes (one x slice), else 128 (2-bit codes: half a layout
    block)."""
    return 64 if bits == 8 else 128


def rs_int_why_not(scheme, k: int, n: int, x_dtype: torch.dtype, device: torch.device) -> str | None:
    """None for the integer weights the kernel decodes (in the fragment layout, `frag_rs_why_not`): 2-, 3-, 4- or 8-bit
    codes, integer zero points on 2- to 4-bit ones (subtracted exactly in x's dtype: `frag_ws_kernel._pairs_zp`), no
    global scale, bf16/fp16 scales per channel or per whole blocks of the layout (128 K; 64 for 8 bits; 256 for 2 bits,
    or every 64 K: a 2-bit word's quarter of its block) — the decode
    multiplies in x's dtype, so scales of the other 16-bit type are rounded to x's once (as Marlin and Humming keep
    them: each decoded weight within one unit in the last place of x's dtype instead of half; exact where the scales
    are x's dtype); else why not."""
    w, g = scheme.weight, scheme.granularity
    if not isinstance(w, IntType) or w.bits not in RS_BITS or scheme.act.quantized:
        return f"{RS_BITS}-bit integer weights with bf16/fp16 activations only ({scheme})"
    if x_dtype not in (torch.bfloat16, torch.float16):
        return f"bf16/fp16 activations only, got {x_dtype}"
    if w.bits == 2 and not settings.rs_w2():
        return "2-bit codes: switched off (ANYBIT_RS_W2=0)"
    zp = scheme.zero_point
    if zp is ZeroPoint.FLOAT or (zp is ZeroPoint.INT and w.bits == 8):
        return f"integer zero points of 2- to 4-bit codes only ({scheme.zero_point.value} zero points, {w.bits} bits)"
    if scheme.global_scale or scheme.scale_dtype.name not in ("bf16", "fp16"):
        return f"bf16/fp16 scales without a global scale only ({scheme})"
    block = frag_block_k(w.bits)
    quarters = w.bits == 2 and g.k == 64  # (a 2-bit word's 64 K: one group)
    if not (g.kind is ScaleKind.CHANNEL or (g.kind is ScaleKind.GROUP and (g.k % block == 0 or quarters))):
        return (
            f"scales per channel or per whole {block}-K blocks only{' (or every 64 K)' if w.bits == 2 else ''} "
            f"({g.token()})"
        )
    if k % 8:
        return f"K={k} must be a multiple of 8 (TMA reads x rows 16-byte aligned)"
    if n % (16 if zp is ZeroPoint.INT else 8):
        return (
            f"N={n} must be a multiple of {16 if zp is ZeroPoint.INT else 8} (TMA reads scale and zero-point rows "
            "16-byte aligned)"
        )
    return gluon_hopper_why_not(device)


# The warp-specialised kernel's row-major tiles (`gemm_frag_ws`) on the integer weights `rs_int_why_not` adds to
# its own (`frag_ws_weight_why_not`): zero points, 3- and 2-bit codes, scales of the other 16-bit type — decoded by
# `frag_ws_kernel._int_block` from the pieces this kernel's decode uses (session 35; sm_90a 168 registers, no spill;
# GPU-run: tests/kernels/test_frag_ws_int_gpu.py). H200 eager µs (tools/probe_ws.py), dequantize + cuBLAS -> its
# default tile (Humming): uint4 g128 + zero points 8192^2 M=512 135.8 -> 109.7 (113.9), M=1024 249.5 -> 225.4
# (222.0), 28672x8192 M=512 500.4 -> 416.4 (339.0), M=1024 862.9 -> 779.8 (712.5); w3a16 8192^2 M=512 133.0 ->
# 120.6 (112.3), M=1024 239.1 -> 243.4 (214.8), 28672x8192 M=512 484.5 -> 461.2, M=1024 838.0 -> 829.6 (the 3-bit
# decode with zero points is the bottleneck at 1024 rows: a draw). ANYBIT_WS_INT=0 turns it off (`settings.ws_int`)


def ws_int_why_not(scheme, k: int, n: int, x_dtype: torch.dtype, device: torch.device) -> str | None:
    """None where the warp-specialised kernel's row-major tiles run integer weights of `scheme` that only this kernel
    ran before (`rs_int_why_not`'s, in the fragment layout), else why not. (Its swapped tiles keep the weights
    `frag_ws_weight_why_not` takes; below `RS_ONLY_MAX_M` rows this kernel keeps these.)"""
    if not settings.ws_int():
        return "zero points, 2/3-bit codes, other-dtype scales: switched off (ANYBIT_WS_INT=0)"
    return rs_int_why_not(scheme, k, n, x_dtype, device)


def rs_kernel_scheme_why_not(scheme, k: int, n: int, x_dtype: torch.dtype, device: torch.device) -> str | None:
    """None when the kernel runs weights of `scheme` (K = k, N = n) with x of `x_dtype` on `device`: e2m1 ones as the
    warp-specialised kernel takes them (`frag_ws_scheme_why_not`; a prepared weight's scales must also fold exactly,
    `frag_rs_why_not`), integer ones by `rs_int_why_not`; else why not."""
    if scheme.weight.is_float:
        return frag_ws_scheme_why_not(scheme, k, x_dtype, device, n)
    return rs_int_why_not(scheme, k, n, x_dtype, device)


def frag_rs_why_not(tw, x_dtype: torch.dtype, device: torch.device) -> str | None:
    """None when `gemm_frag_rs` runs this prepared weight with x of `x_dtype` on `device`: e2m1 weights as the
    warp-specialised kernel takes them (`frag_ws_weight_why_not`), integer ones in the fragment layout by
    `rs_int_why_not`; else why not. (Which of them the route sends here: `rs_scheme_why_not`.)"""
    if tw.fmt["W_FLOAT"]:
        return frag_ws_weight_why_not(tw, x_dtype, device)
    if not tw.frag:
        return "bit-plane weights: the kernel reads the fragment layout"
    return rs_kernel_scheme_why_not(tw.kernel_scheme, tw.k, tw.n, x_dtype, device)


RS_MAX_STAGES = 6
# Two MMA warpgroups take alternate blocks from one ring, and each waits only for its own blocks. A slot's `ready`
# barrier is waited by phase parity, and parity cannot tell block b's phase from block b - 2 * STAGES's: a wait for
# block b passes at once while block b - STAGES (the previous occupant of b's slot) has not landed, and the
# warpgroup reads that older block's words as b's. With an even number of slots b - STAGES is a block the waiting
# warpgroup itself waited for; with an odd number it is the other warpgroup's, which nothing orders before b's wait:
# the H200 lost whole 64-K blocks, their words those of b - 3, in 1-4 of 8 calls after another kernel with 3 slots
# (W8A16 and W4A16, session 27; one launch failed), 0 of 144 with 4 or 6; 5 (160 tokens) was found by the CPU model
# (tests/kernels/test_frag_rs_ring.py). So with an odd number each wait for a block first waits for the release of
# the slot's previous block (`frag_rs_kernel._block_words`). 2 slots hang (a warpgroup reads block b + 2 ahead while
# b holds its slot).
RS_MIN_STAGES = 3
RS_SMALL_MIN_M = 32  # up to 32 rows the frag kernel's split-K decode path is as fast (`rs_tile`)
RS_SMALL_MIN_FILL = 0.7  # 33-64 rows: N's 64-row tiles fill at least this much of one wave (`rs_tile`)
RS_MAX_M = 512  # 257-512 rows where two token tiles a 64-row tile fit one wave (`rs_block_m`)
RS_BYTE_WIDE_M = 320  # 8-bit codes: 257-320 rows as one 320-token tile a 64-row tile (`rs_block_m`)
RS_HEAD = 256  # the first part's rows of a call run as two (`rs_parts`)
RS_PARTS_MAX_M = 384  # the most rows run as two launches (`rs_parts`)
RS_SPLIT = 2  # K splits of a tile where two CTAs a tile fit one wave (`rs_tile`; 4 measured slower)
_SMEM = 227 * 1024 - 2048  # a CTA's shared memory on Hopper, less the barriers and alignment


def rs_stages(block_m: int, bits: int = 4, spare: int = 0) -> int:
    """The most ring slots (up to RS_MAX_STAGES) that fit: a slot is a block's words (4 KB), scale rows (at most 8 x
    64 bytes; or scale and zero-point rows, 2-bit codes in 64-K groups four of each: 768 bytes) and x's two halves
    (block_m x 128 x 2 bytes; the reduction reuses one slot's); 96 or 128 tokens: 6, 160: 5, 192: 4, 256: 3. 8-bit
    codes: a 64-K block holds one x slice (block_m x 64 x 2 bytes; the reduction reuses x slots 0 and 1), so 6 slots
    at every tile up to 256 tokens, 5 at 272-320. 3-bit codes: two 4 KB units a slot (96 tokens: 6, 128: 5, 160: 4,
    192 and 256: 3). spare: bytes of shared memory kept for something else (`frag_rsp.rsp_stages`)."""
    words = 8192 if bits == 3 else 4096
    return min(RS_MAX_STAGES, (_SMEM - spare) // (words + 1024 + block_m * (128 if bits == 8 else 256)))


def rs_block_m(m: int, n: int, num_sms: int = 132, bits: int = 4) -> int | None:
    """The token tile of an M-row call of an N-row weight: the fewest tokens holding M (`frag_ws.swap_block_m`), but
    two 128-token tiles for 193-256 rows where their CTAs still fit one wave (H200 graphs, W4A16, one 256-token tile
    (session 24) -> two of 128 (session 27), µs: 4096^2 M=256 26.7 -> 17.2, 4096x14336 (split in two) 64.4 -> 50.5;
    where they would not, the 256-token tile stays: session 27, same run, 6144x4096 M=224 / 256 27.9 / 27.5 vs 34.5 /
    31.5, 8192^2 62.6 / 54.6 vs 72.5 / 65.1). 257-RS_MAX_M rows where two token tiles a 64-row tile fit one wave
    (4096-row weights): 256-token tiles above 384 rows, else 192-token ones (session 28, W4A16 graphs, the route —
    dequantize + cuBLAS — -> 256 / 128-token tiles (Humming), µs: 4096^2 M=384 36.1 -> 46.1 / 32.8 (27.7), M=512 37.3
    -> 29.5 / 35.0 (33.9); 4096x14336 M=384 111.0 -> 144.0 / 95.6 (78.9), M=512 124.8 -> 91.4 / 113.4 (99.4); session
    29, same run, 128 -> 192-token tiles (Humming), M=320 / 384: 4096^2 35.5 / 31.8 -> 27.5 / 24.3 (25.1 / 27.4),
    4096x14336 105.5 / 93.9 -> 90.5 / 78.6 (58.3 / 78.8); two K halves a tile (`split_k`) slower: 38.8-50.3, 90.6-116.2
    µs). 8-bit codes at 257-RS_BYTE_WIDE_M rows where 256-token tiles would overfill a wave but 64-row tiles fit one
    (6144- and 8192-row weights): one 320-token tile (`rs_token_parts`; session 30, W8A16 graphs, the route — two
    launches, `rs_parts` — -> 288 / 320-token tiles (Humming), µs, M=272 / 288 / 320: 8192^2 104.3 / 100.7 / 97.1 ->
    72.8 / 75.2 / 228.1 and 76.2 / 78.1 / 74.9 (71.0 / 74.3 / 82.0), 8192x28672 340.6 / 345.4 / 322.7 -> 248.3 / 266.1
    / 728.9 and 246.0 / 247.1 / 238.2 (228.5 / 248.0 / 259.0), 6144x4096 54.1 / 50.4 / 45.8 -> 37.6 / 38.6 / 97.2 and
    35.1 / 37.1 / 38.6 (33.8 / 34.3 / 35.9)); else None."""
    if m > 256:
        tiles = cdiv(n, 64)
        if bits == 8 and m <= RS_BYTE_WIDE_M and 2 * tiles > num_sms >= tiles:
            return RS_BYTE_WIDE_M
        if m > RS_MAX_M or cdiv(m, 256) * tiles > num_sms:
            return None
        return 256 if m > 384 else 192
    bm = swap_block_m(m)
    return 128 if bm is not None and bm > 192 and 2 * cdiv(n, 64) <= num_sms else bm


def rs_tile(m: int, n: int, k: int, num_sms: int = 132, bits: int = 4) -> dict | None:
    """The kernel's tile for an M-row call of a weight [N, K] with `bits`-bit codes — the token tile `rs_block_m`, the
    most stages that fit — where it beats the warp-specialised and frag kernels, else None. 8-bit codes: the same rule
    above 64 rows (session 27, W8A16 graphs, the route -> this kernel (Humming), µs, M=96 / 128: 8192^2 46.4 / 50.1 ->
    37.1 / 41.4 (35.4 / 40.3), 6144x4096 30.3 / 32.6 -> 20.0 / 21.8 (21.1 / 23.3), 4096^2 21.2 / 23.0 -> 17.9 / 19.9
    (16.6 / 18.5), 4096x14336 split in two 47.2 / 49.4 -> 37.8 / 42.2 (32.0 / 36.6)); at 33-64 rows the frag kernel's
    decode path stays (8192^2 M=48 / 64 31.0 / 32.5 -> 33.1 / 33.1, 6144x4096 15.6 / 17.0 -> 18.2 / 18.4); not at 65-128
    rows of tall weights whose tiles overfill a wave (session 28, frag kernel -> this kernel, M=96 / 128: 28672x4096
    66.7 / 72.6 -> 74.0 / 84.2, 28672x8192 136.7 / 143.6 -> 140.2 / 158.4; 8192x28672 133.6 / 142.8 -> 122.4 / 137.9).
    H200 graphs (tools/probe_ws.py, session 22), µs, W4A16 / MXFP4 / NVFP4, the route before -> this kernel (Humming):
    8192^2 M=96 42.3 / 42.7 / 43.3 -> 30.5 / 30.6 / 33.2 (29.1 / 32.9 / 33.3), M=128 41.0 / 41.3 / 42.3 -> 32.6 / 33.1 /
    36.9 (34.7 / 36.5 / 38.2), M=192 48.9 / 50.5 / 49.7 -> 46.1 / 47.2 / 50.0, M=256 51.7 / 51.8 / 51.5 -> 51.0 / 52.5 /
    53.5; 8192x28672 M=96 134.8 / 131.0 / 134.0 -> 104.3 / 91.4 / 109.2, M=256 203.5 / 181.8 / 208.0 -> 179.5 / 171.9 /
    176.1; 28672x8192 M=96 129.4 / 133.4 / 136.4 -> 114.1 / 113.8 / 125.9, M=128 127.8 / 131.5 / 136.9 -> 120.5 / 125.3
    / 144.7, M=160 159.8 / 152.1 / 160.3 -> 158.0 / 154.5 / 170.2. So: 65-256 rows where K >= 2N, 65-192 where N's
    64-row tiles fit one wave, 65-128 on taller weights. And RS_SMALL_MIN_M < M <= 64 where N's 64-row tiles fill one
    wave and K < 2N: the frag kernel's split-K decode -> this kernel, W4A16 / MXFP4 / NVFP4, M=40: 8192^2 27.1 / 26.3 /
    27.7 -> 24.3 / 24.9 / 28.0, 7168^2 24.2 / 24.1 / 24.8 -> 21.2 / 21.9 / 24.9; M=48 8192^2 25.9 / 26.8 / 27.1 -> 24.0
    / 24.7 / 27.6, 7168^2 23.1 / 24.3 / 24.2 -> 21.8 / 21.9 / 24.7; W4A16 8192^2 M=64 27.2 -> 23.6 (Humming 25.7-26.7);
    M=32 19.9 either way; taller or longer-K weights keep the decode (28672x8192 M=64 74.0 -> 89.6, 8192x28672 76.6 ->
    86.2). 6144-row weights (96 tiles, 73 % of a wave) too: session 30, W4A16 graphs, 6144x4096 M=40 / 64 20.6 / 15.7 ->
    13.9 / 13.5 (Humming 12.7 / 14.3); 4096-row ones (48 %) keep the decode (4096^2 12.9 / 13.7 vs 13.7 / 13.5;
    28672x4096 39.8 / 37.2 vs 50.7 / 51.1) — at 33-64 rows they take it split in two along K, where two CTAs a tile fill
    one wave (session 31, graphs, the frag decode -> split in two (Humming), W4A16 / NVFP4 / MXFP4, M=40 / 64: 4096^2
    13.1 / 14.8 -> 11.9 / 13.2 (11.0 / 12.6), 13.2 / 14.9 -> 12.7 / 13.9 (12.3 / 13.9), 14.0 / 14.5 -> 12.8 / 12.9
    (12.7 / 13.0); 4096x14336 26.9 / 27.3 -> 25.3 / 25.5 (21.2 / 23.4), 27.5 / 28.4 -> 28.6 / 28.1 (24.6 / 27.3), 25.4 /
    28.2 -> 25.4 / 26.1 (23.7 / 26.4)); 8-bit codes too (session 32, W8A16 graphs, M=40 / 64: 4096^2 15.0 / 15.8 -> 13.6
    / 14.7 (13.3 / 14.6), unsplit 16.3 / 16.5; 4096x14336 32.9 / 35.1 -> 31.7 / 33.5 (26.2 / 28.9)). And split in two
    along K (`split_k`) where K >= 2N and two CTAs a tile still fit one wave (session 23, W4A16 graphs: 4096x14336 M=96
    / 128, the frag kernel's 128-token tiles 40.0 / 41.1 -> 31.7 / 34.3 µs, unsplit 45.7 / 44.5, split 4 37.9 / 41.3;
    Humming 27.4 / 31.5) — the split costs where the tiles fill the SMs already (28672x8192 M=96 117.1 -> 139.1).
    Session 24, 129-256 rows of weights whose 64-row tiles fit one wave (Llama-3-8B's), the route (frag kernel or
    dequantize + cuBLAS) -> this kernel (Humming), W4A16 graphs, M=160 / 192 / 256: 6144x4096 39.2 / 40.6 / 41.9 -> 21.8
    / 21.9 / 27.9 (22.5 / 23.7 / 27.8), 4096x4096 31.6 / 31.3 / 27.5 -> 20.9 / 21.3 / 26.7 (19.5 / 19.3 / 22.3),
    4096x14336 split in two 74.2 / 78.1 / 72.4 -> 44.8 / 49.9 / 64.4 (unsplit 61.8 / 65.5 / 74.8; Humming 36.4 / 44.7 /
    54.4); 8192^2 M=256 (session 22) 51.7 -> 51.0. So: split in two at 65-256 rows where K >= 2N and two CTAs a tile fit
    one wave; else 65-128 rows, K >= 2N, or one wave of 64-row tiles. The route takes these tiles also where the
    warp-specialised kernel would not run (`ws_route_tile`); where 193-256 rows fit one wave as two 128-token tiles,
    those (`rs_block_m`). 257-512 rows (4-bit codes, `rs_block_m`): session 28, graphs, the route (dequantize + cuBLAS)
    -> this kernel, µs, W4A16 / MXFP4 / NVFP4, M=384: 4096^2 34.8 / 35.2 / 35.6 -> 31.1 / 33.1 / 38.2, 4096x14336 109.0
    / 107.3 / 112.3 -> 96.5 / 101.6 / 116.3; M=512: 4096^2 35.7 / 37.0 / 37.6 -> 29.0 / 29.1 / 29.1, 4096x14336 126.2 /
    123.1 / 129.2 -> 91.4 / 92.1 / 91.0; session 29, 192-token tiles at 257-384 rows (NVFP4 and 8-bit codes: the route
    -> these; Humming), M=320 / 384: NVFP4 4096^2 30.9 / 37.8 -> 27.5 / 26.9 (27.3 / 30.9), 4096x14336 102.3 / 113.6 ->
    93.0 / 88.2 (63.9 / 83.3); W8A16 4096^2 30.7 / 37.1 -> 28.6 / 27.5 (28.5 / 31.6), 4096x14336 108.3 / 118.6 -> 97.0 /
    92.9 (64.9 / 96.5). 8-bit codes at 385-512 rows (session 29, W8A16 graphs, the route -> 256-token tiles (Humming),
    M=512: 4096^2 39.1 -> 31.7 (37.3), 4096x14336 132.8 -> 100.5 (109.5)). 8-bit codes at 257-RS_BYTE_WIDE_M rows where
    K >= 2N and two CTAs a 64-row tile fit one wave: one 320-token tile split in two along K (session 30, W8A16 graphs,
    4096x14336 M=288 / 320, two 192-token tiles -> this (Humming): 100.4 / 97.9 -> 81.4 / 86.0 (64.7 / 69.4); 4096^2, K
    < 2N, keeps the 192-token tiles: 30.5 / 28.6 vs 45.6 / 46.9)."""
    if bits == 8 and 256 < m <= RS_BYTE_WIDE_M and k >= 2 * n and 2 * cdiv(n, 64) <= num_sms:
        return dict(rs=True, block_m=RS_BYTE_WIDE_M, stages=rs_stages(RS_BYTE_WIDE_M, bits), split_k=RS_SPLIT)
    bm = rs_block_m(m, n, num_sms, bits) if RS_SMALL_MIN_M < m else None  # the frag kernel's decode path below
    if bm is None:
        return None
    tiles = cdiv(n, 64)
    tile = dict(rs=True, block_m=bm, stages=rs_stages(bm, bits))
    if m <= 64:
        if RS_SMALL_MIN_FILL * num_sms <= RS_SPLIT * tiles <= num_sms and k > 128:
            return tile | dict(split_k=RS_SPLIT)  # two CTAs a tile fill one wave (4096-row weights)
        # one filled wave, not long K (4-bit codes; 8-bit ones keep the decode there)
        takes = bits in (2, 3, 4) and RS_SMALL_MIN_FILL * num_sms <= tiles <= num_sms and k < 2 * n
    elif m <= 256 and k >= 2 * n and 2 * tiles * cdiv(m, bm) <= num_sms:  # (256 tokens split: a spill, sm_90a)
        return tile | dict(split_k=RS_SPLIT)
    else:
        takes = k >= 2 * n or (m <= 128 and bits in (2, 3, 4)) or tiles <= num_sms
    return tile if takes else None


RS_ONLY_MAX_M = 256  # weights only this kernel runs: every shape up to here (`rs_only_tile`)


def rs_only_tile(m: int, n: int, k: int, num_sms: int = 132, bits: int = 4) -> dict | None:
    """The tile for weights only this kernel runs among the large-M ones (`rs_int_why_not`: zero points, 3-bit codes,
    scales of the other 16-bit type — the warp-specialised kernel and the frag kernel's 128/256-token tiles do not
    take them, so the alternative above 64 rows is dequantize + cuBLAS): `rs_tile`'s, else its token tile
    (`rs_block_m`) at 65-RS_ONLY_MAX_M rows on every shape, and 3-bit codes from RS_SMALL_MIN_M rows (their decode
    tiles cost more than 4-bit ones'); else None. H200 graphs (tools/probe_ws.py, session 34), uint3 g128 with zero
    points, µs, the route before (frag decode at 64 rows, dequantize + cuBLAS above) -> this kernel (Humming):
    28672x8192 M=64 117.7 -> 102.7 (83.8), M=256 336.5 -> 218.7 (208.8); 8192x28672 M=64 114.3 -> 88.4 (82.2); at 512
    rows dequantize + cuBLAS stays faster (28672x8192 489.3 vs 533.2, 8192^2 140.5 vs 152.3)."""
    tile = rs_tile(m, n, k, num_sms, bits)
    if tile is not None or not (RS_SMALL_MIN_M < m <= RS_ONLY_MAX_M) or (m <= 64 and bits != 3):
        return tile
    bm = rs_block_m(m, n, num_sms, bits)
    return dict(rs=True, block_m=bm, stages=rs_stages(bm, bits))


def rs_parts(m: int, n: int, k: int, num_sms: int = 132, bits: int = 4) -> dict | None:
    """Where a 257-RS_PARTS_MAX_M-row call that `rs_tile` does not take (weights whose 256-token tiles overfill a wave
    at these rows: 6144- and 8192-row, the warp-specialised kernel's or dequantize + cuBLAS's) runs as two launches of
    this kernel: its first RS_HEAD rows on `rs_tile(RS_HEAD)`'s tile (one wave of 256-token tiles on 8192-row
    weights) and the rest on their own tile (`rs_tile`, else the fewest tokens holding them, at least 64), so the last
    rows do not pay a whole tile's MMA work or a second wave: dict(rs=True, parts=((rows, tile), (rows, tile))), else
    None. H200 graphs, session 29 (`probe_toggle.py --switch rs-parts`), µs, the route -> two launches, M=288 / 384 /
    512: W4A16 8192^2 117.1 / 102.6 / 108.5 -> 86.3 / 87.2 / 109.2, 8192x28672 394.6 / 354.8 / 373.8 -> 278.1 / 307.4 /
    376.6, 6144x4096 48.4 / 48.2 / 55.8 -> 44.6 / 44.9 / 55.7; W8A16 8192^2 125.5 / 118.8 / 118.4 -> 95.5 / 103.9 /
    126.6, 8192x28672 470.5 / 394.7 / 422.0 -> 327.8 / 342.2 / 426.0; NVFP4 8192^2 117.7 / 106.4 / 110.1 -> 87.7 /
    95.5 / 110.4 — so up to 384 rows (at 512 the two halves are the same tiles the route's one launch runs).
    ANYBIT_FRAG_RS_PARTS=0 turns it off."""
    if not (RS_HEAD < m <= RS_PARTS_MAX_M) or rs_tile(m, n, k, num_sms, bits) is not None:
        return None
    head = rs_tile(RS_HEAD, n, k, num_sms, bits)
    if head is None:
        return None
    r = m - RS_HEAD
    bm = max(64, swap_block_m(r))
    tail = rs_tile(r, n, k, num_sms, bits) or dict(rs=True, block_m=bm, stages=rs_stages(bm, bits))
    return dict(rs=True, parts=((RS_HEAD, head), (r, tail)))


def rs_token_parts(block_m: int, bits: int) -> tuple[int, int]:
    """A tile's tokens as the kernel's two power-of-two parts (`frag_ws.swap_parts`: 16-256 tokens, 96 = 64 + 32), and
    for 8-bit codes also 256 + 16 / 32 / 64 (272-320 tokens: their x ring keeps 64-K slices, so 5 slots of 320 tokens
    fit in shared memory, sm_90a 168 registers, no spill; 4-bit codes keep both 64-K halves of a 128-K block a slot,
    and 3 slots of 288 tokens would need 234 KB); (0, 0) for any other block_m."""
    if bits == 8 and block_m - 256 in (16, 32, 64):
        return 256, block_m - 256
    return swap_parts(block_m)


def gemm_frag_rs(x: torch.Tensor, tw, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                 block_m: int = 128, stages: int | None = None, group_m: int = 8, mma_regs: int = 232,
                 x_scales: torch.Tensor | None = None, diag: int = 0, split_k: int = 1, workspace=None,
                 counters=None) -> torch.Tensor:  # fmt: skip
    """y [M, N] = x [M, K] @ dequantize(W)^T (* x_scales, fp32 [M, 1]: x holding FP8 codes, `codes_a16` weights)
    (+ bias) in x's dtype, 64 weight rows by block_m tokens a CTA (a power of two or the sum of two, 16-256, 8-bit
    codes also 272-320: `rs_token_parts`; 96 = 64 + 32 into two accumulators), two MMA warpgroups taking alternate
    128-K blocks (8-bit codes: 64-K). stages: ring slots, at least RS_MIN_STAGES (default `rs_stages`). diag=1
    (timing only, wrong results): the words as the operand without decoding.
    split_k: CTAs a tile, each a share of the K blocks (every share non-empty), summed by the last to finish through
    `workspace` (fp32, >= split_k * M * N) and zeroed int32 `counters` (>= the tiles; left zero for the next call) —
    the Triton backend's shared ones when not given. x: contiguous bf16/fp16 [M, K]; the weight one `frag_rs_why_not`
    accepts (the caller checks)."""
    key = ("rs", block_m, stages, group_m, mma_regs, diag, split_k, x.dtype, bias is None, x_scales is None)
    launch = tw.launches.get(key)
    if launch is None:
        launch = tw.launches[key] = _rs_launch(tw, key)
    y, operands = rs_operands(x, tw, bias, out, block_m, x_scales)
    m, n = x.shape[0], tw.n
    tiles = cdiv(m, block_m) * cdiv(n, 64)
    if split_k > 1 and (workspace is None or counters is None):  # the Triton backend's, shared by every call
        from anybit.backends import get_backend

        workspace, counters = get_backend("triton").workspace(x.device, split_k * m * n, tiles)
    if split_k > 1:
        if workspace.numel() < split_k * m * n or counters.numel() < tiles:
            raise ValueError(f"split_k={split_k} needs a workspace of >= {split_k * m * n} floats and >= {tiles} "
                             f"counters, got {workspace.numel()} and {counters.numel()}")  # fmt: skip
    launch((tiles, split_k), *operands, y, workspace if split_k > 1 else y, counters if split_k > 1 else y, m, n,
           tw.k, tw.planes[0].shape[-1] // 16, y.stride(0))  # fmt: skip
    return y


def rs_operands(x: torch.Tensor, tw, bias: torch.Tensor | None, out: torch.Tensor | None, block_m: int,
                x_scales: torch.Tensor | None) -> tuple[torch.Tensor, tuple]:  # fmt: skip
    """y, and the register-operand kernels' first arguments: x's descriptors (two token parts, `rs_token_parts`),
    the weight's words / scales / zero points, x's row scales, the global scale and bias (y where absent)."""
    y = call_output(x, tw, bias, out)
    bm1, bm2 = rs_token_parts(block_m, tw.fmt["W_BITS"])
    x1 = x_desc(x, bm1)
    gs = tw.global_scale
    return y, (x1, x_desc(x, bm2) if bm2 else x1, *int_descs(tw, x.dtype, 64), row_scales(x_scales, x.shape[0], y),
               gs if gs is not None else y, bias if bias is not None else y)  # fmt: skip


# the arguments of `frag_rs_kernel` a call changes: x's descriptors, x's row scales, y (also standing in for what is
# absent), bias, workspace, counters, M, y's row stride
_RS_LIVE = (0, 1, 5, 6, 7, 8, 9, 10, 11, 15)


def _rs_launch(tw, key: tuple) -> Launcher:
    """The `Launcher` of `gemm_frag_rs` calls with this key (tile, x's dtype, flags), after the checks they alone
    decide: worked out once per weight (an eager call's host time)."""
    _, block_m, stages, group_m, mma_regs, diag, split_k, _, no_bias, no_xs = key
    consts = rs_consts(tw, block_m, stages, mma_regs)
    block_k = rs_block_k(tw.fmt["W_BITS"])
    blocks = cdiv(tw.k, block_k)
    if split_k < 1 or (split_k - 1) * cdiv(blocks, split_k) >= blocks:
        most = max(s for s in range(1, blocks + 1) if (s - 1) * cdiv(blocks, s) < blocks)
        raise ValueError(f"split_k={split_k}: K={tw.k} has {blocks} blocks of {block_k}, so split_k must leave each "
                         f"split some (1 to {most})")  # fmt: skip
    from anybit.kernels.frag_rs_kernel import frag_rs_kernel

    consts |= dict(GROUP_M=group_m, HAS_BIAS=not no_bias, ROW_SCALES=not no_xs, DIAG=int(diag), SPLIT=split_k)
    return Launcher(frag_rs_kernel, consts, _RS_LIVE)


def rs_consts(tw, block_m: int, stages: int | None, mma_regs: int) -> dict:
    """The constexprs of a register-operand kernel launch (`frag_rs_kernel`, `moe_rs_kernel`) that the weight and
    the tile decide, after checking the tile: block_m (`rs_token_parts`) and stages (at least RS_MIN_STAGES; default
    `rs_stages`)."""
    bits = tw.fmt["W_BITS"]
    bm1, bm2 = rs_token_parts(block_m, bits)
    if bm1 < 16:
        raise ValueError(f"block_m must be a power of two or the sum of two, from 16 up to 256 tokens (8-bit codes: "
                         f"also 256 + 16, 32 or 64), got {block_m}")  # fmt: skip
    stages = stages or rs_stages(block_m, bits)
    if stages < RS_MIN_STAGES:
        raise ValueError(f"stages={stages} (block_m={block_m}): the ring needs at least {RS_MIN_STAGES} slots (a "
                         "warpgroup reads its next block's words while its block holds a slot; 2 hang), and 3 slots "
                         "of x fit up to 256 tokens")  # fmt: skip
    return dict(
        STAGES=stages, SCALE_PER_BLOCK=tw.group_k < tw.k, GB=max(1, tw.group_k // frag_block_k(bits)),
        SIGNED=bool(tw.fmt["W_SIGNED"]), PANEL=FRAG_PANEL, MMA_REGS=mma_regs,
        E2M1=tw.fmt["SCALE_KIND"] if tw.fmt["W_FLOAT"] else 0, HAS_GS=tw.global_scale is not None, TWO=bm2 > 0,
        W8=bits == 8, W3=bits == 3, W2=bits == 2, ZP=bool(tw.fmt["ZP"]), num_warps=4,
    )  # fmt: skip
