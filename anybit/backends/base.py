"""The backend protocol: what every GEMM backend offers the chooser."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from anybit.quant.weights import QuantizedWeight


@dataclass(frozen=True)
class Problem:
    """What the chooser decides on: the weight's scheme and shape, the batch rows and the device."""

    scheme: Any
    n: int
    k: int
    m: int | None
    device: torch.device
    act_dtype: torch.dtype | None = None


@dataclass
class Prepared:
    """A weight in one backend's layout; `gemm` of that backend consumes it."""

    backend: str
    qweight: QuantizedWeight
    data: Any
    auto: bool = False
    """Chosen by "auto": the chooser may send a call elsewhere (measured faster, or a kernel failure)."""
    others: dict[str, Prepared] = field(default_factory=dict)
    """The same weight in other backends' layouts (fallbacks, measured-faster alternatives)."""
    routes: dict[int, str] = field(default_factory=dict)
    """M bucket -> the backend "auto" sends those calls to (set at the bucket's first call, or on a
    kernel failure)."""


class Backend(Protocol):
    name: str

    def supports(self, problem: Problem) -> tuple[bool, str]: ...

    def prepare(self, qweight: QuantizedWeight) -> Prepared: ...

    def gemm(self, x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None = None) -> torch.Tensor: ...
