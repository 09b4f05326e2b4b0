"""The warp-specialised Gluon kernel's row-major tiles on the integer weights only the register-operand kernel took
before (`frag_rs.ws_int_why_not`: zero points, 3- and 2-bit codes, scales of the other 16-bit type) on a Hopper GPU:
against float64 products of `dequantize()`, awkward shapes, bias, NaN-poisoned outputs, bit-equal relaunches; the
route (`ws_route_tile`, plain) above the register-operand kernel's rows, under a CUDA graph too."""

import pytest
import torch

from anybit.formats.scheme import ScaleKind, Scheme
from anybit.kernels.frag_ws import gemm_frag_ws, ws_tile
from tests.kernels.test_frag_rs_gpu import ONLY_RS, _only_rs_case, check_route
from tests.kernels.test_frag_ws_gpu import SM90_GPU, random_case
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = SM90_GPU


@pytest.fixture
def ws_int(monkeypatch):
    """The route's switches for these weights on (as by default; ANYBIT_RS_W2=0 / ANYBIT_WS_INT=0 turn them off)."""
    monkeypatch.setenv("ANYBIT_RS_W2", "1")
    monkeypatch.setenv("ANYBIT_WS_INT", "1")


# (M, N, K): M off both token tiles, N off the 128-row tile, K off the 512-K unit of the 3-bit planes (every block
# parity) and a single 128-K block (half of a 2-bit one). One specialisation of the kernel's integer arguments for all
# three (a Gluon compile takes seconds: one a format and tile)
SHAPES = [(257, 1008, 2944), (600, 4160, 1664), (130, 1040, 128)]
# (2-bit codes: a block is four K steps, so two decoders would need 5 stages, more than shared memory holds —
# `frag_ws.ws_min_stages`; with 3 the H200 hung, session 36)
NDEC_FORMATS = ["w3a16", "w4a16:uint4:g128:bf16:zp-int", "w4a16:int4:g128:fp16"]


# 8-bit codes with scales of the other 16-bit type (rounded to x's): the route's 8-bit tile (two decoders, up to
# `frag_ws.WS_BYTES_MAX_M` rows) with the byte decode
BYTES = [("w8a16:int8:ch:fp16", torch.bfloat16), ("w8a16:uint8:g128:bf16", torch.float16)]


@pytest.mark.parametrize("text, dtype", ONLY_RS + BYTES)
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("tile", [dict(block_m=256), dict(block_m=128, stages=6)],
                         ids=lambda t: "-".join(f"{a}{b}" for a, b in t.items()))  # fmt: skip
def test_matches_the_exact_product(ws_int, text, dtype, m, n, k, tile):
    """Zero points (2 to 4 bits), 3-bit codes rebuilt from their planes, 2-bit codes (four 64-K steps a 256-K block,
    64-K groups), scales of the other 16-bit type (8-bit codes too)."""
    _check(text, dtype, m, n, k, tile)


@pytest.mark.parametrize("text", NDEC_FORMATS)
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_two_decoders_match_the_exact_product(ws_int, text, m, n, k):
    """Two decoder partitions on alternate blocks (3 stages, 2 blocks of words each)."""
    dtype = torch.float16 if ":fp16:zp" in text else torch.bfloat16
    _check(text, dtype, m, n, k, dict(block_m=256, ndec=2, stages=3, depth=2, dq_regs=80))


def _check(text, dtype, m, n, k, tile):
    """One direct launch with bias into a NaN-poisoned output against the float64 product, relaunched bit for bit."""
    g = Scheme.parse(text).granularity
    if g.kind is ScaleKind.GROUP and k % g.k:
        pytest.skip(f"K={k} is not a multiple of the group {g.k}")
    x, tw, ref = _only_rs_case(text, m, n, k, dtype, seed=m + n)
    bits = tw.fmt["W_BITS"]
    t = dict(ws_tile(512, 8192, bits=bits)) | tile  # (the route's tile at 512 rows, then the test's)
    b = torch.randn(n, device="cuda").to(dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    y = gemm_frag_ws(x, tw, b, out=out, **t)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[dtype]
    assert torch.equal(y, gemm_frag_ws(x, tw, b, **t))  # relaunch: the same bits


@pytest.mark.parametrize("text", ["w3a16", "w4a16:uint4:g128:bf16:zp-int", "w4a16:int4:g128:fp16", "w2a16"])
@pytest.mark.parametrize("m, n, k", [(512, 8192, 4096), (1024, 4096, 4096), (768, 5632, 2048)])
def test_route_sends_them_here(ws_int, text, m, n, k):
    """anybit.gemm of these weights above the register-operand kernel's rows: the warp-specialised kernel's row-major
    tile (`ws_route_tile`, plain), its bits, the exact product; under a CUDA graph too."""
    from anybit import prepare
    from anybit.backends.triton import ws_route_tile

    x, qw = random_case(text, m, n, k, seed=m)
    p = prepare(qw, backend="triton")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tile = ws_route_tile(m, n, k, sms, qw.scheme.weight.bits, ws=False, plain=True)
    assert tile is not None and not tile.get("rs") and not tile.get("swap")
    check_route(x, qw, p, lambda: gemm_frag_ws(x, p.data, **tile))
    assert p.data.ws_ok[torch.bfloat16] == (False, True, True)
