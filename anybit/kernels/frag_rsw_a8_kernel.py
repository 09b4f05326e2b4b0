"""The persistent, stream-K form of the register-operand wide W4A8 kernel (`frag_rs_a8_kernel`; sm_90a, large M;
`gemm_frag_ws_a8(..., rs=True, persistent=True)`, on the route only with ANYBIT_FRAG_RS_A8=2).

Why: the one-tile kernel launches a CTA a 128 x 256 tile, so a call's last wave runs part-full — 7168^2 at 1024 rows
is 224 tiles on 132 SMs, 1.7 waves paid as 2 (the worst W4A8 cell against Humming, 0.80x, session 49) — and each
CTA's first steps wait for their loads and its epilogue for nothing to overlap. Here P CTAs (one an SM) share every
tile's 128-K steps evenly (`frag_rsp_kernel._run` with one step a unit: all tiles' steps, tile after tile, cut into
P runs — 95 steps a CTA there instead of two tiles' 112), and the ring runs on across a CTA's tiles: the loader
fetches the next tile's first steps while the MMA warpgroups finish this one.

Per CTA, three partitions, as in the one-tile kernel:

* loader (1 warp): every step of the CTA's run in order — step kb of tile t into ring slot g % STAGES (g counts the
  run's steps): its words and scale row (`_w_fetch`), x's [tokens, 128] box (`_x_issue` at K step kb);
* two MMA warpgroups (weight rows 0-63 and 64-127 of each tile): per segment (a run's piece of a tile) the one-tile
  kernel's loop (`_rs_a8_loop` from ring step g), whose accumulator starts at zero in units of the segment's first
  scale and leaves it times the last — a segment's products in the weight's own units, so the parts of a shared
  tile add as they are; then the tile stored, or summed through `frag_rsp_kernel._fixup` with a counter and
  workspace slots of the warpgroup's own (LANES 2): the last CTA in sums every part in CTA order (the same bits
  whichever is last) — or with HEAD the CTA holding the tile's first step, whose run ends there — and stores y.

Also at 33-256 rows (`frag_ws_a8.rsw_a8_tile`: 64-256 tokens a tile, where a few tokens must stream the weight on
every SM) and for MXFP4 weights (E2M1, as the one-tile kernel).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from anybit.kernels.frag_rs_a8_kernel import _rs_a8_loop, _rs_a8_rings
from anybit.kernels.frag_rsp_kernel import _fixup, _run, _segment
from anybit.kernels.frag_ws_a8_wide_kernel import _a8_store, _wide_tile
from anybit.kernels.frag_ws_kernel import _tile_origin, _w_fetch, _x_issue


# fmt: off
@gluon.jit
def _rsw_a8_loader(w_desc, s_desc, x_desc, wq, sq, x_bufs, ready, x_ready, empty, M, N, nb, tiles, num_k,
                   GROUP_M: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, PANEL: gl.constexpr):
    """Every step of the CTA's run: step kb of tile t into slot g % STAGES once both MMA warpgroups released it."""
    STAGES: gl.constexpr = wq.type.shape[0]
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BN: gl.constexpr = 2 * 64
    u0, u1, t0, t1 = _run(tiles, num_k, False)
    g = 0
    for t in range(t0, t1 + 1):
        off_m, off_n = _tile_origin(M, N, BM, BN, GROUP_M, t)
        kb_lo, kb_hi = _segment(t, u0, u1, num_k, False)
        for kb in range(kb_lo, kb_hi):
            s = g % STAGES
            mbarrier.wait(empty.index(s), ((g // STAGES) & 1) ^ 1)
            _w_fetch(w_desc, s_desc, wq, sq, ready, s, 0, 0, off_n // PANEL, nb, off_n, kb, num_k, GB,
                     SCALE_PER_BLOCK)
            _x_issue(x_desc, x_bufs, x_ready, off_m, g, g + 1, STAGES, kb - g)  # slot g, x's K step kb
            g += 1


@gluon.jit
def _rsw_a8_mma(wq, sq, x_bufs, ready, x_ready, empty, ME: gl.constexpr, xs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr,
                M, N, stride_ym, tiles, num_k, GROUP_M: gl.constexpr, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr,
                RESCALE: gl.constexpr, HEAD: gl.constexpr, CVT: gl.constexpr, E2M1: gl.constexpr, rs_ptr):
    """MMA warpgroup ME (64 weight rows of each tile): every segment of the CTA's run (`_rs_a8_loop` from ring step
    g), then its rows' products stored, or summed with the other CTAs' parts of the tile (`_fixup`, lane ME)."""
    BM: gl.constexpr = x_bufs.type.shape[1]
    u0, u1, t0, t1 = _run(tiles, num_k, False)
    g = 0
    for t in range(t0, t1 + 1):
        kb_lo, kb_hi = _segment(t, u0, u1, num_k, False)
        off_m, off_n = _tile_origin(M, N, BM, 2 * 64, GROUP_M, t)
        acc = _rs_a8_loop(wq, sq, x_bufs, ready, x_ready, empty, ME, kb_hi - kb_lo, SIGNED, RESCALE, False, 0, g,
                          E2M1, rs_ptr, N, off_n)
        g += kb_hi - kb_lo
        stores, acc, _ = _fixup(acc, acc, ws_ptr, cnt_ptr, t, num_k, tiles, False, False, ME, 2, HEAD)
        if stores:
            _a8_store(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n + ME * 64, HAS_BIAS, CVT)


@gluon.jit
def frag_rsw_a8_kernel(x_desc, w_desc, s_desc, xs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, M, N, K, nb, stride_ym,
                       rs_ptr, BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, MMA_REGS: gl.constexpr,
                       SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr,
                       PANEL: gl.constexpr, RESCALE: gl.constexpr, HEAD: gl.constexpr, CVT: gl.constexpr = False,
                       E2M1: gl.constexpr = False):
    BM: gl.constexpr = x_desc.block_type.shape[0]  # tokens: the wgmma's N
    _, _, num_k = _wide_tile(x_desc, M, N, K, BN, GROUP_M)
    tiles = gl.cdiv(M, BM) * gl.cdiv(N, BN)
    x_layout: gl.constexpr = x_desc.layout
    x_bufs, wq, sq, ready, x_ready, empty = _rs_a8_rings(x_layout, w_desc, s_desc, BM, BN, STAGES, 1)
    gl.warp_specialize([  # MMA warpgroups (weight rows 0-63, 64-127 of each tile), loader
        (_rsw_a8_mma, (wq, sq, x_bufs, ready, x_ready, empty, 0, xs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, M, N,
                       stride_ym, tiles, num_k, GROUP_M, SIGNED, HAS_BIAS, RESCALE, HEAD, CVT, E2M1, rs_ptr)),
        (_rsw_a8_mma, (wq, sq, x_bufs, ready, x_ready, empty, 1, xs_ptr, bias_ptr, y_ptr, ws_ptr, cnt_ptr, M, N,
                       stride_ym, tiles, num_k, GROUP_M, SIGNED, HAS_BIAS, RESCALE, HEAD, CVT, E2M1, rs_ptr)),
        (_rsw_a8_loader, (w_desc, s_desc, x_desc, wq, sq, x_bufs, ready, x_ready, empty, M, N, nb, tiles, num_k,
                          GROUP_M, SCALE_PER_BLOCK, GB, PANEL)),
    ], [4, 1], [MMA_REGS, 48])
# fmt: on
