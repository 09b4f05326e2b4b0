"""The fragment-layout kernels (4-bit integer weights, bf16/fp16 activations) against float64
references from dequantize(): layout round trip, the swap-AB GEMM, its split-K, the dequantizer."""

import dataclasses

import pytest
import torch

from anybit import prepare, quantize
from anybit.backends import get_backend
from anybit.backends.triton_layout import codes_a16, frag_format, stored_codes, to_triton_layout
from anybit.formats.scheme import Scheme
from anybit.kernels.frag import frag_tile, gemm_frag
from anybit.kernels.frag_dequant import dequantize_frag
from anybit.kernels.frag_layout import (
    FRAG_PANEL,
    from_panels,
    pack_frag,
    pack_frag3,
    to_panels,
    unpack_frag,
    unpack_frag3,
)
from anybit.kernels.gemm import GemmConfig, gemm_dense
from tests.tolerances import GEMM_REL_ERR, rel_err

FRAG_FORMATS = [
    "w4a16",  # int4 g128 bf16
    "w4a16-zp",  # uint4 g128 fp16 zero points
    "w4a16:int4:ch:fp32",
    "w4a16:uint4:g256:fp16",
    "w4a16:int4:b128x128:fp32",
    "w4a16:int4:tensor:fp32",
]


def _problem(text, m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    qw = quantize(torch.randn(n, k, generator=g) * 0.05, text)
    x = torch.randn(m, k, generator=g).half()
    return x, qw, x.double() @ qw.dequantize().double().T


def test_frag_kernels_settle_their_wgmma_per_block(monkeypatch):
    """`frag_settle()`: on by default for compiled sm_90+ code; off under the interpreter, before sm_90 and with
    ANYBIT_FRAG_SETTLE=0; another value is an error."""
    from anybit.kernels import frag

    monkeypatch.setattr(frag, "target_sm", lambda: 90)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not frag.frag_settle()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert frag.frag_settle()
    monkeypatch.setattr(frag, "target_sm", lambda: 80)
    assert not frag.frag_settle()
    monkeypatch.setattr(frag, "target_sm", lambda: 90)
    monkeypatch.setenv("ANYBIT_FRAG_SETTLE", "0")
    assert not frag.frag_settle()
    monkeypatch.setenv("ANYBIT_FRAG_SETTLE", "on")
    with pytest.raises(ValueError, match="ANYBIT_FRAG_SETTLE='on'"):
        frag.frag_settle()


def test_ptx_level_of_the_frag_decode(monkeypatch):
    """`frag_ptx()`: 0 under the interpreter (no inline PTX), with ANYBIT_FRAG_PTX=0 and before sm_90; else
    ANYBIT_FRAG_PTX's level, 2 by default (also `unpack_pairs_minus`); a level it does not know is an error."""
    from anybit.kernels import frag

    monkeypatch.setattr(frag, "target_sm", lambda: 90)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert frag.frag_ptx() == 0
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert frag.frag_ptx() == 2
    monkeypatch.setenv("ANYBIT_FRAG_PTX", "1")
    assert frag.frag_ptx() == 1
    monkeypatch.setenv("ANYBIT_FRAG_PTX", "0")
    assert frag.frag_ptx() == 0
    monkeypatch.setenv("ANYBIT_FRAG_PTX", "yes")
    with pytest.raises(ValueError, match="ANYBIT_FRAG_PTX='yes': expected one of 0, 1, 2"):
        frag.frag_ptx()
    monkeypatch.delenv("ANYBIT_FRAG_PTX")
    monkeypatch.setattr(frag, "target_sm", lambda: 80)
    assert frag.frag_ptx() == 0


def test_which_formats_take_the_fragment_layout():
    assert all(frag_format(Scheme.parse(t)) for t in FRAG_FORMATS)
    for t in ["w4a16:int4:g64:fp16", "w4a16:uint4:g32:fp16:zp-float", "w4a8:int4:g64:fp32:e4m3-token", "w3a16"]:
        assert not frag_format(Scheme.parse(t)), t


@pytest.mark.parametrize("e2m1", [False, True])
@pytest.mark.parametrize("k", [128, 200, 640])
def test_pack_round_trip(k, e2m1):
    codes = torch.randint(0, 16, (3, 5, k), dtype=torch.uint8)
    words = pack_frag(codes, e2m1=e2m1)
    assert words.shape == (3, FRAG_PANEL, -(-k // 128) * 16) and words.dtype == torch.int32  # N: whole panels
    assert torch.equal(unpack_frag(words, k, n=5, e2m1=e2m1), codes)


def test_e2m1_words_put_each_pair_where_one_rotation_and_one_and_decode_it():
    """`e2m1_bit_order`: nibble j of both halves (pair j) comes out at bf16 bits 6-8 and 15 of each half by a rotation
    right of E2M1_ROT[j] and the mask 0x81C081C0 (pair 3: mantissa by E2M1_ROT3[0], the rest by E2M1_ROT3[1])."""
    from anybit.kernels.frag_layout import E2M1_ROT, E2M1_ROT3, _permute_bits, e2m1_bit_order

    nib = torch.randint(0, 1 << 32, (500,), dtype=torch.int64)
    w = _permute_bits(nib, e2m1_bit_order())

    def rotr(v, t):
        return ((v >> t) | (v << (32 - t))) & 0xFFFFFFFF

    def place(j):  # the pair as the decoder wants it, from the nibble-order word
        lo, hi = (nib >> 4 * j) & 0xF, (nib >> (16 + 4 * j)) & 0xF
        return sum(((c & 7) << 6 | (c >> 3) << 15) << 16 * e for e, c in enumerate((lo, hi)))

    for j, t in enumerate(E2M1_ROT):
        assert torch.equal(rotr(w, t) & 0x81C081C0, place(j))
    assert torch.equal((rotr(w, E2M1_ROT3[1]) & 0x81808180) | (rotr(w, E2M1_ROT3[0]) & 0x00400040), place(3))


def test_panels_hold_each_block_of_their_rows_contiguously():
    rows = torch.arange(130 * 48, dtype=torch.int32).reshape(130, 48)  # 130 rows of 3 blocks of 16 words
    p = to_panels(rows, 64)
    assert p.shape == (192, 48) and torch.equal(from_panels(p, 130, 64), rows)
    flat = p.reshape(-1)
    for n, kt in [(0, 0), (1, 0), (63, 2), (64, 1), (129, 2)]:  # panel n // 64: block kt of its rows in a run
        start = ((n // 64 * 3 + kt) * 64 + n % 64) * 16
        assert torch.equal(flat[start : start + 16], rows[n, kt * 16 : kt * 16 + 16])
    assert not from_panels(p, 192, 64)[130:].any()  # padding rows


@pytest.mark.parametrize("text", FRAG_FORMATS)
@pytest.mark.parametrize("m", [1, 13, 40])
def test_swap_ab_gemm_matches_dequantize(interpret, text, m):
    n, k = 80, 512 if "g256" in text else 384  # N off the 64-row tile; K several groups
    x, qw, ref = _problem(text, m, n, k, seed=m)
    prepared = prepare(qw, backend="triton")
    assert prepared.data.frag
    y = get_backend("triton").gemm(x, prepared)
    assert y.dtype == torch.float16 and y.shape == (m, n)
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("split", [1, 2, 3])
def test_k_tail_split_k_poisoned_output_and_bias(interpret, split):
    """Split K (`splitk.store_or_reduce`: every split's partial into the workspace, the last to arrive sums them):
    the exact product with bias into a NaN-poisoned output, the same bits again (the counters re-armed)."""
    x, qw, ref = _problem("w4a16:int4:ch:fp16", 13, 70, 200 if split < 3 else 400, seed=3)  # a padded 128-K block
    bias = torch.randn(70).half()
    tw = to_triton_layout(qw)
    ws, cnt = torch.empty(split * 13 * 70), torch.zeros(8, dtype=torch.int32)
    outs = []
    for _ in range(2):  # the second call checks the counters were re-armed
        out = torch.full((13, 70), float("nan"), dtype=torch.float16)
        gemm_frag(x, tw, bias, block_m=16, block_n=64, split_k=split, num_stages=1, workspace=ws, counters=cnt,
                  out=out)  # fmt: skip
        assert not torch.isnan(out).any()
        assert rel_err(out, ref + bias.double()) < GEMM_REL_ERR[torch.float16]
        outs.append(out)
    assert (cnt == 0).all() and torch.equal(outs[0], outs[1])


def test_large_m_dequantizes_exactly(interpret):
    x, qw, ref = _problem("w4a16-zp", 257, 40, 256, seed=5)  # M > FRAG_MAX_M: dequantize + matmul
    tw = to_triton_layout(qw)
    assert torch.equal(dequantize_frag(tw, dtype=torch.float16), qw.dequantize(torch.float16))
    y = get_backend("triton").gemm(x, prepare(qw, backend="triton"))
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("text, m, bm", [("w4a16:int4:g128:fp16", 100, 128), ("w4a16:int4:ch:fp16", 100, 128),
                                         ("nvfp4", 100, 128), ("mxfp4", 100, 128), ("nvfp4", 200, 256),
                                         ("mxfp4", 200, 256)])  # fmt: skip
def test_128_token_tiles_scale_the_decoded_weights(interpret, text, m, bm):
    """The tiles the route takes for 64 < M <= 256 (`frag_tile(mid=True)`): 128 (256: e2m1 above 128 rows) tokens,
    group scales on the decoded weights (SCALE_W) for int groups, none for channel scales, e2m1 groups in
    registers; N and K off the tile, split K."""
    x, qw, ref = _problem(text, m, 70, 384, seed=11)
    tw = to_triton_layout(qw)
    ws, cnt = torch.empty(2 * m * 70), torch.zeros(4, dtype=torch.int32)
    out = torch.full((m, 70), float("nan"), dtype=torch.float16)
    gemm_frag(x, tw, None, block_m=bm, block_n=64, split_k=2, num_stages=1, workspace=ws, counters=cnt, out=out)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < GEMM_REL_ERR[torch.float16]


# (M, N, K) -> the H200 sweep's best tile family at M = 128 (benchmarks/results/h200_sweep_frag_w4a16_m128_*):
# (block_m, block_n, split_k)
MID_MEASURED = {
    (128, 8192, 8192): (128, 256, 4),
    (128, 28672, 8192): (128, 256, 1),
    (128, 8192, 28672): (128, 256, 4),
    (128, 28672, 4096): (128, 256, 1),
    (128, 4096, 4096): (64, 128, 4),
    (128, 4096, 14336): (64, 128, 4),
    (128, 6144, 4096): (64, 128, 2),
}


MID_MEASURED |= {(256, 8192, 28672): (256, 128, 2), (256, 4096, 14336): (256, 128, 4)}  # ..._m256_*


@pytest.mark.parametrize("shape", list(MID_MEASURED))
def test_mid_tile_rule_follows_the_h200_sweep(shape):
    from anybit.kernels.frag import frag_tile

    t = frag_tile(*shape, 132, interpret=False, mid=True)
    assert (t["block_m"], t["block_n"], t["split_k"]) == MID_MEASURED[shape]
    assert t.get("maxnreg") == (128 if t["block_m"] == 64 else None)


def test_which_calls_take_the_128_token_tiles(monkeypatch):
    from anybit.backends.triton import frag_mid
    from anybit.kernels.frag import frag_tile

    s, sq, bf = Scheme.parse("w4a16"), (8192, 8192), torch.bfloat16
    assert frag_mid(s, 65, *sq, bf) and frag_mid(s, 128, *sq, bf)
    assert not frag_mid(s, 64, *sq, bf) and not frag_mid(s, 129, *sq, bf)
    assert frag_mid(s, 256, 4096, 14336, bf) and not frag_mid(s, 257, 4096, 14336, bf)  # long K: up to 256 rows
    assert not frag_mid(s, 128, *sq, torch.float16)  # bf16 scales: the decoder multiplies in x's dtype
    assert not frag_mid(Scheme.parse("w4a16-zp"), 128, *sq, torch.float16)
    assert frag_mid(Scheme.parse("nvfp4"), 100, *sq, bf) and frag_mid(Scheme.parse("mxfp4"), 100, *sq, torch.float16)
    assert frag_mid(Scheme.parse("nvfp4"), 256, *sq, bf) and frag_mid(Scheme.parse("mxfp4"), 192, 28672, 8192, bf)
    assert not frag_mid(Scheme.parse("mxfp4"), 257, *sq, bf)  # e2m1: 256-token tiles on every shape, up to 256 rows
    assert frag_mid(Scheme.parse("w8a16"), 100, *sq, bf) and not frag_mid(Scheme.parse("w8a16"), 129, 4096, 14336, bf)
    assert not frag_mid(Scheme.parse("w8a16:int8:g128:bf16"), 100, *sq, bf)  # per-block fp32 scaling: not measured
    assert frag_tile(128, 8192, 8192, 132, False, bits=8, mid=True) == dict(block_m=128, block_n=128, num_warps=4,
                                                                           num_stages=3, split_k=4)  # fmt: skip
    assert frag_tile(128, 4096, 4096, 132, False, bits=8, mid=True)["split_k"] == 4  # >= 1024 K a split
    monkeypatch.setenv("ANYBIT_FRAG_MID_MAX_M", "128")
    assert not frag_mid(s, 256, 4096, 14336, bf)
    monkeypatch.setenv("ANYBIT_FRAG_MID_MAX_M", "64")
    assert not frag_mid(s, 100, *sq, bf)


@pytest.mark.parametrize("text", ["w8a16:int8:ch:fp16", "w8a16:uint8:g64:fp16:zp-int"])
def test_8_bit_codes_on_8_warps(interpret, text):
    """8-bit codes on an 8-warp tile: channel scales go per K block there (`CHANNEL_AS_BLOCKS`), groups as they are."""
    x, qw, ref = _problem(text, 16, 256, 512, seed=1)
    out = torch.full((16, 256), float("nan"), dtype=torch.float16)
    gemm_frag(x, to_triton_layout(qw), block_m=16, block_n=128, num_warps=8, num_stages=1, out=out)
    assert rel_err(out, ref) < GEMM_REL_ERR[torch.float16]


def test_bit_plane_kernels_refuse_the_fragment_layout(interpret):
    x, qw, _ = _problem("w4a16", 1, 64, 128, seed=1)
    with pytest.raises(ValueError, match="fragment layout"):
        gemm_dense(x, to_triton_layout(qw), None, config=GemmConfig(16, 32, 32))
    planes = to_triton_layout(qw, allow_frag=False)
    assert not planes.frag and torch.equal(unpack_frag(to_triton_layout(qw).planes[0], 128, n=64), stored_codes(qw))


FLOAT_FORMATS = ["nvfp4", "mxfp4", "w4a16:e2m1:g64:bf16", "w4a16:e2m1:g128:fp16", "w4a16:e2m1:ch:fp32"]


def test_fragment_layout_formats():
    assert all(frag_format(Scheme.parse(t)) for t in FLOAT_FORMATS)
    assert not frag_format(Scheme.parse("w6a16:e2m3:g32:fp16"))  # not e2m1
    # FP8 activations on e2m1 groups < 128: their codes on the A16 kernels, the A16 order (`codes_a16`)
    assert frag_format(Scheme.parse("w4a8-mxfp4")) and codes_a16(Scheme.parse("w4a8-mxfp4"))
    assert codes_a16(Scheme.parse("w4a8:e2m1:g16:e4m3:gs:e5m2-token"))
    assert not frag_format(Scheme.parse("w4a8:e2m1:g128:bf16:e4m3-token"))  # whole 128-K groups: the FP8 MMA
    assert not codes_a16(Scheme.parse("w4a8:e2m1:g32:ue8m0:e4m3-g128"))  # x scales per group
    assert frag_format(Scheme.parse("w4a8")) and not codes_a16(Scheme.parse("w4a8"))  # int4: the FP8 MMA's order
    assert not frag_format(Scheme.parse("w4a8:int4:g128:fp32:e4m3-g128"))  # x scales per group


@pytest.mark.parametrize("text", FLOAT_FORMATS)
@pytest.mark.parametrize("m", [1, 13, 40])
def test_e2m1_swap_ab_gemm_matches_dequantize(interpret, text, m):
    x, qw, ref = _problem(text, m, 80, 384, seed=m)
    prepared = prepare(qw, backend="triton")
    assert prepared.data.frag
    y = get_backend("triton").gemm(x, prepared)
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("text", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 13])
def test_e2m1_rebias_folded_into_the_scales_gives_the_same_bits(interpret, text, m):
    """NVFP4/MXFP4 codes decoded without their packed rebias multiply, the scales carrying it
    (`frag_fold`): the same products, scaled by a power of two, so the same bits as the plain decode."""
    x, qw, ref = _problem(text, m, 80, 384, seed=m)
    assert torch.bfloat16 in to_triton_layout(qw).fold
    assert_fold_gives_the_same_bits(x, qw, ref)


def assert_fold_gives_the_same_bits(x, qw, ref):
    """The triton backend on x (its dtype among the weight's `fold` dtypes) equals, bit for bit, the same
    weight with the fold turned off, and both are within x's dtype tolerance of ref."""
    prepared = prepare(qw, backend="triton")
    assert x.dtype in prepared.data.fold
    be = get_backend("triton")
    folded = be.gemm(x, prepared)
    prepared.data.fold = frozenset()
    assert torch.equal(folded, be.gemm(x, prepared))
    assert rel_err(folded, ref) < GEMM_REL_ERR[x.dtype]


def test_which_e2m1_weights_fold_their_rebias():
    """Folding needs every |scale| < 2**9 (finite scale * 2**118 in bf16), and for fp16 products that keep
    their last bit: e4m3 scales, ue8m0 from 2**-15; bf16 scales only for bf16 activations."""
    w = torch.randn(64, 256) * 0.05
    assert to_triton_layout(quantize(w, "nvfp4")).fold == {torch.bfloat16, torch.float16}
    assert to_triton_layout(quantize(w, "w4a16:e2m1:g64:bf16")).fold == {torch.bfloat16}
    assert to_triton_layout(quantize(w * 2.0**-20, "mxfp4")).fold == {torch.bfloat16}  # scales below 2**-15
    assert to_triton_layout(quantize(w * 2.0**16, "mxfp4")).fold == frozenset()  # scales of 2**9 and more
    assert to_triton_layout(quantize(w, "w4a16:e2m1:ch:bf16")).fold == frozenset()  # scaled after the dot


def e2m1_weight(text, n, k, device="cpu", seed=0):
    """An NVFP4 or MXFP4 weight; NVFP4's first group zero in a few rows (scale 0 over zero codes)."""
    g = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(n, k, generator=g, device=device) * 0.05
    if text == "nvfp4":
        w[:7, :16] = 0
    qw = quantize(w, text)
    assert text != "nvfp4" or bool((qw.scales.view(torch.uint8)[:7, 0] == 0).all())
    return qw


def assert_scale_bits_give_the_same_bits(monkeypatch, x, qw, ref):
    """The folded decode with its scales built from their bits (`frag_fold` 2) equals, bit for bit, the decoded
    scales' (the same values), within x's dtype tolerance of ref."""
    from anybit.kernels import frag

    prepared = prepare(qw, backend="triton")
    assert prepared.data.fold_bits and x.dtype in prepared.data.fold
    be = get_backend("triton")
    monkeypatch.setattr(frag, "SCALE_BITS", False)
    assert frag.frag_fold(prepared.data, x.dtype) == 1
    converted = be.gemm(x, prepared)
    monkeypatch.setattr(frag, "SCALE_BITS", True)
    assert frag.frag_fold(prepared.data, x.dtype) == 2
    assert torch.equal(be.gemm(x, prepared), converted)
    assert rel_err(converted, ref) < GEMM_REL_ERR[x.dtype]


@pytest.mark.parametrize("text", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("m", [1, 13])
def test_scales_built_from_their_bits_give_the_same_bits(interpret, monkeypatch, text, m):
    qw = e2m1_weight(text, 80, 384, seed=m)
    x = torch.randn(m, 384, generator=torch.Generator().manual_seed(m)).half()
    assert_scale_bits_give_the_same_bits(monkeypatch, x, qw, x.double() @ qw.dequantize().double().T)


def test_which_e4m3_scales_may_be_built_from_their_bits():
    """`scale_bits_exact`: ue8m0 group scales always; e4m3, non-negative and normal, or zero over zero codes; not
    bf16 scales."""
    from anybit.backends.triton_layout import scale_bits_exact

    qw = e2m1_weight("nvfp4", 64, 256)
    assert scale_bits_exact(qw) and scale_bits_exact(quantize(torch.randn(64, 256), "mxfp4"))
    assert not scale_bits_exact(quantize(torch.randn(64, 256), "w4a16:e2m1:g64:bf16"))
    s = qw.scales.view(torch.uint8)
    for code, why in [(3, "subnormal"), (0x80 | 60, "negative")]:
        bad = s.clone()
        bad[5, 3] = code
        assert not scale_bits_exact(dataclasses.replace(qw, scales=bad)), why
    codes_nonzero = s.clone()
    codes_nonzero[20, 2] = 0  # a zero scale over nonzero codes
    assert not scale_bits_exact(dataclasses.replace(qw, scales=codes_nonzero))


@pytest.mark.parametrize("text", ["nvfp4", "mxfp4", "w4a16:e2m1:g64:bf16"])
def test_e2m1_dequantizer_is_exact(interpret, text):
    _, qw, _ = _problem(text, 1, 70, 256, seed=2)
    assert torch.equal(dequantize_frag(to_triton_layout(qw), dtype=torch.float16), qw.dequantize(torch.float16))


@pytest.mark.parametrize("text", ["w4a8", "w4a8:uint4:g128:fp32:zp-int:e4m3-token", "w4a8:int4:ch:fp32:e4m3-token"])
@pytest.mark.parametrize("m", [1, 13, 70])
def test_w4a8_fragment_layout(interpret, text, m):
    """int4 weights in the FP8 MMA's order, e4m3 x per token; against a
    reference from the kernel's own quantized x (the interpreter's fp32 -> fp8 drops rounding carries)."""
    from anybit.kernels.quant_act import quantize_act
    from anybit.quant.activations import dequantize_activation

    _, qw, _ = _problem(text, m, 80, 384, seed=m)
    tw = to_triton_layout(qw)
    assert tw.frag and torch.equal(unpack_frag(tw.planes[0], 384, a8=True, n=80), stored_codes(qw))
    x = torch.randn(m, 384, generator=torch.Generator().manual_seed(m)).half()
    xq, xs = quantize_act(x, qw.scheme.act)
    ref = dequantize_activation(xq, xs, qw.scheme.act).double() @ qw.dequantize().double().T
    ws, cnt = torch.empty(2 * m * 80), torch.zeros(64, dtype=torch.int32)
    y = gemm_frag(xq, tw, block_m=16, block_n=64, split_k=2, num_stages=1, workspace=ws, counters=cnt,
                  x_scales=xs, out_dtype=torch.float16)  # fmt: skip
    assert y.dtype == torch.float16 and rel_err(y, ref) < GEMM_REL_ERR[torch.float16]
    xq2, xs2, sums = quantize_act(x, qw.scheme.act, block_sums=True)  # the quantizer's block sums instead
    assert torch.equal(xq2.view(torch.uint8), xq.view(torch.uint8)) and torch.equal(xs2, xs)
    y_sums = gemm_frag(xq, tw, block_m=16, block_n=64, split_k=2, num_stages=1, workspace=ws, counters=cnt,
                       x_scales=xs, x_sums=sums, out_dtype=torch.float16)  # fmt: skip
    assert rel_err(y_sums, ref) < GEMM_REL_ERR[torch.float16]
    prepared = prepare(qw, backend="triton")  # the backend path: quantize, then the same kernel
    assert rel_err(get_backend("triton").gemm(x, prepared), ref) < 4 * GEMM_REL_ERR[torch.float16]
    with pytest.raises(ValueError, match="packed for e4m3"):
        gemm_frag(x, tw, block_m=16, block_n=64)


@pytest.mark.parametrize("m, k", [(1, 384), (13, 200), (3, 5000)])
def test_quantizer_block_sums(interpret, m, k):
    """`quantize_act(block_sums=True)`: per token, the sum of the quantized values over each 128-K block
    (the K tail included), fp32 [blocks, M]; the codes and scales are those of the plain call."""
    from anybit.formats.scheme import Scheme
    from anybit.kernels.quant_act import quantize_act

    act = Scheme.parse("w4a8").act
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).half()
    xq, xs = quantize_act(x, act)
    xq2, xs2, sums = quantize_act(x, act, block_sums=True)
    assert torch.equal(xq2.view(torch.uint8), xq.view(torch.uint8)) and torch.equal(xs2, xs)
    pad = torch.nn.functional.pad(xq.float(), (0, -k % 128))
    ref = pad.reshape(m, -1, 128).double().sum(dim=-1).T
    assert sums.shape == ((k + 127) // 128, m) and torch.allclose(sums.double(), ref, rtol=1e-6, atol=1e-3)
    with pytest.raises(ValueError, match="per-token or static"):
        quantize_act(x[:, :256], Scheme.parse("w4a8:int4:g128:fp32:e4m3-g128").act, block_sums=True)


INT2_FORMATS = ["w2a16", "w2a16:int2:g128:bf16", "w2a16:int2:ch:fp32", "w2a16:uint2:g256:fp16:zp-int"]


def test_2_and_8_bits_take_the_fragment_layout():
    assert all(frag_format(Scheme.parse(t)) for t in INT2_FORMATS)
    assert not frag_format(Scheme.parse("w2a16:uint2:g32:fp16:zp-int"))  # groups shorter than 64
    assert not frag_format(Scheme.parse("w3a16"))
    assert frag_format(Scheme.parse("w8a16")) and not frag_format(Scheme.parse("w8a16:int8:g32:bf16"))


@pytest.mark.parametrize("text", INT2_FORMATS)
@pytest.mark.parametrize("m", [1, 13, 40])
def test_2bit_swap_ab_gemm_matches_dequantize(interpret, text, m):
    """2-bit codes: each 128-K block runs as two 64-K halves (one dot and, for g64, one scale each)."""
    k = {"g256": 512, "g128": 384}.get(text.split(":")[2] if ":" in text else "", 320)  # 320: a half-empty block
    x, qw, ref = _problem(text, m, 80, k, seed=m)
    prepared = prepare(qw, backend="triton")
    assert prepared.data.frag
    y = get_backend("triton").gemm(x, prepared)
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("text", ["w2a16", "w2a16:int2:g128:bf16"])
def test_2bit_dequantizer_is_exact(interpret, text):
    k = 384 if "g128" in text else 320
    _, qw, _ = _problem(text, 1, 70, k, seed=4)
    tw = to_triton_layout(qw)
    assert tw.frag and torch.equal(unpack_frag(tw.planes[0], k, bits=2, n=70), stored_codes(qw))
    assert torch.equal(dequantize_frag(tw, dtype=torch.float16), qw.dequantize(torch.float16))


INT8_FORMATS = ["w8a16", "w8a16:uint8:g128:fp16:zp-int", "w8a16:int8:g64:bf16"]


@pytest.mark.parametrize("bits", [2, 8])
def test_pack_round_trip_other_widths(bits):
    codes = torch.randint(0, 1 << bits, (2, 3, 200), dtype=torch.uint8)
    words = pack_frag(codes, bits=bits)
    assert words.shape == (2, FRAG_PANEL, -(-200 // (512 // bits)) * 16)  # blocks of 16 words per row
    assert torch.equal(unpack_frag(words, 200, bits=bits, n=3), codes)


@pytest.mark.parametrize("n, k", [(5, 128), (70, 384), (3, 640)])
def test_pack_round_trip_three_bits(n, k):
    """3-bit codes: low units (two bits of two 4-bit blocks) then high units (one bit of four), K padded to 512."""
    codes = torch.randint(0, 8, (n, k), dtype=torch.uint8)
    words = pack_frag3(codes)
    assert words.shape == (-(-n // FRAG_PANEL) * FRAG_PANEL, 48 * -(-k // 512))  # 3 bits a code: 48 words per 512 K
    assert words.dtype == torch.int32
    assert torch.equal(unpack_frag3(words, k, n), codes)


@pytest.mark.parametrize("text", ["w3a16:int3:g128:fp16", "w3a16:uint3:g128:fp16:zp-int", "w3a16:int3:ch:fp16"])
@pytest.mark.parametrize("m, k", [(1, 384), (13, 640), (100, 384)])
def test_three_bit_codes_through_the_route(interpret, text, m, k):
    """3-bit integers in the 3-bit planes (`pack_frag3`, the dense backend only): each block's 4-bit words rebuilt
    from a low and a high unit, decoded as 4-bit codes of bias 4 — the frag kernel up to 64 rows (split K across the
    units' pairs and quads), its dequantizer above; N off the tile, K off the 512 of the planes."""
    x, qw, ref = _problem(text, m, 200, k, seed=m)
    prepared = prepare(qw, backend="triton")
    assert prepared.data.frag and prepared.data.fmt["W_BITS"] == 3
    y = get_backend("triton").gemm(x, prepared)
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]
    assert torch.equal(dequantize_frag(prepared.data, dtype=torch.float16), qw.dequantize(torch.float16))
    assert not to_triton_layout(qw).frag  # the grouped MoE kernels' layouts keep bit planes


@pytest.mark.parametrize("text", INT8_FORMATS)
@pytest.mark.parametrize("m", [1, 13, 40])
def test_8bit_swap_ab_gemm_matches_dequantize(interpret, text, m):
    """8-bit codes, opt-in: 64-K blocks, each byte under the fp32 exponent of 2**23, one fp32 subtraction."""
    k = 384 if "g128" in text else 320
    x, qw, ref = _problem(text, m, 80, k, seed=m)
    prepared = prepare(qw, backend="triton")
    assert prepared.data.frag
    y = get_backend("triton").gemm(x, prepared)
    assert rel_err(y, ref) < GEMM_REL_ERR[torch.float16]
    assert torch.equal(dequantize_frag(prepared.data, dtype=torch.float16), qw.dequantize(torch.float16))


def test_decode_split_balances_the_sms_where_one_or_two_tiles_fall_on_each():
    """`balanced_split` (M <= 16, one to two tiles per SM): the H200 sweep's best splits, and the older rule (fill
    two CTAs per SM) elsewhere."""
    splits = {(n, k, fl): frag_tile(1, n, k, 132, False, float_codes=fl)["split_k"]
              for n, k in [(28672, 8192), (18432, 7168), (24576, 5120), (28672, 4096), (8192, 8192)]
              for fl in (False, True)}  # fmt: skip
    assert splits == {(28672, 8192, False): 4, (28672, 8192, True): 4, (18432, 7168, False): 4,
                      (18432, 7168, True): 8, (24576, 5120, False): 2, (24576, 5120, True): 2,
                      (28672, 4096, False): 1, (28672, 4096, True): 4, (8192, 8192, False): 4,
                      (8192, 8192, True): 4}  # fmt: skip
    assert frag_tile(64, 28672, 8192, 132, False)["split_k"] == 1  # 64 tokens: split 1 measured best
    assert frag_tile(1, 20000, 256, 132, False)["split_k"] == 1  # two K blocks: nothing to split
    assert frag_tile(1, 28672, 8192, 132, False, balance=False)["split_k"] == 1  # unbalanced: fill two CTAs an SM
    # 4-bit weights on the FP8 MMA: their own CTA cost (`SPLIT_CTA_COST_A8`), the H100 sweep's best splits
    a8 = {(n, k): frag_tile(16, n, k, 132, False, fp8_mma=True)["split_k"]
          for n, k in [(18432, 7168), (28672, 8192), (28672, 4096), (7168, 7168)]}  # fmt: skip
    assert a8 == {(18432, 7168): 2, (28672, 8192): 1, (28672, 4096): 1, (7168, 7168): 4}
    assert frag_tile(1, 28672, 8192, 132, False, bits=8)["split_k"] == 2  # 8-bit codes: 2 (`BYTE_SPLIT`)
    assert frag_tile(16, 28672, 4096, 132, False, bits=8)["split_k"] == 2


def test_fp8_mma_tiles_narrow_where_128_rows_fill_the_sms_poorly():
    """33-64 rows on the FP8 MMA (`A8_NARROW_FILL`): 18432x7168's 144 tiles of 128 rows hold 55 % of two CTAs an SM,
    so 64 weight rows a tile (288 CTAs); weights whose 128-row tiles (times their split) fill the SMs keep them, and
    so does every A16 weight and every M outside 33-64."""
    pick = {(m, n, k, a8): (t["block_n"], t["split_k"])
            for m in (16, 40, 64) for n, k in [(18432, 7168), (28672, 8192), (8192, 8192), (9216, 4096)]
            for a8 in (False, True) for t in [frag_tile(m, n, k, 132, False, fp8_mma=a8)]}  # fmt: skip
    narrow = {key for key, (bn, _) in pick.items() if bn == 64}
    assert narrow == {(40, 18432, 7168, True), (64, 18432, 7168, True)}
    assert pick[(64, 18432, 7168, True)] == (64, 1) and pick[(64, 18432, 7168, False)] == (128, 1)
    assert pick[(64, 9216, 4096, True)] == (128, 2)  # 64-row tiles would put no more CTAs in flight (144 either way)


def assert_pairs_give_the_same_bits(monkeypatch, x, qw, ref):
    """Two K blocks an iteration (`FRAG_PAIRS`) give the one-block loop's bits (the same products summed in the same
    order; a split's last odd block pairs with a masked one), within x's dtype tolerance of ref."""
    from anybit.kernels import frag

    prepared = prepare(qw, backend="triton")
    be = get_backend("triton")
    monkeypatch.setattr(frag, "FRAG3_PAIRS", False)  # (3-bit codes by this one alone, `FRAG_PAIRS`)
    monkeypatch.setattr(frag, "FRAG_PAIRS", False)
    one = be.gemm(x, prepared)
    monkeypatch.setattr(frag, "FRAG_PAIRS", True)
    assert frag.frag_pairs(prepared.data, 16)
    assert torch.equal(be.gemm(x, prepared), one)
    assert rel_err(one, ref) < GEMM_REL_ERR[x.dtype]


@pytest.mark.parametrize(
    "text, k",  # 5 and 7 K blocks split in two (3 + 2, 4 + 3): a split ends on an odd block; 608: K off the block
    [("w4a16", 640), ("w4a16", 896), ("mxfp4", 608), ("nvfp4", 896), ("w4a8-mxfp4", 608), ("w4a8-mxfp4", 896)],
)
def test_two_blocks_an_iteration_give_the_same_bits(interpret, monkeypatch, text, k):
    from tests.kernels.test_gemm_a8 import a8_reference

    g = torch.Generator().manual_seed(k)
    qw = quantize(torch.randn(72, k, generator=g) * 0.05, text)
    x = torch.randn(5, k, generator=g).half()
    ref = a8_reference(x, qw) if qw.scheme.act.quantized else x.double() @ qw.dequantize().double().T
    assert_pairs_give_the_same_bits(monkeypatch, x, qw, ref)


@pytest.mark.parametrize("text", ["w3a16:int3:g128:fp16", "w3a16:uint3:g128:fp16:zp-int"])
@pytest.mark.parametrize("k", [384, 1024])  # 3 and 8 K blocks split in two: the splits' pairs start on even blocks
def test_two_blocks_an_iteration_of_three_bit_codes_give_the_same_bits(interpret, monkeypatch, text, k):
    """3-bit codes (`pack_frag3`) two blocks an iteration: one load of the pair's low and high units for both (zero
    points too: each block's own)."""
    g = torch.Generator().manual_seed(k)
    qw = quantize(torch.randn(72, k, generator=g) * 0.05, text)
    x = torch.randn(5, k, generator=g).half()
    assert_pairs_give_the_same_bits(monkeypatch, x, qw, x.double() @ qw.dequantize().double().T)


@pytest.mark.parametrize("m", [150, 192])  # the third tile partly past M, and all three full
def test_three_64_token_tiles_on_one_decode_give_the_bits_of_64_token_tiles(interpret, m):
    """e2m1 under FP8 x accumulating in the MMA (`frag_mma_acc`): block_m 192 runs three 64-token tiles against each
    K block's weight rows decoded once (`frag_range_subs`) — the same products in the same order as three 64-token
    tiles launched apart; N and K off the tiles. block_m 192 refuses a split and other weights."""
    from anybit.kernels.quant_act import quantize_act
    from tests.kernels.test_gemm_a8 import a8_reference

    g = torch.Generator().manual_seed(m)
    qw = quantize(torch.randn(72, 608, generator=g) * 0.05, "w4a8-mxfp4")
    x = torch.randn(m, 608, generator=g).half()
    tw = to_triton_layout(qw)
    xq, xs = quantize_act(x, qw.scheme.act)
    kw = dict(block_n=64, num_stages=1, x_scales=xs, out_dtype=torch.float16)
    y = gemm_frag(xq, tw, block_m=192, out=torch.full((m, 72), float("nan"), dtype=torch.float16), **kw)
    assert torch.equal(y, gemm_frag(xq, tw, block_m=64, **kw))
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.float16]
    with pytest.raises(ValueError, match="without split-K"):
        gemm_frag(xq, tw, block_m=192, split_k=2, workspace=torch.empty(2 * m * 72),
                  counters=torch.zeros(64, dtype=torch.int32), **kw)  # fmt: skip


@pytest.mark.parametrize("text", ["w4a16:int4:g128:fp16", "w4a16-zp", "w4a16:int4:ch:fp32", "nvfp4", "mxfp4"])
@pytest.mark.parametrize("m, split, bm", [(13, 1, 48), (40, 3, 48), (48, 1, 48), (100, 2, 48), (90, 2, 96)])
def test_two_part_token_tile_matches_64_token_tiles(interpret, text, m, split, bm):
    """block_m 48 (`FRAG_TWO`: 4-bit codes under bf16/fp16 x) runs a 32- and a 16-token tile against each K block's
    weight rows decoded once (`frag_range_two`; 96: 64 + 32): the products of 64-token tiles (to an ulp of fp16: the
    interpreter's fp32 matmul sums by a blocking of its own, which a narrower product changes), with the
    second part partly or wholly past M, split K (a counter each part, re-armed), bias, N off the tile, a K tail."""
    x, qw, ref = _problem(text, m, 72, 600 if ":ch:" in text else 640, seed=m)  # channel scales: a K tail
    bias = torch.randn(72).half()
    tw = to_triton_layout(qw)
    ws, cnt = torch.empty(split * m * 72), torch.zeros(2 * 3 * 2, dtype=torch.int32)
    kw = dict(block_n=64, split_k=split, num_stages=1, workspace=ws, counters=cnt)
    for _ in range(2):  # the second call checks the counters were re-armed
        out = torch.full((m, 72), float("nan"), dtype=torch.float16)
        y = gemm_frag(x, tw, bias, block_m=bm, out=out, **kw)
        assert not torch.isnan(y).any() and (cnt == 0).all()
        torch.testing.assert_close(y, gemm_frag(x, tw, bias, block_m=64, **kw), rtol=2**-10, atol=2**-12)
    assert rel_err(y, ref + bias.double()) < GEMM_REL_ERR[torch.float16]


def test_two_part_token_tiles_refuse_what_they_cannot_run(interpret):
    """A two-part tile needs parts that are powers of two of >= 16 tokens, and 4-bit codes under bf16/fp16 x; the
    rule takes 48 at 33-48 rows of such weights only."""
    x, qw, _ = _problem("w8a16", 5, 64, 256, seed=1)
    with pytest.raises(ValueError, match="4-bit codes"):
        gemm_frag(x, to_triton_layout(qw), block_m=48, block_n=64, num_stages=1)
    x, qw, _ = _problem("w4a16", 5, 64, 256, seed=1)
    for bm in (40, 24, 8):
        with pytest.raises(ValueError, match=f"got {bm}"):
            gemm_frag(x, to_triton_layout(qw), block_m=bm, block_n=64, num_stages=1)
    assert frag_tile(40, 8192, 8192, 132, False, two=True)["block_m"] == 48
    assert frag_tile(49, 8192, 8192, 132, False, two=True)["block_m"] == 64
    assert frag_tile(40, 8192, 8192, 132, False)["block_m"] == 64


def test_explain_names_the_two_part_tile(monkeypatch):
    """`anybit explain` on a Hopper (faked: 132 SMs, no tuned entry) at 40 rows of a tall 4-bit weight: the 48-token
    tile and its two parts; 8-bit codes keep 64 tokens."""
    import anybit.backends.triton as triton_backend
    from anybit.formats.scheme import Scheme
    from anybit.tools.explain import triton_plan

    monkeypatch.setattr(triton_backend, "_sm_count", lambda device: 132)
    monkeypatch.setattr(triton_backend, "tuning_cache", lambda device: {})
    cuda = torch.device("cuda")
    plan = triton_plan(Scheme.parse("w4a16"), 40, 28672, 8192, cuda, torch.bfloat16)
    assert "(32 + 16 tokens on one decode of each K block), tile 48x128x128" in plan, plan
    assert "tile 64x128x64" in triton_plan(Scheme.parse("w8a16"), 40, 28672, 8192, cuda, torch.bfloat16)


def test_explain_names_the_narrow_fp8_tile(monkeypatch):
    """`anybit explain` on a Hopper (faked) at 64 rows of W4A8 on 18432x7168: 64 weight rows a tile, and why
    (`frag.A8_NARROW_FILL`); 28672x8192 keeps 128."""
    import anybit.backends.triton as triton_backend
    from anybit.formats.scheme import Scheme
    from anybit.tools.explain import triton_plan

    monkeypatch.setattr(triton_backend, "_sm_count", lambda device: 132)
    monkeypatch.setattr(triton_backend, "tuning_cache", lambda device: {})
    cuda = torch.device("cuda")
    plan = triton_plan(Scheme.parse("w4a8"), 64, 18432, 7168, cuda, torch.bfloat16)
    assert "tile 64x64x128" in plan and "under 60 % of two CTAs an SM" in plan, plan
    plan = triton_plan(Scheme.parse("w4a8"), 64, 28672, 8192, cuda, torch.bfloat16)
    assert "tile 64x128x128" in plan and "60 %" not in plan, plan


def test_a_launch_is_worked_out_once_per_tile_and_setting(interpret, monkeypatch):
    """`gemm_frag` keeps a launch's constexprs on the weight (`TritonWeight.launches`): a second call of the same tile
    and flags reuses them (the same bits), a switch a test turns (`FRAG_PAIRS`) or another tile gives a launch of its
    own, and a tile that is not valid raises every time, never kept."""
    from anybit.kernels import frag

    g = torch.Generator().manual_seed(5)
    tw = to_triton_layout(quantize(torch.randn(80, 384, generator=g) * 0.05, "w4a16"))
    x = torch.randn(3, 384, generator=g).half()
    y = gemm_frag(x, tw, block_m=16, block_n=64)
    assert len(tw.launches) == 1 and torch.equal(gemm_frag(x, tw, block_m=16, block_n=64), y)
    assert len(tw.launches) == 1
    monkeypatch.setattr(frag, "FRAG_PAIRS", not frag.FRAG_PAIRS)
    assert torch.equal(gemm_frag(x, tw, block_m=16, block_n=64), y) and len(tw.launches) == 2
    gemm_frag(x, tw, block_m=32, block_n=64)
    assert len(tw.launches) == 3
    for _ in range(2):
        with pytest.raises(ValueError, match="block_n=32 must be >= 16 \\* num_warps"):
            gemm_frag(x, tw, block_m=16, block_n=32)
    assert len(tw.launches) == 3


def test_three_bit_codes_pair_blocks_where_it_paid():
    """`FRAG3_PAIRS`: 3-bit codes two blocks an iteration on decode tiles — without zero points always, with them
    where the launch's CTAs fit two an SM (207 registers; H200: 8192^2 M=1 19.4 -> 18.2 µs, 256 CTAs; 28672x8192 53.3
    -> 55.1, 896); not on 64-token tiles nor under a 128-register cap; 4-bit codes keep `FRAG_PAIRS` (off)."""
    from anybit.kernels import frag

    int3 = to_triton_layout(quantize(torch.randn(64, 512), "w3a16:int3:g128:bf16"), allow_frag3=True)
    uint3 = to_triton_layout(quantize(torch.randn(64, 512), "w3a16"), allow_frag3=True)
    w4 = to_triton_layout(quantize(torch.randn(64, 512), "w4a16"))
    assert frag.frag_pairs(int3, 16) and frag.frag_pairs(int3, 32, ctas=896, num_sms=132)
    assert frag.frag_pairs(uint3, 16, ctas=256, num_sms=132) and not frag.frag_pairs(uint3, 16, ctas=896, num_sms=132)
    assert not frag.frag_pairs(uint3, 16)  # (the interpreter: no SM count)
    assert not frag.frag_pairs(int3, 64) and not frag.frag_pairs(int3, 16, maxnreg=128)
    assert not frag.frag_pairs(w4, 16, ctas=64, num_sms=132)
