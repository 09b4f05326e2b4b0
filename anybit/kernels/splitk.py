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
    store. Else every split writes its partial to the workspace [SPLIT_K, M, N]; the last split to
    arrive at this tile (acq_rel counter `tile`) sums them, adds the bias, stores and re-arms the
    counter — no host synchronisation, replayable in a CUDA graph."""
    mask_n = offs_n < N
    mask = (offs_m < M)[:, None] & mask_n[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        ws_tile = ws_ptr + offs_m[:, None] * N + offs_n[None, :]
        tl.store(ws_tile + pid_k * M * N, acc, mask=mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros_like(acc)
            for i in range(SPLIT_K):
                total += tl.load(ws_tile + i * M * N, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr + tile, 0)
