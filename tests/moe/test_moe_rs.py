"""The register-operand grouped MoE path's host side on the CPU (the GEMM kernel is Gluon, sm_90a only:
tests/moe/test_moe_rs_gpu.py): the gather into the sorted order and silu(gate) * up between the GEMMs (Triton, under
the interpreter), the token tile, why the path is not taken, clear errors."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import stack_experts
from anybit.kernels.moe_rs import moe_gather, moe_gemm_rs, moe_rs_block_m, moe_rs_plan, moe_rs_why_not, moe_silu_sorted
from anybit.moe import moe_align


def _align(t, k, e, block_m, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    ids[ids == 1] = -1  # not on this rank
    return ids, *moe_align(ids, e, block_m)


@pytest.mark.parametrize("t, k, e, block_m", [(13, 2, 4, 16), (1, 1, 3, 32), (40, 4, 19, 16)])
def test_gather_puts_x_in_the_sorted_order(t, k, e, block_m):
    ids, sorted_ids, _, total = _align(t, k, e, block_m, seed=t)
    x = torch.randn(t, 300).half()
    y = moe_gather(x, sorted_ids, total, k)
    n = int(total)
    slot = sorted_ids[:n].long()
    ok = slot < t * k
    assert torch.equal(y[:n][ok], x[slot[ok] // k])
    assert not y[:n][~ok].any()  # padding rows are zeros


@pytest.mark.parametrize("interleaved", [True, False])
def test_silu_mul_in_the_sorted_order(interleaved):
    h = torch.randn(48, 2 * 100).half()
    total = torch.tensor([32], dtype=torch.int32)
    a = torch.full((48, 100), float("nan")).half()
    a = moe_silu_sorted(h, total, interleaved)
    gate, up = (h[:, 0::2], h[:, 1::2]) if interleaved else (h[:, :100], h[:, 100:])
    ref = torch.nn.functional.silu(gate.float()) * up.float()
    assert torch.allclose(a[:32].float(), ref[:32], atol=2e-3, rtol=2e-3)


def test_token_tile_by_rows_an_expert_sees():
    """`moe_rs_block_m`: the tile with the least expected work an expert (Poisson rows): DeepSeek-V3 (256 experts,
    top-8) M=4096 (128 rows an expert) takes 160 = 128 + 32 tokens, not 128 (half the experts would need two
    blocks); M=8192 two blocks of 144 or 160 rather than one of 256 plus a second."""
    assert moe_rs_block_m(4096 * 8, 256) == 160
    assert moe_rs_block_m(1024 * 8, 256) == 64
    assert moe_rs_block_m(8192 * 8, 256) in (144, 160)


def test_not_taken_by_default_nor_on_the_cpu(monkeypatch):
    tw = stack_experts(quantize(torch.randn(4, 256, 512) * 0.05, "w4a16"))
    monkeypatch.delenv("ANYBIT_MOE_RS_MIN_ROWS", raising=False)
    assert "off" in moe_rs_plan(tw, tw, 4096, 4, torch.bfloat16, torch.device("cpu"))[1]
    monkeypatch.setenv("ANYBIT_MOE_RS_MIN_ROWS", "96")
    assert "rows per expert < ANYBIT_MOE_RS_MIN_ROWS=96" in moe_rs_plan(tw, tw, 40, 4, torch.bfloat16,
                                                                         torch.device("cpu"))[1]  # fmt: skip
    assert "CUDA GPU" in moe_rs_plan(tw, tw, 4096, 4, torch.bfloat16, torch.device("cpu"))[1]
    a8 = stack_experts(quantize(torch.randn(2, 256, 512) * 0.05, "w4a8"))
    assert "A16 schemes only" in moe_rs_why_not(a8, torch.bfloat16, torch.device("cpu"))
    odd = stack_experts(quantize(torch.randn(2, 96, 512) * 0.05, "w4a16"))
    assert "N=96 must be a multiple of 64" in moe_rs_why_not(odd, torch.bfloat16, torch.device("cpu"))


def test_clear_errors():
    tw = stack_experts(quantize(torch.randn(4, 256, 512) * 0.05, "w4a16"))
    ids, sorted_ids, expert_ids, total = _align(8, 2, 4, 64, seed=0)
    with pytest.raises(ValueError, match="not one moe_align call with block_m=128"):
        moe_gemm_rs(torch.randn(8, 512).bfloat16(), tw, sorted_ids, expert_ids, total, block_m=128, num_rows=16)
    with pytest.raises(ValueError, match="rows in the sorted order"):
        moe_gemm_rs(torch.randn(8, 512).bfloat16(), tw, sorted_ids, expert_ids, total, block_m=64, num_rows=16)
    x = torch.randn(sorted_ids.numel(), 512).bfloat16()
    with pytest.raises(ValueError, match="scatter needs the routed"):
        moe_gemm_rs(x, tw, sorted_ids, expert_ids, total, block_m=64, num_rows=16, scatter=True)


def test_explain_says_why_the_layer_does_not_take_it(interpret, monkeypatch):
    from anybit.tools.explain import moe_lines

    monkeypatch.delenv("ANYBIT_MOE_RS_MIN_ROWS", raising=False)
    lines = moe_lines("w4a16", 16, 2, 600, 512, 256, "cpu", "bf16")
    assert any("(moe_rs) not used: off (ANYBIT_MOE_RS_MIN_ROWS=0" in line for line in lines)
    monkeypatch.setenv("ANYBIT_MOE_RS_MIN_ROWS", "32")
    assert any(
        "(moe_rs) not used: a Gluon kernel: a CUDA GPU" in line
        for line in moe_lines("w4a16", 16, 2, 600, 512, 256, "cpu", "bf16")
    )
