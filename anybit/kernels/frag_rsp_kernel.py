"""The persistent, stream-K form of the register-operand kernel (`frag_rs_kernel`; on no route — GPU-tested, and as
fast as the one-tile kernel, not faster: BENCHMARKS.md, session 38):
P CTAs (one an SM) share the work of all tiles evenly — the K blocks of every tile, tile after tile, cut into P
runs at unit boundaries (`frag_rsp.shares`: a unit is two 128-K blocks, a tile's last unit three when its block
count is odd) — so 448 tiles on 132 SMs cost 3.39 tiles a CTA, not 4 waves (ncu at 128 tokens on 28672x8192,
session 37: our SMs busy 83 % of the cycles against Humming's 93 %, the gap its stream-K's). The rings run on across
a CTA's tiles (the loader fetches the next tile's first blocks while the warpgroups finish this one), so the first
block's latency is paid once a CTA, not once a tile (session 37's split tail, one-tile CTAs of half a tile's K: a
half cost 23.7 µs, not 17.6).

A CTA's blocks are numbered g = 0, 1, ... along its run and owned by parity (g % 2: the warpgroup), so the ring's
slots, phases and the odd-ring guard of `frag_rs_kernel._block_words` are those of one long tile; a run's piece of a
tile (a segment) holds two blocks at least, one each. At its last block of a segment the second warpgroup stores its
partial products into a buffer of their own (the x slots hold the next segment's x by then) and says so
(`red_bar[0]`); the first waits, adds them, frees the buffer (`red_bar[1]`, which the second waits for before its next
store: one segment ahead at most, so the parity waits are exact) and stores y — or, where the tile's K is shared
with other CTAs, takes a ticket: all but the last in leave their products in their slot of the workspace and say so,
the last waits for them (they are past their loops: a bounded wait), sums every part in CTA order (the same bits
whichever is last), stores y and re-arms the tile's counter (`_fixup`). No 8-bit codes (a block of bytes is 64 K,
one x slice).
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
from anybit.kernels.frag_ws_kernel import _pow2, _scaled, _store_tile, _tile_index, _tile_origin, _w_fetch, _x_issue2


# fmt: off
@gluon.jit
def _per_tile(nb, PAIRS: gl.constexpr):
    """A tile's units: pairs of its nb K blocks (the last three when nb is odd; this kernel), or blocks (PAIRS False:
    `frag_rsw_kernel`, whose warpgroups share every block)."""
    if PAIRS:
        return nb // 2
    else:
        return nb


@gluon.jit
def _run(tiles, nb, PAIRS: gl.constexpr = True):
    """This CTA's run of units [u0, u1) (of all tiles' units, split evenly among the CTAs) and its first and last
    tile — `frag_rsp.shares`."""
    per = _per_tile(nb, PAIRS)
    units = tiles * per
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    u0 = pid * units // P
    u1 = (pid + 1) * units // P
    return u0, u1, u0 // per, (u1 - 1) // per


@gluon.jit
def _segment(t, u0, u1, nb, PAIRS: gl.constexpr = True):
    """The K blocks [kb_lo, kb_hi) of tile t in the run [u0, u1): unit j starts at block 2j (PAIRS; the tile's last
    ends at nb) or is block j."""
    h = _per_tile(nb, PAIRS)
    j_lo = gl.maximum(u0 - t * h, 0)
    j_hi = gl.minimum(u1 - t * h, h)
    if PAIRS:
        return 2 * j_lo, gl.where(j_hi == h, nb, 2 * j_hi)
    else:
        return j_lo, j_hi


@gluon.jit
def _block_at(u, h, nb):
    """Unit u's first block, counted over whole tiles (a tile's last unit ends at the next tile's block 0)."""
    return (u // h) * nb + 2 * (u % h)


@gluon.jit
def _owner(u, units):
    """The CTA whose run holds unit u (the largest q with q * units // P <= u)."""
    return ((u + 1) * gl.num_programs(0) + units - 1) // units - 1


@gluon.jit
def _slot(q, t, units, per):
    """Where CTA q leaves its partial products of tile t (of `per` units) in the workspace: 2q for its run's first
    tile, 2q + 1 for its last (a run's middle tiles are whole)."""
    first_tile = (q * units // gl.num_programs(0)) // per
    return 2 * q + (t != first_tile).to(gl.int32)


@gluon.jit
def _ws_offsets(acc):
    """acc's elements [64, tokens] as offsets row * tokens + token: how every CTA lays its products in a slot."""
    layout: gl.constexpr = acc.type.layout
    r = gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
    return gl.expand_dims(r, 1) * acc.shape[1] + gl.expand_dims(c, 0)


@gluon.jit
def _shared_tile(cnt_ptr, t, nb, tiles, PAIRS: gl.constexpr, lane, LANES: gl.constexpr):
    """Tile t's sharing: its first and last CTA (`_owner` of its first and last unit), the units, the units a tile, and
    this lane's counter (t x LANES + lane)."""
    per = _per_tile(nb, PAIRS)
    units = tiles * per
    first = _owner(t * per, units)
    last = _owner((t + 1) * per - 1, units)
    return first, last, units, per, _counter(cnt_ptr, t, lane, LANES)


@gluon.jit
def _counter(cnt_ptr, t, lane, LANES: gl.constexpr):
    """Lane `lane`'s counter of tile t (`_shared_tile`)."""
    return cnt_ptr + t * LANES + lane


@gluon.jit
def _release(cnt, n):
    """A stored part announced: `n` added to its counter (release) once every thread of the partition stored its
    share (the barrier)."""
    gl.thread_barrier()
    gl.atomic_add(cnt, n, sem="release")


@gluon.jit
def _part(ws_ptr, acc, acc2, q, t, units, per, lane, LANES: gl.constexpr, TWO: gl.constexpr):
    """Where CTA q leaves this lane's part of tile t (`_slot`; fp32 64 x (BM1 + BM2)), and the offsets of acc's and
    acc2's elements in it."""
    BM1: gl.constexpr = acc.shape[1]
    BM2: gl.constexpr = acc2.shape[1]
    SLOT: gl.constexpr = 64 * (BM1 + BM2) if TWO else 64 * BM1
    base = ws_ptr + (_slot(q, t, units, per) * LANES + lane).to(gl.int64) * SLOT
    return base + _ws_offsets(acc), base + _ws_offsets(acc2) + 64 * BM1


@gluon.jit
def _put(ptrs, ptrs2, acc, acc2, TWO: gl.constexpr):
    """A part's products into its slot (`_part`)."""
    gl.store(ptrs, acc)
    if TWO:
        gl.store(ptrs2, acc2)


@gluon.jit
def _add(ptrs, ptrs2, acc, acc2, TWO: gl.constexpr):
    """acc (and acc2) plus the part in a slot (`_part`), read past L1."""
    acc += gl.load(ptrs, cache_modifier=".cg")
    if TWO:
        acc2 += gl.load(ptrs2, cache_modifier=".cg")
    return acc, acc2


@gluon.jit
def _fixup(acc, acc2, ws_ptr, cnt_ptr, t, nb, tiles, TWO: gl.constexpr, PAIRS: gl.constexpr = True, lane=0,
           LANES: gl.constexpr = 1, HEAD: gl.constexpr = False, LATE: gl.constexpr = False):
    """Tile t's products summed over the CTAs sharing its K (`_shared_tile`) into the last one in: its ticket says how
    many came before; all but the last store theirs into their workspace slot (`_part`) and add `parts` (release,
    after a barrier of this partition's threads); the last waits (acquire) for parts x parts, adds the other part to
    its own (two parts: one add, the same bits either way) or every part in CTA order, its own stored first (three or
    more), and re-arms the counter.
    LANES: partitions of a CTA that each sum their own products of the tile (`frag_rsw_kernel`'s two warpgroups, a
    weight panel each), with a counter (t x LANES + lane) and slots of their own. HEAD: no ticket — the CTA holding
    the tile's first block (whose run ends on it) sums, waiting (acquire) for the others' parts - 1 releases; the
    others store their part and add 1 (release, no value back): one atomic round trip less on each side, the same sum
    order (`_fixup_head`); LATE (with HEAD): a part stored, not released — the caller owes `_release` of its counter
    (`_counter`) before it waits on anything. Returns (is this CTA the one to store y, the sums)."""
    if HEAD:
        return _fixup_head(acc, acc2, ws_ptr, cnt_ptr, t, nb, tiles, TWO, PAIRS, lane, LANES, LATE)
    first, last, units, per, cnt = _shared_tile(cnt_ptr, t, nb, tiles, PAIRS, lane, LANES)
    pid = gl.program_id(0)
    parts = last - first + 1
    ahead = parts - 1  # (a whole tile: this CTA stores it)
    if parts > 1:
        ahead = gl.atomic_add(cnt, 1, sem="relaxed") % parts  # the parts in before this one
        if ahead != parts - 1:
            p1, p2 = _part(ws_ptr, acc, acc2, pid, t, units, per, lane, LANES, TWO)
            _put(p1, p2, acc, acc2, TWO)
            _release(cnt, parts)
        else:
            landed = gl.atomic_add(cnt, 0, sem="acquire")
            while landed != parts * parts:
                landed = gl.atomic_add(cnt, 0, sem="acquire")
            if parts == 2:  # one add: the same bits whichever part is last
                p1, p2 = _part(ws_ptr, acc, acc2, first + last - pid, t, units, per, lane, LANES, TWO)
                acc, acc2 = _add(p1, p2, acc, acc2, TWO)
            else:  # its own products through its slot too (each thread reads back what it wrote), then all in order:
                # one accumulator, not its own kept beside the sum (spills at 192 tokens)
                p1, p2 = _part(ws_ptr, acc, acc2, pid, t, units, per, lane, LANES, TWO)
                _put(p1, p2, acc, acc2, TWO)
                acc = gl.zeros_like(acc)
                acc2 = gl.zeros_like(acc2)
                for q in range(first, last + 1):
                    p1, p2 = _part(ws_ptr, acc, acc2, q, t, units, per, lane, LANES, TWO)
                    acc, acc2 = _add(p1, p2, acc, acc2, TWO)
            gl.atomic_xchg(cnt, 0)
    return ahead == parts - 1, acc, acc2


@gluon.jit
def _fixup_head(acc, acc2, ws_ptr, cnt_ptr, t, nb, tiles, TWO: gl.constexpr, PAIRS: gl.constexpr, lane,
                LANES: gl.constexpr, LATE: gl.constexpr = False):
    """`_fixup` with HEAD: the tile's first CTA sums (its own products, then the other parts in CTA order) and re-arms
    the counter with a plain store (every other CTA is done with it); LATE: the others store their part only (the
    release is the caller's, later)."""
    first, last, units, per, cnt = _shared_tile(cnt_ptr, t, nb, tiles, PAIRS, lane, LANES)
    pid = gl.program_id(0)
    if last > first:
        if pid != first:
            p1, p2 = _part(ws_ptr, acc, acc2, pid, t, units, per, lane, LANES, TWO)
            _put(p1, p2, acc, acc2, TWO)
            if not LATE:
                _release(cnt, 1)
        else:
            landed = gl.atomic_add(cnt, 0, sem="acquire")
            while landed != last - first:
                landed = gl.atomic_add(cnt, 0, sem="acquire")
            for q in range(first + 1, last + 1):
                p1, p2 = _part(ws_ptr, acc, acc2, q, t, units, per, lane, LANES, TWO)
                acc, acc2 = _add(p1, p2, acc, acc2, TWO)
            gl.store(cnt, 0)
    return pid == first, acc, acc2


@gluon.jit
def _zero_accs(x_bufs, x2_bufs):
    """The MMA warpgroups' fp32 accumulators [64, BM1] and [64, BM2] (x's token parts), zero."""
    BM1: gl.constexpr = x_bufs.type.shape[1]
    BM2: gl.constexpr = x2_bufs.type.shape[1]
    acc = gl.zeros((64, BM1), dtype=gl.float32, layout=_acc_layout(BM1))
    acc2 = gl.zeros((64, BM2), dtype=gl.float32, layout=_acc_layout(BM2))
    return acc, acc2


@gluon.jit
def _store_tiles(acc, acc2, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES: gl.constexpr,
                 HAS_BIAS: gl.constexpr, E2M1: gl.constexpr, HAS_GS: gl.constexpr, TWO: gl.constexpr,
                 CVT: gl.constexpr = False):
    """y of a tile's 64 weight rows from off_n: acc's BM1 tokens from off_m and (TWO) acc2's BM2 after them. CVT:
    through `_store_tile_cvt` (16-byte stores along y's rows)."""
    if CVT:
        _store_tile_cvt(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES, HAS_BIAS, gs_ptr,
                        _pow2(E2M1), HAS_GS)
        if TWO:
            _store_tile_cvt(acc2, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m + acc.shape[1], off_n, ROW_SCALES,
                            HAS_BIAS, gs_ptr, _pow2(E2M1), HAS_GS)
    else:
        _store_tile(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES, HAS_BIAS, gs_ptr,
                    _pow2(E2M1), HAS_GS, True)
        if TWO:
            _store_tile(acc2, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m + acc.shape[1], off_n, ROW_SCALES,
                        HAS_BIAS, gs_ptr, _pow2(E2M1), HAS_GS, True)


@gluon.jit
def _store_tile_cvt(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES: gl.constexpr,
                    HAS_BIAS: gl.constexpr, gs_ptr, POW2: gl.constexpr, HAS_GS: gl.constexpr):
    """`_store_tile` of a [64 weight rows, tokens] accumulator (the same arithmetic: scaled, bias added in fp32, one
    rounding) whose y values go through shared memory (a layout conversion of the rounded tile) so that a thread
    stores 8 consecutive weight rows of one token — 16 bytes along y's row — instead of the wgmma layout's 2 bytes
    a token (8 half-used sectors a store instruction; session 39: a segment's y store took ~3 µs)."""
    rows, cols = _tile_index(acc, off_m, off_n, True)
    acc = _scaled(acc, xs_ptr, M, off_m, ROW_SCALES, gs_ptr, POW2, HAS_GS, True)
    if HAS_BIAS:
        acc = acc + gl.expand_dims(gl.load(bias_ptr + cols, mask=cols < N, other=0).to(gl.float32), 1)
    rowwise: gl.constexpr = gl.BlockedLayout([8, 1], [8, 4], [1, 4], [0, 1])
    v = gl.convert_layout(acc.to(y_ptr.dtype.element_ty), rowwise)
    n = off_n + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, rowwise))
    t = off_m + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, rowwise))
    ptrs = y_ptr + gl.expand_dims(t.to(gl.int64) * stride_ym, 0) + gl.expand_dims(n, 1)
    gl.store(ptrs, v, mask=gl.expand_dims(t < M, 0) & gl.expand_dims(n < N, 1))


@gluon.jit
def _checks(x_desc, W8: gl.constexpr, W3: gl.constexpr, ZP: gl.constexpr, W2: gl.constexpr, E2M1: gl.constexpr):
    """What the persistent kernels run: 128-K blocks of x in 64-K halves, no 8-bit codes, integer words with 2- or
    3-bit codes and zero points."""
    gl.static_assert(x_desc.block_type.shape[1] == 64, "x comes in 64-K halves of a 128-K frag block")
    gl.static_assert(not W8, "8-bit codes: a 64-K block is one x slice (the one-tile kernel runs them)")
    gl.static_assert(not ((W2 or W3 or ZP) and E2M1), "2- or 3-bit codes and zero points: integer words")


@gluon.constexpr_function
def _token_tile(bm1, bm2, two):
    """A tile's tokens: BM1, and BM2 more with TWO."""
    return bm1 + bm2 if two else bm1


@gluon.jit
def _retire(acc, acc2, a0, a1, b0, b1, empty, g, TWO: gl.constexpr):
    """Block g's wgmma waited for — its register operands kept alive to the wait (`frag_rs_kernel._consumer_loop`) —
    and its stage released (`empty` slot g % its length). Returns the accumulators."""
    if TWO:
        acc, acc2, a0, a1, b0, b1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2, a0, a1, b0, b1))
    else:
        acc, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a0, a1))
    mbarrier.arrive(empty.index(g % empty.type.shape[0]), count=1)
    return acc, acc2


@gluon.jit
def _zero_ring(z_desc, sq, ZP: gl.constexpr):
    """The zero-point rows' ring beside the scale ring `sq` (as many slots; at least two rows a slot: a TMA copy's
    destination 128-byte aligned), or `sq` standing in without zero points."""
    if ZP:
        ZR: gl.constexpr = max(2, z_desc.block_type.shape[0])
        return gl.allocate_shared_memory(z_desc.dtype, [sq.type.shape[0], ZR, 64], z_desc.layout)
    else:
        return sq


@gluon.jit
def _p_loader(w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, M, N, nb, tiles,
              num_blocks, BM: gl.constexpr, GROUP_M: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr,
              PANEL: gl.constexpr, TWO: gl.constexpr, z_desc=None, zq=None, lo_units=0, W3: gl.constexpr = False,
              ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """Every block of the CTA's run in order: words and scales into slot g % STAGES, x's two 64-K halves into x
    slots 2g, 2g + 1 (of 2 STAGES), once the slot's previous block has been released."""
    STAGES: gl.constexpr = wq.type.shape[0]
    u0, u1, t0, t1 = _run(tiles, num_blocks)
    g = 0
    for t in range(t0, t1 + 1):
        off_m, off_n = _tile_origin(M, N, BM, 64, GROUP_M, t)
        kb_lo, kb_hi = _segment(t, u0, u1, num_blocks)
        for kb in range(kb_lo, kb_hi):
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            _w_fetch(w_desc, s_desc, wq, sq, ready, s, 0, 0, off_n // PANEL, nb, off_n, kb, num_blocks, GB,
                     SCALE_PER_BLOCK, z_desc, zq, lo_units, W3, ZP, W2)
            # x slot 2g (+ 1), x's K step 2kb (+ 1): the slot counter plus 2 (kb - g); (no step past the run's)
            _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, 2 * g, 2 * g + 2, 2 * STAGES, TWO,
                      2 * (kb - g))
            _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, 2 * g + 1, 2 * g + 2, 2 * STAGES, TWO,
                      2 * (kb - g))
            g += 1


@gluon.jit
def _p_mma(wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, red, red2, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr,
           cnt_ptr, M, N, stride_ym, tiles, num_blocks, me: gl.constexpr, BM: gl.constexpr, GROUP_M: gl.constexpr,
           SIGNED: gl.constexpr, E2M1: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_GS: gl.constexpr,
           ROW_SCALES: gl.constexpr, TWO: gl.constexpr, zq=None, W3: gl.constexpr = False, ZP: gl.constexpr = False,
           W2: gl.constexpr = False):
    """MMA warpgroup `me`: the blocks g = me, me + 2, ... of the CTA's run, decoded into the wgmma's register operand
    as `frag_rs_kernel._consumer_loop` does (the next owned block's words loaded while the wgmma run, across segments
    too); at its last block of each segment the hand-over through `red` (the second) or the sum, the `_fixup` of a
    shared tile and y (the first)."""
    BM1: gl.constexpr = x_bufs.type.shape[1]
    BM2: gl.constexpr = x2_bufs.type.shape[1]
    l1: gl.constexpr = _acc_layout(BM1)  # (the other warpgroup's products read in these)
    l2: gl.constexpr = _acc_layout(BM2)
    a1_layout: gl.constexpr = _a_layout(BM1)
    a2_layout: gl.constexpr = _a_layout(BM2)
    acc, acc2 = _zero_accs(x_bufs, x2_bufs)
    DTYPE: gl.constexpr = x_bufs.dtype
    u0, u1, t0, t1 = _run(tiles, num_blocks)
    h = num_blocks // 2
    total = _block_at(u1, h, num_blocks) - _block_at(u0, h, num_blocks)  # the run's blocks
    last = me + 2 * (gl.cdiv(total - me, 2) - 1)  # this warpgroup's last block
    base = _block_at(u0, h, num_blocks)
    w, lo, hi = _block_words(wq, sq, ready, empty, me, DTYPE, E2M1, zq, 2 * (u0 % h) + me, W3, ZP, W2)
    g = me  # (a run starts on an even g: warpgroup 0 owns its first block)
    for t in range(t0, t1 + 1):  # segment t - t0 of the run
        kb_lo, kb_hi = _segment(t, u0, u1, num_blocks)
        # this warpgroup's first block of the segment, from its next g and the segment's first (kb carried across
        # the loop instead was folded away by Triton 3.6's gluon-inline: the inner loop ran each segment's count of
        # the first, and the GPU hung at odd block counts, session 38)
        kb = kb_lo + g - (_block_at(gl.maximum(u0, t * h), h, num_blocks) - base)
        for i in range(gl.cdiv(kb_hi - kb, 2)):
            kbi = kb + 2 * i
            a0, a1 = _decoded(w, lo, hi, DTYPE, a1_layout, SIGNED, E2M1, W3, ZP, W2)
            acc, acc2, b0, b1 = _block_mma(a0, a1, x_bufs, x2_bufs, x_ready, g, acc, acc2, TWO, a2_layout)
            # the next owned block two on: past this segment's end, the next tile's (segments start at its block 0
            # and hold two blocks at least); past the run's, the last block's words again (still held)
            kb_next = gl.where(kbi + 2 < kb_hi, kbi + 2, kbi + 2 - kb_hi)
            more = (g + 2 <= last).to(gl.int32)
            w, lo, hi = _block_words(wq, sq, ready, empty, g + 2 * more, DTYPE, E2M1, zq,
                                     more * kb_next + (1 - more) * kbi, W3, ZP, W2)
            acc, acc2 = _retire(acc, acc2, a0, a1, b0, b1, empty, g, TWO)
            g += 2
        j = t - t0
        if me == 1:
            mbarrier.wait(red_bar.index(1), (j & 1) ^ 1)  # the previous segment's partial taken
            red.store(acc)
            if TWO:
                red2.store(acc2)
            mbarrier.arrive(red_bar.index(0), count=1)
        else:
            mbarrier.wait(red_bar.index(0), j & 1)
            acc = acc + red.load(l1)
            if TWO:
                acc2 = acc2 + red2.load(l2)
            mbarrier.arrive(red_bar.index(1), count=1)
            stores, acc, acc2 = _fixup(acc, acc2, ws_ptr, cnt_ptr, t, num_blocks, tiles, TWO)
            if stores:
                off_m, off_n = _tile_origin(M, N, BM, 64, GROUP_M, t)
                _store_tiles(acc, acc2, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES,
                             HAS_BIAS, E2M1, HAS_GS, TWO)
        acc, acc2 = _zero_accs(x_bufs, x2_bufs)


@gluon.jit
def frag_rsp_kernel(x_desc, x2_desc, w_desc, s_desc, z_desc, xs_ptr, gs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K,
                    nb, stride_ym, STAGES: gl.constexpr, GROUP_M: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr,
                    GB: gl.constexpr, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, PANEL: gl.constexpr,
                    MMA_REGS: gl.constexpr, E2M1: gl.constexpr, HAS_GS: gl.constexpr, ROW_SCALES: gl.constexpr,
                    TWO: gl.constexpr, W8: gl.constexpr = False, W3: gl.constexpr = False, ZP: gl.constexpr = False,
                    W2: gl.constexpr = False):
    BM1: gl.constexpr = x_desc.block_type.shape[0]
    BM2: gl.constexpr = x2_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    _checks(x_desc, W8, W3, ZP, W2, E2M1)
    BM: gl.constexpr = _token_tile(BM1, BM2, TWO)
    x_bufs, x2_bufs, wq, sq, ready, empty, x_ready, red_bar = _rs_smem(x_desc, x2_desc, w_desc, s_desc, STAGES, TWO,
                                                                       False, W3)
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    red = gl.allocate_shared_memory(gl.float32, [64, BM1], flat)
    if TWO:
        red2 = gl.allocate_shared_memory(gl.float32, [64, BM2], flat)
    else:
        red2 = red
    zq = _zero_ring(z_desc, sq, ZP)
    num_blocks = _rs_blocks(K, BK, False)
    tiles = gl.cdiv(M, BM) * gl.cdiv(N, 64)
    lo_units = 2 * gl.cdiv(K, 512)
    gl.warp_specialize([
        (_p_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, red, red2, xs_ptr, gs_ptr, bias_ptr, y_ptr,
                  ws_ptr, cnt_ptr, M, N, stride_ym, tiles, num_blocks, 0, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS,
                  ROW_SCALES, TWO, zq, W3, ZP, W2)),
        (_p_mma, (wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, red_bar, red, red2, xs_ptr, gs_ptr, bias_ptr, y_ptr,
                  ws_ptr, cnt_ptr, M, N, stride_ym, tiles, num_blocks, 1, BM, GROUP_M, SIGNED, E2M1, HAS_BIAS, HAS_GS,
                  ROW_SCALES, TWO, zq, W3, ZP, W2)),
        (_p_loader, (w_desc, s_desc, x_desc, x2_desc, wq, sq, x_bufs, x2_bufs, ready, x_ready, empty, M, N, nb,
                     tiles, num_blocks, BM, GROUP_M, SCALE_PER_BLOCK, GB, PANEL, TWO, z_desc, zq, lo_units, W3, ZP,
                     W2)),
    ], [4, 1], [MMA_REGS, 48])
# fmt: on
