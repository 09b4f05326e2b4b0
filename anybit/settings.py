"""Every ANYBIT_* environment variable, typed and documented. Read here, nowhere else."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    backends: tuple[str, ...]
    """ANYBIT_BACKENDS: comma-separated backend order for "auto" (default: triton,humming,torch)."""
    disabled_backends: frozenset[str]
    """ANYBIT_DISABLED_BACKENDS: comma-separated backends "auto" never picks."""
    triton_interpret: bool
    """TRITON_INTERPRET=1 (Triton's own variable): run Triton kernels in the CPU interpreter."""
    cache_dir: str
    """ANYBIT_CACHE_DIR: where tuning results live (default: ~/.cache/anybit)."""
    autotune: bool
    """ANYBIT_AUTOTUNE=1: on a GPU, time tile candidates on the first call of a new problem (outside
    CUDA-graph capture) and keep the fastest in the tuning cache; default off: cached or default tiles."""
    multi_backend: bool
    """ANYBIT_MULTI_BACKEND=1: where the tuning cache measured another usable backend faster for a call's
    M bucket (e.g. humming at decode), "auto" holds the weight in that backend's layout too and sends
    those calls there. Costs the weight's memory once more per extra backend; default off."""
    frag_experimental: bool
    """ANYBIT_FRAG_EXPERIMENTAL=1, for what has not yet run on a GPU in its current form: W4A8 (int4 weights,
    e4m3 activations per token) takes the fragment-layout kernel too (its large M is unmeasured and its
    layout has no dequantize-then-cuBLAS path; zero-point term from the quantizer's block sums, nibbles by
    opaque shifts: sm_90a loop 409 -> 227 instructions at M=1, 858 -> 362 at M=64), and 4-bit integer
    words decode in one inline-PTX block each (`unpack_pairs_minus`; w4a16 loop 340 -> 325, w4a16-zp
    367 -> 353)."""
    frag_ptx: bool
    """ANYBIT_FRAG_PTX=0: the frag kernels decode in plain Triton instead of inline PTX (integer zero points
    by one packed subtraction, `minus_rows`; bytes by one PRMT each, `unpack_bytes`; e2m1 pairs times
    folded scales, `times_groups`; `frag_ptx`). Default on for
    sm_90+ (H200: w4a16-zp 8192² M=1 20.9 -> 16.4 µs, w8a16 23.9 -> 21.1, w2a16 22.3 -> 16.6); the off
    switch is for a toolchain whose ptxas rejects it, and for tests comparing the two forms."""


def _names(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def load() -> Settings:
    """Read the environment now (call sites read it per call, so tests can change it)."""
    return Settings(
        backends=_names(os.environ.get("ANYBIT_BACKENDS", "triton,humming,torch")),
        disabled_backends=frozenset(_names(os.environ.get("ANYBIT_DISABLED_BACKENDS", ""))),
        triton_interpret=os.environ.get("TRITON_INTERPRET", "0") == "1",
        cache_dir=os.environ.get("ANYBIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "anybit"),
        autotune=os.environ.get("ANYBIT_AUTOTUNE", "0") == "1",
        multi_backend=os.environ.get("ANYBIT_MULTI_BACKEND", "0") == "1",
        frag_experimental=os.environ.get("ANYBIT_FRAG_EXPERIMENTAL", "0") == "1",
        frag_ptx=os.environ.get("ANYBIT_FRAG_PTX", "1") != "0",
    )
