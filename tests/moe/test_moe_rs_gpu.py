"""The register-operand grouped MoE kernel on a Hopper GPU: each row against a float64 product of its expert's
`dequantize()` (ids of -1, experts without rows, K off the block, top-k weights, poisoned outputs, bit-equal
relaunches), and `QuantMoE` taking it (ANYBIT_MOE_RS_MIN_ROWS) against the exact loop, CUDA-graph replay."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import stack_experts
from anybit.kernels.moe_rs import moe_gather, moe_gemm_rs, moe_rs_why_not
from anybit.moe import QuantMoE, moe_align, softmax_topk
from tests.graphs import replayed
from tests.moe.test_moe_ws_gpu import _ids
from tests.moe.test_quant_moe import reference
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0), reason="needs sm_90"
    ),
]

CASES = [(4, 2, 300, 256, 1024, 128), (19, 2, 700, 1024, 2176, 160), (8, 1, 1100, 384, 768, 256),
         (64, 8, 257, 512, 512, 64), (8, 2, 500, 320, 4224, 96)]  # (E, top-k, tokens, N, K, block_m)  # fmt: skip


@pytest.mark.parametrize("text, dtype", [("w4a16", torch.bfloat16), ("w4a16:int4:g128:fp16", torch.float16),
                                         ("mxfp4", torch.bfloat16), ("nvfp4", torch.bfloat16),
                                         ("w8a16", torch.bfloat16)])  # fmt: skip
@pytest.mark.parametrize("e, k, t, n, kk, block_m", CASES)
def test_rows_match_their_experts(text, dtype, e, k, t, n, kk, block_m):
    g = torch.Generator(device="cuda").manual_seed(e + t)
    qw = quantize(torch.randn(e, n, kk, generator=g, device="cuda") * 0.05, text)
    tw = stack_experts(qw)
    assert moe_rs_why_not(tw, dtype, torch.device("cuda")) is None
    x = torch.randn(t, kk, generator=g, device="cuda").to(dtype)
    ids = _ids(t, k, e, g)  # expert 1 not on this rank, expert 2 without rows
    sorted_ids, expert_ids, total = moe_align(ids, e, block_m)
    routed = torch.rand(t * k, generator=g, device="cuda")
    xs = moe_gather(x, sorted_ids, total, k)
    out = torch.full((t * k, n), float("nan"), device="cuda", dtype=dtype)
    y = moe_gemm_rs(xs, tw, sorted_ids, expert_ids, total, block_m=block_m, num_rows=t * k, scatter=True,
                    routed_weights=routed, out=out)  # fmt: skip
    w = qw.dequantize().double()
    flat = ids.reshape(-1).long()
    ref = torch.einsum("rk,rnk->rn", x.double()[torch.arange(t * k, device="cuda") // k], w[flat.clamp(min=0)])
    ref = ref * routed.double()[:, None]
    valid = flat >= 0
    assert rel_err(y[valid], ref[valid]) < GEMM_REL_ERR[dtype]
    assert torch.isnan(y[~valid]).all()  # dropped slots untouched
    again = moe_gemm_rs(xs, tw, sorted_ids, expert_ids, total, block_m=block_m, num_rows=t * k, scatter=True,
                        routed_weights=routed, out=out.clone())  # fmt: skip
    assert torch.equal(again[valid], y[valid])
    # the sorted order (the gate_up GEMM's output): each valid position's row is its slot's unweighted product
    h = moe_gemm_rs(xs, tw, sorted_ids, expert_ids, total, block_m=block_m, num_rows=t * k)
    pos = torch.arange(int(total), device="cuda")
    slot = sorted_ids[pos].long()
    ok = slot < t * k
    assert torch.allclose(h[pos[ok]].double() * routed.double()[slot[ok], None], y[slot[ok]].double(),
                          rtol=1e-2, atol=1e-2)  # fmt: skip


@pytest.mark.parametrize("text", ["w4a16", "mxfp4", "w8a16"])
def test_quant_moe_takes_it_and_captures(monkeypatch, text):
    from anybit.kernels import moe_rs

    calls = []
    monkeypatch.setenv("ANYBIT_MOE_RS_MIN_ROWS", "64")
    monkeypatch.setattr(moe_rs, "moe_silu_sorted", lambda *a, f=moe_rs.moe_silu_sorted: calls.append(1) or f(*a))
    g = torch.Generator(device="cuda").manual_seed(7)
    e, k, t, h, i = 16, 4, 600, 512, 256  # 150 rows per expert
    moe = QuantMoE.from_float(torch.randn(e, 2 * i, h, generator=g, device="cuda") * 0.05,
                              torch.randn(e, h, i, generator=g, device="cuda") * 0.05, text)  # fmt: skip
    x = torch.randn(t, h, generator=g, device="cuda").bfloat16()
    w, ids = softmax_topk(torch.randn(t, e, generator=g, device="cuda"), k)
    ids[::7, 1] = -1
    y = moe(x, w, ids)
    assert calls  # it ran this path
    ref = reference(x.cpu(), moe.gate_up.dequantize().cpu(), moe.down.dequantize().cpu(), w.cpu(), ids.cpu())
    assert rel_err(y.cpu(), ref) < 4 * GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(replayed(lambda: moe(x, w, ids)), y)
