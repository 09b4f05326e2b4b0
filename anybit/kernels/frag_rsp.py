"""Host side of the persistent register-operand kernel (`frag_rsp_kernel`, work in progress: compiled for sm_90a,
not yet run on a GPU, on no route)."""

from __future__ import annotations

import torch

from anybit.kernels.dequant import cdiv
from anybit.kernels.frag import sm_count
from anybit.kernels.frag_rs import rs_consts, rs_operands, rs_stages


def rsp_stages(block_m: int, bits: int = 4) -> int:
    """`frag_rs.rs_stages` less the partial products' own buffer (64 x block_m fp32)."""
    return rs_stages(block_m, bits, spare=256 * block_m)


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
    consts = rs_consts(tw, block_m, stages or rsp_stages(block_m, bits), mma_regs)  # (checks the tile)
    consts |= dict(GROUP_M=group_m, HAS_BIAS=bias is not None, ROW_SCALES=x_scales is not None)
    from anybit.kernels.frag_rsp_kernel import frag_rsp_kernel

    y, operands = rs_operands(x, tw, bias, out, block_m, x_scales)
    grid = (min(ctas or sm_count(x.device) or 1, tiles),)
    frag_rsp_kernel[grid](*operands, y, m, n, tw.k, tw.planes[0].shape[-1] // 16, y.stride(0), **consts)
    return y
