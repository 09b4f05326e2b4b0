"""anybit's GEMM as a torch custom op, so `torch.compile(fullgraph=True)` traces through quantized
layers (the op is opaque to the compiler; its fake implementation gives the output shape) and CUDA
graphs capture the real kernels.

A layer is named by an integer handle: the op looks the layer up (weakly) at run time and uses its
prepared layout, built on first use on the layer's device.
"""

from __future__ import annotations

import itertools
import weakref

import torch

_LAYERS: dict[int, weakref.ref] = {}
_ids = itertools.count(1)


def register(layer) -> int:
    """A handle for a QuantLinear-like object with `.prepared()`; dropped when the layer dies."""
    handle = next(_ids)
    _LAYERS[handle] = weakref.ref(layer, lambda _, h=handle: _LAYERS.pop(h, None))
    return handle


@torch.library.custom_op("anybit::linear", mutates_args=())
def linear(x: torch.Tensor, handle: int, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    """y[..., n] = x @ dequantize(W).T (+ bias) for the layer behind `handle`."""
    from anybit.backends.registry import gemm

    ref = _LAYERS.get(handle)
    layer = ref() if ref is not None else None
    if layer is None:
        raise RuntimeError(f"anybit::linear: no live layer for handle {handle}")
    return gemm(x, layer.prepared(), bias)


@linear.register_fake
def _(x: torch.Tensor, handle: int, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], n))
