"""Rows and epilogues of the grouped MoE kernels (`moe_gemm`): which rows of y a block holds and which x rows they
read (`moe_align`'s sorted rows, or slot blocks: one flat slot a block, on the top-k ids as given), whether a block
runs, and how its fp32 tile leaves — scaled, stored (silu(gate) * up), or as a partial that the last of a tile's
partials sums (split-K; slot blocks' top-k sum)."""

from __future__ import annotations

import triton
import triton.language as tl


# fmt: off
@triton.jit
def block_ids(N_FIRST: tl.constexpr = False):
    """(pid_m, pid_n): the program's block of rows and N tile. N_FIRST: the grid is (N tiles, blocks, 1), so the CTAs
    launched together share a block's x rows and its expert's weights (L2), instead of each N tile streaming every
    block's x rows again (`moe_gemm`'s `n_first`); without split-K or slot blocks (`sum_partials` counts tiles by
    the (blocks, N tiles, splits) grid)."""
    if N_FIRST:
        pid_m = tl.program_id(1)
        pid_n = tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
    return pid_m, pid_n


@triton.jit
def block_rows(sorted_ptr, pid_m, n_sorted, num_rows, TOP_K: tl.constexpr, BLOCK_M: tl.constexpr,
               ROWS: tl.constexpr = 0, FIRST: tl.constexpr = 0, SLOTS: tl.constexpr = False):
    """Block pid_m's rows of y (flat slots; padding = num_rows, masked) and the x row each reads: all
    BLOCK_M of them, or ROWS from its row FIRST on. SLOTS: a block is flat slot pid_m alone, on its first row."""
    lane = tl.arange(0, ROWS if ROWS else BLOCK_M)
    if SLOTS:
        rows = pid_m + lane * 0
        valid = lane == 0
    else:
        pos = pid_m * BLOCK_M + FIRST + lane
        rows = tl.load(sorted_ptr + pos, mask=pos < n_sorted, other=num_rows)
        valid = rows < num_rows
    return rows, valid, rows // TOP_K


@triton.jit
def check_expert(e, E, CHECK: tl.constexpr):
    """A slot's expert id >= E (`moe_gemm(sorted_ids=None)` reads the top-k ids as given) stops the kernel, and with
    it the CUDA context, as a device-side assert does: a `trap` (CUDA reports an unspecified launch failure). Not a
    printed message: a printf call in the kernel cost the K loop 7 % more instructions (sm_90a, w4a16)."""
    if CHECK:
        tl.inline_asm_elementwise("{ .reg .pred bad; setp.ge.s64 bad, $1, $2; @bad trap; mov.b32 $0, 0; }", "=r,l,l",
                                  [e.to(tl.int64), E.to(tl.int64)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def finish_rows(acc, e, gs_ptr, xs_ptr, rw_ptr, y_ptr, ws_ptr, cnt_ptr, rows, src, mask_m, offs_n, mask_n, pid_m,
                pid_n, pid_k, N, stride_ym, HAS_GS: tl.constexpr, FP8_X: tl.constexpr, MUL_ROUTED: tl.constexpr,
                SILU_MUL: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                SUM_SLOTS: tl.constexpr = 0):
    """The grouped kernels' epilogue for an fp32 [BLOCK_M, BLOCK_N] tile with weight scales applied:
    global scale, per-token x scales, top-k weights, then store (silu(gate) * up when SILU_MUL), or
    with SPLIT_K the partial to the workspace and the last split to arrive sums, stores, re-arms;
    SUM_SLOTS: `sum_partials`."""
    if HAS_GS:
        acc = acc * tl.load(gs_ptr + e)
    if FP8_X:  # each x row's per-token scale (x rows: tokens for gate_up, flat slots for down)
        acc = acc * tl.load(xs_ptr + src, mask=mask_m, other=0.0)[:, None]
    if MUL_ROUTED:  # the top-k weight of each row's (token, slot)
        acc = acc * tl.load(rw_ptr + rows, mask=mask_m, other=0.0)[:, None]
    # every scaling above is linear, so splits may apply it to their partials; silu waits for the sum
    if SPLIT_K == 1 and SUM_SLOTS == 0:
        store_rows(acc, y_ptr, rows, mask_m, offs_n, mask_n, pid_n, N, stride_ym, SILU_MUL, BLOCK_M, BLOCK_N)
    else:
        sum_partials(acc, y_ptr, ws_ptr, cnt_ptr, rows, mask_m, offs_n, mask_n, pid_m, pid_n, pid_k, N, stride_ym,
                     SILU_MUL, SUM_SLOTS, SPLIT_K, BLOCK_M, BLOCK_N)


@triton.jit
def sum_partials(acc, y_ptr, ws_ptr, cnt_ptr, rows, mask_m, offs_n, mask_n, pid_m, pid_n, pid_k, N, stride_ym,
                 SILU_MUL: tl.constexpr, SUM_SLOTS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """The tile's partial (its K split's; SUM_SLOTS: its slot's, slot blocks holding row pid_m on their first row) to
    the workspace; the last of the output tile's partials to arrive (SPLIT_K, times SUM_SLOTS: every slot of the
    token) sums them in a fixed order (the same bits every launch), stores y (SUM_SLOTS: the token's row — the top-k
    sum without a launch of its own) and re-arms the tile's counter for the next launch (graph replay)."""
    BLOCKS: tl.constexpr = SUM_SLOTS if SUM_SLOTS else 1  # the blocks summed into one output tile
    grid_rows = tl.num_programs(0) * BLOCK_M
    local = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    ws_tile = ws_ptr + local[:, None].to(tl.int64) * N + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    tl.store(ws_tile + pid_k * grid_rows * N, acc, mask=mask)
    tl.debug_barrier()
    owner = pid_m // BLOCKS  # the output tile's (token's) first block is owner * BLOCKS
    tile = owner * tl.num_programs(1) + pid_n
    if tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel") == BLOCKS * SPLIT_K - 1:
        first = ws_tile + (owner * BLOCKS - pid_m) * BLOCK_M * N
        total = tl.zeros_like(acc)
        for j in range(BLOCKS):
            for i in range(SPLIT_K):
                total += tl.load(first + (j * BLOCK_M + i * grid_rows) * N, mask=mask, other=0.0, cache_modifier=".cg")
        out_rows = rows // SUM_SLOTS if SUM_SLOTS else rows
        store_rows(total, y_ptr, out_rows, mask_m, offs_n, mask_n, pid_n, N, stride_ym, SILU_MUL, BLOCK_M, BLOCK_N)
        tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit
def block_live(e, E, total_ptr, y_ptr, ws_ptr, cnt_ptr, pid_m, N, stride_ym, SLOTS: tl.constexpr,
               SUM_SLOTS: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CHECK_E: tl.constexpr):
    """Whether block pid_m (expert e) runs its GEMM: aligned, a block within the padded total of an expert on this
    rank; a slot block (n_sorted = 0: the kernel's loads of sorted ids are masked off), an expert in [0, E) — one that
    is not still adds its zeros to its token's sum (SUM_SLOTS)."""
    if SLOTS:
        check_expert(e, E, CHECK_E)
        if SUM_SLOTS:
            if (e < 0) | (e >= E):
                dropped_slot(y_ptr, ws_ptr, cnt_ptr, pid_m, N, stride_ym, SUM_SLOTS, SPLIT_K, BLOCK_M, BLOCK_N)
        live = (e >= 0) & (e < E)
    else:
        live = pid_m * BLOCK_M < tl.load(total_ptr) and e >= 0
    return live


@triton.jit
def dropped_slot(y_ptr, ws_ptr, cnt_ptr, pid_m, N, stride_ym, SUM_SLOTS: tl.constexpr, SPLIT_K: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A slot of no expert (id -1, or >= E unchecked) adds zeros to its token's sum (`sum_partials` counts every
    slot's partials)."""
    pid_n = tl.program_id(1)
    lane = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    sum_partials(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), y_ptr, ws_ptr, cnt_ptr, pid_m + lane * 0, lane == 0,
                 offs_n, offs_n < N, pid_m, pid_n, tl.program_id(2), N, stride_ym, False, SUM_SLOTS, SPLIT_K, BLOCK_M,
                 BLOCK_N)


@triton.jit
def store_rows(acc, y_ptr, rows, mask_m, offs_n, mask_n, pid_n, N, stride_ym, SILU_MUL: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Write the tile's rows of y (flat slots), or silu(gate) * up of interleaved gate/up columns."""
    if SILU_MUL:
        # rows of W interleave gate and up (2j, 2j+1): split the tile's columns into the two halves
        gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
        h = gate / (1.0 + tl.exp(-gate)) * up
        offs_h = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        y_ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_ym + offs_h[None, :]
        tl.store(y_ptrs, h.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & (offs_h < N // 2)[None, :])
    else:
        y_ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
# fmt: on
