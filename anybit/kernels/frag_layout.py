"""The fragment layout's packing (host side): int32 words holding 2-, 4- or 8-bit codes in the order
a Hopper wgmma A fragment consumes them, stored in panels of 64 rows; `pack_frag` and its inverse
`unpack_frag` (tests, the torch view of a prepared weight). The kernels that read it are in
`anybit.kernels.frag`, their decoders in `anybit.kernels.frag_decode`.

4 bits: int32 [N, K_pad/8], K padded to 128; in each 128-K block of a row the 16 words are numbered
w = 4t + c, and code k = e + 2t + 8j + 32c sits in word 4t + c at nibble j + 4e (FP8 activations:
k = i + 4t + 16j + 32c at nibble 2i + j; 2 and 8 bits: `_frag_order`). e2m1 codes (`e2m1=True`): the same
words with each code's four bits moved (`e2m1_bit_order`), so that a bf16 pair comes out of a word by
one rotation and one AND; under FP8 activations (`a8=True, e2m1=True`) the FP8 order with the magnitudes of
each register's four codes as the nibbles of one byte-permute selector (`e2m1_a8_bit_order`).
"""

from __future__ import annotations

import torch

FRAG_K = 128  # K block of the 4-bit layout (and of its kernels' main loop); 2-bit blocks are 256
FRAG_WORDS = 16  # int32 words per block of a row, every width: a thread's share is one 16-byte load


def frag_block_k(bits: int) -> int:
    """K per block of the layout: 16 words of `bits`-bit codes (128 for 4 bits, 256 for 2, 64 for 8); 3-bit codes
    run in the 4-bit blocks (`pack_frag3`)."""
    if bits not in (2, 3, 4, 8):
        raise ValueError(f"the fragment layout holds 2-, 3-, 4- or 8-bit codes, got bits={bits}")
    return 128 if bits == 3 else FRAG_WORDS * 32 // bits


# Rows per panel of the packed weight: a panel holds block 0 of its rows, then block 1, ..., so a tile's
# block is two contiguous 4 KB runs (4 bits) rather than 128 scattered 64-byte pieces. H200, W4A16 M=16:
# 28672x4096 27.2 -> 23.8 us, DeepSeek-V3 MoE gate_up 616 -> 444 us, down 296 -> 241 us (BENCHMARKS.md).
FRAG_PANEL = 64

PAIR_MASK = 0x000F000F  # passed at run time: ptxas then fuses the and/or into one LOP3


def _frag_order(a8: bool = False, bits: int = 4) -> torch.Tensor:
    """inv[(32 // bits) * w + p] = the k of the block stored in word w at field p. bf16/fp16 MMA (A
    fragment: pairs of k): 4-bit k = e + 2t + 8j + 32c in word 4t + c at nibble j + 4e; 2-bit (256-K
    blocks), c = 2q + l: word 4t + q at field j + 4l + 8e, so each 64-K quarter q is one word per
    thread; 8-bit (64-K blocks): k = e + 2t + 8j + 16c in word 4t + c at byte e + 2j. FP8 MMA (`a8`,
    4-bit, k32 steps, four consecutive k per register): k = i + 4t + 16j + 32c in word 4t + c at
    nibble 2i + j, so ``(word >> 4j) & 0x0F0F0F0F`` is one register of four FP8 bytes."""
    inv = [0] * frag_block_k(bits)
    for k in range(frag_block_k(bits)):
        if a8:
            i, t, j, c = k & 3, (k >> 2) & 3, (k >> 4) & 1, k >> 5
            inv[8 * (4 * t + c) + 2 * i + j] = k
        elif bits == 2:
            e, t, j, c = k & 1, (k >> 1) & 3, (k >> 3) & 3, k >> 5
            inv[16 * (4 * t + (c >> 1)) + j + 4 * (c & 1) + 8 * e] = k
        elif bits == 8:
            e, t, j, c = k & 1, (k >> 1) & 3, (k >> 3) & 1, k >> 4
            inv[4 * (4 * t + c) + e + 2 * j] = k
        else:
            e, t, j, c = k & 1, (k >> 1) & 3, (k >> 3) & 3, k >> 5
            inv[8 * (4 * t + c) + j + 4 * e] = k
    return torch.tensor(inv)


# e2m1 words: code bits (mantissa, exponent low, exponent high, sign) go where the bf16 decode wants them
# (bits 6, 7, 8, 15 of each half: a subnormal bf16 of value * 2**-126, `unpack_e2m1`) after a rotation
# right: nibble j < 3 of both halves by E2M1_ROT[j] (then one AND with 0x81C081C0), nibble 3's mantissa
# by E2M1_ROT3[0], its sign and exponent by E2M1_ROT3[1]. 9 instructions a word instead of 15 (two
# shifts and two LOP3 a pair); three whole pairs is the most 32 bits hold (searched exhaustively).
E2M1_ROT = (0, 4, 10)
E2M1_ROT3 = (14, 6)
_E2M1_BF16_BITS = (6, 7, 8, 15)


def e2m1_bit_order() -> list[int]:
    """new[b] = where bit b of a 4-bit layout word (nibble j + 4e holds the code of pair j, half e) sits
    in the e2m1 word."""
    new = [0] * 32
    for j in range(4):
        for e in range(2):
            for b in range(4):
                rot = E2M1_ROT[j] if j < 3 else E2M1_ROT3[0 if b == 0 else 1]
                new[4 * j + 16 * e + b] = (_E2M1_BF16_BITS[b] + 16 * e + rot) % 32
    assert sorted(new) == list(range(32)), "the e2m1 word order is not a permutation"
    return new


def e2m1_pair_terms(bf16: bool) -> list[list[tuple[int, int]]]:
    """For pair j of an e2m1 word (`e2m1_bit_order`): the (rotation right, mask) terms whose OR is the pair as
    x's dtype times 2**-126 (bf16) or 2**-14 (fp16): bf16 pairs 0-2 one term, pair 3 two (mantissa apart); fp16
    takes the sign from the bf16 rotation and exponent/mantissa from one 3 bits less (`frag_decode.unpack_e2m1`
    in Triton, the warp-specialised decoder's inline PTX in `frag_ws_kernel`)."""
    if bf16:
        return [[(E2M1_ROT[j], 0x81C081C0)] for j in range(3)] + [
            [(E2M1_ROT3[1], 0x81808180), (E2M1_ROT3[0], 0x00400040)]
        ]
    terms = [[(E2M1_ROT[j], 0x80008000), ((E2M1_ROT[j] - 3) % 32, 0x0E000E00)] for j in range(3)]
    r3m, r3 = E2M1_ROT3
    return terms + [[(r3, 0x80008000), ((r3 - 3) % 32, 0x0C000C00), ((r3m - 3) % 32, 0x02000200)]]


def e2m1_a8_bit_order() -> list[int]:
    """new[b] = where bit b of an FP8-order word (nibble 2i + j holds code i of register j) sits in the e2m1 word
    of the FP8 MMA (`frag_decode.unpack_e2m1_a8`): the magnitudes (bits 0-2) of register 0's codes in the low
    nibbles' bits 0-2, register 1's in the high half's, so each half is a PRMT selector of a look-up table of
    eight e4m3 bytes once its nibbles' bit 3 are cleared; code i's sign at bit 8i + 7 (register 0: one AND puts
    the signs on the bytes) or 8i + 3 (register 1: a shift by 4 first)."""
    new = [0] * 32
    for i in range(4):
        for j in range(2):
            for b in range(3):
                new[4 * (2 * i + j) + b] = 16 * j + 4 * i + b
            new[4 * (2 * i + j) + 3] = 8 * i + (7 if j == 0 else 3)
    assert sorted(new) == list(range(32)), "the e2m1 FP8 word order is not a permutation"
    return new


def _permute_bits(words: torch.Tensor, order: list[int]) -> torch.Tensor:
    """int64 words (0 <= w < 2**32) with bit b moved to order[b], by one look-up per byte."""
    byte = torch.arange(256, device=words.device)
    out = torch.zeros_like(words)
    for i in range(4):
        lut = sum(((byte >> b) & 1) << order[8 * i + b] for b in range(8))
        out |= lut[(words >> (8 * i)) & 0xFF]
    return out


def frag_mask(bits: int) -> int:
    """The pair mask the kernels take at run time (ptxas then fuses the and/or into one LOP3)."""
    frag_block_k(bits)  # names an unsupported width
    return {4: PAIR_MASK, 3: PAIR_MASK, 2: 0x00030003, 8: 0xFF}[bits]


def pack_frag(codes: torch.Tensor, a8: bool = False, bits: int = 4, e2m1: bool = False) -> torch.Tensor:
    """uint8 `bits`-bit codes (4 or 2) [..., N, K] -> int32 [..., N, K_pad * bits / 32] in the fragment
    order (`a8`: the FP8 MMA's; K padded with code 0 to a multiple of the block, `frag_block_k`;
    kernels mask the activations there). e2m1: 4-bit e2m1 codes, bits in `e2m1_bit_order` (`a8`:
    `e2m1_a8_bit_order`)."""
    if e2m1 and bits != 4:
        raise ValueError(f"the e2m1 word orders hold 4-bit codes, got bits={bits}")
    *lead, n, k = codes.shape
    c = codes.to(torch.int64)
    kb = frag_block_k(bits)
    pad = -k % kb
    if pad:
        c = torch.cat([c, c.new_zeros(*lead, n, pad)], dim=-1)
    fields = 32 // bits
    blocks = c.reshape(*lead, n, -1, kb)[..., _frag_order(a8, bits).to(c.device)]
    shifted = blocks.reshape(*lead, n, -1, FRAG_WORDS, fields) << (torch.arange(fields, device=c.device) * bits)
    words = shifted.sum(dim=-1).reshape(*lead, n, -1)  # disjoint fields: the sum is the OR
    if e2m1:
        words = _permute_bits(words, e2m1_a8_bit_order() if a8 else e2m1_bit_order())
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return to_panels(words, FRAG_PANEL)


def to_panels(words: torch.Tensor, panel: int) -> torch.Tensor:
    """[..., N, KW] words -> [..., N_pad, KW] (N padded with zero rows to a multiple of `panel`) whose
    memory holds panels of `panel` rows, each panel block after block ([N_pad / panel, blocks, panel,
    16])."""
    *lead, n, kw = words.shape
    pad = -n % panel
    if pad:
        words = torch.cat([words, words.new_zeros(*lead, pad, kw)], dim=-2)
    p = words.reshape(*lead, (n + pad) // panel, panel, kw // FRAG_WORDS, FRAG_WORDS).transpose(-2, -3)
    return p.contiguous().reshape(*lead, n + pad, kw)


def from_panels(words: torch.Tensor, n: int, panel: int) -> torch.Tensor:
    """The inverse of `to_panels`: [..., N, KW] rows one after another."""
    *lead, n_pad, kw = words.shape
    p = words.reshape(*lead, n_pad // panel, kw // FRAG_WORDS, panel, FRAG_WORDS).transpose(-2, -3)
    return p.reshape(*lead, n_pad, kw)[..., :n, :]


def unpack_frag(
    words: torch.Tensor, k: int, a8: bool = False, bits: int = 4, n: int | None = None, e2m1: bool = False
) -> torch.Tensor:
    """The inverse of `pack_frag` (tests, and the torch view of a prepared weight): uint8 [..., N, K]
    (the first n rows: the packing pads N to whole panels)."""
    words = from_panels(words, words.shape[-2] if n is None else n, FRAG_PANEL)
    *lead, n, kw = words.shape
    fields = 32 // bits
    w = words.to(torch.int64).reshape(*lead, n, -1, FRAG_WORDS, 1) & 0xFFFFFFFF
    if e2m1:
        order = e2m1_a8_bit_order() if a8 else e2m1_bit_order()
        w = _permute_bits(w, [order.index(b) for b in range(32)])
    f = (w >> (torch.arange(fields, device=words.device) * bits)) & ((1 << bits) - 1)
    f = f.reshape(*lead, n, -1, frag_block_k(bits))
    out = torch.empty_like(f)
    out[..., _frag_order(a8, bits).to(words.device)] = f
    return out.reshape(*lead, n, kw * fields)[..., :k].to(torch.uint8)


# 3-bit codes: the 4-bit layout's words (`pack_frag`, codes 0-7) split into two planes that hold 3 bits a code. A row's
# "units" are 16 words each, in panels as the 4-bit blocks are (`to_panels`): first K_pad/256 low units — unit u holds
# the low two bits of every nibble of 4-bit blocks 2u (bits 4j, 4j+1) and 2u + 1 (bits 4j+2, 4j+3) —, then K_pad/512
# high units — unit v holds bit 2 of every nibble of blocks 4v + i at bit 4j + i. K is padded to 512. A kernel
# rebuilds block b's 4-bit words from two 16-word loads with the same per-thread shape as the 4-bit layout's
# (`frag3_words`): ((lo >> 2 (b % 2)) & 0x33333333) | (((hi >> (b % 4)) & 0x11111111) << 2).
FRAG3_K = 512
LOW2 = 0x33333333
HIGH1 = 0x11111111


def frag3_low_units(k: int) -> int:
    """How many low units (16 words) a row of a K-long 3-bit weight holds: the high units start there."""
    return 2 * (-(-k // FRAG3_K))


def pack_frag3(codes: torch.Tensor) -> torch.Tensor:
    """uint8 3-bit codes [N, K] -> int32 [N_pad, 3 * K_pad / 64] (K_pad a multiple of FRAG3_K, N of FRAG_PANEL): the
    low and high units of the 4-bit layout's words in panels (see FRAG3_K)."""
    n, k = codes.shape
    pad = -k % FRAG3_K
    c = torch.nn.functional.pad(codes, (0, pad)) if pad else codes
    w = from_panels(pack_frag(c, bits=4), n, FRAG_PANEL).to(torch.int64) & 0xFFFFFFFF
    w = w.reshape(n, -1, FRAG_WORDS)  # [N, 4-bit blocks, 16]
    lo = (w[:, 0::2] & LOW2) | ((w[:, 1::2] & LOW2) << 2)
    hi = sum(((w[:, i::4] >> 2) & HIGH1) << i for i in range(4))
    words = torch.cat([lo, hi], dim=1).reshape(n, -1)
    words = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    return to_panels(words, FRAG_PANEL)


def unpack_frag3(words: torch.Tensor, k: int, n: int) -> torch.Tensor:
    """The inverse of `pack_frag3`: uint8 [n, k]."""
    units = from_panels(words, n, FRAG_PANEL).to(torch.int64).reshape(n, -1, FRAG_WORDS) & 0xFFFFFFFF
    low = frag3_low_units(k)
    lo, hi = units[:, :low], units[:, low:]
    blocks = 2 * low
    w = torch.empty(n, blocks, FRAG_WORDS, dtype=torch.int64, device=words.device)
    for b in range(4):
        if b < blocks:
            w[:, b::4] = ((lo[:, b // 2 :: 2] >> (2 * (b % 2))) & LOW2) | (((hi >> b) & HIGH1) << 2)
    w = torch.where(w >= 1 << 31, w - (1 << 32), w).to(torch.int32).reshape(n, -1)
    return unpack_frag(to_panels(w, FRAG_PANEL), k, bits=4, n=n)
