"""Large-M FP8-activation GEMMs through cuBLAS's block-scaled FP8 GEMM (`torch.nn.functional.scaled_mm`
with 1x128 / 128x128 scales; Hopper, CUDA >= 12.9): the scale of every 128-K block is applied inside
cuBLAS's main loop, where a Triton kernel has to promote each block's partial sums in fp32 itself.

H200, same run (`tools/probe_blockwise.py`, BENCHMARKS.md): 1x128 weight scales 900–1050 TFLOP/s at
M >= 1024, 128x128 blocks 1180–1320 (row-wise `_scaled_mm`: 1200–1400); the Triton kernels on the same
problems: W4A8 g128 210–230, FP8-block 520–630.

Which weights (`blockscaled_recipe`): e4m3 activations per token or per 128-K group, and
* e4m3 weights with 128x128 block scales (DeepSeek-V3 FP8) — read as they are;
* 4-bit integer weights (W4A8) with scales per 128 along K in the FP8 fragment layout — their integers
  (q - z, exact in e4m3) are written out once per call by `dequantize_frag` (N*K bytes), then 1x128.

And row-wise (`rowwise_gemm`, `torch._scaled_mm` with per-token x and per-row W scales): MXFP4 weights under
FP8 x whose rows' group scales lie within 8 binades — each written per call as e4m3 times a power of two a row.
"""

from __future__ import annotations

import functools

import torch

from anybit.formats.dtypes import IntType
from anybit.formats.scheme import ActMode, ScaleKind, Scheme

BLOCK = 128


def blockscaled_recipe(scheme: Scheme, n: int, k: int, nk: bool, frag: bool) -> str | None:
    """The weight's scale blocks, "1x128" or "128x128", when cuBLAS's block-scaled GEMM can run this
    prepared weight exactly, else None (the Triton kernels keep it; static x scales among them)."""
    act, g = scheme.act, scheme.granularity
    if not act.quantized or act.dtype.name != "e4m3" or k % BLOCK:
        return None
    if act.mode is not ActMode.TOKEN and not (act.mode is ActMode.GROUP and act.group == BLOCK):
        return None
    if scheme.scale_dtype.name not in ("fp32", "bf16", "fp16") or scheme.global_scale:
        return None
    if nk and g.kind is ScaleKind.BLOCK and (g.n, g.k) == (BLOCK, BLOCK) and n % BLOCK == 0:
        return "128x128"
    whole_group = g.kind is ScaleKind.GROUP and g.k == BLOCK
    if frag and isinstance(scheme.weight, IntType) and whole_group and n % 16 == 0:
        return "1x128"
    return None


def cublas_weight_scales(scales: torch.Tensor, recipe: str) -> torch.Tensor:
    """The weight's scales (Triton layout: [K/128, N] or [K/128, N/128]) as cuBLAS reads them, fp32:
    1x128 [N, K/128] N-major (a view when already fp32); 128x128 [K/128 padded to 4, N/128] K-major."""
    s = scales.float()
    if recipe == "1x128":
        return s.t()
    pad = -s.shape[0] % 4
    return torch.nn.functional.pad(s.t(), (0, pad)).t() if pad else s.t().contiguous().t()


def blockscaled_why_not(recipe: str | None, device: torch.device, out_dtype: torch.dtype) -> str | None:
    """None when a large-M call of a weight with this recipe goes to cuBLAS's block-scaled FP8 GEMM on
    `device`, else why not."""
    if recipe is None:
        return "the weight has no 128-K scale blocks cuBLAS's block-scaled FP8 GEMM takes"
    return _cuda_why_not(device, blockscaled_support, out_dtype)


def _cuda_why_not(device: torch.device, support, out_dtype: torch.dtype) -> str | None:
    """Why a cuBLAS FP8 route cannot run on `device` (its `support` probe, cached per GPU and dtype), else None."""
    if device.type != "cuda":
        return "cuBLAS needs a CUDA device"
    return support(device.index if device.index is not None else torch.cuda.current_device(), out_dtype)


@functools.cache
def blockscaled_support(device_index: int, out_dtype: torch.dtype) -> str | None:
    """None when this torch and GPU run the block-scaled GEMM (one tiny call of each recipe), else why
    not. Hopper only: cuBLAS has these scale modes for sm_90."""
    cap = torch.cuda.get_device_capability(device_index)
    if cap != (9, 0):
        return f"cuBLAS block-scaled FP8 is sm_90 only, this GPU is sm_{cap[0]}{cap[1]}"
    try:
        from torch.nn.functional import ScalingType, scaled_mm  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.functional.scaled_mm"
    dev = torch.device("cuda", device_index)
    a = torch.ones((BLOCK, BLOCK), device=dev).to(torch.float8_e4m3fn)
    sa = torch.ones((1, BLOCK), device=dev).t()
    try:
        for recipe in ("1x128", "128x128"):
            sb = torch.ones((1, BLOCK), device=dev).t() if recipe == "1x128" else torch.ones((1, 4), device=dev).t()
            _scaled_mm(a, sa, a, sb, recipe, out_dtype)
    except (RuntimeError, ValueError, NotImplementedError) as e:
        return f"torch.nn.functional.scaled_mm block-wise: {str(e).splitlines()[0][:200]}"
    return None


def _scaled_mm(xq, sx, wq, sw, recipe: str, out_dtype):
    from torch.nn.functional import ScalingType, scaled_mm

    rb = ScalingType.BlockWise1x128 if recipe == "1x128" else ScalingType.BlockWise128x128
    return scaled_mm(xq, wq.t(), sx, ScalingType.BlockWise1x128, sw, rb, output_dtype=out_dtype)


def blockscaled_gemm(x: torch.Tensor, tw, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] bf16/fp16 -> y [M, N] in x's dtype: x quantized per the scheme (`quantize_act`), then
    cuBLAS with per-(row, 128-K) x scales and the weight's 1x128 or 128x128 scales."""
    from anybit.kernels.frag_dequant import dequantize_frag
    from anybit.kernels.quant_act import quantize_act

    m = x.shape[0]
    pad = -m % 16  # cuBLAS has no block-scaled algorithm for other M (H200: M=65 not supported, 300 is)
    # cuBLAS reads 1x128 x scales M-major ([M, K/128] with strides (1, M)): the quantizer writes them so
    xq, sx = quantize_act(torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x, tw.scheme.act, blockwise=True)
    if tw.blockscaled == "1x128":  # (int4 W4A8 in the A16 order, `TritonWeight.a16`: scaled by ones)
        wq = dequantize_frag(tw, dtype=torch.float8_e4m3fn, scales=tw.unit_scales)
    else:
        wq = tw.planes[0]
    y = _scaled_mm(xq, sx, wq, tw.blockscaled_scales, tw.blockscaled, x.dtype)[:m]
    return y + bias if bias is not None else y


# e2m1 * 2**-d is an e4m3 value for every e2m1 value when d <= 8 (0.5 * 2**-8 = 2**-9, e4m3's smallest subnormal)
ROW_SPREAD_MAX = 8


def e2m1_row_scales(qw, spread: int = ROW_SPREAD_MAX) -> tuple[torch.Tensor, torch.Tensor] | None:
    """MXFP4 weights (e2m1, ue8m0 scales per group along K) as e4m3 values times one power of two per row,
    exactly, for cuBLAS's row-wise FP8 GEMM: (each group's ue8m0 code relative to its row's largest, in the
    Triton layout [K/g, N]; fp32 [N] row scales 2**(largest - 127)). None unless the scheme is `e2m1_rows_scheme`
    and every row's groups lie within `spread` binades of each other (else some products would need more than e4m3;
    groups whose codes are all zero count as the row's largest). The FP8 frag kernel's look-up tables (`e2m1_a8`)
    take 11 binades: their e4m3 values are 2**6 higher (`frag_decode.E2M1_A8_SPREAD_MAX`)."""
    from anybit.backends.triton_layout import e2m1_rows_scheme

    if not e2m1_rows_scheme(qw.scheme):
        return None
    codes = qw.scales.to(torch.int32)  # [N, K/g] ue8m0 codes
    # groups of zeros (any scale times them is zero) take their row's largest: a zero group with a tiny scale, as
    # a quantizer gives it, must not push the row past the spread
    live = ((qw.codes().reshape(*codes.shape, -1) & 7) != 0).any(dim=-1)
    top = torch.where(live, codes, -1).amax(dim=1, keepdim=True).clamp(min=0)
    codes = torch.where(live, codes, top)
    if bool((top == 255).any()) or int((top - codes).max()) > spread:
        return None
    rel = (codes - top + 127).to(qw.scales.dtype).t().contiguous()
    return rel, torch.exp2(top.squeeze(1).float() - 127)


def rowwise_why_not(tw, device: torch.device, out_dtype: torch.dtype) -> str | None:
    """None when a call of this prepared weight can take `rowwise_gemm` on `device`, else why not."""
    if tw.rowwise is None:
        return "the weight is not MXFP4 within 8 binades a row (11 on the FP8 MMA; `e2m1_row_scales`)"
    if tw.n % 16 or tw.k % 16:
        return f"N={tw.n}, K={tw.k}: cuBLAS's FP8 GEMM takes multiples of 16"
    return _cuda_why_not(device, rowwise_support, out_dtype)


@functools.cache
def rowwise_support(device_index: int, out_dtype: torch.dtype) -> str | None:
    """None when this torch and GPU run the row-wise FP8 GEMM (one tiny call), else why not."""
    if torch.cuda.get_device_capability(device_index) < (8, 9):
        return "FP8 tensor cores need sm_89+"
    a = torch.ones((16, 32), device=torch.device("cuda", device_index)).to(torch.float8_e4m3fn)
    s = torch.ones((16, 1), device=a.device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=s, scale_b=s.t(), out_dtype=out_dtype)
    except (RuntimeError, ValueError, NotImplementedError) as e:
        return f"torch._scaled_mm row-wise: {str(e).splitlines()[0][:200]}"
    return None


def rowwise_gemm(x: torch.Tensor, tw, bias: torch.Tensor | None) -> torch.Tensor:
    """x [M, K] bf16/fp16 -> y [M, N] for MXFP4 weights under FP8 x (`e2m1_row_scales`): x quantized per token, W
    written as e4m3 (N*K bytes, exact: the codes times their group's power of two relative to the row), then
    cuBLAS's row-wise FP8 GEMM with x's scales and the rows' powers of two."""
    from anybit.kernels.frag_dequant import dequantize_frag
    from anybit.kernels.quant_act import quantize_act

    rel, rows = tw.rowwise
    xq, sx = quantize_act(x, tw.scheme.act)
    wq = dequantize_frag(tw, dtype=torch.float8_e4m3fn, scales=rel)
    y = torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=rows.view(1, -1), out_dtype=x.dtype)
    return y + bias if bias is not None else y
