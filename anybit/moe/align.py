"""`moe_align`: tokens sorted by expert, each expert's run padded to whole blocks of `block_m` rows —
the contract of vLLM's `moe_align_block_size`, which indexed grouped GEMMs consume. Pure torch with
fixed output sizes: no host synchronisation, so it captures into CUDA graphs."""

from __future__ import annotations

import torch

from anybit import settings
from anybit.errors import AnybitError


def moe_align(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    expert_map: torch.Tensor | None = None,
    impl: str = "auto",
    check: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] (global expert ids; -1 = no expert) ->

    * sorted_ids int32 [T*k + E*(block_m-1)]: flat (token*k + slot) indices grouped by expert, each
      expert's run padded to a multiple of block_m with the sentinel T*k;
    * expert_ids int32 [ceil(len(sorted_ids) / block_m)]: the (local) expert of each block, -1 for
      blocks past the padded total;
    * num_tokens_post_padded int32 [1]: the padded total.

    `expert_map` [num_global_experts] maps global ids to local ones (-1: not on this rank) for
    expert parallelism; E = num_experts local experts. Unmapped and -1 ids are skipped.

    impl: "triton" (four small kernels, `anybit.kernels.moe_align`), "torch" (fixed-size torch ops),
    "auto" = triton on a GPU or under TRITON_INTERPRET=1, else torch. Both give identical outputs
    (tokens of one expert in flat-index order). check (without expert_map): ids >= num_experts are an
    error instead of skipped — AnybitError on the CPU, a device-side assert on a GPU (`QuantMoE`)."""
    if topk_ids.dim() != 2:
        raise AnybitError(f"topk_ids must be [tokens, k], got shape {tuple(topk_ids.shape)}")
    if block_m < 1 or num_experts < 1:
        raise AnybitError(f"block_m={block_m} and num_experts={num_experts} must be positive")
    if impl not in ("auto", "torch", "triton"):
        raise AnybitError(f"moe_align impl {impl!r}; valid: auto, torch, triton")
    if expert_map is not None:  # a global id past the map would be read out of bounds: an error, not a skip
        bad = topk_ids >= expert_map.numel()
        if topk_ids.is_cuda:  # no host synchronisation: a device-side assert
            torch._assert_async(~bad.any(), f"expert id out of range for an expert_map of {expert_map.numel()}")
        elif bool(bad.any()):
            raise AnybitError(f"expert id {int(topk_ids.max())} out of range for an expert_map of {expert_map.numel()}")
    if impl == "auto":
        impl = "triton" if topk_ids.is_cuda or settings.triton_interpret() else "torch"
    if impl == "triton":
        from anybit.kernels.moe_align import moe_align_triton

        return moe_align_triton(topk_ids, num_experts, block_m, expert_map, check)
    if check and expert_map is None:
        from anybit.kernels.moe_align import assert_ids

        assert_ids((topk_ids < num_experts).all(), f"expert id out of range for {num_experts} experts")
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    numel = flat.numel()
    if expert_map is not None:
        local = torch.where(flat >= 0, expert_map.long()[flat.clamp(min=0)], flat)
    else:
        local = flat
    valid = (local >= 0) & (local < num_experts)
    key = torch.where(valid, local, num_experts)  # invalid entries sort last
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    seg_start = padded_end - padded
    unpadded_start = counts.cumsum(0) - counts
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    e_idx = sorted_key.clamp(max=num_experts - 1)
    dest = seg_start[e_idx] + torch.arange(numel, device=dev) - unpadded_start[e_idx]
    max_padded = numel + num_experts * (block_m - 1)
    dest = torch.where(sorted_key < num_experts, dest, max_padded)  # invalid: a dump slot past the end
    sorted_ids = torch.full((max_padded + 1,), numel, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    n_blocks = (max_padded + block_m - 1) // block_m
    block_start = torch.arange(n_blocks, device=dev) * block_m
    expert_ids = torch.searchsorted(padded_end, block_start, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1).to(torch.int32)
    return sorted_ids[:max_padded], expert_ids, padded_end[-1:].to(torch.int32)


def moe_align_contiguous(
    offsets: torch.Tensor, num_rows: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The contiguous layout: rows already grouped by expert (expert e owns rows offsets[e] …
    offsets[e+1] - 1 of x, e.g. after an expert-parallel all-to-all) -> the same (sorted_ids,
    expert_ids, num_tokens_post_padded) as `moe_align`, so the indexed grouped GEMM runs it with
    top_k=1 and `num_rows` rows: sorted_ids are row indices padded per expert with the sentinel
    `num_rows`. offsets: integer [E+1], non-decreasing, offsets[0] = 0, offsets[E] <= num_rows (the
    row count is the caller's static bound, so nothing waits on the device). Fixed-size torch ops:
    capturable in CUDA graphs."""
    if offsets.dim() != 1 or offsets.numel() < 2 or offsets.dtype.is_floating_point:
        raise AnybitError(f"offsets must be an integer [E+1] tensor, got {offsets.dtype} {tuple(offsets.shape)}")
    if block_m < 1 or num_rows < 0:
        raise AnybitError(f"block_m={block_m} must be positive and num_rows={num_rows} non-negative")
    off = offsets.long()
    if not off.is_cuda:  # a GPU check would synchronise; the CPU one is free
        bad = (off[0] != 0) | (off[1:] < off[:-1]).any() | (off[-1] > num_rows)
        if bool(bad):
            raise AnybitError(f"offsets {off.tolist()} must start at 0, not decrease and end <= {num_rows}")
    e = off.numel() - 1
    dev = off.device
    counts = off[1:] - off[:-1]
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    seg_start = padded_end - padded
    n_sorted = num_rows + e * (block_m - 1)
    pos = torch.arange(n_sorted, device=dev)
    expert = torch.searchsorted(padded_end, pos, right=True)
    ec = expert.clamp(max=e - 1)
    local = pos - seg_start[ec]
    valid = (expert < e) & (local < counts[ec])
    sorted_ids = torch.where(valid, off[ec] + local, num_rows).to(torch.int32)
    n_blocks = (n_sorted + block_m - 1) // block_m
    block_expert = torch.searchsorted(padded_end, torch.arange(n_blocks, device=dev) * block_m, right=True)
    expert_ids = torch.where(block_expert < e, block_expert, -1).to(torch.int32)
    return sorted_ids, expert_ids, padded_end[-1:].to(torch.int32)
