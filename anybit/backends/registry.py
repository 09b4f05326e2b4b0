"""The backend registry and the chooser: first backend, in the configured order, that supports the
problem; every decision carries its reason."""

from __future__ import annotations

import torch

from anybit import settings
from anybit.backends.base import Backend, Prepared, Problem
from anybit.backends.torch_ref import TorchBackend
from anybit.backends.triton import TritonBackend
from anybit.errors import AnybitError
from anybit.formats.scheme import Scheme
from anybit.quant.weights import QuantizedWeight


class _Registry:
    def __init__(self):
        self.backends: dict[str, Backend] = {"triton": TritonBackend(), "torch": TorchBackend()}


_REGISTRY = _Registry()


def get_backend(name: str) -> Backend:
    try:
        return _REGISTRY.backends[name]
    except KeyError:
        raise AnybitError(f"unknown backend {name!r}; available: {sorted(_REGISTRY.backends)}") from None


def explain(problem: Problem) -> list[tuple[str, bool, str]]:
    """(backend, usable, reason) for every backend in the order "auto" tries them."""
    cfg = settings.load()
    order = [b for b in cfg.backends if b in _REGISTRY.backends]
    order += [b for b in _REGISTRY.backends if b not in order]
    rows = []
    for name in order:
        if name in cfg.disabled_backends:
            rows.append((name, False, "disabled by ANYBIT_DISABLED_BACKENDS"))
            continue
        ok, reason = _REGISTRY.backends[name].supports(problem)
        rows.append((name, ok, reason))
    return rows


def choose(problem: Problem, backend: str = "auto") -> Backend:
    if backend != "auto":
        b = get_backend(backend)
        ok, reason = b.supports(problem)
        if not ok:
            raise AnybitError(f"backend {backend!r} cannot run scheme {problem.scheme}: {reason}")
        return b
    for name, ok, _ in explain(problem):
        if ok:
            return _REGISTRY.backends[name]
    raise AnybitError("no backend can run this problem: " + "; ".join(f"{n}: {r}" for n, _, r in explain(problem)))


def prepare(qweight: QuantizedWeight, backend: str = "auto", act_dtype: torch.dtype | None = None) -> Prepared:
    """QuantizedWeight -> the chosen backend's layout (done once, at load time)."""
    problem = Problem(Scheme.parse(qweight.scheme), qweight.n, qweight.k, None, qweight.device, act_dtype)
    return choose(problem, backend).prepare(qweight)


def gemm(x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ dequantize(W).T (+ bias). x: [..., K] bf16/fp16; y: [..., N] in x's dtype."""
    qw = prepared.qweight
    if x.shape[-1] != qw.k:
        raise AnybitError(f"x has K={x.shape[-1]} columns, the weight has K={qw.k}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise AnybitError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if x.device != qw.device:
        raise AnybitError(f"x is on {x.device}, the weight on {qw.device}")
    return get_backend(prepared.backend).gemm(x, prepared, bias)
