"""Number formats of quantized weights, activations and scales.

Three families, each a frozen dataclass with a short name that round-trips through `parse_dtype`:

* `IntType(bits, signed)` — ``int1`` … ``int8`` (two's complement) and ``uint1`` … ``uint8``.
  A code is the value's low `bits` bits.
* `FloatType(exp, man, signed, special)` — any small float of at most 8 bits: ``e2m1``, ``e2m3``,
  ``e3m2``, ``e4m3`` (fn: no inf, NaN only at S.1111.111), ``e5m2`` (IEEE inf/NaN), ``ue8m0``
  (MX scales: unsigned, 2**(code-127), 0xFF is NaN, no zero) …  A code is
  ``[sign][exponent][mantissa]`` from the most significant of its `bits` bits down; exponent field 0
  is subnormal (``man/2**m * 2**(1-bias)``), bias ``2**(exp-1) - 1``.
* `TorchFloatType` — the 16/32-bit scale types ``fp16``, ``bf16``, ``fp32`` (stored as torch tensors).

Every ≤8-bit type has its exact value table (`values()`, float64, indexed by code), `encode`
(round to nearest, ties to the even code, saturating to the largest finite value) and `decode`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import Enum

import torch

from anybit.errors import FormatError


class FloatSpecial(str, Enum):
    """How a small float spends its top exponent codes."""

    NONE = "none"  # every code is finite (OCP MX e2m1/e2m3/e3m2, unsigned ue5m3 …)
    FN = "fn"  # finite + one NaN per sign at all-ones (e4m3fn)
    IEEE = "ieee"  # top exponent holds inf (mantissa 0) and NaN (e5m2)
    E8M0 = "e8m0"  # no zero, no subnormal: 2**(code - bias), all-ones is NaN (ue8m0)


class _SmallType:
    """Shared machinery of the ≤8-bit types: value table, decode and nearest-value encode."""

    bits: int

    @property
    def num_codes(self) -> int:
        return 1 << self.bits

    def values(self) -> torch.Tensor:
        """float64 tensor [2**bits]: the value of every code (NaN / ±inf where the format has them)."""
        return _value_table(self).clone()

    @functools.cached_property
    def max(self) -> float:
        """Largest finite value."""
        v = _value_table(self)
        return float(v[torch.isfinite(v)].max())

    @functools.cached_property
    def min(self) -> float:
        """Smallest (most negative) finite value."""
        v = _value_table(self)
        return float(v[torch.isfinite(v)].min())

    @functools.cached_property
    def smallest_positive(self) -> float:
        v = _value_table(self)
        return float(v[torch.isfinite(v) & (v > 0)].min())

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes: integer tensor (any shape, values < 2**bits) -> float32 values, same shape."""
        table = _value_table(self).to(device=codes.device, dtype=torch.float32)
        return table[codes.long()]

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x: float tensor -> uint8 codes of the nearest value (ties to the even code), saturating."""
        if x.is_floating_point() and bool(torch.isnan(x).any()):
            nan = self._nan_code()
            if nan is None:
                raise FormatError(f"{self.name} has no NaN, and the input holds NaN")
            out = self._encode_finite(torch.nan_to_num(x, nan=0.0))
            return torch.where(torch.isnan(x), torch.full_like(out, nan), out)
        return self._encode_finite(x)

    def _nan_code(self) -> int | None:
        nans = torch.nonzero(torch.isnan(_value_table(self))).flatten()
        return int(nans[0]) if len(nans) else None

    def _encode_finite(self, x: torch.Tensor) -> torch.Tensor:
        mags, codes = _magnitudes(self)
        mags, codes = mags.to(x.device), codes.to(x.device)
        x64 = x.double()
        # unsigned formats saturate negative inputs at their smallest value
        a = (x64.abs() if self._sign_bit() else x64.clamp(min=0)).clamp(max=float(mags[-1]))
        hi = torch.searchsorted(mags, a).clamp(max=len(mags) - 1)
        lo = (hi - 1).clamp(min=0)
        d_lo, d_hi = a - mags[lo], mags[hi] - a
        tie_up = self._ties_up() | (codes[hi] % 2 == 0)
        pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & tie_up)
        code = torch.where(pick_hi, codes[hi], codes[lo])
        if self._sign_bit():
            code = code | (torch.signbit(x64).long() << (self.bits - 1))
        return code.to(torch.uint8)

    def _sign_bit(self) -> bool:
        return False

    def _ties_up(self) -> bool:
        return False


@dataclass(frozen=True)
class IntType(_SmallType):
    """Integer of `bits` bits; signed is two's complement (int4: -8..7), unsigned 0..2**bits-1."""

    bits: int
    signed: bool = True

    def __post_init__(self):
        if not 1 <= self.bits <= 8:
            raise FormatError(f"integer bits={self.bits} is out of range; allowed: 1..8")
        if self.signed and self.bits < 2:
            raise FormatError("int1 has no signed form; use uint1")

    @property
    def name(self) -> str:
        return f"{'' if self.signed else 'u'}int{self.bits}"

    @property
    def is_float(self) -> bool:
        return False

    def _encode_finite(self, x: torch.Tensor) -> torch.Tensor:
        # torch.round is round-half-to-even, the same rule as the float types' ties-to-even code
        q = torch.round(x.double()).clamp(self.min, self.max).long()
        return (q & (self.num_codes - 1)).to(torch.uint8)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class FloatType(_SmallType):
    """Small float with `exp` exponent and `man` mantissa bits (sign bit unless signed=False)."""

    exp: int
    man: int
    signed: bool = True
    special: FloatSpecial = FloatSpecial.NONE

    def __post_init__(self):
        object.__setattr__(self, "special", FloatSpecial(self.special))
        if self.exp < 1 or self.man < 0 or self.bits > 8:
            raise FormatError(
                f"float e{self.exp}m{self.man} ({'signed' if self.signed else 'unsigned'}) needs "
                f"{self.bits} bits; allowed: exp >= 1, man >= 0, sign+exp+man <= 8"
            )
        if self.special is FloatSpecial.E8M0 and (self.man or self.signed):
            raise FormatError("the e8m0 convention is for unsigned, mantissa-free types (ue8m0)")

    @property
    def bits(self) -> int:
        return int(self.signed) + self.exp + self.man

    @property
    def bias(self) -> int:
        return (1 << (self.exp - 1)) - 1

    @property
    def is_float(self) -> bool:
        return True

    @property
    def name(self) -> str:
        base = f"{'' if self.signed else 'u'}e{self.exp}m{self.man}"
        if self.special is _default_special(self.exp, self.man, self.signed):
            return base
        return base + self.special.value

    @property
    def emax(self) -> int:
        """Exponent of the largest finite value (OCP MX calls it emax_elem)."""
        return int(torch.floor(torch.log2(torch.tensor(self.max))).item())

    def _sign_bit(self) -> bool:
        return self.signed

    def _ties_up(self) -> bool:
        # torch.float8_e8m0fnu rounds half up: there is no mantissa bit to be even.
        return self.special is FloatSpecial.E8M0

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class TorchFloatType:
    """A 16/32-bit float stored as the torch dtype itself (scales): fp16, bf16, fp32."""

    name: str

    def __post_init__(self):
        if self.name not in _TORCH_FLOATS:
            raise FormatError(f"unknown torch float {self.name!r}; allowed: {sorted(_TORCH_FLOATS)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _TORCH_FLOATS[self.name]

    @property
    def bits(self) -> int:
        return torch.finfo(self.torch_dtype).bits

    @property
    def is_float(self) -> bool:
        return True

    @functools.cached_property
    def max(self) -> float:
        return float(torch.finfo(self.torch_dtype).max)

    @functools.cached_property
    def smallest_positive(self) -> float:
        return float(torch.finfo(self.torch_dtype).smallest_normal)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.torch_dtype)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()

    def __str__(self) -> str:
        return self.name


_TORCH_FLOATS = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

DType = IntType | FloatType | TorchFloatType


def _default_special(exp: int, man: int, signed: bool) -> FloatSpecial:
    if signed and exp + man == 7:
        return FloatSpecial.IEEE if exp == 5 else FloatSpecial.FN
    if not signed and man == 0 and exp == 8:
        return FloatSpecial.E8M0
    return FloatSpecial.NONE


@functools.cache
def _value_table(t: _SmallType) -> torch.Tensor:
    codes = torch.arange(t.num_codes, dtype=torch.int64)
    if isinstance(t, IntType):
        if t.signed:
            codes = torch.where(codes >= t.num_codes // 2, codes - t.num_codes, codes)
        return codes.double()
    e_field = (codes >> t.man) & ((1 << t.exp) - 1)
    m_field = codes & ((1 << t.man) - 1)
    frac = m_field.double() / (1 << t.man)
    if t.special is FloatSpecial.E8M0:
        mag = torch.pow(2.0, (e_field - t.bias).double())
    else:
        normal = (1.0 + frac) * torch.pow(2.0, (e_field - t.bias).double())
        subnormal = frac * 2.0 ** (1 - t.bias)
        mag = torch.where(e_field == 0, subnormal, normal)
    e_top = e_field == (1 << t.exp) - 1
    if t.special is FloatSpecial.IEEE:
        mag = torch.where(e_top & (m_field == 0), torch.inf, mag)
        mag = torch.where(e_top & (m_field != 0), torch.nan, mag)
    elif t.special in (FloatSpecial.FN, FloatSpecial.E8M0):
        mag = torch.where(e_top & (m_field == (1 << t.man) - 1), torch.nan, mag)
    if t.signed:
        negative = ((codes >> (t.bits - 1)) & 1).bool()
        mag = torch.where(negative, -mag, mag)
    return mag


@functools.cache
def _magnitudes(t: _SmallType) -> tuple[torch.Tensor, torch.Tensor]:
    """Finite non-negative values (ascending) and their codes, the sign bit clear."""
    v = _value_table(t)
    codes = torch.arange(t.num_codes)
    if t._sign_bit():
        half = t.num_codes // 2
        v, codes = v[:half], codes[:half]
    keep = torch.isfinite(v)
    v, codes = v[keep], codes[keep]
    order = torch.argsort(v, stable=True)
    return v[order].contiguous(), codes[order].contiguous()


_NAME = re.compile(r"^(?P<u>u?)(?:int(?P<ib>\d+)|e(?P<e>\d+)m(?P<m>\d+)(?P<sp>fn|ieee|none)?)$")
_ALIASES = {"fp4": "e2m1", "fp8": "e4m3", "float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def parse_dtype(name: str | DType) -> DType:
    """``"int4"`` / ``"uint3"`` / ``"e2m1"`` / ``"e4m3"`` / ``"ue8m0"`` / ``"bf16"`` … -> dtype object."""
    if isinstance(name, (IntType, FloatType, TorchFloatType)):
        return name
    text = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if text in _TORCH_FLOATS:
        return TorchFloatType(text)
    m = _NAME.match(text)
    if not m:
        raise FormatError(
            f"unknown number format {name!r}; allowed: int1..int8, uint1..uint8, eXmY / ueXmY "
            f"floats of at most 8 bits (e2m1, e4m3, e5m2, ue8m0 …), fp16, bf16, fp32"
        )
    signed = not m["u"]
    if m["ib"]:
        return IntType(int(m["ib"]), signed)
    exp, man = int(m["e"]), int(m["m"])
    special = FloatSpecial(m["sp"]) if m["sp"] else _default_special(exp, man, signed)
    return FloatType(exp, man, signed, special)


def torch_float8(t: FloatType) -> torch.dtype | None:
    """The torch dtype with the same bits as `t`, where torch has one (for FP8 tensor-core paths)."""
    return {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}.get(t.name)


def exactly_representable(src: IntType | FloatType, dst: IntType | FloatType) -> bool:
    """True when every finite value of `src` is a value of `dst` (e.g. int4 in e4m3: yes)."""
    v = _value_table(src)
    v = v[torch.isfinite(v)]
    return bool((dst.decode(dst.encode(v)).double() == v).all())


WEIGHT_DTYPE_NAMES = (
    [f"int{b}" for b in range(2, 9)]
    + [f"uint{b}" for b in range(1, 9)]
    + ["e2m1", "e2m2", "e2m3", "e3m2", "e3m3", "e3m4", "e4m2", "e4m3", "e5m2", "ue4m4", "ue5m3"]
)
