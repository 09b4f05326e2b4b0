"""Dynamic FP8 activation quantization on the GPU, matching `anybit.quant.activations` bit for bit:
scale = max(amax / qmax, 1 / (qmax·512)), xq = saturate(x / scale) rounded to nearest even.

One program per row (a decode row over several, `split_chunk`). Up to WIDE_MAX_M rows (decode: a row per
SM at most) a row of up to WIDE_MAX_K values is read in one step and held in registers (up to 16 warps):
the GEMM after it waits for the whole grid, and a row walked 4096 (per group 1024) columns at a time is
a chain of dependent loads in one CTA. More rows: per token, rows up to ROWS_MAX_K long (without block sums or
blockwise scales) by `_quant_rows_kernel`, held whole, and per group rows up to ROWS_GROUP_MAX_K whose length is a
power of two; else rows up to 4096 long are loaded once (amax,
scale, cast from registers), longer ones twice, 4096 at a time (the second read mostly from L2); per
group, 1024 columns at a time, each group's amax, scale and cast in one pass. H200, M=4096
(`tools/probe_blockwise.py --parts`): per token K=4096/8192/14336 30/39/73 µs (a 16384-wide one-pass
row: 183 µs at K=14336, one CTA per SM); per group 37/34/56 µs (one group per step: 55/106/180). Static:
the calibrated scale is read from memory and written out per row, so the GEMM treats it as a per-token
scale. No host synchronisation (CUDA-graph safe); the activations' finiteness is the caller's contract
here (the reference path checks it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from anybit.formats.scheme import ActMode, ActSpec
from anybit.kernels.dequant import cdiv, next_pow2
from anybit.kernels.launch import Launcher
from anybit.quant.activations import act_qmax, act_storage_dtype, min_act_scale

WIDE_MAX_M = 128  # up to this many rows, a row is read in one step (`quantize_act`)
WIDE_MAX_K = 32768  # ... when it is at most this long (64 fp32 values a thread at 16 warps)
# Longer rows per group of columns: this many columns a step. A program has one step's loads in flight and a step
# waits for them, so the bytes in flight per SM — what an M=4096 call's bandwidth rests on (H200: 34-56 µs at
# K=4096-14336, 1.4-3.1 TB/s) — grow with it. sm_90a (8 warps, groups of 128): 1024 columns one LDG.E.64 a thread,
# 30 registers (8 CTAs an SM: 16 KB in flight); 4096 two LDG.E.128, 40 registers (6 CTAs: 48 KB) — that is
# `tools/probe_toggle.py --switch quant-group-block`'s "on", not yet measured on the GPU.
GROUP_BLOCK = 1024
# Up to this many rows (and K > SPLIT_CHUNK) several programs share a row, each casting SPLIT_CHUNK columns
# (`split_chunk`): a decode row is one CTA's chain of loads otherwise (H200: 3.3 µs at K=8192, 7.7 at 28672, which
# the FP8 decode GEMM waits for). Per token each program reads the whole row for its amax (from L2): no split when
# those extra reads pass SPLIT_MAX_REREAD bytes. H200, CUDA graphs, 8192x8192 / 8192x28672 (`tools/probe_toggle.py
# --switch quant-split`): 3-7 % faster at M=1/16/64 (FP8-block, per token up to 16 rows of 28672), 9-10 % slower
# per token at M=64 K=28672 (48 MB re-read); with the early launch (`pdl`) more than 4 programs were slower too.
SPLIT_MAX_M = 64
SPLIT_CHUNK = 2048
SPLIT_MAX_REREAD = 16 << 20
SPLIT_MAX_EARLY_PROGRAMS = 4
# Per-token rows past the decode (> WIDE_MAX_M rows) up to this long: `_quant_rows_kernel`, one row a program held
# whole, ROWS_WARPS warps. H200 graphs (tools/probe_quant_rows.py, session 32), µs, `_quant_act_kernel` -> this, M=1024
# / 4096: K=4096 6.7 / 18.8 -> 6.2 / 15.9, K=7168 14.4 / 41.4 -> 13.2 / 38.5, K=8192 10.8 / 34.0 -> 9.3 / 29.3;
# K=14336 22.8 / 70.3 vs 23.0 / 74.4 (kept); two to eight rows a program were slower (K=7168 M=4096 66.4-97.5).
ROWS_MAX_K = 8192
ROWS_WARPS = 8
# The same for per-group scales, where K is a power of two (no padded columns): H200 graphs (`tools/probe_quant_rows.py
# --scheme fp8-block`, session 33, 8 warps), µs, `_quant_act_kernel` -> this, M=1024 / 4096: K=4096 6.3 / 21.0 -> 6.0 /
# 15.3, K=8192 11.1 / 39.6 -> 9.5 / 30.4; K=7168 (padded to 8192) 9.9 / 34.8 -> 12.9 / 42.0 and K=14336 kept.
ROWS_GROUP_MAX_K = 8192


@triton.jit
def _codes(y, q_ptr, CODES16: tl.constexpr, E5M2: tl.constexpr):
    """Scaled values y (fp32) as q_ptr stores them: FP8 rounded (CODES16: the FP8 value, then in bf16/fp16)."""
    if CODES16:
        if E5M2:
            return y.to(tl.float8e5).to(q_ptr.dtype.element_ty)
        return y.to(tl.float8e4nv).to(q_ptr.dtype.element_ty)
    return y.to(q_ptr.dtype.element_ty)


@triton.jit
def _quant_act_kernel(
    x_ptr, q_ptr, s_ptr, sum_ptr, K, stride_xm, stride_qm, stride_sm, stride_sum, QMAX: tl.constexpr,
    MIN_SCALE: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr, SUMS: tl.constexpr = False,
    ONE_PASS: tl.constexpr = False, PDL: tl.constexpr = False, stride_sg=1, COLS: tl.constexpr = 1,
    CODES16: tl.constexpr = False, E5M2: tl.constexpr = False, CHUNK: tl.constexpr = 0,
):  # fmt: skip
    """GROUP == 0: one scale per row (s_ptr [M, 1]; COLS > 1: written to each of the K/128 columns, COLS
    their power-of-two bound); GROUP == -1: the static scale at s_ptr[M] (read, copied to each row's
    s_ptr [M, 1]); else one per GROUP columns (s_ptr [M, K/GROUP]), BLOCK a multiple of GROUP (BLOCK //
    GROUP groups per step). Scale columns are stride_sg apart (M-major for cuBLAS: 1x128 x scales).
    ONE_PASS (K <= BLOCK): the row is read once and kept in registers, else per token it is read twice
    (amax, then cast).
    SUMS (GROUP <= 0, BLOCK a multiple of 128): also the sum of each 128-K block's quantized values,
    fp32 at sum_ptr [K/128 blocks, M] (the FP8 fragment kernel's zero-point term, `gemm_frag`).
    CODES16: q_ptr is bf16/fp16 and holds the FP8 codes (e4m3, E5M2: e5m2) exactly.
    CHUNK > 0 (a multiple of 128, of BLOCK for groups): program (row, c) casts columns [c * CHUNK, (c + 1) * CHUNK)
    only; per token each of a row's programs takes the row's amax itself (its other reads hit L2), the first
    writes the scale."""
    if PDL:  # the GEMM that reads xq may launch now (it waits for this grid before reading)
        gdc_launch_dependents()
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_xm
    q_row = q_ptr + row * stride_qm
    CAST: tl.constexpr = CHUNK if CHUNK > 0 and GROUP <= 0 else BLOCK  # columns a cast step
    offs_c = tl.arange(0, CAST)
    if CHUNK > 0:
        k_lo = tl.program_id(1) * CHUNK
        k_hi = tl.minimum(k_lo + CHUNK, K)
    else:
        k_lo = 0
        k_hi = K
    if GROUP <= 0:
        xdt = x_ptr.dtype.element_ty  # held as loaded: half the registers of fp32 (a 32768-long row, 16 warps)
        x = tl.zeros((BLOCK,), dtype=xdt)
        if GROUP == 0:
            amax = tl.zeros((BLOCK,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK):
                x = tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0)
                amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
            scale = tl.maximum(tl.max(amax, axis=0) / QMAX, MIN_SCALE)
        else:
            scale = tl.load(s_ptr + tl.num_programs(0) * stride_sm)
        if k_lo == 0:  # the row's first program writes its scale
            if COLS == 1:
                tl.store(s_ptr + row * stride_sm, scale)
            else:
                c = tl.arange(0, COLS)
                tl.store(s_ptr + row * stride_sm + c * stride_sg, tl.zeros((COLS,), tl.float32) + scale,
                         mask=c < K // 128)  # fmt: skip
        for k0 in range(k_lo, k_hi, CAST):
            if ONE_PASS and GROUP == 0 and CHUNK == 0:
                xc = x
            else:
                xc = tl.load(x_row + k0 + offs_c, mask=k0 + offs_c < K, other=0.0)
            y = _codes(tl.clamp(tl.math.div_rn(xc.to(tl.float32), scale), -QMAX, QMAX), q_ptr, CODES16, E5M2)
            tl.store(q_row + k0 + offs_c, y, mask=k0 + offs_c < K)
            if SUMS:
                blk = k0 // 128 + tl.arange(0, CAST // 128)
                sums = tl.sum(tl.reshape(y.to(tl.float32), (CAST // 128, 128)), axis=1)
                tl.store(sum_ptr + blk * stride_sum + row, sums, mask=blk * 128 < K)
    else:
        GB: tl.constexpr = BLOCK // GROUP
        for k0 in range(k_lo, k_hi, BLOCK):
            x = tl.reshape(tl.load(x_row + k0 + offs, mask=k0 + offs < K, other=0.0).to(tl.float32), (GB, GROUP))
            scale = tl.maximum(tl.max(tl.abs(x), axis=1) / QMAX, MIN_SCALE)
            g = k0 // GROUP + tl.arange(0, GB)
            tl.store(s_ptr + row * stride_sm + g * stride_sg, scale, mask=g < K // GROUP)
            y = tl.reshape(tl.clamp(tl.math.div_rn(x, scale[:, None]), -QMAX, QMAX), (BLOCK,))
            tl.store(q_row + k0 + offs, _codes(y, q_ptr, CODES16, E5M2), mask=k0 + offs < K)


@triton.jit
def _quant_rows_kernel(
    x_ptr, q_ptr, s_ptr, M, K, stride_xm, stride_qm, stride_sm, QMAX: tl.constexpr, MIN_SCALE: tl.constexpr,
    ROWS: tl.constexpr, BLOCK: tl.constexpr, CODES16: tl.constexpr = False, E5M2: tl.constexpr = False,
    PDL: tl.constexpr = False, GROUP: tl.constexpr = 0, stride_sg=1,
):  # fmt: skip
    """ROWS rows a program, each row (K <= BLOCK) loaded once and held: every load of the program in flight at once.
    GROUP 0: one scale a row (s_ptr [M, 1]); else one a GROUP columns (s_ptr [M, K/GROUP], columns stride_sg apart:
    M-major for cuBLAS's 1x128 x scales). CODES16 as in `_quant_act_kernel`; the same operations per value, so the
    same bits. One per-token row a program is the route (`ROWS_MAX_K`); more rows measured slower."""
    if PDL:  # the GEMM that reads xq may launch now (it waits for this grid before reading)
        gdc_launch_dependents()
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < M)[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask, other=0.0)  # as loaded
    if GROUP == 0:
        scale = tl.maximum(tl.max(tl.abs(x.to(tl.float32)), axis=1) / QMAX, MIN_SCALE)
        tl.store(s_ptr + rows * stride_sm, scale, mask=rows < M)
        y = tl.clamp(tl.math.div_rn(x.to(tl.float32), scale[:, None]), -QMAX, QMAX)
    else:
        G: tl.constexpr = BLOCK // GROUP
        xg = tl.reshape(x, (ROWS, G, GROUP))
        scale = tl.maximum(tl.max(tl.abs(xg.to(tl.float32)), axis=2) / QMAX, MIN_SCALE)  # [ROWS, G]
        g = tl.arange(0, G)
        smask = (rows < M)[:, None] & (g < K // GROUP)[None, :]
        tl.store(s_ptr + rows[:, None] * stride_sm + g[None, :] * stride_sg, scale, mask=smask)
        y = tl.reshape(tl.clamp(tl.math.div_rn(xg.to(tl.float32), scale[:, :, None]), -QMAX, QMAX), (ROWS, BLOCK))
    tl.store(q_ptr + rows[:, None].to(tl.int64) * stride_qm + cols[None, :], _codes(y, q_ptr, CODES16, E5M2), mask=mask)


# both quantizers' launchers by their constexprs (and stride_sg, a parameter among them: 1, or M for blockwise
# scales); `quantize_rows`' keys start with "rows"
_LAUNCHES: dict = {}


def quantize_rows(
    x: torch.Tensor, spec: ActSpec, rows: int, num_warps: int, pdl: bool = False,
    codes_dtype: torch.dtype | None = None, blockwise: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """`quantize_act` of a per-token or per-group spec (K a multiple of the group) by `_quant_rows_kernel` (`rows`
    rows a program): (xq [M, K], scales fp32 [M, 1] or [M, K/g]; blockwise: per-group scales M-major, as
    `quantize_act`'s), the same bits."""
    m, k = x.shape
    group = spec.group if spec.mode is ActMode.GROUP else 0
    if spec.mode not in (ActMode.TOKEN, ActMode.GROUP) or k % max(group, 1) or (blockwise and group != 128):
        raise ValueError(f"quantize_rows takes per-token or per-group activation scales (K={k} a multiple of the "
                         f"group; blockwise: groups of 128), not {spec}")  # fmt: skip
    xq = torch.empty((m, k), device=x.device, dtype=codes_dtype or act_storage_dtype(spec))
    cols = k // group if group else 1
    scales = torch.empty((cols, m) if blockwise else (m, cols), device=x.device, dtype=torch.float32)
    stride_sm, stride_sg = (1, m) if blockwise else (scales.stride(0), 1)
    if m:
        consts = dict(
            QMAX=act_qmax(spec), MIN_SCALE=min_act_scale(spec), ROWS=rows, BLOCK=max(next_pow2(k), group),
            CODES16=codes_dtype is not None, E5M2=spec.dtype.name == "e5m2", PDL=pdl, GROUP=group, stride_sg=stride_sg,
            num_warps=num_warps,
        )  # fmt: skip
        key = ("rows", *consts.values())
        launch = _LAUNCHES.get(key)
        if launch is None:
            launch = _LAUNCHES[key] = Launcher(_quant_rows_kernel, consts, live=tuple(range(8)))
        launch((cdiv(m, rows),), x, xq, scales, m, k, x.stride(0), xq.stride(0), stride_sm)
    return xq, scales.t() if blockwise else scales


def split_chunk(m: int, k: int, group: int, pdl: bool, itemsize: int = 2) -> int:
    """Columns a program casts when several share a row (0: one program a row). group as the kernel's GROUP
    (0 per token, -1 static, else the group); pdl: the GEMM after it launches early (`quantize_act(pdl=True)`)."""
    if m > SPLIT_MAX_M or k <= SPLIT_CHUNK or (group > 0 and SPLIT_CHUNK % group):
        return 0
    programs = cdiv(k, SPLIT_CHUNK)
    if group == 0 and (programs - 1) * m * k * itemsize > SPLIT_MAX_REREAD:
        return 0
    if pdl and m * programs > SPLIT_MAX_EARLY_PROGRAMS:
        return 0
    return SPLIT_CHUNK


def quantize_act(
    x: torch.Tensor, spec: ActSpec, static_scale: torch.Tensor | None = None, block_sums: bool = False,
    pdl: bool = False, blockwise: bool = False, codes_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """x [M, K] bf16/fp16 (last dim contiguous) -> (xq [M, K] fp8, scales fp32 [M, 1] or [M, K/g]);
    FP8 specs per token, per group or static (`static_scale`: fp32 [] tensor on x's device).
    block_sums (per-token or static specs): also fp32 [ceil(K/128), M], the sum of each row's quantized
    values over each 128-K block (the FP8 fragment kernel subtracts bias times it; `gemm_frag`).
    pdl: the next kernel is a programmatic dependent (`gemm_frag(pdl=True)`) and may launch at once.
    blockwise (per token or per 128 columns, K a multiple of 128): scales [M, K/128] M-major (strides
    (1, M); per-token scales repeated per 128 columns) — the 1x128 x scales cuBLAS's block-scaled GEMM
    reads, written by the quantizer itself (no transposing copy). codes_dtype (bf16/fp16): xq holds the FP8 codes
    in that dtype instead, exactly (`codes_a16` weights: the A16 kernels multiply them)."""
    m, k = x.shape
    if codes_dtype not in (None, torch.bfloat16, torch.float16):
        raise ValueError(f"codes_dtype must be torch.bfloat16 or torch.float16 (or None: FP8), got {codes_dtype}")
    if m > WIDE_MAX_M and not block_sums:  # past the decode: whole rows a program (`_quant_rows_kernel`) where measured
        if spec.mode is ActMode.TOKEN and k <= ROWS_MAX_K and not blockwise:
            return quantize_rows(x, spec, 1, ROWS_WARPS, pdl, codes_dtype)
        if spec.mode is ActMode.GROUP and k <= ROWS_GROUP_MAX_K and k == next_pow2(k) and k % spec.group == 0:
            return quantize_rows(x, spec, 1, ROWS_WARPS, pdl, codes_dtype, blockwise)
    xq = torch.empty((m, k), device=x.device, dtype=codes_dtype or act_storage_dtype(spec))
    if blockwise and (k % 128 or block_sums or not (spec.mode is ActMode.TOKEN or spec.group == 128)):
        raise ValueError(f"blockwise scales take K % 128 == 0 (K={k}) and per-token or 128-column {spec}")
    wide = m <= WIDE_MAX_M and k <= WIDE_MAX_K  # the whole row in one step
    if spec.mode is ActMode.GROUP:
        if block_sums:
            raise ValueError(f"block sums come with per-token or static activation scales, not {spec}")
        block = max(next_pow2(k) if wide else min(next_pow2(k), GROUP_BLOCK), spec.group)
        group, cols = spec.group, k // spec.group
    else:  # rows up to 4096 (decode: WIDE_MAX_K) are held in registers (one read), longer rows are read twice
        block = max(next_pow2(k) if wide else min(next_pow2(k), 4096), 128 if block_sums else 1)
        group, cols = (0 if spec.mode is ActMode.TOKEN else -1), 1
    if blockwise:  # [K/128, M] written M-major: the view returned is [M, K/128] with strides (1, M)
        scales = torch.empty((k // 128, m), device=x.device, dtype=torch.float32)
        stride_sm, stride_sg, expand = 1, m, 1 if group else next_pow2(k // 128)
    else:  # static: one more row holds the calibrated scale the kernel reads (no host synchronisation)
        scales = torch.empty((m + (group == -1), cols), device=x.device, dtype=torch.float32)
        stride_sm, stride_sg, expand = scales.stride(0), 1, 1
        if group == -1:
            scales[m] = static_scale
    sums = torch.empty((cdiv(k, 128), m), device=x.device, dtype=torch.float32) if block_sums else scales
    chunk = split_chunk(m, k, group, pdl, x.element_size())
    if chunk and group > 0:
        block = chunk
    if m:
        consts = dict(
            QMAX=act_qmax(spec), MIN_SCALE=min_act_scale(spec), GROUP=group, BLOCK=block, SUMS=block_sums,
            ONE_PASS=k <= block, PDL=pdl, stride_sg=stride_sg, COLS=expand, CODES16=codes_dtype is not None,
            E5M2=spec.dtype.name == "e5m2", CHUNK=chunk,
            num_warps=8 if k > block else min(16, max(4, block // 1024)),
        )  # fmt: skip
        key = tuple(consts.values())
        launch = _LAUNCHES.get(key)
        if launch is None:
            launch = _LAUNCHES[key] = Launcher(_quant_act_kernel, consts, live=tuple(range(9)))
        launch((m, cdiv(k, chunk) if chunk else 1), x, xq, scales, sums, k, x.stride(0), xq.stride(0), stride_sm,
               sums.stride(0))  # fmt: skip
    if blockwise:
        return xq, scales.t()
    return (xq, scales[:m], sums) if block_sums else (xq, scales[:m])
