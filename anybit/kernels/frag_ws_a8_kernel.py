"""The Gluon kernel of `anybit.kernels.frag_ws_a8` (sm_90a): y = sx * (xq @ (q - 8)^T) * s for e4m3 x quantized
per token and 4-bit integer weights in the FP8 fragment layout with a scale per 128-K block (or per channel),
warp-specialised like `anybit.kernels.frag_ws_kernel`, with the FP8 tensor cores.

Per CTA tile (128 rows of x, BN = 128 or 64 weight rows), four partitions:

* two decoders (DQ warps each, even / odd 128-K steps: one partition's chain of barriers, TMA issue and
  proxy fence per step capped the kernel at ~700 TF/s on the H200 even with no decoding): each takes its steps'
  words and scale rows by TMA into its slots of the word ring (`_w_fetch`, shared with the A16 kernel), turns
  each word into eight e4m3 bytes of (q - 8) / 512 — e4m3 holds every integer of magnitude <= 15 times 2**-9
  exactly (subnormals and the first binade), so a byte is sign | magnitude: one shift, LOP3, subtraction, PRMT and
  select per four weights (`_A8_SIGNED`) — and stores the [BN, 128] step into the w ring with 512 times the
  block's scale row beside it;
* two MMA partitions of one warpgroup each (the default and a worker): each takes its 64 rows of x by TMA into a
  ring of its own, STAGES - 1 steps ahead, runs the step's four k32 wgmma into a fresh fp32 tile and adds it, times
  the step's scales, to its accumulator (FP8 wgmma accumulates with ~14 bits; a 128-K promotion keeps fp32, as
  DeepGEMM does) — PROMOTE False (channel scales only) lets the wgmma accumulate the whole K instead; ORDER makes
  the two take turns on the tensor cores (measured: no faster); EARLY_SCALES loads the step's scales before its
  wgmma (their loads queue behind the wgmma's operand reads). The epilogue multiplies by each row's x scale.

DIAG 1 / 2 (timing only, wrong results): the decoders store without decoding / store nothing — what the rest of
the kernel costs without them (`tools/probe_ws_a8.py`, BENCHMARKS.md).

Both wgmma operands come from shared memory (no register-operand hazard, Triton #9433). Imported only where it
runs (Gluon + Hopper).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from anybit.kernels.frag_ws_kernel import _store_tile, _tile_origin, _w_fetch, _x_issue

# word (nibble 2i + j = code of k = i + 4t + 16j + 32c, stored biased: q + 8) -> two registers of four e4m3 bytes,
# j = 0 and 1, each byte sign | |q| (|q| * 2**-9: subnormal or the first binade). Per register: the magnitude of a
# non-negative q is the low three bits (m), of a negative one 8 - m (0x88 - m also sets the sign bit), and PRMT's
# sign replication turns each code's bit 3 (q >= 0) into a byte mask that selects between them (LOP3 0xE4).
_A8_SIGNED = """{
.reg .b32 a, m, n, p, lo, c88;
mov.b32 lo, 0x07070707;
mov.b32 c88, 0x88888888;
shl.b32 a, $2, 4;
and.b32 m, $2, lo;
sub.u32 n, c88, m;
prmt.b32 p, a, 0, 0xBA98;
lop3.b32 $0, m, n, p, 0xE4;
shr.u32 a, $2, 4;
and.b32 m, a, lo;
sub.u32 n, c88, m;
prmt.b32 p, $2, 0, 0xBA98;
lop3.b32 $1, m, n, p, 0xE4;
}"""

# unsigned codes (uint4): the byte is the code itself (q * 2**-9)
_A8_UNSIGNED = """{
.reg .b32 a, f;
mov.b32 f, 0x0F0F0F0F;
and.b32 $0, $2, f;
shr.u32 a, $2, 4;
and.b32 $1, a, f;
}"""


@gluon.constexpr_function
def _a8_asm(signed):
    return _A8_SIGNED if signed else _A8_UNSIGNED


# fmt: off
@gluon.jit
def _a8_decoder(w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, s_bufs, w_ready, w_empty, off_n, num_k, part,
                NDEC: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, SIGNED: gl.constexpr,
                STAGES: gl.constexpr, PANEL: gl.constexpr, DIAG: gl.constexpr, w_row0=0, s_row0=0, x_desc=None,
                x_bufs=None, x_ready=None, off_m=0):
    """Decodes steps part, part + NDEC, ... of the weight tile into the w ring (e4m3 (q - 8) / 512) and each
    step's scales (times 512, fp32) beside them; words and scales arrive by TMA into this partition's DEPTH slots
    of the word ring (part * DEPTH on), depth - 1 blocks ahead. NDEC partitions overlap one another's latencies
    (barriers, the proxy fence, TMA waits), which one partition's chain of them per block left exposed. w_row0,
    s_row0: the expert's first rows in the word and scale descriptors (grouped MoE: `moe_ws_a8_kernel`). x_desc: also
    each step's x (rows off_m on) by TMA into the slot once it is free (`frag_ws_a8_wide_kernel`)."""
    BN: gl.constexpr = w_bufs.type.shape[1]
    D: gl.constexpr = wq.type.shape[0] // NDEC
    ld: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [gl.num_warps(), 1], [1, 0])  # a thread: 16 bytes of a row
    flat2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    # the w slot as int32 [BN, 32]: the same 128-byte rows and 128-byte swizzle as its e4m3 [BN, 128] view
    w32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    sl: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    p0 = off_n // PANEL
    base = part * D
    for j in gl.static_range(D - 1):
        _w_fetch(w_desc, s_desc, wq, sq, wq_bar, base + j, w_row0, s_row0, p0, nb, off_n, j * NDEC + part, num_k,
                 GB, SCALE_PER_BLOCK)
    mine = gl.cdiv(num_k - part, NDEC)
    for i in range(mine):
        gl.thread_barrier()  # every thread has read slot (i - 1) % D: it takes this partition's block i + D - 1
        _w_fetch(w_desc, s_desc, wq, sq, wq_bar, base + (i + D - 1) % D, w_row0, s_row0, p0, nb, off_n,
                 (i + D - 1) * NDEC + part, num_k, GB, SCALE_PER_BLOCK)
        q = base + i % D
        mbarrier.wait(wq_bar.index(q), (i // D) & 1)
        b = i * NDEC + part
        s = b % STAGES
        if DIAG == 0:
            cur = wq.index(q)._reinterpret(gl.int32, [BN, 16], flat2).load(ld)  # word 4t + c of each row
            sc = sq.index(q)._reinterpret(sq.dtype, [BN], flat1).load(sl).to(gl.float32) * 512.0
            r0, r1 = gl.inline_asm_elementwise(_a8_asm(SIGNED), "=r,=r,r", [cur], dtype=(gl.int32, gl.int32),
                                               is_pure=True, pack=1)
            # register j of word (t, c) holds k = 4 (8c + 4j + t) + i, i = 0..3: int32 column 8c + 4j + t
            v = gl.reshape(gl.permute(gl.reshape(gl.join(r0, r1), [BN, 4, 4, 2]), [0, 2, 3, 1]), [BN, 32])
            mbarrier.wait(w_empty.index(s), ((b // STAGES) & 1) ^ 1)
            if x_desc is not None:
                _x_issue(x_desc, x_bufs, x_ready, off_m, b, num_k, STAGES)
            w_bufs.index(s)._reinterpret(gl.int32, [BN, 32], w32).store(v)
            s_bufs.index(s).store(sc)
        elif DIAG == 1:  # timing only: stores without decoding (wrong results)
            mbarrier.wait(w_empty.index(s), ((b // STAGES) & 1) ^ 1)
            ones: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [gl.num_warps(), 1], [1, 0])
            w_bufs.index(s)._reinterpret(gl.int32, [BN, 32], w32).store(gl.full([BN, 32], 0x38383838, gl.int32, ones))
        else:  # timing only: no stores at all (wrong results)
            mbarrier.wait(w_empty.index(s), ((b // STAGES) & 1) ^ 1)
        fence_async_shared()  # the generic-proxy stores, before the wgmma (async proxy) reads them
        mbarrier.arrive(w_ready.index(s), count=1)


@gluon.constexpr_function
def gather_layout(num_warps):
    """Gathered x rows as int32 words [rows, 32] (a 128-K step of e4m3): four words (16 bytes) a thread, a row
    across 8 threads."""
    return gl.BlockedLayout([1, 4], [4, 8], [num_warps, 1], [1, 0])


@gluon.jit
def _x_gather(x_slot, ki, x_ptr, src_off, xmask, cols, K4):
    """cp.async of x's K step ki of the rows at `src_off` (x_ptr: e4m3 x viewed as int32, K4 words a row; rows not
    in `xmask` and the K tail zero-filled) into `x_slot` (e4m3 [rows, 128], viewed as int32 with x's 128-byte
    swizzle), 16 bytes a thread (`gather_layout`); the caller arrives on the slot's barrier."""
    rows: gl.constexpr = x_slot.type.shape[0]
    x32: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=32, rank=2)
    k = ki * 32 + cols
    ptrs = x_ptr + gl.expand_dims(src_off, 1) + gl.expand_dims(k, 0)
    async_copy.async_copy_global_to_shared(x_slot._reinterpret(gl.int32, [rows, 32], x32), ptrs,
                                           mask=gl.expand_dims(xmask, 1) & gl.expand_dims(k < K4, 0))


@gluon.jit
def _x_step(x_desc, x_bufs, x_ready, off_m, ki, num_k, STAGES: gl.constexpr, GATHER: gl.constexpr, x_ptr, src_off,
            xmask, cols, K4):
    """x's K step ki (none past num_k) into slot ki % STAGES: by TMA from rows off_m on, or (GATHER) by cp.async
    of 16 bytes a thread from the int32 words of the rows at `src_off` (x_ptr: e4m3 x viewed as int32, K4 words a
    row; padding rows and the K tail zero-filled) into the slot viewed as int32 with x's 128-byte swizzle, each
    thread arriving on the slot's barrier once its copies have landed."""
    if GATHER:
        if ki < num_k:
            s = ki % STAGES
            _x_gather(x_bufs.index(s), ki, x_ptr, src_off, xmask, cols, K4)
            async_copy.mbarrier_arrive(x_ready.index(s), increment_count=False)
    else:
        _x_issue(x_desc, x_bufs, x_ready, off_m, ki, num_k, STAGES)


@gluon.jit
def _a8_loop(x_desc, x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, turn, me, off_m, num_k,
             STAGES: gl.constexpr, PROMOTE: gl.constexpr, ORDER: gl.constexpr, EARLY_SCALES: gl.constexpr,
             GATHER: gl.constexpr = False, x_ptr=None, src_off=None, xmask=None, K4=0):
    """One warpgroup's K loop over its 64 rows of the tile: x into its own ring STAGES - 1 steps ahead (TMA, or
    the gathered rows by cp.async: `_x_step`), per step a fresh [64, BN] wgmma tile promoted into the fp32
    accumulator with the step's scales. ORDER 1 / 2: the two warpgroups take turns on the tensor cores (barrier
    `turn[me]` before the step's wgmma, `turn[1 - me]` once they are issued / finished), meant to overlap one's
    promotion with the other's step — H200: no faster than running free (0, the default), so the two were not
    idling in step. Without PROMOTE (one scale row for every step: channel scales) the wgmma accumulates the whole
    K range and the scales are applied once. Returns the accumulator (x's scales not applied)."""
    BMH: gl.constexpr = x_bufs.type.shape[1]
    BN: gl.constexpr = w_bufs.type.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                     instr_shape=[16, BN, 32])
    cols_l: gl.constexpr = gl.SliceLayout(0, layout)
    cols = None
    if GATHER:
        cols = gl.arange(0, 32, layout=gl.SliceLayout(0, gather_layout(gl.num_warps())))
    for i in gl.static_range(STAGES - 1):
        _x_step(x_desc, x_bufs, x_ready, off_m, i, num_k, STAGES, GATHER, x_ptr, src_off, xmask, cols, K4)
    acc = gl.zeros((BMH, BN), dtype=gl.float32, layout=layout)
    if PROMOTE:
        part = gl.zeros((BMH, BN), dtype=gl.float32, layout=layout)
        for ki in range(num_k):
            s = ki % STAGES
            phase = (ki // STAGES) & 1
            mbarrier.wait(x_ready.index(s), phase)
            if GATHER:
                fence_async_shared()  # x came by cp.async (generic proxy); the wgmma reads it through the async one
            mbarrier.wait(w_ready.index(s), phase)
            if EARLY_SCALES:  # shared-memory loads wait behind the wgmma's operand reads: issue them first
                sc = s_bufs.index(s).load(cols_l)
            if ORDER:
                mbarrier.wait(turn.index(me), ki & 1)
            part = warpgroup_mma(x_bufs.index(s), w_bufs.index(s).permute((1, 0)), part, use_acc=False,
                                 is_async=True)
            if ORDER == 1:  # the other's turn once this one's wgmma are issued
                mbarrier.arrive(turn.index(1 - me), count=1)
            # x of step ki + STAGES - 1 into the slot step ki - 1 read (this warpgroup's wgmma of it retired)
            _x_step(x_desc, x_bufs, x_ready, off_m, ki + STAGES - 1, num_k, STAGES, GATHER, x_ptr, src_off, xmask,
                    cols, K4)
            part = warpgroup_mma_wait(num_outstanding=0, deps=(part,))
            if ORDER == 2:  # ... once they have finished: the tensor cores take one warpgroup's step at a time
                mbarrier.arrive(turn.index(1 - me), count=1)
            if EARLY_SCALES:
                acc = acc + part * gl.expand_dims(sc, 0)
                mbarrier.arrive(w_empty.index(s), count=1)  # done with the step's w slot and scales
            else:
                sc = s_bufs.index(s).load(cols_l)
                mbarrier.arrive(w_empty.index(s), count=1)  # done with the step's w slot and scales
                acc = acc + part * gl.expand_dims(sc, 0)
    else:
        sc = gl.zeros((BN, ), dtype=gl.float32, layout=cols_l)
        for ki in range(num_k):
            s = ki % STAGES
            phase = (ki // STAGES) & 1
            mbarrier.wait(x_ready.index(s), phase)
            if GATHER:
                fence_async_shared()
            mbarrier.wait(w_ready.index(s), phase)
            acc = warpgroup_mma(x_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            # step ki - 1's wgmma has retired: its slots take the next copies
            mbarrier.arrive(w_empty.index((ki + STAGES - 1) % STAGES), count=1, pred=ki > 0)
            _x_step(x_desc, x_bufs, x_ready, off_m, ki + STAGES - 1, num_k, STAGES, GATHER, x_ptr, src_off, xmask,
                    cols, K4)
            if ki == 0:
                sc = s_bufs.index(s).load(cols_l)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        acc = acc * gl.expand_dims(sc, 0)
    return acc


@gluon.jit
def _a8_mma(x_desc, x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, turn, me, xs_ptr, bias_ptr, y_ptr, M, N,
            stride_ym, off_m, off_n, num_k, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, PROMOTE: gl.constexpr,
            ORDER: gl.constexpr, EARLY_SCALES: gl.constexpr):
    """One warpgroup's 64 rows of the dense tile: the K loop (`_a8_loop`), then y = acc * x scale (+ bias)."""
    acc = _a8_loop(x_desc, x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, turn, me, off_m, num_k, STAGES,
                   PROMOTE, ORDER, EARLY_SCALES)
    _store_tile(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, True, HAS_BIAS)


@gluon.jit
def _a8_rings(x_layout: gl.constexpr, w_desc, s_desc, BMH: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
              DEPTH: gl.constexpr, X_ARRIVALS: gl.constexpr, ONE_X: gl.constexpr = False):
    """Shared memory of the W4A8 warp-specialised kernels: each MMA warpgroup's x ring (e4m3 [STAGES, BMH, 128];
    its barriers count X_ARRIVALS: 1 for TMA, every thread for gathered rows) — or (ONE_X) one both read, returned
    twice (`frag_ws_a8_wide_kernel`) —, the w ring (e4m3 [STAGES, BN, 128]) with each step's fp32 scales, its ready /
    empty barriers (empty: both MMA warpgroups), and the two decoders' word and scale slots (DEPTH each) with their
    TMA barriers."""
    BK: gl.constexpr = 128
    dtype: gl.constexpr = gl.float8e4nv
    x0 = gl.allocate_shared_memory(dtype, [STAGES, BMH, BK], x_layout)
    x0_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    if ONE_X:
        x1 = x0
        x1_ready = x0_ready
    else:
        x1 = gl.allocate_shared_memory(dtype, [STAGES, BMH, BK], x_layout)
        x1_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], dtype)
    w_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, BK], w_layout)
    s_bufs = gl.allocate_shared_memory(gl.float32, [STAGES, BN], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    w_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    w_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(x0_ready.index(i), count=X_ARRIVALS)
        if not ONE_X:
            mbarrier.init(x1_ready.index(i), count=X_ARRIVALS)
        mbarrier.init(w_ready.index(i), count=1)
        mbarrier.init(w_empty.index(i), count=2)  # both MMA warpgroups
    wq = gl.allocate_shared_memory(gl.int32, [2 * DEPTH, BN // 16, 256], w_desc.layout)  # DEPTH per decoder
    sq = gl.allocate_shared_memory(s_desc.dtype, [2 * DEPTH, 1, BN], s_desc.layout)
    wq_bar = gl.allocate_shared_memory(gl.int64, [2 * DEPTH, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2 * DEPTH):
        mbarrier.init(wq_bar.index(i), count=1)
    return x0, x1, x0_ready, x1_ready, w_bufs, s_bufs, w_ready, w_empty, wq, sq, wq_bar


@gluon.jit
def frag_ws_a8_kernel(x_desc, w_desc, s_desc, xs_ptr, bias_ptr, y_ptr, M, N, K, nb, stride_ym,
                      BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, DQ_WARPS: gl.constexpr,
                      DQ_REGS: gl.constexpr, MMA_REGS: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr,
                      GB: gl.constexpr, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, PANEL: gl.constexpr,
                      DEPTH: gl.constexpr, ORDER: gl.constexpr,
                      PROMOTE: gl.constexpr, DIAG: gl.constexpr, EARLY_SCALES: gl.constexpr):
    BMH: gl.constexpr = x_desc.block_type.shape[0]  # rows per MMA warpgroup; the tile has two
    BK: gl.constexpr = x_desc.block_type.shape[1]
    gl.static_assert(BK == 128, "a K step is one 128-K frag block")
    BM: gl.constexpr = 2 * BMH
    off_m, off_n = _tile_origin(M, N, BM, BN, GROUP_M)

    x_layout: gl.constexpr = x_desc.layout
    x0, x1, x0_ready, x1_ready, w_bufs, s_bufs, w_ready, w_empty, wq, sq, wq_bar = _a8_rings(
        x_layout, w_desc, s_desc, BMH, BN, STAGES, DEPTH, 1)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # ORDER: whose wgmma is next
    mbarrier.init(turn.index(0), count=1)
    mbarrier.init(turn.index(1), count=1)
    mbarrier.arrive(turn.index(0), count=1)  # the first warpgroup goes first
    num_k = gl.cdiv(K, BK)  # x past K is zero-filled by TMA
    gl.warp_specialize([  # MMA warpgroups (rows 0-63, 64-127), decoders (even, odd steps)
        (_a8_mma, (x_desc, x0, x0_ready, w_bufs, s_bufs, w_ready, w_empty, turn, 0, xs_ptr, bias_ptr, y_ptr, M,
                   N, stride_ym, off_m, off_n, num_k, STAGES, HAS_BIAS, PROMOTE, ORDER, EARLY_SCALES)),
        (_a8_mma, (x_desc, x1, x1_ready, w_bufs, s_bufs, w_ready, w_empty, turn, 1, xs_ptr, bias_ptr, y_ptr, M,
                   N, stride_ym, off_m + BMH, off_n, num_k, STAGES, HAS_BIAS, PROMOTE, ORDER, EARLY_SCALES)),
        (_a8_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, s_bufs, w_ready, w_empty, off_n, num_k, 0, 2,
                       SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, DIAG)),
        (_a8_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, s_bufs, w_ready, w_empty, off_n, num_k, 1, 2,
                       SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, DIAG)),
    ], [4, DQ_WARPS, DQ_WARPS], [MMA_REGS, DQ_REGS, DQ_REGS])
# fmt: on
