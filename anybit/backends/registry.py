"""The backend registry and the chooser: the first backend, in the configured order, that supports
the problem — or, where `anybit tune` measured this problem's M bucket, the fastest usable one. Every
decision carries its reason. A kernel that fails to compile or launch at first use logs one warning
and its calls go to the next backend."""

from __future__ import annotations

import warnings

import torch

from anybit import settings
from anybit.backends.base import Backend, Prepared, Problem
from anybit.backends.humming import HummingBackend
from anybit.backends.torch_ref import TorchBackend
from anybit.backends.triton import TritonBackend, tuning_cache
from anybit.errors import AnybitError, FallbackWarning, KernelFailure
from anybit.formats.scheme import Scheme
from anybit.quant.weights import QuantizedWeight
from anybit.tuning.cache import backend_key, m_bucket, problem_key


class _Registry:
    def __init__(self):
        self.backends: dict[str, Backend] = {
            "triton": TritonBackend(),
            "humming": HummingBackend(),
            "torch": TorchBackend(),
        }


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


def measured_us(problem: Problem) -> dict[str, float]:
    """{backend: µs} that `anybit tune` (or a shipped table) measured for this problem's M bucket on
    this device; empty where nothing was measured."""
    if problem.m is None or problem.act_dtype is None:
        return {}
    cache = tuning_cache(problem.device)
    key = problem_key(problem.scheme, problem.n, problem.k, problem.m, problem.act_dtype)
    out = {}
    for name in _REGISTRY.backends:
        entry = cache.get(backend_key(key, name))
        if entry is not None and isinstance(entry.get("us"), (int, float)):
            out[name] = float(entry["us"])
    return out


def choose(problem: Problem, backend: str = "auto") -> Backend:
    """The backend for `problem`: the forced one (raising with its reason if it cannot run it), else
    the fastest measured usable one for the M bucket, else the first usable one in order."""
    return _REGISTRY.backends[choose_with_reason(problem, backend)[0]]


def choose_with_reason(problem: Problem, backend: str = "auto") -> tuple[str, str]:
    if backend != "auto":
        ok, reason = get_backend(backend).supports(problem)
        if not ok:
            raise AnybitError(f"backend {backend!r} cannot run scheme {problem.scheme}: {reason}")
        return backend, "forced"
    usable = [name for name, ok, _ in explain(problem) if ok]
    if not usable:
        raise AnybitError("no backend can run this problem: " + "; ".join(f"{n}: {r}" for n, _, r in explain(problem)))
    times = {b: t for b, t in measured_us(problem).items() if b in usable}
    if times:
        best = min(times, key=times.get)
        listed = ", ".join(f"{b} {t:.1f} µs" for b, t in sorted(times.items(), key=lambda bt: bt[1]))
        return best, f"measured fastest for M bucket {m_bucket(problem.m)} ({listed})"
    return usable[0], "first usable backend in order (nothing measured for this problem)"


def prepare(qweight: QuantizedWeight, backend: str = "auto", act_dtype: torch.dtype | None = None) -> Prepared:
    """QuantizedWeight -> the chosen backend's layout (done once, at load time)."""
    problem = Problem(Scheme.parse(qweight.scheme), qweight.n, qweight.k, None, qweight.device, act_dtype)
    prepared = choose(problem, backend).prepare(qweight)
    prepared.auto = backend == "auto"
    return prepared


def gemm(x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ dequantize(W).T (+ bias). x: [..., K] bf16/fp16; y: [..., N] in x's dtype."""
    qw = prepared.qweight
    if x.shape[-1] != qw.k:
        raise AnybitError(f"x has K={x.shape[-1]} columns, the weight has K={qw.k}")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise AnybitError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if x.device != qw.device:
        raise AnybitError(f"x is on {x.device}, the weight on {qw.device}")
    if bias is not None and (bias.shape != (qw.n,) or bias.dtype != x.dtype or bias.device != x.device):
        raise AnybitError(
            f"bias must be [{qw.n}] in x's dtype {x.dtype} on {x.device}, got {tuple(bias.shape)} {bias.dtype} "
            f"on {bias.device}"
        )
    if not prepared.auto:
        return get_backend(prepared.backend).gemm(x, prepared, bias)
    m = x.numel() // qw.k
    target = _route(x, prepared, m)
    try:
        return get_backend(target.backend).gemm(x, target, bias)
    except KernelFailure as e:
        return _fall_back(x, prepared, target, m, bias, e)


def _route(x: torch.Tensor, prepared: Prepared, m: int) -> Prepared:
    """The prepared layout an "auto" call of M rows runs on: the fallback where this bucket failed,
    the measured-fastest backend's with ANYBIT_MULTI_BACKEND=1, else the weight's own (decided once
    per M bucket: no lookups on the call path)."""
    bucket = m_bucket(m)
    name = prepared.routes.get(bucket)
    if name is None:
        name = prepared.backend
        if settings.load().multi_backend:
            qw = prepared.qweight
            name = choose(Problem(qw.scheme, qw.n, qw.k, m, x.device, x.dtype)).name
        prepared.routes[bucket] = name
    return prepared if name == prepared.backend else _other(prepared, name)


def _other(prepared: Prepared, name: str) -> Prepared:
    if name not in prepared.others:
        prepared.others[name] = get_backend(name).prepare(prepared.qweight)
    return prepared.others[name]


def _fall_back(x, prepared: Prepared, failed: Prepared, m: int, bias, error: KernelFailure) -> torch.Tensor:
    qw = prepared.qweight
    problem = Problem(qw.scheme, qw.n, qw.k, m, x.device, x.dtype)
    rows = explain(problem)
    after = [n for n, ok, _ in rows[[n for n, _, _ in rows].index(failed.backend) + 1 :] if ok]
    if not after:
        raise AnybitError(f"{error}; and no backend after {failed.backend!r} can run it") from error
    name = after[0]
    warnings.warn(
        f"anybit: {error}. Calls of this layer with M in bucket {m_bucket(m)} now run on {name!r}.",
        FallbackWarning,
        stacklevel=3,
    )
    prepared.routes[m_bucket(m)] = name
    return get_backend(name).gemm(x, _other(prepared, name), bias)
