"""The Gluon kernel of `anybit.kernels.moe_ws_a8` with `rs` (sm_90a): the indexed grouped MoE GEMM for W4A8 experts
on the register-operand wide W4A8 kernel (`frag_rs_a8_kernel`): weight rows as the wgmma's M, a block's sorted rows
as its N.

Each CTA takes one block of BM (+ BM2) rows `moe_align` sorted by expert and one 128-row N tile of that expert. A loader
partition (LD_WARPS warps) takes each 128-K step's words and scale row of the expert by TMA (from its first rows on)
and gathers the block's x rows by cp.async (row r of the sorted order reads x row r // TOP_K; padding rows read
zeros) into the step's slot, each loader thread arriving on the slot's barrier once its copies have landed; the two
MMA warpgroups (64 weight rows each) decode their words into the A operand and run the rescaled K loop
(`frag_rs_a8_kernel._rs_a8_loop`). The epilogue turns each warpgroup's [64, BM] tile into [BM, 64] rows of eight
weight rows a thread and stores it through `moe_ws_kernel._moe_store` (x scale by token, top-k weight, silu(gate) *
up of interleaved gate/up rows, each row to its flat slot). Blocks past the padded total or of expert -1 run no K
step and store nothing.

Blocks of two parts (BM2 > 0: 144 = 128 + 16, 80 = 64 + 16 … — an expert's ~128 rows then fill one block instead of
spilling a few rows into a second 128-row one): the loader gathers the second part's rows into a ring of their own
and each MMA warpgroup runs a second wgmma (N = BM2) on the same decoded operand; where the block's row BM is padding
(sorted rows pad each expert's run at its end, so the whole second part is) neither runs.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, mbarrier

from anybit.kernels.frag_rs_a8_kernel import _rs_a8_rings, _rs_a8_steps
from anybit.kernels.frag_ws_a8_kernel import _x_gather, gather_layout
from anybit.kernels.frag_ws_kernel import _w_fetch
from anybit.kernels.moe_ws_kernel import _moe_block, _moe_store


# fmt: off
@gluon.jit
def _rs_a8_mma_moe(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, ME: gl.constexpr, xs_ptr, y_ptr, rows_ptr, rw_ptr,
                   off_m, off_n, n_rows, num_rows, N, stride_ym, num_k, valid, two, SIGNED: gl.constexpr,
                   TOP_K: gl.constexpr, SILU_MUL: gl.constexpr, MUL_ROUTED: gl.constexpr, RESCALE: gl.constexpr,
                   TWO: gl.constexpr):
    """One warpgroup's 64 weight rows of the tile: the K loop, then the grouped epilogue on the [BM, 64] rows (and
    the second part's [BM2, 64] after them)."""
    acc, acc2 = _rs_a8_steps(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, ME, num_k, SIGNED, RESCALE, True, 0, 0,
                             TWO, two)
    out_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])  # 8 weight rows a thread
    rows = gl.convert_layout(gl.permute(acc, [1, 0]), out_l)
    _moe_store(rows, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m, off_n + ME * 64, n_rows, num_rows, N, stride_ym, valid,
               TOP_K, SILU_MUL, MUL_ROUTED)
    if TWO:
        BM: gl.constexpr = x_bufs.type.shape[1]
        rows2 = gl.convert_layout(gl.permute(acc2, [1, 0]), out_l)
        _moe_store(rows2, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m + BM, off_n + ME * 64, n_rows, num_rows, N,
                   stride_ym, valid & two, TOP_K, SILU_MUL, MUL_ROUTED)


@gluon.jit
def _gathered_rows(rows_ptr, off_m, n_rows, num_rows, stride_xm, ROWS: gl.constexpr, TOP_K: gl.constexpr):
    """The x row offsets (int32 words) and mask of ROWS sorted rows from off_m on, in `gather_layout` (row r of the
    sorted order reads x row r // TOP_K; padding rows none)."""
    pos = off_m + gl.arange(0, ROWS, layout=gl.SliceLayout(1, gather_layout(gl.num_warps())))
    slot = gl.load(rows_ptr + pos, mask=pos < n_rows, other=num_rows)
    return (slot // TOP_K).to(gl.int64) * stride_xm, slot < num_rows


@gluon.jit
def _rs_a8_moe_loader(w_desc, s_desc, x_ptr, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, rows_ptr, off_m, off_n,
                      n_rows, num_rows, stride_xm, K4, nb, num_k, w_row0, s_row0, two, TOP_K: gl.constexpr,
                      SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, PANEL: gl.constexpr, TWO: gl.constexpr):
    """Step b's words and scale row of the expert (`_w_fetch`) and the block's gathered x rows (`_x_gather`: both
    parts' where `two`) into slot b % STAGES once both MMA warpgroups released it, each thread arriving on the slot's
    x barrier once its copies have landed."""
    BM: gl.constexpr = x_bufs.type.shape[1]
    BM2: gl.constexpr = x2_bufs.type.shape[1]
    STAGES: gl.constexpr = wq.type.shape[0]
    src_off, xmask = _gathered_rows(rows_ptr, off_m, n_rows, num_rows, stride_xm, BM, TOP_K)
    src2_off, xmask2 = _gathered_rows(rows_ptr, off_m + BM, n_rows, num_rows, stride_xm, BM2, TOP_K)
    cols = gl.arange(0, 32, layout=gl.SliceLayout(0, gather_layout(gl.num_warps())))
    for b in range(num_k):
        s = b % STAGES
        mbarrier.wait(empty.index(s), ((b // STAGES) & 1) ^ 1)
        _w_fetch(w_desc, s_desc, wq, sq, ready, s, w_row0, s_row0, off_n // PANEL, nb, off_n, b, num_k, GB,
                 SCALE_PER_BLOCK)
        _x_gather(x_bufs.index(s), b, x_ptr, src_off, xmask, cols, K4)
        if TWO:
            if two:
                _x_gather(x2_bufs.index(s), b, x_ptr, src2_off, xmask2, cols, K4)
        async_copy.mbarrier_arrive(x_ready.index(s), increment_count=False)


@gluon.jit
def moe_rs_a8_kernel(x_ptr, xs_ptr, w_desc, s_desc, y_ptr, rows_ptr, expert_ptr, total_ptr, rw_ptr, n_rows, num_rows,
                     N, K, stride_xm, stride_ym, w_rows_e, s_rows_e, nb,
                     BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, LD_WARPS: gl.constexpr,
                     LD_REGS: gl.constexpr, MMA_REGS: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr,
                     SIGNED: gl.constexpr, PANEL: gl.constexpr, TOP_K: gl.constexpr, SILU_MUL: gl.constexpr,
                     MUL_ROUTED: gl.constexpr, RESCALE: gl.constexpr, BM2: gl.constexpr = 0):
    BK: gl.constexpr = 128  # a K step is one 128-K frag block
    gl.static_assert(BN == 128, "two warpgroups of 64 weight rows")
    TWO: gl.constexpr = BM2 > 0
    off_m, off_n, e, valid = _moe_block(expert_ptr, total_ptr, N, BM + BM2, BN)
    num_k = gl.where(valid, gl.cdiv(K, BK), 0)  # a skipped block runs no K step and stores nothing
    two = valid
    if TWO:  # the second part runs where the block's row BM holds a slot (padding comes last in a block)
        two = valid & (gl.load(rows_ptr + off_m + BM, mask=off_m + BM < n_rows, other=num_rows) < num_rows)

    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.float8e4nv)
    # every loader thread arrives on x's barrier once its copies have landed
    x_bufs, wq, sq, ready, x_ready, empty = _rs_a8_rings(x_layout, w_desc, s_desc, BM, BN, STAGES, 32 * LD_WARPS)
    if TWO:
        x2_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM2, BK], gl.float8e4nv)
        x2_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BM2, BK], x2_layout)
    else:
        x2_bufs = x_bufs
    gl.warp_specialize([  # MMA warpgroups (weight rows 0-63, 64-127 of the tile), loader
        (_rs_a8_mma_moe, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, 0, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m,
                          off_n, n_rows, num_rows, N, stride_ym, num_k, valid, two, SIGNED, TOP_K, SILU_MUL,
                          MUL_ROUTED, RESCALE, TWO)),
        (_rs_a8_mma_moe, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, 1, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m,
                          off_n, n_rows, num_rows, N, stride_ym, num_k, valid, two, SIGNED, TOP_K, SILU_MUL,
                          MUL_ROUTED, RESCALE, TWO)),
        (_rs_a8_moe_loader, (w_desc, s_desc, x_ptr, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, rows_ptr, off_m,
                             off_n, n_rows, num_rows, stride_xm, K // 4, nb, num_k, e * w_rows_e, e * s_rows_e, two,
                             TOP_K, SCALE_PER_BLOCK, GB, PANEL, TWO)),
    ], [4, LD_WARPS], [MMA_REGS, LD_REGS])
# fmt: on
