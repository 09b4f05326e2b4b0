"""`anybit formats`: every weight dtype and preset with its size, range, step and activation pairing."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from anybit.formats.dtypes import WEIGHT_DTYPE_NAMES, exactly_representable, parse_dtype
from anybit.formats.scheme import PRESETS, Scheme

_FP8 = ("e4m3", "e5m2")


def dtype_rows(group_size: int) -> list[dict]:
    """One row per weight dtype; effective bits assume one bf16 scale per `group_size` weights."""
    rows = []
    for name in WEIGHT_DTYPE_NAMES:
        t = parse_dtype(name)
        exact = [f for f in _FP8 if exactly_representable(t, parse_dtype(f))]
        rows.append(
            {
                "dtype": name,
                "bits": t.bits,
                "bytes_per_weight": (t.bits + 16 / group_size) / 8,
                "min": t.min,
                "max": t.max,
                "step": t.smallest_positive,
                "activations": " · ".join(["bf16/fp16"] + [f"{f} exact" for f in exact]),
            }
        )
    return rows


def preset_rows(k: int) -> list[dict]:
    rows = []
    for name in PRESETS:
        s = Scheme.parse(name)
        rows.append(
            {
                "preset": name,
                "scheme": str(s),
                "bits_per_weight": s.effective_bits(k=k),
                "bytes_per_weight": s.effective_bits(k=k) / 8,
                "activations": s.act.token() if s.act.quantized else "bf16/fp16",
            }
        )
    return rows


def print_formats(group_size: int = 128, k: int = 4096, console: Console | None = None) -> None:
    console = console or Console()
    t = Table(title=f"weight dtypes (bytes/weight with one bf16 scale per {group_size})")
    for col in ("dtype", "bits", "bytes/w", "range", "finest step", "activations it pairs with"):
        t.add_column(col)
    for r in dtype_rows(group_size):
        t.add_row(
            r["dtype"],
            str(r["bits"]),
            f"{r['bytes_per_weight']:.4f}",
            f"[{r['min']:g}, {r['max']:g}]",
            f"{r['step']:g}",
            r["activations"],
        )
    console.print(t)
    p = Table(title=f"presets (effective size for K={k})")
    for col in ("preset", "scheme", "bits/w", "bytes/w", "activations"):
        p.add_column(col)
    for r in preset_rows(k):
        p.add_row(
            r["preset"], r["scheme"], f"{r['bits_per_weight']:.3f}", f"{r['bytes_per_weight']:.4f}", r["activations"]
        )
    console.print(p)
