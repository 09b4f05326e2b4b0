"""CUDA-graph helpers of the GPU tests."""

import torch


def replayed(fn):
    """fn() captured in a CUDA graph (after whatever eager calls warmed it up) and the graph replayed once: the output
    the replay wrote."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    return out
