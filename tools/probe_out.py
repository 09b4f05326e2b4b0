"""What the probe scripts share: their rows, and what failed, as DIR/NAME.json with where they ran; the
"key=value:key=value" tile overrides their command lines take."""

from __future__ import annotations

import json
import os

import torch

from anybit.bench.provenance import provenance


def write_probe(out_dir: str, name: str, rows: list, errors: dict | None = None) -> str:
    """Print what failed, then write {env, rows, errors} to out_dir/name.json; returns the path."""
    for what, ex in (errors or {}).items():
        print(f"{what}: {ex}")
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    env = provenance(torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    with open(path, "w") as f:
        json.dump(dict(env=env, rows=rows, errors=errors or {}), f, indent=1)
    return path


def tile_overrides(text: str) -> dict:
    """ "block_m=128:stages=6" -> {"block_m": 128, "stages": 6} (empty text: {})."""
    return {a: int(b) for a, b in (kv.split("=") for kv in filter(None, text.split(":")))}
