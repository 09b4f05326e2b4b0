"""Decoders of the fragment layout (`anybit.kernels.frag_layout`), for the kernels in
`anybit.kernels.frag`: a loaded [R, 16] word tile -> the [R, K block] bf16/fp16 (or e4m3) values of
the MMA's A operand, in registers. Two codes per instruction where the format allows (MAGIC + code
pairs, e2m1 placed under the exponent, bytes under the fp32 exponent); the inline-PTX forms (`PTX`)
are for compiled code only and give the same bits as their Triton forms, which the interpreter runs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from anybit.kernels.frag_layout import E2M1_ROT, E2M1_ROT3

# word -> four pairs (MAGIC + nibble j of each half) - OFF, j = 0..3 (`unpack_pairs_minus`)
_PAIRS_MINUS = """{
.reg .b32 t, m, g, c;
mov.b32 m, 0x000F000F;
mov.b32 g, MAGIC;
mov.b32 c, OFF;
lop3.b32 $0, $4, m, g, 0xea;
sub.rn.OP $0, $0, c;
shr.u32 t, $4, 4;
lop3.b32 $1, t, m, g, 0xea;
sub.rn.OP $1, $1, c;
shr.u32 t, $4, 8;
lop3.b32 $2, t, m, g, 0xea;
sub.rn.OP $2, $2, c;
shr.u32 t, $4, 12;
lop3.b32 $3, t, m, g, 0xea;
sub.rn.OP $3, $3, c;
}"""


# the same, minus a per-row DTYPE value $5 (MAGIC + bias + zero point) in both halves (`unpack_pairs_minus_rows`)
_PAIRS_MINUS_ROWS = _PAIRS_MINUS.replace("mov.b32 c, OFF;", "mov.b32 c, {$5, $5};")


def _pairs_minus(op: str, magic: str, off: str, template: str = _PAIRS_MINUS) -> tl.constexpr:
    return tl.constexpr(template.replace("OP", op).replace("MAGIC", magic).replace("OFF", off))


_PAIRS_MINUS_BF16_SIGNED = _pairs_minus("bf16x2", "0x43004300", "0x43084308")  # MAGIC 128, minus 128 + 8
_PAIRS_MINUS_BF16 = _pairs_minus("bf16x2", "0x43004300", "0x43004300")
_PAIRS_MINUS_F16_SIGNED = _pairs_minus("f16x2", "0x64006400", "0x64086408")  # MAGIC 1024, minus 1024 + 8
_PAIRS_MINUS_F16 = _pairs_minus("f16x2", "0x64006400", "0x64006400")
_PAIRS_MINUS_ROWS_BF16 = _pairs_minus("bf16x2", "0x43004300", "", _PAIRS_MINUS_ROWS)
_PAIRS_MINUS_ROWS_F16 = _pairs_minus("f16x2", "0x64006400", "", _PAIRS_MINUS_ROWS)


# fmt: off
@triton.jit
def rows_to_mma(t, R: tl.constexpr, NW: tl.constexpr, C: tl.constexpr):
    """Rename the rows of a loaded [R, C] tile (rows spread over registers, warps, lanes/4) so they
    sit where the wgmma A operand wants them (register, warp, register, lane/4). R >= 16 * NW."""
    t = tl.reshape(t, (R // (16 * NW), 2, NW, 8, C))
    return tl.reshape(tl.permute(t, (0, 2, 1, 3, 4)), (R, C))


@triton.jit
def rows_from_mma(t, R: tl.constexpr, NW: tl.constexpr, C: tl.constexpr):
    """The inverse renaming of `rows_to_mma`, for the accumulator."""
    t = tl.reshape(t, (R // (16 * NW), NW, 2, 8, C))
    return tl.reshape(tl.permute(t, (0, 2, 1, 3, 4)), (R, C))


@triton.jit
def pairs_to_rows(r0, r1, r2, r3, R: tl.constexpr, DTYPE: tl.constexpr):
    """Four [R, 16] int32 tensors, r_j holding the DTYPE pair (k of e = 0, e = 1) of nibble j of every
    word -> [R, 128] DTYPE in natural K order (register renaming only)."""
    rr = tl.join(tl.join(r0, r2), tl.join(r1, r3))  # [R, 16, 2, 2]: the last two dims are j
    lo = rr.to(tl.int16).to(DTYPE, bitcast=True)  # e = 0
    hi = (rr >> 16).to(tl.int16).to(DTYPE, bitcast=True)  # e = 1
    v = tl.reshape(tl.join(lo, hi), (R, 4, 4, 4, 2))  # (t, c, j, e)
    return tl.reshape(tl.permute(v, (0, 2, 3, 1, 4)), (R, 128))  # (c, j, t, e): k = 32c + 8j + 2t + e


@triton.jit
def unpack_pairs(p, R: tl.constexpr, MASK, DTYPE: tl.constexpr):
    """[R, 16] words of one 128-K block -> [R, 128] DTYPE values MAGIC + code in natural K order
    (bf16 MAGIC 128, fp16 1024), exactly; one shift and one LOP3 per two codes."""
    if DTYPE == tl.bfloat16:
        magic: tl.constexpr = 0x43004300
    else:
        magic: tl.constexpr = 0x64006400
    # an opaque zero shift (MASK's sign bit): without it LLVM splits this pair into two scalar adds
    # and two PRMTs swap its halves around the magic subtraction (sm_90a SASS: 33 PRMT per loop)
    r0 = ((p >> (MASK >> 31)) & MASK) | magic
    r1 = ((p >> 4) & MASK) | magic
    r2 = ((p >> 8) & MASK) | magic
    r3 = ((p >> 12) & MASK) | magic
    return pairs_to_rows(r0, r1, r2, r3, R, DTYPE)


@triton.jit
def unpack_pairs_minus(p, R: tl.constexpr, DTYPE: tl.constexpr, SIGNED: tl.constexpr):
    """`unpack_pairs` minus MAGIC (+ 8 for signed codes) in one inline-PTX block per word (compiled code
    only): per pair one shift, one LOP3 and one packed subtraction — Marlin's int4 decode. Written in
    Triton the first pair needs an opaque zero shift to stay packed (`unpack_pairs`), one more
    instruction per word."""
    if DTYPE == tl.bfloat16:
        if SIGNED:
            asm: tl.constexpr = _PAIRS_MINUS_BF16_SIGNED
        else:
            asm: tl.constexpr = _PAIRS_MINUS_BF16
    else:
        if SIGNED:
            asm: tl.constexpr = _PAIRS_MINUS_F16_SIGNED
        else:
            asm: tl.constexpr = _PAIRS_MINUS_F16
    r0, r1, r2, r3 = tl.inline_asm_elementwise(asm, "=r,=r,=r,=r,r", [p], dtype=(tl.int32, tl.int32, tl.int32,
                                               tl.int32), is_pure=True, pack=1)  # fmt: skip
    return pairs_to_rows(r0, r1, r2, r3, R, DTYPE)


@triton.jit
def unpack_pairs_minus_rows(p, z, R: tl.constexpr, DTYPE: tl.constexpr):
    """`unpack_pairs_minus` with a per-row value z [R] (DTYPE: MAGIC + bias + zero point) subtracted
    instead of a constant (compiled code only; `minus_rows` is the Triton form)."""
    zb = tl.broadcast_to(z[:, None], p.shape)
    if DTYPE == tl.bfloat16:
        asm: tl.constexpr = _PAIRS_MINUS_ROWS_BF16
    else:
        asm: tl.constexpr = _PAIRS_MINUS_ROWS_F16
    r0, r1, r2, r3 = tl.inline_asm_elementwise(asm, "=r,=r,=r,=r,r,h", [p, zb], dtype=(tl.int32, tl.int32, tl.int32,
                                               tl.int32), is_pure=True, pack=1)  # fmt: skip
    return pairs_to_rows(r0, r1, r2, r3, R, DTYPE)


@triton.jit
def minus_rows(v, z, PTX: tl.constexpr):
    """v [R, C] minus z [R] (both DTYPE): the decoded codes minus MAGIC + bias + zero point, exact.
    PTX: one packed subtraction per register pair in inline PTX. Written in Triton, ptxas swaps the halves of
    every decoded pair before the packed subtraction and back after it (sm_90a: 2 PRMT per pair, 485
    instead of 367 instructions per w4a16-zp loop); the interpreter has no inline PTX, so CPU runs
    take the Triton form (the same arithmetic)."""
    zb = tl.broadcast_to(z[:, None], v.shape)
    if PTX:
        if v.dtype == tl.bfloat16:
            return tl.inline_asm_elementwise("sub.rn.bf16x2 $0, $1, $2;", "=r,r,r", [v, zb], dtype=tl.bfloat16,
                                             is_pure=True, pack=2)
        else:
            return tl.inline_asm_elementwise("sub.rn.f16x2 $0, $1, $2;", "=r,r,r", [v, zb], dtype=tl.float16,
                                             is_pure=True, pack=2)
    else:
        return v - zb


@triton.jit
def times_groups(w, s, G: tl.constexpr, PTX: tl.constexpr):
    """w [R, 128] times s [R, G] (each scale over 128 // G consecutive K), both DTYPE. PTX: one packed
    multiply per register pair in inline PTX — written in Triton, ptxas swaps the halves of every
    decoded pair around the multiply when nothing else touches the pair first (the folded e2m1 decode,
    `frag_fold`: 2 PRMT per pair); the interpreter takes the Triton form (the same arithmetic)."""
    R: tl.constexpr = w.shape[0]
    w3 = tl.reshape(w, (R, G, 128 // G))
    sb = tl.broadcast_to(s[:, :, None], (R, G, 128 // G))
    if PTX:
        if w.dtype == tl.bfloat16:
            r = tl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [w3, sb], dtype=tl.bfloat16,
                                          is_pure=True, pack=2)
        else:
            r = tl.inline_asm_elementwise("mul.rn.f16x2 $0, $1, $2;", "=r,r,r", [w3, sb], dtype=tl.float16,
                                          is_pure=True, pack=2)
    else:
        r = w3 * sb
    return tl.reshape(r, (R, 128))


@triton.jit
def unpack_pairs2(p, R: tl.constexpr, MASK, DTYPE: tl.constexpr):
    """[R, 4] words of one 64-K quarter block of 2-bit codes (MASK 0x00030003) -> [R, 64] DTYPE values
    MAGIC + code in natural K order of the quarter; one shift and one LOP3 per two codes."""
    if DTYPE == tl.bfloat16:
        magic: tl.constexpr = 0x43004300
    else:
        magic: tl.constexpr = 0x64006400
    r0 = ((p >> (MASK >> 31)) & MASK) | magic  # the opaque zero shift, as in unpack_pairs
    r1 = ((p >> 2) & MASK) | magic
    r2 = ((p >> 4) & MASK) | magic
    r3 = ((p >> 6) & MASK) | magic
    r4 = ((p >> 8) & MASK) | magic
    r5 = ((p >> 10) & MASK) | magic
    r6 = ((p >> 12) & MASK) | magic
    r7 = ((p >> 14) & MASK) | magic
    # field pair f = 4l + j: the nesting puts (l, j) in the last three dims, l outermost
    rr = tl.join(tl.join(tl.join(r0, r4), tl.join(r2, r6)), tl.join(tl.join(r1, r5), tl.join(r3, r7)))
    lo = rr.to(tl.int16).to(DTYPE, bitcast=True)  # e = 0
    hi = (rr >> 16).to(tl.int16).to(DTYPE, bitcast=True)  # e = 1
    v = tl.reshape(tl.join(lo, hi), (R, 4, 2, 4, 2))  # (t, l, j, e)
    return tl.reshape(tl.permute(v, (0, 2, 3, 1, 4)), (R, 64))  # k = 32l + 8j + 2t + e


@triton.jit
def unpack_bytes(p, R: tl.constexpr, MASK, sub, DTYPE: tl.constexpr, PTX: tl.constexpr = False):
    """[R, 16] words of one 64-K block of 8-bit codes -> [R, 64] DTYPE values code - (sub - 2**23) in
    natural K order, exactly: a byte under the fp32 exponent of 2**23 is 2**23 + code, one subtraction
    in fp32 (sub: 2**23 + bias (+ zero point), per row or scalar), then a packed convert per pair.
    PTX: each byte is placed by one PRMT (the decode vLLM's Marlin uses) instead of a shift and a LOP3."""
    if PTX:
        b0, b1, b2, b3 = tl.inline_asm_elementwise(
            "prmt.b32 $0, $4, 0x4B000000, 0x7650; prmt.b32 $1, $4, 0x4B000000, 0x7651; "
            "prmt.b32 $2, $4, 0x4B000000, 0x7652; prmt.b32 $3, $4, 0x4B000000, 0x7653;",
            "=r,=r,=r,=r,r", [p], dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True, pack=1)
        f0 = b0 - sub  # byte 0: j 0, e 0
        f1 = b1 - sub  # j 0, e 1
        f2 = b2 - sub  # j 1, e 0
        f3 = b3 - sub  # j 1, e 1
    else:
        f0 = (((p >> (MASK >> 31)) & MASK) | 0x4B000000).to(tl.float32, bitcast=True) - sub  # byte 0: j 0, e 0
        f1 = (((p >> 8) & MASK) | 0x4B000000).to(tl.float32, bitcast=True) - sub  # j 0, e 1
        f2 = (((p >> 16) & MASK) | 0x4B000000).to(tl.float32, bitcast=True) - sub  # j 1, e 0
        f3 = (((p >> 24) & MASK) | 0x4B000000).to(tl.float32, bitcast=True) - sub  # j 1, e 1
    v = tl.reshape(tl.join(tl.join(f0, f2), tl.join(f1, f3)).to(DTYPE), (R, 4, 4, 2, 2))  # (t, c, j, e)
    return tl.reshape(tl.permute(v, (0, 2, 3, 1, 4)), (R, 64))  # k = 16c + 8j + 2t + e


# the rotations of `frag_layout.e2m1_bit_order` (fp16: exponent and mantissa 3 bits higher than in bf16)
_R1: tl.constexpr = tl.constexpr(E2M1_ROT[1])
_R2: tl.constexpr = tl.constexpr(E2M1_ROT[2])
_R3M: tl.constexpr = tl.constexpr(E2M1_ROT3[0])
_R3: tl.constexpr = tl.constexpr(E2M1_ROT3[1])
_F0: tl.constexpr = tl.constexpr((E2M1_ROT[0] - 3) % 32)
_F1: tl.constexpr = tl.constexpr((E2M1_ROT[1] - 3) % 32)
_F2: tl.constexpr = tl.constexpr((E2M1_ROT[2] - 3) % 32)
_F3M: tl.constexpr = tl.constexpr((E2M1_ROT3[0] - 3) % 32)
_F3: tl.constexpr = tl.constexpr((E2M1_ROT3[1] - 3) % 32)


@triton.jit
def _rotr(u, T: tl.constexpr):
    """uint32 u rotated right by T (one SHF.R.W)."""
    return (u >> T) | (u << (32 - T))


@triton.jit
def unpack_e2m1(p, R: tl.constexpr, MASK, DTYPE: tl.constexpr, FOLD: tl.constexpr = False):
    """[R, 16] words of e2m1 codes (`frag_layout.e2m1_bit_order`) -> [R, 128] exact DTYPE values in natural
    K order: the fields land in DTYPE's bits (bf16: exponent/mantissa at bits 6-8 of each half, a bf16
    subnormal for the two e = 0 codes; fp16: bits 9-11) and one packed multiply by 2**126 (bf16) or 2**14
    (fp16) rebiases them — the decode vLLM's Marlin kernels use for FP4. bf16: pairs 0-2 by one rotation
    and one AND each, pair 3 by two (rotations `E2M1_ROT`, `E2M1_ROT3`); fp16 takes sign and exponent/
    mantissa from different rotations (3 bits apart). FOLD: without the multiply (the caller's group
    scales carry 2**118 / 2**6 instead, `frag_fold`). MASK: unused, kept for the decoders' signature."""
    u = p.to(tl.uint32, bitcast=True)
    if DTYPE == tl.bfloat16:
        rebias: tl.constexpr = 2.0**126
        r0 = u & 0x81C081C0  # E2M1_ROT[0] == 0
        r1 = _rotr(u, _R1) & 0x81C081C0
        r2 = _rotr(u, _R2) & 0x81C081C0
        r3 = (_rotr(u, _R3) & 0x81808180) | (_rotr(u, _R3M) & 0x00400040)
    else:
        rebias: tl.constexpr = 2.0**14
        r0 = (u & 0x80008000) | (_rotr(u, _F0) & 0x0E000E00)
        r1 = (_rotr(u, _R1) & 0x80008000) | (_rotr(u, _F1) & 0x0E000E00)
        r2 = (_rotr(u, _R2) & 0x80008000) | (_rotr(u, _F2) & 0x0E000E00)
        r3 = (_rotr(u, _R3) & 0x80008000) | (_rotr(u, _F3) & 0x0C000C00) | (_rotr(u, _F3M) & 0x02000200)
    w = pairs_to_rows(r0.to(tl.int32, bitcast=True), r1.to(tl.int32, bitcast=True),
                      r2.to(tl.int32, bitcast=True), r3.to(tl.int32, bitcast=True), R, DTYPE)  # fmt: skip
    if FOLD:
        return w
    return w * rebias


@triton.jit
def a8_rows(r0, r1, R: tl.constexpr):
    """Two [R, 16] int32 tensors of FP8 bytes (register j = 0, 1 of every word in the FP8 fragment order) ->
    [R, 128] e4m3 in natural K order (register renaming only)."""
    rr = tl.join(r0, r1)  # [R, 16, 2]: j
    b0 = rr.to(tl.int8)
    b1 = (rr >> 8).to(tl.int8)
    b2 = (rr >> 16).to(tl.int8)
    b3 = (rr >> 24).to(tl.int8)
    b = tl.reshape(tl.join(tl.join(b0, b2), tl.join(b1, b3)), (R, 4, 4, 2, 4))  # (t, c, j, i)
    return tl.reshape(tl.permute(b, (0, 2, 3, 1, 4)), (R, 128)).to(tl.float8e4nv, bitcast=True)


@triton.jit
def unpack_a8(p, R: tl.constexpr, MASK):
    """[R, 16] words in the FP8 fragment order -> [R, 128] e4m3 in natural K order whose bytes are the
    unsigned codes q themselves: e4m3 reads a byte 0..15 as q * 2**-9 exactly (subnormals and the
    first binade). One LOP3 (and one shift) per four codes."""
    r0 = (p >> (MASK >> 31)) & 0x0F0F0F0F  # j = 0 (the opaque zero shift keeps LLVM from splitting it)
    # j = 1 by an opaque 4 too: a constant shift folds into the byte extraction below and ptxas rebuilt
    # every register byte by byte (sm_90a: 48 SHF + 48 PRMT per loop)
    r1 = (p >> ((MASK >> 31) + 4)) & 0x0F0F0F0F
    return a8_rows(r0, r1, R)


def _int32(v: int) -> int:
    v %= 1 << 32
    return v - (1 << 32) if v >= 1 << 31 else v


# e2m1 under FP8 x (`unpack_e2m1_a8`): a group's codes as e4m3 bytes of value * 2**(r + E2M1_A8_SHIFT), r <= 0 its
# ue8m0 code relative to its row's largest (`blockscaled.e2m1_row_scales`: rel code c = 127 + r, r >= -11). The
# look-up table of magnitudes 0, 0.5, 1, 1.5 (low word) and 2, 3, 4, 6 (high word) at r + 6 = 0 is 0x3C383000 /
# 0x4C484440; every binade adds 8 to each byte but the zero's, so the table of code c is c * step + base (one IMAD a
# word): r + 6 in [-5, 6] keeps every byte a normal e4m3 (0x08-0x7C), no carry between bytes
E2M1_A8_SHIFT = 6
E2M1_A8_SPREAD_MAX = 11  # r >= -11: r + 6 >= -5 keeps the table's smallest byte 0x30 - 40 = 0x08 (2**-6, normal)
# Integer codes under FP8 x accumulating in the MMA in units of each block's scale (`frag.frag_rescale`): the group
# scales' largest magnitude over their smallest at most 2**RESCALE_SPREAD (an accumulated |sum| <= 448 * 15 * K stays
# finite in fp32 when rescaled so, and nothing underflows to a subnormal that matters)
RESCALE_SPREAD = 64
_LUT_LO_STEP: tl.constexpr = tl.constexpr(0x08080800)
_LUT_HI_STEP: tl.constexpr = tl.constexpr(0x08080808)
_LUT_LO_BASE: tl.constexpr = tl.constexpr(_int32(0x3C383000 - (127 - E2M1_A8_SHIFT) * 0x08080800))
_LUT_HI_BASE: tl.constexpr = tl.constexpr(_int32(0x4C484440 - (127 - E2M1_A8_SHIFT) * 0x08080808))
_SIGNS: tl.constexpr = tl.constexpr(_int32(0x80808080))

# word -> its two registers of e4m3 bytes by the tables ($3: bytes 0-3, $4: bytes 4-7): the magnitudes with every
# nibble's bit 3 cleared; register 0 by the low half as selector and the signs at the bytes' tops, register 1 by the
# high half shifted down and the signs shifted up 4 (7 instructions a word: 3 LOP3, 2 PRMT, 2 shifts)
_E2M1_A8: tl.constexpr = tl.constexpr("""{
.reg .b32 m, s, t;
and.b32 m, $2, 0x77777777;
prmt.b32 $0, $3, $4, m;
and.b32 t, $2, 0x80808080;
or.b32 $0, $0, t;
shr.u32 s, m, 16;
prmt.b32 $1, $3, $4, s;
shl.b32 t, $2, 4;
and.b32 t, t, 0x80808080;
or.b32 $1, $1, t;
}""")


@triton.jit
def _table_bytes(sel, lo, hi):
    """The Triton form of `prmt.b32 d, lo, hi, sel` (the low half's nibbles' bit 3 clear): byte n of d is byte
    (sel >> 4n) & 7 of the eight-byte table hi:lo."""
    d = sel * 0
    for n in tl.static_range(4):
        idx = (sel >> (4 * n)) & 7
        d |= ((tl.where(idx < 4, lo, hi) >> ((idx & 3) * 8)) & 0xFF) << (8 * n)
    return d


@triton.jit
def unpack_e2m1_a8(p, c, R: tl.constexpr, PTX: tl.constexpr):
    """[R, 16] words of e2m1 codes in the FP8 order (`frag_layout.e2m1_a8_bit_order`) and c [R, 4] the rel codes
    of the block's four 32-K groups (word 4t + g is group g) -> [R, 128] e4m3 in natural K order, each weight
    exactly its e2m1 value times 2**(r + E2M1_A8_SHIFT): per word of eight codes two byte permutes of its
    group's table (built by one IMAD each from the group's code), three LOP3 and two shifts (`_E2M1_A8`)."""
    ci = c.to(tl.int32)
    lo = tl.reshape(tl.broadcast_to((ci * _LUT_LO_STEP + _LUT_LO_BASE)[:, None, :], (R, 4, 4)), (R, 16))
    hi = tl.reshape(tl.broadcast_to((ci * _LUT_HI_STEP + _LUT_HI_BASE)[:, None, :], (R, 4, 4)), (R, 16))
    if PTX:
        r0, r1 = tl.inline_asm_elementwise(_E2M1_A8, "=r,=r,r,r,r", [p, lo, hi], dtype=(tl.int32, tl.int32),
                                           is_pure=True, pack=1)  # fmt: skip
    else:
        m = p & 0x77777777
        r0 = _table_bytes(m, lo, hi) | (p & _SIGNS)
        r1 = _table_bytes((m >> 16) & 0x7777, lo, hi) | ((p << 4) & _SIGNS)
    return a8_rows(r0, r1, R)
# fmt: on
