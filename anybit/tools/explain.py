"""`anybit explain`: every backend, whether it can run a problem on this machine and why (not), the
one "auto" picks, and the kernel path and tile the Triton backend would use."""

from __future__ import annotations

import dataclasses

import torch

from anybit import settings
from anybit.backends.base import Problem
from anybit.backends.registry import choose_with_reason, explain, measured_us
from anybit.errors import AnybitError
from anybit.formats.scheme import Scheme, ZeroPoint

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def triton_plan(scheme: Scheme, m: int, n: int, k: int, device: torch.device, dtype: torch.dtype) -> str:
    """The Triton backend's path for this call: kernel, tile, split-K and where the tile comes from
    (the tuning cache or the default rule) — what `gemm` would do."""
    from anybit.backends.blockscaled import blockscaled_recipe, blockscaled_why_not
    from anybit.backends.triton import (
        BLOCKSCALED_MIN_M,
        DEQUANT_MATMUL_MIN_M,
        FRAG_MAX_M,
        ROWWISE_MIN_M,
        ROWWISE_MIN_M_A8,
        _sm_count,
        frag_mid,
        pick_config,
        tuning_cache,
        ws_route_tile,
    )
    from anybit.backends.triton_layout import (
        INT4_CODES_MAX_N,
        a8_mma,
        a16_twin,
        codes_a16,
        dense_frag_format,
        e2m1_rows_scheme,
        fp8_as_is,
        int4_codes_scheme,
    )
    from anybit.kernels.frag import two_parts
    from anybit.kernels.frag_rs import RS_SMALL_MIN_M, rs_kernel_scheme_why_not, rs_scheme_why_not, ws_int_why_not
    from anybit.kernels.frag_ws import frag_ws_scheme_why_not
    from anybit.kernels.gemm import GemmConfig
    from anybit.tuning.cache import problem_key

    if int4_codes_scheme(scheme) and n < INT4_CODES_MAX_N and settings.w4a8_codes():
        limit, recipe = settings.frag_ws_max_m(), blockscaled_recipe(scheme, n, k, False, True)
        if m <= limit or recipe is None or blockscaled_why_not(recipe, device, dtype) is not None:
            return (f"int4 W4A8 laid out for the A16 kernels (ANYBIT_W4A8_CODES=1, N < {INT4_CODES_MAX_N}): e4m3 x "
                    "per token as its codes in x's dtype, x's scales per row after the MMA, the weight's scales in "
                    f"bf16; the A16 path: {triton_plan(a16_twin(scheme), m, n, k, device, dtype)}")  # fmt: skip
        return (f"int4 W4A8 laid out for the A16 kernels (ANYBIT_W4A8_CODES=1), M > ANYBIT_FRAG_WS_MAX_M={limit}: e4m3 "
                "x per 128 columns, Triton writes the int weight's e4m3 codes (N*K bytes), cuBLAS block-scaled FP8 "
                "GEMM (1x128 weight scales)")  # fmt: skip
    cuda = device.type == "cuda"
    frag = dense_frag_format(scheme)
    codes = codes_a16(scheme)  # FP8 codes in x's dtype on the A16 kernels
    rows = e2m1_rows_scheme(scheme)  # MXFP4 under e4m3 x: the FP8 MMA / row-wise FP8 route where the weight allows
    rowwise = ""
    if rows and m > (ROWWISE_MIN_M_A8 if settings.e2m1_a8() else ROWWISE_MIN_M):
        rowwise = ("; MXFP4 weights whose rows' scales lie within 8 binades (checked when prepared) take e4m3 x per "
                   "token, W written as e4m3 times a power of two a row (N*K bytes) and cuBLAS's row-wise FP8 GEMM "
                   "instead" if cuda else "; the row-wise FP8 route needs a CUDA device")  # fmt: skip
    via = (f"FP8 activations ({scheme.act.token()}) as their codes in x's dtype, x's scales per row after the MMA; "
           if codes else "")  # fmt: skip
    if rows and cuda and settings.e2m1_a8():
        rs_e2m1 = _rs_e2m1_plan(m, n, k, device)
        if rs_e2m1:
            return rs_e2m1
    bits = scheme.weight.bits
    rs = rs_scheme_why_not(scheme) is None  # the route sends these codes to the register-operand kernel
    # the register-operand kernel runs these weights (zero points, 2/3-bit codes: it alone)
    rs_why = rs_kernel_scheme_why_not(scheme, k, n, dtype, device) if rs and cuda else None
    rs_runs = rs and cuda and rs_why is None
    ws_why = frag_ws_scheme_why_not(scheme, k, dtype, device, n) if frag else None
    if frag and ws_why is not None and rs_runs:  # the warp-specialised kernel's row-major tiles may take these
        ws_why = ws_int_why_not(scheme, k, n, dtype, device)
        plain = ws_why is None
    else:
        plain = False
    small_rs = frag and rs_runs and RS_SMALL_MIN_M < m <= FRAG_MAX_M and not a8_mma(scheme)
    if small_rs:  # at these rows a register-operand tile or None
        t = ws_route_tile(m, n, k, _sm_count(device), bits, ws=ws_why is None and not plain, plain=plain)
        if t is not None:
            return _rs_plan(via, scheme, t, dtype)
    if frag and m > FRAG_MAX_M and not a8_mma(scheme) and not frag_mid(scheme, m, n, k, dtype, device):
        limit = settings.frag_ws_max_m()
        why = ws_why if m <= limit else f"M > ANYBIT_FRAG_WS_MAX_M={limit}"
        t = None
        if m <= limit and (why is None or rs_runs):
            t = ws_route_tile(m, n, k, _sm_count(device), bits, ws=why is None and not plain, plain=plain)
        if why is None and t is None:
            why = ("its CTAs would leave the last wave of SMs thin here (the kernel is not persistent), and a single "
                   "partial wave pays only from N >= 8192")  # fmt: skip
        if t is not None and t.get("rs"):
            return _rs_plan(via, scheme, t, dtype)
        if t is not None:
            fold = ("; e2m1 weights whose scales the decode builds from their bits exactly (checked when prepared; "
                    "else dequantize + cuBLAS)" if scheme.weight.is_float else "")  # fmt: skip
            mma = ("the weight tile as the wgmma's A operand and x's tokens as its N (swapped), "
                   f"{t['block_n'] // 64} MMA warpgroup(s)" if t.get("swap") else "two MMA warpgroups")  # fmt: skip
            dec = "two decoder partitions (alternate 128-K blocks)" if t.get("ndec") == 2 else "decoder warps"
            notes = "".join(f"; {note}" for note in _int_notes(scheme, dtype, "each 256-K block of 2-bit codes four "
                                                                "64-K steps"))  # fmt: skip
            return (f"{via}{scheme.weight_bits}-bit fragment layout, {FRAG_MAX_M} < M <= {limit}: warp-specialised "
                    f"Gluon kernel ({dec} write W per 64-K step into shared memory, {mma}), tile "
                    f"{t['block_m']}x{t['block_n']}x64, {t['stages']} stages{fold}{rowwise}{notes}")  # fmt: skip
        rs_note = f"; register-operand kernel not used: {rs_why}" if rs_why and m <= limit else ""
        return (f"{via}{scheme.weight_bits}-bit fragment layout, M > {FRAG_MAX_M}: one-pass Triton dequantize, then "
                f"cuBLAS (warp-specialised kernel not used: {why}{rs_note}){rowwise}")  # fmt: skip
    if cuda and m > DEQUANT_MATMUL_MIN_M and not a8_mma(scheme):
        return f"M > {DEQUANT_MATMUL_MIN_M}: one-pass Triton dequantize to the activation dtype, then cuBLAS"
    ws_a8_note = ""
    if frag and a8_mma(scheme) and cuda:
        from anybit.kernels.frag_ws_a8 import RSW_A8_MIN_M, rsw_a8_tile, ws_a8_wide_why_not

        t = rsw_a8_tile(m, n, k, _sm_count(device))
        if t is not None and ws_a8_wide_why_not(scheme, k, n, device, True) is None:
            return (
                f"FP8 activations, {RSW_A8_MIN_M} <= M <= ANYBIT_FRAG_RSW_A8_MAX_M={settings.frag_rsw_a8_max_m()}: "
                "e4m3 x per token, then the register-operand W4A8 Gluon kernel's stream-K form (one CTA an SM sharing "
                f"every 128-row weight tile's 128-K steps, {t['tokens']} tokens a tile; two MMA warpgroups of 64 "
                "weight rows decode W's words straight into the wgmma's e4m3 A registers and keep the accumulator in "
                "units of each block's scale; group scales must be positive, normal and within 64 binades, else the "
                "other routes)"
            )
    if frag and a8_mma(scheme) and m > FRAG_MAX_M:
        from anybit.kernels.frag_ws_a8 import WIDE_MIN_M, ws_a8_plan

        tile, why = ws_a8_plan(scheme, m, n, k, device, _sm_count(device) if cuda else 132)
        if tile is not None and tile.get("rs"):
            level, form = (2, "; its persistent stream-K form, one CTA an SM sharing every tile's 128-K steps") if (
                tile.get("persistent")) else (1, "")  # fmt: skip
            return (
                f"FP8 activations, {WIDE_MIN_M} < M <= ANYBIT_FRAG_WS_A8_WIDE_MAX_M, ANYBIT_FRAG_RS_A8={level}: e4m3 "
                "x per token, then the register-operand W4A8 Gluon kernel (two MMA warpgroups of 64 weight rows x 256 "
                "tokens decode W's words straight into the wgmma's e4m3 A registers and keep the accumulator in units "
                f"of each block's scale{form}; group scales must be positive, normal and within 64 binades, else the "
                "codes pass + cuBLAS)"
            )
        if tile is not None and tile.get("wide"):
            return (
                f"FP8 activations, {WIDE_MIN_M} < M <= ANYBIT_FRAG_WS_A8_WIDE_MAX_M: e4m3 x per token, then the "
                "wide warp-specialised W4A8 Gluon kernel (two decoder partitions write W per 128-K step into shared "
                "memory as e4m3, two MMA warpgroups of 64 weight rows x 256 tokens keep the accumulator in units of "
                "each block's scale; group scales must be positive, normal and within 64 binades, else the codes "
                "pass + cuBLAS)"
            )
        if tile is not None:
            return (f"FP8 activations, {FRAG_MAX_M} < M: e4m3 x per token, then the warp-specialised W4A8 Gluon kernel "
                    "(two decoder partitions write W per 128-K step into shared memory as e4m3, two MMA warpgroups "
                    f"promote each step in fp32), tile 128x{tile.get('block_n', 128)}x128")  # fmt: skip
        ws_a8_note = f" (warp-specialised W4A8 kernel not used: {why})"
    recipe = blockscaled_recipe(scheme, n, k, fp8_as_is(scheme), frag)
    recipe_note = ""
    if recipe and m > BLOCKSCALED_MIN_M:
        why = blockscaled_why_not(recipe, device, dtype)
        if why is None:
            codes = "Triton writes the int weight's e4m3 codes (N*K bytes), " if frag else ""
            gemm = f"cuBLAS block-scaled FP8 GEMM ({recipe} weight scales)"
            return f"FP8 activations, M > {BLOCKSCALED_MIN_M}: {codes}{gemm}{ws_a8_note}"
        recipe_note = f" (cuBLAS block-scaled GEMM not used: {why})"
    entry = tuning_cache(device).get(problem_key(scheme, n, k, m, dtype))
    if entry is not None:
        c, source = GemmConfig(**entry["config"]), f"tuned: {entry['us']:.1f} µs measured"
    else:
        a8 = a8_mma(scheme) or (rows and settings.e2m1_a8())  # (the tile of the FP8 MMA where the weight allows)
        c = pick_config(m, n, k, scheme, _sm_count(device) if cuda else 1, not cuda, fp8_as_is(scheme), a8, frag)
        source = "default rule; nothing tuned, see `anybit tune`"
    act = f"FP8 activations ({scheme.act.token()}, quantized in a separate kernel), " if scheme.act.quantized else ""
    if rows and settings.e2m1_a8():
        act += ("on the FP8 MMA where the weight's rows' scales lie within 11 binades (checked when prepared; "
                "ANYBIT_E2M1_A8=0 turns it off): e2m1 to e4m3 by look-up tables of each group's exponent relative "
                "to its row, the rows' powers of two after the K loop — else their codes in x's dtype on the "
                "bf16/fp16 MMA (exact; x scales after it), ")  # fmt: skip
        from anybit.kernels import frag as frag_kernels

        if frag_kernels.A8_MMA_ACC:
            act += "the FP8 MMA accumulating the whole K (no per-block promotion, frag.A8_MMA_ACC), "
    elif codes:
        act += "their codes in x's dtype on the bf16/fp16 MMA (exact; x scales after it), "
    kernel = f"{scheme.weight_bits}-bit fragment-layout swap-AB GEMM (weight rows x tokens)" if frag else "dense GEMM"
    if frag and scheme.weight_bits == 3:
        kernel += " (each 128-K block's 4-bit words rebuilt from a 2-bit and a 1-bit plane)"
    if frag and c.block_m & (c.block_m - 1):  # `frag.FRAG_TWO`
        kernel += f" ({' + '.join(map(str, two_parts(c.block_m)))} tokens on one decode of each K block)"
    if frag and a8 and entry is None and c.block_m == 64 and c.block_n == 64:  # the default rule's narrow FP8 tile
        from anybit.kernels.frag import A8_NARROW_FILL

        share = f"{A8_NARROW_FILL * 100:.0f} %"
        kernel += f" (64 weight rows a tile: 128-row tiles would hold under {share} of two CTAs an SM)"
    return (
        f"{act}{kernel}, tile {c.block_m}x{c.block_n}x{c.block_k}, split-K {c.split_k}, "
        f"{c.num_warps} warps, {c.num_stages} stages{f', {c.maxnreg} registers' if c.maxnreg else ''} ({source})"
        f"{recipe_note}{ws_a8_note}"
    )


def _int_notes(scheme: Scheme, dtype: torch.dtype, two_bit: str) -> list[str]:
    """What is particular to an integer weight in the Gluon kernels' decode (3-bit planes, 2-bit blocks as `two_bit`
    says, zero points, scales of the other 16-bit type)."""
    notes = []
    if scheme.weight.bits == 3:
        notes.append("each 128-K block's 4-bit words rebuilt from a 2-bit and a 1-bit plane")
    if scheme.weight.bits == 2:
        notes.append(two_bit)
    if scheme.zero_point is ZeroPoint.INT:
        notes.append("zero points subtracted in the decode, exact")
    sdt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(scheme.scale_dtype.name)
    if not scheme.weight.is_float and sdt is not None and sdt != dtype:
        notes.append(f"{scheme.scale_dtype.name} scales rounded to {str(dtype).removeprefix('torch.')} once (the "
                     "decode multiplies in x's dtype: within one ulp instead of half)")  # fmt: skip
    return notes


def _rs_plan(via: str, scheme: Scheme, t: dict, dtype: torch.dtype) -> str:
    """The register-operand kernel's line (`frag_rs.rs_tile`'s tile `t`; `rs_parts`' two launches, each its own)."""
    from anybit.kernels.frag_rs import rs_block_k

    if t.get("parts"):
        (head, first), (rest, second) = t["parts"]
        return (f"two launches (its last token tile would overfill a wave): rows 0-{head - 1}: "
                f"{_rs_plan(via, scheme, first, dtype)}; the other {rest}: "
                f"{_rs_plan('', scheme, second, dtype)}")  # fmt: skip
    bits, notes = scheme.weight.bits, _int_notes(scheme, dtype, "each half of a 256-K block of 2-bit codes a block")
    if t.get("wide"):  # `frag_rsp.rsw_tile`: the backend's `_rs_gemm` runs the wide form
        return (
            f"{via}{scheme.weight_bits}-bit fragment layout, {t['block_m']}-token tile: the register-operand Gluon "
            f"kernel's wide persistent stream-K form (128 weight rows a tile, one MMA warpgroup a 64-row panel, both "
            f"on the same x slices; every tile's 128-K blocks shared evenly among the SMs, a tile shared by CTAs "
            f"summed by the last one in; ANYBIT_RS_WIDE=0 turns it off)" + "".join(f"; {n}" for n in notes)
        )
    if t.get("split_k", 1) > 1:
        notes.insert(0, f"K split {t['split_k']} ways (the last CTA of a tile sums the fp32 partials)")
    block_k = rs_block_k(bits)
    return (f"{via}{scheme.weight_bits}-bit fragment layout, {t['block_m']}-token tile: register-operand Gluon "
            f"kernel (each MMA warpgroup decodes its {block_k}-K blocks straight into the wgmma's registers, two "
            f"warpgroups on alternate blocks; ANYBIT_FRAG_RS=0 turns it off), tile {t['block_m']}x64x{block_k}, "
            f"{t['stages']} stages" + "".join(f"; {n}" for n in notes))  # fmt: skip


def explain_lines(scheme_text: str, m: int, n: int, k: int, device: str | None, dtype: str) -> list[str]:
    scheme = Scheme.parse(scheme_text)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dtype not in DTYPES:
        raise AnybitError(f"--dtype {dtype!r}; valid: {sorted(DTYPES)}")
    problem = Problem(scheme, n, k, m, dev, DTYPES[dtype])
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    lines = [f"scheme {scheme}  ({scheme.effective_bits(k, n):.3f} bits/weight)  M={m} N={n} K={k}  on {where}"]
    for name, ok, reason in explain(problem):
        lines.append(f"  {name:8s} {'yes' if ok else 'no ':4s} {reason}")
    try:
        picked, why = choose_with_reason(problem)
    except AnybitError as e:
        lines.append(f"auto: none — {e}")
        return lines
    lines.append(f"auto picks: {picked} — {why}")
    measured = measured_us(problem)
    if picked not in measured and measured:
        lines.append(f"  (measured here: {', '.join(f'{b} {t:.1f} µs' for b, t in measured.items())})")
    if picked == "triton":
        lines.append(f"  path: {triton_plan(scheme, m, n, k, dev, DTYPES[dtype])}")
    return lines


def moe_lines(scheme_text: str, experts: int, top_k: int, tokens: int, hidden: int, inter: int, device: str | None,
              dtype: str) -> list[str]:  # fmt: skip
    """`anybit explain --moe`: how `QuantMoE` would run one MoE layer here — grouped Triton GEMMs (and
    each projection's tile, split-K, half-width tails, PDL) or the per-expert loop, and why."""
    from anybit.backends.triton_layout import rescale_scheme, stack_experts
    from anybit.kernels.frag import frag_rescale, two_parts
    from anybit.kernels.frag_layout import frag_block_k
    from anybit.kernels.moe_gemm import moe_block_k, moe_n_first, moe_plan_grid_m, moe_tile_kind, two_part_block
    from anybit.kernels.moe_rs import moe_rs_plan
    from anybit.kernels.moe_ws import moe_ws_plan
    from anybit.kernels.moe_ws_a8 import moe_ws_a8_plan
    from anybit.moe.layer import (
        block_stats,
        grouped_why_not,
        launch_plan,
        moe_tiles,
        slot_max_rows,
        takes_slot_blocks,
    )
    from anybit.quant.weights import QuantizedWeight

    scheme = Scheme.parse(scheme_text)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dtype not in DTYPES:
        raise AnybitError(f"--dtype {dtype!r}; valid: {sorted(DTYPES)}")
    if min(experts, top_k, tokens, hidden, inter) < 1 or top_k > experts:
        raise AnybitError(f"--moe {experts},{top_k} and --shape {tokens},{hidden},{inter}: positive, top-k <= E")
    rows = tokens * top_k
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    lines = [
        f"scheme {scheme} MoE: E={experts} top-{top_k}, {tokens} tokens ({rows} rows, {rows / experts:.1f} per "
        f"expert), H={hidden} I={inter} on {where}"
    ]
    why = grouped_why_not(scheme, "auto", dev, DTYPES[dtype])
    if why is not None:
        return lines + [f"  path: per-expert loop over anybit.gemm (exact) — {why}"]
    # one expert of each projection holds every fact the plan reads (layout, format, N, K)
    one = [QuantizedWeight.empty(scheme, (1, n, k), device=dev) for n, k in ((2 * inter, hidden), (hidden, inter))]
    # (W4A8's rescaled accumulation also reads the scales' values: taken as allowing it, as real scales do)
    gate_up, down = (dataclasses.replace(stack_experts(w), rescale=rescale_scheme(scheme)) for w in one)
    rs, rs_why = moe_rs_plan(gate_up, down, rows, experts, DTYPES[dtype], dev)
    if rs:
        return lines + [
            f"  path: register-operand grouped Gluon GEMMs (moe_rs: x gathered into the sorted order, {rs}-token tiles "
            "of 64 weight rows, gate_up in the sorted order, silu*up there, down to the flat slots x top-k weights)"
        ]
    if gate_up.scheme.act.quantized:
        ws, ws_why = moe_ws_a8_plan(gate_up, down, rows, experts, dev)
        if ws and ws.get("rs"):
            return lines + [
                "  path: register-operand grouped FP8 Gluon GEMMs (moe_rs_a8, ANYBIT_MOE_RS_A8_MIN_ROWS: a loader "
                "gathers each block's sorted x rows by cp.async, two MMA warpgroups of 64 weight rows decode W's words "
                f"into the wgmma's e4m3 registers and rescale the accumulator per 128-K block), {ws['block_m']}-row "
                "blocks; "
                "epilogues x scales, silu(gate)*up, top-k weights"
            ]
        if ws:
            return lines + [
                "  path: warp-specialised grouped FP8 Gluon GEMMs (moe_ws_a8: two MMA warpgroups gather 64 sorted x "
                "rows each by cp.async, two decoders write W as e4m3 per 128-K step, promoted in fp32 by its scales), "
                f"{ws['block_m']}-row blocks; epilogues x scales, silu(gate)*up, top-k weights"
            ]
    else:
        ws, ws_why = moe_ws_plan(gate_up, down, rows, experts, DTYPES[dtype], dev)
    if ws:
        return lines + [
            "  path: warp-specialised grouped Gluon GEMMs (moe_ws: the decoder gathers x rows by cp.async and writes W "
            f"per 64-K step into shared memory), {ws['block_m']} rows x {ws['block_n']} weight rows x 64 K, "
            f"{ws['stages']} stages; epilogues silu(gate)*up, top-k weights"
        ]
    kind = moe_tile_kind(gate_up, DTYPES[dtype])
    tiles = moe_tiles(rows, experts, dev.type == "cuda", kind)
    most = slot_max_rows(experts, sum(w.nbytes for w in one))
    slots = takes_slot_blocks(rows, tiles["block_m"], most)
    if slots:
        path = (f"on the top-k ids as given (<= {most} token x slot rows here: a block per row, no moe_align; the "
                "top-k sum in the down GEMM, no moe_sum: two launches, graph-capturable)")  # fmt: skip
    else:
        path = "(moe_align's sorted rows, one launch per projection, graph-capturable"
        if rows > most and tokens <= 16:  # decode sizes: why not slot blocks
            path += f"; {rows} token x slot rows > {most}: blocks a slot would read shared experts again"
        path += ")"
    lines.append(f"  path: grouped Triton GEMMs {path}")
    fused = scheme.granularity.block_shape(2 * inter, hidden)[0] == 1  # gate/up rows interleave: no scale spans rows
    for name, tw, silu in (("gate_up", gate_up, fused), ("down", down, False)):
        p = launch_plan(tw, experts, rows, tiles, silu, dev)
        extras = [f"split-K {p['split_k']}"] + [label for key, label in (
            ("tail_half", "half-width tail blocks"), ("pdl", "PDL"), ("maxnreg", f"<= {p.get('maxnreg')} registers"))
            if p.get(key)]  # fmt: skip
        grid_m = rows if slots else moe_plan_grid_m(rows, experts, p["block_m"])
        if moe_n_first(grid_m, p["split_k"], slots, 0):
            extras.append("N tiles first (a block's x rows and expert weights read once into L2)")
        if frag_rescale(tw, p["block_m"]):
            extras.append("integer codes accumulating in the FP8 MMA in units of each 128-K block's scale "
                          "(frag.A8_RESCALE, where the scales are positive, normal and within 64 binades)")  # fmt: skip
        if two_part_block(p["block_m"]):  # blocks of two parts (`moe_gemm.two_part_why_not`)
            extras.append("blocks of {} + {} rows (the second part only where an expert reaches it)".format(
                *two_parts(p["block_m"])))  # fmt: skip
        epilogue = "silu(gate)*up" if silu else ("top-k weights" if name == "down" else "separate silu*mul")
        epilogue += " and their sum per token" if slots and name == "down" else ""
        layout = "fragment layout" if tw.frag else ("FP8 as stored" if tw.nk else "bit planes")
        bk = frag_block_k(scheme.weight_bits) if tw.frag else moe_block_k(tw, p["block_k"], scheme.act.quantized)
        lines.append(
            f"  {name:7s} N={tw.n} K={tw.k}: {layout}, {p['block_m']} rows x {p['block_n']} weight rows x "
            f"{bk} K, {p['num_warps']} warps, {p['num_stages']} stages, {', '.join(extras)}; "
            f"epilogue {epilogue}"
        )
    lines.append(f"  tiles: moe_tiles kind {kind or 'plain'!r} (anybit/moe/layer.py says what each was measured at)")
    bm = tiles["block_m"]
    short = two_parts(bm)[0] if two_part_block(bm) else (bm // 2 if p.get("tail_half") else 0)  # the down GEMM's plan
    st = block_stats(tokens, top_k, experts, bm, short)
    lines.append(
        f"  blocks: rows an expert ~ Binomial({tokens}, {top_k}/{experts}), mean {st['mean']:.1f}; "
        f"{tiles['block_m']}-row blocks: {st['blocks']:.2f} an expert (each reads its weights), "
        f"{100 * st['spill']:.0f} % of experts spill past one, {100 * st['padding']:.0f} % of the MMA's rows padding"
    )
    return lines + [f"  register-operand grouped kernel (moe_rs) not used: {rs_why}",
                    f"  warp-specialised grouped kernel ({'moe_ws_a8' if gate_up.scheme.act.quantized else 'moe_ws'}) "
                    f"not used: {ws_why}"]  # fmt: skip


def _rs_e2m1_plan(m: int, n: int, k: int, device: torch.device) -> str | None:
    """The register-operand W4A8 kernels for an MXFP4 call under e4m3 x where their rules take it
    (`TritonBackend._ws_a8`: the stream-K form at 65-256 rows by default or 33-`ANYBIT_FRAG_RSW_A8_MAX_M` rows where
    that is set — `rsw_a8_tile` —, the one-tile or stream-K kernel in the wide range with `ANYBIT_FRAG_RS_A8`), else
    None."""
    from anybit.kernels.frag import sm_count
    from anybit.kernels.frag_ws_a8 import RSW_A8_MID_MIN_STEPS, WIDE_MIN_M, rsw_a8_tile, ws_a8_tile

    sms = sm_count(device) or 132
    rule = (f"65-256 rows of weights with >= {RSW_A8_MID_MIN_STEPS} 128-K steps a CTA"
            if not settings.frag_rsw_a8_asked() else "every weight")  # fmt: skip
    t = rsw_a8_tile(m, n, k, sms, e2m1=True)
    switch = f"ANYBIT_FRAG_RSW_A8_MAX_M={settings.frag_rsw_a8_max_m()} ({rule})"
    if t is None and settings.frag_rs_a8() and WIDE_MIN_M < m <= settings.frag_ws_a8_wide_max_m():
        t, switch = ws_a8_tile(m, n, sms, wide=True), f"ANYBIT_FRAG_RS_A8={settings.frag_rs_a8()}"
    if t is None:
        return None
    form = "one tile a CTA"
    if t.get("persistent"):
        form = "its stream-K form (one CTA an SM sharing every tile's 128-K steps)"
    return (
        f"FP8 activations (e4m3 per token), {switch}: MXFP4 weights whose rows' scales lie within 11 binades "
        "(checked when prepared) and N a multiple of 16 run the register-operand W4A8 Gluon kernel, "
        f"{form}, {t.get('tokens', 256)} tokens a tile: two MMA warpgroups of 64 weight rows decode the e2m1 words "
        "by their groups' tables of e4m3 bytes straight into the wgmma's A registers, the FP8 MMA accumulating the "
        "whole K, the rows' powers of two after it — else the routes below"
    )
