"""QuantMoE's grouped Triton path on the GPU in bf16, and its CUDA-graph capture (device only)."""

import pytest
import torch

from anybit.moe import QuantMoE, softmax_topk
from tests.graphs import replayed
from tests.moe.test_quant_moe import reference
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    "scheme", ["w4a16", "nvfp4", "mxfp4", "w8a16", "w4a8", "w8a8-fp8", "fp8-block", "w4a8-mxfp4", "w4a8-nvfp4"]
)
@pytest.mark.parametrize("e, k, t", [(64, 8, 1), (19, 2, 300), (128, 8, 16), (8, 2, 600), (64, 8, 120)])
def test_bf16_grouped_moe(scheme, e, k, t):
    """(8, 2, 600): 150 rows per expert, the 128-row tiles (w4a16: group scales on the decoded weights); (64, 8, 120):
    15 rows per expert, the frag kinds' 32-row decode blocks (`SPILL_16_ROWS`)."""
    g = torch.Generator(device="cuda").manual_seed(e + k + t)
    h, i = 512, 256
    gate_up = torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05
    down = torch.randn(e, h, i, generator=g, device="cuda") * 0.05
    moe = QuantMoE.from_float(gate_up, down, scheme)
    x = torch.randn(t, h, generator=g, device="cuda").bfloat16()
    w, ids = softmax_topk(torch.randn(t, e, generator=g, device="cuda"), k)
    y = moe(x, w, ids)
    assert moe._stacked is not None
    if moe.gate_up.scheme.act.quantized:  # FP8 activations: against the exact per-expert loop
        exact = QuantMoE.from_quantized(moe.gate_up, moe.down)
        exact.backend = "torch"
        assert rel_err(y, exact(x, w, ids)) < 4 * GEMM_REL_ERR[torch.bfloat16]
        return
    ref = reference(x.cpu(), moe.gate_up.dequantize().cpu(), moe.down.dequantize().cpu(), w.cpu(), ids.cpu())
    assert rel_err(y.cpu(), ref) < 4 * GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("scheme", ["w4a8", "w4a8:uint4:g128:bf16:zp-int:e4m3-token"])
@pytest.mark.parametrize("t", [64, 160, 600])  # 16, 40, 150 rows an expert: 32-row, 80-row (two parts), 128-row blocks
def test_w4a8_experts_rescaled_per_block_stay_as_exact(monkeypatch, scheme, t):
    """W4A8's integer experts accumulating in the FP8 MMA in units of each 128-K block's scale (`frag.A8_RESCALE`,
    blocks of >= 32 rows) against fresh products per block, at DeepSeek-V3's hidden size (56 blocks of ratios) with
    group scales spread over 16 binades: both within the budget of the exact layer, the rescaled one at most 1.5x the
    other's error, a relaunch bit for bit."""
    from anybit.kernels import frag

    g = torch.Generator(device="cuda").manual_seed(t)
    e, k, h, i = 8, 2, 7168, 512
    spread = 2.0 ** (16 * torch.rand(h // 128, generator=g, device="cuda") - 8)
    gate_up = torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05 * spread.repeat_interleave(128)
    moe = QuantMoE.from_float(gate_up, torch.randn(e, h, i, generator=g, device="cuda") * 0.05, scheme)
    exact = QuantMoE.from_quantized(moe.gate_up, moe.down)
    exact.backend = "torch"
    x = torch.randn(t, h, generator=g, device="cuda").bfloat16()
    w, ids = softmax_topk(torch.randn(t, e, generator=g, device="cuda"), k)
    ref = exact(x, w, ids).float()
    errs = {}
    for on in (True, False):
        monkeypatch.setattr(frag, "A8_RESCALE", on)
        layer = QuantMoE.from_quantized(moe.gate_up, moe.down)  # (its plans are picked under this setting)
        y = layer(x, w, ids)
        errs[on] = rel_err(y.float(), ref)
        assert torch.equal(y, layer(x, w, ids)), "a relaunch must give the same bits"
    assert max(errs.values()) < 4 * GEMM_REL_ERR[torch.bfloat16] and errs[True] <= 1.5 * errs[False] + 1e-4, errs


def test_grouped_moe_captures_in_a_cuda_graph():
    e, k, t, h, i = 16, 2, 8, 256, 256
    moe = QuantMoE.from_float(
        torch.randn(e, 2 * i, h, device="cuda") * 0.05, torch.randn(e, h, i, device="cuda") * 0.05, "w4a16"
    )
    x = torch.randn(t, h, device="cuda").bfloat16()
    w, ids = softmax_topk(torch.randn(t, e, device="cuda"), k)
    eager = moe(x, w, ids)
    assert torch.equal(replayed(lambda: moe(x, w, ids)), eager)


@pytest.mark.parametrize("scheme", ["w4a16", "nvfp4", "w3a16", "w4a8", "w4a8-mxfp4", "w8a8-fp8", "fp8-block"])
def test_one_token_without_alignment(scheme):
    """One token (decode): the two GEMMs on the top-k ids as given, the top-k sum in the down GEMM
    (`takes_slot_blocks`), at Qwen3-30B-A3B's sizes — against the exact loop and the aligned path, the same bits
    relaunched, and from a CUDA graph replayed with other routings (the ids are read on the device: nothing to
    re-capture)."""
    g = torch.Generator(device="cuda").manual_seed(17)
    e, k, h, i = 128, 8, 2048, 768
    moe = QuantMoE.from_float(torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05,
                              torch.randn(e, h, i, generator=g, device="cuda") * 0.05, scheme)  # fmt: skip
    aligned = QuantMoE.from_quantized(moe.gate_up, moe.down)
    aligned.slot_max_rows = 0
    exact = QuantMoE.from_quantized(moe.gate_up, moe.down)
    exact.backend = "torch"
    x = torch.randn(1, h, generator=g, device="cuda").bfloat16()
    routes = [softmax_topk(torch.randn(1, e, generator=g, device="cuda"), k) for _ in range(3)]
    routes[1][1][0, 2] = -1  # a dropped slot
    w, ids = (v.clone() for v in routes[0])
    graph = torch.cuda.CUDAGraph()
    moe(x, w, ids)
    with torch.cuda.graph(graph):
        y = moe(x, w, ids)
    assert any(key[-1] == "slots" and plan for key, plan in moe._plans.items())
    for rw, rid in routes:
        w.copy_(rw), ids.copy_(rid)
        graph.replay()
        eager = moe(x, rw, rid)
        assert torch.equal(y, eager) and torch.equal(moe(x, rw, rid), eager)
        assert rel_err(eager, exact(x, rw, rid)) < 4 * GEMM_REL_ERR[torch.bfloat16]
        assert rel_err(eager, aligned(x, rw, rid)) < 2 * GEMM_REL_ERR[torch.bfloat16]


def test_an_expert_id_past_the_experts_stops_the_one_token_kernel():
    """Without the alignment's check, the GEMM itself stops on an id >= E (a trap: the CUDA context is gone, hence a
    process of its own); the same layer unchecked skips it as a dropped slot."""
    import subprocess
    import sys

    code = (
        "import torch\nfrom anybit.moe import QuantMoE\n"
        "moe = QuantMoE.from_float(torch.randn(8, 256, 128, device='cuda'), torch.randn(8, 128, 128, device='cuda'),"
        " 'w4a16')\n"
        "x = torch.randn(1, 128, device='cuda').bfloat16()\n"
        "moe(x, torch.ones(1, 2, device='cuda'), torch.tensor([[1, 9]], device='cuda', dtype=torch.int32))\n"
        "torch.cuda.synchronize()\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "unspecified launch failure" in run.stderr, run.stderr[-2000:]
    run = subprocess.run([sys.executable, "-c", code.replace("moe(x", "moe.check_ids = False\nmoe(x")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]


def test_contiguous_layout_in_a_cuda_graph():
    """Rows grouped by expert with device offsets: alignment + grouped GEMM captured once, replayed
    with other offsets (no host synchronisation on the counts)."""
    import anybit
    from anybit.backends.triton_layout import stack_experts
    from anybit.kernels.moe_gemm import moe_gemm
    from anybit.moe import moe_align_contiguous

    g = torch.Generator(device="cuda").manual_seed(5)
    e, n, k, rows = 8, 512, 1024, 300
    qw = anybit.quantize(torch.randn(e, n, k, generator=g, device="cuda") * 0.05, "w4a16")
    tw = stack_experts(qw)
    x = torch.randn(rows, k, generator=g, device="cuda").bfloat16()
    offsets = torch.zeros(e + 1, dtype=torch.int64, device="cuda")
    y = torch.zeros(rows, n, device="cuda", dtype=torch.bfloat16)

    def run():
        moe_gemm(x, tw, *moe_align_contiguous(offsets, rows, 16), block_m=16, num_rows=rows, top_k=1, out=y,
                 block_n=128, block_k=128)  # fmt: skip

    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    w = qw.dequantize().double()
    for seed in range(2):
        counts = torch.randint(0, 70, (e,), generator=torch.Generator().manual_seed(seed))
        counts[seed] = 0
        offsets.copy_(torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).clamp(max=rows))
        graph.replay()
        off = offsets.tolist()
        for ex in range(e):
            if off[ex + 1] > off[ex]:
                ref = x[off[ex] : off[ex + 1]].double() @ w[ex].T
                assert rel_err(y[off[ex] : off[ex + 1]], ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("e, k, t", [(64, 8, 1), (19, 2, 300)])
def test_w4a8_grouped_moe_on_the_fragment_layout(e, k, t):
    """W4A8 experts in the FP8 fragment order, the zero-point term from the
    quantizer's block sums; against the exact per-expert loop, and bit-stable."""
    g = torch.Generator(device="cuda").manual_seed(e + k + t)
    gate_up = torch.randn(e, 512, 512, generator=g, device="cuda") * 0.05
    down = torch.randn(e, 512, 256, generator=g, device="cuda") * 0.05
    moe = QuantMoE.from_float(gate_up, down, "w4a8")
    x = torch.randn(t, 512, generator=g, device="cuda").bfloat16()
    w, ids = softmax_topk(torch.randn(t, e, generator=g, device="cuda"), k)
    y1, y2 = moe(x, w, ids), moe(x, w, ids)
    assert moe._stacked[0].frag and torch.equal(y1, y2)
    exact = QuantMoE.from_quantized(moe.gate_up, moe.down)
    exact.backend = "torch"
    assert rel_err(y1, exact(x, w, ids)) < 4 * GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("scheme", ["w4a16", "w4a8"])
@pytest.mark.parametrize("t", [4, 40])
def test_grouped_moe_with_programmatic_dependent_launch_gives_the_same_bits(monkeypatch, scheme, t):
    """PDL (the default on sm_90): the frag grouped GEMMs launch as dependents of the kernel before them (and
    the W4A8 quantizer lets them launch at once); the same bits as plain launches (ANYBIT_PDL=0, a layer of
    its own: the launch plan is cached per layer), eager and from a CUDA graph; slot blocks (4 tokens) and
    aligned ones (40)."""
    g = torch.Generator(device="cuda").manual_seed(7)
    e, k, h, i = 64, 8, 2048, 1024
    moe = QuantMoE.from_float(torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05,
                              torch.randn(e, h, i, generator=g, device="cuda") * 0.05, scheme)  # fmt: skip
    x = torch.randn(t, h, generator=g, device="cuda").bfloat16()
    w, ids = softmax_topk(torch.randn(t, e, generator=g, device="cuda"), k)
    monkeypatch.setenv("ANYBIT_PDL", "0")
    plain = moe(x, w, ids)
    assert not any(plan[1].get("pdl") for plan in moe._plans.values() if isinstance(plan, tuple))
    monkeypatch.setenv("ANYBIT_PDL", "1")
    moe = QuantMoE.from_quantized(moe.gate_up, moe.down)
    assert torch.equal(moe(x, w, ids), plain)
    assert any(plan[1].get("pdl") for plan in moe._plans.values() if isinstance(plan, tuple))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = moe(x, w, ids)
    y.zero_()
    graph.replay()
    assert torch.equal(y, plain)


@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4", "w8a8-fp8", "fp8-block"])
def test_half_width_tail_blocks_on_the_prefill_tile(scheme):
    """tail_half on the prefill tile (128 x 256, FP8-block 64 x 256): experts of 40, 128, 150 (a full block
    and a tail) and 64 rows against the dequantized experts (FP8 x: its own quantized values)."""
    import anybit
    from anybit.backends.triton_layout import stack_experts
    from anybit.kernels.moe_gemm import moe_gemm, moe_tile_kind
    from anybit.moe import moe_align
    from anybit.moe.layer import grouped_inputs, moe_tiles
    from anybit.quant.activations import dequantize_activation

    g = torch.Generator(device="cuda").manual_seed(5)
    e, n, kk = 4, 512, 1024
    qw = anybit.quantize(torch.randn(e, n, kk, generator=g, device="cuda") * 0.05, scheme)
    tw = stack_experts(qw)
    ids = torch.cat([torch.full((c,), ex) for ex, c in enumerate((40, 128, 150, 64))]).int().cuda()[:, None]
    t = len(ids)
    x = torch.randn(t, kk, generator=g, device="cuda").bfloat16()
    tiles = moe_tiles(1 << 20, e, True, moe_tile_kind(tw, x.dtype))
    assert tiles["block_n"] == 256
    bm = tiles["block_m"]
    kw = dict(block_m=bm, block_n=256, block_k=tiles["block_k"], num_warps=tiles["num_warps"],
              num_stages=tiles["num_stages"], num_rows=t, top_k=1)  # fmt: skip
    y = torch.full((t, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    xin = grouped_inputs(x, tw)
    sorted_ids, expert_ids, total = moe_align(ids, e, bm)
    moe_gemm(tw=tw, sorted_ids=sorted_ids, expert_ids=expert_ids, total=total, out=y, tail_half=True, **xin, **kw)
    xd = dequantize_activation(xin["x"], xin["x_scales"], qw.scheme.act) if "x_scales" in xin else x
    w = qw.dequantize().double()
    ref = torch.stack([xd[r].double() @ w[int(ids[r, 0])].T for r in range(t)])
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4", "w4a8-mxfp4"])
@pytest.mark.parametrize("split", [1, 2])
def test_two_blocks_an_iteration_give_the_same_bits_grouped_in_bf16(monkeypatch, scheme, split):
    """`frag.FRAG_PAIRS` in the grouped kernel on the GPU (bf16; K = 7296, 57 blocks: odd unsplit, and the first
    split of 29 ends on an odd block): bit for bit the one-block loop."""
    import anybit
    from anybit.backends.triton_layout import stack_experts
    from anybit.kernels import frag
    from anybit.kernels.moe_gemm import moe_gemm
    from anybit.moe import moe_align
    from anybit.moe.layer import grouped_inputs

    g = torch.Generator(device="cuda").manual_seed(split)
    e, k, t, n, kk = 8, 2, 4, 512, 7296
    tw = stack_experts(anybit.quantize(torch.randn(e, n, kk, generator=g, device="cuda") * 0.05, scheme))
    xin = grouped_inputs(torch.randn(t, kk, generator=g, device="cuda").bfloat16(), tw)
    ids = torch.stack([torch.randperm(e, device="cuda", generator=g)[:k] for _ in range(t)]).int()
    aligned = moe_align(ids, e, 16)
    ws, cnt = torch.empty(1 << 22, device="cuda"), torch.zeros(4096, dtype=torch.int32, device="cuda")
    kw = dict(block_m=16, block_n=128, block_k=128, num_warps=4, num_stages=4, num_rows=t * k, top_k=k,
              out_dtype=torch.bfloat16, split_k=split, workspace=ws, counters=cnt, **xin)  # fmt: skip
    monkeypatch.setattr(frag, "FRAG_PAIRS", False)
    one = moe_gemm(tw=tw, sorted_ids=aligned[0], expert_ids=aligned[1], total=aligned[2], **kw)
    monkeypatch.setattr(frag, "FRAG_PAIRS", True)
    two = moe_gemm(tw=tw, sorted_ids=aligned[0], expert_ids=aligned[1], total=aligned[2], **kw)
    assert torch.equal(one, two)


def _two_part_layer(monkeypatch, scheme: str, block_m: int, seed: int):
    """A layer forced onto blocks of block_m rows (`moe_tiles`' other keys kept) at ~block_m / 1.5 rows an expert,
    run twice: (layer, x, weights, ids, the two outputs)."""
    from anybit.moe import layer

    tiles = layer.moe_tiles
    monkeypatch.setattr(layer, "moe_tiles", lambda *a, **kw: tiles(*a, **kw) | dict(block_m=block_m))
    g = torch.Generator(device="cuda").manual_seed(seed)
    e, k, h, i = 16, 4, 1024, 512
    t = block_m * e * 2 // (3 * k)
    moe = QuantMoE.from_float(torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05,
                              torch.randn(e, h, i, generator=g, device="cuda") * 0.05, scheme)  # fmt: skip
    x = torch.randn(t, h, generator=g, device="cuda").bfloat16()
    w, ids = softmax_topk(torch.randn(t, e, generator=g, device="cuda"), k)
    return moe, x, w, ids, moe(x, w, ids), moe(x, w, ids)


@pytest.mark.parametrize("scheme", ["w4a16", "w4a16-zp", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("block_m", [48, 96])
def test_blocks_of_two_parts_in_bf16(monkeypatch, scheme, block_m):
    """The layer on blocks of two parts (48 = 32 + 16, 96 = 64 + 32: two MMAs on each decoded K block, or the first
    part alone) at ~block_m / 1.5 rows an expert, against the exact loop, and bit-stable."""
    moe, x, w, ids, y1, y2 = _two_part_layer(monkeypatch, scheme, block_m, block_m)
    assert torch.equal(y1, y2)
    ref = reference(x.cpu(), moe.gate_up.dequantize().cpu(), moe.down.dequantize().cpu(), w.cpu(), ids.cpu())
    assert rel_err(y1.cpu(), ref) < 4 * GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("scheme", ["w4a8", "w4a8-mxfp4", "w4a8-nvfp4"])
@pytest.mark.parametrize("block_m", [48, 80])
def test_blocks_of_two_parts_with_fp8_activations(monkeypatch, scheme, block_m):
    """The layer on blocks of two parts under FP8 x (W4A8 on the FP8 MMA with the quantizer's block sums, W4A8-MXFP4
    accumulating in it, W4A8-NVFP4 as codes) at ~block_m / 1.5 rows an expert, against the exact per-expert loop on
    the same quantized activations' scheme, and bit-stable."""
    moe, x, w, ids, y1, y2 = _two_part_layer(monkeypatch, scheme, block_m, block_m + 3)
    assert torch.equal(y1, y2)
    exact = QuantMoE.from_quantized(moe.gate_up, moe.down)
    exact.backend = "torch"
    assert rel_err(y1, exact(x, w, ids)) < 4 * GEMM_REL_ERR[torch.bfloat16]
