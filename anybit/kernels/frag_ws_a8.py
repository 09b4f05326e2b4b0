"""W4A8 on Hopper without a codes pass: `gemm_frag_ws_a8` quantizes x to e4m3 per token and runs the
warp-specialised Gluon kernel (`anybit.kernels.frag_ws_a8_kernel`) on a weight in the FP8 fragment layout — two
decoder partitions write each 128-K step of the weight tile into shared memory as e4m3 (q - 8) / 512 while two
MMA warpgroups run the FP8 wgmma of the steps before and promote each in fp32 with the block's scales. Where it
is routed (`ws_a8_plan`: 64 < M <= 256, N >= 8192) it replaces writing the weight's integers out as e4m3 for
cuBLAS's block-scaled GEMM each call (N*K bytes, 33 µs at 8192^2 on the H200). With `wide`, 512 < M <= 1536: the same
decoders feeding `frag_ws_a8_wide_kernel` (the weight as the wgmma's A operand, 256 tokens as its N, the accumulator
rescaled per block instead of promoted).

Which weights: 4-bit integer codes (int4 / uint4, no zero point, no global scale) with scales per channel or
per whole 128-K blocks, e4m3 activations per token (the schemes of the FP8 fragment layout, `frag_format`); sm_90
with Gluon's Hopper API (Triton 3.6). `frag_ws_a8_why_not` names what is missing otherwise, and the caller keeps
the block-scaled route.
"""

from __future__ import annotations

import functools

import torch

from anybit import settings
from anybit.formats.dtypes import IntType
from anybit.formats.scheme import ActMode, ScaleKind, ZeroPoint
from anybit.kernels.dequant import cdiv
from anybit.kernels.frag_layout import FRAG_PANEL
from anybit.kernels.frag_ws import WS_WORD_DEPTH, call_output, gluon_api, gluon_hopper_why_not, weight_descs
from anybit.kernels.launch import Launcher
from anybit.kernels.quant_act import quantize_act

A8_BK = 128  # K per step: one frag block
WIDE_TOKENS = 256  # the wide kernel's tokens a tile (the wgmma's N)
WIDE_MIN_M = 512  # it takes calls of more rows than this (and than ANYBIT_FRAG_WS_A8_MAX_M): at 512 it ties the route
WIDE_STAGES = 2  # its ring, 48 KB a step of x, w and scales (H200: 2 to 5 % faster than 3 at M = 1024 / 4096)
# the register-operand wide kernel's ring by tokens a tile: x's [tokens, 128] + 8 KB of words + scales a step (256:
# 40.5 KB, 4 stages; 64: 16.5 KB, 8 — a few tokens stream the weight, so more of it in flight)
RS_STAGES = {64: 8, 128: 6, 256: 4}
RSW_A8_MIN_M = 33  # the stream-K form's smallest call on the route (`rsw_a8_tile`); the decode kernels below
# At 33-64 rows (64 tokens a tile) by default only int4 weights whose route leaves a part-filled second wave: N in
# (MIN, MAX] x SMs (18432x7168: 144 tiles of 128 rows on 132 SMs; 64-row tiles of its frag route, 288 CTAs, just over
# two an SM) and 128-K steps a CTA at least. H100 graphs, route -> this: 18432x7168 M=64 46.1 -> 40.4 µs (session
# 53); left alone (session 54): 28672x8192 M=40 / 64 56.7 / 59.5 -> 60.7 / 61.5 (its 224 tiles are one wave of two
# CTAs an SM), 28672x4096 33.6 / 33.9 -> 40.1 / 41.1, 8192^2 M=64 28.8 -> 29.5, 7168^2 26.2 -> 26.9; MXFP4 (its frag
# route is stronger) 28672x8192 M=64 56.7 -> 60.5
RSW_A8_MIN_N_PER_SM = 64
RSW_A8_MAX_N_PER_SM = 160
RSW_A8_MIN_STEPS = 60
# At 65-256 rows (128 tokens a tile) every 4-bit weight (int4, MXFP4) whose launch holds this many 128-K steps a CTA
# at least: H100 graphs, route -> this, M=128 / 256 (session 54 unless noted): int4 18432x7168 87.5 / 131.0 -> 55.0 /
# 97.9 (session 53), 28672x8192 101.8 -> 84.5 at 128, 28672x4096 60.3 -> 48.8 at 128, 7168^2 (24 steps a CTA; route:
# the codes pass + cuBLAS's block-scaled GEMM) 60.0 / 66.3 -> 36.8 / 49.9, 8192^2 38.0 / 54.8 -> 39.5 / 51.9 (session
# 53); MXFP4 18432x7168 65.6 / 133.1 -> 50.5 / 92.4, 8192^2 41.4 / 53.0 -> 38.3 / 49.7, 7168^2 37.5 / 48.7 -> 36.5 /
# 47.6, 28672x8192 79.6 / 145.6 -> 80.2 / 146.7. Weights of fewer steps (4096^2: 8) not measured
RSW_A8_MID_MIN_STEPS = 16


@functools.cache
def _kernel(wide: bool = False, rs: bool = False, persistent: bool = False):
    if persistent:
        from anybit.kernels.frag_rsw_a8_kernel import frag_rsw_a8_kernel

        return frag_rsw_a8_kernel
    if rs:
        from anybit.kernels.frag_rs_a8_kernel import frag_rs_a8_kernel

        return frag_rs_a8_kernel
    if wide:
        from anybit.kernels.frag_ws_a8_wide_kernel import frag_ws_a8_wide_kernel

        return frag_ws_a8_wide_kernel
    from anybit.kernels.frag_ws_a8_kernel import frag_ws_a8_kernel

    return frag_ws_a8_kernel


@functools.cache
def _x_layout(rows: int):
    gl = gluon_api()[0]
    return gl.NVMMASharedLayout.get_default_for([rows, A8_BK], gl.float8e4nv)


def frag_ws_a8_why_not(scheme, k: int, n: int, device: torch.device) -> str | None:
    """None when `gemm_frag_ws_a8` runs weights of `scheme` (K = k, N = n) on `device`, else why not."""
    why = gluon_hopper_why_not(device)
    if why is not None:
        return why
    w, g, act = scheme.weight, scheme.granularity, scheme.act
    if not isinstance(w, IntType) or w.bits != 4:
        return "4-bit integer weights only"
    if not act.quantized or act.dtype.name != "e4m3" or act.mode is not ActMode.TOKEN:
        return f"e4m3 activations per token only ({act.token()}): the schemes of the FP8 fragment layout"
    if scheme.zero_point is not ZeroPoint.NONE or scheme.global_scale:
        return "no zero points or global scale yet"
    if scheme.scale_dtype.name not in ("fp32", "bf16", "fp16"):
        return f"fp32 / bf16 / fp16 scales only ({scheme.scale_dtype.name})"
    if not (g.kind is ScaleKind.CHANNEL or (g.kind is ScaleKind.GROUP and g.k % 128 == 0)):
        return f"scales per channel or per whole 128-K blocks only ({g.token()})"
    if k % 16:
        return f"K={k} must be a multiple of 16 (TMA reads e4m3 x rows 16-byte aligned)"
    if n % 8:
        return f"N={n} must be a multiple of 8 (TMA reads scale rows 16-byte aligned)"
    return None


WS_A8_MIN_N = 8192  # below, the block-scaled route wins at every M (H200 graphs: 4096^2 M=256 31.8 vs 26.3 µs)


def ws_a8_plan(scheme, m: int, n: int, k: int, device: torch.device, num_sms: int = 132,
               rescale: bool = True) -> tuple[dict | None, str]:  # fmt: skip
    """(the kernel's tile, why) for a W4A8 call of M rows (the caller takes it from M = 65 on), or (None, why not).
    Up to `frag_ws_a8_max_m` rows the narrow kernel: H200 under CUDA graphs it beats the codes pass + cuBLAS's
    block-scaled GEMM up to M = 256 where N >= 8192 (28672x8192 M=128 101 vs 183 µs, M=256 192 vs 242; 8192^2 M=256
    55 vs 68) and trails above (its FP8 wgmma pipeline with the 128-K promotion runs ~700 TF/s, cuBLAS ~800-1000).
    Where 128 x 128 tiles would leave half the SMs idle, 64 weight rows a tile (8192^2 M=128 53 -> 37 µs; with more
    CTAs they are slower: 28672x8192 M=128 100 -> 124). Above, up to `frag_ws_a8_wide_max_m` rows, the wide kernel
    where the weight's scales allow its rescale (rescale: `TritonWeight.rescale`, true for channel scales)."""
    limit = settings.frag_ws_a8_max_m()
    if m > limit:
        wide = settings.frag_ws_a8_wide_max_m()
        if not WIDE_MIN_M < m <= wide:
            return None, (
                f"M={m} > ANYBIT_FRAG_WS_A8_MAX_M={limit}, and not in the wide kernel's {WIDE_MIN_M} < M <= "
                f"ANYBIT_FRAG_WS_A8_WIDE_MAX_M={wide} (cuBLAS's block-scaled GEMM is faster there)"
            )
        why = ws_a8_wide_why_not(scheme, k, n, device, rescale)
        if why is not None:
            return None, why
        why = f"W4A8, {WIDE_MIN_M} < M <= ANYBIT_FRAG_WS_A8_WIDE_MAX_M: the wide kernel"
        return ws_a8_tile(m, n, num_sms, wide=True), why
    why = ws_a8_route_why_not(scheme, k, n, device)
    if why is not None:
        return None, why
    tile = ws_a8_tile(m, n, num_sms)
    few = "; 64 weight rows a tile (few CTAs)" if tile else ""
    return tile, f"W4A8, M <= ANYBIT_FRAG_WS_A8_MAX_M, N >= 8192{few}"


def ws_a8_route_why_not(scheme, k: int, n: int, device: torch.device) -> str | None:
    """The part of `ws_a8_plan`'s narrow rule that depends on the weight and the GPU alone (the backend decides it
    once per weight): `frag_ws_a8_why_not`, and N >= WS_A8_MIN_N."""
    why = frag_ws_a8_why_not(scheme, k, n, device)
    if why is None and n < WS_A8_MIN_N:
        why = f"N={n} < {WS_A8_MIN_N} (too few CTAs: the block-scaled route is faster)"
    return why


def ws_a8_wide_why_not(scheme, k: int, n: int, device: torch.device, rescale: bool) -> str | None:
    """The same for the wide kernel: `frag_ws_a8_why_not`, and scales it may rescale its accumulator by."""
    why = frag_ws_a8_why_not(scheme, k, n, device)
    if why is None and not rescale:
        why = "group scales the wide kernel cannot rescale by (zero, subnormal or over 64 binades apart)"
    return why


def rsw_a8_tile(m: int, n: int, k: int, num_sms: int = 132, e2m1: bool = False) -> dict | None:
    """The register-operand kernel's stream-K form for a W4A8 call of M rows where `settings.frag_rsw_a8_max_m()`
    takes it (RSW_A8_MIN_M <= M <= it, at most 256; the caller checks the weight: `ws_a8_wide_why_not`), else None:
    64 tokens a tile up to 64 rows, else 128 with y stored 16 bytes a thread (256 tokens a tile at M=256 was slower:
    18432x7168 106.7 against 97.9 µs). Where ANYBIT_FRAG_RSW_A8_MAX_M is set, every weight; else at 33-64 rows int4
    weights (not `e2m1`) with RSW_A8_MIN_N_PER_SM x SMs < N <= RSW_A8_MAX_N_PER_SM x SMs and RSW_A8_MIN_STEPS 128-K
    steps a CTA, at 65-256 rows every weight with RSW_A8_MID_MIN_STEPS steps a CTA (the measurements are theirs)."""
    if not RSW_A8_MIN_M <= m <= min(settings.frag_rsw_a8_max_m(), WIDE_TOKENS):
        return None
    steps = cdiv(n, 128) * cdiv(k, A8_BK)
    if m > 64:
        ours = steps >= RSW_A8_MID_MIN_STEPS * num_sms
    else:
        wave = RSW_A8_MIN_N_PER_SM * num_sms < n <= RSW_A8_MAX_N_PER_SM * num_sms
        ours = not e2m1 and wave and steps >= RSW_A8_MIN_STEPS * num_sms
    if not (ours or settings.frag_rsw_a8_asked()):
        return None
    tokens = 64 if m <= 64 else 128
    return dict(wide=True, rs=True, persistent=True, tokens=tokens, cvt=tokens >= 128)


def rs_e2m1_why_not(tw, device: torch.device) -> str | None:
    """None when the register-operand kernels run this MXFP4 weight under e4m3 x (`TritonWeight.e2m1_a8`: by its
    groups' tables), else why not: a Hopper GPU with Gluon, N a multiple of 16 (its uint8 scale rows by TMA)."""
    if not tw.e2m1_a8:
        return "e2m1 weights on the FP8 MMA only (TritonWeight.e2m1_a8: MXFP4 rows within 11 binades)"
    why = gluon_hopper_why_not(device)
    if why is None and tw.n % 16:
        why = f"N={tw.n} must be a multiple of 16 (TMA reads its uint8 scale rows 16-byte aligned)"
    return why


def ws_a8_tile(m: int, n: int, num_sms: int = 132, wide: bool = False) -> dict:
    """The kernel's tile options for M rows: the wide kernel where the caller's rule took it (`ws_a8_plan`); else 64
    weight rows a tile where 128 x 128 tiles fill half the SMs or fewer (8192^2 M=128 53 -> 37 µs), else the
    defaults."""
    if wide:  # ANYBIT_FRAG_RS_A8: its register-operand twin, y stored 16 bytes a thread (2: in the stream-K form)
        level = settings.frag_rs_a8()  # (cvt, H100 M=1024: 28672x8192 493 -> 469 µs, 8192^2 157 -> 150)
        rs = {"rs": True, "cvt": True} if level else {}
        return {"wide": True} | rs | ({"persistent": True} if level == 2 else {})
    return {"block_n": 64} if cdiv(m, 128) * cdiv(n, 128) * 2 <= num_sms else {}


def gemm_frag_ws_a8(x: torch.Tensor, tw, bias: torch.Tensor | None = None, *, out: torch.Tensor | None = None,
                    block_n: int = 128, stages: int | None = None, group_m: int = 8,
                    dq_warps: int | None = None, dq_regs: int | None = None, mma_regs: int | None = None,
                    order: int = 0, promote: bool = True, early_scales: bool = True, diag: int = 0,
                    wide: bool = False, rs: bool = False, tokens: int = WIDE_TOKENS, persistent: bool = False,
                    head: bool = False, ctas: int | None = None, workspace: torch.Tensor | None = None,
                    counters: torch.Tensor | None = None, cvt: bool = False) -> torch.Tensor:  # fmt: skip
    """y [M, N] = quantize(x) @ dequantize(W)^T (+ bias) in x's dtype for an FP8-fragment weight whose scheme
    `frag_ws_a8_why_not` accepts (the caller checks). x: contiguous bf16/fp16 [M, K]. wide: the large-M kernel
    (`frag_ws_a8_wide_kernel`: 128 weight rows by WIDE_TOKENS tokens a tile, the accumulator rescaled per block —
    group scales must be `TritonWeight.rescale`; order, promote, early_scales and diag are the narrow kernel's); rs
    (with wide): its register-operand twin (`frag_rs_a8_kernel`: the MMA warpgroups decode the words themselves),
    `tokens` a tile (64, 128 or 256: the wgmma's N), diag its timing-only variants (`_rs_a8_loop`); persistent (with
    rs): its stream-K form (`frag_rsw_a8_kernel`: `ctas` CTAs, default the SMs, share every tile's 128-K steps
    evenly; a shared tile summed by the last CTA in, or with `head` by the one holding its first step, through
    `workspace` (fp32, >= 4 ctas x 64 x tokens) and zeroed int32 `counters` (>= 2 x the tiles; left zero) — the
    Triton backend's shared ones when not given); cvt (the wide kernels): y stored through a layout conversion, 16
    bytes a thread along y's rows, not the wgmma layout's 2 bytes a token."""
    m, k = x.shape
    n = tw.n
    if not (tw.frag and tw.scheme.act.quantized):
        raise ValueError(
            f"{tw.scheme}: gemm_frag_ws_a8 reads weights in the FP8 fragment layout (frag_format), "
            f"this one is {'the A16 fragment' if tw.frag else 'the bit-plane'} layout"
        )
    blocks = tw.group_k < tw.k  # a scale row per 128-K block (or per several), else per channel
    if rs and not wide:
        raise ValueError("rs=True is the wide W4A8 kernel's register-operand variant: it takes wide=True")
    if persistent and not rs:
        raise ValueError("persistent=True is the register-operand W4A8 kernel's stream-K form: it takes wide=True, "
                         "rs=True")  # fmt: skip
    if head and not persistent:
        raise ValueError("head=True is a way of the stream-K form to sum a shared tile: it takes persistent=True")
    if cvt and not wide:
        raise ValueError("cvt=True is the wide W4A8 kernels' y store (16 bytes a thread): it takes wide=True")
    if persistent and diag:
        raise ValueError(f"diag={diag}: the timing-only variants are the one-tile kernel's (persistent=False)")
    if tokens != WIDE_TOKENS and not rs:
        raise ValueError(f"tokens={tokens}: only the register-operand kernel (rs=True) takes other than {WIDE_TOKENS}")
    if tokens not in (64, 128, 256):
        raise ValueError(f"tokens={tokens}: the register-operand kernel takes 64, 128 or 256 tokens a tile")
    e2m1 = tw.e2m1_a8  # MXFP4 by its groups' tables: the register-operand kernels alone
    if e2m1 and not rs:
        raise ValueError(f"{tw.scheme}: e2m1 weights on the FP8 MMA run on the register-operand kernel only "
                         "(wide=True, rs=True)")  # fmt: skip
    if e2m1 and n % 16:
        raise ValueError(f"N={n}: e2m1 weights' uint8 scale rows are read by TMA 16-byte aligned (N a multiple of "
                         "16)")  # fmt: skip
    if wide and (block_n != 128 or not (tw.rescale or e2m1)):
        raise ValueError(
            f"the wide W4A8 kernel takes block_n=128 (not {block_n}) and group scales it may rescale by "
            "(positive, normal, within 64 binades: TritonWeight.rescale)"
        )
    # the wide kernel's 128-register accumulators need 154+ registers where ptxas compiles it: 12 warps, not 16
    defaults = (RS_STAGES[tokens], 1, 48, 232) if rs else (WIDE_STAGES, 2, 128, 192) if wide else (4, 4, 80, 176)
    stages, dq_warps, dq_regs, mma_regs = (
        v or d for v, d in zip((stages, dq_warps, dq_regs, mma_regs), defaults, strict=True)
    )
    y = call_output(x, tw, bias, out)
    xq, xs = quantize_act(x, tw.scheme.act)
    rows = tokens if wide else 64  # x rows a TMA copy: the tile's tokens, or one MMA warpgroup's
    x_desc = gluon_api()[1].from_tensor(xq, [rows, A8_BK], _x_layout(rows))  # TensorDescriptor
    w_desc, s_desc = weight_descs(tw, block_n)
    key = ("ws_a8", wide, rs, tokens, block_n, stages, group_m, dq_warps, dq_regs, mma_regs, order, promote,
           early_scales, diag, persistent, head, cvt, x.dtype, bias is None)  # fmt: skip
    rs_ptr = tw.rowwise[1] if e2m1 else y  # e2m1: the rows' powers of two after the K loop
    launch = tw.launches.get(key)
    if launch is None:
        consts = dict(
            BN=block_n, STAGES=stages, GROUP_M=group_m, MMA_REGS=mma_regs, SCALE_PER_BLOCK=blocks,
            GB=max(1, tw.group_k // 128), SIGNED=bool(tw.fmt["W_SIGNED"]), HAS_BIAS=bias is not None, PANEL=FRAG_PANEL,
            num_warps=4,
        )  # fmt: skip
        if persistent:
            consts.update(RESCALE=blocks and not e2m1, HEAD=head, CVT=cvt, E2M1=e2m1)
        elif rs:  # no decoder partitions (its loader's warp and registers are the kernel's own)
            consts.update(RESCALE=blocks and not e2m1, DIAG=diag, CVT=cvt, E2M1=e2m1)
        else:
            consts.update(DQ_WARPS=dq_warps, DQ_REGS=dq_regs, DEPTH=WS_WORD_DEPTH)
            if wide:
                consts.update(RESCALE=blocks, CVT=cvt)
            else:
                consts.update(ORDER=int(order), PROMOTE=promote or blocks, DIAG=diag,
                              EARLY_SCALES=bool(early_scales))  # fmt: skip
        # live: x's descriptor, its scales, bias (or y), y, (workspace, counters,) M, y's row stride
        live = (0, 3, 4, 5, 6, 7, 8, 12) if persistent else (0, 3, 4, 5, 6, 10)
        launch = tw.launches[key] = Launcher(_kernel(wide, rs, persistent), consts, live=live)
    if persistent:
        _launch_persistent(
            launch, x_desc, w_desc, s_desc, xs, bias, y, tw, tokens, ctas, head, workspace, counters, rs_ptr
        )
        return y
    # fmt: off
    launch(
        (cdiv(m, rows if wide else 128) * cdiv(n, block_n),), x_desc, w_desc, s_desc, xs,
        bias if bias is not None else y, y, m, n, k, tw.planes[0].shape[-1] // 16, y.stride(0),
        *((rs_ptr,) if rs else ()),
    )
    # fmt: on
    return y


def _launch_persistent(launch, x_desc, w_desc, s_desc, xs, bias, y, tw, tokens, ctas, head, workspace, counters,
                       rs_ptr) -> None:  # fmt: skip
    """`frag_rsw_a8_kernel` on `ctas` CTAs (default the SMs; at most one a 128-K step of the call), its workspace
    slots two a CTA for each of the two MMA warpgroups, a counter a tile and warpgroup."""
    from anybit.kernels.frag import sm_count
    from anybit.kernels.frag_rsp import stream_k_workspace

    m = y.shape[0]
    tiles = cdiv(m, tokens) * cdiv(tw.n, 128)
    sms = sm_count(y.device)
    grid = (min(ctas or sms or 1, tiles * cdiv(tw.k, A8_BK)),)
    if head and sms and grid[0] > sms:  # a tile's first CTA waits for the later ones: all must be resident
        raise ValueError(f"head=True waits across CTAs: it takes ctas <= the {sms} SMs, got {ctas}")
    workspace, counters = stream_k_workspace(y, 4 * grid[0] * 64 * tokens, 2 * tiles, workspace, counters)
    # fmt: off
    launch(
        grid, x_desc, w_desc, s_desc, xs, bias if bias is not None else y, y, workspace, counters, m, tw.n, tw.k,
        tw.planes[0].shape[-1] // 16, y.stride(0), rs_ptr,
    )
    # fmt: on
