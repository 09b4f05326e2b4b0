"""Host side of the persistent, stream-K register-operand kernel (`frag_rsp_kernel`; on no route: as fast as the
one-tile kernel, not faster — BENCHMARKS.md, session 38):
`shares` says which blocks each CTA runs (the kernel's `_run` / `_segment`, for the tests' models and the host)."""

from __future__ import annotations

import torch

from anybit.kernels.dequant import cdiv
from anybit.kernels.frag import sm_count
from anybit.kernels.frag_rs import _SMEM, rs_block_m, rs_consts, rs_operands, rs_stages
from anybit.kernels.launch import Launcher


def rsp_stages(block_m: int, bits: int = 4) -> int:
    """`frag_rs.rs_stages` less the partial products' own buffer (64 x block_m fp32)."""
    return rs_stages(block_m, bits, spare=256 * block_m)


def shares(tiles: int, nb: int, ctas: int, pairs: bool = True) -> list[list[tuple[int, int, int]]]:
    """Each CTA's run as segments (tile, first K block, end): the tiles' K blocks in units of two (a tile's last unit
    three when nb is odd; `pairs`, this kernel: every segment two blocks at least, one for each MMA warpgroup) or of
    one (`gemm_frag_rsw`, whose warpgroups share every block), tile after tile, cut into `ctas` runs of units as even
    as they come (CTA q's [q U // P, (q + 1) U // P)) — the kernels' `_run` / `_segment`."""
    h = nb // 2 if pairs else nb
    units = tiles * h
    runs = []
    for q in range(ctas):
        u0, u1 = q * units // ctas, (q + 1) * units // ctas
        segs = []
        for t in range(u0 // h, (u1 - 1) // h + 1):
            j_lo, j_hi = max(u0 - t * h, 0), min(u1 - t * h, h)
            if pairs:
                segs.append((t, 2 * j_lo, nb if j_hi == h else 2 * j_hi))
            else:
                segs.append((t, j_lo, j_hi))
        runs.append(segs)
    return runs


def stream_k_workspace(x: torch.Tensor, floats: int, tiles: int, workspace, counters) -> tuple:
    """The fp32 workspace and zeroed int32 counters of a persistent stream-K launch (this module's kernels and
    `frag_ws_a8`'s) — the Triton backend's shared ones when not given — after checking their sizes."""
    if workspace is None or counters is None:
        from anybit.backends import get_backend

        workspace, counters = get_backend("triton").workspace(x.device, floats, tiles)
    if workspace.numel() < floats or counters.numel() < tiles:
        raise ValueError(f"the persistent kernel's CTAs need a workspace of >= {floats} floats and >= {tiles} "
                         f"counters, got {workspace.numel()} and {counters.numel()}")  # fmt: skip
    return workspace, counters


def gemm_frag_rsp(x: torch.Tensor, tw, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                  block_m: int = 128, stages: int | None = None, group_m: int = 8, mma_regs: int = 232,
                  x_scales: torch.Tensor | None = None, ctas: int | None = None, workspace=None,
                  counters=None) -> torch.Tensor:  # fmt: skip
    """`frag_rs.gemm_frag_rs` (no 8-bit codes) with `ctas` persistent CTAs (default: the SMs, at most one a unit of
    two K blocks) sharing the tiles' K blocks evenly (`shares`); a tile shared by several CTAs is summed by the last
    to finish through `workspace` (fp32, >= 2 ctas x 64 x block_m) and zeroed int32 `counters` (>= the tiles; left
    zero) — the Triton backend's shared ones when not given. K must hold two 128-K blocks at least."""
    if tw.fmt["W_BITS"] == 8:
        raise ValueError("the persistent kernel takes 2-, 3- and 4-bit codes and e2m1, not 8-bit ones")
    if tw.k <= 128:
        raise ValueError(f"the persistent kernel needs K > 128 (two 128-K blocks a tile: one each warpgroup), "
                         f"got {tw.k}")  # fmt: skip
    tiles = cdiv(x.shape[0], block_m) * cdiv(tw.n, 64)
    grid = (min(ctas or sm_count(x.device) or 1, tiles * (cdiv(tw.k, 128) // 2)),)  # (at most a CTA a unit)
    workspace, counters = stream_k_workspace(x, 2 * grid[0] * 64 * block_m, tiles, workspace, counters)
    return _launch("rsp", x, tw, bias, out, block_m, stages, group_m, mma_regs, x_scales, grid, workspace, counters)


# y stored 16 bytes a thread (CVT) from this many tokens a tile: H200 graphs, W4A16 (session 39), off -> on, µs:
# 28672x8192 M=128 118.7 -> 105.3 (Humming 107.0), M=192 164.2 -> 154.3 (160.5); 57344x8192 M=128 225.6 -> 223.4,
# M=192 312.9 -> 297.0 (309.6); at 64 / 96 tokens no gain (71.5 / 100.5 -> 75.5 / 102.0)
RSW_CVT_MIN_M = 128
# a shared tile summed by its first CTA (HEAD) up to this many tokens a tile: H200 graphs, W4A16 (session 40), the
# ticket form -> HEAD, µs: 28672x8192 M=96 / 128 105.0 / 113.4 -> 103.5 / 107.8 (Humming 91.1 / 108.6), 57344x8192
# 202.1 / 228.9 -> 201.5 / 211.0; at 160 / 192 tokens slower: 141.9 / 155.0 -> 141.2 / 160.4, 285.5 / 295.6 -> 291.0
# / 309.9 (the CTAs' speeds spread more there — ends 97-123 µs at 160 tokens, 82-89 at 128 — and the first CTA, not
# the last in, waits). With HEAD its other CTAs announce their parts late (LATE), session 40, µs: 28672x8192 M=96 /
# 128 104.9 / 109.5 -> 99.5 / 108.0 (Humming 93.3 / 110.4), 57344x8192 199.9 / 220.4 -> 188.1 / 203.9 (178.1 / 210.8);
# a part-leaving segment end 2.3 -> 1.6 µs (rsw_timeline, 28672x8192 M=128)
RSW_HEAD_MAX_M = 128
RSW_MAX_STAGES = 8  # H200 graphs, W4A16 M=64 (session 39), 6 -> 8 stages: 28672x8192 81.6 -> 76.9 µs, 4096x14336
# 28.3 -> 27.8


def rsw_stages(block_m: int, bits: int = 4, cvt: bool = False, panels: int = 2) -> int:
    """The most stages (up to RSW_MAX_STAGES) of `gemm_frag_rsw` that fit: a stage is two panels' words (4 KB each;
    3-bit codes 8 KB), their scale (and zero-point) rows (at most 1 KB each) and x's two halves (block_m x 128 x 2
    bytes); up to 64 tokens: 8, 96: 6, 128: 5, 192: 3. cvt: less 8 KB, the scratch of both warpgroups' layout
    conversions (`frag_rsp_kernel._store_tile_cvt`; sm_90a, 128 tokens: 3.9 KB — Triton converts in rounds).
    panels: the tile's 64-row panels (4: four panels' words a stage)."""
    words = 8192 if bits == 3 else 4096
    spare = 8192 * panels // 2 if cvt else 0
    return min(RSW_MAX_STAGES, (_SMEM - spare) // (panels * (words + 1024) + block_m * 256))


def gemm_frag_rsw(x: torch.Tensor, tw, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                  block_m: int = 128, stages: int | None = None, group_m: int = 8, mma_regs: int | None = None,
                  x_scales: torch.Tensor | None = None, ctas: int | None = None, workspace=None,
                  counters=None, times: torch.Tensor | None = None, cvt: bool | None = None,
                  head: bool | None = None, late: bool | None = None, panels: int = 2) -> torch.Tensor:  # fmt: skip
    """`gemm_frag_rsp` with 128-row weight tiles (`frag_rsw_kernel`: the two MMA warpgroups on a 64-row panel each,
    sharing every block's x slices — half the x traffic) and the tiles' K blocks shared one by one among `ctas`
    persistent CTAs (default the SMs); a shared tile's panels summed by the last CTA in through `workspace` (fp32,
    >= 4 ctas x 64 x block_m) and zeroed int32 `counters` (>= 2 x the tiles; left zero); `times` (int64, >= ctas x
    40; a diagnostic, `tools/rsw_timeline.py`): each warpgroup's timestamps (TIMES), one buffer per weight and key;
    `cvt`: y stored 16 bytes a thread (CVT; default from RSW_CVT_MIN_M tokens a tile); `head`: a shared tile summed by
    its first CTA without a ticket (HEAD; default up to RSW_HEAD_MAX_M tokens a tile); `late` (with head; default with
    it): a part left for another CTA announced under the next segment's wgmma (LATE); `panels` 4: 256-row tiles, four
    MMA warpgroups a panel each (PANELS; half the x traffic again, twice the warpgroups to hide each one's decode,
    `mma_regs` default 232 a warpgroup, 104 with four). GPU-tested sessions 39-40
    (`test_frag_rsp_gpu.py`); the route runs it where `rsw_tile` says."""
    if tw.fmt["W_BITS"] == 8:
        raise ValueError("the wide persistent kernel takes 2-, 3- and 4-bit codes and e2m1, not 8-bit ones")
    if block_m > 192:
        raise ValueError(f"block_m={block_m}: the wide persistent kernel takes up to 192 tokens a tile (at 256 its "
                         "warpgroups spill: sm_90a, session 38); two tiles of 128 hold 256 rows")  # fmt: skip
    if panels not in (2, 4):
        raise ValueError(f"panels={panels}: the wide kernel's tiles are 2 or 4 panels of 64 weight rows")
    tiles = cdiv(x.shape[0], block_m) * cdiv(tw.n, 64 * panels)
    grid = (min(ctas or sm_count(x.device) or 1, tiles * cdiv(tw.k, 128)),)
    if times is not None and (times.dtype != torch.int64 or times.numel() < 20 * panels * grid[0]):
        raise ValueError(f"times: an int64 buffer of >= {20 * panels} x {grid[0]} CTAs = {20 * panels * grid[0]} "
                         f"stamps, got {times.dtype} x {times.numel()}")  # fmt: skip
    floats = 2 * panels * grid[0] * 64 * block_m
    workspace, counters = stream_k_workspace(x, floats, panels * tiles, workspace, counters)
    cvt = block_m >= RSW_CVT_MIN_M if cvt is None else cvt
    head = block_m <= RSW_HEAD_MAX_M if head is None else head
    late = head if late is None else late
    if late and not head:
        raise ValueError("late=True announces the parts of the head form: it needs head=True")
    extra = dict(CVT=cvt, HEAD=head, LATE=late, PANELS=panels)
    extra |= dict(times_ptr=times, TIMES=True) if times is not None else {}
    stages = stages or rsw_stages(block_m, tw.fmt["W_BITS"], cvt, panels)
    mma_regs = mma_regs or (104 if panels == 4 else 232)
    return _launch("rsw", x, tw, bias, out, block_m, stages, group_m, mma_regs, x_scales, grid, workspace, counters,
                   extra)  # fmt: skip


RSW_MIN_M = 33  # up to 32 rows the frag kernel's split-K decode
RSW_MAX_M = 192  # past this the wide form runs two 128-token tiles: slower (28672x8192 M=256 214.4 -> 227.1 µs)
RSW_MIN_BLOCKS = 96  # 128-K blocks a CTA at least: each tile a CTA shares costs ~4 µs (14336x4096, 54 a CTA, lost)


def rsw_tile(m: int, n: int, k: int, num_sms: int = 132, bits: int = 4) -> dict | None:
    """The wide kernel's tile for an M-row call of a weight [N, K] with `bits`-bit codes where the route runs it
    (`ws_route_tile`: in place of a one-tile, unsplit `frag_rs.rs_tile` tile, and at 129-RSW_MAX_M rows of the
    warp-specialised kernel's), else None: 2-4-bit codes (e2m1 too), RSW_MIN_M-RSW_MAX_M rows, weights whose 64-row
    tiles overfill one wave of the one-tile kernel (N > 64 x SMs: its CTAs end unevenly and re-read x for every 64-row
    tile) and whose 128-K blocks give each CTA RSW_MIN_BLOCKS at least. H200 graphs (session 39; probe_toggle
    --switch rs-wide and probe_ws), the route -> this, µs: W4A16 / NVFP4 / W3A16 28672x8192 M=96 116.1 / 127.6 / 124.5
    -> 101.4 / 107.9 / 103.4, M=128 124.0 / 145.3 / 138.2 -> 114.7 / 127.6 / 122.0 (Humming W4A16 92.7, 108.6);
    57344x8192 M=96 217.5 / 238.2 / 234.6 -> 197.9 / 213.3 / 216.8, M=128 240.4 / 279.0 / 263.7 -> 225.5 / 245.6 /
    240.8; W3A16 (whose 33-64 rows the one-tile kernel took) 28672x8192 M=40 / 64 101.7 / 100.6 -> 83.3 / 89.8; W4A16
    28672x8192 M=160 / 192 (the warp-specialised kernel) 160.3 / 172.3 -> 145.3 / 163.5 (116.4 / 162.8). Not where
    the 64-row tiles fit one wave (8192^2 M=64 / 96 / 128 the one-tile kernel 23.5 / 29.4 / 34.1 -> 29.3 / 37.0 /
    42.7) nor with few blocks a CTA (14336x4096, 54: M=128 32.4 -> 38.2, M=192 51.0 -> 57.4); the 4-bit decode at
    33-64 rows stays (28672x8192 M=64 73.4 vs 76.3)."""
    if bits not in (2, 3, 4) or not RSW_MIN_M <= m <= RSW_MAX_M or cdiv(n, 64) <= num_sms:
        return None
    if cdiv(n, 128) * cdiv(k, 128) < RSW_MIN_BLOCKS * num_sms:
        return None
    return dict(rs=True, wide=True, block_m=rsw_block_m(rs_block_m(m, n, num_sms, bits) or 128))


def rsw_block_m(block_m: int) -> int:
    """The wide kernel's token tile for a register-operand tile of `block_m` tokens: the same up to 192, else 128
    (at 256 it spills; the route and `explain` send such calls here as two 128-token tiles)."""
    return block_m if block_m <= 192 else 128


def _launch(kind: str, x: torch.Tensor, tw, bias, out, block_m: int, stages: int | None, group_m: int, mma_regs: int,
            x_scales, grid: tuple, workspace: torch.Tensor, counters: torch.Tensor,
            extra: dict | None = None) -> torch.Tensor:  # fmt: skip
    """y from the persistent kernel `kind` ("rsp": `frag_rsp_kernel`, "rsw": `frag_rsw_kernel`), its `Launcher`
    and constexprs worked out once per weight and key (an eager call's host time); `extra`: the kernel's own options
    (constexprs, the wide kernel's timestamp buffer) for its key."""
    extra = extra or {}
    key = (kind, block_m, stages, group_m, mma_regs, x.dtype, bias is None, x_scales is None, *extra.items())
    launch = tw.launches.get(key)
    if launch is None:
        if kind == "rsp":
            from anybit.kernels.frag_rsp_kernel import frag_rsp_kernel as kernel

            rule = rsp_stages
        else:
            from anybit.kernels.frag_rsw_kernel import frag_rsw_kernel as kernel

            rule = rsw_stages
        consts = rs_consts(tw, block_m, stages or rule(block_m, tw.fmt["W_BITS"]), mma_regs)  # (checks the tile)
        consts |= dict(GROUP_M=group_m, HAS_BIAS=bias is not None, ROW_SCALES=x_scales is not None)
        consts |= extra
        launch = tw.launches[key] = Launcher(kernel, consts, _RSP_LIVE)
    y, operands = rs_operands(x, tw, bias, out, block_m, x_scales)
    launch(grid, *operands, y, workspace, counters, x.shape[0], tw.n, tw.k, tw.planes[0].shape[-1] // 16, y.stride(0))
    return y


# the arguments of `frag_rsp_kernel` and `frag_rsw_kernel` a call changes: x's descriptors, x's row scales, y (also
# standing in for what is absent), bias, workspace, counters, M, y's row stride
_RSP_LIVE = (0, 1, 5, 6, 7, 8, 9, 10, 11, 15)
