"""anybit: JIT-compiled Triton GEMM kernels for quantized LLM inference (1-8 bit weights)."""

from anybit.backends import explain, gemm, prepare
from anybit.errors import AnybitError, CheckpointError, FormatError, QuantizationError, SchemeError
from anybit.formats import PRESETS, FloatType, IntType, Scheme, parse_dtype
from anybit.layers import QuantLinear, load_quantized, quantize_model, save_quantized
from anybit.quant import QuantizedWeight, dequantize_activation, quantize, quantize_activation

__version__ = "0.1.0"

__all__ = [
    # formats and schemes
    "Scheme",
    "PRESETS",
    "IntType",
    "FloatType",
    "parse_dtype",
    # quantization
    "QuantizedWeight",
    "quantize",
    "quantize_activation",
    "dequantize_activation",
    # compute
    "prepare",
    "gemm",
    "explain",
    # layers and models
    "QuantLinear",
    "quantize_model",
    "save_quantized",
    "load_quantized",
    # errors
    "AnybitError",
    "FormatError",
    "SchemeError",
    "QuantizationError",
    "CheckpointError",
    "__version__",
]
