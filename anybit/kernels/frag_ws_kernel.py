"""The Gluon kernel of `anybit.kernels.frag_ws` (sm_90a): y = x @ dequantize(W)^T for 4- or 8-bit integer or e2m1
(NVFP4, MXFP4) weights in the fragment layout, warp-specialised so that decoding the weight never stalls the
tensor cores (8-bit codes: a 64-K block of their layout is one K step, `_decode_bytes`) — and, row-major tiles only,
integer zero points and 2- and 3-bit codes (`_int_block`: the register-operand kernel's decode pieces).

Per CTA tile (BM rows of x, BN weight rows), two partitions meet at two shared-memory rings:

* decoder (DQ warps): takes each 128-K block of frag words and its scale row by TMA into a ring of its own
  (DEPTH blocks, `_w_fetch`), turns each 64-K half into (q - bias) * s in x's dtype with one LOP3, one packed
  subtraction and one packed multiply per pair of weights (inline PTX) — e2m1: one or two rotations and masks and
  one multiply by the group's scale built from its code (`_e2m1_asm`) —, and stores the [BN, 64] tile into the
  w ring;
* MMA (the default partition, 2 warpgroups): TMA copies of x [BM, 64] into the x ring, STAGES - 1 steps
  ahead, and wgmma with both operands in shared memory, one group in flight; a slot of each ring is
  refilled once the wgmma that read it has retired.

Both wgmma operands come from shared memory, so the register-operand hazard of Triton issue #9433 (a
pending wgmma's A registers rewritten) cannot arise here. Imported only where it runs (Gluon + Hopper).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from anybit.kernels.frag_layout import HIGH1, LOW2, e2m1_pair_terms

_LOW2 = gl.constexpr(LOW2)  # the 3-bit planes' masks (`frag_layout.pack_frag3`)
_HIGH1 = gl.constexpr(HIGH1)


def _pairs_scaled(bf16: bool, bias, width: int = 4, half: int = 0) -> str:
    """word $4 -> four pairs ((MAGIC + code j of each half) - OFF) * (s, s), j = 0..3: one LOP3, one packed subtraction
    and one packed multiply per pair (the subtraction is exact, the multiply rounds once: the bits of dequantize()
    rounded to x's dtype, as the dequantize-then-cuBLAS path gives). width 4: nibble j of each 16-bit half (shift 4j);
    2: field j + 4 half of each half (`frag_layout._frag_order`'s 2-bit words: shift 2j + 8 half)."""
    op = "bf16x2" if bf16 else "f16x2"
    mask = "0x000F000F" if width == 4 else "0x00030003"
    lines = [".reg .b32 t, m, g, c, s;", f"mov.b32 m, {mask};", f"mov.b32 g, {_pairs_off(bf16, 0)};",
             f"mov.b32 c, {_pairs_off(bf16, bias)};", "mov.b32 s, {$5, $5};"]  # fmt: skip
    for j in range(4):
        shift = 4 * j if width == 4 else 2 * j + 8 * half
        src = "$4"
        if shift:
            lines.append(f"shr.u32 t, $4, {shift};")
            src = "t"
        lines += [f"lop3.b32 ${j}, {src}, m, g, 0xea;", f"sub.rn.{op} ${j}, ${j}, c;", f"mul.rn.{op} ${j}, ${j}, s;"]
    return "{\n" + "\n".join(lines) + "\n}"


# (x is bf16 or fp16, codes stored biased: bias 8 for signed 4-bit codes, 4 for signed 3-bit ones rebuilt as 4-bit
# words, 2 for signed 2-bit ones, 0 unsigned) -> the block; MAGIC 128 (bf16) / 1024 (fp16), minus it plus the bias.
# "zp": minus a register ($6, each row's MAGIC + zero point in x's dtype: exact, the zero point is an integer below 256)
def _pairs_off(bf16: bool, bias) -> str:
    magic = 0x4300 if bf16 else 0x6400
    return "{$6, $6}" if bias == "zp" else f"{magic + bias:#06x}{magic + bias:04x}"


_ASM = {
    (bf16, bias, width, half): _pairs_scaled(bf16, bias, width, half)
    for bf16 in (True, False)
    for bias in (0, 2, 4, 8, "zp")
    for width, half in ((4, 0), (2, 0), (2, 1))
}


@gluon.constexpr_function
def _pairs_asm(dtype, signed, bias3=False):
    return _ASM[(dtype == gl.bfloat16, (4 if bias3 else 8) if signed else 0, 4, 0)]


@gluon.constexpr_function
def _pairs_zp_asm(dtype):
    return _ASM[(dtype == gl.bfloat16, "zp", 4, 0)]


@gluon.constexpr_function
def _pairs2_asm(dtype, signed, zp, half):
    return _ASM[(dtype == gl.bfloat16, "zp" if zp else (2 if signed else 0), 2, half)]


def _e2m1_asm(bf16: bool) -> str:
    """word $4 of e2m1 codes (`frag_layout.e2m1_bit_order`) -> its four pairs $0-$3 in x's dtype times the
    scale $5 (pairs 0, 1) or $6 (pairs 2, 3) — given as scale * 2**118 (fp16 2**6), so that the products are
    the weights times 2**-8 exactly: the OR of each pair's rotated and masked terms
    (`frag_layout.e2m1_pair_terms`), one packed multiply."""
    op = "bf16x2" if bf16 else "f16x2"
    lines = [".reg .b32 t, u, m, sa, sb;", "mov.b32 sa, {$5, $5};", "mov.b32 sb, {$6, $6};"]
    for j, terms in enumerate(e2m1_pair_terms(bf16)):
        for i, (rot, mask) in enumerate(terms):
            src = "$4"
            if rot:
                lines.append(f"shf.r.wrap.b32 u, $4, $4, {rot};")
                src = "u"
            lines.append(f"mov.b32 m, {mask:#010x};")
            lines.append(f"and.b32 t, {src}, m;" if i == 0 else f"lop3.b32 t, {src}, m, t, 0xea;")  # (a & b) | c
        lines.append(f"mul.rn.{op} ${j}, t, {'sa' if j < 2 else 'sb'};")
    return "{\n" + "\n".join(lines) + "\n}"


_E2M1_ASM = {True: _e2m1_asm(True), False: _e2m1_asm(False)}


@gluon.constexpr_function
def _e2m1_pairs_asm(dtype):
    return _E2M1_ASM[dtype == gl.bfloat16]


@gluon.constexpr_function
def _pow2(e2m1):
    """What the epilogue multiplies by: e2m1 weights come out of `_e2m1_asm` times 2**-8."""
    return 256.0 if e2m1 else 1.0


# 8-bit codes (a 64-K block of the layout: k = 16c + 8j + 2t + e in word 4t + c at byte e + 2j) -> the word's two
# pairs (j = 0, 1) in x's dtype times the scale $3, exactly (code - bias) * s rounded once. bf16 (7 mantissa bits):
# each byte under fp32's 2**23 by one PRMT (as vLLM's Marlin), one fp32 subtraction of 2**23 + bias, a packed
# convert, a packed multiply; fp16: a byte under 1024 is a half by itself, so one PRMT a pair.
_BYTES_BF16 = (
    "{\n.reg .b32 a, b, s;\nmov.b32 s, {$3, $3};\n"
    + "".join(
        f"prmt.b32 a, $2, 0x4B000000, 0x765{2 * j};\nprmt.b32 b, $2, 0x4B000000, 0x765{2 * j + 1};\n"
        f"sub.f32 a, a, OFF;\nsub.f32 b, b, OFF;\ncvt.rn.bf16x2.f32 ${j}, b, a;\nmul.rn.bf16x2 ${j}, ${j}, s;\n"
        for j in range(2)  # pair j: bytes 2j (its low half) and 2j + 1
    )
    + "}"
)
_BYTES_FP16 = """{
.reg .b32 c, s;
mov.b32 s, {$3, $3};
mov.b32 c, OFF;
prmt.b32 $0, $2, 0x64646464, 0x5140;
prmt.b32 $1, $2, 0x64646464, 0x5342;
sub.rn.f16x2 $0, $0, c;
sub.rn.f16x2 $1, $1, c;
mul.rn.f16x2 $0, $0, s;
mul.rn.f16x2 $1, $1, s;
}"""
_BYTES_ASM = {  # (x is bf16, codes are signed int8 stored biased by 128)
    (True, True): _BYTES_BF16.replace("OFF", "0f4B000080"),
    (True, False): _BYTES_BF16.replace("OFF", "0f4B000000"),
    (False, True): _BYTES_FP16.replace("OFF", "0x64806480"),
    (False, False): _BYTES_FP16.replace("OFF", "0x64006400"),
}


@gluon.constexpr_function
def _bytes_asm(dtype, signed):
    return _BYTES_ASM[(dtype == gl.bfloat16, bool(signed))]


# fmt: off
@gluon.jit
def _x_issue(x_desc, x_bufs, x_ready, off_m, ki, num_k, STAGES: gl.constexpr, k_off=0):
    """x's K step ki (of num_k: none past them) into slot ki % STAGES; k_off: the steps before this CTA's (split K)."""
    BK: gl.constexpr = x_desc.block_type.shape[1]
    s = ki % STAGES
    p = ki < num_k
    mbarrier.expect(x_ready.index(s), x_desc.block_type.nbytes, pred=p)
    tma.async_copy_global_to_shared(x_desc, [off_m, (ki + k_off) * BK], x_ready.index(s), x_bufs.index(s), pred=p)


@gluon.jit
def _pairs(words, s, t, SIGNED: gl.constexpr, E2M1: gl.constexpr, W3: gl.constexpr = False):
    """Words (any shape) -> the four pairs of each, int32 holding two values of x's dtype: pair j of a word holds the
    codes of nibbles j (e = 0) and j + 4 (e = 1), i.e. k = 32 c + 8 j + 2 t + e of word 4t + c
    (`anybit.kernels.frag_layout`). 4-bit integers: (q - bias) * s, s each word's scale; e2m1
    (`frag_layout.e2m1_bit_order`): s the scales of pairs 0, 1 and t of pairs 2, 3 (the same for 32-K groups), as
    `_scale_bits` builds them — the values come out times 2**-8 (the epilogue's `_pow2` puts it back). W3: 3-bit
    codes rebuilt as 4-bit words (`frag_layout.pack_frag3`), whose signed ones are biased by 4."""
    if E2M1:
        r0, r1, r2, r3 = gl.inline_asm_elementwise(_e2m1_pairs_asm(s.dtype), "=r,=r,=r,=r,r,h,h", [words, s, t],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True,
                                                   pack=1)  # fmt: skip
    else:
        r0, r1, r2, r3 = gl.inline_asm_elementwise(_pairs_asm(s.dtype, SIGNED, W3), "=r,=r,=r,=r,r,h", [words, s],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True,
                                                   pack=1)  # fmt: skip
    return r0, r1, r2, r3


@gluon.jit
def _pairs_zp(words, s, zo):
    """`_pairs` of integer codes with zero points: (q - z) * s, zo each word's MAGIC + z beside it in x's dtype (the
    subtraction exact, the multiply rounded once)."""
    r0, r1, r2, r3 = gl.inline_asm_elementwise(_pairs_zp_asm(s.dtype), "=r,=r,=r,=r,r,h,h", [words, s, zo],
                                               dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True,
                                               pack=1)  # fmt: skip
    return r0, r1, r2, r3


@gluon.jit
def _pairs2_half(words, s, zo, SIGNED: gl.constexpr, ZP: gl.constexpr, HALF: gl.constexpr):
    """Pairs (j, HALF) of 2-bit words (`_pairs2`); zo read only with ZP."""
    if ZP:
        return gl.inline_asm_elementwise(_pairs2_asm(s.dtype, SIGNED, ZP, HALF), "=r,=r,=r,=r,r,h,h", [words, s, zo],
                                         dtype=(gl.int32,) * 4, is_pure=True, pack=1)  # fmt: skip
    return gl.inline_asm_elementwise(_pairs2_asm(s.dtype, SIGNED, ZP, HALF), "=r,=r,=r,=r,r,h", [words, s],
                                     dtype=(gl.int32,) * 4, is_pure=True, pack=1)  # fmt: skip


@gluon.jit
def _pairs2(words, s, zo, SIGNED: gl.constexpr, ZP: gl.constexpr):
    """2-bit words [..., 2 (q)] — two 64-K quarters of a row's 256-K block, field j + 4l + 8e of quarter q holding
    k = e + 2t + 8j + 32 (2q + l) (`frag_layout._frag_order`) — and each word's scale (ZP: and MAGIC + z) beside it ->
    the four pairs of the 4-bit layout's words c = 2q + l [..., 4], as `_pairs` gives them for 4-bit codes."""
    a0, a1, a2, a3 = _pairs2_half(words, s, zo, SIGNED, ZP, 0)
    b0, b1, b2, b3 = _pairs2_half(words, s, zo, SIGNED, ZP, 1)
    shape: gl.constexpr = [words.shape[0], words.shape[1], 2 * words.shape[2]]
    return (gl.reshape(gl.join(a0, b0), shape), gl.reshape(gl.join(a1, b1), shape),
            gl.reshape(gl.join(a2, b2), shape), gl.reshape(gl.join(a3, b3), shape))  # fmt: skip


@gluon.jit
def _half_from_pairs(r0, r1, r2, r3, DTYPE: gl.constexpr):
    """Pair j of every word of a half block [BN, 4 (t), 2 (cl)] -> the half [BN, 64] in natural K order."""
    BN: gl.constexpr = r0.shape[0]
    rr = gl.join(gl.join(r0, r2), gl.join(r1, r3))  # [BN, 4, 2, 2, 2]: the last two dims are j = 2a + b
    lo = rr.to(gl.int16).to(DTYPE, bitcast=True)  # e = 0
    hi = (rr >> 16).to(gl.int16).to(DTYPE, bitcast=True)  # e = 1
    v = gl.reshape(gl.join(lo, hi), [BN, 4, 2, 4, 2])  # (t, cl, j, e)
    return gl.reshape(gl.permute(v, [0, 2, 3, 1, 4]), [BN, 64])  # (cl, j, t, e)


@gluon.jit
def _scale_bits(c, KIND: gl.constexpr, DTYPE: gl.constexpr):
    """uint8 scale codes (KIND 1: e4m3, 2: ue8m0) -> scale * 2**118 (bf16) or * 2**6 (fp16) from their bits
    (exact where `TritonWeight.fold_bits`, as the frag kernel's `frag_fold` 2)."""
    c = c.to(gl.int32)
    if DTYPE == gl.bfloat16:
        if KIND == 1:
            b = c * 16 + 0x7700
        else:
            b = c * 128 + 0x3B00
    else:
        if KIND == 1:
            b = c * 128 + 0x3800
        else:
            b = c * 1024 - 0x1A800
    return b.to(gl.int16).to(DTYPE, bitcast=True)


@gluon.jit
def _e2m1_scales(codes, layout: gl.constexpr, KIND: gl.constexpr, DTYPE: gl.constexpr):
    """A block's scale codes in shared memory ([G, BN], G = 4 groups of 32 or 8 of 16) -> the scales of pairs
    0, 1 and of pairs 2, 3 of word c of every row, each [BN, 1, 4] in `layout` (of the words as (n, t, c)): group c
    (32-K groups) or 2c and 2c + 1 (16-K: k = 32c + 8j + 2t + e)."""
    G: gl.constexpr = codes.type.shape[0]
    BN: gl.constexpr = codes.type.shape[1]
    row: gl.constexpr = gl.SliceLayout(1, layout)
    flat2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    v = codes._reinterpret(gl.uint8, [4, (G // 4) * BN], flat2)  # row c: groups (G // 4) c .. of every row
    lo = gl.expand_dims(_scale_bits(v.slice(0, BN, dim=1).permute((1, 0)).load(row), KIND, DTYPE), 1)
    if G == 4:
        hi = lo
    else:
        hi = gl.expand_dims(_scale_bits(v.slice(BN, BN, dim=1).permute((1, 0)).load(row), KIND, DTYPE), 1)
    return lo, hi


@gluon.jit
def _x_gather(x_ptr, x_bufs, x_ready, src_off, rmask, cols, K, ki, STAGES: gl.constexpr):
    """K step ki of the block's x rows (`src_off`: each row's offset in x; padding rows and the K tail
    zero-filled) copied into its slot by cp.async, 16 bytes a thread; the slot's barrier counts this thread's
    arrival once its copies have landed (the MMA warps wait for all of them)."""
    s = ki % STAGES
    k = ki * x_bufs.type.shape[2] + cols
    ptrs = x_ptr + gl.expand_dims(src_off, 1) + gl.expand_dims(k, 0)
    async_copy.async_copy_global_to_shared(x_bufs.index(s), ptrs,
                                           mask=gl.expand_dims(rmask, 1) & gl.expand_dims(k < K, 0))
    async_copy.mbarrier_arrive(x_ready.index(s), increment_count=False)


@gluon.jit
def _w_fetch(w_desc, s_desc, wq, sq, wq_bar, slot, w_row0, s_row0, p0, nb, off_n, b, num_blocks, GB: gl.constexpr,
             SCALE_PER_BLOCK: gl.constexpr, z_desc=None, zq=None, lo_units=0, W3: gl.constexpr = False,
             ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """Block b's words of the tile (one 4 KB TMA copy per 64-row panel) and its scale row into `slot` of the word
    ring (nothing past the last block). TMA, not loads into registers: the decoder's proxy fence (MEMBAR.ALL.CTA +
    FENCE.VIEW.ASYNC) waits for every load the thread has in flight, so loads issued ahead were waited on once per
    block anyway. W3 (3-bit codes, `frag_layout.pack_frag3`): each panel's low unit b // 2 into the slot's first half
    and its high unit lo_units + b // 4 into the second (`_words3`). ZP: its zero-point row(s) (the scale rows' place
    in `z_desc`) into `zq`. W2 (2-bit codes in the register-operand kernel's 128-K blocks): block b's words and scale
    rows are those of the layout's 256-K block b // 2 (fetched once for each of its halves)."""
    if W2:
        bw = b // 2
    else:
        bw = b
    UNITS: gl.constexpr = 2 if W3 else 1
    PANELS: gl.constexpr = wq.type.shape[1] // (4 * UNITS)
    p = b < num_blocks
    nbytes: gl.constexpr = PANELS * UNITS * w_desc.block_type.nbytes + s_desc.block_type.nbytes
    if ZP:
        mbarrier.expect(wq_bar.index(slot), nbytes + z_desc.block_type.nbytes, pred=p)
    else:
        mbarrier.expect(wq_bar.index(slot), nbytes, pred=p)
    for q in gl.static_range(PANELS):
        if W3:
            row = w_row0 + (p0 + q) * nb * 4
            tma.async_copy_global_to_shared(w_desc, [row + (bw // 2) * 4, 0], wq_bar.index(slot),
                                            wq.index(slot).slice(4 * q, 4, dim=0), pred=p)
            tma.async_copy_global_to_shared(w_desc, [row + (lo_units + bw // 4) * 4, 0], wq_bar.index(slot),
                                            wq.index(slot).slice(4 * (PANELS + q), 4, dim=0), pred=p)
        else:
            tma.async_copy_global_to_shared(w_desc, [w_row0 + ((p0 + q) * nb + bw) * 4, 0], wq_bar.index(slot),
                                            wq.index(slot).slice(4 * q, 4, dim=0), pred=p)
    SG: gl.constexpr = sq.type.shape[1]  # scale rows a block (e2m1: its groups)
    if SG > 1:
        srow = s_row0 + bw * SG
    elif SCALE_PER_BLOCK:
        srow = s_row0 + bw // GB
    else:
        srow = s_row0
    tma.async_copy_global_to_shared(s_desc, [srow, off_n], wq_bar.index(slot), sq.index(slot), pred=p)
    if ZP:
        tma.async_copy_global_to_shared(z_desc, [srow, off_n], wq_bar.index(slot), zq.index(slot).slice(0, SG, dim=0),
                                        pred=p)


@gluon.jit
def _w_decoder(w_desc, s_desc, wq, sq, wq_bar, w_row0, s_row0, nb, w_bufs, w_ready, w_empty, off_n, num_blocks,
               x_ptr, x_bufs, x_ready, rows_ptr, off_m, n_rows, num_rows, stride_xm, K,
               SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, SIGNED: gl.constexpr, STAGES: gl.constexpr,
               PANEL: gl.constexpr, GATHER: gl.constexpr, TOP_K: gl.constexpr, E2M1: gl.constexpr = 0, part=0,
               NDEC: gl.constexpr = 1, W8: gl.constexpr = False, z_desc=None, zq=None, W3: gl.constexpr = False,
               ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """Decodes 128-K blocks part, part + NDEC, ... of the weight tile, each as two 64-K slices into the w ring, its
    words and scales arriving by TMA into this partition's slots of a ring of their own (`_w_fetch`, depth - 1
    blocks ahead; slots part * depth on). NDEC partitions overlap one another's chain of latencies per block (the
    barrier, the TMA wait, the proxy fence), which one partition leaves exposed. GATHER (the grouped MoE GEMM, NDEC
    1): also copies each step's x rows — row i of the block is x row rows_ptr[off_m + i] // TOP_K, masked past
    n_rows and where the entry is padding (>= num_rows) — into the x ring, STAGES - 2 steps ahead of the weight
    slice. E2M1 (1: e4m3 scales, 2: ue8m0; 0: 4-bit integers): e2m1 words with a scale code a group
    (`_e2m1_block`). W8: 8-bit integer codes, whose 64-K blocks (the same 16 words a row) are one K step each
    (`_decode_bytes`; not with GATHER). W3, ZP, W2 (dense kernels only): 3-bit codes, integer zero points (their rows
    by TMA from `z_desc` into `zq`), 2-bit codes — 256-K blocks of four K steps (`_int_block`)."""
    gl.static_assert(not ((W8 or W3 or ZP or W2) and GATHER), "8-, 3-, 2-bit codes, zero points: dense kernels only")
    lo_units = 2 * gl.cdiv(K, 512)  # W3: where a row's high units start (`frag_layout.frag3_low_units`)
    D: gl.constexpr = wq.type.shape[0] // NDEC
    ld: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [gl.num_warps(), 1], [1, 0])  # a thread: 16 bytes of a row
    p0 = off_n // PANEL
    base = part * D
    if GATHER:
        BM: gl.constexpr = x_bufs.type.shape[1]
        BK: gl.constexpr = x_bufs.type.shape[2]
        xl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])  # 16 bytes of x a thread
        pos = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, xl))
        slot = gl.load(rows_ptr + pos, mask=pos < n_rows, other=num_rows)
        xmask = slot < num_rows
        src_off = (slot // TOP_K).to(gl.int64) * stride_xm
        cols = gl.arange(0, BK, layout=gl.SliceLayout(0, xl))
        for j in gl.static_range(STAGES - 2):
            _x_ahead(x_ptr, x_bufs, x_ready, w_empty, src_off, xmask, cols, K, j, 2 * num_blocks, STAGES)
    for j in gl.static_range(D - 1):
        _w_fetch(w_desc, s_desc, wq, sq, wq_bar, base + j, w_row0, s_row0, p0, nb, off_n, j * NDEC + part, num_blocks,
                 GB, SCALE_PER_BLOCK, z_desc, zq, lo_units, W3, ZP)
    for i in range(gl.cdiv(num_blocks - part, NDEC)):
        gl.thread_barrier()  # every thread has read slot (i - 1) % D: it takes this partition's block i + D - 1
        _w_fetch(w_desc, s_desc, wq, sq, wq_bar, base + (i + D - 1) % D, w_row0, s_row0, p0, nb, off_n,
                 (i + D - 1) * NDEC + part, num_blocks, GB, SCALE_PER_BLOCK, z_desc, zq, lo_units, W3, ZP)
        q = base + i % D
        mbarrier.wait(wq_bar.index(q), (i // D) & 1)
        if W8:  # one K step: the block's 64 K
            cur, sc = _row_words(wq.index(q), sq.index(q), ld)
            _put(_decode_bytes(cur, sc, SIGNED), w_bufs, w_ready, w_empty, i * NDEC + part, STAGES)
        elif W3 or ZP or W2:
            _int_block(wq, sq, zq, q, i * NDEC + part, w_bufs, w_ready, w_empty, ld, SIGNED, STAGES, W3, ZP, W2)
        else:
            k0 = 2 * (i * NDEC + part)  # this block's two K steps go to slots k0 % STAGES and (k0 + 1) % STAGES
            if E2M1:
                h0, h1, s0, s1, t0, t1 = _e2m1_block(wq.index(q), sq.index(q), E2M1, w_bufs.dtype)
            else:
                cur, sc = _row_words(wq.index(q), sq.index(q), ld)
                h0, h1 = _halves(cur)
                s0, s1 = _halves(sc)
                t0, t1 = s0, s1
            if GATHER:  # each step's x goes out STAGES - 2 steps ahead of its weight; each slice handed over alone
                _x_ahead(x_ptr, x_bufs, x_ready, w_empty, src_off, xmask, cols, K, k0 + STAGES - 2, 2 * num_blocks,
                         STAGES)
                _put(_decode(h0, s0, t0, SIGNED, E2M1), w_bufs, w_ready, w_empty, k0, STAGES)
                _x_ahead(x_ptr, x_bufs, x_ready, w_empty, src_off, xmask, cols, K, k0 + STAGES - 1, 2 * num_blocks,
                         STAGES)
                _put(_decode(h1, s1, t1, SIGNED, E2M1), w_bufs, w_ready, w_empty, k0 + 1, STAGES)
            else:
                v = _decode(h0, s0, t0, SIGNED, E2M1)
                mbarrier.wait(w_empty.index(k0 % STAGES), ((k0 // STAGES) & 1) ^ 1)
                w_bufs.index(k0 % STAGES).store(v)
                v = _decode(h1, s1, t1, SIGNED, E2M1)
                mbarrier.wait(w_empty.index((k0 + 1) % STAGES), (((k0 + 1) // STAGES) & 1) ^ 1)
                w_bufs.index((k0 + 1) % STAGES).store(v)
                fence_async_shared()  # the generic-proxy stores, before the wgmma (async proxy) reads them
                mbarrier.arrive(w_ready.index(k0 % STAGES), count=1)
                mbarrier.arrive(w_ready.index((k0 + 1) % STAGES), count=1)


@gluon.jit
def _row_words(words, scales, ld: gl.constexpr):
    """An integer block in the decoder's ring -> its words [BN, 16] in `ld` (a thread: 16 bytes of a row) and each
    row's scale beside each of its words."""
    BN: gl.constexpr = scales.type.shape[1]
    flat2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    cur = words._reinterpret(gl.int32, [BN, 16], flat2).load(ld)
    sc = scales._reinterpret(scales.dtype, [BN], flat1).load(gl.SliceLayout(1, ld))
    sc, _ = gl.broadcast(gl.expand_dims(sc, 1), cur)
    return cur, sc


@gluon.jit
def _halves(t):
    """[BN, 16] per word of a block (word 4t + 2h + cl) -> its two halves h = 0, 1, each [BN, 4 (t), 2 (cl)]."""
    return gl.split(gl.permute(gl.reshape(t, [t.shape[0], 4, 2, 2]), [0, 1, 3, 2]))


@gluon.jit
def _e2m1_block(words, codes, KIND: gl.constexpr, DTYPE: gl.constexpr):
    """A block of e2m1 words and its scale codes in the decoder's ring -> the words of each half and the scales
    of pairs 0, 1 and 2, 3 beside each word (`_halves` of each, `_e2m1_scales`): the words loaded as (n, t, c),
    a thread's four words one row's c = 0..3, so that its scales are that row's groups of the block."""
    BN: gl.constexpr = codes.type.shape[1]
    ld3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [8, 4, 1], [gl.num_warps(), 1, 1], [2, 1, 0])
    flat3: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0])
    cur = words._reinterpret(gl.int32, [BN, 4, 4], flat3).load(ld3)
    lo, hi = _e2m1_scales(codes, ld3, KIND, DTYPE)
    lo, _ = gl.broadcast(lo, cur)
    hi, _ = gl.broadcast(hi, cur)
    h0, h1 = _halves(gl.reshape(cur, [BN, 16]))
    s0, s1 = _halves(gl.reshape(lo, [BN, 16]))
    t0, t1 = _halves(gl.reshape(hi, [BN, 16]))
    return h0, h1, s0, s1, t0, t1


@gluon.jit
def _decode(h, s, t, SIGNED: gl.constexpr, E2M1: gl.constexpr):
    """A half block's words [BN, 4 (t), 2 (cl)] -> [BN, 64] in x's dtype, natural K order (`_pairs`)."""
    r0, r1, r2, r3 = _pairs(h, s, t, SIGNED, E2M1)
    return _half_from_pairs(r0, r1, r2, r3, s.dtype)


@gluon.jit
def _byte_values(words, s, SIGNED: gl.constexpr):
    """8-bit words (any shape) and each word's scale beside it -> their values [..., 2 (j), 2 (e)] in x's dtype: byte
    e + 2j of each word less its bias, times the scale (`_bytes_asm`)."""
    r0, r1 = gl.inline_asm_elementwise(_bytes_asm(s.dtype, SIGNED), "=r,=r,r,h", [words, s],
                                       dtype=(gl.int32, gl.int32), is_pure=True, pack=1)  # fmt: skip
    rr = gl.join(r0, r1)  # [..., 2 (j)]
    lo = rr.to(gl.int16).to(s.dtype, bitcast=True)  # e = 0
    hi = (rr >> 16).to(gl.int16).to(s.dtype, bitcast=True)  # e = 1
    return gl.join(lo, hi)


@gluon.jit
def _decode_bytes(words, s, SIGNED: gl.constexpr):
    """A 64-K block of 8-bit words [BN, 16] (word 4t + c) and each word's scale beside it -> [BN, 64] in x's dtype,
    natural K order (byte e + 2j of word 4t + c holds k = 16c + 8j + 2t + e: `_byte_values`)."""
    BN: gl.constexpr = words.shape[0]
    v = gl.reshape(_byte_values(words, s, SIGNED), [BN, 4, 4, 2, 2])  # (t, c, j, e)
    return gl.reshape(gl.permute(v, [0, 2, 3, 1, 4]), [BN, 64])  # (c, j, t, e)


@gluon.jit
def _words3(lo, hi, kb):
    """A 128-K block's 4-bit words of 3-bit codes from its low and high units of the 3-bit planes
    (`frag_layout.pack_frag3`; kb: the block's index in the whole K, whose parity picks the units' bits)."""
    return ((lo >> (2 * (kb % 2))) & _LOW2) | (((hi >> (kb % 4)) & _HIGH1) << 2)


@gluon.jit
def _zero_offsets(z, DTYPE: gl.constexpr):
    """uint8 zero points -> MAGIC + z in x's dtype (`_pairs_off`'s MAGIC; exact: an integer below 256 added to 128 or
    1024)."""
    return (z.to(gl.float32) + (128.0 if DTYPE == gl.bfloat16 else 1024.0)).to(DTYPE)


@gluon.jit
def _int_words(slot, kb, ld: gl.constexpr, W3: gl.constexpr):
    """An integer block's words [BN, 16] in `ld` from its slot of the decoder's ring (W3: rebuilt from the slot's low
    and high units, `_words3`)."""
    flat2: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
    ROWS: gl.constexpr = slot.type.shape[0] * 16  # rows of 16 words in the slot (W3: two units of BN)
    units = slot._reinterpret(gl.int32, [ROWS, 16], flat2)
    if W3:
        words = _words3(units.slice(0, ROWS // 2, dim=0).load(ld), units.slice(ROWS // 2, ROWS // 2, dim=0).load(ld),
                        kb)  # fmt: skip
    else:
        words = units.load(ld)
    return words


@gluon.jit
def _row_vals(buf, row: gl.constexpr, words):
    """Row `row` of a slot's per-row values [rows, BN] (scales, zero points), each beside each of the row's words
    ([BN, 16] in their layout)."""
    flat1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    BN: gl.constexpr = words.shape[0]
    rows = buf._reinterpret(buf.dtype, [buf.type.shape[0] * BN], flat1)
    v = rows.slice(row * BN, BN).load(gl.SliceLayout(1, words.type.layout))
    v, _ = gl.broadcast(gl.expand_dims(v, 1), words)
    return v


@gluon.jit
def _quarter(t, st: gl.constexpr):
    """[BN, 16] per word of a 2-bit block (word 4t + st holds its 64-K step st) -> step st's [BN, 4 (t), 1]."""
    q0, q1 = gl.split(gl.reshape(t, [t.shape[0], 4, 2, 2]))  # (t, h, q): st = 2h + q
    if st % 2 == 0:
        u = q0
    else:
        u = q1
    h0, h1 = gl.split(u)
    if st // 2 == 0:
        r = h0
    else:
        r = h1
    return gl.expand_dims(r, 2)


@gluon.jit
def _int_step(h, s, zo, SIGNED: gl.constexpr, W3: gl.constexpr, ZP: gl.constexpr, W2: gl.constexpr):
    """64 K of integer words [BN, 4 (t), 2 (cl)] (W2: [BN, 4 (t), 1], `_pairs2`), each word's scale and (ZP) MAGIC +
    zero point beside it -> [BN, 64] in x's dtype, natural K order."""
    if W2:
        r0, r1, r2, r3 = _pairs2(h, s, zo, SIGNED, ZP)
    elif ZP:
        r0, r1, r2, r3 = _pairs_zp(h, s, zo)
    else:
        r0, r1, r2, r3 = _pairs(h, s, s, SIGNED, 0, W3)
    return _half_from_pairs(r0, r1, r2, r3, s.dtype)


@gluon.jit
def _stage(v, w_bufs, w_empty, j, STAGES: gl.constexpr):
    """Step j's decoded slice into its slot once the slot is free (handed over by `_hand_over`)."""
    mbarrier.wait(w_empty.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
    w_bufs.index(j % STAGES).store(v)


@gluon.jit
def _hand_over(w_ready, j, STAGES: gl.constexpr):
    """Steps j and j + 1, stored (`_stage`), to the MMA partition."""
    fence_async_shared()  # the generic-proxy stores, before the wgmma (async proxy) reads them
    mbarrier.arrive(w_ready.index(j % STAGES), count=1)
    mbarrier.arrive(w_ready.index((j + 1) % STAGES), count=1)


@gluon.jit
def _int_block(wq, sq, zq, q, kb, w_bufs, w_ready, w_empty, ld: gl.constexpr, SIGNED: gl.constexpr,
               STAGES: gl.constexpr, W3: gl.constexpr, ZP: gl.constexpr, W2: gl.constexpr):
    """Integer block kb of the tile (3-bit codes, zero points, 2-bit codes: what `_w_decoder`'s 4-bit path does not
    decode) from slot q of the decoder's ring -> its 64-K steps into the w ring, two at a time: a 128-K block's two
    halves (`_halves`), or a 2-bit 256-K block's four steps (`_quarter`; 64-K groups: scale and zero-point row st of
    the slot for step st)."""
    cur = _int_words(wq.index(q), kb, ld, W3)
    DTYPE: gl.constexpr = w_bufs.dtype
    if W2:
        SG: gl.constexpr = sq.type.shape[1]
        for st in gl.static_range(4):  # (scale row st // (4 // SG): st in 64-K groups, else 0)
            sc = _row_vals(sq.index(q), st // (4 // SG), cur)
            zo = sc
            if ZP:
                zo = _zero_offsets(_row_vals(zq.index(q), st // (4 // SG), cur), DTYPE)
            v = _int_step(_quarter(cur, st), _quarter(sc, st), _quarter(zo, st), SIGNED, W3, ZP, W2)
            _stage(v, w_bufs, w_empty, 4 * kb + st, STAGES)
            if st % 2 == 1:
                _hand_over(w_ready, 4 * kb + st - 1, STAGES)
    else:
        sc = _row_vals(sq.index(q), 0, cur)
        zo = sc
        if ZP:
            zo = _zero_offsets(_row_vals(zq.index(q), 0, cur), DTYPE)
        h0, h1 = _halves(cur)
        s0, s1 = _halves(sc)
        z0, z1 = _halves(zo)
        _stage(_int_step(h0, s0, z0, SIGNED, W3, ZP, W2), w_bufs, w_empty, 2 * kb, STAGES)
        _stage(_int_step(h1, s1, z1, SIGNED, W3, ZP, W2), w_bufs, w_empty, 2 * kb + 1, STAGES)
        _hand_over(w_ready, 2 * kb, STAGES)


@gluon.jit
def _put(v, w_bufs, w_ready, w_empty, j, STAGES: gl.constexpr):
    """Step j's decoded slice into its slot once the slot is free, handed to the MMA partition."""
    mbarrier.wait(w_empty.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
    w_bufs.index(j % STAGES).store(v)
    fence_async_shared()  # the generic-proxy stores, before the wgmma (async proxy) reads them
    mbarrier.arrive(w_ready.index(j % STAGES), count=1)


@gluon.jit
def _x_ahead(x_ptr, x_bufs, x_ready, w_empty, src_off, rmask, cols, K, j, num_k, STAGES: gl.constexpr):
    """Step j's x copies, once its slot is free (nothing past the last step)."""
    if j < num_k:
        mbarrier.wait(w_empty.index(j % STAGES), ((j // STAGES) & 1) ^ 1)
        _x_gather(x_ptr, x_bufs, x_ready, src_off, rmask, cols, K, j, STAGES)


@gluon.jit
def _mma_loop(x_desc, x_bufs, w_bufs, x_ready, w_ready, w_empty, off_m, num_k, STAGES: gl.constexpr,
              GATHER: gl.constexpr):
    """The K loop of the default partition: x through TMA (STAGES - 1 steps ahead, into the slot the last
    retired wgmma read) unless the decoder gathers it (GATHER), the weight slices from the decoder, wgmma
    with one group in flight. Returns the fp32 [BM, BN] accumulator."""
    BM: gl.constexpr = x_bufs.type.shape[1]
    BN: gl.constexpr = w_bufs.type.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                     instr_shape=[16, BN, 16])
    if not GATHER:
        for i in gl.static_range(STAGES - 1):
            _x_issue(x_desc, x_bufs, x_ready, off_m, i, num_k, STAGES)
    acc = gl.zeros((BM, BN), dtype=gl.float32, layout=layout)
    for ki in range(num_k):
        s = ki % STAGES
        phase = (ki // STAGES) & 1
        mbarrier.wait(x_ready.index(s), phase)
        if GATHER:
            fence_async_shared()  # x came by cp.async (generic proxy); the wgmma reads it through the async one
        mbarrier.wait(w_ready.index(s), phase)
        acc = warpgroup_mma(x_bufs.index(s), w_bufs.index(s).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        # the wgmma of step ki - 1 has retired: its slots take step ki + STAGES - 1
        mbarrier.arrive(w_empty.index((ki + STAGES - 1) % STAGES), count=1, pred=ki > 0)
        if not GATHER:
            _x_issue(x_desc, x_bufs, x_ready, off_m, ki + STAGES - 1, num_k, STAGES)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def _mma(x_desc, x_bufs, w_bufs, x_ready, w_ready, w_empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m,
         off_n, num_k, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr, POW2: gl.constexpr, HAS_GS: gl.constexpr,
         ROW_SCALES: gl.constexpr):
    """The dense default partition: the K loop, then the epilogue (here, at this partition's register count:
    the kernel's own is the 64K register file over every warp)."""
    acc = _mma_loop(x_desc, x_bufs, w_bufs, x_ready, w_ready, w_empty, off_m, num_k, STAGES, False)
    _store_tile(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES, HAS_BIAS, gs_ptr, POW2,
                HAS_GS)


@gluon.jit
def _tile_index(acc, off_m, off_n, SWAPPED: gl.constexpr):
    """acc's token rows and weight columns (in y); tokens run along acc's dimension 1, or 0 where SWAPPED."""
    d0 = gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, acc.type.layout))
    d1 = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
    if SWAPPED:  # weight rows down, tokens across: a token vector is expanded along dim 0
        return off_m + d1, off_n + d0
    else:
        return off_m + d0, off_n + d1


@gluon.jit
def _scaled(acc, xs_ptr, M, off_m, ROW_SCALES: gl.constexpr, gs_ptr=None, POW2: gl.constexpr = 1.0,
            HAS_GS: gl.constexpr = False, SWAPPED: gl.constexpr = False):
    """acc (* POW2) (* the weight's global scale, HAS_GS) (* each row's x scale, ROW_SCALES) — `_store_tile`'s."""
    rows, _ = _tile_index(acc, off_m, 0, SWAPPED)
    TA: gl.constexpr = 0 if SWAPPED else 1
    if HAS_GS:
        acc = acc * (gl.load(gs_ptr) * POW2)
    elif POW2 != 1.0:
        acc = acc * POW2
    if ROW_SCALES:
        acc = acc * gl.expand_dims(gl.load(xs_ptr + rows, mask=rows < M, other=0.0), TA)
    return acc


@gluon.jit
def _store_tile(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES: gl.constexpr,
                HAS_BIAS: gl.constexpr, gs_ptr=None, POW2: gl.constexpr = 1.0, HAS_GS: gl.constexpr = False,
                SWAPPED: gl.constexpr = False):
    """The dense kernels' epilogue: y = acc (* POW2, the weights' power of two left out of the decode) (* the
    weight's global scale, HAS_GS) (* each row's x scale, ROW_SCALES) (+ bias), inside [M, N]. acc: [tokens from
    off_m, weight rows from off_n], or the transpose (SWAPPED, `frag_ws_swap_kernel`)."""
    rows, cols = _tile_index(acc, off_m, off_n, SWAPPED)
    TA: gl.constexpr = 0 if SWAPPED else 1
    acc = _scaled(acc, xs_ptr, M, off_m, ROW_SCALES, gs_ptr, POW2, HAS_GS, SWAPPED)
    if HAS_BIAS:
        acc = acc + gl.expand_dims(gl.load(bias_ptr + cols, mask=cols < N, other=0).to(gl.float32), 1 - TA)
    ptrs = y_ptr + gl.expand_dims(rows.to(gl.int64) * stride_ym, TA) + gl.expand_dims(cols, 1 - TA)
    gl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=gl.expand_dims(rows < M, TA) & gl.expand_dims(cols < N, 1 - TA))


@gluon.jit
def _tile_origin(M, N, BM: gl.constexpr, BN: gl.constexpr, GROUP_M: gl.constexpr, pid=None):
    """This CTA's (off_m, off_n) in the grouped tile order (L2: GROUP_M row tiles of x share each decoded weight
    tile's neighbours); pid: the tile's index in that order (default the CTA's, `program_id(0)`)."""
    if pid is None:
        pid = gl.program_id(0)
    num_m = gl.cdiv(M, BM)
    num_n = gl.cdiv(N, BN)
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size = gl.minimum(num_m - first_m, GROUP_M)
    return (first_m + (pid % group) % size) * BM, ((pid % group) // size) * BN


@gluon.jit
def _rings(x_layout: gl.constexpr, dtype: gl.constexpr, w_desc, s_desc, BM: gl.constexpr, BN: gl.constexpr,
           BK: gl.constexpr, STAGES: gl.constexpr, DEPTH: gl.constexpr, X_ARRIVALS: gl.constexpr,
           W3: gl.constexpr = False):
    """Both kernels' shared memory: the x and w rings (STAGES slots, x's barrier counting X_ARRIVALS: 1 for a TMA
    copy, every decoder thread for a gather), and the decoder's TMA ring of DEPTH blocks of the tile's words (4
    rows of 256 words per 64-row panel; W3: twice, a low and a high unit) and scale rows (one a block; e2m1: one a
    group; 2-bit codes in 64-K groups: four), one barrier per slot."""
    x_bufs = gl.allocate_shared_memory(dtype, [STAGES, BM, BK], x_layout)
    w_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BN, BK], dtype)
    w_bufs = gl.allocate_shared_memory(dtype, [STAGES, BN, BK], w_layout)
    x_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    w_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    w_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(x_ready.index(i), count=X_ARRIVALS)
        mbarrier.init(w_ready.index(i), count=1)
        mbarrier.init(w_empty.index(i), count=1)
    wq = gl.allocate_shared_memory(gl.int32, [DEPTH, BN // 8 if W3 else BN // 16, 256], w_desc.layout)
    sq = gl.allocate_shared_memory(s_desc.dtype, [DEPTH, s_desc.block_type.shape[0], BN], s_desc.layout)
    wq_bar = gl.allocate_shared_memory(gl.int64, [DEPTH, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(DEPTH):
        mbarrier.init(wq_bar.index(i), count=1)
    return x_bufs, w_bufs, x_ready, w_ready, w_empty, wq, sq, wq_bar


@gluon.jit
def _dense_decoder(w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, w_ready, w_empty, off_n, num_blocks, K,
                   SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr, SIGNED: gl.constexpr, STAGES: gl.constexpr,
                   PANEL: gl.constexpr, E2M1: gl.constexpr, part, NDEC: gl.constexpr, W8: gl.constexpr, z_desc, zq,
                   W3: gl.constexpr, ZP: gl.constexpr, W2: gl.constexpr):
    """`_w_decoder` of one weight (no x gather): decoder `part` of NDEC."""
    _w_decoder(w_desc, s_desc, wq, sq, wq_bar, 0, 0, nb, w_bufs, w_ready, w_empty, off_n, num_blocks, w_bufs, w_bufs,
               w_ready, w_bufs, 0, 0, 0, 0, K, SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, False, 1, E2M1, part, NDEC,
               W8, z_desc, zq, W3, ZP, W2)


@gluon.jit
def _zero_ring(z_desc, sq, BN: gl.constexpr, DEPTH: gl.constexpr, ZP: gl.constexpr):
    """The decoder's ring of zero-point rows (ZP; its rows as the scale ring's, each slot a multiple of 128 bytes: a
    TMA copy's shared destination must be 128-byte aligned), or the scale ring standing in."""
    if ZP:
        SG: gl.constexpr = z_desc.block_type.shape[0]
        zq = gl.allocate_shared_memory(gl.uint8, [DEPTH, max(SG, 128 // BN), BN], z_desc.layout)
    else:
        zq = sq
    return zq


@gluon.constexpr_function
def _steps(W8, W2):
    """K steps (64 K) a block of the layout: 1 for 8-bit codes, 4 for 2-bit ones (256 K), else 2."""
    return 1 if W8 else (4 if W2 else 2)


@gluon.jit
def frag_ws_kernel(x_desc, w_desc, s_desc, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N, K, nb, stride_ym, z_desc,
                   BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, DQ_WARPS: gl.constexpr,
                   DQ_REGS: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr,
                   SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, PANEL: gl.constexpr, DEPTH: gl.constexpr,
                   E2M1: gl.constexpr, HAS_GS: gl.constexpr, ROW_SCALES: gl.constexpr, NDEC: gl.constexpr,
                   W8: gl.constexpr = False, W3: gl.constexpr = False, ZP: gl.constexpr = False,
                   W2: gl.constexpr = False):
    BM: gl.constexpr = x_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    gl.static_assert(BK == 64, "a K step is half a 128-K frag block (an 8-bit one: W8; a quarter of a 2-bit one: W2)")
    gl.static_assert(not ((W2 or W3 or ZP) and (W8 or E2M1)), "2- or 3-bit codes and zero points: integer words")
    dtype: gl.constexpr = x_desc.dtype
    off_m, off_n = _tile_origin(M, N, BM, BN, GROUP_M)

    x_layout: gl.constexpr = x_desc.layout
    x_bufs, w_bufs, x_ready, w_ready, w_empty, wq, sq, wq_bar = _rings(x_layout, dtype, w_desc, s_desc, BM, BN, BK,
                                                                       STAGES, NDEC * DEPTH, 1, W3)  # x: one TMA copy
    zq = _zero_ring(z_desc, sq, BN, NDEC * DEPTH, ZP)
    STEPS: gl.constexpr = _steps(W8, W2)
    num_blocks = gl.cdiv(K, STEPS * BK)
    num_k = STEPS * num_blocks  # x past K is zero-filled by TMA, the frag codes there are 0
    # The partitions' argument tuples are written out in each branch: bound to a variable, a tuple loses its
    # constexprs (STAGES became an int32), and warp_specialize takes no function passed as a constexpr (Triton 3.6).
    if NDEC == 1:
        gl.warp_specialize([
            (_mma, (x_desc, x_bufs, w_bufs, x_ready, w_ready, w_empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N, stride_ym,
                off_m, off_n, num_k, STAGES, HAS_BIAS, _pow2(E2M1), HAS_GS, ROW_SCALES)),
            (_dense_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, w_ready, w_empty, off_n, num_blocks, K,
                              SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, E2M1, 0, 1, W8, z_desc, zq, W3, ZP, W2)),
        ], [DQ_WARPS], [DQ_REGS])
    else:  # two decoders: even and odd blocks
        gl.warp_specialize([
            (_mma, (x_desc, x_bufs, w_bufs, x_ready, w_ready, w_empty, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N, stride_ym,
                off_m, off_n, num_k, STAGES, HAS_BIAS, _pow2(E2M1), HAS_GS, ROW_SCALES)),
            (_dense_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, w_ready, w_empty, off_n, num_blocks, K,
                              SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, E2M1, 0, 2, W8, z_desc, zq, W3, ZP, W2)),
            (_dense_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, w_ready, w_empty, off_n, num_blocks, K,
                              SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, E2M1, 1, 2, W8, z_desc, zq, W3, ZP, W2)),
        ], [DQ_WARPS, DQ_WARPS], [DQ_REGS, DQ_REGS])
# fmt: on


# fmt: off
@gluon.jit
def _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, ki, num_k, STAGES: gl.constexpr, TWO: gl.constexpr,
              k_off=0):
    """`_x_issue` of a swapped tile's x: BM1 rows, and (TWO) the BM2 rows after them by a second copy (Gluon's
    tensors are powers of two: 192 tokens are 128 + 64)."""
    if TWO:
        BK: gl.constexpr = x_desc.block_type.shape[1]
        BM1: gl.constexpr = x_desc.block_type.shape[0]
        s = ki % STAGES
        p = ki < num_k
        kx = (ki + k_off) * BK
        mbarrier.expect(x_ready.index(s), x_desc.block_type.nbytes + x2_desc.block_type.nbytes, pred=p)
        tma.async_copy_global_to_shared(x_desc, [off_m, kx], x_ready.index(s), x_bufs.index(s), pred=p)
        tma.async_copy_global_to_shared(x2_desc, [off_m + BM1, kx], x_ready.index(s), x2_bufs.index(s), pred=p)
    else:
        _x_issue(x_desc, x_bufs, x_ready, off_m, ki, num_k, STAGES, k_off)


@gluon.jit
def _mma_loop_swap(x_desc, x2_desc, x_bufs, x2_bufs, w_bufs, x_ready, w_ready, w_empty, off_m, num_k,
                   STAGES: gl.constexpr, TWO: gl.constexpr):
    """`_mma_loop` with the roles swapped: the weight slice [BN, 64] is the wgmma's A operand (each warpgroup 64
    weight rows) and x its B, N = BM1 tokens — and BM2 more into a second accumulator (TWO). Returns the fp32
    [BN, BM1] and [BN, BM2] accumulators (the second a copy of the first without TWO)."""
    BM1: gl.constexpr = x_bufs.type.shape[1]
    BM2: gl.constexpr = x2_bufs.type.shape[1]
    BN: gl.constexpr = w_bufs.type.shape[1]
    l1: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                 instr_shape=[16, BM1, 16])
    l2: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[gl.num_warps(), 1],
                                                 instr_shape=[16, BM2, 16])
    for i in gl.static_range(STAGES - 1):
        _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, i, num_k, STAGES, TWO)
    acc = gl.zeros((BN, BM1), dtype=gl.float32, layout=l1)
    acc2 = gl.zeros((BN, BM2), dtype=gl.float32, layout=l2)
    for ki in range(num_k):
        s = ki % STAGES
        phase = (ki // STAGES) & 1
        mbarrier.wait(x_ready.index(s), phase)
        mbarrier.wait(w_ready.index(s), phase)
        acc = warpgroup_mma(w_bufs.index(s), x_bufs.index(s).permute((1, 0)), acc, is_async=True)
        if TWO:
            acc2 = warpgroup_mma(w_bufs.index(s), x2_bufs.index(s).permute((1, 0)), acc2, is_async=True)
            acc, acc2 = warpgroup_mma_wait(num_outstanding=2, deps=(acc, acc2))
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        mbarrier.arrive(w_empty.index((ki + STAGES - 1) % STAGES), count=1, pred=ki > 0)
        _x_issue2(x_desc, x2_desc, x_bufs, x2_bufs, x_ready, off_m, ki + STAGES - 1, num_k, STAGES, TWO)
    if TWO:
        acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, acc2


@gluon.jit
def _mma_swap(x_desc, x2_desc, x_bufs, x2_bufs, w_bufs, x_ready, w_ready, w_empty, xs_ptr, gs_ptr, bias_ptr, y_ptr,
              M, N, stride_ym, off_m, off_n, num_k, STAGES: gl.constexpr, HAS_BIAS: gl.constexpr,
              POW2: gl.constexpr, HAS_GS: gl.constexpr, ROW_SCALES: gl.constexpr, TWO: gl.constexpr):
    """The swapped default partition: its K loop, then the epilogue of each accumulator."""
    acc, acc2 = _mma_loop_swap(x_desc, x2_desc, x_bufs, x2_bufs, w_bufs, x_ready, w_ready, w_empty, off_m, num_k,
                               STAGES, TWO)
    _store_tile(acc, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m, off_n, ROW_SCALES, HAS_BIAS, gs_ptr, POW2,
                HAS_GS, True)
    if TWO:
        _store_tile(acc2, xs_ptr, bias_ptr, y_ptr, M, N, stride_ym, off_m + x_bufs.type.shape[1], off_n, ROW_SCALES,
                    HAS_BIAS, gs_ptr, POW2, HAS_GS, True)


@gluon.jit
def frag_ws_swap_kernel(x_desc, x2_desc, w_desc, s_desc, xs_ptr, gs_ptr, bias_ptr, y_ptr, M, N, K, nb, stride_ym,
                        z_desc, BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, DQ_WARPS: gl.constexpr,
                        DQ_REGS: gl.constexpr, SCALE_PER_BLOCK: gl.constexpr, GB: gl.constexpr,
                        SIGNED: gl.constexpr, HAS_BIAS: gl.constexpr, PANEL: gl.constexpr, DEPTH: gl.constexpr,
                        E2M1: gl.constexpr, HAS_GS: gl.constexpr, ROW_SCALES: gl.constexpr,
                        TWO: gl.constexpr, NDEC: gl.constexpr, W8: gl.constexpr = False, W3: gl.constexpr = False,
                        ZP: gl.constexpr = False, W2: gl.constexpr = False):
    """`frag_ws_kernel` with the weight tile as the wgmma's A operand and x as its B (`_mma_loop_swap`): BN weight
    rows (64 a warpgroup of the default partition) by BM1 (+ BM2, TWO) tokens, x's TMA blocks — 192 tokens in one
    tile (128 + 64) where the row-major tiles take 256, and 64-row weight tiles for twice the CTAs."""
    BM1: gl.constexpr = x_desc.block_type.shape[0]
    BM2: gl.constexpr = x2_desc.block_type.shape[0]
    BK: gl.constexpr = x_desc.block_type.shape[1]
    gl.static_assert(BK == 64, "a K step is half a 128-K frag block (an 8-bit one: W8)")
    dtype: gl.constexpr = x_desc.dtype
    if TWO:
        BM: gl.constexpr = BM1 + BM2
    else:
        BM: gl.constexpr = BM1
    off_m, off_n = _tile_origin(M, N, BM, BN, GROUP_M)
    x_layout: gl.constexpr = x_desc.layout
    x_bufs, w_bufs, x_ready, w_ready, w_empty, wq, sq, wq_bar = _rings(x_layout, dtype, w_desc, s_desc, BM1, BN, BK,
                                                                       STAGES, NDEC * DEPTH, 1, W3)
    zq = _zero_ring(z_desc, sq, BN, NDEC * DEPTH, ZP)
    x2_layout: gl.constexpr = x2_desc.layout
    if TWO:
        x2_bufs = gl.allocate_shared_memory(dtype, [STAGES, BM2, BK], x2_layout)
    else:
        x2_bufs = x_bufs
    STEPS: gl.constexpr = _steps(W8, W2)
    num_blocks = gl.cdiv(K, STEPS * BK)
    if NDEC == 1:  # the argument tuples written out in each branch, as in `frag_ws_kernel`
        gl.warp_specialize([
            (_mma_swap, (x_desc, x2_desc, x_bufs, x2_bufs, w_bufs, x_ready, w_ready, w_empty, xs_ptr, gs_ptr, bias_ptr,
                     y_ptr, M, N, stride_ym, off_m, off_n, STEPS * num_blocks, STAGES, HAS_BIAS, _pow2(E2M1), HAS_GS,
                     ROW_SCALES, TWO)),
            (_dense_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, w_ready, w_empty, off_n, num_blocks, K,
                              SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, E2M1, 0, 1, W8, z_desc, zq, W3, ZP, W2)),
        ], [DQ_WARPS], [DQ_REGS])
    else:  # two decoders: even and odd blocks
        gl.warp_specialize([
            (_mma_swap, (x_desc, x2_desc, x_bufs, x2_bufs, w_bufs, x_ready, w_ready, w_empty, xs_ptr, gs_ptr, bias_ptr,
                     y_ptr, M, N, stride_ym, off_m, off_n, STEPS * num_blocks, STAGES, HAS_BIAS, _pow2(E2M1), HAS_GS,
                     ROW_SCALES, TWO)),
            (_dense_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, w_ready, w_empty, off_n, num_blocks, K,
                              SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, E2M1, 0, 2, W8, z_desc, zq, W3, ZP, W2)),
            (_dense_decoder, (w_desc, s_desc, wq, sq, wq_bar, nb, w_bufs, w_ready, w_empty, off_n, num_blocks, K,
                              SCALE_PER_BLOCK, GB, SIGNED, STAGES, PANEL, E2M1, 1, 2, W8, z_desc, zq, W3, ZP, W2)),
        ], [DQ_WARPS, DQ_WARPS], [DQ_REGS, DQ_REGS])
# fmt: on
