import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anybit.errors import QuantizationError
from anybit.quant.packing import pack_bits, packed_words, unpack_bits


@settings(max_examples=60, deadline=None)
@given(bits=st.integers(1, 8), rows=st.integers(1, 5), k=st.integers(1, 200), seed=st.integers(0, 2**31))
def test_round_trip_any_width_and_shape(bits, rows, k, seed):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (rows, k), generator=g, dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.dtype == torch.int32 and packed.shape == (rows, packed_words(k, bits))
    assert torch.equal(unpack_bits(packed, bits, k), codes)


def test_layout_is_gptq_bit_stream():
    # 3-bit: code i at bits [3i, 3i+3) of the stream; code 10 spans words 0 and 1 (bits 30..32)
    codes = torch.zeros(1, 32, dtype=torch.uint8)
    codes[0, 10] = 0b111
    codes[0, 1] = 0b101
    p = pack_bits(codes, 3)
    assert p.shape == (1, 3)
    w0 = p[0, 0].item() & 0xFFFFFFFF
    assert w0 == (0b101 << 3) | (0b11 << 30)
    assert p[0, 1].item() == 0b1
    # 4-bit: eight nibbles per word, first code in the lowest nibble
    c4 = torch.arange(8, dtype=torch.uint8)[None]
    assert pack_bits(c4, 4).item() == 0x76543210


def test_leading_dims_and_errors():
    codes = torch.randint(0, 32, (2, 3, 17), dtype=torch.uint8)
    assert torch.equal(unpack_bits(pack_bits(codes, 5), 5, 17), codes)
    with pytest.raises(QuantizationError, match="outside the 4-bit range"):
        pack_bits(torch.tensor([[16]]), 4)
    with pytest.raises(QuantizationError, match="allowed: 1..8"):
        pack_bits(torch.tensor([[1]]), 9)
    with pytest.raises(QuantizationError, match="do not hold k=10"):
        unpack_bits(torch.zeros(1, 1, dtype=torch.int32), 4, 10)
