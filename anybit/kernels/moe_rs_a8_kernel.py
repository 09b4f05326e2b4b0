"""The Gluon kernel of `anybit.kernels.moe_ws_a8` with `rs` (sm_90a): the indexed grouped MoE GEMM for W4A8 experts
on the register-operand wide W4A8 kernel (`frag_rs_a8_kernel`): weight rows as the wgmma's M, a block's sorted rows
as its N.

Each CTA takes one block of BM rows `moe_align` sorted by expert and one 128-row N tile of that expert. A loader
partition (LD_WARPS warps) takes each 128-K step's words and scale row of the expert by TMA (from its first rows on)
and gathers the block's x rows by cp.async (row r of the sorted order reads x row r // TOP_K; padding rows read
zeros) into the step's slot, each loader thread arriving on the slot's barrier once its copies have landed; the two
MMA warpgroups (64 weight rows each) decode their words into the A operand and run the rescaled K loop
(`frag_rs_a8_kernel._rs_a8_loop`). The epilogue turns each warpgroup's [64, BM] tile into [BM, 64] rows of eight
weight rows a thread and stores it through `moe_ws_kernel._moe_store` (x scale by token, top-k weight, silu(gate) *
up of interleaved gate/up rows, each row to its flat slot). Blocks past the padded total or of expert -1 run no K
step and store nothing.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from anybit.kernels.frag_rs_a8_kernel import _rs_a8_loop, _rs_a8_rings
from anybit.kernels.frag_ws_a8_kernel import _x_step, gather_layout
from anybit.kernels.frag_ws_kernel import _w_fetch
from anybit.kernels.moe_ws_kernel import _moe_block, _moe_store


# fmt: off
@gluon.jit
def _rs_a8_mma_moe(wq, sq, x_bufs, ready, x_ready, empty, ME: gl.constexpr, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m,
                   off_n, n_rows, num_rows, N, stride_ym, num_k, valid, SIGNED: gl.constexpr, TOP_K: gl.constexpr,
                   SILU_MUL: gl.constexpr, MUL_ROUTED: gl.constexpr, RESCALE: gl.constexpr):
    """One warpgroup's 64 weight rows of the tile: the K loop, then the grouped epilogue on the [BM, 64] rows."""
    acc = _rs_a8_loop(wq, sq, x_bufs, ready, x_ready, empty, ME, num_k, SIGNED, RESCALE, True)
    out_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])  # 8 weight rows a thread
    rows = gl.convert_layout(gl.permute(acc, [1, 0]), out_l)
    _moe_store(rows, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m, off_n + ME * 64, n_rows, num_rows, N, stride_ym, valid,
               TOP_K, SILU_MUL, MUL_ROUTED)


@gluon.jit
def _rs_a8_moe_loader(w_desc, s_desc, x_ptr, wq, sq, x_bufs, ready, x_ready, empty, rows_ptr, off_m, off_n, n_rows,
                      num_rows, stride_xm, K4, nb, num_k, w_row0, s_row0, TOP_K: gl.constexpr,
                      SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, PANEL: gl.constexpr):
    """Step b's words and scale row of the expert (`_w_fetch`) and the block's gathered x rows (`_x_step`) into slot
    b % STAGES once both MMA warpgroups released it."""
    BM: gl.constexpr = x_bufs.type.shape[1]
    STAGES: gl.constexpr = wq.type.shape[0]
    gl_l: gl.constexpr = gather_layout(gl.num_warps())
    pos = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, gl_l))
    slot = gl.load(rows_ptr + pos, mask=pos < n_rows, other=num_rows)
    xmask = slot < num_rows
    src_off = (slot // TOP_K).to(gl.int64) * stride_xm  # (x_ptr: x's int32 words, stride_xm of them a row)
    cols = gl.arange(0, 32, layout=gl.SliceLayout(0, gl_l))
    for b in range(num_k):
        s = b % STAGES
        mbarrier.wait(empty.index(s), ((b // STAGES) & 1) ^ 1)
        _w_fetch(w_desc, s_desc, wq, sq, ready, s, w_row0, s_row0, off_n // PANEL, nb, off_n, b, num_k, GB,
                 SCALE_PER_BLOCK)
        _x_step(None, x_bufs, x_ready, 0, b, num_k, STAGES, True, x_ptr, src_off, xmask, cols, K4)


@gluon.jit
def moe_rs_a8_kernel(x_ptr, xs_ptr, w_desc, s_desc, y_ptr, rows_ptr, expert_ptr, total_ptr, rw_ptr, n_rows, num_rows,
                     N, K, stride_xm, stride_ym, w_rows_e, s_rows_e, nb,
                     BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, LD_WARPS: gl.constexpr,
                     LD_REGS: gl.constexpr, MMA_REGS: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr,
                     SIGNED: gl.constexpr, PANEL: gl.constexpr, TOP_K: gl.constexpr, SILU_MUL: gl.constexpr,
                     MUL_ROUTED: gl.constexpr, RESCALE: gl.constexpr):
    BK: gl.constexpr = 128  # a K step is one 128-K frag block
    gl.static_assert(BN == 128, "two warpgroups of 64 weight rows")
    off_m, off_n, e, valid = _moe_block(expert_ptr, total_ptr, N, BM, BN)
    num_k = gl.where(valid, gl.cdiv(K, BK), 0)  # a skipped block runs no K step and stores nothing

    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.float8e4nv)
    # every loader thread arrives on x's barrier once its copies have landed
    x_bufs, wq, sq, ready, x_ready, empty = _rs_a8_rings(x_layout, w_desc, s_desc, BM, BN, STAGES, 32 * LD_WARPS)
    gl.warp_specialize([  # MMA warpgroups (weight rows 0-63, 64-127 of the tile), loader
        (_rs_a8_mma_moe, (wq, sq, x_bufs, ready, x_ready, empty, 0, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m, off_n,
                          n_rows, num_rows, N, stride_ym, num_k, valid, SIGNED, TOP_K, SILU_MUL, MUL_ROUTED,
                          RESCALE)),
        (_rs_a8_mma_moe, (wq, sq, x_bufs, ready, x_ready, empty, 1, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m, off_n,
                          n_rows, num_rows, N, stride_ym, num_k, valid, SIGNED, TOP_K, SILU_MUL, MUL_ROUTED,
                          RESCALE)),
        (_rs_a8_moe_loader, (w_desc, s_desc, x_ptr, wq, sq, x_bufs, ready, x_ready, empty, rows_ptr, off_m, off_n,
                             n_rows, num_rows, stride_xm, K // 4, nb, num_k, e * w_rows_e, e * s_rows_e, TOP_K,
                             SCALE_PER_BLOCK, GB, PANEL)),
    ], [4, LD_WARPS], [MMA_REGS, LD_REGS])
# fmt: on
