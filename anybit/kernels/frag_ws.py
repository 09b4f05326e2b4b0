"""Large-M W4A16 on Hopper without a dequantize pass: `gemm_frag_ws` runs the warp-specialised Gluon kernel
(`anybit.kernels.frag_ws_kernel`) on a fragment-layout weight — a decode partition writes each 64-K
slice of the weight tile into shared memory as x's dtype while two MMA warpgroups multiply the slice before
(wgmma, both operands in shared memory). It replaces dequantize-then-cuBLAS, which writes and reads the
whole bf16 weight once per call (N*K*2 bytes: 40 µs of a 200 µs M=1024 call at 8192^2 on the H200).

Which weights: 4- and 8-bit integer codes (int4 / uint4 / int8 / uint8, no zero point, no global scale) with
scales in x's dtype per channel or per whole blocks of the layout (128 K; 64 for 8 bits), and e2m1 codes with e4m3
or ue8m0 scales every 16 or 32 K (NVFP4 with its global scale, MXFP4) whose scales the frag decode may build from
their bits (`TritonWeight.fold_bits`); bf16 or fp16 activations; sm_90 with Gluon's Hopper API (Triton 3.6).
`frag_ws_weight_why_not` names what is missing otherwise, and the caller keeps dequantize-then-cuBLAS.
"""

from __future__ import annotations

import copy
import functools

import torch

from anybit import settings
from anybit.backends.triton_layout import codes_a16
from anybit.formats.dtypes import FloatType
from anybit.formats.scheme import ScaleKind
from anybit.kernels.dequant import cdiv
from anybit.kernels.frag import scaled_int_why_not
from anybit.kernels.frag_layout import FRAG_K, FRAG_PANEL, frag_block_k
from anybit.kernels.launch import Launcher

WS_BK = 64  # K per step (half a frag block)


# The Triton whose Gluon API the kernels are written in and were measured with (Triton 3.9 renamed parts of it:
# `tma.async_copy_global_to_shared` -> `async_load`, `shared_memory_descriptor._reinterpret` -> `reinterpret`)
GLUON_TRITON = "3.6"


@functools.cache
def _gluon():
    """(gl, TensorDescriptor, the kernel) where this Triton has Gluon's Hopper API as the kernels use it, else the
    reason (a str)."""
    try:
        import triton

        if not triton.__version__.startswith(GLUON_TRITON + "."):
            return (f"the Gluon kernels are written for Triton {GLUON_TRITON}'s Gluon API, this is Triton "
                    f"{triton.__version__}")  # fmt: skip
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        from anybit.kernels.frag_ws_kernel import frag_ws_kernel
    except Exception as ex:  # ImportError, or names this Triton spells otherwise
        return f"Gluon's Hopper API is not importable here ({type(ex).__name__}: {ex})"
    return gl, TensorDescriptor, frag_ws_kernel


def gluon_api():
    """`_gluon()`'s (gl, TensorDescriptor, kernel) for a launcher; its reason as an error where there is none (the
    callers check `gluon_hopper_why_not` first)."""
    api = _gluon()
    if isinstance(api, str):
        raise RuntimeError(f"Gluon kernel unavailable: {api}")
    return api


@functools.cache
def _x_layout(block_m: int, dtype: torch.dtype):
    gl = gluon_api()[0]
    gdt = gl.bfloat16 if dtype == torch.bfloat16 else gl.float16
    return gl.NVMMASharedLayout.get_default_for([block_m, WS_BK], gdt)


_X_DESCS: dict = {}  # (block_m, dtype) -> a TensorDescriptor of x's tiles without its tensor (`x_desc`'s template)


def x_desc(x: torch.Tensor, block_m: int):
    """The TMA descriptor of x's [block_m, WS_BK] tiles (x contiguous [M, K] bf16/fp16): a copy of one built per
    tile and dtype with x put in — the descriptor's own checks cost ~2 µs of host time a call, twice in most calls —
    where x is 16-byte aligned with M >= 1 and K % 8 == 0 (what they check of such an x), else a checked one."""
    key = (block_m, x.dtype)
    template = _X_DESCS.get(key)
    if template is None or x.data_ptr() % 16 or not x.shape[0] or x.shape[1] % 8:
        desc = gluon_api()[1].from_tensor(x, [block_m, WS_BK], _x_layout(block_m, x.dtype))
        if template is None:
            template = _X_DESCS[key] = copy.copy(desc)
            template.base = None  # (holds no tensor alive)
        return desc
    desc = object.__new__(type(template))
    desc.__dict__.update(template.__dict__)
    desc.base, desc.shape, desc.strides = x, x.shape, x.stride()
    return desc


@functools.cache
def flat_layout(bits: int):
    """The unswizzled shared layout of the decoder's TMA ring (words: 32 bits, scales: their width)."""
    return gluon_api()[0].NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=bits, rank=2)


WS_WORD_DEPTH = 3  # blocks of words and scales in the decoder's TMA ring (two in flight while one is decoded)


def weight_descs(tw, block_n: int) -> tuple:
    """TMA descriptors of a frag weight (or expert stack) for the decoder: its words as rows of 256 (a 64-row
    panel's 128-K block is 4 of them, `frag_layout.to_panels`) and its scales as [groups (x experts), N] rows
    of `block_n`; cached on the weight."""
    if block_n not in tw.ws_desc:
        TensorDescriptor = gluon_api()[1]
        words = tw.planes[0].reshape(-1, 256)
        scales = tw.scales.reshape(-1, tw.scales.shape[-1])
        rows = 1  # scale rows a block: one (ints), or the block's groups as uint8 codes (e2m1)
        if tw.fmt["W_FLOAT"]:
            scales, rows = scales.view(torch.uint8), FRAG_K // tw.group_k
        s_layout = flat_layout(8 * scales.element_size())
        tw.ws_desc[block_n] = (TensorDescriptor.from_tensor(words, [4, 256], flat_layout(32)),
                               TensorDescriptor.from_tensor(scales, [rows, block_n], s_layout))  # fmt: skip
    return tw.ws_desc[block_n]


def int_descs(tw, dtype: torch.dtype, block_n: int) -> tuple:
    """The TMA descriptors of a frag weight for a Gluon kernel with x of `dtype` and N tiles of `block_n` rows: its
    words and scales (`weight_descs`; integer scales of the other 16-bit type rounded to x's once —
    `frag_rs.rs_int_why_not` —, 2-bit codes in 64-K groups four scale rows a 256-K block) and its zero points as
    [groups, N] uint8 rows (the scale descriptor standing in without them); cached on the weight."""
    key = ("int", dtype, block_n)
    if key not in tw.ws_desc:
        w_desc, s_desc = weight_descs(tw, block_n)
        TensorDescriptor = gluon_api()[1]
        rows = 4 if tw.fmt["W_BITS"] == 2 and tw.group_k == 64 else 1  # a 2-bit block's four 64-K groups
        if not tw.fmt["W_FLOAT"] and (tw.scales.dtype != dtype or rows > 1):
            scales = tw.scales.to(dtype).reshape(-1, tw.scales.shape[-1])
            s_desc = TensorDescriptor.from_tensor(scales, [rows, block_n], flat_layout(16))
        z_desc = s_desc
        if tw.fmt["ZP"]:
            zeros = tw.zeros.reshape(-1, tw.zeros.shape[-1])
            z_desc = TensorDescriptor.from_tensor(zeros, [rows, block_n], flat_layout(8))
        tw.ws_desc[key] = (w_desc, s_desc, z_desc)
    return tw.ws_desc[key]


@functools.cache
def _is_hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def gluon_hopper_why_not(device: torch.device) -> str | None:
    """None when the warp-specialised Gluon kernels can run on `device` (a Hopper GPU, Gluon's Hopper API in this
    Triton, not the interpreter), else why not."""
    if device.type != "cuda" or settings.triton_interpret():
        return "a Gluon kernel: a CUDA GPU, not the interpreter"
    if not _is_hopper(device.index if device.index is not None else torch.cuda.current_device()):
        return "Hopper (sm_90) only: wgmma, TMA and warp specialisation"
    return _gluon() if isinstance(_gluon(), str) else None


def frag_ws_why_not(
    scheme, k: int, x_dtype: torch.dtype, device: torch.device, n: int | None = None, bits: int = 4
) -> str | None:
    """None when `gemm_frag_ws` runs integer weights of `scheme` (K = k, N = n where known; `bits`: 4, or 8 for the
    dense kernels — the grouped MoE kernel decodes 4) with x of `x_dtype` on `device`, else why not."""
    why = gluon_hopper_why_not(device)
    if why is not None:
        return why
    why = scaled_int_why_not(scheme, x_dtype, bits)
    if why is not None:
        return why
    if k % 8:
        return f"K={k} must be a multiple of 8 (TMA reads x rows 16-byte aligned)"
    if n is not None and n % 8:
        return f"N={n} must be a multiple of 8 (TMA reads scale rows 16-byte aligned)"
    return None


def e2m1_ws_why_not(scheme, x_dtype: torch.dtype) -> str | None:
    """None for the e2m1 schemes the kernel decodes (`_e2m1_asm`): bf16/fp16 x (or FP8 x as its codes in x's dtype,
    `codes_a16`, scaled per row after the MMA), scales every 16 or 32 K as e4m3 or ue8m0 codes (NVFP4, MXFP4); else
    why not. A weight also needs scales that fold exactly (`frag_ws_weight_why_not`)."""
    w, g = scheme.weight, scheme.granularity
    if (scheme.act.quantized and not codes_a16(scheme)) or x_dtype not in (torch.bfloat16, torch.float16):
        return "e2m1 weights with bf16/fp16 activations (or FP8 ones as their codes, per token) only"
    if not (isinstance(w, FloatType) and (w.exp, w.man) == (2, 1) and g.kind is ScaleKind.GROUP and g.k in (16, 32)):
        return f"e2m1 codes in groups of 16 or 32 along K only ({scheme})"
    if scheme.scale_dtype.name not in ("e4m3", "ue8m0"):
        return f"e4m3 or ue8m0 scales only (scales {scheme.scale_dtype.name})"
    return None


def frag_ws_scheme_why_not(
    scheme, k: int, x_dtype: torch.dtype, device: torch.device, n: int | None = None
) -> str | None:
    """None when `gemm_frag_ws` runs weights of `scheme` (K = k, N = n where known) with x of `x_dtype` on `device`
    (e2m1 weights: where their scales fold exactly, `frag_ws_weight_why_not`), else why not."""
    if not isinstance(scheme.weight, FloatType):
        return frag_ws_why_not(scheme, k, x_dtype, device, n, 8 if scheme.weight.bits == 8 else 4)
    why = gluon_hopper_why_not(device) or e2m1_ws_why_not(scheme, x_dtype)
    if why is None and k % 8:
        why = f"K={k} must be a multiple of 8 (TMA reads x rows 16-byte aligned)"
    if why is None and n is not None and n % 16:
        why = f"N={n} must be a multiple of 16 (TMA reads rows of scale codes 16-byte aligned)"
    return why


def frag_ws_weight_why_not(tw, x_dtype: torch.dtype, device: torch.device) -> str | None:
    """`frag_ws_scheme_why_not` for a prepared frag weight: e2m1 weights also need scales that the decode builds from
    their bits exactly for x's dtype (`frag_fold` 2: `TritonWeight.fold`, `fold_bits`)."""
    why = frag_ws_scheme_why_not(tw.kernel_scheme, tw.k, x_dtype, device, tw.n)
    if why is None and tw.e2m1_a8:
        why = "e2m1 weights laid out for the FP8 MMA (`TritonWeight.e2m1_a8`) run the frag kernel"
    if why is None and tw.fmt["W_FLOAT"] and (x_dtype not in tw.fold or not tw.fold_bits):
        why = f"this weight's scales do not fold exactly for {x_dtype} (`TritonWeight.fold`, `fold_bits`)"
    return why


WS_MIN_WAVE_FILL = 0.84  # of the last wave of CTAs: the kernel is not persistent, a thin last wave idles SMs
WS_ONE_WAVE_MIN_N = 8192  # a launch of one partial wave still beats dequantize + cuBLAS from this N on


def swap_tile(m: int, n: int, num_sms: int = 132, k: int | None = None) -> dict | None:
    """The swapped kernel's tile (`frag_ws_swap_kernel`: weight rows as the wgmma's M, the fewest tokens holding M as
    its N), or None where the row-major tiles are as fast. H200 graphs (tools/probe_ws.py, session 20), µs, MXFP4 /
    W4A16 against the route before: where N's 64-row tiles fill one wave (8192 rows: 128 CTAs), 64 weight rows of
    one warpgroup, 5 stages (4 at 256 tokens) from 129 tokens on — 8192^2 M=160 / 192 / 256: 66.9 / 66.7 / 70.5 ->
    48.3 / 53.9 / 54.4 (W4A16 M=192 68.6 -> 55.1), 8192x28672 214.8 / 219.5 / 223.8 -> 164.0 / 183.8 / 181.0 (W4A16
    M=192 254.9 -> 188.7) — and from 65 where K < 2N (8192^2 M=96 / 128 47.9 / 51.0 -> 42.4 / 43.6, W4A16 M=128
    52.8 -> 42.4; 8192x28672 M=128 132.3 -> 145.2 stays on the frag kernel); where 128-row tiles make more than a
    wave, 128 weight rows at 129-192 tokens (28672x8192 M=160 204.8 -> 160.9). Up to 192 tokens two decoder
    partitions (`ndec`, session 21: 8192^2 M=192 MXFP4 55.5 -> 49.1, W4A16 55.8 -> 48.9, NVFP4 M=96 / 128 48.0 /
    51.6 -> 43.8 / 44.4; 28672x8192 M=192 128-row tiles MXFP4 182.4 (the route then) -> 173.7, Humming 176.7); at
    256 tokens one (MXFP4 58.1 vs 60.5)."""
    bm = swap_block_m(m) if m > 64 else None
    if bm is None:
        return None
    tile = dict(block_m=bm, group_m=8, dq_warps=4, dq_regs=160, swap=True)
    if bm <= 192:
        tile |= dict(ndec=2, dq_regs=96)
    if cdiv(n, 64) <= num_sms and cdiv(n, 64) >= WS_MIN_WAVE_FILL * num_sms:
        if m > 128 or (k is not None and k < 2 * n):
            return tile | dict(block_n=64, stages=4 if bm == 256 else 5)
    elif cdiv(n, 128) > num_sms and 128 < m <= 192:
        return tile | dict(block_n=128, stages=4, dq_regs=80, depth=2)  # two 2-block word rings: shared memory
    return None


def ws_takes(tile: dict | None, m: int) -> bool:
    """Whether a call of M rows that the frag kernel's 128/256-token tiles would take (`frag_mid`) goes to this
    kernel's tile instead: above 128 rows any tile, up to 128 only a swapped one (the row-major tiles trail there)
    or the register-operand kernel's (`frag_rs.rs_tile`)."""
    return tile is not None and (m > 128 or bool(tile.get("swap") or tile.get("rs")))


# 8-bit codes (W8A16): the byte decode is ~1.75x the 4-bit one's instructions a K step, and dequantize + cuBLAS
# reads / writes 2x the 4-bit pass. H200, eager µs (tools/probe_ws.py, session 26), dequantize + cuBLAS -> this
# kernel's 256x128 tile (Humming): 28672x4096 M=256 204.4 -> 141.4 (120.9), M=1024 458.6 -> 461.7 (392.0); 4096x14336
# M=1024 206.8 -> 217.9 (220.6); two decoder partitions on the 256-row tile (`WS_BYTES_TILE`), graphs, route ->
# that tile: 28672x4096 M=256 127.5 -> 123.9 (118.7), M=512 (dequantize + cuBLAS) 274.9 -> 244.6 (201.1);
# 28672x8192 M=512 539.2 -> 491.9 (392.4); 8192^2 M=512 153.3 -> 115.2 (127.8); at M=1024 (graphs, dequantize +
# cuBLAS -> that tile) a draw: 28672x4096 437.9 -> 446.2, 28672x8192 836.4 -> 840.3, 8192^2 244.6 -> 253.8, 4096^2
# 60.6 -> 63.3, 4096x14336 210.6 -> 202.6 (Humming 401.0 / 748.4 / 248.9 / 61.5 / 216.7). So up to this many rows
WS_BYTES_MAX_M = 512
WS_BYTES_TILE = dict(ndec=2, stages=3, depth=2, dq_regs=80)  # 8-bit codes on 256-row tiles: two decoders


def ws_tile(m: int, n: int, num_sms: int = 132, k: int | None = None, bits: int = 4) -> dict | None:
    """The kernel's tile (`swap_tile` first), or None where dequantize + cuBLAS is faster (H200 sweeps,
    `tools/probe_ws.py`, BENCHMARKS.md): 256 x-rows x 128 weight rows, 64-K steps, 4 stages, 4 decode warps
    (8192^2 M=1024 212 µs, 196 under graphs since the decoder's words come by TMA; 128 x 256 decodes each weight tile
    for half as many rows: 267; 3 stages: 234); 128 x 128 only at
    M <= 256, where 256-row tiles are half padding (28672x8192 M=128 152 vs 288 µs; above, 128-row tiles are
    1.3-1.6x slower), with 6 stages (half-size x slices: CUDA graphs, 28672x8192 M=128 143 -> 136 µs,
    8192x28672 M=128 229 -> 219, every 128-row cell 1-5 % faster). Only where the CTAs fill their waves:
    6144x4096 M=1024 (192 CTAs, 1.45 waves) took 108 µs against 84 for dequantize + cuBLAS, 4096x4096 M=1024
    (128 CTAs) 54 against 56 — or, in a single partial wave, where N >= 8192: the dequantize pass grows with
    N x K, one CTA's walk only with K (graphs: 8192^2 M=128, 64 CTAs, 67 vs 89 µs; 8192x28672 M=128 219 vs 317;
    4096^2 M=128, 32 CTAs, 35 vs 26). 8-bit codes (`bits`) up to WS_BYTES_MAX_M rows; 3-bit ones with a word ring
    of two blocks."""
    if bits == 8 and m > WS_BYTES_MAX_M:
        return None
    swapped = swap_tile(m, n, num_sms, k)
    if swapped is not None:
        return swapped
    fits = [bm for bm in (256, 128) if not ((bm == 256 and m <= 128) or (bm == 128 and m > 256))]
    ctas = {bm: cdiv(m, bm) * cdiv(n, 128) for bm in fits}
    filled = [bm for bm in fits if ctas[bm] / (cdiv(ctas[bm], num_sms) * num_sms) >= WS_MIN_WAVE_FILL]
    # a single partial wave: the most CTAs (8192^2 M=256: 128 x 128 tiles 69 µs, 256 x 128 72)
    one_wave = [bm for bm in reversed(fits) if ctas[bm] <= num_sms and n >= WS_ONE_WAVE_MIN_N]
    bm = (filled or one_wave or [None])[0]
    if bm is None:
        return None
    tile = dict(block_m=bm, block_n=128, stages=4 if bm == 256 else 6, group_m=8, dq_warps=4, dq_regs=160)
    if bits == 3:  # a block's words are two units (16 KB a slot): two slots, or the CTA's shared memory overflows
        tile |= dict(depth=2)
    return tile | WS_BYTES_TILE if bits == 8 and bm == 256 else tile


def swap_parts(block_m: int) -> tuple[int, int]:
    """A swapped tile's tokens as Gluon's power-of-two tensors: (block_m, 0) or (larger, smaller) summing to it
    (192 = 128 + 64); (0, 0) where block_m is neither, or above 256."""
    if not 0 < block_m <= 256:
        return 0, 0
    hi = 1 << (block_m.bit_length() - 1)
    lo = block_m - hi
    return (hi, lo) if lo == 0 or ((lo & (lo - 1)) == 0 and lo >= 16) else (0, 0)


def swap_block_m(m: int) -> int | None:
    """The fewest tokens of a swapped tile (`swap_parts`) holding m rows, or None above 256."""
    return next((b for b in range(16, 257, 16) if b >= m and swap_parts(b)[0]), None)


def call_output(x: torch.Tensor, tw, bias: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
    """What the Gluon launchers check of a call (x contiguous [M, K], bias [N] in x's dtype), and y [M, N] in x's
    dtype: `out`, or a new tensor."""
    if x.shape[-1] != tw.k or x.dim() != 2 or not x.is_contiguous():
        raise ValueError(f"x must be contiguous [M, {tw.k}], got {tuple(x.shape)} (contiguous: {x.is_contiguous()})")
    if bias is not None and (bias.shape != (tw.n,) or bias.dtype != x.dtype):
        raise ValueError(f"bias must be [{tw.n}] in {x.dtype}, got {tuple(bias.shape)} {bias.dtype}")
    return out if out is not None else torch.empty((x.shape[0], tw.n), device=x.device, dtype=x.dtype)


def row_scales(x_scales: torch.Tensor | None, m: int, dummy: torch.Tensor) -> torch.Tensor:
    """x's per-row scales as the kernels read them (fp32 [M]; FP8 codes in x, `codes_a16`), or `dummy` (a pointer
    the kernel never reads) without them."""
    if x_scales is None:
        return dummy
    if x_scales.numel() != m:
        raise ValueError(f"x_scales must hold one scale a row of x ({m}), got {tuple(x_scales.shape)}")
    return x_scales.reshape(m).float()


def gemm_frag_ws(x: torch.Tensor, tw, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                 block_m: int = 256, block_n: int = 128, stages: int = 4, group_m: int = 8, dq_warps: int = 4,
                 dq_regs: int = 160, x_scales: torch.Tensor | None = None, swap: bool = False,
                 depth: int = WS_WORD_DEPTH, ndec: int = 1) -> torch.Tensor:  # fmt: skip
    """y [M, N] = x [M, K] @ dequantize(W)^T (* x_scales, fp32 [M, 1]: `codes_a16` weights, x holding FP8 codes)
    (+ bias) in x's dtype, for a fragment-layout weight that `frag_ws_weight_why_not` accepts (the caller checks).
    x: contiguous bf16/fp16 [M, K]. swap: the weight tile as the wgmma's A operand (`frag_ws_swap_kernel`: block_n
    64 or 128 weight rows, block_m any multiple of 16 up to 256 tokens). ndec: decoder partitions (1, or 2 taking
    alternate 128-K blocks), each with a TMA ring of `depth` blocks of words (depth - 1 in flight)."""
    key = ("ws", block_m, block_n, stages, group_m, dq_warps, dq_regs, swap, depth, ndec, x.dtype, bias is None,
           x_scales is None)  # fmt: skip
    launch = tw.launches.get(key)
    if launch is None:
        launch = tw.launches[key] = _ws_launch(tw, key)
    y = call_output(x, tw, bias, out)
    m, n = x.shape[0], tw.n
    if swap:
        bm1, bm2 = swap_parts(block_m)
        descs = x_desc(x, bm1), x_desc(x, bm2) if bm2 else x_desc(x, bm1)
    else:
        descs = (x_desc(x, block_m),)
    w_desc, s_desc, z_desc = int_descs(tw, x.dtype, block_n)
    gs = tw.global_scale
    # fmt: off
    launch(
        (cdiv(m, block_m) * cdiv(n, block_n),), *descs, w_desc, s_desc, row_scales(x_scales, m, y),
        gs if gs is not None else y, bias if bias is not None else y, y, m, n, tw.k, tw.planes[0].shape[-1] // 16,
        y.stride(0), z_desc,
    )
    # fmt: on
    return y


def ws_block_steps(bits: int) -> int:
    """The 64-K steps of a decoder block of `bits`-bit codes (the kernel's `frag_ws_kernel._steps`): 1 for 8-bit codes,
    4 for 2-bit ones (a 256-K block), else 2."""
    return 1 if bits == 8 else (4 if bits == 2 else 2)


def ws_min_stages(bits: int, ndec: int) -> int:
    """The fewest ring stages of decoded 64-K slices `gemm_frag_ws` runs with `ndec` decoders of `bits`-bit codes. A
    decoder block is `steps` K steps (`ws_block_steps`), handed over two at a time, and the MMA partition frees a slot
    once the next step's wgmma is issued: one decoder needs a slot more than it hands over at once (else it waits for a
    slot the MMA frees only after the step it has not handed over). Two decoders need more stages than a block has
    steps: decoder p's first step j of a block waits for the release of step j - STAGES by phase parity, which passes as
    well on the release of j - 2 STAGES, and only its previous block's last wait (for j - steps - 1 - STAGES) keeps that
    from happening — found on the H200 (session 36): 2-bit codes with two decoders and 3 stages hung.
    tests/kernels/test_frag_ws_ring.py models both."""
    steps = ws_block_steps(bits)
    return steps + 1 if ndec == 2 else min(steps, 2) + 1


def _ws_launch(tw, key: tuple) -> Launcher:
    """The `Launcher` of `gemm_frag_ws` calls with this key (tile, x's dtype, flags), after the checks they alone
    decide: worked out once per weight (an eager call's host time)."""
    _, block_m, block_n, stages, group_m, dq_warps, dq_regs, swap, depth, ndec, _, no_bias, no_xs = key
    bits = tw.fmt["W_BITS"]
    if ndec not in (1, 2) or depth < 2:
        raise ValueError(f"ndec must be 1 or 2 decoder partitions and depth >= 2 blocks (got {ndec}, {depth})")
    least = ws_min_stages(bits, ndec)
    if stages < least:
        raise ValueError(f"ndec={ndec} with {bits}-bit codes needs stages >= {least}, got stages={stages}: with fewer "
                         "the ring's waits by phase parity hang or rewrite a slice before its wgmma read it "
                         "(`ws_min_stages`)")  # fmt: skip
    kernel, warps, extra = gluon_api()[2], 8, {}
    if swap:
        from anybit.kernels.frag_ws_kernel import frag_ws_swap_kernel as kernel

        bm1, bm2 = swap_parts(block_m)
        if block_n not in (64, 128) or bm1 < 16:
            raise ValueError(f"swap tiles: block_n 64 or 128, block_m a power of two or the sum of two, from 16 up to "
                             f"256 (got {block_n}, {block_m})")  # fmt: skip
        warps, extra = block_n // 16, dict(TWO=bm2 > 0)
    consts = dict(
        BN=block_n, STAGES=stages, GROUP_M=group_m, DQ_WARPS=dq_warps, DQ_REGS=dq_regs,
        SCALE_PER_BLOCK=tw.group_k < tw.k, GB=max(1, tw.group_k // frag_block_k(bits)),
        SIGNED=bool(tw.fmt["W_SIGNED"]), W8=bits == 8, W3=bits == 3, W2=bits == 2, ZP=bool(tw.fmt["ZP"]),
        HAS_BIAS=not no_bias, PANEL=FRAG_PANEL, DEPTH=depth, E2M1=tw.fmt["SCALE_KIND"] if tw.fmt["W_FLOAT"] else 0,
        HAS_GS=tw.global_scale is not None, ROW_SCALES=not no_xs, NDEC=ndec, num_warps=warps, **extra,
    )  # fmt: skip
    # the live arguments: x's descriptor(s), x's row scales, y (standing in for what is absent), bias, M, y's row
    # stride — after one x descriptor, or two (swap)
    d = 1 + swap
    return Launcher(kernel, consts, (*range(d), d + 2, d + 3, d + 4, d + 5, d + 6, d + 10))
