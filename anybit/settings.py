"""Every ANYBIT_* environment variable, typed and documented. Read here, nowhere else."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    backends: tuple[str, ...]
    """ANYBIT_BACKENDS: comma-separated backend order for "auto" (default: triton,torch)."""
    disabled_backends: frozenset[str]
    """ANYBIT_DISABLED_BACKENDS: comma-separated backends "auto" never picks."""
    triton_interpret: bool
    """TRITON_INTERPRET=1 (Triton's own variable): run Triton kernels in the CPU interpreter."""


def _names(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def load() -> Settings:
    """Read the environment now (call sites read it per call, so tests can change it)."""
    return Settings(
        backends=_names(os.environ.get("ANYBIT_BACKENDS", "triton,torch")),
        disabled_backends=frozenset(_names(os.environ.get("ANYBIT_DISABLED_BACKENDS", ""))),
        triton_interpret=os.environ.get("TRITON_INTERPRET", "0") == "1",
    )
