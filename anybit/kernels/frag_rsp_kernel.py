"""The persistent form of the register-operand kernel (`frag_rs_kernel`), work in progress (session 37; compiled for
sm_90a here, not yet run on a GPU): one CTA an SM walks the tiles pid, pid + P, ... (P CTAs) with the same three
partitions, but the rings run on across its tiles — the loader fetches the next tile's first blocks while the MMA
warpgroups finish this one, and the first warpgroup's epilogue of a tile overlaps the second's next blocks. Why:
ncu at 128 tokens on 28672x8192 (BENCHMARKS.md, session 37) has our SMs busy 83 % of the cycles against Humming's 93 %
(two persistent CTAs an SM), the busy SMs' work within 5 %, and each CTA of the one-tile kernel pays the first block's
latency and the warpgroups' uneven end once more per tile.

Blocks are numbered globally, g = t * nb + b (the CTA's t-th tile, its K block b), and owned by parity (g % 2: the
warpgroup), so the ring's slots, phases and the odd-ring guard of `frag_rs_kernel._block_words` are those of one long
tile. A warpgroup's last owned block of a tile (every tile has at least two blocks: one each) ends the tile for it:
the second stores its partial products into a buffer of their own (the x slots hold the next tile's x by then) and
says so (`red_bar[0]`); the first waits for them, adds them, frees the buffer (`red_bar[1]`, which the second waits
for before its next store: one tile ahead at most, so the parity waits are exact) and stores y. No split K, no 8-bit
codes (a block of bytes is 64 K, one x slice).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma_wait

from anybit.kernels.frag_rs_kernel import (
    _a_layout,
    _acc_layout,
    _block_mma,
    _block_words,
    _decoded,
    _rs_blocks,
    _rs_smem,
)
from anybit.kernels.frag_ws_kernel import _pow2, _store_tile, _tile_origin, _w_fetch, _x_issue2


# fmt: off
@gluon.jit
def _p_loader(w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, M, N, nb, my_tiles,
              num_blocks, BM: gl.constexpr, GROUP_M: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr,
              PANEL: gl.constexpr, TWO: gl.constexpr, z_desc=None, zq=None, lo_units=0, W3: gl.constexpr = False,
              ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """Every block of the CTA's tiles in global order: words and scales into slot g % STAGES, x's two 64-K halves
    into x slots 2g, 2g + 1 (of 2 STAGES), once the slot's previous block has been released."""
    STAGES: gl.constexpr = wq.type.shape[0]
    pid = gl.program_id(0)
    total = my_tiles * num_blocks
    for t in range(my_tiles):
        off_m, off_n = _tile_origin(M, N, BM, 64, GROUP_M, pid + t * gl.num_programs(0))
        for b in range(num_blocks):
            g = t * num_blocks + b
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            _w_fetch(w_desc, s_desc, wq, sq, ready, s, 0, 0, off_n // PANEL, nb, off_n, b, num_blocks, GB,
                     SCALE_PER_BLOCK, z_desc, zq, lo_units, W3, ZP, W2)
            # x slot 2g (+ 1), x's K step 2b (+ 1): the step is the slot counter plus 2 (b - g)
            _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, 2 * g, 2 * total, 2 * STAGES, TWO,
                      2 * (b - g))
            _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, 2 * g + 1, 2 * total, 2 * STAGES, TWO,
                      2 * (b - g))


@gluon.jit
def _p_mma(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, red, red2, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N,
           stride_ym, my_tiles, num_blocks, me: gl.constexpr, BM: gl.constexpr, GROUP_M: gl.constexpr,
           SIGNED: gl.constexpr, E2M1: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_GS: gl.constexpr,
           ROW_SCALES: gl.constexpr, TWO: gl.constexpr, zq=None, W3: gl.constexpr = False, ZP: gl.constexpr = False,
           W2: gl.constexpr = False):
    """MMA warpgroup `me`: its blocks g = me, me + 2, ... of the CTA's tiles, decoded into the wgmma's register operand
    as `frag_rs_kernel._consumer_loop` does (the next owned block's words loaded while the wgmma run); at its last
    block of each tile the hand-over through `red` (the second) or the sum and y (the first)."""
    BM1: gl.constexpr = x_bufs.type.shape[1]
    BM2: gl.constexpr = x2_bufs.type.shape[1]
    STAGES: gl.constexpr = wq.type.shape[0]
    l1: gl.constexpr = _acc_layout(BM1)
    l2: gl.constexpr = _acc_layout(BM2)
    a1_layout: gl.constexpr = _a_layout(BM1)
    a2_layout: gl.constexpr = _a_layout(BM2)
    acc = gl.zeros((64, BM1), dtype=gl.float32, layout=l1)
    acc2 = gl.zeros((64, BM2), dtype=gl.float32, layout=l2)
    DTYPE: gl.constexpr = x_bufs.dtype
    pid = gl.program_id(0)
    total = my_tiles * num_blocks
    mine = gl.cdiv(total - me, 2)
    last = me + 2 * (mine - 1)  # its last block
    w, lo, hi = _block_words(wq, sq, ready, empty, me, DTYPE, E2M1, zq, me, W3, ZP, W2)
    kb = me  # block g's K block in its tile t, counted along (no division a block: every tile has >= 2 blocks, so
    t = 0  # the next owned block is at most one tile on)
    for i in range(mine):
        g = 2 * i + me
        wrap = (kb + 2 >= num_blocks).to(gl.int32)
        kb_next = kb + 2 - wrap * num_blocks
        t_next = t + wrap
        a0, a1 = _decoded(w, lo, hi, DTYPE, a1_layout, SIGNED, E2M1, W3, ZP, W2)
        acc, acc2, b0, b1 = _block_mma(a0, a1, x_bufs, x2_bufs, x_ready, g, acc, acc2, TWO, a2_layout)
        more = (g + 2 <= last).to(gl.int32)  # (else the last block's words again: still held)
        nxt = g + 2 * more
        w, lo, hi = _block_words(wq, sq, ready, empty, nxt, DTYPE, E2M1, zq, more * kb_next + (1 - more) * kb, W3, ZP,
                                 W2)
        if TWO:
            acc, acc2, a0, a1, b0, b1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, a0, a1, b0, b1))
        else:
            acc, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a0, a1))
        mbarrier.arrive(empty.index(g % STAGES), count=1)
        if wrap == 1:  # this warpgroup's last block of its tile t (the next owned one is past it)
            if me == 1:
                mbarrier.wait(red_bar.index(1), (t & 1) ^ 1)  # the previous tile's partial taken
                red.store(acc)
                if TWO:
                    red2.store(acc2)
                mbarrier.arrive(red_bar.index(0), count=1)
            else:
                mbarrier.wait(red_bar.index(0), t & 1)
                acc = acc + red.load(l1)
                if TWO:
                    acc2 = acc2 + red2.load(l2)
                mbarrier.arrive(red_bar.index(1), count=1)
                off_m, off_n = _tile_origin(M, N, BM, 64, GROUP_M, pid + t * gl.num_programs(0))
                _store_tile(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES, HAS_BIAS,
                            gs_ptr, _pow2(E2M1), HAS_GS, True)
                if TWO:
                    _store_tile(acc2, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m + BM1, off_n, ROW_SCALES,
                                HAS_BIAS, gs_ptr, _pow2(E2M1), HAS_GS, True)
            acc = gl.zeros((64, BM1), dtype=gl.float32, layout=l1)
            acc2 = gl.zeros((64, BM2), dtype=gl.float32, layout=l2)
        kb = kb_next
        t = t_next


@gluon.jit
def frag_rsp_kernel(x_desc, x2_desc, w_desc, s_desc, z_desc, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N, K, nb, stride_ym,
                    STAGES: gl.constexpr, GROUP_M: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr,
                    SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, PANEL: gl.constexpr, MMA_REGS: gl.constexpr,
                    E2M1: gl.constexpr, HAS_GS: gl.constexpr, ROW_SCALES: gl.constexpr, TWO: gl.constexpr,
                    W8: gl.constexpr = False, W3: gl.constexpr = False, ZP: gl.constexpr = False,
                    W2: gl.constexpr = False):
    BM1: gl.constexpr = x_desc.block_type.shape[0]
    BM2: gl.constexpr = x2_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    gl.static_assert(BK == 64, "x comes in 64-K halves of a 128-K frag block")
    gl.static_assert(not W8, "8-bit codes: a 64-K block is one x slice (the one-tile kernel runs them)")
    gl.static_assert(not ((W2 or W3 or ZP) and E2M1), "2- or 3-bit codes and zero points: integer words")
    if TWO:
        BM: gl.constexpr = BM1 + BM2
    else:
        BM: gl.constexpr = BM1
    x_bufs, x2_bufs, wq, sq, ready, empty, x_ready, red_bar = _rs_smem(x_desc, x2_desc, w_desc, s_desc, STAGES, TWO,
                                                                       False, W3)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    red = gl.allocate_shared_memory(gl.float32, [64, BM1], flat)
    if TWO:
        red2 = gl.allocate_shared_memory(gl.float32, [64, BM2], flat)
    else:
        red2 = red
    if ZP:
        ZR: gl.constexpr = max(2, z_desc.block_type.shape[0])
        zq = gl.allocate_shared_memory(z_desc.dtype, [STAGES, ZR, 64], z_desc.layout)
    else:
        zq = sq
    num_blocks = _rs_blocks(K, BK, False)
    tiles = gl.cdiv(M, BM) * gl.cdiv(N, 64)
    my_tiles = gl.cdiv(tiles - gl.program_id(0), gl.num_programs(0))
    lo_units = 2 * gl.cdiv(K, 512)
    gl.warp_specialize([
        (_p_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, red, red2, xs_ptr, gs_ptr, bias_ptr, y_ptr,
                  M, N, stride_ym, my_tiles, num_blocks, 0, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS, ROW_SCALES,
                  TWO, zq, W3, ZP, W2)),
        (_p_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, red, red2, xs_ptr, gs_ptr, bias_ptr, y_ptr,
                  M, N, stride_ym, my_tiles, num_blocks, 1, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS, ROW_SCALES,
                  TWO, zq, W3, ZP, W2)),
        (_p_loader, (w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, M, N, nb,
                     my_tiles, num_blocks, BM, GROUP_M, SCALE_PER_BLOCK, GB, PANEL, TWO, z_desc, zq, lo_units, W3, ZP,
                     W2)),
    ], [4, 1], [MMA_REGS, 48])
# fmt: on
