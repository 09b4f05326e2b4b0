"""The persistent stream-K register-operand kernel (`frag_rsp`, work in progress) against float64 products of
`dequantize()`: 1, 7 and all SMs' CTAs sharing the tiles' K blocks (tiles summed over two or three CTAs), N off the
64-row tile, M off the token tile, an odd number of K blocks (a tile's last unit three blocks: the warpgroups' blocks
swap parity from one segment to the next), bias into a NaN-poisoned output, bit-equal relaunches (the tile counters
re-armed); one CTA with an even number of K blocks: the bits of the one-tile kernel."""

import pytest
import torch

from anybit.kernels.frag_rs import gemm_frag_rs
from anybit.kernels.frag_rsp import gemm_frag_rsp, gemm_frag_rsw
from tests.kernels.test_frag_rs_gpu import ONLY_RS, _only_rs_case
from tests.kernels.test_frag_ws_gpu import SM90_GPU
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = SM90_GPU


@pytest.mark.parametrize("text, dtype", [("w4a16", torch.bfloat16), ("nvfp4", torch.bfloat16),
                                         ("mxfp4", torch.bfloat16), ("w4a16:int4:g128:fp16", torch.float16),
                                         *ONLY_RS[:2], ONLY_RS[4], ONLY_RS[7]])  # fmt: skip
@pytest.mark.parametrize("m, n, k", [(13, 4160, 1024), (96, 2000, 1408), (200, 1040, 2944)])
@pytest.mark.parametrize("ctas", [1, 7, None])
def test_matches_the_exact_product(text, dtype, m, n, k, ctas):
    x, tw, ref = _only_rs_case(text, m, n, k, dtype, seed=m + n)
    bm = 96 if m == 96 else 128
    b = torch.randn(n, device="cuda").to(dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    y = gemm_frag_rsp(x, tw, b, out=out, block_m=bm, ctas=ctas)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[dtype]
    assert torch.equal(y, gemm_frag_rsp(x, tw, b, block_m=bm, ctas=ctas))
    if ctas == 1 and (k // 128) % 2 == 0:  # each tile's blocks split between the warpgroups as in the one-tile kernel
        assert torch.equal(y, gemm_frag_rs(x, tw, b, block_m=bm))


@pytest.mark.parametrize("text, dtype", [("w4a16", torch.bfloat16), ("nvfp4", torch.bfloat16),
                                         ("w4a16:int4:g128:fp16", torch.float16), *ONLY_RS[:2], ONLY_RS[4],
                                         ONLY_RS[7]])  # fmt: skip
@pytest.mark.parametrize("m, n, k", [(13, 4160, 1024), (96, 2000, 1408), (200, 1040, 2944), (64, 128, 128)])
@pytest.mark.parametrize("ctas", [1, 7, None])
@pytest.mark.parametrize(
    "options",
    [{}, {"head": False}, {"head": True, "late": False}, {"cvt": True}, {"cvt": False}],
    ids=["default", "ticket", "head", "cvt", "nocvt"],
)
def test_wide_matches_the_exact_product(text, dtype, m, n, k, ctas, options):
    """The wide form (`gemm_frag_rsw`, work in progress: 128-row tiles, the warpgroups a panel each sharing x, K
    blocks shared one by one): N = 4160 ends on a lone 64-row panel (the other's words past the weight, zero-filled,
    its rows not stored), K = 128 is one block a tile (7 CTAs: the host caps them at the blocks), bit-equal relaunch
    and CUDA-graph replay (the tile counters re-armed by the kernel); options: a shared tile summed by the last CTA in
    (ticket) rather than its first (the default up to 128 tokens, the others announcing their parts under their next
    segment's wgmma), the parts announced at the segment end (head), y through the 16-byte store or not (cvt)."""
    x, tw, ref = _only_rs_case(text, m, n, k, dtype, seed=m + n)
    bm = 96 if m == 96 else 64 if m == 64 else 128
    b = torch.randn(n, device="cuda").to(dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    y = gemm_frag_rsw(x, tw, b, out=out, block_m=bm, ctas=ctas, **options)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[dtype]
    assert torch.equal(y, gemm_frag_rsw(x, tw, b, block_m=bm, ctas=ctas, **options))
    graph = torch.cuda.CUDAGraph()  # capturable: no host synchronisation, the counters re-armed in the graph
    with torch.cuda.graph(graph):
        yg = gemm_frag_rsw(x, tw, b, block_m=bm, ctas=ctas, **options)
    graph.replay()
    graph.replay()
    assert torch.equal(yg, y)


@pytest.mark.parametrize("text, dtype", [("w4a16", torch.bfloat16), ("nvfp4", torch.bfloat16),
                                         ("w4a16:int4:g128:fp16", torch.float16), *ONLY_RS[:2], ONLY_RS[4],
                                         ONLY_RS[7]])  # fmt: skip
@pytest.mark.parametrize("m, n, k", [(13, 4160, 1024), (96, 2000, 1408), (64, 128, 128)])
@pytest.mark.parametrize("ctas", [1, 7, None])
def test_wide_four_panels_match_the_exact_product(text, dtype, m, n, k, ctas):
    """The wide form on 256-row tiles (panels=4: four MMA warpgroups, a 64-row panel each): N = 4160 ends on one real
    panel of four, 2000 on three and a part, 128 on two; bit-equal relaunch and CUDA-graph replay."""
    x, tw, ref = _only_rs_case(text, m, n, k, dtype, seed=m + n)
    bm = 96 if m == 96 else 64
    b = torch.randn(n, device="cuda").to(dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    y = gemm_frag_rsw(x, tw, b, out=out, block_m=bm, ctas=ctas, panels=4)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[dtype]
    assert torch.equal(y, gemm_frag_rsw(x, tw, b, block_m=bm, ctas=ctas, panels=4))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = gemm_frag_rsw(x, tw, b, block_m=bm, ctas=ctas, panels=4)
    graph.replay()
    assert torch.equal(yg, y)
