"""The wide W4A8 Gluon kernel of `anybit.kernels.frag_ws_a8` (sm_90a, large M): `frag_ws_a8_kernel`'s decoders and
rings with the roles swapped — the weight tile is the wgmma's A operand (64 rows a warpgroup), x its B with N = 256
tokens — and the accumulator rescaled per 128-K block instead of promoted.

Why: the promotion (a fresh fp32 tile a step, added times the step's scales) keeps a second tile of registers, which
caps a warpgroup at N = 128 and ~800 TF/s even with the decoders storing nothing (sessions 13, 42). Here each
warpgroup keeps one [64, 256] fp32 tile, in units of 512 times the current block's scale: before a block's wgmma it
multiplies the tile by each weight row's last scale over this one's (two rows a thread: the ratios are per
accumulator row because the weight is the A operand), the wgmma accumulates in place, and the epilogue multiplies by
the last block's scale and each token's x scale (flash attention's online rescale, for group scales;
`frag.frag_rescale` does the same in the grouped Triton kernel). The two MMA warpgroups are separate partitions
running free, so one's wait-and-rescale between blocks overlaps the other's wgmma.

Per CTA tile (BN = 128 weight rows by 256 tokens), four partitions: the two MMA warpgroups (default and a worker)
and `frag_ws_a8_kernel`'s two decoders (even / odd 128-K steps), which also issue each step's x copy by TMA into the
slot they fill (the slot is free once both warpgroups released it: one empty barrier for x, w and scales).

Weights with group scales must be `TritonWeight.rescale` (positive, normal, within 64 binades); channel scales
accumulate the whole K with one wgmma group in flight. Imported only where it runs (Gluon + Hopper).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from anybit.kernels.frag_rsp_kernel import _store_tile_cvt
from anybit.kernels.frag_ws_a8_kernel import _a8_decoder, _a8_rings
from anybit.kernels.frag_ws_kernel import _store_tile, _tile_origin

TINY = gl.constexpr(
    2.0**-100
)  # scale rows past N read 0: clamped so the ratios stay finite (their products are masked out)


# fmt: off
@gluon.jit
def _wide_loop(x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, ME: gl.constexpr, num_k, STAGES: gl.constexpr,
               RESCALE: gl.constexpr):
    """One warpgroup's K loop over its 64 weight rows of the tile and all BM tokens: returns the fp32 [64, BM]
    accumulator times the weight rows' scales (x's not applied)."""
    BM: gl.constexpr = x_bufs.type.shape[1]
    R: gl.constexpr = 64
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                     instr_shape=[16, BM, 32])
    rows_l: gl.constexpr = gl.SliceLayout(1, layout)
    acc = gl.zeros((R, BM), dtype=gl.float32, layout=layout)
    last = gl.full((R, ), 1.0, dtype=gl.float32, layout=rows_l)
    for ki in range(num_k):
        s = ki % STAGES
        phase = (ki // STAGES) & 1
        mbarrier.wait(w_ready.index(s), phase)
        if RESCALE:  # acc in units of this block's scale (the last block's wgmma retired below)
            sc = gl.maximum(s_bufs.index(s).slice(ME * R, R).load(rows_l), TINY)
            acc = acc * gl.expand_dims(last / sc, 1)
            last = sc
        elif ki == 0:  # one scale row for every block (the slot is released a step later)
            last = s_bufs.index(s).slice(ME * R, R).load(rows_l)
        mbarrier.wait(x_ready.index(s), phase)
        acc = warpgroup_mma(w_bufs.index(s).slice(ME * R, R), x_bufs.index(s).permute((1, 0)), acc, is_async=True)
        if RESCALE:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            mbarrier.arrive(w_empty.index(s), count=1)  # done with the step's x, w and scales
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            mbarrier.arrive(w_empty.index((ki + STAGES - 1) % STAGES), count=1, pred=ki > 0)
    if not RESCALE:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return acc * gl.expand_dims(last, 1)


@gluon.jit
def _a8_store(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, HAS_BIAS: gl.constexpr, CVT: gl.constexpr):
    """y of a wide tile's 64 weight rows from off_n: acc [64, tokens] * x's scales (+ bias); CVT: through a layout
    conversion, 16 bytes a thread along y's rows (`frag_rsp_kernel._store_tile_cvt`: the wgmma layout stores 2 bytes
    a token — 128 half-used stores a thread for a 256-token tile; the A16 wide kernel's y store was 6-8.5 µs a tile
    that way, session 39), else in the wgmma layout."""
    if CVT:
        _store_tile_cvt(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, True, HAS_BIAS, None, 1.0, False)
    else:
        _store_tile(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, True, HAS_BIAS, SWAPPED=True)


@gluon.jit
def _wide_mma(x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, ME: gl.constexpr, xs_ptr, bias_ptr, y_ptr, M, N,
              stride_ym, off_m, off_n, num_k, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, RESCALE: gl.constexpr,
              CVT: gl.constexpr):
    """One warpgroup's 64 weight rows of the tile: the K loop (`_wide_loop`), then y = acc * x scale (+ bias)."""
    acc = _wide_loop(x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, ME, num_k, STAGES, RESCALE)
    _a8_store(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n + ME * 64, HAS_BIAS, CVT)


@gluon.jit
def _wide_tile(x_desc, M, N, K, BN: gl.constexpr, GROUP_M: gl.constexpr):
    """The wide kernels' tile (both `frag_ws_a8_wide_kernel` and `frag_rs_a8_kernel`): (off_m, off_n, its 128-K
    steps) for BN = 128 weight rows by x's box of tokens (x past K is zero-filled by TMA, the frag codes there are
    0)."""
    BM: gl.constexpr = x_desc.block_type.shape[0]  # tokens: the wgmma's N
    BK: gl.constexpr = x_desc.block_type.shape[1]
    gl.static_assert(BK == 128, "a K step is one 128-K frag block")
    gl.static_assert(BN == 128, "two warpgroups of 64 weight rows")
    off_m, off_n = _tile_origin(M, N, BM, BN, GROUP_M)
    return off_m, off_n, gl.cdiv(K, BK)


@gluon.jit
def frag_ws_a8_wide_kernel(x_desc, w_desc, s_desc, xs_ptr, bias_ptr, y_ptr, M, N, K, nb, stride_ym,
                           BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, DQ_WARPS: gl.constexpr,
                           DQ_REGS: gl.constexpr, MMA_REGS: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr,
                           GB: gl.constexpr, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, PANEL: gl.constexpr,
                           DEPTH: gl.constexpr, RESCALE: gl.constexpr, CVT: gl.constexpr = False):
    BM: gl.constexpr = x_desc.block_type.shape[0]  # tokens: the wgmma's N
    off_m, off_n, num_k = _wide_tile(x_desc, M, N, K, BN, GROUP_M)
    x_layout: gl.constexpr = x_desc.layout
    x_bufs, _, x_ready, _, w_bufs, s_bufs, w_ready, w_empty, wq, sq, wq_bar = _a8_rings(
        x_layout, w_desc, s_desc, BM, BN, STAGES, DEPTH, 1, ONE_X=True)
    gl.warp_specialize([  # MMA warpgroups (weight rows 0-63, 64-127), decoders (even, odd steps; x by TMA)
        (_wide_mma, (x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, 0, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym,
                     off_m, off_n, num_k, STAGES, HAS_BIAS, RESCALE, CVT)),
        (_wide_mma, (x_bufs, x_ready, w_bufs, s_bufs, w_ready, w_empty, 1, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym,
                     off_m, off_n, num_k, STAGES, HAS_BIAS, RESCALE, CVT)),
        (_a8_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, s_bufs, w_ready, w_empty, off_n, num_k, 0, 2,
                       SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, 0, 0, 0, x_desc, x_bufs, x_ready, off_m)),
        (_a8_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, s_bufs, w_ready, w_empty, off_n, num_k, 1, 2,
                       SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, 0, 0, 0, x_desc, x_bufs, x_ready, off_m)),
    ], [4, DQ_WARPS, DQ_WARPS], [MMA_REGS, DQ_REGS, DQ_REGS])
# fmt: on
