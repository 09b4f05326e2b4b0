"""Number formats (dtypes) and quantization schemes."""

from anybit.formats.dtypes import DType, FloatSpecial, FloatType, IntType, TorchFloatType, parse_dtype
from anybit.formats.scheme import PRESETS, ActMode, ActSpec, Granularity, ScaleKind, Scheme, ZeroPoint

__all__ = [
    # dtypes
    "DType",
    "IntType",
    "FloatType",
    "FloatSpecial",
    "TorchFloatType",
    "parse_dtype",
    # schemes
    "Scheme",
    "Granularity",
    "ScaleKind",
    "ZeroPoint",
    "ActSpec",
    "ActMode",
    "PRESETS",
]
