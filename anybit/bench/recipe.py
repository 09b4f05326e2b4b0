"""Bench recipes: YAML files naming shapes (or a model config to derive them from), schemes, batch
sizes, backends, peers and the timing rules. Unknown keys and bad values are errors that say what
would be valid, before any GPU time is spent."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from importlib import resources

from anybit.errors import AnybitError
from anybit.formats.scheme import Scheme

CPU_DEFAULTS = {"max_n": 256, "max_k": 512, "m": [1, 16], "repeats": 3, "calls": 2}
PEERS = ("torch-bf16", "torch-fp8", "torch-fp8-mm", "tinygemm", "humming")
TIMING = ("eager", "graph", "both")
_KEYS = {
    "name",
    "model",
    "shapes",
    "schemes",
    "m",
    "backends",
    "peers",
    "repeats",
    "warmup",
    "timing",
    "graph_max_m",
    "graph_calls",
    "seed",
    "budget_s",
    "out",
    "cpu",
}


@dataclass(frozen=True)
class Shape:
    name: str
    n: int
    k: int
    experts: int = 0  # > 0: an expert-stacked MoE weight (timed as one expert's dense GEMM for now)
    topk: int = 0

    @property
    def label(self) -> str:
        return f"{self.name} {self.n}x{self.k}" + (f" (E={self.experts}, top-{self.topk})" if self.experts else "")


@dataclass
class Recipe:
    name: str
    shapes: list[Shape]
    schemes: list[str]
    m: list[int]
    backends: list[str] = field(default_factory=lambda: ["auto"])
    peers: list[str] = field(default_factory=lambda: list(PEERS))
    repeats: int = 15
    warmup: int = 10
    timing: str = "both"
    graph_max_m: int = 64
    graph_calls: int = 20
    seed: int = 0
    budget_s: float = 540.0
    out: str = "bench-out"
    cpu: dict = field(default_factory=lambda: dict(CPU_DEFAULTS))
    source: str = "<dict>"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("source")
        return d

    @property
    def sha256(self) -> str:
        """Of the canonical JSON of what is measured (not of the file's spelling)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def _ints(value, what: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(v, int) and v > 0 for v in value):
        raise AnybitError(f"recipe {what} must be a non-empty list of positive integers, got {value!r}")
    return value


def parse_recipe(d: dict, source: str = "<dict>") -> Recipe:
    from anybit.bench.models import shapes_from_config

    if not isinstance(d, dict):
        raise AnybitError(f"{source}: a recipe is a mapping, got {type(d).__name__}")
    unknown = set(d) - _KEYS
    if unknown:
        raise AnybitError(f"{source}: unknown recipe keys {sorted(unknown)}; valid: {sorted(_KEYS)}")
    shapes = []
    if "model" in d:
        model = d["model"]
        if isinstance(model, str):
            path = model if model.endswith(".json") else os.path.join(model, "config.json")
            path = os.path.join(os.path.dirname(source), path) if not os.path.isabs(path) else path
            try:
                with open(path) as f:
                    model = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                raise AnybitError(f"{source}: cannot read model config {path}: {e}") from None
        shapes += shapes_from_config(model)
    for s in d.get("shapes") or []:
        try:
            shapes.append(Shape(**s))
        except TypeError as e:
            raise AnybitError(f"{source}: shape {s!r}: {e}; a shape is {{name, n, k[, experts, topk]}}") from None
    if not shapes:
        raise AnybitError(f"{source}: give `shapes` ([{{name, n, k}}, ...]) or `model` (config.json or mapping)")
    schemes = d.get("schemes")
    if not isinstance(schemes, list) or not schemes:
        raise AnybitError(f"{source}: `schemes` must list scheme strings, e.g. [w4a16, nvfp4]")
    for s in schemes:
        Scheme.parse(s)  # raises SchemeError naming what is wrong
    peers = d.get("peers", list(PEERS))
    bad = [p for p in peers if p not in PEERS]
    if bad:
        raise AnybitError(f"{source}: unknown peers {bad}; valid: {list(PEERS)}")
    timing = d.get("timing", "both")
    if timing not in TIMING:
        raise AnybitError(f"{source}: timing={timing!r}; valid: {list(TIMING)}")
    repeats = d.get("repeats", 15)
    if not isinstance(repeats, int) or repeats < 1 or repeats % 2 == 0:
        raise AnybitError(f"{source}: repeats={repeats!r} must be an odd positive integer (the median is a sample)")
    if "cpu" in d:
        if not isinstance(d["cpu"], dict) or set(d["cpu"]) - set(CPU_DEFAULTS):
            raise AnybitError(f"{source}: cpu={d['cpu']!r}; a mapping with keys from {sorted(CPU_DEFAULTS)}")
        d = {**d, "cpu": {**CPU_DEFAULTS, **d["cpu"]}}
    kw = {
        k: d[k]
        for k in ("name", "backends", "warmup", "graph_max_m", "graph_calls", "seed", "budget_s", "out", "cpu")
        if k in d
    }
    kw.setdefault("name", os.path.splitext(os.path.basename(source))[0])
    return Recipe(
        shapes=shapes,
        schemes=list(schemes),
        m=_ints(d.get("m"), "m"),
        peers=list(peers),
        timing=timing,
        repeats=repeats,
        source=source,
        **kw,
    )


def shipped_recipes() -> list[str]:
    """The names of the recipes that ship with anybit (`anybit/bench/recipes/`)."""
    folder = resources.files("anybit.bench").joinpath("recipes")
    return sorted(f.name.removesuffix(".yaml") for f in folder.iterdir() if f.name.endswith(".yaml"))


def load_recipe(path: str | None = None) -> Recipe:
    """A recipe file, or a shipped recipe by name (`fp8`, `dense_a16`: no such file here), or the shipped default
    (Llama-3-8B layer shapes) when path is None."""
    import yaml

    if path is None or (not os.path.exists(path) and os.sep not in path):
        name = "default" if path is None else path.removesuffix(".yaml")
        if name not in shipped_recipes():
            raise AnybitError(f"no recipe file {path!r}, and no shipped recipe of that name: {shipped_recipes()}")
        text = resources.files("anybit.bench").joinpath(f"recipes/{name}.yaml").read_text()
        source = f"{name}.yaml"
    else:
        try:
            with open(path) as f:
                text = f.read()
        except OSError as e:
            raise AnybitError(f"cannot read recipe {path}: {e}") from None
        source = path
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise AnybitError(f"{source}: not valid YAML: {e}") from None
    return parse_recipe(data, source)
