"""The one-pass dequantizer of fragment-layout weights (`anybit.kernels.frag`): W [N, K] in bf16/fp16 for
the large-M dequantize-then-cuBLAS path, or, for weights packed for the FP8 MMA (W4A8), their unscaled
integers in e4m3 for cuBLAS's block-scaled FP8 GEMM (`anybit.backends.blockscaled`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from anybit.kernels.dequant import cdiv, load_scale
from anybit.kernels.frag import code_offset, frag3_units, frag3_words, frag_constexprs, frag_ptx, frag_row_words
from anybit.kernels.frag_decode import unpack_a8, unpack_bytes, unpack_e2m1, unpack_e2m1_a8, unpack_pairs, unpack_pairs2
from anybit.kernels.frag_layout import FRAG_PANEL, frag_block_k, frag_mask
from anybit.kernels.launch import Launcher


# fmt: off
@triton.jit(do_not_specialize=["MASK"])
def _frag_dequant_kernel(w_ptr, s_ptr, z_ptr, gs_ptr, out_ptr, N, K, stride_wn, stride_s, MASK,
                         W_BITS: tl.constexpr, W_FLOAT: tl.constexpr, SCALE_KIND: tl.constexpr, S_EXP: tl.constexpr,
                         S_MAN: tl.constexpr, ZP: tl.constexpr, W_SIGNED: tl.constexpr, GROUP_K: tl.constexpr,
                         GROUP_N: tl.constexpr, HAS_GS: tl.constexpr, BN: tl.constexpr, PANEL: tl.constexpr,
                         CODES: tl.constexpr = False, PTX: tl.constexpr = 0):
    """W [N, K] in out's dtype, one block (128 K, 2-bit: 256) per program column (large M: then cuBLAS).
    CODES (FP8-MMA order, out e4m3): the integers q - bias - z unscaled, for a block-scaled FP8 GEMM; e2m1 (`s_ptr`:
    row-relative codes) times 2**(r + E2M1_A8_SHIFT) a group, for the row-wise one. Scaled
    values into e4m3 (MXFP4 with row-relative scales, `e2m1_row_scales`) round to nearest: exact there."""
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    kt = tl.program_id(1)
    mask_n = offs_n < N
    if out_ptr.dtype.element_ty.primitive_bitwidth == 8:  # e4m3 out: decode through fp16 (exact for 4-bit codes)
        dtype: tl.constexpr = tl.float16
    else:
        dtype: tl.constexpr = out_ptr.dtype.element_ty
    KB: tl.constexpr = 128 if W_BITS == 3 else 512 // W_BITS  # K per block: 16 words per row (3 bits: 12)
    WSTEP: tl.constexpr = 16 * PANEL
    w_ptrs = w_ptr + frag_row_words(offs_n, stride_wn, PANEL)[:, None] + tl.arange(0, 16)[None, :]
    if W_BITS == 3:  # block kt's 4-bit words from its low and high units (`pack_frag3`)
        lo, hi = frag3_units(w_ptrs, kt, K, mask_n, PANEL)
        p = frag3_words(lo, hi, kt)
    else:
        p = tl.load(w_ptrs + kt * WSTEP, mask=mask_n[:, None], other=0)
    G: tl.constexpr = KB // GROUP_K if GROUP_K < KB else 1  # scale groups per block
    rows = tl.minimum((kt * KB) // GROUP_K + tl.arange(0, G), K // GROUP_K - 1)
    if CODES and W_FLOAT:  # e2m1 for the FP8 MMA: e4m3 by its groups' tables (row-relative codes, `unpack_e2m1_a8`)
        c = tl.load(s_ptr + rows[None, :] * stride_s + offs_n[:, None], mask=mask_n[:, None], other=0)
        q = unpack_e2m1_a8(p, c, BN, PTX)  # stored as it is
    elif CODES:
        q = unpack_a8(p, BN, MASK).to(tl.float32) * 512.0 - (8.0 if W_SIGNED else 0.0)  # bytes read as q * 2**-9
    elif W_FLOAT:
        q = unpack_e2m1(p, BN, MASK, dtype).to(tl.float32)
    elif W_BITS == 8:
        q = unpack_bytes(p, BN, MASK, code_offset(dtype, W_BITS, W_SIGNED), tl.float32)
    else:
        off = code_offset(dtype, W_BITS, W_SIGNED)
        if W_BITS == 2:
            ql0, ql1 = tl.split(tl.reshape(p, (BN, 4, 2, 2)))  # word 4t + q, q = 2a + b: split b, then a
            p0, p2 = tl.split(ql0)
            p1, p3 = tl.split(ql1)
            even = tl.join(unpack_pairs2(p0, BN, MASK, dtype), unpack_pairs2(p2, BN, MASK, dtype))  # [BN, 64, a]
            odd = tl.join(unpack_pairs2(p1, BN, MASK, dtype), unpack_pairs2(p3, BN, MASK, dtype))
            q = tl.reshape(tl.permute(tl.join(even, odd), (0, 2, 3, 1)), (BN, 256)).to(tl.float32) - off
        else:
            q = unpack_pairs(p, BN, MASK, dtype).to(tl.float32) - off
    if ZP != 0:
        z = tl.load(z_ptr + rows[None, :] * stride_s + (offs_n // GROUP_N)[:, None], mask=mask_n[:, None], other=0)
        q = tl.reshape(tl.reshape(q, (BN, G, KB // G)) - z.to(tl.float32)[:, :, None], (BN, KB))
    if CODES:
        w = q
    else:
        s = load_scale(s_ptr, rows[None, :], (offs_n // GROUP_N)[:, None], mask_n[:, None], stride_s, SCALE_KIND,
                       S_EXP, S_MAN)
        w = tl.reshape(tl.reshape(q, (BN, G, KB // G)) * s[:, :, None], (BN, KB))
        if HAS_GS:
            w = w * tl.load(gs_ptr)
    offs_k = kt * KB + tl.arange(0, KB)
    tl.store(out_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :], w.to(out_ptr.dtype.element_ty),
             mask=mask_n[:, None] & (offs_k < K)[None, :])
# fmt: on


def dequantize_frag(tw, *, dtype: torch.dtype, block_n: int = 64, scales: torch.Tensor | None = None) -> torch.Tensor:
    """A fragment-layout weight -> W [N, K] in `dtype` (values of `QuantizedWeight.dequantize()`
    rounded once). Weights packed for the FP8 MMA (W4A8) give their unscaled integers q - z instead, in
    e4m3 (`dtype` must be torch.float8_e4m3fn; exact for 4-bit codes), for a block-scaled FP8 GEMM; MXFP4 packed
    for it (`TritonWeight.e2m1_a8`) its e4m3 values relative to each row (times `rowwise[1]` they are W).
    scales: others in the layout and dtype of `tw.scales` (the row-relative ue8m0 codes of `e2m1_row_scales`)."""
    codes = tw.mma_a8
    if codes and dtype != torch.float8_e4m3fn:
        raise ValueError(f"{tw.scheme} is packed for the FP8 MMA: its codes dequantize to float8_e4m3fn, not {dtype}")
    if tw.e2m1_a8 and scales is not None and scales.data_ptr() != tw.scales.data_ptr():
        raise ValueError(f"{tw.scheme} is packed for the FP8 MMA by its row-relative scales (`rowwise`): no others")
    scales = tw.scales if scales is None else scales
    if scales.shape != tw.scales.shape or scales.dtype != tw.scales.dtype:
        raise ValueError(f"scales must be {tw.scales.dtype} {tuple(tw.scales.shape)} like the weight's, got "
                         f"{scales.dtype} {tuple(scales.shape)}")  # fmt: skip
    out = torch.empty((tw.n, tw.k), device=tw.scales.device, dtype=dtype)
    key = ("dequant", dtype, block_n, frag_ptx())
    launch = tw.launches.get(key)
    if launch is None:
        consts = dict(
            frag_constexprs(tw), GROUP_K=min(tw.group_k, tw.k), GROUP_N=tw.group_n, HAS_GS=tw.global_scale is not None,
            BN=block_n, PANEL=FRAG_PANEL, CODES=codes, PTX=key[-1], num_warps=4,
        )  # fmt: skip
        launch = tw.launches[key] = Launcher(_frag_dequant_kernel, consts, live=(1, 2, 3, 4, 8))  # scales, out
    dummy = scales
    # fmt: off
    launch(
        (cdiv(tw.n, block_n), cdiv(tw.k, frag_block_k(tw.fmt["W_BITS"]))), tw.planes[0], scales,
        tw.zeros if tw.zeros is not None else dummy, tw.global_scale if tw.global_scale is not None else dummy, out,
        tw.n, tw.k, tw.planes[0].stride(-2), scales.stride(-2), frag_mask(tw.fmt["W_BITS"]),
    )
    # fmt: on
    return out
