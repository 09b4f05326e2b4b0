"""The warp-specialised grouped W4A8 MoE kernel and its register-operand twin on a Hopper GPU: each sorted row against
a float64 product of its token's quantized x (the quantizer's own codes and scales) and its expert's `dequantize()`,
with ids of -1, experts without rows, a warpgroup of only padding rows, blocks of two parts whose second part is
padding or not, N and K off the tile, gate/up fused, top-k weights, poisoned outputs, bit-equal relaunches; and
`QuantMoE` taking it at large M, captured in a CUDA graph."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import stack_experts
from anybit.kernels.moe_ws_a8 import moe_gemm_ws_a8, moe_ws_a8_why_not
from anybit.kernels.quant_act import quantize_act
from anybit.moe import QuantMoE, moe_align
from anybit.moe.layer import interleave_gate_up
from anybit.quant.activations import dequantize_activation
from tests.graphs import replayed
from tests.moe.test_moe_ws_gpu import _ids, large_m_layer
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs sm_90"
    ),
]

CASES = [
    (4, 2, 300, 200, 1024),
    (19, 2, 700, 1000, 2176),
    (8, 1, 1100, 384, 768),
    (64, 8, 257, 512, 512),
    (64, 1, 40, 256, 1024),  # < 64 rows an expert: every block's second warpgroup is padding
]  # (E, top-k, tokens, N, K)


# the warp-specialised kernel (128-row blocks), the register-operand one with 64 / 128 / 256-row blocks and blocks of
# two parts (80 = 64 + 16, 144 = 128 + 16)
KERNELS = pytest.mark.parametrize(
    "kernel",
    [dict(block_m=128), dict(rs=True, block_m=64), dict(rs=True, block_m=128), dict(rs=True, block_m=256),
     dict(rs=True, block_m=80), dict(rs=True, block_m=144)],
    ids=["ws", "rs64", "rs128", "rs256", "rs80", "rs144"],
)  # fmt: skip


def _quantized_x(t, kk, act, g):
    x = torch.randn(t, kk, generator=g, device="cuda").bfloat16()
    xq, xs = quantize_act(x, act)
    return xq, xs, dequantize_activation(xq, xs, act).double()


@pytest.mark.parametrize("text", ["w4a8", "w4a8:int4:ch:fp32:e4m3-token"])
@pytest.mark.parametrize("e, k, t, n, kk", CASES)
@KERNELS
def test_rows_match_their_experts(text, e, k, t, n, kk, kernel):
    g = torch.Generator(device="cuda").manual_seed(e + t)
    qw = quantize(torch.randn(e, n, kk, generator=g, device="cuda") * 0.05, text)
    tw = stack_experts(qw)
    assert moe_ws_a8_why_not(tw, torch.device("cuda")) is None
    xq, xs, xd = _quantized_x(t, kk, qw.scheme.act, g)
    ids = _ids(t, k, e, g)
    sorted_ids, expert_ids, total = moe_align(ids, e, kernel["block_m"])
    routed = torch.rand(t * k, generator=g, device="cuda")
    out = torch.full((t * k, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = moe_gemm_ws_a8(xq, tw, sorted_ids, expert_ids, total, num_rows=t * k, top_k=k, x_scales=xs, out=out,
                       routed_weights=routed, **kernel)  # fmt: skip
    w = qw.dequantize().double()
    flat = ids.reshape(-1).long()
    ref = torch.einsum("rk,rnk->rn", xd[torch.arange(t * k, device="cuda") // k], w[flat.clamp(min=0)])
    ref = ref * routed.double()[:, None]
    valid = flat >= 0
    assert rel_err(y[valid], ref[valid]) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.isnan(y[~valid]).all()  # slots of expert -1: left as they were
    again = moe_gemm_ws_a8(xq, tw, sorted_ids, expert_ids, total, num_rows=t * k, top_k=k, x_scales=xs,
                           routed_weights=routed, **kernel)  # fmt: skip
    assert torch.equal(y[valid], again[valid])


@KERNELS
def test_silu_mul_of_interleaved_gate_up(kernel):
    g = torch.Generator(device="cuda").manual_seed(5)
    e, k, t, h, i = 8, 2, 1500, 1024, 384
    qw = quantize(torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05, "w4a8")
    tw = stack_experts(interleave_gate_up(qw))
    xq, xs, xd = _quantized_x(t, h, qw.scheme.act, g)
    ids = _ids(t, k, e, g)
    sorted_ids, expert_ids, total = moe_align(ids, e, kernel["block_m"])
    y = moe_gemm_ws_a8(xq, tw, sorted_ids, expert_ids, total, num_rows=t * k, top_k=k, x_scales=xs, silu_mul=True,
                       **kernel)  # fmt: skip
    w = qw.dequantize().double()
    flat = ids.reshape(-1).long()
    hid = torch.einsum("rk,rnk->rn", xd[torch.arange(t * k, device="cuda") // k], w[flat.clamp(min=0)])
    ref = torch.nn.functional.silu(hid[:, :i]) * hid[:, i:]
    valid = flat >= 0
    assert rel_err(y[valid], ref[valid]) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("block_m", [96, 160, 272])
def test_the_other_blocks_of_two_parts(block_m):
    test_rows_match_their_experts("w4a8", 4, 2, 300, 200, 1024, dict(rs=True, block_m=block_m))


@pytest.mark.parametrize("switch", ["ANYBIT_MOE_WS_A8_MIN_ROWS", "ANYBIT_MOE_RS_A8_MIN_ROWS"])
def test_quant_moe_takes_it_at_large_m_and_captures(switch, monkeypatch):
    monkeypatch.setenv(switch, "96")
    moe, x, w, ids, y = large_m_layer("w4a8", moe_gemm_ws_a8)
    rs = "RS" in switch
    assert any(isinstance(p, tuple) and p[1].get("rs", False) == rs for p in moe._plans.values())
    exact = QuantMoE.from_quantized(moe.gate_up, moe.down)
    exact.backend = "torch"
    assert rel_err(y, exact(x, w, ids)) < 4 * GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(replayed(lambda: moe(x, w, ids)), y)


def test_explain_names_the_register_operand_kernel(monkeypatch):
    from anybit.tools.explain import moe_lines

    monkeypatch.setenv("ANYBIT_MOE_RS_A8_MIN_ROWS", "96")
    line = moe_lines("w4a8", 16, 4, 600, 512, 256, "cuda", "bf16")[-1]  # 150 rows an expert
    assert "moe_rs_a8" in line and "144-row blocks" in line
