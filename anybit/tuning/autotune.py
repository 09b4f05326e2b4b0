"""Choose a GEMM tile by measuring candidates around the default on the real problem (GPU)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from anybit.kernels.gemm import GemmConfig


def candidates(default: GemmConfig, frag: bool = False) -> list[GemmConfig]:
    """The default and its neighbours: half/double the N tile and the split-K, the other warp count;
    a deeper K tile (bit-plane kernels), or half the token tile (frag kernel: its K block is fixed,
    and at 64 tokens two 32-token tiles can beat one; 48 tokens: 32 and 64)."""
    out = [default]
    for bn in (default.block_n // 2, default.block_n * 2):
        if 32 <= bn <= 256:
            out.append(dataclasses.replace(default, block_n=bn))
    for split in (default.split_k // 2, default.split_k * 2):
        if 1 <= split <= 32:
            out.append(dataclasses.replace(default, split_k=split))
    if default.num_warps in (4, 8):  # the other of 4 / 8 warps (the 16-warp frag tile has no such neighbour)
        out.append(dataclasses.replace(default, num_warps=12 - default.num_warps, num_stages=7 - default.num_stages))
    if frag:  # the 48-token tile (32 + 16) against its neighbours 32 and 64
        for bm in (32, 64) if default.block_m == 48 else (default.block_m // 2,):
            if bm >= 16:
                out.append(dataclasses.replace(default, block_m=bm))
    elif default.block_k < 256:
        out.append(dataclasses.replace(default, block_k=default.block_k * 2, num_stages=max(2, default.num_stages - 1)))
    return list(dict.fromkeys(out))


def autotune(configs: list[GemmConfig], time_us: Callable[[GemmConfig], float]) -> tuple[GemmConfig, float]:
    """The fastest config by `time_us` (a config that fails to compile or run is skipped)."""
    best, best_us = None, float("inf")
    for c in configs:
        try:
            us = time_us(c)
        except Exception:  # noqa: BLE001 - a tile that does not fit this GPU is not a candidate
            continue
        if us < best_us:
            best, best_us = c, us
    if best is None:
        raise RuntimeError("no candidate configuration ran")
    return best, best_us


def cuda_time_us(run: Callable[[], object], graph: bool, calls: int = 20, repeats: int = 5) -> float:
    """Median µs per call, CUDA events around `calls` back-to-back calls after a warm-up; replayed
    from a CUDA graph when `graph` (small M: eager calls would time the host, not the kernel)."""
    from anybit.bench.timing import median, time_eager, time_graph

    if graph:
        return median(time_graph([run], calls, repeats, calls))
    return median(time_eager([run], calls, repeats, calls, True))
