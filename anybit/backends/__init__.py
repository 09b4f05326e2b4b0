"""GEMM backends and the chooser: `prepare(qweight)` then `gemm(x, prepared)`."""

from anybit.backends.base import Backend, Prepared, Problem
from anybit.backends.registry import choose, explain, gemm, get_backend, prepare

__all__ = ["Backend", "Prepared", "Problem", "choose", "explain", "gemm", "get_backend", "prepare"]
