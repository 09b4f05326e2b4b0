"""The fragment-layout kernels on the GPU in bf16 at real sizes: every format, every tile the sweep
and the default rule can pick, bit-for-bit equal relaunches (the guard against a register-operand
wgmma race), graph replay through the MoE path is in tests/moe."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import to_triton_layout
from anybit.kernels.frag import frag_tile, gemm_frag
from tests.kernels.test_frag import (
    FRAG_FORMATS,
    assert_fold_gives_the_same_bits,
    assert_pairs_give_the_same_bits,
    assert_scale_bits_give_the_same_bits,
    e2m1_weight,
)
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = pytest.mark.gpu

TILES = [(64, 4, 4), (128, 4, 4), (128, 8, 3), (256, 8, 3), (256, 4, 3)]  # (block_n, warps, stages)


def _case(text, m, n, k, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qw = quantize(torch.randn(n, k, generator=g, device="cuda") * 0.05, text)
    x = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    return x, qw, x.double() @ qw.dequantize().double().T


@pytest.mark.parametrize("text", FRAG_FORMATS)
@pytest.mark.parametrize("m", [1, 13, 64])
def test_default_tile_every_format_bitwise_stable(text, m):
    x, qw, ref = _case(text, m, 3000, 4096, seed=m)
    tw = to_triton_layout(qw)
    tile = frag_tile(m, tw.n, tw.k, torch.cuda.get_device_properties(0).multi_processor_count, False)
    ws = torch.empty(tile["split_k"] * m * tw.n, device="cuda")
    cnt = torch.zeros(4096, dtype=torch.int32, device="cuda")
    y1 = gemm_frag(x, tw, workspace=ws, counters=cnt, **tile)
    y2 = gemm_frag(x, tw, workspace=ws, counters=cnt, **tile)
    assert rel_err(y1, ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y1, y2)


@pytest.mark.parametrize("bn, warps, stages", TILES)
@pytest.mark.parametrize("m, split", [(1, 1), (16, 4), (40, 2)])
def test_every_swept_tile(bn, warps, stages, m, split):
    x, qw, ref = _case("w4a16:int4:ch:bf16", m, 2000, 2880, seed=2)  # K tail: 2880 = 22.5 blocks
    tw = to_triton_layout(qw)
    bm = 16 if m <= 16 else 64
    ws = torch.empty(split * m * tw.n, device="cuda")
    cnt = torch.zeros(4096, dtype=torch.int32, device="cuda")
    out = torch.full((m, tw.n), float("nan"), device="cuda", dtype=torch.bfloat16)
    gemm_frag(x, tw, block_m=bm, block_n=bn, split_k=split, num_warps=warps, num_stages=stages, workspace=ws,
              counters=cnt, out=out)  # fmt: skip
    assert rel_err(out, ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("text", ["w4a16", "w4a16:int4:ch:bf16", "w4a16:uint4:g256:bf16", "nvfp4", "mxfp4", "w8a16"])
@pytest.mark.parametrize("m, n, k", [(65, 8192, 2880), (128, 8200, 4096), (100, 3000, 4096), (128, 4096, 14336),
                                     (200, 4000, 14336), (256, 8192, 28672)])  # fmt: skip
def test_128_token_tiles_through_the_route(text, m, n, k):
    """64 < M <= 256 (`frag_mid`): the route's 128 x 256 (16 warps), 64 x 128 (128 registers) and 256 x 128 tiles
    (int4 long K only, e2m1 every shape), N off the tile, a K tail (2880 for channel scales, else the last group's
    multiple), split K; bit-stable relaunch and CUDA-graph replay into a poisoned output."""
    from anybit import prepare
    from anybit.backends import get_backend
    from anybit.backends.triton import frag_mid

    if k == 2880 and ":ch:" not in text:
        k = 2816  # a multiple of the 256-K groups
    x, qw, ref = _case(text, m, n, k, seed=m)
    if m > 128 and text == "w8a16":
        pytest.skip("8-bit codes take the frag kernel up to 128 rows only")
    assert frag_mid(qw.scheme, m, n, k, x.dtype)
    p, be = prepare(qw, backend="triton"), get_backend("triton")
    y1 = be.gemm(x, p)
    assert rel_err(y1, ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y1, be.gemm(x, p))
    graph, out = torch.cuda.CUDAGraph(), None
    with torch.cuda.graph(graph):
        out = be.gemm(x, p)
    out.fill_(float("nan"))
    graph.replay()
    assert torch.equal(out, y1)


OTHER_FRAG = ["nvfp4", "mxfp4", "w4a16:e2m1:g64:bf16", "w4a16:e2m1:g128:bf16", "w2a16", "w2a16:int2:g128:bf16",
              "w8a16", "w8a16:uint8:g128:fp16:zp-int"]  # fmt: skip


@pytest.mark.parametrize("text", OTHER_FRAG)
@pytest.mark.parametrize("m", [1, 13, 64, 300])
def test_frag_formats_in_bf16_bitwise_stable(text, m):
    """On the GPU in bf16, bit-stable: the e2m1 decode leans on bf16 subnormals (the two e=0 codes)
    surviving the packed multiply; 2- and 8-bit codes: 2-bit as four 64-K quarters per block, g64 scales
    and zero points per quarter; M=300 runs the dequantizer + cuBLAS."""
    from anybit import prepare
    from anybit.backends import get_backend

    x, qw, ref = _case(text, m, 3000, 4096, seed=m)
    p = prepare(qw, backend="triton")
    assert p.data.frag
    be = get_backend("triton")
    y1, y2 = be.gemm(x, p), be.gemm(x, p)
    assert rel_err(y1, ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y1, y2)


def _a8_route_matches_its_quantized_x(x, p):
    """The route's y for an FP8-activation weight against the exact product of the quantizer's own x, bit-stable."""
    from anybit.backends import get_backend
    from anybit.kernels.quant_act import quantize_act
    from anybit.quant.activations import dequantize_activation

    qw = p.qweight
    xq, xs = quantize_act(x, qw.scheme.act)
    ref = dequantize_activation(xq, xs, qw.scheme.act).double() @ qw.dequantize().double().T
    be = get_backend("triton")
    y1, y2 = be.gemm(x, p), be.gemm(x, p)
    assert rel_err(y1, ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y1, y2)


@pytest.mark.parametrize("text", ["w4a8", "w4a8:uint4:g128:fp32:zp-int:e4m3-token"])
@pytest.mark.parametrize("m", [1, 16, 64, 300])
def test_w4a8_fragment_layout_in_bf16(text, m):
    """W4A8 on the GPU: the FP8 fragment kernel at M <= 64, cuBLAS's block-scaled GEMM above (g128), against
    the exact product of the quantizer's own x, bit-stable."""
    from anybit import prepare

    x, qw, _ = _case(text, m, 3000, 4096, seed=m)
    p = prepare(qw, backend="triton")
    assert p.data.frag
    _a8_route_matches_its_quantized_x(x, p)


@pytest.mark.parametrize("text", ["w4a8", "w4a8-mxfp4"])
@pytest.mark.parametrize("m", [40, 64])
def test_fp8_mma_narrow_tiles_through_the_route(text, m, monkeypatch):
    """33-64 rows of 18432x7168 on the FP8 MMA take 64 weight rows a tile (`frag.A8_NARROW_FILL`): against the exact
    product of the quantizer's own x, bit-stable (int4 runs the stream-K register-operand kernel there by default:
    off here, so that the frag kernel's tile is what runs)."""
    from anybit import prepare
    from anybit.backends.triton import pick_config

    monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", "0")

    x, qw, _ = _case(text, m, 18432, 7168, seed=m)
    p = prepare(qw, backend="triton")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tw = p.data
    config = pick_config(m, tw.n, tw.k, tw.kernel_scheme, sms, False, tw.nk, tw.mma_a8, tw.frag)
    assert sms != 132 or config.block_n == 64
    _a8_route_matches_its_quantized_x(x, p)


@pytest.mark.parametrize("text", ["w8a16", "w8a16:uint8:g128:bf16:zp-int"])
@pytest.mark.parametrize("m", [1, 13])
def test_byte_codes_on_one_to_two_tiles_a_sm_split_in_two_through_the_route(text, m):
    """8-bit codes at <= 16 rows of a weight with one to two 128-row tiles per SM: the route splits K in two
    (`BYTE_SPLIT`); against float64, bit for bit on relaunch."""
    from anybit import prepare
    from anybit.backends import get_backend

    x, qw, ref = _case(text, m, 20000, 4096, seed=m)
    p = prepare(qw, backend="triton")
    be = get_backend("triton")
    y1 = be.gemm(x, p)
    assert p.data.configs[m].split_k == 2
    assert rel_err(y1, ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y1, be.gemm(x, p))


@pytest.mark.parametrize("text", ["w3a16", "w3a16:uint3:g128:bf16:zp-int", "w3a16:int3:ch:bf16"])
@pytest.mark.parametrize("m", [1, 13, 64, 100])
def test_three_bit_codes_through_the_route(text, m):
    """3-bit integers in the 3-bit planes (`pack_frag3`): the frag kernel up to 64 rows, its dequantizer above; N off
    the tile, K off the planes' 512 for channel scales; against float64, bit for bit on relaunch and graph replay."""
    from anybit import prepare
    from anybit.backends import get_backend

    k = 2880 if ":ch:" in text else 4096
    x, qw, ref = _case(text, m, 3000, k, seed=m)
    p = prepare(qw, backend="triton")
    assert p.data.frag and p.data.fmt["W_BITS"] == 3
    be = get_backend("triton")
    y1 = be.gemm(x, p)
    assert rel_err(y1, ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y1, be.gemm(x, p))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y2 = be.gemm(x, p)
    y2.fill_(float("nan"))
    graph.replay()
    assert torch.equal(y1, y2)


PTX_FORMATS = ["w4a16", "w4a16:uint4:g128:bf16", "w4a16:int4:ch:bf16", "w4a16-zp", "w4a16:uint4:g128:bf16:zp-int",
               "w2a16", "w8a16", "w8a16:uint8:g128:bf16:zp-int"]  # fmt: skip


@pytest.mark.parametrize("text", PTX_FORMATS)
@pytest.mark.parametrize("m", [1, 16, 64])
def test_inline_ptx_decode_matches_the_triton_form(monkeypatch, text, m):
    """Zero points subtracted by packed PTX (`minus_rows`) and bytes placed by PRMT (`unpack_bytes`), level 1,
    and nibble words decoded in one PTX block each (`unpack_pairs_minus`, level 2, the sm_90 default) give
    the same bits as the Triton form (ANYBIT_FRAG_PTX=0; same arithmetic), bit-stable."""
    from anybit import prepare
    from anybit.backends import get_backend

    x, qw, ref = _case(text, m, 3000, 4096, seed=m)
    be = get_backend("triton")
    p = prepare(qw, backend="triton")
    monkeypatch.setenv("ANYBIT_FRAG_PTX", "0")
    plain = be.gemm(x, p)
    monkeypatch.delenv("ANYBIT_FRAG_PTX")
    y1, y2 = be.gemm(x, p), be.gemm(x, p)
    assert rel_err(y1, ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y1, y2) and torch.equal(y1, plain)
    monkeypatch.setenv("ANYBIT_FRAG_PTX", "1")
    assert torch.equal(be.gemm(x, p), plain)


@pytest.mark.parametrize("text", ["nvfp4", "mxfp4", "w4a16:e2m1:g64:bf16"])
@pytest.mark.parametrize("m", [1, 16, 64])
def test_e2m1_rebias_folded_into_the_scales_gives_the_same_bits_in_bf16(text, m):
    """bf16: the scales carry 2**118 of the codes' 2**126 rebias (`frag_fold`), the decoded pairs (bf16
    subnormals for the two e = 0 codes) are multiplied by them directly: the same bits as the plain decode."""
    x, qw, ref = _case(text, m, 3000, 4096, seed=m)
    assert_fold_gives_the_same_bits(x, qw, ref)


@pytest.mark.parametrize("text", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_scales_built_from_their_bits_give_the_same_bits_in_bf16(monkeypatch, text, m):
    """`frag_fold` 2 in bf16 (the interpreter's bf16 cannot check it): bit for bit the decoded scales'."""
    qw = e2m1_weight(text, 3000, 4096, device="cuda", seed=m)
    x = torch.randn(m, 4096, generator=torch.Generator(device="cuda").manual_seed(m), device="cuda").bfloat16()
    assert_scale_bits_give_the_same_bits(monkeypatch, x, qw, x.double() @ qw.dequantize().double().T)


@pytest.mark.parametrize("text", ["w4a16", "mxfp4", "nvfp4", "w4a8-mxfp4"])
@pytest.mark.parametrize("m", [1, 16, 32])
def test_two_blocks_an_iteration_give_the_same_bits_in_bf16(monkeypatch, text, m):
    """`FRAG_PAIRS` in bf16 at decode tiles (K = 7 blocks: an odd split): bit for bit the one-block loop."""
    from tests.kernels.test_gemm_a8 import a8_reference

    g = torch.Generator(device="cuda").manual_seed(m)
    qw = quantize(torch.randn(3000, 896, generator=g, device="cuda") * 0.05, text)
    x = torch.randn(m, 896, generator=g, device="cuda").bfloat16()
    ref = a8_reference(x, qw) if qw.scheme.act.quantized else x.double() @ qw.dequantize().double().T
    assert_pairs_give_the_same_bits(monkeypatch, x, qw, ref)


def test_quantizer_block_sums_on_the_gpu():
    """`quantize_act(block_sums=True)` on the GPU: the sum of each 128-K block of the e4m3 values it wrote
    (K tail included), and the same codes and scales as the plain call."""
    from anybit.formats.scheme import Scheme
    from anybit.kernels.quant_act import quantize_act

    act = Scheme.parse("w4a8").act
    x = torch.randn(37, 5000, generator=torch.Generator(device="cuda").manual_seed(5), device="cuda").bfloat16()
    xq, xs = quantize_act(x, act)
    xq2, xs2, sums = quantize_act(x, act, block_sums=True)
    assert torch.equal(xq2.view(torch.uint8), xq.view(torch.uint8)) and torch.equal(xs2, xs)
    ref = torch.nn.functional.pad(xq.float(), (0, -5000 % 128)).reshape(37, -1, 128).double().sum(dim=-1).T
    assert torch.allclose(sums.double(), ref, rtol=1e-6, atol=1e-3)


@pytest.mark.parametrize("text", ["w4a8", "w4a16"])
@pytest.mark.parametrize("m", [1, 16, 64])
def test_programmatic_dependent_launch_gives_the_same_bits(monkeypatch, text, m):
    """PDL (the default on sm_90): the frag GEMM launches as a dependent of the kernel before it (W4A8: the
    quantizer) and waits for it; the same bits as a plain launch (ANYBIT_PDL=0), eager and from a CUDA graph."""
    from anybit import prepare
    from anybit.backends import get_backend

    x, qw, _ = _case(text, m, 3000, 4096, seed=m)
    be, p = get_backend("triton"), prepare(qw, backend="triton")
    monkeypatch.setenv("ANYBIT_PDL", "0")
    plain = be.gemm(x, p)
    monkeypatch.setenv("ANYBIT_PDL", "1")
    assert torch.equal(be.gemm(x, p), plain)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = be.gemm(x, p)
    y.zero_()
    graph.replay()
    assert torch.equal(y, plain)


@pytest.mark.parametrize("text", ["w8a16", "w8a16:uint8:g128:bf16:zp-int"])
@pytest.mark.parametrize("bm, bn, warps, split", [(128, 128, 8, 1), (64, 128, 8, 2), (128, 256, 16, 2)])
def test_8bit_codes_with_more_warps(text, bm, bn, warps, split):
    """8-bit codes on 8/16-warp tiles (with channel scales in the epilogue these gave runs of wrong rows, different
    on every launch, `tools/probe_w8_warps.py`; now scaled per K block, `CHANNEL_AS_BLOCKS`): right and bit-stable."""
    x, qw, ref = _case(text, 128, 6144, 4096, seed=3)
    tw = to_triton_layout(qw)
    ws = torch.empty(split * 128 * tw.n, device="cuda")
    cnt = torch.zeros(4096, dtype=torch.int32, device="cuda")
    tile = dict(block_m=bm, block_n=bn, split_k=split, num_warps=warps, num_stages=3, workspace=ws, counters=cnt)
    outs = []
    for _ in range(3):
        out = torch.full((128, tw.n), float("nan"), device="cuda", dtype=torch.bfloat16)
        outs.append(gemm_frag(x, tw, out=out, **tile))
    errs = [rel_err(o, ref) for o in outs]
    assert max(errs) < GEMM_REL_ERR[torch.bfloat16], errs
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("text", ["w4a16", "w8a16", "nvfp4"])
@pytest.mark.parametrize("m", [1, 16, 128])
def test_settled_wgmma_give_the_same_result(monkeypatch, text, m):
    """The frag kernels waiting for each block's wgmma (`settled`, the default) against ANYBIT_FRAG_SETTLE=0:
    both right, the settled form bit-stable (the same MMA order: the bits may match too, but need not)."""
    from anybit import prepare
    from anybit.backends import get_backend

    x, qw, ref = _case(text, m, 6144, 4096, seed=m)
    be = get_backend("triton")
    p = prepare(qw, backend="triton")
    y1, y2 = be.gemm(x, p), be.gemm(x, p)
    assert rel_err(y1, ref) < GEMM_REL_ERR[torch.bfloat16] and torch.equal(y1, y2)
    monkeypatch.setenv("ANYBIT_FRAG_SETTLE", "0")
    assert rel_err(be.gemm(x, p), ref) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("text", FRAG_FORMATS + ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m, split", [(33, 1), (40, 4), (48, 2), (100, 1)])
@pytest.mark.parametrize("tile", [dict(block_m=48), dict(block_m=96, num_warps=8, num_stages=3)], ids=["48", "96w8"])
def test_two_part_token_tile(text, m, split, tile):
    """block_m 48 (32 + 16 tokens on one decode, `frag_range_two`; 96 = 64 + 32 on 8 warps, sm_90a without spills):
    every 4-bit format, the second part partly or wholly past M, N off the tile, a K tail for channel scales, split K;
    poisoned output, bit-stable relaunch."""
    x, qw, ref = _case(text, m, 3000, 2880 if ":ch:" in text else 4096, seed=m)
    tw = to_triton_layout(qw)
    ws = torch.empty(split * m * tw.n, device="cuda")
    cnt = torch.zeros(4096, dtype=torch.int32, device="cuda")
    outs = []
    for _ in range(2):
        out = torch.full((m, tw.n), float("nan"), device="cuda", dtype=torch.bfloat16)
        outs.append(gemm_frag(x, tw, block_n=128, split_k=split, workspace=ws, counters=cnt, out=out, **tile))
    assert rel_err(outs[0], ref) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(outs[0], outs[1]) and not (cnt != 0).any()


@pytest.mark.parametrize("text", ["w4a16", "mxfp4"])
def test_two_part_token_tile_is_the_route_at_40_rows(text):
    """33-48 rows of 4-bit weights whose 64-row tiles do not fill a wave go through the 48-token tile: the route's
    output is a direct launch's, bit for bit."""
    from anybit import prepare
    from anybit.backends import get_backend

    x, qw, ref = _case(text, 40, 3000, 4096, seed=40)
    p = prepare(qw, backend="triton")
    y = get_backend("triton").gemm(x, p)
    tile = frag_tile(40, 3000, 4096, torch.cuda.get_device_properties(0).multi_processor_count, False, two=True)
    assert tile["block_m"] == 48
    ws = torch.empty(tile["split_k"] * 40 * 3000, device="cuda")
    cnt = torch.zeros(4096, dtype=torch.int32, device="cuda")
    assert torch.equal(y, gemm_frag(x, p.data, workspace=ws, counters=cnt, **tile))
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.bfloat16]
