"""`QuantLinear` and whole-model helpers: quantize a model's linear layers, save it (safetensors +
JSON, never pickle) and load it back into a skeleton of the same architecture.

    model = anybit.quantize_model(model, "w4a16", exclude=["lm_head"])
    anybit.save_quantized(model, "out/")
    model = anybit.load_quantized("out/", skeleton)
"""

from __future__ import annotations

import fnmatch
import json
import os

import torch
from torch import nn

from anybit.backends.registry import prepare
from anybit.errors import AnybitError, CheckpointError
from anybit.formats.scheme import Scheme
from anybit.ops import register
from anybit.quant.weights import QuantizedWeight, quantize

CONFIG_FILE = "anybit_config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT_VERSION = 1
_TENSORS = ("qweight", "scales", "zeros", "global_scale", "input_scale")


class QuantLinear(nn.Module):
    """y = x @ dequantize(W).T + bias on the backend the chooser picks for the weight's device.

    The quantized tensors are buffers (they move with `.to()`, live in `state_dict()`); the backend's
    prepared layout is built on first use per device and dropped when the buffers change."""

    def __init__(
        self,
        qweight: QuantizedWeight,
        bias: torch.Tensor | None = None,
        act_perm: torch.Tensor | None = None,
        backend: str = "auto",
    ):
        super().__init__()
        if len(qweight.shape) != 2:
            raise AnybitError(f"QuantLinear takes an (N, K) weight, got {qweight.shape}")
        self.scheme = qweight.scheme
        self.out_features, self.in_features = qweight.n, qweight.k
        self.backend = backend
        for name, t in qweight.tensors().items():
            self.register_buffer(name, t)
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=False) if bias is not None else None
        self.register_buffer("act_perm", act_perm.long() if act_perm is not None else None)
        self._prepared = None
        self._handle = register(self)  # for the anybit::linear op (torch.compile, CUDA graphs)

    # ---- construction ---------------------------------------------------------------------------
    @classmethod
    def from_float(cls, linear: nn.Linear, scheme: Scheme | str, backend: str = "auto") -> QuantLinear:
        qw = quantize(linear.weight.detach(), scheme)
        return cls(qw, linear.bias, backend=backend)

    @classmethod
    def from_quantized(
        cls, qweight: QuantizedWeight, bias: torch.Tensor | None = None, act_perm: torch.Tensor | None = None
    ) -> QuantLinear:
        return cls(qweight, bias, act_perm)

    def quantized(self) -> QuantizedWeight:
        """The layer's weight as a QuantizedWeight (views of its buffers)."""
        tensors = {n: getattr(self, n) for n in _TENSORS if getattr(self, n, None) is not None}
        return QuantizedWeight(self.scheme, (self.out_features, self.in_features), **tensors)

    # ---- compute --------------------------------------------------------------------------------
    def prepared(self):
        dev = self.scales.device
        if self._prepared is None or self._prepared.qweight.device != dev:
            self._prepared = prepare(self.quantized(), backend=self.backend)
        return self._prepared

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.act_perm is not None:
            x = x[..., self.act_perm]
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return torch.ops.anybit.linear(x, self._handle, self.out_features, bias)

    def _apply(self, fn, recurse=True):
        """Moves apply to every tensor; dtype casts (`model.bfloat16()`, `.to(torch.float16)`) only to the
        bias: the quantized tensors keep their storage dtypes (casting fp32 scales would change values)."""
        self._prepared = None  # a device move invalidates the prepared layout
        kept = {n: self._buffers[n] for n in _TENSORS if self._buffers.get(n) is not None}
        for n in kept:
            self._buffers[n] = None
        try:
            super()._apply(fn, recurse)
        finally:
            device = fn(torch.empty(0, device=next(iter(kept.values())).device)).device if kept else None
            for n, t in kept.items():
                self._buffers[n] = t.to(device)
        return self

    def _load_from_state_dict(self, *args, **kwargs):
        self._prepared = None
        return super()._load_from_state_dict(*args, **kwargs)

    def extra_repr(self) -> str:
        backend = self._prepared.backend if self._prepared is not None else self.backend
        shape = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{shape}, scheme={self.scheme}, backend={backend}"


# ---- whole models ---------------------------------------------------------------------------------
def _selected(name: str, include, exclude) -> bool:
    def hit(patterns):
        return any(fnmatch.fnmatch(name, p) or name.split(".")[-1] == p or name == p for p in patterns)

    return (not include or hit(include)) and not (exclude and hit(exclude))


def quantize_model(
    model: nn.Module,
    scheme: Scheme | str | dict,
    include=None,
    exclude=None,
    backend: str = "auto",
    progress: bool = True,
) -> nn.Module:
    """Replace every selected `nn.Linear` by a `QuantLinear`, in place; returns the model.
    `scheme` is one scheme, or {name pattern: scheme} (first match wins; fnmatch patterns or a
    module's last name, e.g. {"*.mlp.*": "w4a16", "*": "w8a16"}). include/exclude: name patterns."""
    rules = scheme if isinstance(scheme, dict) else {"*": scheme}
    rules = {p: Scheme.parse(s) for p, s in rules.items()}
    targets = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and _selected(name, include, exclude):
            match = next((s for p, s in rules.items() if _selected(name, [p], None)), None)
            if match is not None:
                targets.append((name, module, match))
    bar = _progress(progress, len(targets))
    for name, module, s in targets:
        _set_module(model, name, QuantLinear.from_float(module, s, backend))
        bar(name)
    return model


def _progress(enabled: bool, total: int):
    if not enabled or not total:
        return lambda name: None
    try:
        from rich.progress import Progress
    except ImportError:
        return lambda name: None
    bar = Progress(transient=True)
    task = bar.add_task("quantizing", total=total)
    bar.start()

    def step(name):
        bar.update(task, advance=1, description=name)
        if bar.finished:
            bar.stop()

    return step


def _set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    parent, _, leaf = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, leaf, new)


def save_quantized(model: nn.Module, out_dir: str) -> None:
    """model.safetensors (every tensor of the state dict; tied tensors stored once each name) and
    anybit_config.json (format version, each QuantLinear's scheme and shape)."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    layers = {
        name: {
            "scheme": m.scheme.to_dict(),
            "shape": [m.out_features, m.in_features],
            "bias": m.bias is not None,
            "act_perm": m.act_perm is not None,
        }
        for name, m in model.named_modules()
        if isinstance(m, QuantLinear)
    }
    seen, tensors = set(), {}
    for k, v in model.state_dict().items():
        v = v.detach().contiguous()
        if v.data_ptr() in seen and v.numel():
            v = v.clone()  # safetensors stores shared memory once; names stay distinct
        seen.add(v.data_ptr())
        tensors[k] = v.cpu()
    save_file(tensors, os.path.join(out_dir, WEIGHTS_FILE), metadata={"format": "pt", "anybit": str(FORMAT_VERSION)})
    with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
        json.dump({"anybit_format": FORMAT_VERSION, "layers": layers}, f, indent=1)


def load_quantized(in_dir: str, skeleton: nn.Module, strict: bool = True) -> nn.Module:
    """Load what `save_quantized` wrote into a model of the same architecture (its Linear layers
    become QuantLinears of the saved schemes); returns the skeleton."""
    from safetensors.torch import load_file

    path = os.path.join(in_dir, CONFIG_FILE)
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read the anybit config ({e})") from None
    if cfg.get("anybit_format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: anybit_format {cfg.get('anybit_format')!r}; this anybit reads {FORMAT_VERSION}")
    for name, spec in cfg["layers"].items():
        try:
            old = skeleton.get_submodule(name)
        except AttributeError:
            raise CheckpointError(f"{path}: layer {name!r} is not in the skeleton model") from None
        n, k = spec["shape"]
        if isinstance(old, nn.Linear) and (old.out_features, old.in_features) != (n, k):
            raise CheckpointError(
                f"{path}: layer {name!r} is {n}x{k} in the checkpoint, "
                f"{old.out_features}x{old.in_features} in the skeleton"
            )
        scheme = Scheme.from_dict(spec["scheme"])
        placeholder = QuantizedWeight.empty(scheme, (n, k))  # right shapes and dtypes; values come next
        bias = torch.zeros(n) if spec["bias"] else None
        perm = torch.arange(k) if spec["act_perm"] else None
        _set_module(skeleton, name, QuantLinear(placeholder, bias, perm))
    wpath = os.path.join(in_dir, WEIGHTS_FILE)
    try:
        state = load_file(wpath)
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise CheckpointError(f"{wpath}: not a readable safetensors file (truncated or corrupted?): {e}") from None
    skeleton.load_state_dict(state, strict=strict)
    return skeleton
