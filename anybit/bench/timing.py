"""Timing and ceilings. GPU: CUDA events around `calls` consecutive calls rotating over weight copies
(so weights come from HBM, not L2), after warm-up; eager and CUDA-graph replay; every sample kept,
the median reported. CPU: the same with the wall clock."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def _sample(run: Callable[[], None], cuda: bool) -> float:
    if not cuda:
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e6
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


WARM_S = 0.05  # GPU warm-up of at least this long before the samples (s)


def _warm(run: Callable[[], None], runs: int, cuda: bool) -> None:
    """`runs` runs, then (GPU) more until WARM_S has passed: an H200 that sat idle (a weight being quantized, a
    host-bound eager loop) ran its first ~10 ms of graph replays 10-15 % slower (bench samples, 2026-12-01)."""
    t0 = time.perf_counter()
    done = 0
    while done < runs or (cuda and time.perf_counter() - t0 < WARM_S):
        run()
        done += 1
        if cuda:
            torch.cuda.synchronize()


def time_eager(fns: list[Callable], calls: int, repeats: int, warmup: int, cuda: bool) -> list[float]:
    """µs per call: `repeats` samples, each the mean of `calls` back-to-back launches."""
    seq = [fns[i % len(fns)] for i in range(calls)]

    def run():
        for f in seq:
            f()

    _warm(run, max(1, warmup // calls), cuda)
    return [_sample(run, cuda) / calls for _ in range(repeats)]


def time_graph(fns: list[Callable], calls: int, repeats: int, warmup: int) -> list[float]:
    """µs per call of one CUDA graph holding `calls` rotated calls, replayed `repeats` times."""
    seq = [fns[i % len(fns)] for i in range(calls)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for f in seq:  # warm outside the capture: JIT compiles, workspaces are allocated
            f()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for f in seq:
            f()
    _warm(graph.replay, max(1, warmup // calls), True)
    return [_sample(graph.replay, True) / calls for _ in range(repeats)]


def median(samples: list[float]) -> float:
    return statistics.median(samples)


def ceilings(device: torch.device) -> dict:
    """This card today: copy bandwidth (read + write bytes / s), cuBLAS bf16 and FP8 peak FLOP/s."""
    out = {}
    a = torch.empty(1 << 28, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    out["copy_Bps"] = 2 * a.nbytes / (median(time_eager([lambda: b.copy_(a)], 10, 5, 10, True)) * 1e-6)

    x = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    us = median(time_eager([lambda: x @ x], 10, 5, 10, True))
    out["bf16_flops"] = 2 * 8192**3 / (us * 1e-6)
    if torch.cuda.get_device_capability(device) >= (8, 9):
        xf = x.to(torch.float8_e4m3fn)
        wf = x.to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device)
        us = median(time_eager([lambda: torch._scaled_mm(xf, wf, one, one, out_dtype=torch.bfloat16)], 10, 5, 10, True))
        out["fp8_flops"] = 2 * 8192**3 / (us * 1e-6)
    return out
