"""The Gluon kernel of `anybit.kernels.frag_rs` (sm_90a, experimental): y = x @ dequantize(W)^T for 4-bit integer
weights in the fragment layout with the decoded weight as the wgmma's register operand — no shared-memory round
trip of the decoded tile (the warp-specialised `frag_ws_kernel` stores it and its SS wgmma reads it back: ~44 KB
of shared traffic a 64-K step at 96 tokens, session 21).

Per CTA: 64 weight rows (the wgmma's M) by BM tokens (its N), three partitions:

* loader (1 warp): each 128-K block's words (one 4 KB TMA copy of the 64-row panel), its scale row and x's two
  [BM, 64] halves by TMA into slot b % STAGES of one ring;
* two MMA warpgroups taking alternate blocks (intra-CTA split K): each loads its block's words from shared memory
  in the wgmma A operand's own thread order (`_words_layout`: a thread's 16 bytes are its row's four words of the
  block, which hold its A fragments of all eight k16 slabs — `anybit.kernels.frag_layout`), decodes them in
  registers ((q - bias) * s, one LOP3, one packed subtraction, one packed multiply a pair, as the SS kernel), runs
  two wgmma (one a 64-K half) and waits for them (no register operand is rewritten while a wgmma reads it: the
  other warpgroup's block keeps the tensor cores busy meanwhile);
* at the end the second warpgroup's fp32 tile goes through shared memory to the first, which stores y.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from anybit.kernels.frag_ws_kernel import _pairs_asm, _store_tile, _tile_origin


@gluon.constexpr_function
def _words_layout():
    """[64 rows, 16 words] int32 of a block, as the wgmma's A fragments want them: register bits c (words 4t + c)
    and row + 8, lane bits t = lane % 4 and row = lane // 4, warp bits rows of 16."""
    lanes = [[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]]
    return gl.DistributedLinearLayout(reg_bases=[[0, 1], [0, 2], [8, 0]], lane_bases=lanes,
                                      warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[64, 16])  # fmt: skip


# fmt: off
@gluon.jit
def _a_operand(words, s, SIGNED: gl.constexpr, a_layout: gl.constexpr):
    """A block's words [64, 16] (`_words_layout`) and each row's scale beside them -> the two 64-K halves of the
    decoded block [64, 64] each, in x's dtype, as the wgmma's register operand (`a_layout`). Pair j of word 4t + c
    holds k = 32 c + 8 j + 2 t + e (e: its half)."""
    r0, r1, r2, r3 = gl.inline_asm_elementwise(_pairs_asm(s.dtype, SIGNED), "=r,=r,=r,=r,r,h", [words, s],
                                               dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    rr = gl.join(gl.join(r0, r2), gl.join(r1, r3))  # [64, 16, 2 (j1), 2 (j0)]: j = 2 j1 + j0
    lo = rr.to(gl.int16).to(s.dtype, bitcast=True)  # e = 0
    hi = (rr >> 16).to(gl.int16).to(s.dtype, bitcast=True)  # e = 1
    v = gl.reshape(gl.join(lo, hi), [64, 4, 4, 2, 2, 2])  # (row, t, c, j1, j0, e)
    v = gl.reshape(gl.permute(v, [0, 2, 3, 4, 1, 5]), [64, 2, 64])  # k = 64 c1 + (32 c0 + 16 j1 + 8 j0 + 2 t + e)
    v0, v1 = gl.split(gl.permute(v, [0, 2, 1]))  # the halves k < 64 and k >= 64
    return gl.convert_layout(v0, a_layout), gl.convert_layout(v1, a_layout)


@gluon.jit
def _loader(w_desc, s_desc, x_desc, wq, sq, x_lo, x_hi, ready, empty, off_m, off_n, nb, num_blocks,
            SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, PANEL: gl.constexpr):
    """Block b's words, scale row and x halves into slot b % STAGES once its consumer released it."""
    STAGES: gl.constexpr = wq.type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    p0 = off_n // PANEL
    for b in range(num_blocks):
        s = b % STAGES
        mbarrier.wait(empty.index(s), ((b // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), w_desc.block_type.nbytes + s_desc.block_type.nbytes
                        + 2 * x_desc.block_type.nbytes)  # fmt: skip
        tma.async_copy_global_to_shared(w_desc, [(p0 * nb + b) * 4, 0], ready.index(s), wq.index(s))
        if SCALE_PER_BLOCK:
            srow = b // GB
        else:
            srow = 0
        tma.async_copy_global_to_shared(s_desc, [srow, off_n], ready.index(s), sq.index(s))
        tma.async_copy_global_to_shared(x_desc, [off_m, 2 * b * BK], ready.index(s), x_lo.index(s))
        tma.async_copy_global_to_shared(x_desc, [off_m, (2 * b + 1) * BK], ready.index(s), x_hi.index(s))


@gluon.jit
def _consumer_loop(wq, sq, x_lo, x_hi, ready, empty, num_blocks, me, SIGNED: gl.constexpr):
    """Blocks me, me + 2, ...: words from shared memory, decoded into the A operand, two wgmma, waited for. Returns
    the fp32 [64, BM] partial product."""
    STAGES: gl.constexpr = wq.type.shape[0]
    BM: gl.constexpr = x_lo.type.shape[1]
    dtype: gl.constexpr = x_lo.dtype
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, BM, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_layout, k_width=2)
    wl: gl.constexpr = _words_layout()
    flat2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    acc = gl.zeros((64, BM), dtype=gl.float32, layout=mma_layout)
    for i in range(gl.cdiv(num_blocks - me, 2)):
        b = 2 * i + me
        s = b % STAGES
        mbarrier.wait(ready.index(s), (b // STAGES) & 1)
        words = wq.index(s)._reinterpret(gl.int32, [64, 16], flat2).load(wl)
        sc = sq.index(s)._reinterpret(dtype, [64], flat1).load(gl.SliceLayout(1, wl))
        sc, _ = gl.broadcast(gl.expand_dims(sc, 1), words)
        a0, a1 = _a_operand(words, sc, SIGNED, a_layout)
        acc = warpgroup_mma(a0, x_lo.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(a1, x_hi.index(s).permute((1, 0)), acc, is_async=True)
        acc, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a0, a1))
        mbarrier.arrive(empty.index(s), count=1)
    return acc


@gluon.jit
def _first(wq, sq, x_lo, x_hi, ready, empty, red, red_bar, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n,
           num_blocks, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr):
    """The even blocks, then the odd ones' partial product from shared memory, then y."""
    acc = _consumer_loop(wq, sq, x_lo, x_hi, ready, empty, num_blocks, 0, SIGNED)
    mbarrier.wait(red_bar.index(0), 0)
    acc = acc + red.load(acc.type.layout)
    _store_tile(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, False, HAS_BIAS, SWAPPED=True)


@gluon.jit
def _second(wq, sq, x_lo, x_hi, ready, empty, red, red_bar, num_blocks, SIGNED: gl.constexpr):
    """The odd blocks; their partial product into shared memory for `_first`."""
    acc = _consumer_loop(wq, sq, x_lo, x_hi, ready, empty, num_blocks, 1, SIGNED)
    red.store(acc)
    mbarrier.arrive(red_bar.index(0), count=1)


@gluon.jit
def frag_rs_kernel(x_desc, w_desc, s_desc, bias_ptr, y_ptr, M, N, K, nb, stride_ym, STAGES: gl.constexpr,
                   GROUP_M: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, SIGNED: gl.constexpr,
                   HAS_BIAS: gl.constexpr, PANEL: gl.constexpr, MMA_REGS: gl.constexpr):
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    gl.static_assert(BK == 64, "x comes in 64-K halves of a 128-K frag block")
    dtype: gl.constexpr = x_desc.dtype
    off_m, off_n = _tile_origin(M, N, BM, 64, GROUP_M)
    x_lo = gl.allocate_shared_memory(dtype, [STAGES, BM, BK], x_desc.layout)
    x_hi = gl.allocate_shared_memory(dtype, [STAGES, BM, BK], x_desc.layout)
    wq = gl.allocate_shared_memory(gl.int32, [STAGES, 4, 256], w_desc.layout)
    sq = gl.allocate_shared_memory(s_desc.dtype, [STAGES, 1, 64], s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    red = gl.allocate_shared_memory(gl.float32, [64, BM], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    red_bar = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(red_bar.index(0), count=1)
    num_blocks = gl.cdiv(K, 2 * BK)  # x past K is zero-filled by TMA, the frag codes there are 0
    gl.warp_specialize([
        (_first, (wq, sq, x_lo, x_hi, ready, empty, red, red_bar, y_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m,
                  off_n, num_blocks, SIGNED, HAS_BIAS)),
        (_second, (wq, sq, x_lo, x_hi, ready, empty, red, red_bar, num_blocks, SIGNED)),
        (_loader, (w_desc, s_desc, x_desc, wq, sq, x_lo, x_hi, ready, empty, off_m, off_n, nb, num_blocks,
                   SCALE_PER_BLOCK, GB, PANEL)),
    ], [4, 1], [MMA_REGS, 48])
# fmt: on
