"""The exceptions anybit raises on bad input. Each message names the value and what would be valid."""


class AnybitError(ValueError):
    """Base of every anybit input error (a ValueError, so generic handlers still catch it)."""


class FormatError(AnybitError):
    """An unknown or impossible number format."""


class SchemeError(AnybitError):
    """A scheme string, dict or field combination that is not valid."""


class QuantizationError(AnybitError):
    """Input that cannot be quantized or dequantized as asked (shape, NaN/Inf, dtype)."""


class CheckpointError(AnybitError):
    """A checkpoint on disk is missing a tensor, has the wrong shape, is truncated or is of an
    unsupported kind; the message names the file, the tensor and what was expected."""


class Unsupported(AnybitError):
    """A backend (or benchmark peer) cannot run this scheme, shape or device; the message says why."""


class KernelFailure(RuntimeError):
    """A kernel failed to compile or launch for a problem the backend said it supports (a compiler
    limit, a tile that does not fit this GPU); the chooser falls back to the next backend."""


class FallbackWarning(UserWarning):
    """A backend's kernel failed for a layer; those calls now run on the next backend."""
