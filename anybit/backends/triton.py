"""The `triton` backend: anybit's own kernels (dense; bf16/fp16 or dynamic FP8 activations)."""

from __future__ import annotations

import dataclasses
import functools
import os
import warnings

import torch

from anybit import settings
from anybit.backends.base import Prepared, Problem
from anybit.backends.blockscaled import blockscaled_gemm, blockscaled_why_not, rowwise_gemm, rowwise_why_not
from anybit.backends.torch_ref import TorchBackend
from anybit.backends.triton_layout import (
    TritonWeight,
    a8_mma,
    codes_a16,
    dense_frag_format,
    frag_format,
    to_triton_layout,
)
from anybit.errors import FallbackWarning, KernelFailure
from anybit.formats.dtypes import FloatType, IntType, exactly_representable
from anybit.formats.scheme import ActMode, ScaleKind, Scheme, ZeroPoint
from anybit.kernels import frag
from anybit.kernels.dequant import cdiv
from anybit.kernels.dequant_a16 import dequantize_a16
from anybit.kernels.frag import frag_tile, gemm_frag, scaled_int4_why_not
from anybit.kernels.frag import sm_count as _sm_count
from anybit.kernels.frag_dequant import dequantize_frag
from anybit.kernels.frag_layout import frag_block_k
from anybit.kernels.frag_rs import (
    RS_BITS,
    RS_SMALL_MIN_M,
    frag_rs_why_not,
    gemm_frag_rs,
    rs_only_tile,
    rs_parts,
    rs_tile,
    ws_int_why_not,
)
from anybit.kernels.frag_rsp import gemm_frag_rsw, rsw_tile
from anybit.kernels.frag_ws import frag_ws_scheme_why_not, frag_ws_weight_why_not, gemm_frag_ws, ws_takes, ws_tile
from anybit.kernels.frag_ws_a8 import (
    RSW_A8_MIN_M,
    WIDE_MIN_M,
    gemm_frag_ws_a8,
    rs_e2m1_why_not,
    rsw_a8_tile,
    ws_a8_route_why_not,
    ws_a8_tile,
    ws_a8_wide_why_not,
)
from anybit.kernels.gemm import GemmConfig, OutOfResources, fewer_stages, gemm_dense
from anybit.kernels.quant_act import quantize_act
from anybit.quant.weights import QuantizedWeight
from anybit.tuning.cache import TuningCache, device_key, problem_key, source_hash

# Above this many rows, dequantizing W once and calling cuBLAS beats dequantizing per M tile inside the
# GEMM (H200, w4a16 8192x8192 M=256: 102 µs vs 180 µs, BENCHMARKS.md history).
DEQUANT_MATMUL_MIN_M = 128
# Fragment-layout (4-bit int A16) weights: the swap-AB kernel up to here, dequantize + cuBLAS above.
FRAG_MAX_M = 64
# FP8-activation weights with 128-K scale blocks (W4A8 g128, FP8-block): the Triton kernels up to here,
# cuBLAS's block-scaled FP8 GEMM above (`anybit.backends.blockscaled`; H200 M=256: 8192² W4A8 g128 61.8 µs
# vs 138.0, FP8-block 41.2 vs 117.1).
BLOCKSCALED_MIN_M = 64
# Up to this many rows the activation quantizer lets its frag GEMM launch at once (PDL's early trigger); above, the
# GEMM launches when it has finished. H200 graphs (tools/probe_toggle.py --switch quant-early): M=16 early 8192^2
# w4a8 19.9 vs 18.1 µs, 8192x28672 51.5 vs 45.5, w4a8-mxfp4 28.4 vs 23.7, 81.6 vs 63.3 (the GEMM's CTAs land on the
# SMs its 16 quantizer CTAs leave free); M=1 early 1-7 % faster, M=64 0-3 %
QUANT_EARLY_MAX_M = 4
# MXFP4 weights under FP8 x above this many rows: e4m3 W a call and cuBLAS's row-wise FP8 GEMM (`rowwise_gemm`);
# weights on the FP8 MMA (`e2m1_a8`) above ROWWISE_MIN_M_A8: H200 graphs, frag kernel vs row-wise (µs, 8192^2 /
# 28672x8192 / 8192x28672): M=192 56.7/173/184 vs 70.8/240/244, M=256 58.3/228/197 vs 64.1/223/213, M=384
# 107/343/353 vs 85/274/288 (`tools/probe_toggle.py --switch rowwise`, session 18); the frag kernel's 128/256-token
# tiles since (session 19, `frag_mma_acc`): M=192 55.8/156.0/153.9, M=256 56.9/147.8/148.5
ROWWISE_MIN_M = 128
ROWWISE_MIN_M_A8 = 256
FP8_DEEP_K_MIN = 2048  # K per split from which FP8 decode tiles go 256 deep (the shortest measured: 8192^2, split 4)


def default_config(m: int, n: int, k: int, weight_bits: int, num_sms: int, interpret: bool) -> GemmConfig:
    """Hopper-first tile choice by M bucket (the tuning cache overrides it where it has data)."""
    if interpret:
        return GemmConfig(block_m=16, block_n=32, block_k=32, split_k=2 if k >= 128 else 1)
    k_tiles = cdiv(k, 128)
    if m <= 16:
        bm, bn, bk, warps, stages = 16, 128, 128, 4, 4
    elif m <= 64:
        bm, bn, bk, warps, stages = 64, 64, 128, 4, 4
    elif m <= 256:
        bm, bn, bk, warps, stages = 64, 128, 64, 4, 4
    else:
        bm, bn, bk, warps, stages = 128, 128, 64, 8, 3
    tiles = cdiv(m, bm) * cdiv(n, bn)
    split = 1
    if m <= 64:
        # fill the machine 1.5 times over, but keep >= 4 K tiles per split (H200 sweep, BENCHMARKS.md)
        while tiles * split < 1.5 * num_sms and split * 2 <= max(1, k_tiles // 4) and split < 16:
            split *= 2
    return GemmConfig(bm, bn, bk, split_k=split, num_warps=warps, num_stages=stages)


def fp8_unsupported(scheme: Scheme) -> str | None:
    """Why the FP8-activation kernel cannot run `scheme` exactly, or None when it can: activations
    quantized dynamically to e4m3/e5m2, weight values exact in that dtype, weight scales that cover
    whole K tiles of >= 32."""
    act, w, g = scheme.act, scheme.weight, scheme.granularity
    if act.dtype.name not in ("e4m3", "e5m2"):
        return f"{act.dtype.name} activations: the Triton kernels take FP8 (e4m3/e5m2) activations"
    if act.mode is ActMode.GROUP and act.group < 32:
        return f"activation groups of {act.group}: FP8 K tiles are >= 32"
    if scheme.zero_point is ZeroPoint.FLOAT:
        return f"a float zero point makes (q - z) inexact in {act.dtype.name}"
    values = IntType(w.bits + 1, signed=True) if scheme.zero_point is ZeroPoint.INT else w
    if not exactly_representable(values, act.dtype):
        what = f"{w} weight values" + (" minus zero points" if scheme.zero_point is ZeroPoint.INT else "")
        return f"{what} are not exact in {act.dtype.name}"
    if g.kind in (ScaleKind.GROUP, ScaleKind.BLOCK) and g.k < 32 and not codes_a16(scheme):
        return f"weight scales every {g.k} along K: the FP8 kernel applies them per K tile of >= 32"
    return None


def a8_config(config: GemmConfig, scheme: Scheme, m: int, k: int, nk: bool, interpret: bool) -> GemmConfig:
    """FP8 activations: K tiles of 128 (the FP8 MMA's natural depth) within one weight group and one
    activation group; large M gets 128x256 tiles when the weight needs no decoding and no per-tile
    scaling."""
    g, act = scheme.granularity, scheme.act
    block_k = config.block_k if interpret else 128
    if g.kind in (ScaleKind.GROUP, ScaleKind.BLOCK):
        block_k = min(block_k, g.k)
    if act.mode is ActMode.GROUP:
        block_k = min(block_k, act.group)
    config = dataclasses.replace(config, block_k=max(32, block_k))
    per_tile_scales = act.mode is ActMode.GROUP or g.kind in (ScaleKind.GROUP, ScaleKind.BLOCK)
    if not interpret and m > 64 and nk and not per_tile_scales:
        # the MMA accumulates the whole K range: a 128x256 fp32 accumulator fits 8 warps (sm_90a: 254
        # registers, no spills); per-tile scaling needs a second tile of partials, so it stays 128x128
        config = dataclasses.replace(config, block_m=128, block_n=256, num_warps=8, num_stages=3)
    elif not interpret and m <= 16 and nk and not per_tile_scales and k // config.split_k >= FP8_DEEP_K_MIN:
        # decode on FP8 weights read as stored: 256-deep K tiles of 3 stages, twice the bytes in flight a CTA
        # (H200 graphs, warm, tools/sweep_gemm.py: 28672x8192 M=1 63.4 -> 61.3 µs, 8192x28672 70.0 -> 67.5, 8192^2 even)
        config = dataclasses.replace(config, block_k=256, num_stages=3)
    return config


def pick_config(
    m: int, n: int, k: int, scheme: Scheme, sms: int, interpret: bool, nk: bool, a8: bool | None = None,
    frag_layout: bool = True,
) -> GemmConfig:  # fmt: skip
    """The tile for one call (cached per prepared weight and M: picking must not cost host time). a8: the weight
    runs on the FP8 MMA (default `a8_mma(scheme)`; `TritonWeight.mma_a8` where the weight's data decides).
    frag_layout: the weight is in the fragment layout (`TritonWeight.frag`; the bit-plane kernel takes no 48-token
    tile)."""
    if (dense_frag_format if frag_layout else frag_format)(scheme):  # A16 above FRAG_MAX_M: only by `frag_mid`
        a8 = a8_mma(scheme) if a8 is None else a8
        float_codes = isinstance(scheme.weight, FloatType)
        # e2m1 on the FP8 MMA accumulating the whole K (`frag.A8_MMA_ACC`) takes the 128/256-token tiles too
        wide_a8 = a8 and float_codes and frag.A8_MMA_ACC
        t = frag_tile(m, n, k, sms, interpret, scheme.weight_bits, mid=m > FRAG_MAX_M and (not a8 or wide_a8),
                      float_codes=float_codes, a8=wide_a8,
                      two=frag_layout and not a8 and scheme.weight_bits == 4, fp8_mma=a8)  # fmt: skip
        block_k = frag_block_k(scheme.weight_bits)
        return GemmConfig(t["block_m"], t["block_n"], block_k, t["split_k"], num_warps=t["num_warps"],
                          num_stages=t["num_stages"], maxnreg=t.get("maxnreg"))  # fmt: skip
    config = default_config(m, n, k, scheme.weight_bits, sms, interpret)
    if a8_mma(scheme):
        config = a8_config(config, scheme, m, k, nk, interpret)
    return config


FRAG_MID_LONG_K = 2  # 128 < M <= 256: the frag kernel only where K >= this x N (H200: 8192x28672, 4096x14336 win)
# 128 < M <= 256: the `frag_mid_kind`s whose 256-token tiles run, with the least K / N they take. e2m1 on every
# shape: H200 graphs, `tools/probe_toggle.py --switch mid256-e2m1`, MXFP4 / NVFP4 M=256 (µs, large-M path -> these):
# 8192^2 96.0 -> 76.4 / 99.8 -> 82.6, 28672x8192 333.7 -> 239.4 / 346.5 -> 253.9, 8192x28672 325.7 -> 228.3 /
# 338.8 -> 243.0; M=192 0.86-0.95x
FRAG_MID_256 = {"int4": FRAG_MID_LONG_K, "e2m1": 0}


def frag_mid_kind(scheme: Scheme, dtype: torch.dtype) -> str | None:
    """Which A16 frag weights the frag kernel's 128/256-token tiles take (`frag_mid`): "int4" — 4-bit ints scaled on
    the decoded weights (`scaled_int4_why_not`) —, "e2m1" — groups shorter than the 128-K block, scaled in
    registers (NVFP4, MXFP4) — or "int8" — 8-bit ints with channel scales and no zero point: formats whose K loop
    keeps one accumulator (8-bit groups scale a second tile each block: not measured); else None. `codes_a16`
    schemes (FP8 codes on the A16 kernels) as their weights' A16 scheme."""
    if a8_mma(scheme):
        return None
    g, w = scheme.granularity, scheme.weight
    if isinstance(w, FloatType) and w.bits == 4:
        return "e2m1" if g.kind is ScaleKind.GROUP and g.k < 128 and frag_format(scheme) else None
    if isinstance(w, IntType) and w.bits == 8:
        plain = g.kind is ScaleKind.CHANNEL and scheme.zero_point is ZeroPoint.NONE
        return "int8" if plain and frag_format(scheme) else None
    return "int4" if scaled_int4_why_not(scheme, dtype) is None else None


def frag_mid_rows(kind: str | None, m: int, n: int, k: int) -> bool:
    """The M (and shape) part of `frag_mid`: FRAG_MAX_M < M <= `settings.frag_mid_max_m()` (default 256), 128-token
    tiles up to 128 rows; 129-256 rows for the kinds of FRAG_MID_256 (256-token tiles; "int4" with K >= FRAG_MID_LONG_K
    x N — H200 graphs M=256: 4096x14336 91 -> 68 µs, 8192x28672 217 -> 206; on square and tall shapes the
    warp-specialised kernel or dequantize + cuBLAS stay faster)."""
    if kind is None or not FRAG_MAX_M < m <= settings.frag_mid_max_m():
        return False
    return m <= 128 or (kind in FRAG_MID_256 and k >= FRAG_MID_256[kind] * n)


# The `frag_mid_kind`s whose calls the warp-specialised kernel (`frag_ws`) takes where it runs and `ws_takes` its
# tile: above 128 rows any, at 65-128 a swapped one. e2m1, H200 graphs (tools/probe_ws.py), 256-token tiles -> ws, µs,
# MXFP4 M=192: 8192^2 82.3 -> 53.9 (swapped), 28672x8192 281.7 -> 177.3, 8192x28672 260.3 -> 183.8 (swapped); M=256:
# 76.0 -> 54.4, 244.4 -> 195.3, 226.1 -> 181.0 (NVFP4 alike); 4-bit ints with K >= 2N (the 256-token tiles' shapes)
# 8192x28672 M=192 254.9 -> 188.7, and at M=128 on 8192^2 52.8 -> 42.4 (`frag_ws.swap_tile`)
WS_OVER_MID = ("e2m1", "int4")
# ... and those that yield to the register-operand kernel only (`rs_tile` takes 8-bit codes at 65-256 rows; the
# swapped warp-specialised tiles were no faster than the frag kernel's there, session 26)
RS_OVER_MID = ("int8",)


def ws_over_mid(kind: str | None, m: int) -> bool:
    """Whether a `frag_mid` call of this kind and M may yield to the warp-specialised kernel or the register-operand
    kernel (`ws_takes` of `ws_route_tile`'s tile)."""
    over = kind in WS_OVER_MID or (kind in RS_OVER_MID and settings.frag_rs())
    return over and FRAG_MAX_M < m <= settings.frag_ws_max_m()


def ws_route_tile(
    m: int, n: int, k: int, num_sms: int, bits: int = 4, ws: bool = True, plain: bool = False
) -> dict | None:
    """The warp-specialised kernel's tile for an M-row call (`ws_tile`), or where that kernel would run the
    register-operand kernel's where it is faster (`rs_tile`: 65-512 rows, also where the warp-specialised kernel would
    not run — its CTAs would not fill a wave on 4096- and 6144-row weights; 257-384 rows that its tiles would overfill
    as two of its launches, `rs_parts`; ANYBIT_FRAG_RS=0 turns it off). At most FRAG_MAX_M rows (the frag kernel's
    decode path) only the register-operand kernel's (`rs_tile`: 33-64 rows of weights whose 64-row tiles fill one
    wave, or split in two along K where two CTAs a tile do), else None. bits: the weight's code width (the
    register-operand kernel only for `frag_rs.RS_BITS`, `rs_tile`'s rule for them; the warp-specialised kernel's,
    `ws_tile`). ws=False: a weight only the register-operand kernel runs (`frag_rs.rs_int_why_not`: zero points, 3-bit
    codes, scales of the other 16-bit type) — its tile (`rs_only_tile`) or None; plain (with ws=False): such a weight
    that the warp-specialised kernel's row-major tiles also run (`frag_rs.ws_int_why_not`) — above what
    `rs_only_tile` takes, `ws_tile`'s row-major tile."""
    rs = bits in RS_BITS and settings.frag_rs()
    tile = (rs_tile if ws else rs_only_tile)(m, n, k, num_sms, bits) if rs else None
    one_tile = tile is not None and "split_k" not in tile  # (the one-tile kernel's, or none at 129-192 rows)
    if rs and (one_tile or m > 128) and settings.rs_wide():  # its wide form where `rsw_tile` says
        tile = rsw_tile(m, n, k, num_sms, bits) or tile
    if tile is None and rs and settings.frag_rs_parts():
        tile = rs_parts(m, n, k, num_sms, bits)
    if tile is not None or m <= FRAG_MAX_M or not (ws or plain):
        return tile
    tile = ws_tile(m, n, num_sms, k, bits)
    return None if tile is not None and tile.get("swap") and not ws else tile


def _rs_gemm(
    x: torch.Tensor, tw: TritonWeight, bias: torch.Tensor | None, x_scales: torch.Tensor | None, tile: dict,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The register-operand kernel on an `rs_tile` tile, or on an `rs_parts` one: each part's rows of x (and of its
    row scales) into the same rows of one output."""
    if "parts" not in tile:
        if tile.get("wide"):  # `rsw_tile`: the wide persistent stream-K form
            return gemm_frag_rsw(x, tw, bias, out=out, x_scales=x_scales, block_m=tile["block_m"])
        return gemm_frag_rs(x, tw, bias, out=out, x_scales=x_scales, **{a: v for a, v in tile.items() if a != "rs"})
    y = torch.empty((x.shape[0], tw.n), device=x.device, dtype=x.dtype) if out is None else out
    row = 0
    for rows, part in tile["parts"]:
        end = row + rows
        _rs_gemm(x[row:end], tw, bias, x_scales[row:end] if x_scales is not None else None, part, y[row:end])
        row = end
    return y


def frag_mid(scheme: Scheme, m: int, n: int, k: int, dtype: torch.dtype, device: torch.device | None = None) -> bool:
    """Whether an A16 call of a frag weight [N, K] with M rows runs the frag kernel's 128/256-token tiles (`frag_tile`
    mid) rather than the large-M paths (H200 M=128 under graphs: 8192^2 65 -> 45 µs, 8192x28672 219 -> 115,
    NVFP4 8192^2 99 -> 53). With `device`: not where the warp-specialised kernel takes the call (`ws_over_mid`; its
    e2m1 weights' scales must also fold exactly, which only the prepared weight tells)."""
    kind = frag_mid_kind(scheme, dtype)
    if not frag_mid_rows(kind, m, n, k):
        return False
    if device is None or not ws_over_mid(kind, m):
        return True
    return frag_ws_scheme_why_not(scheme, k, dtype, device, n) is not None or not ws_takes(
        ws_route_tile(m, n, k, _sm_count(device), scheme.weight.bits), m
    )


def tuning_cache(device: torch.device) -> TuningCache:
    """The tuning cache of the Triton GEMM on `device` (user cache over the shipped table)."""
    return _tuning_cache_at(device, settings.load().cache_dir)


def _triton_errors() -> tuple[type[BaseException], ...]:
    """Triton's compile/launch failures (its error base class where this Triton has one)."""
    import triton.compiler.errors as ce
    import triton.runtime.errors as re_

    names = [getattr(ce, "CompilationError", None), getattr(re_, "OutOfResources", None)]
    names += [getattr(re_, "PTXASError", None), getattr(re_, "TritonError", None)]
    return tuple(e for e in names if e is not None)


def gemm_source_hash() -> str:
    """The source hash the tuning tables of the dense GEMM are filed under: its kernels, and the frag
    kernel's helpers (its loop lives there, so a change to them re-tunes too)."""
    from anybit.kernels import dequant, frag, frag_decode
    from anybit.kernels.gemm import _gemm_kernel
    from anybit.kernels.quant_act import _quant_act_kernel

    kernels = (_gemm_kernel, _quant_act_kernel, frag._frag_gemm_kernel, frag.frag_range, frag.frag_range_subs,
               frag.frag_range_two, frag.frag_decode16, frag.code_offset, frag.frag_epilogue, frag.frag_row_words,
               frag.frag_block_dot, frag.frag_quarter_dots, frag.frag_byte_dot, frag.block_meta, frag.block_sums,
               frag_decode.minus_rows,
               frag_decode.times_groups, frag_decode.unpack_pairs, frag_decode.unpack_pairs_minus,
               frag_decode.unpack_pairs_minus_rows, frag_decode.unpack_pairs2, frag_decode.unpack_bytes,
               frag_decode.unpack_e2m1, frag_decode.unpack_a8, frag_decode.a8_rows, frag_decode.unpack_e2m1_a8,
               frag_decode._table_bytes, dequant.decode_scale, dequant.decode_float)  # fmt: skip
    return source_hash(*kernels)


@functools.cache
def _tuning_cache_at(device: torch.device, cache_dir: str) -> TuningCache:
    props = torch.cuda.get_device_properties(device) if device.type == "cuda" else None
    root = os.path.join(cache_dir, "tuning")
    return TuningCache("gemm", gemm_source_hash(), device_key(props), root)


@functools.cache
def _major(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def pdl_launch(device: torch.device) -> bool:
    """On an sm_90+ GPU (not the interpreter) unless ANYBIT_PDL=0: frag GEMMs launch as programmatic dependents of
    the kernel before them (`gemm_frag(pdl=True)`: it waits for that kernel before any read), and the FP8
    activation quantizer lets its GEMM launch at once (`quantize_act(pdl=True)`; dense calls up to
    `QUANT_EARLY_MAX_M` rows)."""
    return device.type == "cuda" and settings.pdl() and not settings.triton_interpret() and _major(device) >= 9


def quant_early(m: int, device: torch.device) -> bool:
    """Whether the activation quantizer of an M-row dense frag call triggers its GEMM's early launch
    (`QUANT_EARLY_MAX_M`)."""
    return m <= QUANT_EARLY_MAX_M and pdl_launch(device)


class _Workspace:
    """Split-K partials and tile counters, per device, grown on demand and reused by every call."""

    def __init__(self):
        self._bufs: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        ws, cnt = self._bufs.get(device, (None, None))
        if ws is None or ws.numel() < floats:
            ws = torch.empty(max(floats, 1 << 20), dtype=torch.float32, device=device)
        if cnt is None or cnt.numel() < tiles:
            cnt = torch.zeros(max(tiles, 4096), dtype=torch.int32, device=device)
        self._bufs[device] = (ws, cnt)
        return ws, cnt


class TritonBackend:
    name = "triton"

    def __init__(self):
        self._workspace = _Workspace()

    def workspace(self, device: torch.device, floats: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared split-K workspace (fp32) and tile counters (int32, zero between launches)."""
        return self._workspace.get(device, floats, tiles)

    def supports(self, problem: Problem) -> tuple[bool, str]:
        s = problem.scheme
        if s.act.quantized:
            why = fp8_unsupported(s)
            if why:
                return False, why
        if problem.act_dtype is not None and problem.act_dtype not in (torch.float16, torch.bfloat16):
            return False, f"activations must be bf16 or fp16, got {problem.act_dtype}"
        if problem.device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(problem.device)
            if major < 8:
                return False, f"needs an SM80+ GPU, this one is sm_{major}{minor}"
            if s.act.quantized and (major, minor) < (8, 9):
                return False, f"FP8 activations need FP8 tensor cores (sm_89+), this GPU is sm_{major}{minor}"
            return True, f"Triton kernel for sm_{major}{minor}" + (" (FP8 activations)" if s.act.quantized else "")
        if settings.load().triton_interpret:
            return True, "Triton interpreter (TRITON_INTERPRET=1) on the CPU"
        return False, f"device {problem.device.type} needs a CUDA GPU or TRITON_INTERPRET=1"

    def prepare(self, qweight: QuantizedWeight) -> Prepared:
        return Prepared(self.name, qweight, to_triton_layout(qweight, allow_int4_codes=True, allow_frag3=True))

    def gemm(
        self, x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None = None, config: GemmConfig | None = None
    ) -> torch.Tensor:
        try:
            return self._gemm(x, prepared, bias, config)
        except _triton_errors() as e:
            tw = prepared.data
            raise KernelFailure(f"Triton kernel for {tw.scheme} N={tw.n} K={tw.k} M={x.numel() // tw.k}: {e}") from e

    def _gemm(
        self, x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None, config: GemmConfig | None
    ) -> torch.Tensor:
        tw: TritonWeight = prepared.data
        if x.dtype not in (torch.float16, torch.bfloat16):
            # fp32 activations (e.g. a model left in fp32): the kernels' tensor cores would round them to
            # TF32 or bf16, so the exact path answers instead
            return TorchBackend().gemm(x, prepared, bias)
        x2 = x if x.dim() == 2 else x.reshape(-1, tw.k)
        y = self._gemm2d(x2 if x2.stride(-1) == 1 else x2.contiguous(), prepared, bias, config)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], tw.n)

    def _gemm2d(
        self, x: torch.Tensor, prepared: Prepared, bias: torch.Tensor | None, config: GemmConfig | None
    ) -> torch.Tensor:
        """`_gemm` of a bf16/fp16 x [M, K] (last dim contiguous) -> y [M, N]: the route and the launch."""
        tw: TritonWeight = prepared.data
        m = x.shape[0]
        act = tw.scheme.act
        a8 = tw.mma_a8
        x_scales = None
        rowwise_min = ROWWISE_MIN_M_A8 if tw.e2m1_a8 else ROWWISE_MIN_M
        if config is None and tw.e2m1_a8 and m >= RSW_A8_MIN_M and x.is_cuda:  # MXFP4: the register-operand
            y = self._ws_a8(x, tw, bias)  # kernels where their rules take it (`_ws_a8`)
            if y is not None:
                return y
        if config is None and m > rowwise_min and rowwise_why_not(tw, x.device, x.dtype) is None:
            return rowwise_gemm(x, tw, bias)
        if config is None and tw.a16 is not None and m > settings.frag_ws_max_m() and self._blockscaled(tw, x):
            return blockscaled_gemm(x, tw, bias)  # int4 W4A8 as codes: above the A16 kernels
        if tw.codes_a16:  # x's FP8 codes in x's dtype for the A16 kernels, its scales after the MMA
            static = self._static_scale(tw, prepared) if act.mode is ActMode.STATIC else None
            x, x_scales = quantize_act(x, act, static, pdl=quant_early(m, x.device), codes_dtype=x.dtype)
        large = (tw.frag and m > FRAG_MAX_M) or (x.is_cuda and m > DEQUANT_MATMUL_MIN_M)
        tile = self._ws_tile(x, tw) if tw.frag and RS_SMALL_MIN_M < m and x.is_cuda else None  # (once a call)
        # 33-64 rows of some weights: the register-operand kernel (`rs_tile`), through the large-M path's launcher
        large = large or (tile is not None and "rs" in tile)
        if config is None and large and not a8 and not (tw.frag and self._mid(tw, x, tile)):
            return self.dequant_matmul(x, tw, bias, x_scales, tile)
        if config is None and a8 and tw.frag and not tw.e2m1_a8 and m >= RSW_A8_MIN_M and x.is_cuda:  # (33: rsw)
            y = self._ws_a8(x, tw, bias)
            if y is not None:
                return y
        if config is None and m > BLOCKSCALED_MIN_M and self._blockscaled(tw, x):
            return blockscaled_gemm(x, tw, bias)
        planned = config is None
        if planned:
            config = tw.configs.get(m)
            if config is None:
                config = tw.configs[m] = self._tuned_config(x, tw, bias)
        while True:
            try:
                return self._launch(x, tw, prepared, bias, config, x_scales)
            except OutOfResources as e:
                config = fewer_stages(e, config)
                if planned:  # this GPU's tile from now on (sm_86/89: 99 KB of shared memory per block)
                    tw.configs[m] = config

    @staticmethod
    def _blockscaled(tw: TritonWeight, x: torch.Tensor) -> bool:
        """Whether cuBLAS's block-scaled FP8 GEMM runs this weight for x (asked only where a route would take it)."""
        return blockscaled_why_not(tw.blockscaled, x.device, x.dtype) is None

    @staticmethod
    def _static_scale(tw: TritonWeight, prepared: Prepared) -> torch.Tensor:
        return tw.input_scale if tw.input_scale is not None else prepared.qweight.require_input_scale()

    def _launch(
        self, x2: torch.Tensor, tw: TritonWeight, prepared: Prepared, bias: torch.Tensor | None, config: GemmConfig,
        x_scales: torch.Tensor | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """One launch of the Triton GEMM with this tile: [M, N] (FP8 schemes quantize x first; `codes_a16` weights
        come with x's codes and `x_scales`)."""
        m, act = x2.shape[0], tw.scheme.act
        x_sums, x_group, out_dtype = None, 0, None
        pdl = tw.frag and pdl_launch(x2.device)
        if tw.mma_a8:
            out_dtype = x2.dtype
            static = self._static_scale(tw, prepared) if act.mode is ActMode.STATIC else None
            early = tw.frag and quant_early(m, x2.device)
            x2, x_scales, *sums = quantize_act(x2, act, static, block_sums=tw.takes_sums, pdl=early)
            x_sums = sums[0] if sums else None
            x_group = act.group if act.mode is ActMode.GROUP else 0
        ws = cnt = None
        if config.split_k > 1:
            tiles = 2 * cdiv(m, config.block_m) * cdiv(tw.n, config.block_n)  # a counter each part of a 48-token tile
            ws, cnt = self._workspace.get(x2.device, config.split_k * m * tw.n, tiles)
        if tw.frag:  # the swap-AB kernel; its K block is the layout's 128
            c = config
            return gemm_frag(x2, tw, bias, block_m=c.block_m, block_n=c.block_n, split_k=c.split_k,
                             num_warps=c.num_warps, num_stages=c.num_stages, workspace=ws, counters=cnt,
                             x_scales=x_scales, x_sums=x_sums, out_dtype=out_dtype, pdl=pdl,
                             maxnreg=c.maxnreg)  # fmt: skip
        return gemm_dense(x2, tw, bias, config=config, workspace=ws, counters=cnt, x_scales=x_scales,
                          x_group=x_group, out_dtype=out_dtype)  # fmt: skip

    def _tuned_config(self, x: torch.Tensor, tw: TritonWeight, bias: torch.Tensor | None) -> GemmConfig:
        """The tuning cache's tile for this problem on this device, else (ANYBIT_AUTOTUNE=1, GPU, not
        capturing a graph) the fastest measured candidate, stored; else the default rule's."""
        m, cuda = x.shape[0], x.is_cuda
        sms = _sm_count(x.device) if cuda else 1
        default = pick_config(m, tw.n, tw.k, tw.kernel_scheme, sms, not cuda, tw.nk, tw.mma_a8, tw.frag)
        cache = tuning_cache(x.device)
        key = problem_key(tw.kernel_scheme, tw.n, tw.k, m, x.dtype)
        entry = cache.get(key)
        if entry is not None:
            try:
                return GemmConfig(**entry["config"])
            except TypeError:  # written by another layout of GemmConfig: fall through and re-tune
                pass
        if not (cuda and settings.load().autotune) or torch.cuda.is_current_stream_capturing():
            return default
        from anybit.tuning.autotune import autotune, candidates, cuda_time_us

        def time_us(c: GemmConfig) -> float:
            tw.configs[m] = c
            return cuda_time_us(lambda: self.gemm(x, Prepared(self.name, None, tw), bias), graph=m <= 64)

        best, us = autotune(candidates(default, tw.frag), time_us)
        cache.put(key, dataclasses.asdict(best), us)
        return best

    def _mid(self, tw: TritonWeight, x: torch.Tensor, tile: dict | None) -> bool:
        """`frag_mid` for this weight and call (its format's part decided once per dtype; where the call yields to
        the warp-specialised kernel, `ws_over_mid`, whether that runs this weight: its `_ws_tile`, `tile`)."""
        m, key = x.shape[0], ("mid", x.dtype)
        if key not in tw.ws_ok:
            tw.ws_ok[key] = frag_mid_kind(tw.kernel_scheme, x.dtype)
        kind = tw.ws_ok[key]
        if not frag_mid_rows(kind, m, tw.n, tw.k):
            return False
        return not (ws_over_mid(kind, m) and x.is_cuda and ws_takes(tile, m))

    @staticmethod
    def _ws_tile(x: torch.Tensor, tw: TritonWeight) -> dict | None:
        """`gemm_frag_ws`'s (or `gemm_frag_rs`'s, `ws_route_tile`) tile for this large-M call of a frag weight, or
        None: dequantize + cuBLAS (the kernel's availability is decided once per weight and dtype, the tile once per
        M: `_mid` and `dequant_matmul` both ask for it)."""
        m = x.shape[0]
        if m > settings.frag_ws_max_m():
            return None
        ok = tw.ws_ok.get(x.dtype)
        if ok is None:  # which kernels run this weight: (warp-specialised, register-operand, only the former's
            # row-major tiles — `ws_int_why_not`)
            ws = frag_ws_weight_why_not(tw, x.dtype, x.device) is None
            rs = ws or frag_rs_why_not(tw, x.dtype, x.device) is None
            plain = not ws and rs and ws_int_why_not(tw.kernel_scheme, tw.k, tw.n, x.dtype, x.device) is None
            ok = tw.ws_ok[x.dtype] = (ws, rs, plain)
        if not any(ok):  # (a kernel failure stores False: none from then on)
            return None
        key = ("tile", m, x.dtype)
        if key not in tw.ws_ok:
            tw.ws_ok[key] = ws_route_tile(m, tw.n, tw.k, _sm_count(x.device), tw.fmt["W_BITS"], ok[0], ok[2])
        return tw.ws_ok[key]

    @staticmethod
    def _ws_a8(x: torch.Tensor, tw: TritonWeight, bias: torch.Tensor | None) -> torch.Tensor | None:
        """A W4A8 call through `gemm_frag_ws_a8` where `ws_a8_plan`'s rule takes it (the weight's part decided once),
        or at 33-256 rows its register-operand kernel's stream-K form where `rsw_a8_tile` does; MXFP4 weights under
        e4m3 x (`TritonWeight.e2m1_a8`) only on the register-operand kernels, where `rsw_a8_tile` or ANYBIT_FRAG_RS_A8
        takes the call and `rs_e2m1_why_not` the weight; else None: the other routes. A kernel failure warns once and
        leaves this weight on them."""
        m, sms = x.shape[0], _sm_count(x.device)
        tile = rsw_a8_tile(m, tw.n, tw.k, sms, tw.e2m1_a8)  # (the stream-K form at 33-256 rows)
        if tw.e2m1_a8:  # MXFP4: the register-operand kernels alone, each where its rule takes the call
            if tile is None and settings.frag_rs_a8() and WIDE_MIN_M < m <= settings.frag_ws_a8_wide_max_m():
                tile = ws_a8_tile(m, tw.n, sms, wide=True)
            if tile is None:
                return None
            if tw.ws_ok.get("a8-e2m1") is None:
                tw.ws_ok["a8-e2m1"] = rs_e2m1_why_not(tw, x.device) is None
            return TritonBackend._ws_a8_run(x, tw, bias, tile, "a8-e2m1") if tw.ws_ok["a8-e2m1"] else None
        narrow = tile is None and m <= settings.frag_ws_a8_max_m()
        if m <= FRAG_MAX_M and tile is None:
            return None
        if tile is None and not narrow and not WIDE_MIN_M < m <= settings.frag_ws_a8_wide_max_m():
            return None
        key = "a8" if narrow else "a8-wide"  # (the stream-K form asks what the wide kernels ask)
        ok = tw.ws_ok.get(key)
        if ok is None:
            why = (ws_a8_route_why_not(tw.scheme, tw.k, tw.n, x.device) if narrow else
                   ws_a8_wide_why_not(tw.scheme, tw.k, tw.n, x.device, tw.rescale))  # fmt: skip
            ok = tw.ws_ok[key] = why is None
        if not ok:
            return None
        tile = tile or ws_a8_tile(m, tw.n, sms, wide=not narrow)
        return TritonBackend._ws_a8_run(x, tw, bias, tile, key)

    @staticmethod
    def _ws_a8_run(x: torch.Tensor, tw: TritonWeight, bias: torch.Tensor | None, tile: dict, key: str):
        """`gemm_frag_ws_a8` with `tile`; a kernel failure warns once and leaves this weight's `key` off it (None:
        the caller's other route)."""
        try:
            return gemm_frag_ws_a8(x if x.is_contiguous() else x.contiguous(), tw, bias, **tile)
        except _triton_errors() as e:
            tw.ws_ok[key] = False
            warnings.warn(f"frag_ws_a8 kernel failed for {tw.scheme} N={tw.n} K={tw.k}, using the other "
                          f"route: {type(e).__name__}: {e}", FallbackWarning, stacklevel=5)  # fmt: skip
            return None

    def dequant_matmul(
        self, x: torch.Tensor, tw: TritonWeight, bias: torch.Tensor | None, x_scales: torch.Tensor | None = None,
        tile: dict | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Large-M path: Triton dequantizes W to x's dtype once, cuBLAS multiplies — or, for 4-bit integer and
        e2m1 frag weights on Hopper up to `settings.frag_ws_max_m()` rows, the warp-specialised kernel that
        decodes W into shared memory per tile (`anybit.kernels.frag_ws`; no dequantize pass) or the register-operand
        kernel (`anybit.kernels.frag_rs`, `ws_route_tile`; also the 33-64-row calls it takes). x_scales
        (`codes_a16`: x holds FP8 codes): each row of the product times its scale, then the bias. tile: the call's
        `_ws_tile`, worked out by the caller."""
        if tw.frag:  # (`codes_a16` weights, the only ones with x_scales, are frag weights)
            if tile is not None:
                try:
                    aligned = x.is_contiguous() and x.data_ptr() % 16 == 0  # TMA reads whole rows from 16 bytes on
                    xc = x if aligned else x.clone(memory_format=torch.contiguous_format)
                    if tile.get("rs"):  # `rs_tile` / `rs_parts`: the register-operand kernel
                        return _rs_gemm(xc, tw, bias, x_scales, tile)
                    return gemm_frag_ws(xc, tw, bias, x_scales=x_scales, **tile)
                except _triton_errors() as e:  # loud, and this weight keeps dequantize + cuBLAS from now on
                    tw.ws_ok[x.dtype] = (False, False, False)
                    warnings.warn(f"frag_ws kernel failed for {tw.scheme} N={tw.n} K={tw.k}, using dequantize + "
                                  f"cuBLAS: {type(e).__name__}: {e}", FallbackWarning, stacklevel=3)  # fmt: skip
            w = dequantize_frag(tw, dtype=x.dtype)
            if x_scales is None:
                return torch.nn.functional.linear(x, w, bias)
            y = torch.nn.functional.linear(x, w)
            y.mul_(x_scales)  # in fp32, one rounding
            return y.add_(bias) if bias is not None else y
        y = x @ dequantize_a16(tw, dtype=x.dtype)
        return y + bias if bias is not None else y
