"""The register-operand Gluon kernel on a Hopper GPU: against float64 products of `dequantize()`, awkward
shapes (M off the token tile, N off the 64-row tile, K off the 128-K block and a single block), every token tile,
bias, a NaN-poisoned output, bit-equal relaunches; NVFP4 with FP8 x as its codes."""

import pytest
import torch

from anybit.backends.triton_layout import to_triton_layout
from anybit.formats.scheme import ScaleKind, Scheme
from anybit.kernels.dequant import cdiv
from anybit.kernels.frag_rs import frag_rs_why_not, gemm_frag_rs
from anybit.kernels.frag_ws import swap_block_m
from tests.kernels.test_frag_ws_gpu import SM90_GPU, _case, random_case
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = SM90_GPU


def _check_exact_product(text, dtype, m, n, k, tile):
    """A direct launch with bias into a NaN-poisoned output against the float64 product, then relaunched bit for
    bit."""
    x, tw, ref = _case(text, m, n, k, dtype, seed=m + n)
    assert frag_rs_why_not(tw, dtype, x.device) is None
    b = torch.randn(n, device="cuda").to(dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    y = gemm_frag_rs(x, tw, b, out=out, **tile)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[dtype]
    assert torch.equal(y, gemm_frag_rs(x, tw, b, **tile))  # relaunch: the same bits


@pytest.mark.parametrize("text, dtype", [("w4a16", torch.bfloat16), ("w4a16:int4:g128:fp16", torch.float16),
                                         ("w4a16:uint4:g128:bf16", torch.bfloat16),
                                         ("w4a16:int4:ch:bf16", torch.bfloat16), ("mxfp4", torch.bfloat16),
                                         ("nvfp4", torch.bfloat16), ("nvfp4", torch.float16)])  # fmt: skip
@pytest.mark.parametrize("m, n, k", [(1, 256, 512), (13, 4160, 1024), (257, 1008, 2880), (96, 1040, 128)])
@pytest.mark.parametrize("tile", [dict(block_m=64, stages=3), dict(block_m=96), dict(block_m=128),
                                  dict(block_m=160), dict(block_m=192), dict(block_m=256)],
                         ids=lambda t: f"bm{t['block_m']}")  # fmt: skip
def test_matches_the_exact_product(text, dtype, m, n, k, tile):
    if k == 2880 and text.startswith("w4a16") and ":ch:" not in text:
        k = 2944  # K must be a multiple of the 128-K group; 23 blocks: the second warpgroup takes one fewer
    _check_exact_product(text, dtype, m, n, k, tile)


@pytest.mark.parametrize("text", ["w4a16", "w4a16:int4:ch:bf16", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("m, k, split", [(96, 2944, 2), (40, 2880, 3), (130, 1024, 4), (257, 384, 3)])
def test_split_k(text, m, k, split):
    """split_k CTAs a tile, the last to finish summing the fp32 partials (the counters left zero for the next call):
    uneven shares (23 blocks in 2 or 3, 3 blocks in 3 — one block a split, the second warpgroup with none), two-part
    token tiles, N off the tile, bias, NaN-poisoned output, bit-stable relaunch."""
    if k == 2880 and ":ch:" not in text:
        k = 2944 if text.startswith("w4a16") else 2880
    x, tw, ref = _case(text, m, 1040, k, torch.bfloat16, seed=m + k)
    b = torch.randn(1040, device="cuda").bfloat16()
    ws = torch.empty(split * m * 1040, device="cuda")
    cnt = torch.zeros(4096, dtype=torch.int32, device="cuda")
    outs = []
    for _ in range(2):
        out = torch.full((m, 1040), float("nan"), device="cuda", dtype=torch.bfloat16)
        outs.append(gemm_frag_rs(x, tw, b, out=out, block_m=swap_block_m(m) or 128, split_k=split, workspace=ws,
                                 counters=cnt))  # fmt: skip
    assert rel_err(outs[0], ref + b.double()) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(outs[0], outs[1]) and not cnt.any()


BYTE_TILES = [
    dict(block_m=64, stages=3),
    dict(block_m=96),
    dict(block_m=128),
    dict(block_m=192),
    dict(block_m=256),
    dict(block_m=256, stages=5),  # odd: guarded (the default is 6 — one x slice a slot)
    dict(block_m=96, split_k=2),
    dict(block_m=288),  # 256 + 32, 5 slots (odd: guarded); not routed yet
    dict(block_m=320),
]


@pytest.mark.parametrize("text, dtype", [("w8a16", torch.bfloat16), ("w8a16:int8:g128:fp16", torch.float16),
                                         ("w8a16:uint8:g64:bf16", torch.bfloat16)])  # fmt: skip
@pytest.mark.parametrize("m, n, k", [(1, 256, 512), (13, 4160, 1024), (257, 1008, 1472), (96, 1040, 64)])
@pytest.mark.parametrize("tile", BYTE_TILES, ids=lambda t: "-".join(f"{a}{b}" for a, b in t.items()))
def test_bytes_match_the_exact_product(text, dtype, m, n, k, tile):
    """8-bit integer codes (`W8`: a 64-K block of their layout is one x slice and one wgmma): K off the 128-K block
    (1472 = 23 blocks of 64; g128 1408) and a single block (the second warpgroup has none), every token tile, split
    K, bias, NaN-poisoned output, bit-equal relaunch."""
    if k == 1472 and "g128" in text:
        k = 1408
    if k == 64 and "g128" in text:
        k = 128
    if tile.get("split_k", 1) > cdiv(k, 64):
        pytest.skip("more splits than blocks")
    _check_exact_product(text, dtype, m, n, k, tile)


def test_fp8_codes_on_nvfp4_weights():
    """W4A8-NVFP4 (`codes_a16`): x's e4m3 codes in bf16, its per-row scales in the epilogue."""
    from anybit import prepare
    from anybit.kernels.quant_act import quantize_act
    from tests.kernels.test_gemm_a8 import a8_reference

    x, qw = random_case("w4a8-nvfp4", 150, 8192, 2048, seed=1)
    p = prepare(qw, backend="triton")
    xq, xs = quantize_act(x, qw.scheme.act, codes_dtype=torch.bfloat16)
    y = gemm_frag_rs(xq, p.data, x_scales=xs)
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize(
    "text, m",
    [
        ("w4a16", 96),
        ("mxfp4", 192),
        ("nvfp4", 130),
        ("w4a16", 64),
        ("nvfp4", 56),
        ("mxfp4", 40),
        ("w8a16", 96),
        ("w8a16:int8:g128:bf16", 256),
        ("w8a16", 300),
    ],
)
def test_is_the_route(text, m):
    """anybit.gemm of a 33-192-row call of a 8192-row weight (K < 2N; 8-bit codes also up to 256 rows, and 257-320
    on one 320-token tile) runs this kernel's `rs_tile`: the same bits as a direct launch."""
    from anybit.backends import get_backend
    from anybit.backends.base import Prepared
    from anybit.backends.triton_layout import to_triton_layout
    from anybit.kernels.frag_rs import rs_tile

    x, qw = random_case(text, m, 8192, 1024, seed=m)
    tw = to_triton_layout(qw)
    route = get_backend("triton").gemm(x, Prepared("triton", qw, tw))
    tile = rs_tile(m, 8192, 1024, torch.cuda.get_device_properties(0).multi_processor_count, qw.scheme.weight.bits)
    assert torch.equal(route, gemm_frag_rs(x, tw, block_m=tile["block_m"], stages=tile["stages"]))


@pytest.mark.parametrize("text, m", [("w4a16", 96), ("mxfp4", 128), ("nvfp4", 160), ("w4a16", 192), ("w8a16", 128),
                                     ("w8a16", 300), ("w4a16", 48), ("nvfp4", 64), ("w4a8-nvfp4", 40),
                                     ("w8a16", 40)])  # fmt: skip
def test_split_k_is_the_route_where_tiles_are_few(text, m):
    """anybit.gemm of a 33-256-row call of a 4096x14336 weight (64 tiles of 64 rows: at 33-64 rows two CTAs a tile
    fill one wave — 4- and 8-bit codes —, at 65-256 K >= 2N; 8-bit codes also 257-320 rows on a 320-token tile) runs
    this kernel split in two along K (`rs_tile`): a direct launch's bits, the exact product (FP8 x as codes: of x as
    the quantizer gives it)."""
    from anybit import prepare
    from anybit.backends import get_backend
    from anybit.kernels.frag_rs import rs_tile

    x, qw = random_case(text, m, 4096, 14336, seed=m)
    p = prepare(qw, backend="triton")
    tile = rs_tile(m, 4096, 14336, torch.cuda.get_device_properties(0).multi_processor_count, qw.scheme.weight.bits)
    assert tile["split_k"] == 2
    y = get_backend("triton").gemm(x, p)
    xs = None
    if qw.scheme.act.quantized:  # `codes_a16`: x's e4m3 codes in x's dtype, its scales after the MMA
        from anybit.kernels.quant_act import quantize_act

        x, xs = quantize_act(x, qw.scheme.act, codes_dtype=x.dtype)
    assert torch.equal(y, gemm_frag_rs(x, p.data, x_scales=xs, **{a: v for a, v in tile.items() if a != "rs"}))
    ref = (x.double() * (1 if xs is None else xs.double())) @ qw.dequantize().double().T
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("text, m, n", [("w4a16", 160, 6144), ("mxfp4", 256, 6144), ("nvfp4", 192, 4096),
                                         ("w4a16", 300, 4096), ("mxfp4", 384, 4096), ("mxfp4", 512, 4096),
                                         ("nvfp4", 449, 4000), ("w8a16", 400, 4096), ("w8a16", 512, 4000),
                                         ("w4a16", 40, 6144), ("mxfp4", 64, 6144)])  # fmt: skip
def test_is_the_route_where_the_warp_specialised_kernel_is_not(text, m, n):
    """anybit.gemm of a 33-64-row call of a 6144-row weight, or a 129-512-row one of a weight whose 64-row tiles fit
    one wave (Llama-3-8B's qkv / o, K < 2N:
    the warp-specialised kernel would not run; above 256 rows where two token tiles a 64-row tile fit one wave: 4-bit
    codes 192-token tiles to 384 rows, 256 above, 8-bit codes 256 above 384) runs this kernel unsplit: a direct
    launch's bits, the exact product."""
    from anybit import prepare
    from anybit.backends import get_backend
    from anybit.kernels.frag_rs import rs_tile

    x, qw = random_case(text, m, n, 4096, seed=m)
    p = prepare(qw, backend="triton")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tile = rs_tile(m, n, 4096, sms, qw.scheme.weight.bits)
    assert "split_k" not in tile
    y = get_backend("triton").gemm(x, p)
    assert torch.equal(y, gemm_frag_rs(x, p.data, block_m=tile["block_m"], stages=tile["stages"]))
    ref = x.double() @ qw.dequantize().double().T
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("text, dtype", [("w8a16:int8:ch:fp16", torch.float16), ("w4a16", torch.bfloat16)])
@pytest.mark.parametrize("tile", [dict(block_m=64, stages=3), dict(block_m=256, stages=3), dict(block_m=128, stages=4),
                                  dict(block_m=64, stages=5), dict(block_m=160, stages=5), dict(block_m=256)],
                         ids=["bm64s3", "bm256s3", "bm128s4", "bm64s5", "bm160s5", "bm256"])  # fmt: skip
def test_first_calls_after_another_kernel(text, dtype, tile):
    """The ring's phase-parity hazard (`frag_rs.RS_MIN_STAGES`): unguarded, a warpgroup's wait in a ring of 3 slots
    passed on the previous occupant of its block's slot, and a whole 64-K block came out of the older block's words
    in 1-4 of 8 first calls after another kernel (H200, session 27). Fresh weights, a cuBLAS GEMM between launches,
    odd numbers of slots (guarded) and even: every call the exact product."""
    for seed in range(8):
        x, tw, ref = _case(text, 13 + 29 * seed, 4160, 1024, dtype, seed=seed)
        a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
        (a @ a).sum().item()  # another kernel's data in shared memory and L2 before the launch
        y = gemm_frag_rs(x, tw, **tile)
        assert rel_err(y, ref) < GEMM_REL_ERR[dtype], seed


@pytest.mark.parametrize("text, m, n, k", [("w4a16", 288, 8192, 1024), ("nvfp4", 384, 6144, 1024),
                                           ("w8a16", 330, 8192, 1024), ("mxfp4", 300, 8208, 2048),
                                           ("w4a16", 257, 8192, 4096)])  # fmt: skip
def test_two_launches_where_the_tiles_would_overfill_a_wave(text, m, n, k):
    """anybit.gemm of a 257-384-row call of a 6144/8192-row weight (`rs_parts`): the first 256 rows and the rest as
    two launches into one output — each part's bits those of a direct launch on its rows, the exact product."""
    from anybit import prepare
    from anybit.backends import get_backend
    from anybit.kernels.frag_rs import rs_parts

    x, qw = random_case(text, m, n, k, seed=m)
    p = prepare(qw, backend="triton")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tile = rs_parts(m, n, k, sms, qw.scheme.weight.bits)
    y = get_backend("triton").gemm(x, p)
    row = 0
    for rows, part in tile["parts"]:
        direct = gemm_frag_rs(x[row : row + rows], p.data, **{a: v for a, v in part.items() if a != "rs"})
        assert torch.equal(y[row : row + rows], direct), (row, rows, part)
        row += rows
    ref = x.double() @ qw.dequantize().double().T
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.bfloat16]


ONLY_RS = [("w3a16", torch.bfloat16), ("w3a16", torch.float16), ("w3a16:int3:g128:bf16", torch.bfloat16),
           ("w3a16:int3:ch:fp16", torch.float16), ("w4a16:uint4:g128:bf16:zp-int", torch.bfloat16),
           ("w4a16:uint4:g128:fp16:zp-int", torch.float16), ("w4a16:int4:g128:fp16", torch.bfloat16),
           ("w2a16", torch.bfloat16), ("w2a16:uint2:g64:fp16:zp-int", torch.float16),
           ("w2a16:int2:g256:bf16", torch.bfloat16), ("w2a16:int2:ch:bf16", torch.bfloat16)]  # fmt: skip


def _only_rs_case(text, m, n, k, dtype, seed):
    """x, the weight as the dense backend lays it out (3-bit planes), and the float64 product of `dequantize()`."""
    x, qw = random_case(text, m, n, k, dtype, seed)
    tw = to_triton_layout(qw, allow_frag3=True)
    assert frag_rs_why_not(tw, dtype, x.device) is None
    return x, tw, x.double() @ qw.dequantize().double().T


@pytest.mark.parametrize("text, dtype", ONLY_RS)
@pytest.mark.parametrize("m, n, k", [(1, 256, 512), (13, 4160, 1024), (257, 1008, 2944), (96, 1040, 128),
                                     (70, 2048, 1664)])  # fmt: skip
@pytest.mark.parametrize("tile", [dict(block_m=64, stages=3), dict(block_m=96), dict(block_m=128), dict(block_m=192),
                                  dict(block_m=256), dict(block_m=96, split_k=2)],
                         ids=lambda t: "-".join(f"{a}{b}" for a, b in t.items()))  # fmt: skip
def test_zero_points_and_three_bit_codes(monkeypatch, text, dtype, m, n, k, tile):
    """Weights only this kernel runs (`rs_int_why_not`): integer zero points (2 to 4 bits), 3-bit codes rebuilt from
    their planes (every block parity, K off the 512-K unit: 1664, 2944), 2-bit codes (each half of a 256-K block, 64-K
    groups, K=128: half a block), scales of the other 16-bit type (rounded to x's once: within the same budget) —
    against the float64 product, bias, NaN-poisoned output, bit-equal relaunch."""

    monkeypatch.setenv("ANYBIT_RS_W2", "1")  # (as by default)
    g = Scheme.parse(text).granularity
    if g.kind is ScaleKind.GROUP and k % g.k:
        pytest.skip(f"K={k} is not a multiple of the group {g.k}")
    if tile.get("split_k", 1) > -(-k // 128):
        pytest.skip("a split a block at least")
    x, tw, ref = _only_rs_case(text, m, n, k, dtype, seed=m + n)
    b = torch.randn(n, device="cuda").to(dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    y = gemm_frag_rs(x, tw, b, out=out, **tile)
    assert rel_err(y, ref + b.double()) < GEMM_REL_ERR[dtype]
    assert torch.equal(y, gemm_frag_rs(x, tw, b, **tile))


@pytest.mark.parametrize("text", ["w3a16", "w4a16:uint4:g128:bf16:zp-int", "w4a16:int4:g128:fp16", "w2a16"])
@pytest.mark.parametrize("m, n, k", [(40, 8192, 4096), (96, 8192, 4096), (200, 4096, 4096), (160, 4096, 14336),
                                     (300, 4096, 4096)])  # fmt: skip
def test_route_sends_them_here(monkeypatch, text, m, n, k):
    """anybit.gemm of these weights at 33-512 rows where `rs_tile` (or `rs_parts`) takes the call: the register-operand
    kernel's bits (the warp-specialised kernel does not run them), the exact product; under a CUDA graph too."""
    from anybit import prepare
    from anybit.backends.triton import ws_route_tile

    monkeypatch.setenv("ANYBIT_RS_W2", "1")  # (as by default)
    x, qw = random_case(text, m, n, k, seed=m)
    p = prepare(qw, backend="triton")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tile = ws_route_tile(m, n, k, sms, qw.scheme.weight.bits, ws=False)
    assert tile is not None and tile.get("rs") and "parts" not in tile
    check_route(x, qw, p, lambda: gemm_frag_rs(x, p.data, **{a: v for a, v in tile.items() if a != "rs"}))


def check_route(x, qw, p, direct):
    """anybit.gemm (the Triton backend) of x on the prepared weight p: the bits of `direct()` (the kernel launched on
    the route's tile), the exact product, and the same bits replayed from a CUDA graph."""
    from anybit.backends import get_backend

    backend = get_backend("triton")
    y = backend.gemm(x, p)
    assert torch.equal(y, direct())
    assert rel_err(y, x.double() @ qw.dequantize().double().T) < GEMM_REL_ERR[torch.bfloat16]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        yg = backend.gemm(x, p)
    g.replay()
    assert torch.equal(yg, y)
