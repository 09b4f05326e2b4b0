"""QuantMoE against a per-expert loop over the exact dequantized weights."""

import pytest
import torch

import anybit
from anybit.errors import AnybitError
from anybit.moe import QuantMoE, softmax_topk
from tests.tolerances import GEMM_REL_ERR, rel_err


def reference(x, gate_up, down, w, ids, act=None):
    """The float64 loop over the dequantized experts. act (FP8 schemes): both GEMM inputs quantized by the reference
    quantizer, the intermediate silu(gate) * up rounded once to x's dtype first, as the fused epilogue writes it."""
    from anybit.quant.activations import dequantize_activation, quantize_activation

    def quantized(v):
        return v.double() if act is None else dequantize_activation(*quantize_activation(v, act), act).double()

    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = gate_up.shape[1] // 2
    xd = quantized(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            h = gate_up[e].double() @ xd[t]
            a = torch.nn.functional.silu(h[:inter]) * h[inter:]
            a = a if act is None else quantized(a.to(x.dtype)[None])[0]
            out[t] += w[t, j].double() * (down[e].double() @ a)
    return out


@pytest.mark.parametrize("scheme", ["w4a16", "mxfp4"])
@pytest.mark.parametrize("e, k, t", [(4, 1, 1), (19, 2, 7), (8, 8, 5)])
def test_quant_moe_matches_a_loop_over_dequantized_experts(scheme, e, k, t):
    g = torch.Generator().manual_seed(e + k + t)
    h, i = 128, 128
    gate_up = torch.randn(e, 2 * i, h, generator=g) * 0.1
    down = torch.randn(e, h, i, generator=g) * 0.1
    moe = QuantMoE.from_float(gate_up, down, scheme, backend="torch")
    x = torch.randn(t, h, generator=g).half()
    w, ids = softmax_topk(torch.randn(t, e, generator=g), k)
    if t > 1:
        ids[1, 0] = -1  # a dropped slot contributes nothing
    y = moe(x, w, ids)
    ref = reference(x, moe.gate_up.dequantize(), moe.down.dequantize(), w, ids)
    assert y.shape == (t, h) and rel_err(y, ref) < 4 * GEMM_REL_ERR[torch.float16]  # two GEMMs + activation


def test_bad_shapes_are_named():
    with pytest.raises(AnybitError, match="must be"):
        QuantMoE.from_float(torch.randn(2, 256, 128), torch.randn(2, 128, 256), "w4a16")


def _grouped_and_exact(scheme):
    """A QuantMoE on the Triton backend, the same weights on the exact loop, inputs with a dropped slot."""
    g = torch.Generator().manual_seed(3)
    e, k, t, h, i = 6, 2, 9, 128, 128
    gate_up, down = torch.randn(e, 2 * i, h, generator=g) * 0.1, torch.randn(e, h, i, generator=g) * 0.1
    fast = QuantMoE.from_float(gate_up, down, scheme, backend="triton")
    exact = QuantMoE.from_quantized(fast.gate_up, fast.down)
    exact.backend = "torch"
    x = torch.randn(t, h, generator=g).half()
    w, ids = softmax_topk(torch.randn(t, e, generator=g), k)
    ids[2, 1] = -1
    return fast, exact, x, w, ids


@pytest.mark.parametrize("scheme", ["w4a16", "nvfp4", "w8a16:e4m3:b128x128:fp32"])
@pytest.mark.parametrize("split", [None, 2])
def test_grouped_triton_path_matches_the_reference_path(interpret, scheme, split):
    fast, exact, x, w, ids = _grouped_and_exact(scheme)
    fast.split_k = split  # 2: the decode path's split-K reduction, forced on the CPU
    y = fast(x, w, ids)
    assert fast._stacked is not None  # the grouped kernels ran
    assert fast._stacked[2] == ("b128" not in scheme)  # silu-and-mul fused unless scales span rows
    ref = reference(x, fast.gate_up.dequantize(), fast.down.dequantize(), w, ids)
    assert rel_err(y, ref) < 4 * GEMM_REL_ERR[torch.float16]
    assert rel_err(y, exact(x, w, ids).double()) < 4 * GEMM_REL_ERR[torch.float16]


def test_interleave_gate_up_puts_gate_and_up_rows_side_by_side():
    from anybit.moe.layer import interleave_gate_up
    from anybit.quant import quantize

    qw = quantize(torch.randn(3, 8, 128), "nvfp4")
    w, iw = qw.dequantize(), interleave_gate_up(qw).dequantize()
    assert torch.equal(iw[:, 0::2], w[:, :4]) and torch.equal(iw[:, 1::2], w[:, 4:])
    with pytest.raises(AnybitError, match="span 128 rows"):
        interleave_gate_up(quantize(torch.randn(2, 256, 128), "w8a16:e4m3:b128x128:fp32"))


@pytest.mark.parametrize("scheme", ["w4a8", "w8a8-fp8", "w4a8-mxfp4", "w4a8-nvfp4", "fp8-block"])
def test_grouped_path_with_fp8_activations(interpret, scheme, monkeypatch):
    """FP8 per-token schemes run grouped too. The interpreter's fp32 -> fp8 conversion drops rounding
    carries (tests/kernels/test_gemm_a8.py), so here the activations are quantized by the reference
    quantizer — the same values the GPU's kernel produces bit for bit (its GPU test) — and the result
    must equal the float64 product of those quantized inputs up to fp16 rounding (`reference` with `act`)."""
    _fp8_grouped(scheme, monkeypatch)


def _reference_inputs(x, tw, pdl=False):
    """`layer.grouped_inputs` with the reference quantizer (the interpreter's fp32 -> fp8 conversion drops rounding
    carries; the GPU's quantizer matches the reference bit for bit); the stand-in launches nothing to depend on."""
    from anybit.quant.activations import quantize_activation

    s = tw.scheme
    if not s.act.quantized:
        return dict(x=x)
    # rows of dropped slots are never written (and never read): whatever memory held
    xq, xs = quantize_activation(torch.nan_to_num(x), s.act)
    if tw.codes_a16:  # the A16 kernels take the codes in x's dtype
        return dict(x=xq.to(x.dtype), x_scales=xs)
    if tw.e2m1_a8:  # e2m1 on the FP8 MMA: no sums
        return dict(x=xq, x_scales=xs)
    if not tw.frag:
        return dict(x=xq, x_scales=xs, x_group=s.act.group if s.act.mode.name == "GROUP" else 0)
    blocks = torch.nn.functional.pad(xq.float(), (0, -xq.shape[1] % 128)).reshape(xq.shape[0], -1, 128)
    return dict(x=xq, x_scales=xs, x_sums=blocks.sum(dim=-1).T.contiguous())  # as `quantize_act` sums


def _fp8_grouped(scheme, monkeypatch):
    import anybit.moe.layer as layer

    monkeypatch.setattr(layer, "grouped_inputs", _reference_inputs)
    fast, exact, x, w, ids = _grouped_and_exact(scheme)
    y = fast(x, w, ids)
    assert fast._stacked is not None
    # the per-expert exact loop rounds gate and up to x's dtype first: under FP8 that moves some of the
    # intermediate's codes by a step (NVFP4-A8: 1.3e-2), so the reference follows the fused epilogue
    ref = reference(x, fast.gate_up.dequantize(), fast.down.dequantize(), w, ids, act=fast.gate_up.scheme.act)
    assert rel_err(y, ref) < 4 * GEMM_REL_ERR[torch.float16]
    return fast


def test_grouped_w4a8_on_the_fragment_layout_with_block_sums(interpret, monkeypatch):
    """W4A8 experts in the FP8 fragment order; the kernel takes the inputs' per-block sums
    (`grouped_inputs`) instead of summing each x tile."""
    fast = _fp8_grouped("w4a8", monkeypatch)
    assert fast._stacked[0].frag and fast._stacked[1].frag


def test_slot_blocks_up_to_the_measured_rows():
    """Slot blocks (no alignment) up to 32 token x slot rows, 64 for experts of <= 8 MB (H200: Qwen3-30B-A3B's 2.4-4.7
    MB experts faster up to 8 tokens of top-8, DeepSeek-V3's 22-44 MB slower from 6), at most half the experts; the
    layer's limit from its own weights; blocks of two parts never."""
    from anybit.moe.layer import slot_max_rows, takes_slot_blocks

    assert slot_max_rows(128, 2.4e6) == 64 and slot_max_rows(256, 22e6) == 32  # Qwen3-30B-A3B, DeepSeek-V3
    assert slot_max_rows(8, 88e6) == 4 and slot_max_rows(6, 1e3) == 3  # few experts: at most half of them
    assert takes_slot_blocks(64, 16, 64) and not takes_slot_blocks(65, 16, 64) and not takes_slot_blocks(8, 48, 64)
    moe = QuantMoE.from_float(torch.randn(128, 2 * 128, 128) * 0.1, torch.randn(128, 128, 128) * 0.1, "w4a16")
    assert moe.slot_max_rows == 64


@pytest.mark.parametrize("scheme", ["w4a16", "nvfp4", "w8a16:e4m3:b128x128:fp32", "w4a8", "w8a8-fp8"])
@pytest.mark.parametrize("split", [None, 2])
def test_one_token_runs_without_alignment(interpret, monkeypatch, scheme, split):
    """A call of one token (up to `slot_max_rows` token x slot rows) runs its two GEMMs on the top-k ids as given,
    the top-k sum in the down GEMM: no `moe_align`, no `moe_sum` (both fail here if called); a dropped slot; split-K
    forced; FP8 x; gate and up unfused where scales span rows. Three tokens (two sharing an expert) are right too."""
    import anybit.kernels.moe_gemm as kernels
    import anybit.moe.align as align
    import anybit.moe.layer as layer

    def refused(*a, **kw):
        raise AssertionError("called")

    monkeypatch.setattr(layer, "grouped_inputs", _reference_inputs)
    monkeypatch.setattr(align, "moe_align", refused)
    monkeypatch.setattr(kernels, "moe_sum", refused)
    g = torch.Generator().manual_seed(5)
    e, h, i = 6, 128, 128
    fast = QuantMoE.from_float(torch.randn(e, 2 * i, h, generator=g) * 0.1, torch.randn(e, h, i, generator=g) * 0.1,
                               scheme, backend="triton")  # fmt: skip
    fast.split_k = split
    act = fast.gate_up.scheme.act if fast.gate_up.scheme.act.quantized else None
    for t, ids in ((1, [[3, -1, 0]]), (3, [[3, 1, 0], [1, 5, 2], [4, -1, 0]])):
        fast.slot_max_rows = t * 3
        x = torch.randn(t, h, generator=g).half()
        w = torch.rand(t, 3, generator=g)
        ids = torch.tensor(ids, dtype=torch.int32)
        y = fast(x, w, ids)
        ref = reference(x, fast.gate_up.dequantize(), fast.down.dequantize(), w, ids, act=act)
        assert y.shape == (t, h) and rel_err(y, ref) < 4 * GEMM_REL_ERR[torch.float16]
    ids[0, 0] = 6
    with pytest.raises(AnybitError, match="expert id 6 out of range for 6 experts"):
        fast(x, w, ids)


def test_out_of_range_expert_ids_are_an_error_on_the_grouped_path(interpret):
    fast, _, x, w, ids = _grouped_and_exact("w4a16")
    ids[0, 0] = 6  # 6 experts: ids 0..5
    with pytest.raises(AnybitError, match="expert id out of range for 6 experts"):
        fast(x, w, ids)


def test_grouped_launch_over_shared_memory_retries_shallower(interpret, monkeypatch):
    """A plan tile that asks more shared memory than the GPU has per block (sm_86/89: 99 KB) is refused
    before it runs (simulated: > 3 stages); the layer retries one stage shallower and keeps it in its plan."""
    from triton.runtime.errors import OutOfResources

    from anybit.kernels import moe_gemm as kernels
    from anybit.moe import layer

    deep = layer.moe_tiles
    monkeypatch.setattr(layer, "moe_tiles", lambda *a, **kw: dict(deep(*a, **kw), num_stages=5))
    run, refused = kernels.moe_gemm, []

    def limited(*args, **kw):
        if kw["num_stages"] > 3:
            refused.append(kw["num_stages"])
            raise OutOfResources(110592, 101376, "shared memory")
        return run(*args, **kw)

    monkeypatch.setattr(kernels, "moe_gemm", limited)
    fast, exact, x, w, ids = _grouped_and_exact("w4a16")
    for _ in range(2):
        assert rel_err(fast(x, w, ids), exact(x, w, ids)) < 4 * GEMM_REL_ERR[torch.float16]
    assert refused == [5, 4, 5, 4]  # gate_up, then down, on the first call only
    plans = [v for v in fast._plans.values() if isinstance(v, tuple)]
    assert [(gu["num_stages"], dn["num_stages"]) for _, gu, dn, _ in plans] == [(3, 3)]


def test_launch_plan_half_width_tails_from_32_rows_without_split():
    from anybit.backends.triton_layout import stack_experts
    from anybit.moe.layer import launch_plan
    from anybit.quant.weights import QuantizedWeight

    tw = stack_experts(QuantizedWeight.empty("w4a16", (1, 256, 512)))
    tiles = dict(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)
    plan = launch_plan(tw, 8, 512, tiles, True, torch.device("cpu"))
    assert plan["tail_half"] and plan["split_k"] == 1 and plan["num_rows"] == 512
    assert "tail_half" not in launch_plan(tw, 8, 512, dict(tiles, block_m=16), True, torch.device("cpu"))
    assert "tail_half" not in launch_plan(tw, 8, 512, tiles, True, torch.device("cpu"), split_k=2)


@pytest.mark.parametrize("lut", [True, False])
def test_mxfp4_and_nvfp4_experts_under_fp8_x_run_grouped(interpret, monkeypatch, lut):
    """MXFP4 experts on the FP8 MMA by look-up tables (`e2m1_a8`: the FP8 order, e4m3 x, no block sums), or with
    ANYBIT_E2M1_A8=0 — and NVFP4 experts always — as `codes_a16` (the A16 order, x's codes in x's dtype)."""
    monkeypatch.setenv("ANYBIT_E2M1_A8", "1" if lut else "0")
    for scheme in ("w4a8-mxfp4", "w4a8-nvfp4"):
        fast = _fp8_grouped(scheme, monkeypatch)
        on_fp8 = lut and scheme == "w4a8-mxfp4"
        assert all(tw.frag and tw.codes_a16 != on_fp8 and tw.e2m1_a8 == on_fp8 for tw in fast._stacked[:2])


def test_mxfp4_experts_take_the_fp8_mma_only_when_every_expert_can():
    """One expert's rows spanning more than 8 binades keep every expert on the codes path (one kernel a stack)."""
    from anybit.backends.triton_layout import stack_experts

    w = torch.randn(3, 32, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    assert stack_experts(anybit.quantize(w, "w4a8-mxfp4")).e2m1_a8
    w[1, 3, :32] *= 2.0**-14  # past 11 binades whatever the groups' own maxima (twelve were not, for some draws)
    tw = stack_experts(anybit.quantize(w, "w4a8-mxfp4"))
    assert tw.codes_a16 and not tw.e2m1_a8 and tw.rowwise is None


def test_block_stats_against_counting_every_routing():
    """`block_stats` (what `anybit explain --moe` says of a block size) against enumerating every way 6 tokens can
    each pick an expert or not (p = 1/2: top-1 of 2): blocks an expert, experts past one block, padding; and the
    deterministic case (top-k = E)."""
    import itertools
    import math

    from anybit.moe.layer import block_stats

    for block_m in (1, 2, 4, 8):
        picks = list(itertools.product((0, 1), repeat=6))
        blocks = sum(-(-sum(p) // block_m) for p in picks) / len(picks)
        spill = sum(sum(p) > block_m for p in picks) / len(picks)
        st = block_stats(6, 1, 2, block_m)
        assert math.isclose(st["blocks"], blocks) and math.isclose(st["spill"], spill, abs_tol=1e-12)
        assert math.isclose(st["padding"], 1 - 3 / (blocks * block_m), abs_tol=1e-12)
    st = block_stats(40, 4, 4, 16)
    assert st == dict(mean=40.0, blocks=3.0, spill=1.0, padding=1 - 40 / 48)
    # a short last block runs `short` rows: 40 rows in 16-row blocks end in 8 (a half-width block)
    assert block_stats(40, 4, 4, 16, short=8)["padding"] == 1 - 40 / 40
    assert block_stats(33, 4, 4, 48, short=32)["padding"] == 1 - 33 / 48  # 33 rows: both parts of a 48-row block
    picks = list(itertools.product((0, 1), repeat=6))  # 48 = 32 + 16 on 0-6 rows: always the first part
    assert math.isclose(block_stats(6, 1, 2, 48, short=32)["padding"], 1 - 3 / (32 * (1 - 1 / len(picks))))


@pytest.mark.parametrize(
    "scheme, t, block_m",
    [("w4a16:int4:g128:fp16", 60, 32), ("nvfp4", 60, 32), ("w4a8", 60, 32), ("w4a8-mxfp4", 60, 32),
     ("w4a16:int4:g128:fp16", 128, 48), ("mxfp4", 128, 48), ("w4a16:int4:g128:fp16", 256, 80), ("nvfp4", 256, 80),
     ("w4a8-mxfp4", 256, 80)],
)  # fmt: skip
def test_the_layer_on_the_gpu_tile(interpret, monkeypatch, scheme, t, block_m):
    """QuantMoE as it runs on a Hopper GPU (`moe_tiles(cuda=True)`, silu·up fused into gate_up, the top-k weight into
    down) under the interpreter, against the exact loop: at 15 rows an expert 32-row blocks with half-width halves, at
    32 and 64 rows (4-bit A16 experts) blocks of two parts, 48 = 32 + 16 and 80 = 64 + 16 (`WIDE_BLOCKS`), and 80 at
    64 rows for W4A8-MXFP4 (`A8_ACC_TWO_MIN_ROWS`)."""
    from anybit.kernels import moe_gemm as kernels
    from anybit.moe import layer

    gpu_tiles = layer.moe_tiles
    monkeypatch.setattr(layer, "moe_tiles", lambda rows, experts, cuda, kind="": gpu_tiles(rows, experts, True, kind))
    monkeypatch.setattr(layer, "grouped_inputs", _reference_inputs)  # FP8 x: see `_reference_inputs`
    monkeypatch.setattr(kernels, "target_sm", lambda: 90)  # the "wide" kind, as on an H200
    g = torch.Generator().manual_seed(15)
    e, k, h, i = 8, 2, 256, 128
    gate_up, down = torch.randn(e, 2 * i, h, generator=g) * 0.1, torch.randn(e, h, i, generator=g) * 0.1
    fast = QuantMoE.from_float(gate_up, down, scheme, backend="triton")
    x = torch.randn(t, h, generator=g).half()
    w, ids = softmax_topk(torch.randn(t, e, generator=g), k)
    launched = []
    run = kernels.moe_gemm
    monkeypatch.setattr(kernels, "moe_gemm", lambda *a, **kw: launched.append(kw["block_m"]) or run(*a, **kw))
    y = fast(x, w, ids)
    assert fast._stacked is not None and fast._stacked[2]  # grouped, silu·up fused
    assert launched == [block_m, block_m]
    # the fused epilogue's intermediate quantized as the grouped path does (`reference` with `act`; see _fp8_grouped)
    act = fast.gate_up.scheme.act
    ref = reference(x, fast.gate_up.dequantize(), fast.down.dequantize(), w, ids, act=act if act.quantized else None)
    assert rel_err(y, ref) < 4 * GEMM_REL_ERR[torch.float16]
