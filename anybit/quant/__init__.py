"""Weight and activation quantization (reference, torch) and bit packing."""

from anybit.quant.activations import dequantize_activation, quantize_activation
from anybit.quant.packing import pack_bits, packed_words, unpack_bits
from anybit.quant.weights import QuantizedWeight, quantize

__all__ = [
    "QuantizedWeight",
    "quantize",
    "quantize_activation",
    "dequantize_activation",
    "pack_bits",
    "unpack_bits",
    "packed_words",
]
