"""The `humming` backend: humming-kernels (CUDA C++ compiled at run time) running anybit's quantized
weights, so a user can keep Humming where it is measured faster and `anybit bench` can run it side by
side. Present only when `humming` imports (`pip install 'anybit[humming]'`).

The weight is handed over exactly: our codes are unpacked and re-packed by Humming's own packer, signed
integers become Humming's unsigned codes with the implicit 2**(bits-1) offset, scales keep their
values (bf16/fp16 scales must be in the activations' dtype, which is the dtype Humming keeps them in).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, field

import torch

from anybit.backends.base import Prepared, Problem
from anybit.errors import Unsupported
from anybit.formats.dtypes import FloatType, IntType, TorchFloatType
from anybit.formats.scheme import ActMode, ScaleKind, Scheme, ZeroPoint
from anybit.quant.weights import QuantizedWeight

_FLOATS = {"e2m1": "float4e2m1", "e2m3": "float6e2m3", "e3m2": "float6e3m2", "e4m3": "float8e4m3", "e5m2": "float8e5m2"}
_FP8_SCALES = {"e4m3": ("float8e4m3", torch.float8_e4m3fn), "ue8m0": ("float8e8m0", torch.float8_e8m0fnu)}


def humming_configs(scheme: Scheme, exact_scales: bool = True) -> tuple[dict, dict | None]:
    """Humming's weight and input configs for `scheme`; raises Unsupported naming what has no
    Humming equivalent. `exact_scales=False` (a peer quantizing the float weight itself) lets fp32
    scales become Humming's activation-dtype scales."""
    w, g, sdt = scheme.weight, scheme.granularity, scheme.scale_dtype
    if isinstance(w, IntType):
        if w.signed and scheme.zero_point is not ZeroPoint.NONE:
            raise Unsupported(f"signed {w} codes with a zero point")
        wc: dict = {"dtype": f"uint{w.bits}"}
        if not w.signed:
            wc["has_zero_point"] = True  # unsigned codes: an explicit (possibly all-zero) zero point
    elif isinstance(w, FloatType) and w.name in _FLOATS:
        wc = {"dtype": _FLOATS[w.name]}
    else:
        raise Unsupported(f"no humming weight dtype for {w}")
    if scheme.zero_point is ZeroPoint.FLOAT:
        raise Unsupported("float zero points are not mapped to humming")
    if g.kind is ScaleKind.GROUP:
        wc["group_size"] = g.k
    elif g.kind is ScaleKind.BLOCK:
        if sdt.name != "fp32" and exact_scales:
            raise Unsupported(f"humming's 2-D block scales are fp32, not {sdt.name}")
        wc.update(group_size=g.k, group_size_n=g.n)
    elif g.kind is not ScaleKind.CHANNEL:
        raise Unsupported(f"humming has no {g.token()} weight scales")
    if sdt.name in _FP8_SCALES:
        wc["scale_dtype"] = _FP8_SCALES[sdt.name][0]
    elif sdt.name == "fp32" and g.kind is not ScaleKind.BLOCK and exact_scales:
        raise Unsupported("fp32 group/channel scales: humming keeps them in the activation dtype (inexact)")
    elif sdt.name not in ("bf16", "fp16", "fp32"):
        raise Unsupported(f"{sdt.name} scales have no humming equivalent")
    if scheme.global_scale:
        wc["weight_scale_2_type"] = "tensor"
    ic = None
    if scheme.act.quantized:
        if scheme.act.dtype.name != "e4m3" or scheme.act.mode is not ActMode.TOKEN:
            raise Unsupported(f"humming's FP8 input is dynamic per-token e4m3, not {scheme.act.token()}")
        ic = {"dtype": "float8e4m3", "quant_mode": "dynamic_token"}
    return wc, ic


def humming_tensors(qw: QuantizedWeight, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Humming's tensors for a dense weight, before packing: ``weight`` int32 [N, K] codes (unsigned
    ints carry the 2**(bits-1) offset when there is no zero point), ``weight_scale`` [N, K/g] (or
    [N, 1], or fp32 [N/bn, K/bk] blocks), ``zero_point`` int32 [N, K/g] codes, ``weight_scale_2`` fp32
    [1]. Humming computes ``(code - zero or offset) * scale * scale_2``, which equals `dequantize()`."""
    s = qw.scheme
    sdt = s.scale_dtype
    codes = qw.codes().to(torch.int32)
    if isinstance(s.weight, IntType) and s.weight.signed:
        codes = codes ^ (1 << (s.weight.bits - 1))  # two's complement -> offset binary
    out = {"weight": codes}
    if isinstance(sdt, TorchFloatType):
        if sdt.name != "fp32" and sdt.torch_dtype != dtype:
            raise Unsupported(f"{sdt.name} scales with {dtype} activations: humming keeps scales in the x dtype")
        out["weight_scale"] = qw.scales
    else:
        out["weight_scale"] = qw.scales.view(_FP8_SCALES[sdt.name][1])
    if s.granularity.kind is ScaleKind.CHANNEL:
        out["weight_scale"] = out["weight_scale"].reshape(*qw.lead, qw.n, 1)
    if isinstance(s.weight, IntType) and not s.weight.signed:
        zeros = qw.zeros if qw.zeros is not None else torch.zeros(qw.scales.shape, dtype=torch.uint8, device=qw.device)
        out["zero_point"] = zeros.to(torch.int32).reshape(*qw.lead, qw.n, -1)
    if qw.global_scale is not None:
        out["weight_scale_2"] = qw.global_scale.float().reshape(qw.lead or (1,))  # [E] for expert stacks
    return out


def packed_humming_tensors(qw: QuantizedWeight, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """`humming_tensors` with codes and integer zero points packed by Humming's own packer (zero
    points along N, as its quantizer does)."""
    from humming import ops

    bits = qw.scheme.weight_bits
    t = humming_tensors(qw, dtype)
    t["weight"] = ops.pack_weight(t["weight"].contiguous(), bits)
    if "zero_point" in t:
        t["zero_point"] = ops.pack_weight(t["zero_point"].transpose(-1, -2).contiguous(), bits)
        t["zero_point"] = t["zero_point"].transpose(-1, -2).contiguous()
    return t


def humming_moe_layer(qw: QuantizedWeight, dtype: torch.dtype, experts_per_chunk: int = 16, exact_scales: bool = True):
    """A transformed `HummingLayer(num_experts=E)` holding an (E, N, K) expert stack, filled a chunk of
    experts at a time (unpacked int32 codes of all DeepSeek-V3 experts would take 30 GB). exact_scales=False
    (a timing peer): fp32 channel/group scales are rounded to Humming's activation-dtype scales."""
    from humming.layer import HummingLayer

    wc, ic = humming_configs(qw.scheme, exact_scales)
    e = qw.shape[0]
    with torch.device(qw.device):
        layer = HummingLayer(shape_n=qw.n, shape_k=qw.k, weight_config=dict(wc), input_config=ic and dict(ic),
                             num_experts=e, torch_dtype=dtype)  # fmt: skip
    for e0 in range(0, e, experts_per_chunk):
        part = {k: v[e0 : e0 + experts_per_chunk] for k, v in qw.tensors().items()}
        chunk = QuantizedWeight(qw.scheme, (part["qweight"].shape[0], qw.n, qw.k), **part)
        for name, t in packed_humming_tensors(chunk, dtype).items():
            dest = getattr(layer, name).data[e0 : e0 + t.shape[0]]
            dest.copy_(t.reshape(dest.shape))
    layer.transform()
    return layer


@functools.cache
def _installed() -> bool:
    return importlib.util.find_spec("humming") is not None


@dataclass
class HummingWeight:
    """One Humming layer per activation dtype, built on first use (Humming fixes the dtype at build)."""

    qweight: QuantizedWeight
    layers: dict = field(default_factory=dict)

    def layer(self, dtype: torch.dtype):
        if dtype not in self.layers:
            self.layers[dtype] = _build_layer(self.qweight, dtype)
        return self.layers[dtype]


def _build_layer(qw: QuantizedWeight, dtype: torch.dtype):
    from humming.layer import HummingLayer

    wc, ic = humming_configs(qw.scheme)
    t = packed_humming_tensors(qw, dtype)
    with torch.cuda.device(qw.device):
        layer = HummingLayer(shape_n=qw.n, shape_k=qw.k, weight_config=dict(wc), input_config=ic and dict(ic),
                             torch_dtype=dtype).to(qw.device)  # fmt: skip
        layer.load_from_tensors(t)
        layer.transform()
    return layer


class HummingBackend:
    name = "humming"

    def supports(self, problem: Problem) -> tuple[bool, str]:
        if not _installed():
            return False, "humming-kernels is not installed (pip install 'anybit[humming]')"
        if problem.device.type != "cuda":
            return False, "humming-kernels runs on CUDA GPUs only"
        if problem.act_dtype is not None and problem.act_dtype not in (torch.float16, torch.bfloat16):
            return False, f"activations must be bf16 or fp16, got {problem.act_dtype}"
        try:
            humming_configs(problem.scheme)
        except Unsupported as e:
            return False, str(e)
        bits = problem.scheme.weight_bits
        if (problem.k * bits) % 32 or (isinstance(problem.scheme.weight, IntType) and (problem.n * bits) % 32):
            return False, f"K*bits (and N*bits for ints) must divide by 32 for humming; K={problem.k}"
        g = problem.scheme.granularity
        if g.kind is ScaleKind.BLOCK and problem.n % g.n:
            return False, f"humming's 2-D block scales need N={problem.n} to be a multiple of {g.n}"
        sdt = problem.scheme.scale_dtype
        if problem.act_dtype is not None and isinstance(sdt, TorchFloatType) and sdt.name != "fp32":
            if sdt.torch_dtype != problem.act_dtype:
                return False, f"{sdt.name} scales with {problem.act_dtype} x (humming keeps scales in the x dtype)"
        return True, "humming-kernels (CUDA C++, JIT)"

    def prepare(self, qweight: QuantizedWeight) -> Prepared:
        if qweight.lead:
            raise Unsupported(f"the humming backend takes dense (N, K) weights, not {qweight.shape}")
        humming_configs(qweight.scheme)
        return Prepared(self.name, qweight, HummingWeight(qweight))

    def gemm(self, x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None = None) -> torch.Tensor:
        if x.dtype not in (torch.float16, torch.bfloat16):
            raise Unsupported(f"the humming backend takes bf16/fp16 activations, not {x.dtype}")
        lead = x.shape[:-1]
        y = prepared.data.layer(x.dtype)(x.reshape(-1, x.shape[-1]).contiguous())
        if bias is not None:
            y = y + bias
        return y.reshape(*lead, y.shape[-1])
