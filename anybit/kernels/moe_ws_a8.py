"""Large-M grouped MoE GEMM for W4A8 experts on Hopper: `moe_gemm_ws_a8` runs the warp-specialised FP8 Gluon kernel
(`anybit.kernels.moe_ws_a8_kernel`) — the dense `frag_ws_a8` kernel's two decoders and two promoting FP8 MMA
warpgroups, each warpgroup gathering its 64 sorted rows of x by cp.async. Same contract as
`anybit.kernels.moe_gemm.moe_gemm` (y row = flat slot, silu(gate) * up of interleaved gate/up rows, top-k weights)
for the experts `frag_ws_a8_why_not` accepts: 4-bit integer codes in the FP8 fragment layout with scales per channel
or per whole 128-K blocks, x quantized to e4m3 per token (`quantize_act`).
"""

from __future__ import annotations

import functools

import torch

from anybit import settings
from anybit.kernels.dequant import cdiv
from anybit.kernels.frag_layout import FRAG_PANEL
from anybit.kernels.frag_ws import WS_WORD_DEPTH, weight_descs
from anybit.kernels.frag_ws_a8 import frag_ws_a8_why_not
from anybit.kernels.moe_gemm import check_aligned, moe_grid_m

WS_A8_BLOCK_M = 128  # sorted rows a block: two MMA warpgroups of 64
RS_A8_BLOCKS = (64, 128, 256)  # the register-operand kernel's sorted rows a block (its wgmma's N) ...
RS_A8_SECOND = (16, 32)  # ... and the rows of a block's second part (a second wgmma: 144 = 128 + 16)
RS_A8_STAGES = {64: 6, 128: 5, 256: 4}  # its ring by the first part: x's rows + 8 KB of words + scales a step


def rs_a8_parts(block_m: int) -> tuple[int, int]:
    """The register-operand grouped kernel's block of block_m sorted rows as (first part, second part): a power of
    two of RS_A8_BLOCKS alone, or one and RS_A8_SECOND rows after it (80 = 64 + 16, 144 = 128 + 16, 160 = 128 + 32,
    272 = 256 + 16) — or a clear error."""
    for first in RS_A8_BLOCKS:
        if block_m - first in (0, *RS_A8_SECOND):
            return first, block_m - first
    sizes = sorted({a + b for a in RS_A8_BLOCKS for b in (0, *RS_A8_SECOND)})
    raise ValueError(f"block_m={block_m}: the register-operand kernel takes blocks of {sizes} sorted rows (a power "
                     f"of two of {RS_A8_BLOCKS} and {RS_A8_SECOND} rows more)")  # fmt: skip


def rs_a8_block_m(per_expert: float) -> int:
    """The register-operand kernel's block for `per_expert` token x slot rows an expert (its layers measured slower
    than `moe_gemm`'s, session 53; the Triton kernel's measured rule for such experts, `moe_tiles`, picks 144 = 128 +
    16 at 97-192 rows): 256 from 256 rows, 144 from 97 to 191 (an expert's ~128 rows in one block, not a second one of
    128 rows for a few of them), 128 at 192-255, 80 = 64 + 16 below."""
    if per_expert >= 256:
        return 256
    if per_expert >= 192:
        return 128
    return 144 if per_expert > 96 else 80


@functools.cache
def _kernel(rs: bool = False):
    if rs:
        from anybit.kernels.moe_rs_a8_kernel import moe_rs_a8_kernel

        return moe_rs_a8_kernel
    from anybit.kernels.moe_ws_a8_kernel import moe_ws_a8_kernel

    return moe_ws_a8_kernel


def moe_ws_a8_why_not(tw, device: torch.device) -> str | None:
    """None when `moe_gemm_ws_a8` runs these stacked experts (`stack_experts`), else why not."""
    if not (tw.frag and tw.mma_a8) or tw.e2m1_a8:
        return "4-bit integer experts in the FP8 fragment layout only"
    return frag_ws_a8_why_not(tw.scheme, tw.k, tw.n, device)


def moe_ws_a8_plan(gate_up, down, rows: int, experts: int, device: torch.device) -> tuple:
    """(tile, None) when a `QuantMoE` call of `rows` token x slot rows runs both stacked W4A8 projections through
    `moe_gemm_ws_a8`, else (None, why not): Hopper, experts `moe_ws_a8_why_not` accepts, and at least
    `settings.moe_rs_a8_min_rows()` rows per expert for the register-operand kernel (experts whose scales allow its
    rescale; 256-row blocks from 256 rows an expert) or `settings.moe_ws_a8_min_rows()` for the warp-specialised one
    (both 0 by default: off — the latter slower than `moe_gemm` on the H200 in every cell measured,
    `Settings.moe_ws_a8_min_rows`)."""
    rs_least, ws_least = settings.moe_rs_a8_min_rows(), settings.moe_ws_a8_min_rows()
    if not (rs_least or ws_least):
        return None, "off (ANYBIT_MOE_RS_A8_MIN_ROWS=0 and ANYBIT_MOE_WS_A8_MIN_ROWS=0, the defaults)"
    why = moe_ws_a8_why_not(gate_up, device) or moe_ws_a8_why_not(down, device)
    per_expert = rows / experts
    rs_why = None
    if rs_least and per_expert >= rs_least:
        rescalable = gate_up.rescale and down.rescale
        rs_why = why or (None if rescalable else "group scales the register-operand kernel cannot rescale by (zero, "
                                                  "subnormal or over 64 binades)")  # fmt: skip
        if rs_why is None:
            return dict(rs=True, block_m=rs_a8_block_m(per_expert)), None
    if ws_least and per_expert >= ws_least:
        return (None, why) if why else (dict(block_m=WS_A8_BLOCK_M), None)
    if rs_why is not None:  # enough rows for the register-operand kernel, which cannot take these experts here
        return None, rs_why
    least = " and ".join(f"{name}={v}" for name, v in (("ANYBIT_MOE_RS_A8_MIN_ROWS", rs_least),
                                                        ("ANYBIT_MOE_WS_A8_MIN_ROWS", ws_least)) if v)  # fmt: skip
    return None, f"{per_expert:.1f} rows per expert < {least}"


def moe_gemm_ws_a8(x, tw, sorted_ids, expert_ids, total, *, num_rows: int, top_k: int, x_scales, block_m: int = 128,
                   out=None, silu_mul: bool = False, routed_weights=None, out_dtype=None, x_group: int = 0,
                   x_sums=None, block_n: int = 128, stages: int | None = None, dq_warps: int = 4,
                   dq_regs: int | None = None, mma_regs: int | None = None, rs: bool = False):  # fmt: skip
    """x [T or T*k, K] e4m3 with x_scales [rows] fp32 per row (`quantize_act`, per token; x_sums are not needed and
    ignored); tw: stacked experts `moe_ws_a8_why_not` accepts; sorted_ids, expert_ids, total: `anybit.moe.moe_align(
    ..., block_m)`. Returns y [num_rows, N] (or [num_rows, N / 2] with silu_mul) in out_dtype (default bf16); rows of
    no valid slot are left as they were. Registers: the MMA warpgroups 192 a thread, the decoders 64 (sm_90a: no
    spill; the dense kernel's 176 / 80 spilled 24 bytes here, the gathered rows' offsets). rs: the register-operand
    kernel (`moe_rs_a8_kernel`: block_m 64, 128 or 256 sorted rows as the wgmma's N, or one of them and 16 or 32 rows
    more as a second wgmma's, `rs_a8_parts`; experts `TritonWeight.rescale`; dq_warps and dq_regs are its loader's,
    default 4 warps of 88 registers)."""
    n, k = tw.n, tw.k
    first, second = rs_a8_parts(block_m) if rs else (block_m, 0)
    if rs and block_n != 128:
        raise ValueError(f"the register-operand kernel (rs) takes block_n=128 (two warpgroups of 64 weight rows), "
                         f"got {block_n}")  # fmt: skip
    if rs and not tw.rescale:
        raise ValueError("the register-operand kernel (rs) takes group scales it may rescale by (TritonWeight.rescale)")
    if not rs and block_m != WS_A8_BLOCK_M:
        raise ValueError(f"block_m must be {WS_A8_BLOCK_M} (two warpgroups of 64 wgmma rows), got {block_m}")
    if x_group:
        raise ValueError(f"x must be quantized per token (its scales per group of {x_group} are not supported)")
    check_aligned(sorted_ids, expert_ids, block_m)
    if x.dtype != torch.float8_e4m3fn or x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1 or x.stride(0) % 16:
        raise ValueError(f"x must be e4m3 [rows, {k}] with unit column stride and rows 16-byte aligned, got "
                         f"{x.dtype} {tuple(x.shape)} strides {x.stride()}")  # fmt: skip
    xs = x_scales.reshape(-1)
    if xs.numel() != x.shape[0] or xs.dtype != torch.float32:
        raise ValueError(f"x_scales must be {x.shape[0]} fp32 values (one per row), got {xs.dtype} {xs.numel()}")
    if silu_mul and n % 2:
        raise ValueError(f"silu_mul needs an even N, got N={n}")
    n_out = n // 2 if silu_mul else n
    y = out if out is not None else torch.empty((num_rows, n_out), device=x.device, dtype=out_dtype or torch.bfloat16)
    grid_m = moe_grid_m(num_rows, sorted_ids.numel(), expert_ids.numel(), block_m)
    w_desc, s_desc = weight_descs(tw, block_n)
    words = tw.planes[0]
    blocks = tw.group_k < k
    consts = dict(BN=block_n, SCALE_PER_BLOCK=blocks, GB=max(1, tw.group_k // 128), SIGNED=bool(tw.fmt["W_SIGNED"]),
                  PANEL=FRAG_PANEL, TOP_K=top_k, SILU_MUL=silu_mul, MUL_ROUTED=routed_weights is not None,
                  num_warps=4)  # fmt: skip
    if rs:  # loader warps, their registers, the MMA warpgroups'
        consts.update(BM=first, BM2=second, STAGES=stages or RS_A8_STAGES[first], LD_WARPS=dq_warps,
                      LD_REGS=dq_regs or 88, MMA_REGS=mma_regs or 232, RESCALE=blocks)  # fmt: skip
    else:
        consts.update(STAGES=stages or 4, DQ_WARPS=dq_warps, DQ_REGS=dq_regs or 64, MMA_REGS=mma_regs or 192,
                      DEPTH=WS_WORD_DEPTH)  # fmt: skip
    # fmt: off
    _kernel(rs)[(grid_m * cdiv(n, block_n),)](
        x.view(torch.int32), xs.contiguous(), w_desc, s_desc, y, sorted_ids, expert_ids, total,
        routed_weights if routed_weights is not None else xs, sorted_ids.numel(), num_rows, n, k, x.stride(0) // 4,
        y.stride(0), words.stride(0) // 256, tw.scales.shape[1], words.shape[-1] // 16, **consts,
    )
    # fmt: on
    return y
