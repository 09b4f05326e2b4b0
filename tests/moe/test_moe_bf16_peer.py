"""tools/moe_bf16.py, the bf16 fused-MoE baseline that tools/moe_bench.py times beside anybit (`--peers bf16`): its
Triton kernel under the interpreter (fp16) against a per-expert loop, so a device run times a correct peer."""

import os
import sys

import pytest
import torch

from anybit.moe import moe_align
from tests.tolerances import GEMM_REL_ERR, rel_err

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools"))

from moe_bf16 import bf16_moe_gemm  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 on CPU")


@pytest.mark.parametrize("tokens, experts, top_k, block_m", [(7, 4, 2, 16), (13, 5, 1, 64), (3, 6, 2, 16)])
def test_matches_a_per_expert_loop(tokens, experts, top_k, block_m):
    """Every routed row (x[row // top_k] @ w[expert]^T), N and K off the tile (96 x 80), experts with no token, an
    id of -1 (no expert: its row is not written)."""
    g = torch.Generator().manual_seed(tokens)
    n, k = 96, 80
    x = torch.randn(tokens, k, generator=g).half()
    w = (torch.randn(experts, n, k, generator=g) * 0.1).half()
    ids = torch.randint(0, experts - 1, (tokens, top_k), generator=g)  # the last expert gets none
    ids[0, 0] = -1
    sorted_ids, expert_ids, total = moe_align(ids, experts, block_m)
    out = torch.full((tokens * top_k, n), float("nan"), dtype=torch.float16)
    y = bf16_moe_gemm(x, w, sorted_ids, expert_ids, total, num_rows=tokens * top_k, top_k=top_k, block_m=block_m,
                      out=out)  # fmt: skip
    for row, e in enumerate(ids.flatten().tolist()):
        if e < 0:
            assert y[row].isnan().all()
            continue
        ref = x[row // top_k].double() @ w[e].double().T
        assert rel_err(y[row], ref) < GEMM_REL_ERR[torch.float16], (row, e)


@pytest.mark.parametrize("rows, inter", [(5, 48), (3, 1300)])
def test_the_peer_glue_silu_mul(rows, inter):
    """tools/moe_glue.py's silu(gate) * up in one pass (Humming's layer in tools/moe_bench.py): against torch in
    float64, I off the block (1300 > its 1024 columns)."""
    from moe_glue import silu_mul

    h = torch.randn(rows, 2 * inter, generator=torch.Generator().manual_seed(rows)).half()
    ref = torch.nn.functional.silu(h[:, :inter].double()) * h[:, inter:].double()
    assert rel_err(silu_mul(h), ref) < 1e-3


@pytest.mark.parametrize("tokens, top_k, hidden", [(4, 2, 40), (3, 8, 1100)])
def test_the_peer_glue_weighted_sum(tokens, top_k, hidden):
    """tools/moe_glue.py's top-k weighted sum in one pass: against torch in float64, H off the block."""
    from moe_glue import weighted_sum

    g = torch.Generator().manual_seed(hidden)
    y = torch.randn(tokens * top_k, hidden, generator=g).half()
    w = torch.rand(tokens, top_k, generator=g)
    ref = (y.double().view(tokens, top_k, hidden) * w.double()[..., None]).sum(dim=1)
    assert rel_err(weighted_sum(y, w), ref) < 1e-3
