"""Persistent tuning results: the best kernel configuration per problem, measured on this GPU."""

from anybit.tuning.cache import TuningCache, device_key, m_bucket

__all__ = ["TuningCache", "device_key", "m_bucket"]
