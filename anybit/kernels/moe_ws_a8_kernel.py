"""The Gluon kernel of `anybit.kernels.moe_ws_a8` (sm_90a): the indexed grouped MoE GEMM for W4A8 experts (4-bit
integer codes in the FP8 fragment layout, e4m3 x per token), warp-specialised as `anybit.kernels.frag_ws_a8_kernel`
is for one weight.

Each CTA takes one block of 128 rows `moe_align` sorted by expert and one N tile of that expert: the same two
decoder partitions (the expert's words and scale rows by TMA from its first rows on) and two MMA warpgroups of 64
rows each, which here gather their rows of x by cp.async (row r of the sorted order reads x row r // TOP_K) into
their own rings. A warpgroup whose 64 rows are all padding runs no wgmma: it only hands each step's w slot back.
The epilogue (`moe_ws_kernel._moe_store`) multiplies by each row's x scale (by token) and top-k weight, applies
silu(gate) * up of interleaved gate/up columns, and writes each row to its flat slot. Blocks past the padded total
or of expert -1 run no K step and store nothing.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from anybit.kernels.frag_ws_a8_kernel import _a8_decoder, _a8_loop, _a8_rings, gather_layout
from anybit.kernels.moe_ws_kernel import _moe_block, _moe_store


# fmt: off
@gluon.jit
def _a8_mma_moe(x_ptr, x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, turn, me, xs_ptr, y_ptr, rows_ptr,
                rw_ptr, off_m, off_n, n_rows, num_rows, N, K, stride_xm, stride_ym, num_k, valid,
                STAGES: gl.constexpr, TOP_K: gl.constexpr, SILU_MUL: gl.constexpr, MUL_ROUTED: gl.constexpr):
    """One warpgroup's 64 sorted rows (off_m on): gathered x, the promoted FP8 K loop (`_a8_loop`), the grouped
    epilogue; or, when every row is padding, each step's w slot handed back unread."""
    BMH: gl.constexpr = x_bufs.type.shape[1]
    pos = off_m + gl.arange(0, BMH, layout=gl.SliceLayout(1, gather_layout(gl.num_warps())))
    slot = gl.load(rows_ptr + pos, mask=pos < n_rows, other=num_rows)
    xmask = (slot < num_rows) & valid
    if gl.max(xmask.to(gl.int32), axis=0) > 0:
        src_off = (slot // TOP_K).to(gl.int64) * stride_xm  # (x_ptr: x's int32 words, stride_xm of them a row)
        acc = _a8_loop(None, x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, turn, me, off_m, num_k, STAGES,
                       True, 0, True, True, x_ptr, src_off, xmask, K // 4)
        _moe_store(acc, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m, off_n, n_rows, num_rows, N, stride_ym, valid, TOP_K,
                   SILU_MUL, MUL_ROUTED)
    else:
        for ki in range(num_k):
            s = ki % STAGES
            mbarrier.wait(w_ready.index(s), (ki // STAGES) & 1)
            mbarrier.arrive(w_empty.index(s), count=1)


@gluon.jit
def moe_ws_a8_kernel(x_ptr, xs_ptr, w_desc, s_desc, y_ptr, rows_ptr, expert_ptr, total_ptr, rw_ptr, n_rows, num_rows,
                     N, K, stride_xm, stride_ym, w_rows_e, s_rows_e, nb,
                     BN: gl.constexpr, STAGES: gl.constexpr, DQ_WARPS: gl.constexpr, DQ_REGS: gl.constexpr,
                     MMA_REGS: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, SIGNED: gl.constexpr,
                     PANEL: gl.constexpr, DEPTH: gl.constexpr, TOP_K: gl.constexpr, SILU_MUL: gl.constexpr,
                     MUL_ROUTED: gl.constexpr):
    BMH: gl.constexpr = 64  # rows per MMA warpgroup; a block has two
    BK: gl.constexpr = 128  # a K step is one 128-K frag block
    off_m, off_n, e, valid = _moe_block(expert_ptr, total_ptr, N, 2 * BMH, BN)
    num_k = gl.where(valid, gl.cdiv(K, BK), 0)  # a skipped block runs no K step and stores nothing

    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BMH, BK], gl.float8e4nv)
    # every thread of an MMA warpgroup arrives on its x barrier once its copies have landed
    x0, x1, x0_ready, x1_ready, w_bufs, s_bufs, w_ready, w_empty, wq, sq, wq_bar = _a8_rings(
        x_layout, w_desc, s_desc, BMH, BN, STAGES, DEPTH, 128)
    w_row0 = e * w_rows_e
    s_row0 = e * s_rows_e
    gl.warp_specialize([  # MMA warpgroups (rows 0-63, 64-127 of the block), decoders (even, odd steps)
        (_a8_mma_moe, (x_ptr, x0, x0_ready, w_bufs, s_bufs, w_ready, w_empty, None, 0, xs_ptr, y_ptr, rows_ptr,
                       rw_ptr, off_m, off_n, n_rows, num_rows, N, K, stride_xm, stride_ym, num_k, valid, STAGES,
                       TOP_K, SILU_MUL, MUL_ROUTED)),
        (_a8_mma_moe, (x_ptr, x1, x1_ready, w_bufs, s_bufs, w_ready, w_empty, None, 1, xs_ptr, y_ptr, rows_ptr,
                       rw_ptr, off_m + BMH, off_n, n_rows, num_rows, N, K, stride_xm, stride_ym, num_k, valid,
                       STAGES, TOP_K, SILU_MUL, MUL_ROUTED)),
        (_a8_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, s_bufs, w_ready, w_empty, off_n, num_k, 0, 2,
                       SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, 0, w_row0, s_row0)),
        (_a8_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, s_bufs, w_ready, w_empty, off_n, num_k, 1, 2,
                       SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, 0, w_row0, s_row0)),
    ], [4, DQ_WARPS, DQ_WARPS], [MMA_REGS, DQ_REGS, DQ_REGS])
# fmt: on
