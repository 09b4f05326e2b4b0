"""`QuantizedWeight` — the hub type every loader produces and every backend consumes — and the
reference weight quantizer `quantize`.

Tensors of a QuantizedWeight of logical shape ``(*lead, N, K)`` (lead = () for a dense layer,
(E,) for an expert stack), with a scheme whose scale block is ``(bn, bk)`` rows × columns:

* ``qweight``  int32 ``[*lead, N, ceil(K*bits/32)]`` — codes bit-packed along K (`packing`).
* ``scales``   ``[*lead, ceil(N/bn), K/bk]`` — uint8 codes for 8-bit float scale dtypes (e4m3,
  e5m2, ue8m0), else a torch fp16/bf16/fp32 tensor.
* ``zeros``    same shape as scales, or None: uint8 codes (zp-int) or scale-dtype floats (zp-float).
* ``global_scale`` fp32 ``[*lead]`` or None (NVFP4's second-level scale).
* ``input_scale`` fp32 ``[*lead]`` or None: the calibrated activation scale of schemes with static
  activations (``e4m3-static``); optional when the weight is made, required when it is computed with.

``dequantize()`` computes, in fp32 and in this order, ``((q - z) * s) * g`` with q the decoded weight
value, z the zero point (0 if none), s the decoded scale of the element's block and g the global
scale (1 if none): the exact values the kernels reproduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from anybit.errors import QuantizationError
from anybit.formats.dtypes import FloatType, IntType, TorchFloatType
from anybit.formats.scheme import ActMode, Scheme, ZeroPoint
from anybit.quant.packing import pack_bits, packed_words, unpack_bits

_CLIP_RATIOS = torch.linspace(1.0, 0.75, 11).tolist()


@dataclass
class QuantizedWeight:
    scheme: Scheme
    shape: tuple[int, ...]
    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None
    global_scale: torch.Tensor | None = None
    input_scale: torch.Tensor | None = None

    def __post_init__(self):
        self.shape = tuple(int(d) for d in self.shape)
        self.validate()

    # ---- shapes --------------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.shape[-2]

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def lead(self) -> tuple[int, ...]:
        return self.shape[:-2]

    @property
    def block(self) -> tuple[int, int]:
        """(rows, cols) of weights sharing one scale."""
        return self.scheme.granularity.block_shape(self.n, self.k)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def validate(self) -> None:
        """Raise QuantizationError naming the first tensor whose shape or dtype does not fit."""
        expect = expected_tensors(self.scheme, self.shape)
        for name in ("zeros", "global_scale", "input_scale"):
            if name not in expect and getattr(self, name) is not None:
                raise QuantizationError(f"{name} given, but scheme {self.scheme} has none")
        for name, (shape, dtype) in expect.items():
            t = getattr(self, name)
            if t is None and name == "input_scale":
                continue  # attached later (a checkpoint's calibrated scale); the backends ask for it
            if t is None:
                raise QuantizationError(f"{name} missing: scheme {self.scheme} needs it with shape {shape}")
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise QuantizationError(
                    f"{name} has shape {tuple(t.shape)} and dtype {t.dtype}; expected {shape} and {dtype} "
                    f"for a {self.shape} weight of scheme {self.scheme}"
                )
        if self.input_scale is not None and not bool(((self.input_scale > 0) & self.input_scale.isfinite()).all()):
            raise QuantizationError(f"input_scale must be positive and finite, got {self.input_scale.tolist()}")

    def require_input_scale(self) -> torch.Tensor:
        """The static activation scale, or a clear error where the weight has none."""
        if self.input_scale is None:
            raise QuantizationError(
                f"scheme {self.scheme} quantizes activations with a static scale, and this weight has no "
                "input_scale: load it from a checkpoint that has one, or pass input_scale= to quantize() "
                "(calibration: max |x| over sample inputs / the FP8 max)"
            )
        return self.input_scale

    @classmethod
    def empty(cls, scheme: Scheme | str, shape: tuple[int, ...], device=None) -> QuantizedWeight:
        """Uninitialised tensors of the right shapes and dtypes (a placeholder to load values into)."""
        scheme = Scheme.parse(scheme)
        tensors = {n: torch.empty(s, dtype=d, device=device) for n, (s, d) in expected_tensors(scheme, shape).items()}
        if "input_scale" in tensors:
            tensors["input_scale"].fill_(1.0)  # validated on construction: a placeholder must be a valid scale
        return cls(scheme, shape, **tensors)

    # ---- values --------------------------------------------------------------------------------
    def codes(self) -> torch.Tensor:
        """uint8 [*lead, N, K]: the unpacked weight codes."""
        return unpack_bits(self.qweight, self.scheme.weight_bits, self.k)

    def scale_values(self) -> torch.Tensor:
        """fp32 [*lead, ceil(N/bn), K/bk]: the decoded per-block scales (without the global scale)."""
        return self.scheme.scale_dtype.decode(self.scales)

    def zero_values(self) -> torch.Tensor | None:
        if self.zeros is None:
            return None
        return self.zeros.float()

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[*lead, N, K] weight values (see the module docstring for the exact formula)."""
        q = self.scheme.weight.decode(self.codes())
        s = _expand(self.scale_values(), self.block, self.n)
        z = self.zero_values()
        w = (q - _expand(z, self.block, self.n)) * s if z is not None else q * s
        if self.global_scale is not None:
            w = w * self.global_scale.float()[..., None, None]
        return w.to(dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {"qweight": self.qweight, "scales": self.scales}
        if self.zeros is not None:
            out["zeros"] = self.zeros
        if self.global_scale is not None:
            out["global_scale"] = self.global_scale
        if self.input_scale is not None:
            out["input_scale"] = self.input_scale
        return out

    def expert(self, e: int) -> QuantizedWeight:
        """Expert e of an (E, N, K) stack as an (N, K) weight (views, no copy)."""
        if len(self.shape) != 3:
            raise QuantizationError(f"expert() needs an (E, N, K) weight, this one is {self.shape}")
        return QuantizedWeight(self.scheme, self.shape[1:], **{k: v[e] for k, v in self.tensors().items()})

    def to(self, device) -> QuantizedWeight:
        moved = {k: v.to(device) for k, v in self.tensors().items()}
        return QuantizedWeight(self.scheme, self.shape, **moved)


def expected_tensors(scheme: Scheme, shape: tuple[int, ...]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """{tensor name: (shape, dtype)} of a QuantizedWeight of `shape` and `scheme`."""
    shape = tuple(int(d) for d in shape)
    if len(shape) not in (2, 3):
        raise QuantizationError(f"weight shape {shape} must be (N, K) or (E, N, K)")
    lead, n, k = shape[:-2], shape[-2], shape[-1]
    bn, bk = scheme.granularity.block_shape(n, k)
    if k % bk:
        raise QuantizationError(f"K={k} is not a multiple of the scale block's k={bk} ({scheme})")
    scales = (lead + (math.ceil(n / bn), k // bk), _scale_storage(scheme))
    expect = {"qweight": (lead + (n, packed_words(k, scheme.weight_bits)), torch.int32), "scales": scales}
    if scheme.zero_point is ZeroPoint.INT:
        expect["zeros"] = (scales[0], torch.uint8)
    elif scheme.zero_point is ZeroPoint.FLOAT:
        expect["zeros"] = scales
    if scheme.global_scale:
        expect["global_scale"] = (lead, torch.float32)
    if scheme.act.quantized and scheme.act.mode is ActMode.STATIC:
        expect["input_scale"] = (lead, torch.float32)
    return expect


def _scale_storage(scheme: Scheme) -> torch.dtype:
    s = scheme.scale_dtype
    return s.torch_dtype if isinstance(s, TorchFloatType) else torch.uint8


def _expand(per_block: torch.Tensor, block: tuple[int, int], n: int) -> torch.Tensor:
    bn, bk = block
    return per_block.repeat_interleave(bn, dim=-2)[..., :n, :].repeat_interleave(bk, dim=-1)


# ================================================================================================
# Reference quantization
# ================================================================================================
def quantize(
    w: torch.Tensor, scheme: Scheme | str, *, clip_search: bool = False, input_scale: torch.Tensor | float | None = None
) -> QuantizedWeight:
    """Quantize a float weight [N, K] or [E, N, K] (fp32/bf16/fp16, any device) to `scheme`.

    Round to nearest (ties to even) with abs-max scales (min/max with a zero point); MX scales per the
    OCP MX spec (2**(floor(log2 amax) - emax)); NVFP4 per NVIDIA's recipe (fp32 global scale
    amax/(6*448), e4m3 block scales). `clip_search` tries shrinking each block's range and keeps the
    scale with the least squared error. All-zero blocks get zero scales (no NaN); NaN/Inf is an error.
    `input_scale`: the calibrated activation scale of a static-activation scheme (fp32, one per expert).
    """
    scheme = Scheme.parse(scheme)
    if not w.is_floating_point() or w.dim() not in (2, 3):
        raise QuantizationError(f"weight must be a float tensor [N, K] or [E, N, K], got {w.dtype} {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):
        raise QuantizationError("weight holds NaN or Inf; cannot quantize it")
    n, k = w.shape[-2:]
    bn, bk = scheme.granularity.block_shape(n, k)
    if k % bk:
        raise QuantizationError(f"K={k} is not a multiple of the group/block size {bk} of scheme {scheme}")
    blocks = _to_blocks(w.float(), bn, bk)  # [*lead, nb, bn, kb, bk]
    ratios = _CLIP_RATIOS if clip_search else [1.0]
    best = None
    for r in ratios:
        cand = _quantize_blocks(blocks, scheme, r)
        err = ((cand["deq"] - blocks) ** 2).sum(dim=(-3, -1))
        if best is None:
            best, best_err = cand, err
            continue
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        for key in ("codes", "scales", "zeros", "deq"):
            if best[key] is not None:
                mask = better[..., :, None, :, None] if best[key].dim() == blocks.dim() else better
                best[key] = torch.where(mask, cand[key], best[key])
    codes = _from_blocks(best["codes"], n)
    return QuantizedWeight(
        scheme=scheme,
        shape=tuple(w.shape),
        qweight=pack_bits(codes, scheme.weight_bits),
        scales=best["scales"],
        zeros=best["zeros"],
        global_scale=best["global"],
        input_scale=_per_expert(input_scale, w),
    )


def _per_expert(value: torch.Tensor | float | None, w: torch.Tensor) -> torch.Tensor | None:
    """A static activation scale as fp32 [*lead] on w's device."""
    if value is None:
        return None
    return torch.as_tensor(value, dtype=torch.float32, device=w.device).expand(w.shape[:-2]).contiguous()


def _to_blocks(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    n, k = w.shape[-2:]
    pad = -n % bn
    if pad:
        w = torch.cat([w, w.new_zeros(*w.shape[:-2], pad, k)], dim=-2)
    return w.reshape(*w.shape[:-2], (n + pad) // bn, bn, k // bk, bk)


def _from_blocks(b: torch.Tensor, n: int) -> torch.Tensor:
    nb, bn, kb, bk = b.shape[-4:]
    return b.reshape(*b.shape[:-4], nb * bn, kb * bk)[..., :n, :]


def _bcast(per_block: torch.Tensor) -> torch.Tensor:
    """[*lead, nb, kb] -> [*lead, nb, 1, kb, 1] to broadcast against blocks."""
    return per_block[..., :, None, :, None]


def _quantize_blocks(blocks: torch.Tensor, scheme: Scheme, ratio: float) -> dict:
    wdt, sdt = scheme.weight, scheme.scale_dtype
    lead = blocks.shape[:-4]
    full_amax = blocks.abs().amax(dim=(-3, -1))
    amax = full_amax * ratio
    qmax = wdt.max
    glob = None
    zeros_stored = z_eff = None
    if scheme.zero_point is not ZeroPoint.NONE:
        lo = blocks.amin(dim=(-3, -1)).clamp(max=0) * ratio
        hi = blocks.amax(dim=(-3, -1)).clamp(min=0) * ratio
        scale_stored, s_eff = _encode_scale(sdt, (hi - lo) / (wdt.num_codes - 1))
        safe = torch.where(s_eff > 0, s_eff, torch.ones_like(s_eff))
        z = torch.where(s_eff > 0, -lo / safe, torch.zeros_like(lo))
        if scheme.zero_point is ZeroPoint.INT:
            zeros_stored = torch.round(z).clamp(0, wdt.num_codes - 1).to(torch.uint8)
            z_eff = zeros_stored.float()
        else:
            zeros_stored = sdt.encode(z)
            z_eff = zeros_stored.float()
    elif sdt.name == "ue8m0":
        scale_stored, s_eff = _mx_scale(wdt, amax)
    elif scheme.global_scale:
        # from the unclipped range, so every clip ratio of the search shares one global scale
        tensor_amax = full_amax.flatten(len(lead)).amax(dim=-1)
        glob = tensor_amax / (qmax * sdt.max)
        glob = torch.where(glob > 0, glob, torch.ones_like(glob)).float()
        scale_stored, s_dec = _encode_scale(sdt, amax / qmax / glob[(...,) + (None,) * 2])
        s_eff = s_dec * glob[(...,) + (None,) * 2]
    else:
        scale_stored, s_eff = _encode_scale(sdt, amax / qmax)
    s_b = _bcast(s_eff)
    safe = torch.where(s_b > 0, s_b, torch.ones_like(s_b))
    scaled = torch.where(s_b > 0, blocks / safe, torch.zeros_like(blocks))
    if z_eff is not None:
        scaled = scaled + _bcast(z_eff)
    codes = wdt.encode(scaled)
    q = wdt.decode(codes)
    deq = (q - _bcast(z_eff)) * s_b if z_eff is not None else q * s_b
    return {"codes": codes, "scales": scale_stored, "zeros": zeros_stored, "global": glob, "deq": deq}


def _encode_scale(sdt, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (stored scale, its decoded fp32 value)."""
    stored = sdt.encode(s)
    return stored, sdt.decode(stored)


def _mx_scale(wdt: IntType | FloatType, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP MX shared exponent: floor(log2(amax)) - emax_elem for floats; for ints the smallest power
    of two that does not clip. Clamped to ue8m0's range; all-zero blocks take the smallest scale."""
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    if isinstance(wdt, FloatType):
        e = torch.floor(torch.log2(safe)) - wdt.emax
    else:
        e = torch.ceil(torch.log2(safe / wdt.max))
    e = torch.where(amax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)
    stored = (e + 127).to(torch.uint8)
    return stored, torch.pow(2.0, e).float()
