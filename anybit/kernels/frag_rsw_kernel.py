"""The wide persistent stream-K register-operand kernel (written in session 38, GPU-run and routed since session 39:
`frag_rsp.rsw_tile`). Why: the register-operand kernels' two MMA warpgroups
split K over the same 64 weight rows, so every 128-K block a CTA reads x's [tokens, 128] slice (32 KB at 128 tokens)
for 4 KB of weight words, and x crosses L2 once for every 64-row weight tile; the stream-K form (`frag_rsp_kernel`)
ran 3.39 tiles' blocks a CTA instead of 4 and was no faster — per block it slowed as more SMs ran it (BENCHMARKS.md,
session 38). Here the two warpgroups take the two 64-row panels of a 128-row weight tile and share each block's x
slices: half the x traffic for the same registers and decode work a warpgroup.

Per CTA (P persistent CTAs, one an SM), three partitions:

* loader (1 warp): the CTA's run of K blocks (`frag_rsp_kernel._run` with one block a unit: all tiles' blocks cut
  into P runs as even as they come), block g's words and scale rows of panel q into word slot 2 (g % STAGES) + q
  (`frag_ws_kernel._w_fetch`, a barrier each), x's two 64-K halves into x slots 2g, 2g + 1 (of 2 STAGES), once both
  warpgroups released the stage (`empty`, two arrivals);
* two MMA warpgroups, `me` the panel: every block of the run — its panel's words decoded into the wgmma's register
  operand (`frag_rs_kernel._block_words` on the panel slots: slot index 2g + me of a 2 STAGES ring, so its phases
  are exact and no odd-ring guard is needed), two wgmma on the shared x slices, the next block's words loaded while
  they run, the wait, the release. At the end of each segment (a run's piece of a tile) a warpgroup stores its 64
  rows' products, or sums a tile shared with other CTAs through `frag_rsp_kernel._fixup` with a counter and
  workspace slots of its own (LANES 2): up to 128 tokens a tile the CTA holding the tile's first block sums it, the
  others announcing their parts under their next segment's wgmma (HEAD, LATE); above, the last CTA in (a ticket).

No 8-bit codes (a block of bytes is 64 K, one x slice), no split K (stream-K is the split).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from anybit.kernels.frag_rs_kernel import _a_layout, _block_mma, _block_words, _decoded, _rs_blocks
from anybit.kernels.frag_rsp_kernel import (
    _checks,
    _counter,
    _fixup,
    _release,
    _retire,
    _run,
    _segment,
    _store_tiles,
    _token_tile,
    _zero_accs,
    _zero_ring,
)
from anybit.kernels.frag_ws_kernel import _tile_origin, _w_fetch, _x_issue2


# fmt: off
@gluon.jit
def _w_loader(w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, M, N, nb, tiles,
              num_blocks, BM: gl.constexpr, GROUP_M: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr,
              PANEL: gl.constexpr, TWO: gl.constexpr, z_desc=None, zq=None, lo_units=0, W3: gl.constexpr = False,
              ZP: gl.constexpr = False, W2: gl.constexpr = False, times_ptr=None, TIMES: gl.constexpr = False):
    """Every block of the CTA's run in order: each panel's words and scales into its word slot, x's halves into
    x slots 2g, 2g + 1, once every MMA warpgroup released the stage. TIMES: its start and end (`_w_mma`'s slots 19,
    18)."""
    STAGES: gl.constexpr = x_bufs.type.shape[0] // 2
    P: gl.constexpr = wq.type.shape[0] // STAGES  # the tile's 64-row panels
    u0, u1, t0, t1 = _run(tiles, num_blocks, False)
    if TIMES:
        gl.store(times_ptr + gl.program_id(0) * 20 * P + 19, _now(t0))
    g = 0
    for t in range(t0, t1 + 1):
        off_m, off_n = _tile_origin(M, N, BM, 64 * P, GROUP_M, t)
        kb_lo, kb_hi = _segment(t, u0, u1, num_blocks, False)
        for kb in range(kb_lo, kb_hi):
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            for q in gl.static_range(P):
                _w_fetch(w_desc, s_desc, wq, sq, ready, P * s + q, 0, 0, (off_n + 64 * q) // PANEL, nb, off_n + 64 * q,
                         kb, num_blocks, GB, SCALE_PER_BLOCK, z_desc, zq, lo_units, W3, ZP, W2)
            # x slot 2g (+ 1), x's K step 2kb (+ 1): the slot counter plus 2 (kb - g)
            _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, 2 * g, 2 * g + 2, 2 * STAGES, TWO,
                      2 * (kb - g))
            _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, 2 * g + 1, 2 * g + 2, 2 * STAGES, TWO,
                      2 * (kb - g))
            g += 1
    if TIMES:
        gl.store(times_ptr + gl.program_id(0) * 20 * P + 18, _now(g))


@gluon.jit
def _w_mma(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, M,
           N, stride_ym, tiles, num_blocks, me: gl.constexpr, BM: gl.constexpr, GROUP_M: gl.constexpr,
           SIGNED: gl.constexpr, E2M1: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_GS: gl.constexpr,
           ROW_SCALES: gl.constexpr, TWO: gl.constexpr, zq=None, W3: gl.constexpr = False, ZP: gl.constexpr = False,
           W2: gl.constexpr = False, times_ptr=None, TIMES: gl.constexpr = False,
           CVT: gl.constexpr = False, HEAD: gl.constexpr = False, LATE: gl.constexpr = False):
    """MMA warpgroup `me` (the tile's panel me): every block of the CTA's run on its panel's words, the next block's
    words loaded while the wgmma run; at each segment's end its rows' products stored or summed (`_fixup`). (The
    warpgroups' wgmma issued in turns through two barriers, so one's products run while the other decodes, measured
    no faster: session 39, dab86c3.) TIMES (a
    diagnostic, `tools/rsw_timeline.py`): into times_ptr [CTA, warpgroup, 20] (int64) the warpgroup's %globaltimer at
    its start (0), when each of its first six segments' blocks are done (1 + i) and when their products are summed
    and stored (7 + i), at its end (13); its SM (14), its segment count (15) and which segments it stored (16, bits);
    in warpgroup 0's row also the kernel's entry (17) and the loader's end and start (18, 19).
    CVT: y stored 16 bytes a thread along its rows (`frag_rsp_kernel._store_tile_cvt`). HEAD: a shared tile summed
    by its first CTA, no ticket (`frag_rsp_kernel._fixup_head`). LATE (with HEAD): a part left for another CTA is
    announced (`_release`: a barrier, a fence that waits for the part's stores, the add) during the next segment's
    second block, under its wgmma, not at the segment's end — or before the next `_fixup` (which may wait) or at the
    run's end if that comes first: the tile's first CTA, which reads it, gets to it at the end of its own run."""
    BM1: gl.constexpr = x_bufs.type.shape[1]
    BM2: gl.constexpr = x2_bufs.type.shape[1]
    P: gl.constexpr = wq.type.shape[0] // (x_bufs.type.shape[0] // 2)  # the tile's 64-row panels
    a1_layout: gl.constexpr = _a_layout(BM1)
    a2_layout: gl.constexpr = _a_layout(BM2)
    acc, acc2 = _zero_accs(x_bufs, x2_bufs)
    DTYPE: gl.constexpr = x_bufs.dtype
    u0, u1, t0, t1 = _run(tiles, num_blocks, False)
    total = u1 - u0  # the run's blocks
    if TIMES:
        stamps = times_ptr + (gl.program_id(0) * P + me) * 20
        gl.store(stamps, _now(t0))
        gl.store(stamps + 14, _smid(t0))
        gl.store(stamps + 15, (t1 - t0 + 1).to(gl.int64))
        stored = (t0 * 0).to(gl.int64)
    # block g's panel me: word slot Pg + me of the P STAGES panel slots (phase (Pg + me) // (P STAGES) = g // STAGES)
    w, lo, hi = _block_words(wq, sq, ready, empty, me, DTYPE, E2M1, zq, u0 % num_blocks, W3, ZP, W2)
    g = 0
    owed = t0 * 0 - 1  # LATE: the tile whose part this warpgroup left unannounced, announced at block rel_at
    rel_at = owed
    for t in range(t0, t1 + 1):
        kb_lo, kb_hi = _segment(t, u0, u1, num_blocks, False)
        for kb in range(kb_lo, kb_hi):
            a0, a1 = _decoded(w, lo, hi, DTYPE, a1_layout, SIGNED, E2M1, W3, ZP, W2)
            acc, acc2, b0, b1 = _block_mma(a0, a1, x_bufs, x2_bufs, x_ready, g, acc, acc2, TWO, a2_layout)
            if LATE:
                if g == rel_at:
                    _release(_counter(cnt_ptr, owed, me, P), 1)
            # the next block's words (the next tile's block 0 past this segment; past the run, this block's again)
            more = (g + 1 < total).to(gl.int32)
            kb_next = gl.where(kb + 1 < kb_hi, kb + 1, 0)
            w, lo, hi = _block_words(wq, sq, ready, empty, P * (g + more) + me, DTYPE, E2M1, zq,
                                     more * kb_next + (1 - more) * kb, W3, ZP, W2)
            acc, acc2 = _retire(acc, acc2, a0, a1, b0, b1, empty, g, TWO)
            g += 1
        if TIMES:
            if t - t0 < 6:
                gl.store(stamps + 1 + t - t0, _now(t + g))
        if LATE:
            if rel_at >= g:  # (not yet announced: this segment was too short) before _fixup may wait
                _release(_counter(cnt_ptr, owed, me, P), 1)
        stores, acc, acc2 = _fixup(acc, acc2, ws_ptr, cnt_ptr, t, num_blocks, tiles, TWO, False, me, P, HEAD, LATE)
        if LATE:
            rel_at = gl.where(stores, -1, g + 1)  # a part left (HEAD: not the tile's first CTA): owed
            owed = t
        if stores:
            off_m, off_n = _tile_origin(M, N, BM, 64 * P, GROUP_M, t)
            _store_tiles(acc, acc2, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n + 64 * me,
                         ROW_SCALES, HAS_BIAS, E2M1, HAS_GS, TWO, CVT)
        if TIMES:
            if t - t0 < 6:
                gl.store(stamps + 7 + t - t0, _now(t + stores.to(gl.int32)))
            stored = stored | (stores.to(gl.int64) << (t - t0).to(gl.int64))
        acc, acc2 = _zero_accs(x_bufs, x2_bufs)
    if LATE:
        if rel_at >= g:
            _release(_counter(cnt_ptr, owed, me, P), 1)
    if TIMES:
        gl.store(stamps + 13, _now(t1))
        gl.store(stamps + 16, stored)


@gluon.jit
def _now(dep):
    """%globaltimer (ns), after `dep` (a scalar the asm takes, so it is not hoisted)."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [dep], dtype=gl.int64, is_pure=False,
                                     pack=1)


@gluon.jit
def _smid(dep):
    """The SM this runs on."""
    return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [dep], dtype=gl.int32, is_pure=False,
                                     pack=1).to(gl.int64)


@gluon.jit
def frag_rsw_kernel(x_desc, x2_desc, w_desc, s_desc, z_desc, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                    nb, stride_ym, STAGES: gl.constexpr, GROUP_M: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr,
                    GB: gl.constexpr, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, PANEL: gl.constexpr,
                    MMA_REGS: gl.constexpr, E2M1: gl.constexpr, HAS_GS: gl.constexpr, ROW_SCALES: gl.constexpr,
                    TWO: gl.constexpr, W8: gl.constexpr = False, W3: gl.constexpr = False, ZP: gl.constexpr = False,
                    W2: gl.constexpr = False, times_ptr=None,
                    TIMES: gl.constexpr = False, CVT: gl.constexpr = False, HEAD: gl.constexpr = False,
                    LATE: gl.constexpr = False, PANELS: gl.constexpr = 2):
    gl.static_assert(not (LATE and not HEAD), "LATE announces parts of the HEAD form only")
    gl.static_assert(PANELS == 2 or PANELS == 4, "a tile of two 64-row panels (two MMA warpgroups) or four")
    BM1: gl.constexpr = x_desc.block_type.shape[0]
    BM2: gl.constexpr = x2_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    _checks(x_desc, W8, W3, ZP, W2, E2M1)
    BM: gl.constexpr = _token_tile(BM1, BM2, TWO)
    if TIMES:
        gl.store(times_ptr + gl.program_id(0) * 20 * PANELS + 17, _now(M))
    # x rings of 2 STAGES slots shared by the warpgroups; a word ring of PANELS x STAGES panel slots (stage s, panel
    # q: PANELS s + q) with a barrier each; a stage released by every MMA warpgroup
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [2 * STAGES, BM1, BK], x_desc.layout)
    if TWO:
        x2_bufs = gl.allocate_shared_memory(x_desc.dtype, [2 * STAGES, BM2, BK], x2_desc.layout)
    else:
        x2_bufs = x_bufs
    wq = gl.allocate_shared_memory(gl.int32, [PANELS * STAGES, 8 if W3 else 4, 256], w_desc.layout)
    sq = gl.allocate_shared_memory(s_desc.dtype, [PANELS * STAGES, s_desc.block_type.shape[0], 64], s_desc.layout)
    zq = _zero_ring(z_desc, sq, ZP)
    ready = gl.allocate_shared_memory(gl.int64, [PANELS * STAGES, 1], mbarrier.MBarrierLayout())
    x_ready = gl.allocate_shared_memory(gl.int64, [2 * STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(PANELS * STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(2 * STAGES):
        mbarrier.init(x_ready.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(empty.index(i), count=PANELS)
    num_blocks = _rs_blocks(K, BK, False)
    tiles = gl.cdiv(M, BM) * gl.cdiv(N, 64 * PANELS)
    lo_units = 2 * gl.cdiv(K, 512)
    if PANELS == 4:  # four MMA warpgroups, a panel each, as workers with MMA_REGS registers; the loader the default
        # partition (its four warps hold the kernel's base registers, so the MMA warpgroups get the rest)
        gl.warp_specialize([
            (_w_loader, (w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, M, N, nb,
                         tiles, num_blocks, BM, GROUP_M, SCALE_PER_BLOCK, GB, PANEL, TWO, z_desc, zq, lo_units, W3,
                         ZP, W2, times_ptr, TIMES)),
            (_w_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr,
                      cnt_ptr, M, N, stride_ym, tiles, num_blocks, 0, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS,
                      ROW_SCALES, TWO, zq, W3, ZP, W2, times_ptr, TIMES, CVT, HEAD, LATE)),
            (_w_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr,
                      cnt_ptr, M, N, stride_ym, tiles, num_blocks, 1, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS,
                      ROW_SCALES, TWO, zq, W3, ZP, W2, times_ptr, TIMES, CVT, HEAD, LATE)),
            (_w_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr,
                      cnt_ptr, M, N, stride_ym, tiles, num_blocks, 2, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS,
                      ROW_SCALES, TWO, zq, W3, ZP, W2, times_ptr, TIMES, CVT, HEAD, LATE)),
            (_w_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr,
                      cnt_ptr, M, N, stride_ym, tiles, num_blocks, 3, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS,
                      ROW_SCALES, TWO, zq, W3, ZP, W2, times_ptr, TIMES, CVT, HEAD, LATE)),
        ], [4, 4, 4, 4], [MMA_REGS, MMA_REGS, MMA_REGS, MMA_REGS])
    else:
        gl.warp_specialize([
            (_w_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr,
                      cnt_ptr, M, N, stride_ym, tiles, num_blocks, 0, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS,
                      ROW_SCALES, TWO, zq, W3, ZP, W2, times_ptr, TIMES, CVT, HEAD, LATE)),
            (_w_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr,
                      cnt_ptr, M, N, stride_ym, tiles, num_blocks, 1, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS,
                      ROW_SCALES, TWO, zq, W3, ZP, W2, times_ptr, TIMES, CVT, HEAD, LATE)),
            (_w_loader, (w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, M, N, nb,
                         tiles, num_blocks, BM, GROUP_M, SCALE_PER_BLOCK, GB, PANEL, TWO, z_desc, zq, lo_units, W3,
                         ZP, W2, times_ptr, TIMES)),
        ], [4, 1], [MMA_REGS, 48])
# fmt: on
