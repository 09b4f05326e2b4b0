"""`Scheme`: the complete description of one quantization, with its string and dict forms.

String form — colon-separated tokens, canonical order::

    w{weight bits}a{16|8} : weight dtype : granularity : scale dtype [: zp-int|zp-float] [: gs] [: act]

    w4a16:int4:g128:bf16               int4, one bf16 scale per 128 weights along K
    w4a16:uint4:g128:fp16:zp-int       GPTQ/AWQ-style asymmetric: (q - z) * s, z an integer code
    w4a16:e2m1:g16:e4m3:gs             NVFP4: e4m3 scale per 16, times one fp32 scale per tensor
    w8a8:e4m3:b128x128:fp32:e4m3-g128  DeepSeek-V3 FP8 block weights, FP8 activations per 128

granularity: ``ch`` (one scale per output row), ``g{k}`` (per row, per k along K), ``b{n}x{k}``
(2-D blocks), ``tensor``. act: ``{e4m3|e5m2|int8}-{token|g{k}|static}`` (dynamic per token, dynamic
per group of k along K, static per tensor); absent means the activations stay bf16/fp16.
`Scheme.parse` also takes a preset name (`PRESETS`), and a prefix that names a preset fills the
fields the text leaves out: ``w4a16:g64`` is the w4a16 preset with groups of 64 (naming a weight
dtype drops the preset's zero point unless a ``zp-`` token is given too).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from enum import Enum

from anybit.errors import SchemeError
from anybit.formats.dtypes import DType, FloatType, IntType, TorchFloatType, parse_dtype

SCHEME_VERSION = 1

SCALE_DTYPES = ("fp32", "bf16", "fp16", "e4m3", "e5m2", "ue8m0")
ACT_DTYPES = ("e4m3", "e5m2", "int8")
_MAX_GROUP = 8192


class ScaleKind(str, Enum):
    CHANNEL = "channel"
    GROUP = "group"
    BLOCK = "block"
    TENSOR = "tensor"


class ZeroPoint(str, Enum):
    """NONE: value = q*s.  INT: (q - z)*s with z an integer code.  FLOAT: (q - z)*s with z a float."""

    NONE = "none"
    INT = "int"
    FLOAT = "float"


class ActMode(str, Enum):
    NONE = "none"  # activations stay in the input dtype (bf16 / fp16)
    TOKEN = "token"  # dynamic, one scale per row of x
    GROUP = "group"  # dynamic, one scale per row and per `group` columns of x
    STATIC = "static"  # one scale per tensor, given ahead of time (calibrated)


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


@dataclass(frozen=True)
class Granularity:
    """Which weights share a scale: a block of `n` rows × `k` columns (0 = the whole extent)."""

    kind: ScaleKind
    n: int = 0
    k: int = 0

    def __post_init__(self):
        object.__setattr__(self, "kind", ScaleKind(self.kind))
        sizes = {ScaleKind.GROUP: (self.k,), ScaleKind.BLOCK: (self.n, self.k)}.get(self.kind, ())
        for v in sizes:
            if not (_is_pow2(v) and 8 <= v <= _MAX_GROUP):
                raise SchemeError(
                    f"granularity {self.token()!r}: size {v} is not allowed; "
                    f"group and block sizes are powers of two from 8 to {_MAX_GROUP}"
                )

    def block_shape(self, n_rows: int, k_cols: int) -> tuple[int, int]:
        """(rows, cols) of weights sharing one scale, for an (n_rows, k_cols) matrix."""
        return {
            ScaleKind.CHANNEL: (1, k_cols),
            ScaleKind.GROUP: (1, self.k),
            ScaleKind.BLOCK: (self.n, self.k),
            ScaleKind.TENSOR: (n_rows, k_cols),
        }[self.kind]

    def token(self) -> str:
        return {
            ScaleKind.CHANNEL: "ch",
            ScaleKind.GROUP: f"g{self.k}",
            ScaleKind.BLOCK: f"b{self.n}x{self.k}",
            ScaleKind.TENSOR: "tensor",
        }[self.kind]

    @staticmethod
    def parse(token: str) -> Granularity | None:
        if token in ("ch", "channel"):
            return Granularity(ScaleKind.CHANNEL)
        if token == "tensor":
            return Granularity(ScaleKind.TENSOR)
        if m := re.fullmatch(r"g(\d+)", token):
            return Granularity(ScaleKind.GROUP, k=int(m[1]))
        if m := re.fullmatch(r"b(\d+)x(\d+)", token):
            return Granularity(ScaleKind.BLOCK, n=int(m[1]), k=int(m[2]))
        return None


@dataclass(frozen=True)
class ActSpec:
    """How activations are quantized before the GEMM; `ActSpec()` leaves them in bf16/fp16."""

    dtype: IntType | FloatType | None = None
    mode: ActMode = ActMode.NONE
    group: int = 0

    def __post_init__(self):
        object.__setattr__(self, "mode", ActMode(self.mode))
        if (self.dtype is None) != (self.mode is ActMode.NONE):
            raise SchemeError("an activation spec needs both a dtype and a mode, or neither")
        if self.dtype is not None and self.dtype.name not in ACT_DTYPES:
            raise SchemeError(f"activation dtype {self.dtype.name!r} is not supported; allowed: {ACT_DTYPES}")
        if self.mode is ActMode.GROUP and not (_is_pow2(self.group) and 8 <= self.group <= _MAX_GROUP):
            raise SchemeError(f"activation group {self.group} must be a power of two from 8 to {_MAX_GROUP}")
        if self.mode is not ActMode.GROUP and self.group:
            raise SchemeError(f"activation group={self.group} given, but mode is {self.mode.value!r}")
        if isinstance(self.dtype, IntType) and self.mode is not ActMode.TOKEN:
            raise SchemeError("int8 activations are quantized per token only ('int8-token')")

    @property
    def quantized(self) -> bool:
        return self.dtype is not None

    def token(self) -> str:
        if self.dtype is None:
            return "none"
        mode = f"g{self.group}" if self.mode is ActMode.GROUP else self.mode.value
        return f"{self.dtype.name}-{mode}"

    @staticmethod
    def parse(token: str) -> ActSpec | None:
        if token == "none":
            return ActSpec()
        m = re.fullmatch(r"(e4m3|e5m2|fp8|int8)-(token|static|g(\d+))", token)
        if not m:
            return None
        dtype = parse_dtype(m[1])
        if m[3]:
            return ActSpec(dtype, ActMode.GROUP, int(m[3]))
        return ActSpec(dtype, ActMode(m[2]))


@dataclass(frozen=True)
class Scheme:
    """Weight dtype, scale layout and dtype, zero point, second-level scale, activation spec."""

    weight: IntType | FloatType
    granularity: Granularity
    scale_dtype: DType
    zero_point: ZeroPoint = ZeroPoint.NONE
    global_scale: bool = False
    act: ActSpec = field(default_factory=ActSpec)

    def __post_init__(self):
        object.__setattr__(self, "zero_point", ZeroPoint(self.zero_point))
        w, s = self.weight, self.scale_dtype
        if not isinstance(w, (IntType, FloatType)):
            raise SchemeError(f"weight dtype {w} is not allowed; weights are int/uint 1..8 bits or floats <= 8 bits")
        if s.name not in SCALE_DTYPES:
            raise SchemeError(f"scale dtype {s.name!r} is not allowed; allowed: {SCALE_DTYPES}")
        if self.zero_point is not ZeroPoint.NONE and not (isinstance(w, IntType) and not w.signed):
            raise SchemeError(
                f"zero_point={self.zero_point.value!r} needs an unsigned integer weight (uint1..uint8), got {w}"
            )
        if self.zero_point is ZeroPoint.FLOAT and isinstance(s, FloatType):
            raise SchemeError("a float zero point is stored in the scale dtype; use fp16, bf16 or fp32 scales")
        if self.global_scale and s.name not in ("e4m3", "e5m2"):
            raise SchemeError(f"a second-level (global) scale needs 8-bit float scales (e4m3/e5m2), got {s}")

    # ---- derived facts -------------------------------------------------------------------------
    @property
    def weight_bits(self) -> int:
        return self.weight.bits

    @property
    def act_bits(self) -> int:
        return self.act.dtype.bits if self.act.dtype is not None else 16

    def effective_bits(self, k: int = 4096, n: int = 4096) -> float:
        """Bits per weight including scales and zero points, for an (n, k) matrix."""
        bn, bk = self.granularity.block_shape(n, k)
        per_block = self.scale_dtype.bits
        if self.zero_point is ZeroPoint.INT:
            per_block += 8
        elif self.zero_point is ZeroPoint.FLOAT:
            per_block += self.scale_dtype.bits
        extra = 32 / (n * k) if self.global_scale else 0.0
        return self.weight.bits + per_block / (bn * bk) + extra

    # ---- string and dict forms -----------------------------------------------------------------
    def __str__(self) -> str:
        parts = [
            f"w{self.weight_bits}a{self.act_bits}",
            self.weight.name,
            self.granularity.token(),
            self.scale_dtype.name,
        ]
        if self.zero_point is not ZeroPoint.NONE:
            parts.append(f"zp-{self.zero_point.value}")
        if self.global_scale:
            parts.append("gs")
        if self.act.quantized:
            parts.append(self.act.token())
        return ":".join(parts)

    @staticmethod
    def parse(text: str | Scheme) -> Scheme:
        """A preset name or a scheme string (module docstring) -> Scheme."""
        if isinstance(text, Scheme):
            return text
        text = text.strip().lower()
        if text in PRESETS:
            return _parse_tokens(PRESETS[text].split(":"), text)
        return _parse_tokens(text.split(":"), text)

    def to_dict(self) -> dict:
        return {
            "version": SCHEME_VERSION,
            "weight": self.weight.name,
            "granularity": self.granularity.token(),
            "scale_dtype": self.scale_dtype.name,
            "zero_point": self.zero_point.value,
            "global_scale": self.global_scale,
            "act": self.act.token(),
        }

    @staticmethod
    def from_dict(d: dict) -> Scheme:
        if d.get("version") != SCHEME_VERSION:
            raise SchemeError(f"scheme dict version {d.get('version')!r} is not supported; expected {SCHEME_VERSION}")
        expected = {"version", "weight", "granularity", "scale_dtype", "zero_point", "global_scale", "act"}
        if set(d) != expected:
            raise SchemeError(f"scheme dict keys {sorted(d)} differ from the expected {sorted(expected)}")
        gran, act = Granularity.parse(d["granularity"]), ActSpec.parse(d["act"])
        if gran is None or act is None:
            raise SchemeError(f"scheme dict has an invalid granularity {d['granularity']!r} or act {d['act']!r}")
        return Scheme(
            weight=parse_dtype(d["weight"]),
            granularity=gran,
            scale_dtype=parse_dtype(d["scale_dtype"]),
            zero_point=ZeroPoint(d["zero_point"]),
            global_scale=bool(d["global_scale"]),
            act=act,
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Scheme:
        return Scheme.from_dict(json.loads(text))


PRESETS: dict[str, str] = {
    "w2a16": "w2a16:uint2:g64:fp16:zp-int",
    "w3a16": "w3a16:uint3:g128:fp16:zp-int",
    "w4a16": "w4a16:int4:g128:bf16",
    "w4a16-zp": "w4a16:uint4:g128:fp16:zp-int",
    "w8a16": "w8a16:int8:ch:bf16",
    "w4a8": "w4a8:int4:g128:fp32:e4m3-token",
    "w4a8-mxfp4": "w4a8:e2m1:g32:ue8m0:e4m3-token",
    "w4a8-nvfp4": "w4a8:e2m1:g16:e4m3:gs:e4m3-token",
    "w8a8-fp8": "w8a8:e4m3:ch:fp32:e4m3-token",
    "w8a8-int8": "w8a8:int8:ch:fp32:int8-token",
    "fp8-block": "w8a8:e4m3:b128x128:fp32:e4m3-g128",
    "nvfp4": "w4a16:e2m1:g16:e4m3:gs",
    "mxfp4": "w4a16:e2m1:g32:ue8m0",
    "mxfp6": "w6a16:e2m3:g32:ue8m0",
    "mxfp6-e3m2": "w6a16:e3m2:g32:ue8m0",
    "mxfp8": "w8a16:e4m3:g32:ue8m0",
}


def _parse_tokens(tokens: list[str], text: str) -> Scheme:
    m = re.fullmatch(r"w(\d+)a(\d+)", tokens[0])
    if not m:
        raise SchemeError(
            f"scheme {text!r} must start with w<bits>a<bits> (e.g. 'w4a16:int4:g128:bf16') "
            f"or be a preset: {', '.join(PRESETS)}"
        )
    wbits, abits = int(m[1]), int(m[2])
    prefix_preset = PRESETS.get(tokens[0])
    if prefix_preset is not None and prefix_preset.split(":") != tokens:
        fields = _fields(Scheme.parse(tokens[0]))
    else:
        fields = _default_fields(wbits, abits)
    dtypes_seen = 0
    for tok in tokens[1:]:
        if (gran := Granularity.parse(tok)) is not None:
            fields["granularity"] = gran
        elif (act := ActSpec.parse(tok)) is not None:
            fields["act"] = act
        elif tok in ("zp-int", "zp-float", "zp-none"):
            fields["zero_point"] = ZeroPoint(tok[3:])
        elif tok == "gs":
            fields["global_scale"] = True
        else:
            try:
                dtype = parse_dtype(tok)
            except Exception:
                raise SchemeError(
                    f"scheme {text!r}: token {tok!r} is not a dtype, granularity (ch, g128, b128x128, tensor), "
                    f"scale dtype ({', '.join(SCALE_DTYPES)}), zp-int/zp-float, gs or activation spec "
                    f"(e4m3-token, e4m3-g128, e4m3-static, int8-token)"
                ) from None
            if dtypes_seen == 2:
                raise SchemeError(f"scheme {text!r}: more than two dtypes (weight, then scale) given")
            fields["weight" if dtypes_seen == 0 else "scale_dtype"] = dtype
            dtypes_seen += 1
    if dtypes_seen and not any(t.startswith("zp-") for t in tokens):
        fields["zero_point"] = ZeroPoint.NONE  # a zero point belongs to the weight dtype it came with
    scheme = Scheme(**fields)
    if (scheme.weight_bits, scheme.act_bits) != (wbits, abits):
        raise SchemeError(
            f"scheme {text!r}: prefix w{wbits}a{abits} disagrees with the fields "
            f"(weight {scheme.weight} is {scheme.weight_bits} bits, activations {scheme.act_bits} bits)"
        )
    return scheme


def _fields(s: Scheme) -> dict:
    return {f: getattr(s, f) for f in ("weight", "granularity", "scale_dtype", "zero_point", "global_scale", "act")}


def _default_fields(wbits: int, abits: int) -> dict:
    if abits not in (8, 16):
        raise SchemeError(f"activation bits a{abits} are not supported; allowed: a16 (bf16/fp16), a8 (fp8/int8)")
    if not 1 <= wbits <= 8:
        raise SchemeError(f"weight bits w{wbits} are not supported; allowed: w1..w8")
    return {
        "weight": IntType(wbits, signed=wbits > 1),
        "granularity": Granularity(ScaleKind.CHANNEL) if wbits == 8 else Granularity(ScaleKind.GROUP, k=128),
        "scale_dtype": TorchFloatType("bf16"),
        "zero_point": ZeroPoint.NONE,
        "global_scale": False,
        "act": ActSpec(parse_dtype("e4m3"), ActMode.TOKEN) if abits == 8 else ActSpec(),
    }
