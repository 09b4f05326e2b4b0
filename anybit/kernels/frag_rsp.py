"""Host side of the persistent register-operand kernel (`frag_rsp_kernel`, work in progress: compiled for sm_90a,
not yet run on a GPU, on no route)."""

from __future__ import annotations

import torch

from anybit.kernels.dequant import cdiv
from anybit.kernels.frag_rs import _SMEM, RS_MAX_STAGES, RS_MIN_STAGES, rs_consts, rs_token_parts
from anybit.kernels.frag_ws import call_output, int_descs, row_scales, x_desc


def rsp_stages(block_m: int, bits: int = 4) -> int:
    """`frag_rs.rs_stages` less the partial products' own buffer (64 x block_m fp32)."""
    words = 8192 if bits == 3 else 4096
    return min(RS_MAX_STAGES, (_SMEM - 256 * block_m) // (words + 1024 + block_m * 256))


def gemm_frag_rsp(x: torch.Tensor, tw, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                  block_m: int = 128, stages: int | None = None, group_m: int = 8, mma_regs: int = 232,
                  x_scales: torch.Tensor | None = None, ctas: int | None = None) -> torch.Tensor:  # fmt: skip
    """`frag_rs.gemm_frag_rs` (no split K, no 8-bit codes) with `ctas` persistent CTAs (default: the SMs) walking
    the tiles; K must hold two 128-K blocks at least."""
    bits = tw.fmt["W_BITS"]
    if bits == 8:
        raise ValueError("the persistent kernel takes 2-, 3- and 4-bit codes and e2m1, not 8-bit ones")
    if tw.k <= 128:
        raise ValueError(f"the persistent kernel needs K > 128 (two 128-K blocks a tile: one each warpgroup), "
                         f"got {tw.k}")  # fmt: skip
    m, n = x.shape[0], tw.n
    tiles = cdiv(m, block_m) * cdiv(n, 64)
    if ctas is None:
        ctas = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
    stages = stages or rsp_stages(block_m, bits)
    if stages < RS_MIN_STAGES:
        raise ValueError(f"stages={stages}: at least {RS_MIN_STAGES}")
    consts = rs_consts(tw, block_m, stages, mma_regs)
    consts.pop("W8")
    consts |= dict(GROUP_M=group_m, HAS_BIAS=bias is not None, ROW_SCALES=x_scales is not None)
    from anybit.kernels.frag_rsp_kernel import frag_rsp_kernel

    y = call_output(x, tw, bias, out)
    bm1, bm2 = rs_token_parts(block_m, bits)
    x1 = x_desc(x, bm1)
    x2 = x_desc(x, bm2) if bm2 else x1
    w_desc, s_desc, z_desc = int_descs(tw, x.dtype, 64)
    gs = tw.global_scale
    frag_rsp_kernel[(min(ctas, tiles),)](
        x1, x2, w_desc, s_desc, z_desc, row_scales(x_scales, m, y), gs if gs is not None else y,
        bias if bias is not None else y, y, m, n, tw.k, tw.planes[0].shape[-1] // 16, y.stride(0), **consts,
    )  # fmt: skip
    return y
