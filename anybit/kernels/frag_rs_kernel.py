"""The Gluon kernel of `anybit.kernels.frag_rs` (sm_90a): y = x @ dequantize(W)^T for 4-bit integer, e2m1 (NVFP4,
MXFP4) or 8-bit integer weights in the fragment layout — and 2- and 3-bit integers (`W2`, `W3`), integer zero points
(`ZP`) — with the decoded weight as the wgmma's register operand — no shared-memory round trip of the decoded tile (the
warp-specialised `frag_ws_kernel` stores it and its SS wgmma reads it back: ~44 KB of shared traffic a 64-K step at 96
tokens, session 21).

Per CTA: 64 weight rows (the wgmma's M) by BM tokens (its N), three partitions:

* loader (1 warp): each 128-K block's words (one 4 KB TMA copy of the 64-row panel) and scale row(s) into slot
  b % STAGES of the word ring (`_w_fetch`), x's two [BM, 64] halves into the x ring (`_x_issue`);
* two MMA warpgroups taking alternate blocks (intra-CTA split K): each loads its block's words from shared memory
  in the wgmma A operand's own thread order (`_words_layout`: a thread's 16 bytes are its row's four words of the
  block, which hold its A fragments of all eight k16 slabs — `anybit.kernels.frag_layout`), decodes them in
  registers as the warp-specialised kernel's decoder does (`_pairs`), runs two wgmma (one a 64-K half) and waits
  for them: no register operand is rewritten while a wgmma reads it, and the other warpgroup's block keeps the
  tensor cores busy meanwhile (8-bit codes, `W8`: a block is 64 K, one x slice, one wgmma). Each waits only for its
  own blocks, so with an odd number of slots it first waits for the release of the slot's previous block
  (`_block_words`, `frag_rs.RS_MIN_STAGES`);
* at the end the second warpgroup's fp32 tile goes through shared memory (the x slots of its last block; W8, whose
  x ring has one slot a block: slots 0 and 1 once the first's loop is done — `_partial`) to the first, which stores
  y (times the e2m1 power of two, NVFP4's global scale, x's per-row scales of FP8 codes: `_store_tile`).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from anybit.kernels.frag_ws_kernel import (
    _byte_values,
    _e2m1_scales,
    _pairs,
    _pairs2,
    _pairs_zp,
    _pow2,
    _scaled,
    _store_tile,
    _tile_origin,
    _w_fetch,
    _words3,
    _x_issue2,
    _zero_offsets,
)


@gluon.constexpr_function
def _words_layout():
    """A block's words as [64 rows, 4 (t), 4 (c)] int32 (word 4t + c), as the wgmma's A fragments want them: register
    bits c and row + 8, lane bits t = lane % 4 and row = lane // 4, warp bits rows of 16."""
    lanes = [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0]],
        lane_bases=lanes,
        warp_bases=[[16, 0, 0], [32, 0, 0]],
        block_bases=[],
        shape=[64, 4, 4],
    )


@gluon.constexpr_function
def _words2_layout():
    """Half a 2-bit block's words as [64 rows, 4 (t), 2 (q)] (word 4t + 2h + q of the slot, `_block_words`): the
    layout `_words_layout` leaves after its last register bit (h) is selected away."""
    lanes = [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    return gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [8, 0, 0]],
        lane_bases=lanes,
        warp_bases=[[16, 0, 0], [32, 0, 0]],
        block_bases=[],
        shape=[64, 4, 2],
    )


@gluon.constexpr_function
def _acc_layout(tokens):
    """A warpgroup's fp32 [64 weight rows, tokens] wgmma accumulator."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, tokens, 16])


@gluon.constexpr_function
def _a_layout(tokens):
    """The register A operand [64, 64 K] of a wgmma onto `_acc_layout(tokens)`."""
    return gl.DotOperandLayout(operand_index=0, parent=_acc_layout(tokens), k_width=2)


# fmt: off
@gluon.jit
def _a_operand(r0, r1, r2, r3, DTYPE: gl.constexpr, a_layout: gl.constexpr):
    """The four pairs of a block's words [64, 4 (t), 4 (c)] (`_pairs`: pair j holds k = 32 c + 8 j + 2 t + e) -> the
    block's two 64-K halves [64, 64], as the wgmma's register operand (`a_layout`): a register renaming."""
    rr = gl.join(gl.join(r0, r2), gl.join(r1, r3))  # [64, 4, 4, 2 (j1), 2 (j0)]: j = 2 j1 + j0
    lo = rr.to(gl.int16).to(DTYPE, bitcast=True)  # e = 0
    hi = (rr >> 16).to(gl.int16).to(DTYPE, bitcast=True)  # e = 1
    v = gl.permute(gl.join(lo, hi), [0, 2, 3, 4, 1, 5])  # (row, c, j1, j0, t, e): k = 32 c + 16 j1 + 8 j0 + 2 t + e
    v0, v1 = gl.split(gl.permute(gl.reshape(v, [64, 2, 64]), [0, 2, 1]))  # the halves k < 64 and k >= 64
    return gl.convert_layout(v0, a_layout), gl.convert_layout(v1, a_layout)


@gluon.jit
def _a_operand_bytes(words, s, SIGNED: gl.constexpr, a_layout: gl.constexpr):
    """A 64-K block of 8-bit words [64, 4 (t), 4 (c)] (byte e + 2j of word 4t + c: k = 16 c + 8 j + 2 t + e) and the
    row's scale beside each word -> the block [64, 64] in x's dtype as the wgmma's register operand (`a_layout`):
    the warp-specialised kernel's byte decode (`_byte_values`), then a register renaming."""
    v = gl.permute(_byte_values(words, s, SIGNED), [0, 2, 3, 1, 4])  # (row, t, c, j, e) -> (row, c, j, t, e)
    return gl.convert_layout(gl.reshape(v, [64, 64]), a_layout)


@gluon.jit
def _row_values(buf, DTYPE: gl.constexpr, layout: gl.constexpr):
    """A slot's 64 per-row values (scales, zero points) as [64, 1, 1] in the rows of `layout` (of the words)."""
    flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    v = buf._reinterpret(DTYPE, [64], flat1).load(gl.SliceLayout(1, gl.SliceLayout(2, layout)))
    return gl.expand_dims(gl.expand_dims(v, 1), 2)


@gluon.jit
def _group_values(buf, h, DTYPE: gl.constexpr):
    """Groups 2h and 2h + 1 of a slot's 4 rows of 64 per-row values (a 256-K block's 64-K groups of 2-bit codes) as
    [64, 1, 2] in `_words2_layout`: group 2h + q beside the row's word q."""
    flat2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    v = buf._reinterpret(DTYPE, [2, 2, 64], flat2).index(h).permute((1, 0))
    return gl.expand_dims(v.load(gl.SliceLayout(1, _words2_layout())), 1)


@gluon.jit
def _half_words(words, h):
    """A slot's 2-bit words [64, 4 (t), 4 (q)] -> words 2h and 2h + 1 of each thread's [64, 4, 2] in
    `_words2_layout` (h a run-time 0 or 1: one select a register)."""
    a, b = gl.split(gl.permute(gl.reshape(words, [64, 4, 2, 2]), [0, 1, 3, 2]))
    return gl.convert_layout(gl.where(h == 0, a, b), _words2_layout())


@gluon.jit
def _decoded(w, lo, hi, DTYPE: gl.constexpr, a_layout: gl.constexpr, SIGNED: gl.constexpr, E2M1: gl.constexpr,
             W3: gl.constexpr, ZP: gl.constexpr, W2: gl.constexpr):
    """A 128-K block's words and scales (`_block_words`) -> its two 64-K halves as the wgmma's register operand."""
    s_lo, _ = gl.broadcast(lo, w)
    s_hi, _ = gl.broadcast(hi, w)
    if W2:
        r0, r1, r2, r3 = _pairs2(w, s_lo, s_hi, SIGNED, ZP)
    elif ZP:
        r0, r1, r2, r3 = _pairs_zp(w, s_lo, s_hi)
    else:
        r0, r1, r2, r3 = _pairs(w, s_lo, s_hi, SIGNED, E2M1, W3)
    return _a_operand(r0, r1, r2, r3, DTYPE, a_layout)


@gluon.jit
def _block_mma(a0, a1, x_bufs, x2_bufs, x_ready, b, acc, acc2, TWO: gl.constexpr, a2_layout: gl.constexpr):
    """Block b's wgmma (not waited for) once its x has landed in x slots 2b, 2b + 1 (of 2 STAGES): the halves a0, a1
    on x's first BM1 tokens, and (TWO) the same registers renamed (b0, b1) on the BM2 after them — issued first: a
    warpgroup's first wgmma of the other shape waits for the chain before it to drain (ncu, session 41: the first
    64 x 32 after eight 64 x 128 held the most stall samples of the 160-token wide kernel), and the smaller part
    drains sooner. Returns acc, acc2, b0, b1 (a0, a1 without TWO) — the wait's deps."""
    STAGES: gl.constexpr = x_bufs.type.shape[0] // 2
    x0 = (2 * b) % (2 * STAGES)
    mbarrier.wait(x_ready.index(x0), (b // STAGES) & 1)
    mbarrier.wait(x_ready.index(x0 + 1), (b // STAGES) & 1)
    b0 = a0
    b1 = a1
    if TWO:  # the same registers as the other N's operand (a renaming); the smaller part first (see the docstring)
        b0 = gl.convert_layout(a0, a2_layout)
        b1 = gl.convert_layout(a1, a2_layout)
        acc2 = warpgroup_mma(b0, x2_bufs.index(x0).permute((1, 0)), acc2, is_async=True)
        acc2 = warpgroup_mma(b1, x2_bufs.index(x0 + 1).permute((1, 0)), acc2, is_async=True)
    acc = warpgroup_mma(a0, x_bufs.index(x0).permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(a1, x_bufs.index(x0 + 1).permute((1, 0)), acc, is_async=True)
    return acc, acc2, b0, b1


@gluon.jit
def _block_words(wq, sq, ready, empty, b, DTYPE: gl.constexpr, E2M1: gl.constexpr, zq=None, kb=0,
                 W3: gl.constexpr = False, ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """Block b's words [64, 4 (t), 4 (c)] (`_words_layout`) and the scales of each word's pairs 0, 1 and 2, 3 (per row
    and c), from its slot of the word ring once the slot has landed. With an odd number D of slots, first the
    release of the slot's previous block b - D (the other warpgroup's): the parity wait on `ready` cannot tell b's
    phase from b - 2D's, so it would pass at once while b - D is still in flight (`frag_rs.RS_MIN_STAGES`); b - 2D
    is this warpgroup's own, so this wait is exact. With an even D, b - D is this warpgroup's own already.
    W3: the 4-bit words rebuilt from the slot's low and high units (`frag_layout.pack_frag3`; kb: the block's index in
    the whole K, whose parity picks the units' bits). ZP: the third value is each row's MAGIC + zero point in x's
    dtype (`_pairs_zp`) instead of the scales of pairs 2, 3. W2: the slot holds the layout's 256-K block of 2-bit
    words; block kb is its half kb % 2 — words 2h, 2h + 1 of each row [64, 4, 2], and their groups' scales (and zero
    points) [64, 1, 2] where groups are 64 K (four scale rows a slot), else the row's [64, 1, 1]."""
    D: gl.constexpr = wq.type.shape[0]
    wl: gl.constexpr = _words_layout()
    s = b % D
    if D % 2 == 1:  # (a fresh barrier passes the parity-1 wait: blocks 0 .. D - 1 have no predecessor)
        mbarrier.wait(empty.index(s), ((b // D) & 1) ^ 1)
    mbarrier.wait(ready.index(s), (b // D) & 1)
    flat3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    if W3:  # the slot's low unit, then its high unit
        units = wq.index(s)._reinterpret(gl.int32, [128, 4, 4], flat3)
        lo = units.slice(0, 64, dim=0).load(wl)
        hi = units.slice(64, 64, dim=0).load(wl)
        words = _words3(lo, hi, kb)
    else:
        words = wq.index(s)._reinterpret(gl.int32, [64, 4, 4], flat3).load(wl)
    SG: gl.constexpr = sq.type.shape[1]
    if W2:  # this block's half of the 256-K block
        words = _half_words(words, kb % 2)
        vl: gl.constexpr = _words2_layout()
    else:
        vl: gl.constexpr = wl
    if E2M1:  # each word's group scales (`frag_ws_kernel._e2m1_scales`, the same (n, t, c) view of the words)
        lo, hi = _e2m1_scales(sq.index(s), wl, E2M1, DTYPE)
    elif W2 and SG == 4:  # each 2-bit word's 64-K group
        lo = _group_values(sq.index(s), kb % 2, DTYPE)
        hi = lo
        if ZP:
            hi = _zero_offsets(_group_values(zq.index(s), kb % 2, gl.uint8), DTYPE)
    else:  # the row's scale beside each of its words
        lo = _row_values(sq.index(s), DTYPE, vl)
        hi = lo
        if ZP:
            hi = _zero_offsets(_row_values(zq.index(s), gl.uint8, vl), DTYPE)
    return words, lo, hi  # the scales [64, 1, 4] (ints [64, 1, 1]): broadcast where they are used


@gluon.jit
def _loader(w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, off_m, off_n, nb,
            num_blocks, k0, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, PANEL: gl.constexpr, TWO: gl.constexpr,
            W8: gl.constexpr = False, w_row0=0, s_row0=0, z_desc=None, zq=None, lo_units=0,
            W3: gl.constexpr = False, ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """This CTA's block b (K block k0 + b) — its words and scales into slot b % STAGES of the word ring, x's halves
    (BM1 rows, and BM2 more: TWO) into slots 2b, 2b + 1 of the x rings (2 STAGES) — once its consumer released the
    slot. W8: a block of 8-bit codes is 64 K, one x slice, into slot b of x rings of STAGES slots. w_row0, s_row0:
    the first word and scale rows of the weight (an expert of a stack, `moe_rs_kernel`). W3, ZP, W2: 3-bit units, zero
    points, 2-bit blocks (`_w_fetch`)."""
    STAGES: gl.constexpr = wq.type.shape[0]
    for b in range(num_blocks):
        s = b % STAGES
        mbarrier.wait(empty.index(s), ((b // STAGES) & 1) ^ 1)
        _w_fetch(w_desc, s_desc, wq, sq, ready, s, w_row0, s_row0, off_n // PANEL, nb, off_n, k0 + b,
                 k0 + num_blocks, GB, SCALE_PER_BLOCK, z_desc, zq, lo_units, W3, ZP, W2)
        if W8:  # slot b, x's K step k0 + b
            _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, b, num_blocks, STAGES, TWO, k0)
        else:
            _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, 2 * b, 2 * num_blocks, 2 * STAGES, TWO,
                      2 * k0)
            _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, 2 * b + 1, 2 * num_blocks, 2 * STAGES, TWO,
                      2 * k0)


@gluon.jit
def _consumer_loop(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, num_blocks, me, SIGNED: gl.constexpr,
                   E2M1: gl.constexpr, TWO: gl.constexpr, DIAG: gl.constexpr, W8: gl.constexpr = False, zq=None, k0=0,
                   W3: gl.constexpr = False, ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """Blocks me, me + 2, ...: each decoded into the A operand, two wgmma (one a 64-K half; four with TWO: the BM2
    tokens after the first BM1 into a second accumulator), the next block's words loaded while they run (as
    Humming's mainloop does; up to 192 tokens), waited for. Returns the fp32 [64, BM1] and [64, BM2]
    partial products (the second a copy of the first without TWO). W3, ZP, W2 (k0: the first block's index in the
    whole K): 3-bit codes, zero points, 2-bit codes (`_block_words`). (Decoding the next block into a second set of
    registers while this block's wgmma run, both kept alive by the wait's deps, made ptxas wait after every
    wgmma: sm_90a, session 21.)"""
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
    # the next block's words ride over the loop's back edge below 256 tokens (at 256 the e2m1 scales spill)
    AHEAD: gl.constexpr = (BM1 + BM2 if TWO else BM1) <= 192
    mine = gl.cdiv(num_blocks - me, 2)
    last = me + 2 * gl.maximum(mine - 1, 0)  # this warpgroup's last block
    if AHEAD:  # its first block's words (with no block of its own, block 0's: landed, read, never used)
        first = gl.minimum(me, num_blocks - 1)
        w, lo, hi = _block_words(wq, sq, ready, empty, first, DTYPE, E2M1, zq, k0 + first, W3, ZP, W2)
    for i in range(mine):
        b = 2 * i + me
        if not AHEAD:
            w, lo, hi = _block_words(wq, sq, ready, empty, b, DTYPE, E2M1, zq, k0 + b, W3, ZP, W2)
        if W8:  # one 64-K block of bytes, one x slice (slot b), one wgmma per token tile
            s_lo, _ = gl.broadcast(lo, w)
            a0 = _a_operand_bytes(w, s_lo, SIGNED, a1_layout)
            x0 = b % STAGES
            mbarrier.wait(x_ready.index(x0), (b // STAGES) & 1)
            acc = warpgroup_mma(a0, x_bufs.index(x0).permute((1, 0)), acc, is_async=True)
            if TWO:
                b0 = gl.convert_layout(a0, a2_layout)
                acc2 = warpgroup_mma(b0, x2_bufs.index(x0).permute((1, 0)), acc2, is_async=True)
            if AHEAD:
                nxt = gl.minimum(b + 2, last)
                w, lo, hi = _block_words(wq, sq, ready, empty, nxt, DTYPE, E2M1, zq, k0 + nxt, W3, ZP, W2)
            if TWO:
                acc, acc2, a0, b0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, a0, b0))
            else:
                acc, a0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a0))
            mbarrier.arrive(empty.index(b % STAGES), count=1)
        else:
            if DIAG:  # timing only: the words themselves as the operand, no decode (wrong results)
                a0, a1 = _a_operand(w, w, w, w, DTYPE, a1_layout)
            else:
                a0, a1 = _decoded(w, lo, hi, DTYPE, a1_layout, SIGNED, E2M1, W3, ZP, W2)
            acc, acc2, b0, b1 = _block_mma(a0, a1, x_bufs, x2_bufs, x_ready, b, acc, acc2, TWO, a2_layout)
            if AHEAD:  # the next block's words while the wgmma run (the last block's again at the end: still held)
                nxt = gl.minimum(b + 2, last)
                w, lo, hi = _block_words(wq, sq, ready, empty, nxt, DTYPE, E2M1, zq, k0 + nxt, W3, ZP, W2)
            if TWO:
                acc, acc2, a0, a1, b0, b1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, a0, a1, b0, b1))
            else:
                acc, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a0, a1))
            mbarrier.arrive(empty.index(b % STAGES), count=1)
    return acc, acc2


@gluon.jit
def _partial(x_bufs, num_blocks, W8: gl.constexpr):
    """Where the second warpgroup leaves its fp32 [64, BM] partial product: the two x slots of its last block (or of
    block 1, unused, when it has none) — the same bytes, free once that block's wgmma retired (no later block takes
    them), so the reduction costs no shared memory of its own. W8 (a block holds one x slot): x slots 0 and 1, free
    once both warpgroups' loops are done (`_first` says so on `red_bar[1]`)."""
    BM: gl.constexpr = x_bufs.type.shape[1]
    BK: gl.constexpr = x_bufs.type.shape[2]
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    if W8:
        SLOTS: gl.constexpr = x_bufs.type.shape[0]
        pairs = x_bufs._reinterpret(x_bufs.dtype, [SLOTS // 2, 2 * BM, BK], flat)  # (an odd last slot left out)
        return pairs.index(0)._reinterpret(gl.float32, [64, BM], flat)
    else:
        STAGES: gl.constexpr = x_bufs.type.shape[0] // 2
        last = 1 + 2 * gl.maximum(gl.cdiv(num_blocks - 1, 2) - 1, 0)
        pairs = x_bufs._reinterpret(x_bufs.dtype, [STAGES, 2 * BM, BK], flat)
        return pairs.index(last % STAGES)._reinterpret(gl.float32, [64, BM], flat)


@gluon.jit
def _sum_splits(own, part, ws_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, SPLIT: gl.constexpr,
                HAS_BIAS: gl.constexpr):
    """y [tokens off_m.., weight rows off_n..] = the SPLIT parts' scaled partial products summed in part order — this
    part's (`own`, in registers) and the others' from their slices of the workspace [SPLIT, M, N], read through L2
    (`.cg`: other CTAs wrote them) — (+ bias, `_store_tile`): a tile of own's shape [64, BM] and layout."""
    layout: gl.constexpr = own.type.layout
    cols = off_n + gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    rows = off_m + gl.arange(0, own.shape[1], layout=gl.SliceLayout(0, layout))
    offs = gl.expand_dims(rows.to(gl.int64) * N, 0) + gl.expand_dims(cols, 1)
    mask = gl.expand_dims(rows < M, 0) & gl.expand_dims(cols < N, 1)
    if SPLIT == 2:  # (one add: the same bits either way round)
        total = own + gl.load(ws_ptr + (1 - part) * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
    else:
        total = gl.zeros(own.shape, dtype=gl.float32, layout=layout)
        for i in gl.static_range(SPLIT):
            other = gl.load(ws_ptr + i * M * N + offs, mask=mask & (part != i), other=0.0, cache_modifier=".cg")
            total += gl.where(part == i, own, other)
    _store_tile(total, None, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, False, HAS_BIAS, SWAPPED=True)


@gluon.jit
def _summed(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, num_blocks, SIGNED: gl.constexpr,
            E2M1: gl.constexpr, TWO: gl.constexpr, DIAG: gl.constexpr, W8: gl.constexpr, zq=None, k0=0,
            W3: gl.constexpr = False, ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """The first warpgroup's part: the even blocks (`_consumer_loop`), plus the odd ones' partial products from
    shared memory (`_partial`, once `_second` has stored them): the tile's fp32 [64, BM1] and [64, BM2] products."""
    acc, acc2 = _consumer_loop(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, num_blocks, 0, SIGNED, E2M1, TWO, DIAG,
                               W8, zq, k0, W3, ZP, W2)
    if W8:  # this warpgroup's wgmma no longer read x: the second may take slots 0 and 1 (`_partial`)
        mbarrier.arrive(red_bar.index(1), count=1)
    mbarrier.wait(red_bar.index(0), 0)
    acc = acc + _partial(x_bufs, num_blocks, W8).load(acc.type.layout)
    if TWO:
        acc2 = acc2 + _partial(x2_bufs, num_blocks, W8).load(acc2.type.layout)
    return acc, acc2


@gluon.jit
def _first(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr,
           M, N, stride_ym, off_m, off_n, num_blocks, SIGNED: gl.constexpr, E2M1: gl.constexpr,
           HAS_BIAS: gl.constexpr, HAS_GS: gl.constexpr, ROW_SCALES: gl.constexpr, TWO: gl.constexpr,
           DIAG: gl.constexpr, SPLIT: gl.constexpr, W8: gl.constexpr, zq, k0, W3: gl.constexpr, ZP: gl.constexpr,
           W2: gl.constexpr):
    """The even blocks, then the odd ones' partial products from shared memory (`_partial`), then y. Split K: each
    part adds 1 to the tile's counter; the SPLIT - 1 first in store their scaled partial products (no bias) into
    their slices of the fp32 workspace [SPLIT, M, N] and add SPLIT (release, after a barrier of this partition's
    threads); the last in waits (acquire) until they have (the counter at SPLIT x SPLIT — they are past their loops:
    a bounded wait), sums every part's products in part order with its own in registers (the same bits whichever
    part is last), adds the bias, stores y and re-arms the counter — no host synchronisation, replayable in a CUDA
    graph. (Each part stored its slice and the last read them all before, session 37: ~6 µs a split CTA on the H200
    at 128 tokens, ncu.)"""
    BM1: gl.constexpr = x_bufs.type.shape[1]
    acc, acc2 = _summed(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, num_blocks, SIGNED, E2M1, TWO, DIAG,
                        W8, zq, k0, W3, ZP, W2)
    if SPLIT == 1:
        _store_tile(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES, HAS_BIAS, gs_ptr,
                    _pow2(E2M1), HAS_GS, True)
        if TWO:
            _store_tile(acc2, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m + BM1, off_n, ROW_SCALES, HAS_BIAS,
                        gs_ptr, _pow2(E2M1), HAS_GS, True)
    else:  # one atomic counts the parts in; all but the last leave their scaled products in their slices and say so
        tile = gl.program_id(0)
        part = gl.program_id(1)
        own = _scaled(acc, xs_ptr, M, off_m, ROW_SCALES, gs_ptr, _pow2(E2M1), HAS_GS, True)
        own2 = own
        if TWO:
            own2 = _scaled(acc2, xs_ptr, M, off_m + BM1, ROW_SCALES, gs_ptr, _pow2(E2M1), HAS_GS, True)
        ahead = gl.atomic_add(cnt_ptr + tile, 1, sem="relaxed") % SPLIT  # the parts in before this one
        if ahead != SPLIT - 1:
            _store_tile(own, None, None, ws_ptr + part * M * N, M, N, N, off_m, off_n, False, False, SWAPPED=True)
            if TWO:
                _store_tile(own2, None, None, ws_ptr + part * M * N, M, N, N, off_m + BM1, off_n, False, False,
                            SWAPPED=True)
            gl.thread_barrier()
            gl.atomic_add(cnt_ptr + tile, SPLIT, sem="release")  # (after every thread's stores: the barrier)
        else:  # the last in: once the others' products have landed (SPLIT arrivals + SPLIT - 1 x SPLIT), y
            landed = gl.atomic_add(cnt_ptr + tile, 0, sem="acquire")
            while landed != SPLIT * SPLIT:
                landed = gl.atomic_add(cnt_ptr + tile, 0, sem="acquire")
            _sum_splits(own, part, ws_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, SPLIT, HAS_BIAS)
            if TWO:
                _sum_splits(own2, part, ws_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m + BM1, off_n, SPLIT,
                            HAS_BIAS)
            gl.atomic_xchg(cnt_ptr + tile, 0)


@gluon.jit
def _second(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, num_blocks, SIGNED: gl.constexpr,
            E2M1: gl.constexpr, TWO: gl.constexpr, DIAG: gl.constexpr, W8: gl.constexpr, zq=None, k0=0,
            W3: gl.constexpr = False, ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """The odd blocks; their partial products into shared memory for `_first`."""
    acc, acc2 = _consumer_loop(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, num_blocks, 1, SIGNED, E2M1, TWO, DIAG,
                               W8, zq, k0, W3, ZP, W2)
    if W8:
        mbarrier.wait(red_bar.index(1), 0)
    _partial(x_bufs, num_blocks, W8).store(acc)
    if TWO:
        _partial(x2_bufs, num_blocks, W8).store(acc2)
    mbarrier.arrive(red_bar.index(0), count=1)


@gluon.jit
def _rs_smem(x_desc, x2_desc, w_desc, s_desc, STAGES: gl.constexpr, TWO: gl.constexpr, W8: gl.constexpr,
             W3: gl.constexpr = False):
    """The kernel's shared memory: x rings of 2 STAGES slots (W8: STAGES, a block's x is one slice) of BM1 (and, TWO,
    BM2) tokens by 64 K, the word and scale ring of STAGES slots (W3: a block's two 3-bit units a slot), their
    barriers, and `red_bar` (the second warpgroup's partial landed; W8: x slots 0 and 1 free for it)."""
    BM1: gl.constexpr = x_desc.block_type.shape[0]
    BM2: gl.constexpr = x2_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    if W8:
        XS: gl.constexpr = STAGES
    else:
        XS: gl.constexpr = 2 * STAGES
    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [XS, BM1, BK], x_desc.layout)
    if TWO:
        x2_bufs = gl.allocate_shared_memory(x_desc.dtype, [XS, BM2, BK], x2_desc.layout)
    else:
        x2_bufs = x_bufs
    wq = gl.allocate_shared_memory(gl.int32, [STAGES, 8 if W3 else 4, 256], w_desc.layout)
    sq = gl.allocate_shared_memory(s_desc.dtype, [STAGES, s_desc.block_type.shape[0], 64], s_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    x_ready = gl.allocate_shared_memory(gl.int64, [XS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(XS):
        mbarrier.init(x_ready.index(i), count=1)
    red_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(red_bar.index(0), count=1)
    mbarrier.init(red_bar.index(1), count=1)
    return x_bufs, x2_bufs, wq, sq, ready, empty, x_ready, red_bar


@gluon.jit
def _rs_blocks(K, BK: gl.constexpr, W8: gl.constexpr):
    """The K blocks of a weight: 128 K (two x slices), 64 for 8-bit codes; x past K is zero-filled by TMA, the frag
    codes there are 0."""
    if W8:
        return gl.cdiv(K, BK)
    else:
        return gl.cdiv(K, 2 * BK)


@gluon.jit
def frag_rs_kernel(x_desc, x2_desc, w_desc, s_desc, z_desc, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                   nb, stride_ym, STAGES: gl.constexpr, GROUP_M: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr,
                   GB: gl.constexpr, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, PANEL: gl.constexpr,
                   MMA_REGS: gl.constexpr, E2M1: gl.constexpr, HAS_GS: gl.constexpr, ROW_SCALES: gl.constexpr,
                   TWO: gl.constexpr, DIAG: gl.constexpr, SPLIT: gl.constexpr = 1, W8: gl.constexpr = False,
                   W3: gl.constexpr = False, ZP: gl.constexpr = False, W2: gl.constexpr = False):
    BM1: gl.constexpr = x_desc.block_type.shape[0]
    BM2: gl.constexpr = x2_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    gl.static_assert(BK == 64, "x comes in 64-K halves of a 128-K frag block (W8: a whole 64-K one)")
    gl.static_assert(not (W8 and (E2M1 or DIAG)), "8-bit integer codes: no e2m1 scales, no diag")
    gl.static_assert(not ((W2 or W3 or ZP) and (W8 or E2M1)), "2- or 3-bit codes and zero points: integer words")
    if TWO:
        BM: gl.constexpr = BM1 + BM2
    else:
        BM: gl.constexpr = BM1
    off_m, off_n = _tile_origin(M, N, BM, 64, GROUP_M)
    x_bufs, x2_bufs, wq, sq, ready, empty, x_ready, red_bar = _rs_smem(x_desc, x2_desc, w_desc, s_desc, STAGES, TWO,
                                                                       W8, W3)
    if ZP:  # the blocks' zero-point rows beside their scale rows (64 bytes in 128: a TMA copy's shared-memory
        # destination must be 128-byte aligned — slots of 64 bytes made every odd one a misaligned address)
        ZR: gl.constexpr = max(2, z_desc.block_type.shape[0])  # (2-bit codes in 64-K groups: 4 rows a slot)
        zq = gl.allocate_shared_memory(z_desc.dtype, [STAGES, ZR, 64], z_desc.layout)
    else:
        zq = sq
    num_blocks = _rs_blocks(K, BK, W8)
    lo_units = 2 * gl.cdiv(K, 512)  # W3: where a row's high units start (`frag_layout.frag3_low_units`)
    k0 = 0
    if SPLIT > 1:  # this CTA's share of the K blocks (the host keeps every split's share non-empty)
        per = gl.cdiv(num_blocks, SPLIT)
        k0 = gl.program_id(1) * per
        num_blocks = gl.minimum(per, num_blocks - k0)
    gl.warp_specialize([
        (_first, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr,
                  cnt_ptr, M, N, stride_ym, off_m, off_n, num_blocks, SIGNED, E2M1, HAS_BIAS, HAS_GS, ROW_SCALES, TWO,
                  DIAG, SPLIT, W8, zq, k0, W3, ZP, W2)),
        (_second, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, num_blocks, SIGNED, E2M1, TWO, DIAG, W8, zq,
                   k0, W3, ZP, W2)),
        (_loader, (w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, off_m, off_n, nb,
                   num_blocks, k0, SCALE_PER_BLOCK, GB, PANEL, TWO, W8, 0, 0, z_desc, zq, lo_units, W3, ZP, W2)),
    ], [4, 1], [MMA_REGS, 48])
# fmt: on
