"""The Gluon kernel of `anybit.kernels.moe_rs` (sm_90a): the grouped MoE GEMM on the register-operand kernel
(`frag_rs_kernel`'s loader, MMA warpgroups and partial-product exchange, unchanged).

Each CTA takes one block of BM rows of `moe_align`'s sorted order and one 64-row tile of that block's expert. x is
already in the sorted order (`moe_rs.moe_gather`; the down GEMM's x is the gate_up GEMM's output, which this kernel
writes in that order), so its rows come by TMA as in the dense kernel; the expert's words and scales come from its
rows of the stack. Blocks past the padded total or of expert -1 return at once. The epilogue writes y in the sorted
order (SCATTER 0) or each row to its flat slot, times the row's top-k weight (SCATTER 1); rows of no valid slot are
left as they were.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from anybit.kernels.frag_rs_kernel import _loader, _rs_blocks, _rs_smem, _second, _summed
from anybit.kernels.frag_ws_kernel import _pow2


# fmt: off
@gluon.jit
def _store_rows(acc, gs_ptr, y_ptr, rows_ptr, rw_ptr, n_rows, num_rows, N, stride_ym, off_m, off_n,
                POW2: gl.constexpr, HAS_GS: gl.constexpr, SCATTER: gl.constexpr):
    """y of acc [64 weight rows from off_n, tokens from sorted position off_m] (* the e2m1 power of two, * the
    expert's global scale): row = the sorted position (< n_rows), or (SCATTER) its flat slot rows_ptr[position] times
    the slot's top-k weight, where the slot is < num_rows (not padding)."""
    layout: gl.constexpr = acc.type.layout
    cols = off_n + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, layout))
    pos = off_m + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
    if HAS_GS:
        acc = acc * (gl.load(gs_ptr) * POW2)
    elif POW2 != 1.0:
        acc = acc * POW2
    if SCATTER:
        rows = gl.load(rows_ptr + pos, mask=pos < n_rows, other=num_rows)
        ok = rows < num_rows
        acc = acc * gl.expand_dims(gl.load(rw_ptr + rows, mask=ok, other=0.0), 0)
    else:
        rows = pos
        ok = pos < n_rows
    ptrs = y_ptr + gl.expand_dims(rows.to(gl.int64) * stride_ym, 0) + gl.expand_dims(cols, 1)
    gl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=gl.expand_dims(ok, 0) & gl.expand_dims(cols < N, 1))


@gluon.jit
def _first_moe(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, gs_ptr, y_ptr, rows_ptr, rw_ptr, n_rows,
               num_rows, N, stride_ym, off_m, off_n, num_blocks, SIGNED: gl.constexpr, E2M1: gl.constexpr,
               HAS_GS: gl.constexpr, TWO: gl.constexpr, W8: gl.constexpr, SCATTER: gl.constexpr):
    """The first warpgroup's part (`frag_rs_kernel._summed`), then the grouped epilogue (`_store_rows`)."""
    BM1: gl.constexpr = x_bufs.type.shape[1]
    acc, acc2 = _summed(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, num_blocks, SIGNED, E2M1, TWO, False,
                        W8)
    _store_rows(acc, gs_ptr, y_ptr, rows_ptr, rw_ptr, n_rows, num_rows, N, stride_ym, off_m, off_n, _pow2(E2M1),
                HAS_GS, SCATTER)
    if TWO:
        _store_rows(acc2, gs_ptr, y_ptr, rows_ptr, rw_ptr, n_rows, num_rows, N, stride_ym, off_m + BM1, off_n,
                    _pow2(E2M1), HAS_GS, SCATTER)


@gluon.jit
def moe_rs_kernel(x_desc, x2_desc, w_desc, s_desc, gs_ptr, y_ptr, rows_ptr, expert_ptr, total_ptr, rw_ptr, n_rows,
                  num_rows, N, K, nb, stride_ym, w_rows_e, s_rows_e, STAGES: gl.constexpr,
                  SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, SIGNED: gl.constexpr, PANEL: gl.constexpr,
                  MMA_REGS: gl.constexpr, E2M1: gl.constexpr, HAS_GS: gl.constexpr, TWO: gl.constexpr,
                  W8: gl.constexpr, SCATTER: gl.constexpr, W3: gl.constexpr = False, ZP: gl.constexpr = False,
                  W2: gl.constexpr = False):
    gl.static_assert(not (W2 or W3 or ZP), "2- and 3-bit codes, zero points: the dense kernel only (`moe_rs_why_not`)")
    BM1: gl.constexpr = x_desc.block_type.shape[0]
    BM2: gl.constexpr = x2_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    gl.static_assert(BK == 64, "x comes in 64-K slices")
    if TWO:
        BM: gl.constexpr = BM1 + BM2
    else:
        BM: gl.constexpr = BM1
    # the N tiles of a block fastest: the CTAs in flight share its x rows and its expert's words in L2
    pid = gl.program_id(0)
    num_n = gl.cdiv(N, 64)
    pid_m = pid // num_n
    off_m = pid_m * BM
    off_n = (pid % num_n) * 64
    e = gl.load(expert_ptr + pid_m)
    if (off_m >= gl.load(total_ptr)) | (e < 0):  # padding past the total, or a non-local expert
        return
    x_bufs, x2_bufs, wq, sq, ready, empty, x_ready, red_bar = _rs_smem(x_desc, x2_desc, w_desc, s_desc, STAGES, TWO,
                                                                       W8)
    num_blocks = _rs_blocks(K, BK, W8)
    gl.warp_specialize([
        (_first_moe, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, gs_ptr + e, y_ptr, rows_ptr, rw_ptr,
                      n_rows, num_rows, N, stride_ym, off_m, off_n, num_blocks, SIGNED, E2M1, HAS_GS, TWO, W8,
                      SCATTER)),
        (_second, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, num_blocks, SIGNED, E2M1, TWO, False, W8)),
        (_loader, (w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, off_m, off_n, nb,
                   num_blocks, 0, SCALE_PER_BLOCK, GB, PANEL, TWO, W8, e * w_rows_e, e * s_rows_e)),
    ], [4, 1], [MMA_REGS, 48])
# fmt: on
