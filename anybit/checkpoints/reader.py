"""Lazy, tensor-by-tensor reading of a Hugging Face model directory's safetensors files (single file
or sharded with `model.safetensors.index.json`). Nothing is unpickled; every failure names the file
and tensor."""

from __future__ import annotations

import json
import os

import torch
from safetensors import SafetensorError, safe_open

from anybit.errors import CheckpointError


class Reader:
    def __init__(self, model_dir: str):
        self.dir = model_dir
        index = os.path.join(model_dir, "model.safetensors.index.json")
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
            except (OSError, json.JSONDecodeError, KeyError) as e:
                raise CheckpointError(f"{index}: not a safetensors index ({e})") from None
            self.where = {name: os.path.join(model_dir, file) for name, file in weight_map.items()}
        else:
            files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
            if not files:
                raise CheckpointError(f"{model_dir}: no *.safetensors files and no model.safetensors.index.json")
            self.where = {}
            for file in files:
                path = os.path.join(model_dir, file)
                for name in self._open(path).keys():
                    self.where[name] = path

    def _open(self, path: str):
        """The file's handle (headers read once; tensor data is read on demand)."""
        handles = self.__dict__.setdefault("_handles", {})
        if path not in handles:
            if not os.path.exists(path):
                raise CheckpointError(f"{path}: listed in the index but missing")
            try:
                handles[path] = safe_open(path, framework="pt")
            except (SafetensorError, OSError) as e:
                msg = f"{path}: not a readable safetensors file (truncated or corrupted?): {e}"
                raise CheckpointError(msg) from None
        return handles[path]

    def names(self) -> list[str]:
        return list(self.where)

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str, shape: tuple | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """One tensor, read now; `shape`/`dtype` (None entries in shape are free) are checked."""
        if name not in self.where:
            raise CheckpointError(f"tensor {name!r} is missing from the checkpoint in {self.dir}")
        path = self.where[name]
        try:
            t = self._open(path).get_tensor(name)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{path}: cannot read tensor {name!r} (truncated or corrupted?): {e}") from None
        if dtype is not None and t.dtype != dtype:
            raise CheckpointError(f"{path}: tensor {name!r} is {t.dtype}, expected {dtype}")
        if shape is not None and (
            len(shape) != t.dim() or any(s is not None and s != d for s, d in zip(shape, t.shape, strict=True))
        ):
            want = "×".join("*" if s is None else str(s) for s in shape)
            raise CheckpointError(f"{path}: tensor {name!r} has shape {tuple(t.shape)}, expected {want}")
        return t
