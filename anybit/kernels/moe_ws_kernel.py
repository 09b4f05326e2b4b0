"""The Gluon kernel of `anybit.kernels.moe_ws` (sm_90a): the indexed grouped MoE GEMM for 4-bit integer
experts in the fragment layout, warp-specialised as `anybit.kernels.frag_ws_kernel` is for one weight.

Each CTA takes one block of BM rows `moe_align` sorted by expert and one N tile of that expert. The decoder
partition gathers the block's x rows by cp.async (row r of the sorted order reads x row r // TOP_K) into the
x ring while it decodes the expert's weight slices into the w ring; the MMA partition runs the same SS wgmma
loop as the dense kernel, then writes each row to its flat slot (silu(gate) * up of interleaved gate/up
columns, or times the row's top-k weight). Blocks past the padded total or of expert -1 store nothing.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from anybit.kernels.frag_ws_kernel import _mma_loop, _rings, _w_decoder


# fmt: off
@gluon.jit
def _mma_moe(x_bufs, w_bufs, x_ready, w_ready, w_empty, y_ptr, rows_ptr, rw_ptr, off_m, off_n, n_rows, num_rows, N,
             stride_ym, num_k, valid, STAGES: gl.constexpr, SILU_MUL: gl.constexpr, MUL_ROUTED: gl.constexpr):
    acc = _mma_loop(None, x_bufs, w_bufs, x_ready, w_ready, w_empty, off_m, num_k, STAGES, True)
    _moe_store(acc, None, y_ptr, rows_ptr, rw_ptr, off_m, off_n, n_rows, num_rows, N, stride_ym, valid, 1, SILU_MUL,
               MUL_ROUTED)


@gluon.jit
def _moe_store(acc, xs_ptr, y_ptr, rows_ptr, rw_ptr, off_m, off_n, n_rows, num_rows, N, stride_ym, valid,
               TOP_K: gl.constexpr, SILU_MUL: gl.constexpr, MUL_ROUTED: gl.constexpr):
    """The grouped epilogue of a [BM, BN] tile of sorted rows off_m on: times each row's x scale (`xs_ptr`, by
    token: slot // TOP_K; None: none) and its top-k weight (MUL_ROUTED), silu(gate) * up of interleaved columns
    (SILU_MUL), stored at the row's flat slot; padding rows and invalid blocks store nothing."""
    BM: gl.constexpr = acc.shape[0]
    BN: gl.constexpr = acc.shape[1]
    pos = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, acc.type.layout))
    slot = gl.load(rows_ptr + pos, mask=pos < n_rows, other=num_rows)
    rmask = (slot < num_rows) & valid
    if xs_ptr is not None:
        acc = acc * gl.expand_dims(gl.load(xs_ptr + slot // TOP_K, mask=rmask, other=0.0), 1)
    if MUL_ROUTED:  # the top-k weight of each row's (token, slot)
        acc = acc * gl.expand_dims(gl.load(rw_ptr + slot, mask=rmask, other=0.0), 1)
    if SILU_MUL:  # columns 2j, 2j + 1 are gate j and up j (`anybit.moe.layer.interleave_gate_up`)
        gate, up = gl.split(gl.reshape(acc, [BM, BN // 2, 2]))
        h = gate / (1.0 + gl.exp(-gate)) * up
        cols = off_n // 2 + gl.arange(0, BN // 2, layout=gl.SliceLayout(0, h.type.layout))
        hrows = gl.convert_layout(slot, gl.SliceLayout(1, h.type.layout))
        hmask = gl.convert_layout(rmask, gl.SliceLayout(1, h.type.layout))
        ptrs = y_ptr + gl.expand_dims(hrows.to(gl.int64) * stride_ym, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, h.to(y_ptr.dtype.element_ty), mask=gl.expand_dims(hmask, 1) & gl.expand_dims(cols < N // 2, 0))
    else:
        cols = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, acc.type.layout))
        ptrs = y_ptr + gl.expand_dims(slot.to(gl.int64) * stride_ym, 1) + gl.expand_dims(cols, 0)
        gl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=gl.expand_dims(rmask, 1) & gl.expand_dims(cols < N, 0))


@gluon.jit
def _moe_block(expert_ptr, total_ptr, N, BM: gl.constexpr, BN: gl.constexpr):
    """This CTA's block of sorted rows and N tile, N tiles fastest (the CTAs in flight share a few blocks' x rows and
    their experts' whole weights in L2): (off_m, off_n, expert, valid) — a block past the padded total or of expert
    -1 is not valid (its expert read as 0: it runs no K step and stores nothing)."""
    pid = gl.program_id(0)
    num_n = gl.cdiv(N, BN)
    pid_m = pid // num_n
    off_m = pid_m * BM
    off_n = (pid % num_n) * BN
    e = gl.load(expert_ptr + pid_m)
    valid = (off_m < gl.load(total_ptr)) & (e >= 0)
    return off_m, off_n, gl.maximum(e, 0), valid


@gluon.jit
def moe_ws_kernel(x_ptr, w_desc, s_desc, y_ptr, rows_ptr, expert_ptr, total_ptr, rw_ptr, n_rows, num_rows, N, K,
                  stride_xm, stride_ym, w_rows_e, s_rows_e, nb,
                  BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, DQ_WARPS: gl.constexpr,
                  DQ_REGS: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, SIGNED: gl.constexpr,
                  PANEL: gl.constexpr, TOP_K: gl.constexpr, SILU_MUL: gl.constexpr, MUL_ROUTED: gl.constexpr,
                  DEPTH: gl.constexpr):
    BK: gl.constexpr = 64  # a K step is half a 128-K frag block
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    off_m, off_n, e, valid = _moe_block(expert_ptr, total_ptr, N, BM, BN)
    num_blocks = gl.where(valid, gl.cdiv(K, 2 * BK), 0)  # a skipped block runs no K step and stores nothing

    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], dtype)
    # x's barrier counts every decoder thread's copies of the step
    x_bufs, w_bufs, x_ready, w_ready, w_empty, wq, sq, wq_bar = _rings(x_layout, dtype, w_desc, s_desc, BM, BN, BK,
                                                                       STAGES, DEPTH, DQ_WARPS * 32)
    gl.warp_specialize([
        (_mma_moe, (x_bufs, w_bufs, x_ready, w_ready, w_empty, y_ptr, rows_ptr, rw_ptr, off_m, off_n, n_rows,
                    num_rows, N, stride_ym, 2 * num_blocks, valid, STAGES, SILU_MUL, MUL_ROUTED)),
        (_w_decoder, (w_desc, s_desc, wq, sq, wq_bar, e * w_rows_e, e * s_rows_e, nb, w_bufs, w_ready, w_empty,
                      off_n, num_blocks, x_ptr, x_bufs, x_ready, rows_ptr, off_m, n_rows, num_rows, stride_xm, K,
                      SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, True, TOP_K)),
    ], [DQ_WARPS], [DQ_REGS])
# fmt: on
