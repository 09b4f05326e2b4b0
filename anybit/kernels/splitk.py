"""The split-K epilogue shared by the GEMM kernels: store, or reduce partials in one launch."""

import triton
import triton.language as tl


@triton.jit
def store_or_reduce(
    acc,
    y_ptr,
    ws_ptr,
    cnt_ptr,
    bias_ptr,
    offs_m,
    offs_n,
    M,
    N,
    stride_ym,
    tile,
    pid_k,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    """acc: fp32 [BM, BN] at rows offs_m, columns offs_n, fully scaled. SPLIT_K == 1: add the bias and
    store. Else one atomic on the tile's counter `tile` says how many splits came in first; those write
    their partials to their slices of the workspace [SPLIT_K, M, N] and add SPLIT_K to the counter
    (release, after a barrier); the last in waits (acquire) for the counter to reach SPLIT_K², sums every
    split's partial in split order — its own from registers, the same bits whichever split is last —,
    adds the bias, stores and re-arms the counter: no host synchronisation, replayable in a CUDA graph.
    (The waits are bounded: the splits ahead are past their K loops. The last in used to write its own
    partial and read every slice back.)"""
    mask_n = offs_n < N
    mask = (offs_m < M)[:, None] & mask_n[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        _store_y(acc, y_ptrs, bias_ptr, offs_n, mask_n, mask, HAS_BIAS)
    else:
        ws_tile = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
        ahead = tl.atomic_add(cnt_ptr + tile, 1, sem="relaxed") % SPLIT_K
        if ahead != SPLIT_K - 1:
            tl.store(ws_tile + pid_k * M * N, acc, mask=mask)
            tl.debug_barrier()
            tl.atomic_add(cnt_ptr + tile, SPLIT_K, sem="release")
        else:
            landed = tl.atomic_add(cnt_ptr + tile, 0, sem="acquire")
            while landed != SPLIT_K * SPLIT_K:
                landed = tl.atomic_add(cnt_ptr + tile, 0, sem="acquire")
            if SPLIT_K == 2:  # (one add: the same bits either way round)
                total = acc + tl.load(ws_tile + (1 - pid_k) * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            else:
                total = tl.zeros_like(acc)
                for i in tl.static_range(SPLIT_K):
                    theirs = mask & (offs_n[None, :] * 0 + pid_k != i)  # (not this split's own slice)
                    other = tl.load(ws_tile + i * M * N, mask=theirs, other=0.0, cache_modifier=".cg")
                    total += tl.where(pid_k == i, acc, other)
            _store_y(total, y_ptrs, bias_ptr, offs_n, mask_n, mask, HAS_BIAS)
            tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit
def _store_y(total, y_ptrs, bias_ptr, offs_n, mask_n, mask, HAS_BIAS: tl.constexpr):
    """y's tile = total (+ bias)."""
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    tl.store(y_ptrs, total.to(y_ptrs.dtype.element_ty), mask=mask)
