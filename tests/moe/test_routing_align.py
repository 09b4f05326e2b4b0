"""MoE routing and alignment against loop references written from their definitions."""

import os

import pytest
import torch

from anybit.errors import AnybitError
from anybit.moe import grouped_topk, moe_align, softmax_topk


def align_reference(topk_ids, num_experts, block_m, expert_map=None):
    flat = topk_ids.reshape(-1).tolist()
    numel = len(flat)
    local = [(int(expert_map[e]) if expert_map is not None and e >= 0 else e) for e in flat]
    ids, blocks = [], []
    for e in range(num_experts):
        mine = [i for i, le in enumerate(local) if le == e]
        if not mine:
            continue
        pad = -len(mine) % block_m
        ids += mine + [numel] * pad
        blocks += [e] * ((len(mine) + pad) // block_m)
    total = len(ids)
    max_padded = numel + num_experts * (block_m - 1)
    ids += [numel] * (max_padded - total)
    n_blocks = -(-max_padded // block_m)
    blocks += [-1] * (n_blocks - len(blocks))
    return ids, blocks, total


_no_triton = not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
IMPLS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(_no_triton, reason="set TRITON_INTERPRET=1"))]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("e", [4, 19, 64])
@pytest.mark.parametrize("k", [1, 2, 8])
@pytest.mark.parametrize("t", [1, 7, 300])
def test_align_matches_the_contract(e, k, t, impl):
    k = min(k, e)  # top-8 of 4 experts: every expert
    g = torch.Generator().manual_seed(e * 1000 + k * 10 + t)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    ids[ids == 1] = 3 % e  # expert 1 receives nothing (and 3 twice as much)
    if t > 1:
        ids[0, 0] = -1  # a dropped slot
    for block_m in (1, 16, 48, 64, 80):  # 48, 80: blocks of two parts (`moe_gemm.two_part_why_not`)
        sorted_ids, expert_ids, total = moe_align(ids, e, block_m, impl=impl)
        r_ids, r_blocks, r_total = align_reference(ids, e, block_m)
        assert int(total) == r_total
        assert sorted_ids.tolist() == r_ids and expert_ids.tolist() == r_blocks


@pytest.mark.parametrize("impl", IMPLS)
def test_align_expert_parallel_map_skips_non_local_experts(impl):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (50, 4), generator=g).int()
    emap = torch.full((16,), -1, dtype=torch.int32)
    emap[8:] = torch.arange(8, dtype=torch.int32)  # this rank holds global experts 8..15 as 0..7
    sorted_ids, expert_ids, total = moe_align(ids, 8, 16, expert_map=emap, impl=impl)
    r_ids, r_blocks, r_total = align_reference(ids, 8, 16, expert_map=emap)
    assert int(total) == r_total and sorted_ids.tolist() == r_ids and expert_ids.tolist() == r_blocks


def test_softmax_topk():
    logits = torch.randn(5, 12)
    w, ids = softmax_topk(logits, 3)
    p = torch.softmax(logits, -1)
    ref_w, ref_ids = p.topk(3, dim=-1)
    assert torch.equal(ids.long(), ref_ids) and torch.allclose(w, ref_w / ref_w.sum(-1, keepdim=True))
    w2, _ = softmax_topk(logits, 3, renormalize=False)
    assert torch.allclose(w2, ref_w)
    with pytest.raises(AnybitError, match="top-k=13"):
        softmax_topk(logits, 13)


def test_grouped_topk_deepseek_v3():
    g = torch.Generator().manual_seed(1)
    t, e, groups, topk_groups, k = 6, 32, 8, 3, 4
    logits, bias = torch.randn(t, e, generator=g), torch.randn(e, generator=g) * 0.1
    w, ids = grouped_topk(logits, k, groups, topk_groups, bias=bias, scale=2.5)
    s = torch.sigmoid(logits)
    for i in range(t):
        choice = s[i] + bias
        per_group = [sorted(choice[j * 4 : (j + 1) * 4].tolist(), reverse=True)[:2] for j in range(groups)]
        best_groups = sorted(range(groups), key=lambda j: -sum(per_group[j]))[:topk_groups]
        allowed = [x for j in best_groups for x in range(j * 4, (j + 1) * 4)]
        chosen = sorted(allowed, key=lambda x: -choice[x].item())[:k]
        assert sorted(ids[i].tolist()) == sorted(chosen)
        ref = s[i][ids[i].long()]
        assert torch.allclose(w[i], ref / ref.sum() * 2.5)
    with pytest.raises(AnybitError, match="groups"):
        grouped_topk(logits, k, 5, 2)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])  # (the Triton kernels read both as given)
def test_align_many_chunks_and_experts(impl, dtype):
    """8000 entries over 256 experts: the Triton kernels' chunk loops run more than once."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(-1, 256, (1000, 8), generator=g).to(dtype)
    for block_m in (16, 128, 144):
        sorted_ids, expert_ids, total = moe_align(ids, 256, block_m, impl=impl)
        r_ids, r_blocks, r_total = align_reference(ids, 256, block_m)
        assert int(total) == r_total and sorted_ids.tolist() == r_ids and expert_ids.tolist() == r_blocks


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("t", [1, 16, 17])  # <= 128 entries: one Triton launch (decode); 136: the chunked path
@pytest.mark.parametrize("mapped", [False, True])
def test_align_decode_sizes_with_many_experts(impl, t, mapped):
    g = torch.Generator().manual_seed(t)
    ids = torch.stack([torch.randperm(256, generator=g)[:8] for _ in range(t)]).int()
    ids[0, 1] = -1
    emap = None
    if mapped:  # this rank holds global experts 128..255 as 0..127
        emap = torch.full((256,), -1, dtype=torch.int32)
        emap[128:] = torch.arange(128, dtype=torch.int32)
    e = 128 if mapped else 256
    for block_m in (16, 48, 64):
        sorted_ids, expert_ids, total = moe_align(ids, e, block_m, expert_map=emap, impl=impl)
        r_ids, r_blocks, r_total = align_reference(ids, e, block_m, expert_map=emap)
        assert int(total) == r_total and sorted_ids.tolist() == r_ids and expert_ids.tolist() == r_blocks


@pytest.mark.parametrize("impl", IMPLS)
def test_align_ids_past_the_expert_map_are_an_error(impl):
    emap = torch.arange(8, dtype=torch.int32)
    with pytest.raises(AnybitError, match="out of range for an expert_map of 8"):
        moe_align(torch.tensor([[3, 8]], dtype=torch.int32), 8, 16, expert_map=emap, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("t", [2, 40])  # 16 entries: the decode launch checks them itself; 320: chunked
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_align_check_makes_ids_past_the_experts_an_error(impl, t, dtype):
    ids = torch.randint(0, 8, (t, 8), generator=torch.Generator().manual_seed(t)).to(dtype)
    ids[0, 0] = -1  # dropped slots are fine
    r_ids, _, _ = align_reference(ids, 8, 16)
    assert moe_align(ids, 8, 16, impl=impl, check=True)[0].tolist() == r_ids
    ids[-1, 3] = 8
    assert moe_align(ids, 8, 16, impl=impl)[0].tolist() == align_reference(ids, 8, 16)[0]  # unchecked: skipped
    with pytest.raises(AnybitError, match="expert id out of range for 8 experts"):
        moe_align(ids, 8, 16, impl=impl, check=True)
