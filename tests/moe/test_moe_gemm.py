"""The indexed grouped Triton GEMM (interpreter, fp16) against per-slot products with the exact
dequantized experts; rows are poisoned first so unwritten rows show."""

import pytest
import torch

import anybit
from anybit.backends.triton_layout import stack_experts
from anybit.kernels.moe_gemm import moe_decode_plan, moe_gemm
from anybit.moe import moe_align
from anybit.moe.layer import down_tiles, moe_tiles
from tests.tolerances import GEMM_REL_ERR, rel_err


@pytest.mark.parametrize("scheme", ["w4a16", "w4a16-zp", "nvfp4", "mxfp4", "w8a16", "w3a16"])
@pytest.mark.parametrize("e, k, t", [(4, 2, 7), (19, 1, 13), (6, 3, 1)])
def test_grouped_gemm_matches_per_slot_products(interpret, scheme, e, k, t):
    g = torch.Generator().manual_seed(e * 7 + k + t)
    n, kk = 40, 256  # N off the tile
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme)
    tw = stack_experts(qw)
    x = torch.randn(t, kk, generator=g).half()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    ids[0, 0] = -1 if t > 1 else ids[0, 0]
    sorted_ids, expert_ids, total = moe_align(ids, e, 16)
    y = torch.full((t * k, n), float("nan"), dtype=torch.float16)
    moe_gemm(x, tw, sorted_ids, expert_ids, total, block_m=16, num_rows=t * k, top_k=k, out=y)
    w = qw.dequantize().double()
    for r in range(t * k):
        ex = int(ids.view(-1)[r])
        if ex < 0:
            assert torch.isnan(y[r]).all()  # a dropped slot is not written
            continue
        ref = x[r // k].double() @ w[ex].T
        assert rel_err(y[r], ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize(
    "scheme", ["w4a8", "w8a8-fp8", "w8a8:e4m3:g128:fp32:e4m3-token", "w4a8-mxfp4", "w4a8-nvfp4", "fp8-block"]
)
def test_grouped_gemm_with_fp8_activations(interpret, scheme):
    """FP8 x (per-token scales; FP8-block: per row and 128 columns, applied per K tile) against per-slot
    products built from the kernel's own quantized x; e4m3 experts under e4m3 x are read as stored
    ([E, N, K], no bit planes), with channel, 128-K group or 128x128 block scales."""
    from anybit.kernels.quant_act import quantize_act
    from anybit.quant.activations import dequantize_activation

    g = torch.Generator().manual_seed(11)
    e, k, t, n, kk = 5, 2, 9, 40, 256
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme)
    x = torch.randn(t, kk, generator=g).half()
    tw = stack_experts(qw)
    assert tw.nk == (scheme.startswith("w8a8") or scheme == "fp8-block")
    # NVFP4 experts: the A16 kernel on x's codes in fp16; MXFP4 the FP8 MMA by look-up tables (`e2m1_a8`)
    assert tw.codes_a16 == (scheme == "w4a8-nvfp4") and tw.e2m1_a8 == (scheme == "w4a8-mxfp4")
    xq, xs = quantize_act(x, qw.scheme.act, codes_dtype=x.dtype if tw.codes_a16 else None)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    sorted_ids, expert_ids, total = moe_align(ids, e, 16)
    group = qw.scheme.act.group if qw.scheme.act.mode.name == "GROUP" else 0
    y = moe_gemm(xq, tw, sorted_ids, expert_ids, total, block_m=16, num_rows=t * k, top_k=k, x_scales=xs,
                 x_group=group, out_dtype=torch.float16, block_k=64)  # fmt: skip
    assert y.dtype == torch.float16
    xd = dequantize_activation(xq, xs, qw.scheme.act).double()
    w = qw.dequantize().double()
    ref = torch.stack([xd[r // k] @ w[int(ids.view(-1)[r])].T for r in range(t * k)])
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]
    # blocks whose second half is padding (<= 5 rows per expert here) run half-width: FP8 experts read as
    # stored take the transposed MMA up to 32 rows (64: the x rows on the MMA's 64-row side)
    for bm in (32, 128):
        y = torch.full((t * k, n), float("nan"), dtype=torch.float16)
        moe_gemm(xq, tw, *moe_align(ids, e, bm), block_m=bm, num_rows=t * k, top_k=k, x_scales=xs, x_group=group,
                 out=y, block_k=64, tail_half=True)  # fmt: skip
        assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]
    if group:  # K tiles must lie inside one x group
        with pytest.raises(ValueError, match="x_group"):
            moe_gemm(xq, tw, sorted_ids, expert_ids, total, block_m=16, num_rows=t * k, top_k=k, x_scales=xs,
                     x_group=96, block_k=64)  # fmt: skip


@pytest.mark.parametrize("split", [2, 3])
@pytest.mark.parametrize("silu", [False, True])
def test_split_k_equals_one_launch(interpret, split, silu):
    """K cut into parts reduced in the launch (decode): same result as one part, counters re-armed so a
    second launch with the same buffers is right too; unwritten rows stay poisoned."""
    g = torch.Generator().manual_seed(split)
    e, k, t, n, kk = 6, 2, 5, 64, 512
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, "w4a16")
    tw = stack_experts(qw)
    x = torch.randn(t, kk, generator=g).half()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    ids[1, 1] = -1
    aligned = moe_align(ids, e, 16)
    kw = dict(block_m=16, block_n=32, block_k=32, num_rows=t * k, top_k=k, silu_mul=silu)
    one = moe_gemm(x, tw, *aligned, **kw)
    ws, cnt = torch.empty(1 << 16), torch.zeros(256, dtype=torch.int32)
    for _ in range(2):
        y = torch.full_like(one, float("nan"))
        moe_gemm(x, tw, *aligned, out=y, split_k=split, workspace=ws, counters=cnt, **kw)
        assert torch.isnan(y[1 * k + 1]).all() and not cnt.any()
        valid = ids.view(-1) >= 0
        assert rel_err(y[valid], one[valid]) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("scheme", ["w4a16", "w3a16", "mxfp4", "w8a16", "w8a8-fp8"])
def test_slot_blocks_without_alignment(interpret, scheme):
    """`moe_gemm(sorted_ids=None)`: each flat slot a block of its own on the top-k ids as given (int64 here), no
    `moe_align` — gate_up rows per slot (a dropped slot's row not written), and the down GEMM summing each token's
    slots times their top-k weights in the launch (`sum_slots`), unsplit and split, counters re-armed and the same
    bits on a relaunch; two tokens share an expert. Bit-plane, fragment-layout and FP8-as-stored experts."""
    from anybit.kernels.quant_act import quantize_act
    from anybit.quant.activations import dequantize_activation

    g = torch.Generator().manual_seed(4)
    e, k, t, n, kk = 6, 3, 2, 40, 256
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme)
    tw = stack_experts(qw)
    ids = torch.tensor([[4, 0, 2], [2, 5, -1]])
    flat, w = ids.view(-1), qw.dequantize().double()
    x, a = torch.randn(t, kk, generator=g).half(), torch.randn(t * k, kk, generator=g).half()
    xin, ain, xd, ad = dict(x=x), dict(x=a), x.double(), a.double()
    if qw.scheme.act.quantized:  # FP8 x: references from the kernel's own quantized inputs
        xin, ain = (dict(zip(("x", "x_scales"), quantize_act(v, qw.scheme.act), strict=True)) for v in (x, a))
        xd, ad = (dequantize_activation(v["x"], v["x_scales"], qw.scheme.act).double() for v in (xin, ain))
    kw = dict(block_m=16, num_rows=t * k, out_dtype=torch.float16, block_k=64)
    y = moe_gemm(tw=tw, sorted_ids=None, expert_ids=flat, total=None, top_k=k, **xin, **kw)
    live = flat >= 0
    ref = torch.stack([xd[r // k] @ w[int(flat[r])].T for r in range(t * k) if flat[r] >= 0])
    assert rel_err(y[live], ref) < GEMM_REL_ERR[torch.float16]
    rw = torch.rand(t * k, generator=g)
    ref = torch.zeros(t, n, dtype=torch.float64)
    for r in range(t * k):
        if flat[r] >= 0:
            ref[r // k] += rw[r].double() * (ad[r] @ w[int(flat[r])].T)
    ws, cnt = torch.empty(1 << 16), torch.zeros(256, dtype=torch.int32)
    outs = []
    for split in (1, 2, 2):
        out = torch.full((t, n), float("nan"), dtype=torch.float16)
        moe_gemm(tw=tw, sorted_ids=None, expert_ids=flat, total=None, top_k=1, out=out, routed_weights=rw, sum_slots=k,
                 split_k=split, workspace=ws, counters=cnt, **ain, **kw)  # fmt: skip
        assert rel_err(out, ref) < GEMM_REL_ERR[torch.float16] and not cnt.any()
        outs.append(out)
    assert torch.equal(outs[1], outs[2])


def test_slot_blocks_errors(interpret):
    from anybit.errors import AnybitError

    tw = stack_experts(anybit.quantize(torch.randn(4, 32, 128) * 0.05, "w4a16"))
    x, ids = torch.randn(1, 128).half(), torch.tensor([0, 3])
    ws, cnt = torch.empty(1 << 14), torch.zeros(64, dtype=torch.int32)
    kw = dict(block_m=16, num_rows=2, top_k=2)
    with pytest.raises(ValueError, match="take no total"):
        moe_gemm(x, tw, None, ids, torch.tensor([16]), **kw)
    with pytest.raises(ValueError, match=r"int32/int64 \[2\]"):
        moe_gemm(x, tw, None, ids.float(), None, **kw)
    with pytest.raises(ValueError, match="power-of-two block_m"):
        moe_gemm(x, tw, None, ids, None, **dict(kw, block_m=48))
    with pytest.raises(ValueError, match="no silu_mul"):
        moe_gemm(x, tw, None, ids, None, silu_mul=True, sum_slots=2, workspace=ws, counters=cnt, **kw)
    with pytest.raises(ValueError, match="needs an fp32 workspace"):
        moe_gemm(x.expand(2, -1), tw, None, ids, None, sum_slots=2, **dict(kw, top_k=1))
    with pytest.raises(ValueError, match="takes slot blocks"):
        moe_gemm(x, tw, *moe_align(ids[None], 4, 16), sum_slots=2, **kw)
    with pytest.raises(AnybitError, match="expert id 4 out of range for 4 experts"):
        moe_gemm(x, tw, None, torch.tensor([0, 4]), None, **kw)
    # unchecked, an id past the experts is skipped as -1 is
    y = torch.full((2, 32), float("nan"), dtype=torch.float16)
    moe_gemm(x, tw, None, torch.tensor([0, 4]), None, out=y, check_ids=False, **kw)
    assert not torch.isnan(y[0]).any() and torch.isnan(y[1]).all()
    a, sums = x.expand(2, -1).contiguous(), dict(sum_slots=2, workspace=ws, counters=cnt, **dict(kw, top_k=1))
    dropped = moe_gemm(a, tw, None, torch.tensor([0, -1]), None, **sums)
    assert torch.equal(moe_gemm(a, tw, None, torch.tensor([0, 4]), None, check_ids=False, **sums), dropped)


@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4", "w4a8-mxfp4"])
def test_two_blocks_an_iteration_give_the_same_bits_grouped(interpret, monkeypatch, scheme):
    """`frag.FRAG_PAIRS` in the grouped kernel: bit for bit the one-block loop, unsplit and split in two over five K
    blocks (one split ends on an odd block)."""
    from anybit.kernels import frag
    from anybit.moe.layer import grouped_inputs

    g = torch.Generator().manual_seed(9)
    e, k, t, n, kk = 5, 2, 6, 40, 640
    tw = stack_experts(anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme))
    xin = grouped_inputs(torch.randn(t, kk, generator=g).half(), tw)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    aligned = moe_align(ids, e, 16)
    kw = dict(block_m=16, num_rows=t * k, top_k=k, out_dtype=torch.float16, **xin)
    for split in (1, 2):
        ws, cnt = torch.empty(1 << 16), torch.zeros(256, dtype=torch.int32)
        extra = dict(split_k=split, workspace=ws, counters=cnt) if split > 1 else {}
        monkeypatch.setattr(frag, "FRAG_PAIRS", False)
        one = moe_gemm(tw=tw, sorted_ids=aligned[0], expert_ids=aligned[1], total=aligned[2], **kw, **extra)
        monkeypatch.setattr(frag, "FRAG_PAIRS", True)
        assert frag.frag_pairs(tw, 16)
        two = moe_gemm(tw=tw, sorted_ids=aligned[0], expert_ids=aligned[1], total=aligned[2], **kw, **extra)
        assert torch.equal(one, two)


@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4"])
def test_contiguous_layout_rows_grouped_by_expert(interpret, scheme):
    """Rows already grouped by expert (offsets [E+1], an expert with no rows, rows past offsets[E]
    left alone): the same grouped GEMM through `moe_align_contiguous`."""
    from anybit.moe import moe_align_contiguous

    g = torch.Generator().manual_seed(3)
    e, n, kk, rows = 5, 40, 256, 23
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme)
    offsets = torch.tensor([0, 6, 6, 13, 20, 21])  # expert 1 has no rows; rows 21, 22 belong to none
    x = torch.randn(rows, kk, generator=g).half()
    aligned = moe_align_contiguous(offsets, rows, 16)
    y = torch.full((rows, n), float("nan"), dtype=torch.float16)
    moe_gemm(x, stack_experts(qw), *aligned, block_m=16, num_rows=rows, top_k=1, out=y)
    w = qw.dequantize().double()
    for ex in range(e):
        lo, hi = int(offsets[ex]), int(offsets[ex + 1])
        if hi > lo:
            assert rel_err(y[lo:hi], x[lo:hi].double() @ w[ex].T) < GEMM_REL_ERR[torch.float16]
    assert torch.isnan(y[21:]).all()


def test_contiguous_alignment_contract_and_errors():
    from anybit.errors import AnybitError
    from anybit.moe import moe_align_contiguous

    sorted_ids, expert_ids, total = moe_align_contiguous(torch.tensor([0, 3, 3, 8]), 10, 4)
    assert int(total) == 4 + 0 + 8 and sorted_ids.numel() == 10 + 3 * 3
    assert sorted_ids[:12].tolist() == [0, 1, 2, 10, 3, 4, 5, 6, 7, 10, 10, 10]
    assert (sorted_ids[12:] == 10).all()
    assert expert_ids.tolist() == [0, 2, 2, -1, -1]
    with pytest.raises(AnybitError, match="must start at 0"):
        moe_align_contiguous(torch.tensor([0, 5, 3]), 10, 4)
    with pytest.raises(AnybitError, match="end <= 4"):
        moe_align_contiguous(torch.tensor([0, 5]), 4, 4)
    with pytest.raises(AnybitError, match="integer"):
        moe_align_contiguous(torch.tensor([0.0, 1.0]), 4, 4)


@pytest.mark.parametrize("scheme", ["nvfp4", "mxfp4", "w2a16", "w8a16"])
def test_grouped_gemm_fragment_layout_experts(interpret, scheme):
    """e2m1 and 2- and 8-bit integer experts in the fragment layout through the grouped kernel (split-K
    and the silu·up epilogue included)."""
    g = torch.Generator().manual_seed(9)
    e, k, t, n, kk = 6, 2, 5, 64, 384
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme)
    tw = stack_experts(qw)
    assert tw.frag
    x = torch.randn(t, kk, generator=g).half()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    aligned = moe_align(ids, e, 16)
    ws, cnt = torch.empty(1 << 16), torch.zeros(256, dtype=torch.int32)
    y = moe_gemm(x, tw, *aligned, block_m=16, num_rows=t * k, top_k=k, split_k=2, workspace=ws, counters=cnt)
    w = qw.dequantize().double()
    ref = torch.stack([x[r // k].double() @ w[int(ids.view(-1)[r])].T for r in range(t * k)])
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


def test_8_bit_channel_experts_on_8_warps(interpret):
    """8-bit channel-scaled experts on an 8-warp tile scale each K block (`CHANNEL_AS_BLOCKS`: the dense kernel's
    channel epilogue gave wrong rows on 8/16-warp tiles on the H200)."""
    g = torch.Generator().manual_seed(10)
    e, k, t, n, kk = 4, 2, 5, 128, 384
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, "w8a16:int8:ch:fp16")
    tw = stack_experts(qw)
    x = torch.randn(t, kk, generator=g).half()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    y = moe_gemm(x, tw, *moe_align(ids, e, 16), block_m=16, block_n=128, num_warps=8, num_rows=t * k, top_k=k)
    w = qw.dequantize().double()
    ref = torch.stack([x[r // k].double() @ w[int(ids.view(-1)[r])].T for r in range(t * k)])
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("scheme", ["w4a16:int4:g128:fp16", "w4a16-zp"])
def test_group_scales_applied_to_the_decoded_weights(interpret, scheme):
    """SCALE_W (the large-M tiles' rule, forced here on a small tile): group scales multiply the decoded
    4-bit rows before the MMA, over several K blocks, zero points included."""
    from anybit.kernels.frag import frag_scale_w

    g = torch.Generator().manual_seed(21)
    e, k, t, n, kk = 4, 2, 11, 64, 512
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme)
    tw = stack_experts(qw)
    assert tw.frag and frag_scale_w(tw, torch.float16, 128) and not frag_scale_w(tw, torch.bfloat16, 128)
    x = torch.randn(t, kk, generator=g).half()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    y = torch.full((t * k, n), float("nan"), dtype=torch.float16)
    moe_gemm(x, tw, *moe_align(ids, e, 16), block_m=16, num_rows=t * k, top_k=k, out=y, scale_w=True)
    w = qw.dequantize().double()
    ref = torch.stack([x[r // k].double() @ w[int(ids.view(-1)[r])].T for r in range(t * k)])
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("scheme", ["w4a16:int4:g128:fp16", "mxfp4", "w3a16"])
def test_half_width_tail_blocks(interpret, scheme):
    """tail_half: blocks whose second half is padding run half-width (fragment and bit-plane experts);
    experts of 5, 20, 33 (a full block and a 1-row tail) and 16 rows (exactly half) against per-slot
    products, unwritten rows poisoned; 4-bit experts also on the down GEMM's tile of wide experts (64-row blocks of
    256 weight rows, 8 warps: `down_tiles`) with N = 320 off that tile."""
    g = torch.Generator().manual_seed(23)
    e, n, kk = 4, 64, 256
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme)
    tw = stack_experts(qw)
    ids = torch.cat([torch.full((c,), ex) for ex, c in enumerate((5, 20, 33, 16))])
    ids = ids[torch.randperm(len(ids), generator=g)].int()[:, None]  # top-1, tokens in random order
    t = len(ids)
    x = torch.randn(t, kk, generator=g).half()
    y = torch.full((t, n), float("nan"), dtype=torch.float16)
    moe_gemm(x, tw, *moe_align(ids, e, 32), block_m=32, num_rows=t, top_k=1, out=y, tail_half=True,
             scale_w=scheme.startswith("w4a16"))  # fmt: skip
    w = qw.dequantize().double()
    ref = torch.stack([x[r].double() @ w[int(ids[r, 0])].T for r in range(t)])
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]
    if scheme != "w3a16":  # the down GEMM's tile of wide experts (`down_tiles`): 64-row blocks of 256 weight rows
        qw2 = anybit.quantize(torch.randn(e, 320, kk, generator=g) * 0.05, scheme)
        y2 = torch.full((t, 320), float("nan"), dtype=torch.float16)
        moe_gemm(x, stack_experts(qw2), *moe_align(ids, e, 64), block_m=64, block_n=256, num_warps=8, num_rows=t,
                 top_k=1, out=y2, tail_half=True, scale_w=scheme.startswith("w4a16"))  # fmt: skip
        w2 = qw2.dequantize().double()
        ref2 = torch.stack([x[r].double() @ w2[int(ids[r, 0])].T for r in range(t)])
        assert rel_err(y2, ref2) < GEMM_REL_ERR[torch.float16]
    with pytest.raises(ValueError, match="tail_half"):
        moe_gemm(x, tw, *moe_align(ids, e, 32), block_m=32, num_rows=t, top_k=1, tail_half=True, split_k=2,
                 workspace=torch.empty(1 << 16), counters=torch.zeros(64, dtype=torch.int32))  # fmt: skip


@pytest.mark.parametrize("scheme", ["w4a16:int4:g128:fp16", "w4a16-zp", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("block_m, counts", [(48, (9, 32, 40, 60)), (96, (20, 64, 80, 100))])
def test_blocks_of_two_parts(interpret, scheme, block_m, counts):
    """Blocks of a power of two + a smaller one (48 = 32 + 16, 96 = 64 + 32): two MMAs on each decoded K block,
    or the first part alone where the second is padding — experts with rows in the first part only, exactly
    filling it, into the second, and past one block (a short second block), top-2 with silu·up fused and the top-k
    weight, N = 160 off the tile, unwritten rows poisoned; other experts and split-K are a clear error."""
    from anybit.kernels.moe_gemm import two_part_why_not

    g = torch.Generator().manual_seed(block_m)
    e, n, kk, k = 4, 160, 384, 2
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme)
    tw = stack_experts(qw)
    slots = torch.cat([torch.full((c,), ex) for ex, c in enumerate(counts)])
    t = len(slots) // k
    ids = slots[torch.randperm(len(slots), generator=g)][: t * k].view(t, k).int()
    ids[:, 1] = torch.where(ids[:, 1] == ids[:, 0], -1, ids[:, 1])  # a token's slots on one expert: drop one
    x = torch.randn(t, kk, generator=g).half()
    rw = torch.rand(t * k, generator=g)
    w = qw.dequantize().double()
    valid = ids.view(-1) >= 0
    ref = torch.stack([x[r // k].double() @ w[max(int(ids.view(-1)[r]), 0)].T for r in range(t * k)])
    y = torch.full((t * k, n), float("nan"), dtype=torch.float16)
    moe_gemm(x, tw, *moe_align(ids, e, block_m), block_m=block_m, num_rows=t * k, top_k=k, out=y,
             block_n=128, routed_weights=rw)  # fmt: skip
    assert torch.isnan(y[~valid]).all()
    assert rel_err(y[valid], (ref * rw[:, None].double())[valid]) < GEMM_REL_ERR[torch.float16]
    h = torch.full((t * k, n // 2), float("nan"), dtype=torch.float16)
    moe_gemm(x, tw, *moe_align(ids, e, block_m), block_m=block_m, num_rows=t * k, top_k=k, out=h, silu_mul=True,
             block_n=128)  # fmt: skip
    gate, up = ref[:, 0::2], ref[:, 1::2]
    assert rel_err(h[valid], (gate * torch.sigmoid(gate) * up)[valid]) < GEMM_REL_ERR[torch.float16]
    if block_m == 48:  # the down GEMM's tile of wide experts: 256 weight rows, 8 warps
        y2 = torch.full((t * k, n), float("nan"), dtype=torch.float16)
        moe_gemm(x, tw, *moe_align(ids, e, block_m), block_m=block_m, num_rows=t * k, top_k=k, out=y2,
                 block_n=256, num_warps=8)  # fmt: skip
        assert rel_err(y2[valid], ref[valid]) < GEMM_REL_ERR[torch.float16]
    assert two_part_why_not(stack_experts(anybit.quantize(torch.randn(2, 64, 256), "w8a16")), 48)
    assert "power of two" in two_part_why_not(tw, 40)
    with pytest.raises(ValueError, match="split-K"):
        moe_gemm(x, tw, *moe_align(ids, e, block_m), block_m=block_m, num_rows=t * k, top_k=k, split_k=2,
                 workspace=torch.empty(1 << 20), counters=torch.zeros(64, dtype=torch.int32))  # fmt: skip


def _grouped_fp8(qw, block_m, counts, g, silu_mul=False):
    """(stacked experts, moe_gemm's output, float64 reference of the kernel's own quantized x) for FP8-x experts on
    rows routed `counts` to each expert (top-1, rows and x drawn from `g`); silu_mul: the output is silu(gate)·up of
    the interleaved rows (the reference stays the plain product). Outputs start as NaN (unwritten rows show)."""
    from anybit.moe.layer import grouped_inputs
    from anybit.quant.activations import dequantize_activation

    e, n, k = qw.shape
    tw = stack_experts(qw)
    ids = torch.cat([torch.full((c,), ex) for ex, c in enumerate(counts)])
    ids = ids[torch.randperm(len(ids), generator=g)].int()[:, None]
    t = len(ids)
    xin = grouped_inputs(torch.randn(t, k, generator=g).half(), tw)
    xd = dequantize_activation(xin["x"], xin["x_scales"], qw.scheme.act).double()
    w = qw.dequantize().double()
    ref = torch.stack([xd[r] @ w[int(ids[r, 0])].T for r in range(t)])
    y = torch.full((t, n // 2 if silu_mul else n), float("nan"), dtype=torch.float16)
    moe_gemm(tw=tw, sorted_ids=(a := moe_align(ids, e, block_m))[0], expert_ids=a[1], total=a[2], block_m=block_m,
             num_rows=t, top_k=1, out=y, silu_mul=silu_mul, block_n=128, **xin)  # fmt: skip
    return tw, y, ref


@pytest.mark.parametrize("scheme", ["w4a8", "w4a8-mxfp4", "w4a8-nvfp4"])
@pytest.mark.parametrize("block_m, counts", [(48, (9, 32, 40, 60)), (80, (20, 64, 72, 100))])
def test_blocks_of_two_parts_with_fp8_activations(interpret, scheme, block_m, counts):
    """Blocks of two parts under FP8 x: W4A8 on the FP8 MMA (the zero-point term from the quantizer's block sums),
    W4A8-MXFP4 accumulating in the FP8 MMA (row scales after the loop), W4A8-NVFP4 as codes in fp16 — against per-slot
    products of the kernel's own quantized x, silu·up fused, unwritten rows poisoned."""
    g = torch.Generator().manual_seed(block_m + 1)
    qw = anybit.quantize(torch.randn(4, 160, 384, generator=g) * 0.05, scheme)
    _, y, ref = _grouped_fp8(qw, block_m, counts, g)
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]
    _, h, ref = _grouped_fp8(qw, block_m, counts, g, silu_mul=True)
    gate, up = ref[:, 0::2], ref[:, 1::2]
    assert rel_err(h, gate * torch.sigmoid(gate) * up) < GEMM_REL_ERR[torch.float16]


def test_grouped_gemm_w4a8_fragment_layout(interpret):
    """W4A8 experts in the FP8 fragment order, per-token x scales."""
    from anybit.kernels.quant_act import quantize_act
    from anybit.quant.activations import dequantize_activation

    g = torch.Generator().manual_seed(13)
    e, k, t, n, kk = 5, 2, 9, 64, 256
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, "w4a8")
    tw = stack_experts(qw)
    assert tw.frag
    xq, xs = quantize_act(torch.randn(t, kk, generator=g).half(), qw.scheme.act)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    y = moe_gemm(xq, tw, *moe_align(ids, e, 16), block_m=16, num_rows=t * k, top_k=k, x_scales=xs,
                 out_dtype=torch.float16)  # fmt: skip
    xd, w = dequantize_activation(xq, xs, qw.scheme.act).double(), qw.dequantize().double()
    ref = torch.stack([xd[r // k] @ w[int(ids.view(-1)[r])].T for r in range(t * k)])
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


def test_decode_plan_at_the_measured_shapes():
    """The decode launch plan (host arithmetic, H200's 132 SMs), as measured: DeepSeek-V3 gate_up at one
    token splits K in two; Qwen3's down at one token (frag layout, no fused silu: 1.1 CTAs an SM) takes 64-row
    tiles unsplit, DeepSeek-V3's (3.8) and Qwen3's at 4 tokens (4.1) keep 128; at 4 tokens the launches are big
    enough as they are; FP8 experts read as stored never split. Frag CTAs that walk >= 2048 K get 128 registers
    (DeepSeek-V3), short ones (Qwen3's split gate_up, its down over 768 K) do not."""
    tiles = moe_tiles(8, 256, True)
    assert moe_decode_plan(8, 256, 4096, 7168, tiles, 132) == (128, 2, None)
    assert moe_decode_plan(8, 256, 4096, 7168, tiles, 132, frag=True) == (128, 2, 128)
    fp8 = moe_tiles(8, 256, True, "fp8")  # W8A8 experts read as stored: the layer ran faster unsplit
    assert moe_decode_plan(8, 256, 4096, 7168, fp8, 132) == (128, 2, None)
    assert moe_decode_plan(8, 256, 4096, 7168, fp8, 132, split_ok=False) == (128, 1, None)
    assert moe_decode_plan(8, 256, 7168, 2048, tiles, 132, frag=True, narrow=True) == (128, 1, 128)
    qwen = moe_tiles(8, 128, True)
    assert moe_decode_plan(8, 128, 1536, 2048, qwen, 132, frag=True) == (128, 4, None)
    assert moe_decode_plan(8, 128, 2048, 768, qwen, 132, frag=True, narrow=True) == (64, 1, None)
    assert moe_decode_plan(32, 128, 2048, 768, moe_tiles(32, 128, True), 132, frag=True, narrow=True) == (128, 1, None)
    assert moe_decode_plan(32, 256, 4096, 7168, moe_tiles(32, 256, True), 132) == (128, 1, None)
    assert moe_decode_plan(128, 256, 7168, 2048, moe_tiles(128, 256, True), 132, narrow=True) == (128, 1, None)


@pytest.mark.parametrize(
    "scheme, wide",
    [("w4a16", True), ("mxfp4", True), ("nvfp4", True), ("w4a16:int4:ch:bf16", True), ("w4a16-zp", False),
     ("w4a8", False), ("w8a16", False), ("w4a16:e2m1:g128:bf16", False)],
)  # fmt: skip
def test_wide_prefill_tiles_only_where_one_accumulator_runs(monkeypatch, scheme, wide):
    """256 weight rows per 128-row block (H200 M=4096: 10-23 % faster) where the K loop keeps one
    accumulator; w4a16-zp keeps fp16 scales (bf16 x: no SCALE_W), 128-K groups of e2m1 and A8 spill (W4A8's integer
    codes rescaled in the FP8 MMA, "a8-rescale", were measured faster on 128 weight rows); Hopper only (sm_80:
    spills, and more shared memory than an A100 block has)."""
    from anybit.kernels import moe_gemm as kernels

    tw = stack_experts(anybit.quantize(torch.randn(2, 64, 512) * 0.05, scheme))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(kernels, "target_sm", lambda: 80)
    assert not kernels.moe_wide_tile(tw, torch.bfloat16)
    monkeypatch.setattr(kernels, "target_sm", lambda: 90)
    assert kernels.moe_wide_tile(tw, torch.bfloat16) is wide
    kind = "wide" if wide else "a8-rescale" if scheme == "w4a8" else ""
    assert kernels.moe_tile_kind(tw, torch.bfloat16) == kind
    assert moe_tiles(4096 * 8, 256, True, kind)["block_n"] == (256 if wide else 128)
    assert moe_tiles(1024 * 8, 256, True, kind)["block_n"] == 128  # 32 rows per expert: 128 weight rows
    assert moe_tiles(1024 * 8, 256, True, kind)["block_m"] == {"wide": 48, "a8-rescale": 64, "": 32}[kind]
    if kind == "a8-rescale":  # blocks of 144 = 128 + 16 rows up to 192 rows an expert, 128 above
        assert [moe_tiles(pe * 256, 256, True, kind)["block_m"] for pe in (64, 128, 256)] == [80, 144, 128]
    # 16 rows per expert (Qwen3-30B-A3B M=256): frag kinds take 32-row blocks, a spilling expert's weights read once;
    # 8 (DeepSeek-V3 M=256) keep the 16-row decode tile
    assert moe_tiles(256 * 8, 128, True, kind)["block_m"] == (32 if kind else 16)
    assert moe_tiles(256 * 8, 128, True, "a8-acc")["block_m"] == 32  # W4A8-MXFP4 / NVFP4 (session 43)
    assert moe_tiles(256 * 8, 256, True, kind)["block_m"] == 16
    mid = moe_tiles(1024 * 8, 256, True, kind)  # the down GEMM's 64-row blocks of wide experts: 256 weight rows
    assert down_tiles(mid, kind, 2048)["block_n"] == (256 if wide else 128)
    assert down_tiles(mid, kind, 2048)["num_warps"] == (8 if wide else mid["num_warps"])
    assert down_tiles(mid, kind, 768) == mid  # short K (Qwen3-30B-A3B's 768): 128 weight rows
    big = moe_tiles(4096 * 8, 256, True, kind)
    assert down_tiles(big, kind, 2048) == big
    assert down_tiles(moe_tiles(8, 256, True, kind), kind, 2048)["block_n"] == 128


def test_wide_experts_take_blocks_of_two_parts_sized_to_their_rows():
    """`WIDE_BLOCKS`: 48 = 32 + 16 rows at 32 an expert, 80 = 64 + 16 at 64, 144 = 128 + 16 of 256 weight rows on 8
    warps at 128, 128 at 256; the launch plan takes no split-K and no half-width tails for them."""
    from anybit.moe.layer import launch_plan

    got = {pe: moe_tiles(pe * 256, 256, True, "wide") for pe in (32, 64, 128, 256)}
    assert [got[pe]["block_m"] for pe in (32, 64, 128, 256)] == [48, 80, 144, 128]
    assert (got[128]["block_n"], got[128]["num_warps"]) == (256, 8) and got[64]["num_warps"] == 4
    tw = stack_experts(anybit.quantize(torch.randn(4, 64, 256) * 0.05, "w4a16"))
    plan = launch_plan(tw, 4, 128, got[32], False, torch.device("cpu"))
    assert plan["split_k"] == 1 and "tail_half" not in plan
    assert launch_plan(tw, 4, 128, got[256], False, torch.device("cpu"))["tail_half"]


def test_e2m1_experts_on_the_fp8_mma_take_128_row_blocks_of_256_weight_rows_from_97_rows_an_expert(monkeypatch):
    """e2m1 experts under FP8 x accumulating the whole K in the MMA (`frag.A8_MMA_ACC`) keep one accumulator: 128-row
    blocks of 256 weight rows above 96 rows per expert (H200 M=4096 1.15-1.23x faster), 64-row blocks below; with
    the per-block product added in fp32 they are "a8" experts (64-row blocks)."""
    from anybit.kernels import frag
    from anybit.kernels import moe_gemm as kernels

    tw = stack_experts(anybit.quantize(torch.randn(2, 64, 512) * 0.05, "w4a8-mxfp4"))
    assert tw.e2m1_a8 and kernels.moe_tile_kind(tw, torch.bfloat16) == "a8-acc"
    big, mid = moe_tiles(4096 * 8, 256, True, "a8-acc"), moe_tiles(1024 * 8, 256, True, "a8-acc")
    assert (big["block_m"], big["block_n"], big["num_warps"]) == (128, 256, 8) and mid["block_m"] == 64
    assert moe_tiles(2048 * 8, 256, True, "a8-acc")["block_m"] == 80  # 64 rows an expert: blocks of 64 + 16
    monkeypatch.setattr(frag, "A8_MMA_ACC", False)
    assert kernels.moe_tile_kind(tw, torch.bfloat16) == "a8"


RESCALED = ["w4a8", "w4a8:uint4:g128:fp16:zp-int:e4m3-token", "w4a8:int4:g256:bf16:e4m3-token",
            "w4a8:int4:ch:fp32:e4m3-token"]  # fmt: skip


@pytest.mark.parametrize("scheme", RESCALED)
@pytest.mark.parametrize("block_m", [16, 32, 80, 144])  # fresh products (16-row blocks), rescaled, two parts
def test_w4a8_experts_accumulating_in_units_of_each_blocks_scale(interpret, monkeypatch, scheme, block_m):
    """W4A8's integer experts accumulating in the FP8 MMA, the accumulator rescaled by each K block's scale over the
    last (`frag.A8_RESCALE`, blocks of >= 32 rows): group scales spread over 20 binades along K, N off the tile,
    unwritten rows poisoned; within the format's tolerance with and without it."""
    from anybit.kernels import frag
    from anybit.kernels.moe_gemm import moe_tile_kind

    g = torch.Generator().manual_seed(block_m)
    k = 768
    spread = 2.0 ** (20 * torch.rand(k // 128, generator=g) - 10)
    qw = anybit.quantize(torch.randn(3, 160, k, generator=g) * 0.05 * spread.repeat_interleave(128)[None, None], scheme)
    for on in (True, False):
        monkeypatch.setattr(frag, "A8_RESCALE", on)
        tw, y, ref = _grouped_fp8(qw, block_m, (9, 40, 70), torch.Generator().manual_seed(block_m))
        assert tw.rescale and frag.frag_rescale(tw, block_m) == (on and block_m >= 32)
        assert moe_tile_kind(tw, torch.float16) == ("a8-rescale" if on else "a8")
        assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16], on


@pytest.mark.parametrize("zero", [True, False])
def test_w4a8_experts_whose_scales_cannot_be_rescaled_keep_fresh_products(interpret, zero):
    """A zero group scale (an all-zero group), or scales more than `RESCALE_SPREAD` binades apart, are no ratio to
    rescale by: such experts keep a fresh product per block (`TritonWeight.rescale` False, the "a8" tiles) and stay
    right."""
    from anybit.kernels.moe_gemm import moe_tile_kind

    g = torch.Generator().manual_seed(3)
    w = torch.randn(2, 160, 384, generator=g) * 0.05
    if zero:
        w[1, :, 128:256] = 0.0
    else:
        w[0, :, :128] *= 2.0**-70
    qw = anybit.quantize(w, "w4a8")
    tw, y, ref = _grouped_fp8(qw, 32, (20, 30), torch.Generator().manual_seed(3))
    assert not tw.rescale and moe_tile_kind(tw, torch.float16) == "a8"
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("scheme, kind, block_m", [("w8a8-fp8", "fp8", 128), ("fp8-block", "fp8-block", 64)])
def test_fp8_experts_read_as_stored_take_deep_k_prefill_tiles(scheme, kind, block_m):
    """FP8 experts read as stored have no decode: 128-deep K tiles from 17 rows per expert on (H200
    DeepSeek-V3 W8A8 M=1024 gate_up 2x faster); FP8-block's per-tile promotion keeps 64-row blocks."""
    from anybit.kernels.moe_gemm import moe_tile_kind

    tw = stack_experts(anybit.quantize(torch.randn(2, 64, 512) * 0.05, scheme))
    assert moe_tile_kind(tw, torch.bfloat16) == kind
    decode = moe_tiles(8 * 256, 256, True, kind)
    assert decode["block_m"] == 16 and decode["block_k"] == (256 if kind == "fp8" else 128)  # in one x group
    assert moe_tiles(32 * 256, 256, True, kind) == dict(block_m=64, block_n=128, block_k=128, num_warps=4,
                                                        num_stages=4)  # fmt: skip
    assert moe_tiles(128 * 256, 256, True, kind)["block_m"] == block_m


def test_moe_sum_skips_rows_the_down_gemm_never_wrote(interpret):
    """Each token's rows of valid experts summed in fp32; rows of dropped (-1) or out-of-range slots hold
    garbage (NaN here) and are skipped; H off the 1024-wide tile."""
    from anybit.kernels.moe_gemm import moe_sum

    g = torch.Generator().manual_seed(2)
    t, k, h, e = 5, 3, 1300, 4
    ids = torch.randint(0, e, (t, k), generator=g).int()
    ids[1, 0], ids[3, 2] = -1, e
    y = torch.randn(t * k, h, generator=g).half()
    y[(ids.reshape(-1) < 0) | (ids.reshape(-1) >= e)] = float("nan")
    out = moe_sum(y, ids, e)
    keep = ((ids >= 0) & (ids < e)).reshape(t * k, 1)
    ref = torch.where(keep, y.double(), 0).view(t, k, h).sum(dim=1)
    assert out.dtype == torch.float16 and rel_err(out, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize(
    "scheme, kind", [("w4a16:int4:g128:fp16", "wide"), ("nvfp4", "wide"), ("w4a8", "a8"), ("w4a8-mxfp4", "a8-acc")]
)
def test_sixteen_rows_an_expert_take_32_row_blocks(interpret, scheme, kind):
    """The frag kinds' decode tile near 16 rows an expert (`SPILL_16_ROWS`): 32-row blocks whose 16-row halves run
    half-width, as `launch_plan` launches them — experts of 13, 16 (half-width), 17 and 30 rows (full width) against
    per-slot products (FP8 x: its own quantized values), N = 160 off the 128-row tile, unwritten rows poisoned."""
    from anybit.moe.layer import grouped_inputs, launch_plan
    from anybit.quant.activations import dequantize_activation

    g = torch.Generator().manual_seed(16)
    e, n, kk = 4, 160, 512
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme)
    tw = stack_experts(qw)
    ids = torch.cat([torch.full((c,), ex) for ex, c in enumerate((13, 16, 17, 30))])
    ids = ids[torch.randperm(len(ids), generator=g)].int()[:, None]
    t = len(ids)
    tiles = moe_tiles(16 * e, e, True, kind)
    assert tiles["block_m"] == 32
    plan = launch_plan(tw, e, t, tiles, False, torch.device("cpu"))
    assert plan["tail_half"] and plan["split_k"] == 1
    x = torch.randn(t, kk, generator=g).half()
    xin = grouped_inputs(x, tw)
    y = torch.full((t, n), float("nan"), dtype=torch.float16)
    moe_gemm(tw=tw, sorted_ids=(a := moe_align(ids, e, 32))[0], expert_ids=a[1], total=a[2], top_k=1, out=y,
             **xin, **plan)  # fmt: skip
    xd = dequantize_activation(xin["x"], xin["x_scales"], qw.scheme.act) if "x_scales" in xin else x
    w = qw.dequantize().double()
    ref = torch.stack([xd[r].double() @ w[int(ids[r, 0])].T for r in range(t)])
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize(
    "scheme, block_m", [("w4a16", 16), ("w4a16", 48), ("w8a16", 32), ("w3a16", 16), ("w8a8-fp8", 16), ("w4a8", 16)]
)
def test_both_launch_orders_give_the_same_bits(interpret, scheme, block_m):
    """`moe_n_first`: N tiles fastest (the default where unsplit) or blocks fastest, the same rows in the same bits —
    fragment-layout experts (blocks of two parts too), bit-plane experts and FP8 experts read as stored; N spans
    three 16-row tiles so the order matters."""
    from anybit.moe.layer import grouped_inputs

    g = torch.Generator().manual_seed(block_m)
    e, k, t, n, kk = 5, 2, 23, 40, 256
    tw = stack_experts(anybit.quantize(torch.randn(e, n, kk, generator=g) * 0.05, scheme))
    xin = grouped_inputs(torch.randn(t, kk, generator=g).half(), tw)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    aligned = moe_align(ids, e, block_m)
    kw = dict(block_m=block_m, num_rows=t * k, top_k=k, block_n=16, out_dtype=torch.float16, **xin)
    ys = []
    for order in (False, True):
        y = torch.full((t * k, n), float("nan"), dtype=torch.float16)
        ys.append(moe_gemm(tw=tw, sorted_ids=aligned[0], expert_ids=aligned[1], total=aligned[2], out=y,
                           n_first=order, **kw))  # fmt: skip
    assert not ys[0].isnan().any() and torch.equal(ys[0], ys[1])


def test_n_first_only_where_unsplit_and_aligned():
    from anybit.kernels.moe_gemm import GRID_Y_MAX, moe_n_first

    assert moe_n_first(100, 1, False, 0) and not moe_n_first(100, 1, False, 0, n_first=False)
    assert not moe_n_first(100, 2, False, 0, n_first=True)  # split-K partials count tiles blocks first
    assert not moe_n_first(100, 1, True, 0) and not moe_n_first(100, 1, True, 8)  # slot blocks
    assert not moe_n_first(GRID_Y_MAX + 1, 1, False, 0)  # more blocks than a grid's second axis holds
