"""The warp-specialised grouped W4A8 MoE kernel's host side on the CPU (the kernel itself is Gluon, sm_90a only:
tests/moe/test_moe_ws_a8_gpu.py): which experts it takes, why the layer does not, and clear errors for arguments it
cannot run."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import stack_experts
from anybit.kernels.moe_ws_a8 import moe_gemm_ws_a8, moe_ws_a8_plan, moe_ws_a8_why_not, rs_a8_block_m, rs_a8_parts
from anybit.kernels.quant_act import quantize_act
from anybit.moe import moe_align


@pytest.fixture(scope="module")
def experts():
    return stack_experts(quantize(torch.randn(4, 256, 512) * 0.05, "w4a8"))


def _x(tw, rows=8):
    return quantize_act(torch.randn(rows, tw.k), tw.scheme.act)


def test_not_on_the_cpu(experts):
    assert "CUDA GPU" in moe_ws_a8_why_not(experts, torch.device("cpu"))


@pytest.mark.parametrize("text", ["w4a16", "w4a8-mxfp4", "w8a8-fp8"])
def test_other_experts_are_refused(text):
    tw = stack_experts(quantize(torch.randn(2, 128, 256) * 0.05, text))
    assert "4-bit integer experts in the FP8 fragment layout" in moe_ws_a8_why_not(tw, torch.device("cpu"))


def test_block_m_is_two_warpgroups(experts):
    xq, xs = _x(experts)
    with pytest.raises(ValueError, match="block_m must be 128"):
        moe_gemm_ws_a8(xq, experts, *moe_align(torch.randint(0, 4, (8, 2)), 4, 64), block_m=64, num_rows=16,
                       top_k=2, x_scales=xs)  # fmt: skip
    with pytest.raises(ValueError, match=r"block_m=32: the register-operand kernel takes blocks of \[64, 80, 96, 128"):
        moe_gemm_ws_a8(xq, experts, *moe_align(torch.randint(0, 4, (8, 2)), 4, 32), block_m=32, num_rows=16,
                       top_k=2, x_scales=xs, rs=True)  # fmt: skip
    with pytest.raises(ValueError, match="takes block_n=128 .* got 64"):
        moe_gemm_ws_a8(xq, experts, *moe_align(torch.randint(0, 4, (8, 2)), 4, 128), block_m=128, num_rows=16,
                       top_k=2, x_scales=xs, rs=True, block_n=64)  # fmt: skip


def test_register_operand_blocks_of_two_parts():
    assert [rs_a8_parts(b) for b in (64, 80, 96, 128, 144, 160, 256, 272, 288)] == [
        (64, 0), (64, 16), (64, 32), (128, 0), (128, 16), (128, 32), (256, 0), (256, 16), (256, 32)]  # fmt: skip
    with pytest.raises(ValueError, match="block_m=192"):
        rs_a8_parts(192)
    # an expert's ~128 rows in one block of 144, not 128 and a second block for a few rows
    assert [rs_a8_block_m(r) for r in (40, 96, 97, 128, 191, 192, 255, 256, 600)] == [
        80, 80, 144, 144, 144, 128, 128, 256, 256]  # fmt: skip


def test_x_must_be_e4m3_of_the_experts_width(experts):
    a = moe_align(torch.randint(0, 4, (8, 2)), 4, 128)
    xq, xs = _x(experts)
    with pytest.raises(ValueError, match=r"x must be e4m3 \[rows, 512\]"):
        moe_gemm_ws_a8(torch.randn(8, 512).bfloat16(), experts, *a, num_rows=16, top_k=2, x_scales=xs)
    with pytest.raises(ValueError, match="x_scales must be 8 fp32 values"):
        moe_gemm_ws_a8(xq, experts, *a, num_rows=16, top_k=2, x_scales=xs[:4])
    with pytest.raises(ValueError, match="quantized per token"):
        moe_gemm_ws_a8(xq, experts, *a, num_rows=16, top_k=2, x_scales=xs, x_group=128)


def test_plan_is_off_unless_asked(experts, monkeypatch):
    def plan():
        return moe_ws_a8_plan(experts, experts, 1200, 4, torch.device("cpu"))

    monkeypatch.delenv("ANYBIT_MOE_WS_A8_MIN_ROWS", raising=False)
    assert plan()[0] is None and "off" in plan()[1]  # off by default
    monkeypatch.setenv("ANYBIT_MOE_WS_A8_MIN_ROWS", "400")
    assert "300.0 rows per expert < ANYBIT_MOE_WS_A8_MIN_ROWS=400" in plan()[1]
    monkeypatch.setenv("ANYBIT_MOE_WS_A8_MIN_ROWS", "96")
    assert "CUDA GPU" in plan()[1]
    monkeypatch.setenv("ANYBIT_MOE_WS_A8_MIN_ROWS", "bad")
    with pytest.raises(ValueError, match="ANYBIT_MOE_WS_A8_MIN_ROWS='bad'"):
        plan()


def test_register_operand_plan_is_off_unless_asked(experts, monkeypatch):
    def plan():
        return moe_ws_a8_plan(experts, experts, 1200, 4, torch.device("cpu"))

    monkeypatch.delenv("ANYBIT_MOE_WS_A8_MIN_ROWS", raising=False)
    monkeypatch.setenv("ANYBIT_MOE_RS_A8_MIN_ROWS", "400")
    assert "300.0 rows per expert < ANYBIT_MOE_RS_A8_MIN_ROWS=400" in plan()[1]
    monkeypatch.setenv("ANYBIT_MOE_WS_A8_MIN_ROWS", "500")
    assert "< ANYBIT_MOE_RS_A8_MIN_ROWS=400 and ANYBIT_MOE_WS_A8_MIN_ROWS=500" in plan()[1]
    monkeypatch.setenv("ANYBIT_MOE_RS_A8_MIN_ROWS", "96")
    assert "CUDA GPU" in plan()[1]  # enough rows: the GPU is what is missing here
    monkeypatch.setenv("ANYBIT_MOE_RS_A8_MIN_ROWS", "bad")
    with pytest.raises(ValueError, match="ANYBIT_MOE_RS_A8_MIN_ROWS='bad'"):
        plan()


def test_explain_names_the_w4a8_kernel(interpret, monkeypatch):
    from anybit.tools.explain import moe_lines

    monkeypatch.setenv("ANYBIT_MOE_WS_A8_MIN_ROWS", "100")
    last = moe_lines("w4a8", 16, 2, 600, 512, 256, "cpu", "bf16")[-1]
    assert "(moe_ws_a8) not used: 75.0 rows per expert < ANYBIT_MOE_WS_A8_MIN_ROWS=100" in last
