"""Mixture-of-Experts building blocks: routing and the token alignment grouped GEMMs consume."""

from anybit.moe.align import moe_align, moe_align_contiguous
from anybit.moe.layer import QuantMoE
from anybit.moe.routing import grouped_topk, softmax_topk

__all__ = ["QuantMoE", "grouped_topk", "moe_align", "moe_align_contiguous", "softmax_topk"]
