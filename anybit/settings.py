"""Every ANYBIT_* environment variable, typed and documented. Read here, nowhere else."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    backends: tuple[str, ...]
    """ANYBIT_BACKENDS: comma-separated backend order for "auto" (default: triton,humming,torch)."""
    disabled_backends: frozenset[str]
    """ANYBIT_DISABLED_BACKENDS: comma-separated backends "auto" never picks."""
    triton_interpret: bool
    """TRITON_INTERPRET=1 (Triton's own variable): run Triton kernels in the CPU interpreter."""
    cache_dir: str
    """ANYBIT_CACHE_DIR: where tuning results live (default: ~/.cache/anybit)."""
    autotune: bool
    """ANYBIT_AUTOTUNE=1: on a GPU, time tile candidates on the first call of a new problem (outside
    CUDA-graph capture) and keep the fastest in the tuning cache; default off: cached or default tiles."""
    multi_backend: bool
    """ANYBIT_MULTI_BACKEND=1: where the tuning cache measured another usable backend faster for a call's
    M bucket (e.g. humming at decode), "auto" holds the weight in that backend's layout too and sends
    those calls there. Costs the weight's memory once more per extra backend; default off."""
    pdl: bool
    """ANYBIT_PDL (default 1; 0 turns it off), sm_90+: frag GEMMs, dense and grouped (MoE), are launched with
    programmatic dependent launch and wait (griddepcontrol.wait) before they read anything, so their launch
    overlaps the end of the kernel before them; the FP8 activation quantizer lets its GEMM launch at once
    (griddepcontrol.launch_dependents; dense calls up to 4 rows only, `QUANT_EARLY_MAX_M`). H200, CUDA graphs
    of 20 calls: w4a16 0.2-0.4 µs per call faster (8192² M=1 15.3 -> 14.9), W4A8 (quantizer + GEMM) 0.5-1.5 µs
    (6144x4096 M=1 11.2 -> 10.1)."""
    frag_ws_max_m: int
    """ANYBIT_FRAG_WS_MAX_M (default 1024; 0 turns it off), Hopper: 4-bit integer and e2m1 (NVFP4, MXFP4; also under
    FP8 x as its codes) A16 weights — 8-bit integers up to `frag_ws.WS_BYTES_MAX_M` rows — with M from 65 to this many
    rows run the warp-specialised Gluon kernel
    (`anybit.kernels.frag_ws`) instead of dequantize + cuBLAS — and instead of the frag kernel's mid-M tiles where
    `frag_ws.ws_takes` says so (above 128 rows; at 65-128 its swapped tiles). H200, same run: W4A16 28672x8192 M=256
    342 -> 214 µs, M=1024 775 -> 722; MXFP4 M=1024 822 -> 710, 8192^2 M=256 70.5 -> 54.4 (swapped); from ~2048 rows
    the dequantize pass is amortised and cuBLAS's faster main loop wins (28672x8192 M=2048 1378 vs 1543, M=4096 2895
    vs 3152)."""
    frag_mid_max_m: int
    """ANYBIT_FRAG_MID_MAX_M (default 256; 64 or less turns it off): A16 weights of 4-bit integers with scales in x's
    dtype, NVFP4, MXFP4 and 8-bit integers with channel scales (`anybit.backends.triton.frag_mid`) with M from 65 to
    this many rows (above 128: 4-bit integers with K >= 2N, NVFP4 and MXFP4) run the frag kernel's 128/256-token tiles
    (`frag_tile`) instead of the warp-specialised kernel or dequantize + cuBLAS, where that kernel does not take them
    (`frag_ws.ws_takes`). H200, CUDA graphs, M=128: 8192^2 65 -> 45 µs, 8192x28672 215 -> 114, 4096x14336 82 -> 40,
    W8A16 8192^2 102 -> 49; M=256 4096x14336 91 -> 68."""
    frag_ws_a8_max_m: int
    """ANYBIT_FRAG_WS_A8_MAX_M (default 256; 0 turns it off), Hopper: W4A8 (4-bit integer weights, e4m3 x per token)
    calls with M from 65 to this many rows and N >= 8192 run the warp-specialised Gluon kernel
    (`anybit.kernels.frag_ws_a8`) instead of the weight's codes pass + cuBLAS's block-scaled GEMM. H200, CUDA graphs:
    28672x8192 M=128 183 -> 101 µs, M=256 242 -> 192; from M=512 they tie and above the route wins (M=1024 654 vs
    581)."""
    frag_ws_a8_wide_max_m: int
    """ANYBIT_FRAG_WS_A8_WIDE_MAX_M (default 65536 with `frag_rs_a8` on, else 1536; 0 turns it off), Hopper: W4A8
    calls of more rows than 512 (and than `frag_ws_a8_max_m`) and at most this many run the wide kernels — the
    register-operand one (`frag_rs_a8`, the default) or the warp-specialised one (`frag_ws_a8_wide_kernel`: 128 weight
    rows by 256 tokens a tile, the accumulator rescaled per block) — where the weight's scales allow it
    (`TritonWeight.rescale`, or channel scales), instead of the codes pass + cuBLAS's block-scaled GEMM. The
    warp-specialised kernel, H200, CUDA graphs, at M=1024 faster on all four shapes measured (8192^2 180 -> 163 µs,
    7168^2 156 -> 142, 28672x8192 599 -> 585, 18432x7168 354 -> 344); at 512 and 2048 level (-8 .. +2 %), at 4096 two
    shapes faster and two slower; the register-operand kernel faster than cuBLAS's route at 1024 and 4096 rows on
    every shape (H100, session 53: 4096 rows 8192^2 634 -> 559 µs, 28672x8192 2123 -> 1823, 7168^2 520 -> 436,
    18432x7168 1182 -> 1070)."""
    frag_rsw_a8_max_m: int
    """ANYBIT_FRAG_RSW_A8_MAX_M (default 256; 0 turns it off), Hopper: W4A8 and W4A8-MXFP4 calls of 33 to this many
    rows (at most 256) whose scales allow the kernel run the register-operand W4A8 kernel's stream-K form
    (`frag_rsw_a8_kernel`, 64 tokens a tile up to 64 rows, else 128) ahead of the other routes: one CTA an SM shares
    every 128-row weight tile's 128-K steps, so a few tokens stream the weight on every SM (the A16 side's `rs_wide`
    for W4A8). Unset, the measured rule (`frag_ws_a8.rsw_a8_tile`): at 33-64 rows int4 weights whose route leaves a
    part-filled second wave (64 x SMs < N <= 160 x SMs, >= 60 128-K steps a CTA: 18432x7168), at 65-256 rows every
    4-bit weight with >= 16 steps a CTA; set, every weight the kernel runs, any N. H100 CUDA graphs, the route before ->
    this: int4 18432x7168 M=64 / 128 / 256 46.1 / 87.5 / 131.0 -> 40.4 / 55.0 / 97.9 µs (Humming 38.7 / 78.4 /
    130.4, session 53); 7168^2 M=128 / 256 60.0 / 66.3 -> 36.8 / 49.9, MXFP4 18432x7168 65.6 / 133.1 -> 50.5 / 92.4
    (session 54); at 33-64 rows 28672x8192 56.7 / 59.5 -> 60.7 / 61.5 at M=40 / 64, which the rule leaves alone."""
    moe_ws_min_rows: int
    """ANYBIT_MOE_WS_MIN_ROWS (default 0: off), Hopper: a `QuantMoE` call whose experts see at least this many
    rows on average runs both grouped GEMMs through the warp-specialised Gluon kernel (`anybit.kernels.moe_ws`,
    4-bit integer A16 experts) instead of `moe_gemm`. Off by default: H200 w4a16, it is 1.5-2.6x slower than
    `moe_gemm` in every cell measured (DeepSeek-V3 M=4096 gate_up 7439 vs 4684 µs; 128-row blocks are half
    padding at ~128 rows per expert, and its 128-row tiles run at ~420 TF/s even dense)."""
    moe_ws_a8_min_rows: int
    """ANYBIT_MOE_WS_A8_MIN_ROWS (default 0: off), Hopper: a `QuantMoE` call of W4A8 experts (4-bit integer codes in
    the FP8 fragment layout, e4m3 x per token) whose experts see at least this many rows on average runs both
    grouped GEMMs through the warp-specialised FP8 Gluon kernel (`anybit.kernels.moe_ws_a8`) instead of
    `moe_gemm`. Off by default: H200 CUDA graphs, slower than `moe_gemm` in every cell measured (DeepSeek-V3 M=4096
    gate_up / down 3988 / 2463 vs 3935 / 2216 µs, M=1024 2124 / 1292 vs 1436 / 784; Qwen3-30B-A3B M=4096 473 / 339 vs
    408 / 263): each 128-row block decodes its expert's weights again, and at ~128 rows an expert half the blocks
    hold a few rows."""
    moe_rs_min_rows: int
    """ANYBIT_MOE_RS_MIN_ROWS (default 0: off), Hopper: a `QuantMoE` call of A16 experts the register-operand kernel
    takes whose experts see at least this many rows on average runs both grouped GEMMs through it
    (`anybit.kernels.moe_rs`: x gathered into the sorted order, token tiles by the rows an expert sees) instead of
    `moe_gemm`. Off by default: H200 w4a16 layers slower in every cell measured (DeepSeek-V3 M=4096 8473 vs 7911 µs,
    M=1024 4374 vs 3150; Qwen3-30B-A3B 1336 vs 890, 557 vs 326)."""
    moe_rs_a8_min_rows: int
    """ANYBIT_MOE_RS_A8_MIN_ROWS (default 0: off), Hopper: a `QuantMoE` call of W4A8 experts whose group scales allow
    a rescaled accumulator and whose experts see at least this many rows on average runs both grouped GEMMs through
    the register-operand FP8 Gluon kernel (`anybit.kernels.moe_rs_a8_kernel`: 128 weight rows by 128 sorted rows a
    tile, 256 from 256 rows an expert) instead of `moe_gemm`. Off by default: H100 CUDA graphs (session 53), the W4A8
    layer 4-33 % slower than with `moe_gemm` (Qwen3-30B-A3B M=1024 334 vs 251 µs, M=4096 821 vs 716; DeepSeek-V3
    3167 vs 2616, 5382 vs 5181)."""
    frag_ptx: int
    """ANYBIT_FRAG_PTX=0/1/2, how much of the frag decode is inline PTX (`frag_ptx`): 0 plain Triton; 1 integer
    zero points by one packed subtraction (`minus_rows`), bytes by one PRMT each (`unpack_bytes`), e2m1 pairs
    times folded scales (`times_groups`) — H200: w4a16-zp 8192² M=1 20.9 -> 16.4 µs, w8a16 23.9 -> 21.1,
    w2a16 22.3 -> 16.6; 2 (default on sm_90+) also each 4-bit integer word in one block
    (`unpack_pairs_minus`): w4a16 8192² M=1/16/64 15.8/16.3/27.4 -> 15.4/15.6/26.5 µs. Lower levels are for a
    toolchain whose ptxas rejects a form, and for tests comparing the forms."""
    frag_settle: bool
    """ANYBIT_FRAG_SETTLE (default 1; 0 turns it off), compiled frag kernels (dense and grouped): each K block's
    register-operand wgmma finish before the next block's decode rewrites their A registers (`settled`). Off,
    Triton 3.6 leaves 3-7 of them in flight there (undefined behaviour: 8-bit codes on 8/16 warps gave runs of wrong
    rows on the H200; sm_90a SASS of w4a16 M=128, w8a16 M=16-128, nvfp4/mxfp4 M=1/16/128 show the same pattern,
    `tools/sm90_check.py` HAZARD). Its speed on the H200 is not yet measured (2026-12-01)."""
    frag_rs: bool
    """ANYBIT_FRAG_RS (default 1; 0 turns it off), Hopper: A16 calls of 33-256 rows of 4-bit integer, NVFP4 and MXFP4
    weights run the register-operand kernel (`anybit.kernels.frag_rs`: the decoded weight straight into the wgmma's
    registers) where `rs_tile`'s rule says it is faster than the warp-specialised kernel, the frag kernel or
    dequantize + cuBLAS (H200: 8192^2 W4A16 M=128 41.0 -> 32.6 µs, 8192x28672 M=96 134.8 -> 104.3, 6144x4096 M=192
    40.6 -> 21.9); read when a prepared weight first sees an M."""
    frag_rs_a8: int
    """ANYBIT_FRAG_RS_A8 (default 1; 0 off; 2 its stream-K form), Hopper: the W4A8 calls of the wide range
    (`frag_ws_a8_wide_max_m`) — 4-bit integer weights whose scales allow the rescale, and MXFP4 weights under e4m3 x
    (`rs_e2m1_why_not`) — run the register-operand W4A8 kernel (`anybit.kernels.frag_rs_a8_kernel`: the MMA
    warpgroups decode the words straight into the wgmma's A registers, no decoder partitions; y stored 16 bytes a
    thread) instead of the warp-specialised wide kernel (int4) or the e4m3 pass + cuBLAS (MXFP4). H100, eager, same
    run (session 53), int4 g128 at 1024 / 4096 rows: 18432x7168 289 / 1070 µs (Humming 338 / 1192, the
    warp-specialised kernel 363 / 1306), 7168^2 127 / 436 (181 / 474), 8192^2 150 / 559 (171 / 583), 28672x8192 469 /
    1823 (537 / 2104); MXFP4 18432x7168 264 / 980 (Humming 275 / 1083, the route 339 / 992), 7168^2 115 / 408 (172 /
    402, 155 / 410). 2: its persistent stream-K form (`frag_rsw_a8_kernel`: one CTA an SM sharing every tile's 128-K
    steps evenly) — measured slower (7168^2 M=1024 140 vs 127 µs, M=4096 507 vs 436)."""
    frag_rs_parts: bool
    """ANYBIT_FRAG_RS_PARTS (default 1; 0 turns it off), with `frag_rs`: a 257-384-row call that the register-operand
    kernel's tiles would overfill runs as two of its launches, 256 rows and the rest (`frag_rs.rs_parts`)."""
    rs_wide: bool
    """ANYBIT_RS_WIDE (default 1; 0 turns it off), with `frag_rs`: 33-192-row calls of 2-4-bit codes on weights whose
    64-row tiles overfill one wave (N > 64 x SMs) run the register-operand kernel's wide persistent stream-K form
    (`frag_rsp.rsw_tile`, `gemm_frag_rsw`: 128-row tiles whose warpgroups share x, the K blocks shared among the SMs;
    H200 graphs W4A16 28672x8192 M=96 118.2 -> 102.3 µs); read when a prepared weight first sees an M."""
    rs_w2: bool
    """ANYBIT_RS_W2 (default 1; 0 turns it off), with `frag_rs`: 2-bit integer codes on the register-operand kernel
    (`frag_rs.rs_int_why_not`; off: the frag kernel's decode tiles and dequantize + cuBLAS at 65-256 rows). H200 graphs,
    W2A16 (uint2 g64 + zero points): 8192^2 M=128 100.1 -> 29.7 µs, 28672x8192 M=128 323.9 -> 120.9; read when a
    prepared weight first sees a dtype."""
    ws_int: bool
    """ANYBIT_WS_INT (default 1; 0 turns it off), Hopper: integer weights with zero points, 2- or 3-bit codes or scales
    of the other 16-bit type run on the warp-specialised kernel's row-major tiles above the register-operand kernel's
    rows, up to `frag_ws_max_m` (`frag_rs.ws_int_why_not`; off: dequantize + cuBLAS). H200 eager, uint4 g128 + zero
    points: 8192^2 M=512 135.8 -> 109.7 µs, 28672x8192 M=1024 862.9 -> 779.8; read when a prepared weight first sees a
    dtype."""
    e2m1_a8: bool
    """ANYBIT_E2M1_A8 (default 1; 0 turns it off), read when a weight is prepared: MXFP4 weights under e4m3 x per
    token whose rows span at most 11 binades of scale (`e2m1_row_scales`) are packed for the FP8 MMA and decoded to
    e4m3 by look-up tables (`TritonWeight.e2m1_a8`); off (or other weights), x's FP8 codes run on the A16 kernels
    (`codes_a16`). H200 graphs: 0.67-0.89x the codes path's time at M = 1-128 (8192^2 M=1 18.3 -> 15.1 µs,
    28672x8192 M=16 49.1 -> 41.1, 8192x28672 M=128 142.1 -> 102.6)."""
    w4a8_codes: bool
    """ANYBIT_W4A8_CODES=1 (default 0, read when a weight is prepared; H200: no faster than the FP8 route, sessions 26
    and 33, BENCHMARKS.md): int4 W4A8 weights
    (e4m3 x per token, scales per channel or whole 128-K blocks, no zero point) with N < 8192 are laid out for the
    A16 kernels and run as `codes_a16` — x's e4m3 codes in bf16/fp16, the weight's scales rounded once to bf16, x's
    scales per row after the MMA — up to ANYBIT_FRAG_WS_MAX_M rows, cuBLAS's block-scaled FP8 GEMM above
    (`triton_layout.int4_codes_scheme`). `tools/probe_w4a8_codes.py` times the estimate."""
    fast_launch: bool
    """ANYBIT_FAST_LAUNCH (default 1; 0 turns it off): the GEMM launchers call a compiled kernel's launcher straight
    once they have launched it with the same specialisation (`anybit.kernels.launch.Launcher`), instead of Triton's
    `JITFunction.run` binding and specialising every argument each call (30-60 µs of host time an eager call on the
    H200's host)."""
    launch_check: bool
    """ANYBIT_LAUNCH_CHECK=1 (default 0; read when `anybit.kernels.launch` is imported — the tests): each fast launch
    specialises every argument as Triton does and raises where one differs from the compiling call's."""


def _names(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


_POSIX = os.name == "posix"
_KEYS: dict[str, bytes] = {}


def _env(name: str) -> str | None:
    """os.environ.get(name), faster: on POSIX os.environ keeps its variables in a dict of bytes that every write through
    it (monkeypatch.setenv too) updates — one lookup there instead of three Python frames (~0.9 -> 0.2 µs; an eager
    call reads several of these)."""
    data = getattr(os.environ, "_data", None)
    if not _POSIX or type(data) is not dict:
        return os.environ.get(name)
    key = _KEYS.get(name)
    if key is None:
        key = _KEYS[name] = os.fsencode(name)
    value = data.get(key)
    return None if value is None else os.fsdecode(value)


def _level(name: str, default: int, valid: tuple[int, ...]) -> int:
    value = _env(name)
    if value is None:
        return default
    value = value.strip()
    if value not in {str(v) for v in valid}:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(map(str, valid))}")
    return int(value)


def triton_interpret() -> bool:
    """TRITON_INTERPRET alone: the call path reads single variables (a whole `load()` costs ~12 µs)."""
    return _env("TRITON_INTERPRET") == "1"


def pdl() -> bool:
    """ANYBIT_PDL alone (see `Settings.pdl`)."""
    return _level("ANYBIT_PDL", 1, (0, 1)) == 1


def _rows(name: str, default: int, what: str) -> int:
    value = _env(name)
    if value is None:
        return default
    value = value.strip()
    if not value.isdigit():
        raise ValueError(f"{name}={value!r}: expected {what} (0 turns the kernel off)")
    return int(value)


def frag_ws_max_m() -> int:
    """ANYBIT_FRAG_WS_MAX_M alone (see `Settings.frag_ws_max_m`)."""
    return _rows("ANYBIT_FRAG_WS_MAX_M", 1024, "a row count")


def frag_mid_max_m() -> int:
    """ANYBIT_FRAG_MID_MAX_M alone (see `Settings.frag_mid_max_m`)."""
    return _rows("ANYBIT_FRAG_MID_MAX_M", 256, "a row count")


def frag_ws_a8_max_m() -> int:
    """ANYBIT_FRAG_WS_A8_MAX_M alone (see `Settings.frag_ws_a8_max_m`)."""
    return _rows("ANYBIT_FRAG_WS_A8_MAX_M", 256, "a row count")


# `frag_ws_a8_wide_max_m`'s default with the register-operand kernel on (`frag_rs_a8`): no practical bound — it beat
# the codes pass + cuBLAS at 1024 and 4096 rows on every shape measured, and its tiles only fill more above
WIDE_RS_A8_MAX_M = 1 << 16


def frag_ws_a8_wide_max_m() -> int:
    """ANYBIT_FRAG_WS_A8_WIDE_MAX_M alone (see `Settings.frag_ws_a8_wide_max_m`)."""
    return _rows("ANYBIT_FRAG_WS_A8_WIDE_MAX_M", WIDE_RS_A8_MAX_M if frag_rs_a8() else 1536, "a row count")


def frag_rsw_a8_max_m() -> int:
    """ANYBIT_FRAG_RSW_A8_MAX_M alone (see `Settings.frag_rsw_a8_max_m`)."""
    return _rows("ANYBIT_FRAG_RSW_A8_MAX_M", 256, "a row count")


def frag_rsw_a8_asked() -> bool:
    """Whether ANYBIT_FRAG_RSW_A8_MAX_M is set: then every weight the stream-K form takes runs it in its rows, not only
    the default's (`frag_ws_a8.rsw_a8_tile`)."""
    return _env("ANYBIT_FRAG_RSW_A8_MAX_M") is not None


def moe_ws_min_rows() -> int:
    """ANYBIT_MOE_WS_MIN_ROWS alone (see `Settings.moe_ws_min_rows`)."""
    return _rows("ANYBIT_MOE_WS_MIN_ROWS", 0, "rows per expert")


def moe_ws_a8_min_rows() -> int:
    """ANYBIT_MOE_WS_A8_MIN_ROWS alone (see `Settings.moe_ws_a8_min_rows`)."""
    return _rows("ANYBIT_MOE_WS_A8_MIN_ROWS", 0, "rows per expert")


def moe_rs_a8_min_rows() -> int:
    """ANYBIT_MOE_RS_A8_MIN_ROWS alone (see `Settings.moe_rs_a8_min_rows`)."""
    return _rows("ANYBIT_MOE_RS_A8_MIN_ROWS", 0, "rows per expert")


def moe_rs_min_rows() -> int:
    """ANYBIT_MOE_RS_MIN_ROWS alone (see `Settings.moe_rs_min_rows`)."""
    return _rows("ANYBIT_MOE_RS_MIN_ROWS", 0, "rows per expert")


def frag_ptx() -> int:
    """ANYBIT_FRAG_PTX alone (see `Settings.frag_ptx`)."""
    return _level("ANYBIT_FRAG_PTX", 2, (0, 1, 2))


def frag_settle() -> bool:
    """ANYBIT_FRAG_SETTLE alone (see `Settings.frag_settle`)."""
    return _level("ANYBIT_FRAG_SETTLE", 1, (0, 1)) == 1


def frag_rs() -> bool:
    """ANYBIT_FRAG_RS alone (see `Settings.frag_rs`)."""
    return _level("ANYBIT_FRAG_RS", 1, (0, 1)) == 1


def frag_rs_a8() -> int:
    """ANYBIT_FRAG_RS_A8 alone (see `Settings.frag_rs_a8`)."""
    return _level("ANYBIT_FRAG_RS_A8", 1, (0, 1, 2))


def frag_rs_parts() -> bool:
    """ANYBIT_FRAG_RS_PARTS alone (see `Settings.frag_rs_parts`)."""
    return _level("ANYBIT_FRAG_RS_PARTS", 1, (0, 1)) == 1


def rs_wide() -> bool:
    """ANYBIT_RS_WIDE alone (see `Settings.rs_wide`)."""
    return _level("ANYBIT_RS_WIDE", 1, (0, 1)) == 1


def rs_w2() -> bool:
    """ANYBIT_RS_W2 alone (see `Settings.rs_w2`)."""
    return _level("ANYBIT_RS_W2", 1, (0, 1)) == 1


def ws_int() -> bool:
    """ANYBIT_WS_INT alone (see `Settings.ws_int`)."""
    return _level("ANYBIT_WS_INT", 1, (0, 1)) == 1


def e2m1_a8() -> bool:
    """ANYBIT_E2M1_A8 alone (see `Settings.e2m1_a8`)."""
    return _level("ANYBIT_E2M1_A8", 1, (0, 1)) == 1


def w4a8_codes() -> bool:
    """ANYBIT_W4A8_CODES alone (see `Settings.w4a8_codes`)."""
    return _level("ANYBIT_W4A8_CODES", 0, (0, 1)) == 1


def fast_launch() -> bool:
    """ANYBIT_FAST_LAUNCH alone (see `Settings.fast_launch`)."""
    return _env("ANYBIT_FAST_LAUNCH") != "0"


def launch_check() -> bool:
    """ANYBIT_LAUNCH_CHECK alone (see `Settings.launch_check`)."""
    return _level("ANYBIT_LAUNCH_CHECK", 0, (0, 1)) == 1


def load() -> Settings:
    """Read the environment now (call sites read it per call, so tests can change it; the per-call
    paths of the kernels read only the variables they need: `triton_interpret`, `pdl`, `frag_ptx`, `frag_settle`,
    `frag_ws_max_m`, `frag_mid_max_m`, `frag_ws_a8_max_m`, `frag_ws_a8_wide_max_m`, `frag_rsw_a8_max_m`,
    `moe_ws_min_rows`,
    `moe_ws_a8_min_rows`, `moe_rs_a8_min_rows`, `moe_rs_min_rows`, `frag_rs`, `frag_rs_a8`,
    `frag_rs_parts`, `rs_wide`, `rs_w2`,
    `ws_int`, `fast_launch`)."""
    return Settings(
        backends=_names(os.environ.get("ANYBIT_BACKENDS", "triton,humming,torch")),
        disabled_backends=frozenset(_names(os.environ.get("ANYBIT_DISABLED_BACKENDS", ""))),
        triton_interpret=triton_interpret(),
        cache_dir=os.environ.get("ANYBIT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "anybit"),
        autotune=os.environ.get("ANYBIT_AUTOTUNE", "0") == "1",
        multi_backend=os.environ.get("ANYBIT_MULTI_BACKEND", "0") == "1",
        pdl=pdl(),
        frag_ws_max_m=frag_ws_max_m(),
        frag_mid_max_m=frag_mid_max_m(),
        frag_ws_a8_max_m=frag_ws_a8_max_m(),
        frag_ws_a8_wide_max_m=frag_ws_a8_wide_max_m(),
        frag_rsw_a8_max_m=frag_rsw_a8_max_m(),
        moe_ws_min_rows=moe_ws_min_rows(),
        moe_ws_a8_min_rows=moe_ws_a8_min_rows(),
        moe_rs_a8_min_rows=moe_rs_a8_min_rows(),
        moe_rs_min_rows=moe_rs_min_rows(),
        frag_ptx=frag_ptx(),
        frag_settle=frag_settle(),
        frag_rs=frag_rs(),
        frag_rs_a8=frag_rs_a8(),
        frag_rs_parts=frag_rs_parts(),
        rs_wide=rs_wide(),
        rs_w2=rs_w2(),
        ws_int=ws_int(),
        e2m1_a8=e2m1_a8(),
        w4a8_codes=w4a8_codes(),
        fast_launch=fast_launch(),
        launch_check=launch_check(),
    )
