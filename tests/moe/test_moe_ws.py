"""The warp-specialised grouped MoE kernel's host side on the CPU (the kernel itself is Gluon, sm_90a only:
tests/moe/test_moe_ws_gpu.py): why it is not taken, and clear errors for arguments it cannot run."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import stack_experts
from anybit.kernels.moe_ws import moe_gemm_ws, moe_ws_tile, moe_ws_why_not
from anybit.moe import moe_align


@pytest.fixture(scope="module")
def experts():
    return stack_experts(quantize(torch.randn(4, 256, 512) * 0.05, "w4a16"))


def test_not_on_the_cpu(experts):
    assert "CUDA GPU" in moe_ws_why_not(experts, torch.bfloat16, torch.device("cpu"))


def test_bit_plane_experts_are_refused():
    tw = stack_experts(quantize(torch.randn(2, 128, 256) * 0.05, "w4a16"), allow_frag=False)
    assert "fragment-layout" in moe_ws_why_not(tw, torch.bfloat16, torch.device("cpu"))


@pytest.mark.parametrize("block_m", [16, 64])
def test_block_m_must_fill_two_warpgroups(experts, block_m):
    ids = torch.randint(0, 4, (8, 2))
    with pytest.raises(ValueError, match="block_m must be 128 or 256"):
        moe_gemm_ws(torch.randn(8, 512).bfloat16(), experts, *moe_align(ids, 4, block_m), block_m=block_m,
                    num_rows=16, top_k=2)  # fmt: skip


def test_x_of_the_wrong_width_is_named(experts):
    ids = torch.randint(0, 4, (8, 2))
    with pytest.raises(ValueError, match=r"x must be \[rows, 512\]"):
        moe_gemm_ws(torch.randn(8, 500).bfloat16(), experts, *moe_align(ids, 4, 128), block_m=128, num_rows=16,
                    top_k=2)  # fmt: skip


def test_tile_by_rows_per_expert():
    assert moe_ws_tile(4096 * 8, 128)["block_m"] == 256  # Qwen3-30B-A3B M=4096: 256 rows per expert
    assert moe_ws_tile(4096 * 8, 256)["block_m"] == 128  # DeepSeek-V3 M=4096: 128


def test_plan_is_off_unless_asked(experts, monkeypatch):
    from anybit.kernels.moe_ws import moe_ws_plan

    def plan():
        return moe_ws_plan(experts, experts, 1200, 4, torch.bfloat16, torch.device("cpu"))

    monkeypatch.delenv("ANYBIT_MOE_WS_MIN_ROWS", raising=False)
    assert plan()[0] is None and "off" in plan()[1]  # off by default
    monkeypatch.setenv("ANYBIT_MOE_WS_MIN_ROWS", "96")
    assert "CUDA GPU" in plan()[1]
    monkeypatch.setenv("ANYBIT_MOE_WS_MIN_ROWS", "bad")
    with pytest.raises(ValueError, match="ANYBIT_MOE_WS_MIN_ROWS='bad'"):
        plan()


def test_explain_says_why_the_layer_keeps_moe_gemm(interpret, monkeypatch):
    from anybit.tools.explain import moe_lines

    def last(**env):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        return moe_lines("w4a16", 16, 2, 600, 512, 256, "cpu", "bf16")[-1]

    monkeypatch.delenv("ANYBIT_MOE_WS_MIN_ROWS", raising=False)
    assert "not used: off (ANYBIT_MOE_WS_MIN_ROWS=0" in last()
    assert "75.0 rows per expert < ANYBIT_MOE_WS_MIN_ROWS=100" in last(ANYBIT_MOE_WS_MIN_ROWS="100")
    assert "CUDA GPU" in last(ANYBIT_MOE_WS_MIN_ROWS="32")
