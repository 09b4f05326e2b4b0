"""The warp-specialised grouped MoE kernel on a Hopper GPU: each sorted row against a float64 product of its
expert's `dequantize()`, with ids of -1, experts without rows, N and K off the tile, gate/up fused, top-k
weights, poisoned outputs, bit-equal relaunches; and `QuantMoE` taking it at large M."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import stack_experts
from anybit.kernels.moe_ws import moe_gemm_ws, moe_ws_why_not
from anybit.moe import QuantMoE, moe_align, softmax_topk
from anybit.moe.layer import interleave_gate_up
from tests.graphs import replayed
from tests.moe.test_quant_moe import reference
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs sm_90"
    ),
]


def _ids(t, k, e, g):
    ids = torch.stack([torch.randperm(e, generator=g, device="cuda")[:k] for _ in range(t)]).int()
    ids[ids == 1] = -1  # expert 1: not on this rank (its slots are skipped)
    ids[ids == 2] = 0  # expert 2 receives nothing
    return ids


CASES = [
    (4, 2, 300, 200, 1024, 128),
    (19, 2, 700, 1000, 2176, 128),
    (8, 1, 1100, 384, 768, 256),
    (64, 8, 257, 512, 512, 128),
]  # (E, top-k, tokens, N, K, block_m)


@pytest.mark.parametrize("text, dtype", [("w4a16", torch.bfloat16), ("w4a16:int4:g128:fp16", torch.float16),
                                         ("w4a16:uint4:g128:bf16", torch.bfloat16),
                                         ("w4a16:int4:ch:bf16", torch.bfloat16)])  # fmt: skip
@pytest.mark.parametrize("e, k, t, n, kk, block_m", CASES)
def test_rows_match_their_experts(text, dtype, e, k, t, n, kk, block_m):
    g = torch.Generator(device="cuda").manual_seed(e + t)
    qw = quantize(torch.randn(e, n, kk, generator=g, device="cuda") * 0.05, text)
    tw = stack_experts(qw)
    assert moe_ws_why_not(tw, dtype, torch.device("cuda")) is None
    x = torch.randn(t, kk, generator=g, device="cuda").to(dtype)
    ids = _ids(t, k, e, g)
    sorted_ids, expert_ids, total = moe_align(ids, e, block_m)
    routed = torch.rand(t * k, generator=g, device="cuda")
    out = torch.full((t * k, n), float("nan"), device="cuda", dtype=dtype)
    y = moe_gemm_ws(x, tw, sorted_ids, expert_ids, total, block_m=block_m, num_rows=t * k, top_k=k, out=out,
                    routed_weights=routed)  # fmt: skip
    w = qw.dequantize().double()
    flat = ids.reshape(-1).long()
    ref = torch.einsum("rk,rnk->rn", x.double()[torch.arange(t * k, device="cuda") // k], w[flat.clamp(min=0)])
    ref = ref * routed.double()[:, None]
    valid = flat >= 0
    assert rel_err(y[valid], ref[valid]) < GEMM_REL_ERR[dtype]
    assert torch.isnan(y[~valid]).all()  # slots of expert -1: left as they were
    again = moe_gemm_ws(x, tw, sorted_ids, expert_ids, total, block_m=block_m, num_rows=t * k, top_k=k,
                        routed_weights=routed)  # fmt: skip
    assert torch.equal(y[valid], again[valid])


def test_k_tail_half_a_block_and_channel_scales():
    g = torch.Generator(device="cuda").manual_seed(11)
    e, t, n, kk = 4, 500, 256, 2880  # 2880 = 22.5 blocks of 128
    qw = quantize(torch.randn(e, n, kk, generator=g, device="cuda") * 0.05, "w4a16:int4:ch:bf16")
    x = torch.randn(t, kk, generator=g, device="cuda").bfloat16()
    ids = torch.randint(0, e, (t, 1), generator=g, device="cuda").int()
    sorted_ids, expert_ids, total = moe_align(ids, e, 128)
    y = moe_gemm_ws(x, stack_experts(qw), sorted_ids, expert_ids, total, block_m=128, num_rows=t, top_k=1)
    ref = torch.einsum("rk,rnk->rn", x.double(), qw.dequantize().double()[ids.reshape(-1).long()])
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("block_m", [128, 256])
def test_silu_mul_of_interleaved_gate_up(block_m):
    g = torch.Generator(device="cuda").manual_seed(block_m)
    e, k, t, h, i = 8, 2, 1500, 1024, 384
    qw = quantize(torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05, "w4a16")
    tw = stack_experts(interleave_gate_up(qw))
    x = torch.randn(t, h, generator=g, device="cuda").bfloat16()
    ids = _ids(t, k, e, g)
    sorted_ids, expert_ids, total = moe_align(ids, e, block_m)
    y = moe_gemm_ws(x, tw, sorted_ids, expert_ids, total, block_m=block_m, num_rows=t * k, top_k=k, silu_mul=True)
    w = qw.dequantize().double()
    flat = ids.reshape(-1).long()
    hid = torch.einsum("rk,rnk->rn", x.double()[torch.arange(t * k, device="cuda") // k], w[flat.clamp(min=0)])
    ref = torch.nn.functional.silu(hid[:, :i]) * hid[:, i:]
    valid = flat >= 0
    assert rel_err(y[valid], ref[valid]) < GEMM_REL_ERR[torch.bfloat16]


def large_m_layer(scheme: str, run) -> tuple:
    """A `QuantMoE` of `scheme` at 150 rows per expert (16 experts, top-4, 600 tokens), called once: (moe, x, top-k
    weights, ids, y), after checking that its plan took the grouped kernel `run`."""
    g = torch.Generator(device="cuda").manual_seed(7)
    e, k, t, h, i = 16, 4, 600, 512, 256
    moe = QuantMoE.from_float(torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05,
                              torch.randn(e, h, i, generator=g, device="cuda") * 0.05, scheme)  # fmt: skip
    x = torch.randn(t, h, generator=g, device="cuda").bfloat16()
    w, ids = softmax_topk(torch.randn(t, e, generator=g, device="cuda"), k)
    y = moe(x, w, ids)
    assert any(isinstance(p, tuple) and p[-1] is run for p in moe._plans.values())
    return moe, x, w, ids, y


def test_quant_moe_takes_it_at_large_m_and_captures(monkeypatch):
    monkeypatch.setenv("ANYBIT_MOE_WS_MIN_ROWS", "96")
    moe, x, w, ids, y = large_m_layer("w4a16", moe_gemm_ws)
    ref = reference(x.cpu(), moe.gate_up.dequantize().cpu(), moe.down.dequantize().cpu(), w.cpu(), ids.cpu())
    assert rel_err(y.cpu(), ref) < 4 * GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(replayed(lambda: moe(x, w, ids)), y)
