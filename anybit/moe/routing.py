"""Expert routing: softmax top-k (Mixtral, Qwen-MoE) and DeepSeek-V3's grouped top-k with sigmoid
scores and a correction bias. Pure torch, no host synchronisation (CUDA-graph capturable)."""

from __future__ import annotations

import torch

from anybit.errors import AnybitError


def softmax_topk(logits: torch.Tensor, k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (weights fp32 [T, k], ids int32 [T, k]): softmax over experts, the k largest,
    renormalised to sum to 1 per token when `renormalize`."""
    _check(logits, k)
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = probs.topk(k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def grouped_topk(
    logits: torch.Tensor,
    k: int,
    num_groups: int,
    topk_groups: int,
    bias: torch.Tensor | None = None,
    scoring: str = "sigmoid",
    renormalize: bool = True,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing: scores = sigmoid(logits) (or softmax); experts are chosen on
    scores + bias, within the `topk_groups` groups whose two best (biased) scores sum highest; the
    weights are the unbiased scores of the chosen experts, renormalised, times `scale`
    (routed_scaling_factor)."""
    _check(logits, k)
    t, e = logits.shape
    if e % num_groups or not 1 <= topk_groups <= num_groups:
        raise AnybitError(
            f"{e} experts in {num_groups} groups, top {topk_groups} groups: need E % groups == 0 "
            "and 1 <= topk_groups <= num_groups"
        )
    if scoring == "sigmoid":
        scores = torch.sigmoid(logits.float())
    elif scoring == "softmax":
        scores = torch.softmax(logits.float(), dim=-1)
    else:
        raise AnybitError(f"scoring={scoring!r}; valid: 'sigmoid', 'softmax'")
    choice = scores + bias.float() if bias is not None else scores
    grouped = choice.view(t, num_groups, e // num_groups)
    group_score = grouped.topk(min(2, e // num_groups), dim=-1).values.sum(dim=-1)  # [T, G]
    keep = torch.zeros_like(group_score).scatter_(1, group_score.topk(topk_groups, dim=-1).indices, 1.0)
    masked = choice.masked_fill(~keep.bool().repeat_interleave(e // num_groups, dim=1), float("-inf"))
    ids = masked.topk(k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * scale, ids.to(torch.int32)


def _check(logits: torch.Tensor, k: int) -> None:
    if logits.dim() != 2:
        raise AnybitError(f"router logits must be [tokens, experts], got shape {tuple(logits.shape)}")
    if not 1 <= k <= logits.shape[1]:
        raise AnybitError(f"top-k={k} must be between 1 and the number of experts {logits.shape[1]}")
