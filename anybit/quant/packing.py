"""Bit packing of 1..8-bit codes into int32 words along the last dimension.

Layout (the GPTQ bit-stream, least significant bit first): along a row, code ``i`` occupies bits
``[i*b, i*b + b)`` of the row's stream of 32-bit little-endian words, i.e. word ``(i*b) // 32`` at
bit ``(i*b) % 32``. For widths that divide 32 (1, 2, 4, 8) a word holds ``32 // b`` whole codes;
for 3, 5, 6 and 7 bits a code may span two consecutive words (its low bits end one word, its high
bits start the next), exactly as GPTQ packs 3-bit weights. A row of K codes takes
``ceil(K*b / 32)`` words; unused high bits of the last word are zero. Words are stored as int32 (the
bit pattern of the uint32 word).
"""

from __future__ import annotations

import torch

from anybit.errors import QuantizationError


def packed_words(k: int, bits: int) -> int:
    """Number of int32 words a row of `k` codes of `bits` bits takes."""
    return (k * bits + 31) // 32


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes: integer tensor [..., K] with values in [0, 2**bits) -> int32 [..., ceil(K*bits/32)]."""
    _check_bits(bits)
    if codes.is_floating_point():
        raise QuantizationError(f"pack_bits takes integer codes, got {codes.dtype}")
    c = codes.long()
    if c.numel() and (int(c.min()) < 0 or int(c.max()) >= 1 << bits):
        raise QuantizationError(
            f"codes span [{int(c.min())}, {int(c.max())}], outside the {bits}-bit range [0, {(1 << bits) - 1}]"
        )
    k = c.shape[-1]
    offset = torch.arange(k, device=c.device) * bits
    word, shift = offset // 32, offset % 32
    n_words = packed_words(k, bits)
    out = torch.zeros(*c.shape[:-1], n_words + 1, dtype=torch.int64, device=c.device)
    # the bit ranges of different codes are disjoint, so adding is the same as or-ing
    out.scatter_add_(-1, word.expand_as(c), (c << shift) & 0xFFFFFFFF)
    out.scatter_add_(-1, (word + 1).expand_as(c), c >> (32 - shift))
    return _to_int32(out[..., :n_words])


def unpack_bits(packed: torch.Tensor, bits: int, k: int) -> torch.Tensor:
    """Inverse of `pack_bits`: int32 [..., words] -> uint8 codes [..., k]."""
    _check_bits(bits)
    if packed.dtype != torch.int32:
        raise QuantizationError(f"packed codes must be int32 words, got {packed.dtype}")
    if packed.shape[-1] != packed_words(k, bits):
        raise QuantizationError(
            f"{packed.shape[-1]} packed words do not hold k={k} codes of {bits} bits "
            f"(that needs {packed_words(k, bits)} words)"
        )
    w = packed.long() & 0xFFFFFFFF
    w = torch.cat([w, torch.zeros_like(w[..., :1])], dim=-1)
    offset = torch.arange(k, device=packed.device) * bits
    word, shift = offset // 32, offset % 32
    lo = w.index_select(-1, word)
    hi = w.index_select(-1, word + 1)
    return ((((hi << 32) | lo) >> shift) & ((1 << bits) - 1)).to(torch.uint8)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def _check_bits(bits: int) -> None:
    if not 1 <= bits <= 8:
        raise QuantizationError(f"bits={bits} cannot be packed; allowed: 1..8")
