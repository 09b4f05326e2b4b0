"""The warp-specialised large-M kernel (`anybit.kernels.frag_ws`): the Gluon kernel itself runs only on a
Hopper GPU (tests/kernels/test_frag_ws_gpu.py); here, on the CPU, the decoder's word -> K order written
with the same reshape / permute / split / join steps in torch against the layout's own unpacker, and the
reasons the kernel is not taken."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import to_triton_layout
from anybit.formats.scheme import Scheme
from anybit.kernels.frag import scaled_int_why_not
from anybit.kernels.frag_layout import FRAG_PANEL, e2m1_pair_terms, from_panels, pack_frag
from anybit.kernels.frag_ws import (
    _gluon,
    e2m1_ws_why_not,
    frag_ws_weight_why_not,
    frag_ws_why_not,
    swap_parts,
    swap_tile,
    ws_takes,
    ws_tile,
)


def _decode_half_like_the_kernel(words: torch.Tensor, h: int) -> torch.Tensor:
    """words int64 [R, 16] (one 128-K block of each row) -> the codes of its half h [R, 64], by the steps
    of `_w_decoder` / `_decode_half` (gl.join = stack on a new last dim, gl.split = unbind it)."""
    r = words.shape[0]
    half = words.reshape(r, 4, 2, 2).permute(0, 1, 3, 2).unbind(-1)[h]  # [R, 4 (t), 2 (cl)]
    pairs = [(half >> (4 * j)) & 0x000F000F for j in range(4)]
    rr = torch.stack([torch.stack([pairs[0], pairs[2]], -1), torch.stack([pairs[1], pairs[3]], -1)], -1)
    lo, hi = rr & 0xFFFF, rr >> 16
    v = torch.stack([lo, hi], -1).reshape(r, 4, 2, 4, 2)  # (t, cl, j, e)
    return v.permute(0, 2, 3, 1, 4).reshape(r, 64)


def test_decoder_order_is_the_frag_layout():
    codes = torch.randint(0, 16, (FRAG_PANEL, 384), dtype=torch.uint8)
    words = from_panels(pack_frag(codes), FRAG_PANEL, FRAG_PANEL).to(torch.int64) & 0xFFFFFFFF
    for b in range(3):
        block = words[:, 16 * b : 16 * (b + 1)]
        for h in range(2):
            got = _decode_half_like_the_kernel(block, h)
            assert torch.equal(got, codes[:, 128 * b + 64 * h : 128 * b + 64 * (h + 1)].to(torch.int64))


def _rotr(u: torch.Tensor, r: int) -> torch.Tensor:
    return ((u >> r) | (u << (32 - r))) & 0xFFFFFFFF if r else u


def _scale_bits(c: torch.Tensor, kind: int, dtype: torch.dtype) -> torch.Tensor:
    """`frag_ws_kernel._scale_bits`: codes -> scale * 2**118 (bf16) / 2**6 (fp16) as x's dtype."""
    bf16 = dtype == torch.bfloat16
    b = {(True, 1): c * 16 + 0x7700, (True, 2): c * 128 + 0x3B00, (False, 1): c * 128 + 0x3800,
         (False, 2): c * 1024 - 0x1A800}[(bf16, kind)]  # fmt: skip
    return b.to(torch.int16).view(dtype)


def _e2m1_half_like_the_kernel(words, codes, h, kind, dtype):
    """words int64 [R, 16] of one 128-K block of e2m1 codes, codes [R, G] its scale codes -> the decoded half h
    [R, 64] times 2**-8, by the steps of `_e2m1_block` / `_e2m1_asm` (`e2m1_pair_terms`) / `_half_from_pairs`."""
    r, g = codes.shape
    c = torch.arange(4)
    lo_group, hi_group = (c, c) if g == 4 else (2 * c, 2 * c + 1)  # the scale of pairs 0, 1 and 2, 3 of word c
    lo = _scale_bits(codes[:, lo_group], kind, dtype).float()[:, None, :].expand(r, 4, 4)  # (n, t, c)
    hi = _scale_bits(codes[:, hi_group], kind, dtype).float()[:, None, :].expand(r, 4, 4)
    w = words.reshape(r, 4, 4)
    half = lambda t: t.reshape(r, 4, 2, 2).permute(0, 1, 3, 2)[..., h]  # noqa: E731  [R, 4 (t), 2 (cl)]
    pairs = []
    for j, terms in enumerate(e2m1_pair_terms(dtype == torch.bfloat16)):
        v = torch.zeros_like(half(w))
        for rot, mask in terms:
            v |= _rotr(half(w), rot) & mask
        s = half(lo) if j < 2 else half(hi)
        ev = [((v >> (16 * e)) & 0xFFFF).to(torch.int16).view(dtype).float() * s for e in range(2)]
        pairs.append(torch.stack(ev, -1).to(dtype))  # the packed multiply: exact, then x's dtype
    v = torch.stack(pairs, -2)  # [R, 4 (t), 2 (cl), 4 (j), 2 (e)]
    return v.permute(0, 2, 3, 1, 4).reshape(r, 64)  # (cl, j, t, e)


@pytest.mark.parametrize("text", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_e2m1_decoder_gives_the_weights_times_a_power_of_two(text, dtype):
    qw = quantize(torch.randn(FRAG_PANEL, 256) * 0.05, text)
    tw = to_triton_layout(qw)
    assert frag_ws_weight_why_not(tw, dtype, torch.device("cpu")) == "a Gluon kernel: a CUDA GPU, not the interpreter"
    assert e2m1_ws_why_not(tw.scheme, dtype) is None and dtype in tw.fold and tw.fold_bits
    words = from_panels(tw.planes[0], FRAG_PANEL, FRAG_PANEL).to(torch.int64) & 0xFFFFFFFF
    codes = tw.scales.view(torch.uint8).to(torch.int64).T  # [N, groups]
    gs = float(tw.global_scale) if tw.global_scale is not None else 1.0
    ref = (qw.dequantize().double() / gs * 2.0**-8).to(dtype)
    g = 128 // tw.group_k
    for b in range(2):
        for h in range(2):
            got = _e2m1_half_like_the_kernel(words[:, 16 * b : 16 * (b + 1)], codes[:, g * b : g * (b + 1)], h,
                                             tw.fmt["SCALE_KIND"], dtype)  # fmt: skip
            assert torch.equal(got, ref[:, 128 * b + 64 * h : 128 * b + 64 * (h + 1)])


def _bytes_like_the_kernel(words: torch.Tensor, scales: torch.Tensor, signed: bool, dtype) -> torch.Tensor:
    """words int64 [R, 16] (one 64-K block of 8-bit codes a row), scales [R] in x's dtype -> the block [R, 64] in
    x's dtype, by the steps of `_decode_bytes` / `_bytes_asm`: byte e + 2j of word 4t + c is pair j's half e, the
    code less its bias exact, times the scale rounded once (the packed multiply)."""
    r = words.shape[0]
    s = scales.float()[:, None]
    half = [(((words >> (8 * i)) & 0xFF) - (128 if signed else 0)).float() * s for i in range(4)]  # byte i, exact
    pairs = [torch.stack([half[2 * j], half[2 * j + 1]], -1).to(dtype) for j in range(2)]  # [R, 16 (t, c), 2 (e)]
    v = torch.stack(pairs, -2).reshape(r, 4, 4, 2, 2)  # (t, c, j, e)
    return v.permute(0, 2, 3, 1, 4).reshape(r, 64)  # (c, j, t, e)


@pytest.mark.parametrize("text", ["w8a16", "w8a16:int8:g128:bf16", "w8a16:uint8:g64:fp16"])
def test_byte_decoder_gives_the_dequantized_weights(text):
    qw = quantize(torch.randn(FRAG_PANEL, 384) * 0.05, text)
    tw = to_triton_layout(qw)
    dtype = tw.scales.dtype
    assert frag_ws_weight_why_not(tw, dtype, torch.device("cpu")) == "a Gluon kernel: a CUDA GPU, not the interpreter"
    assert scaled_int_why_not(tw.scheme, dtype, 8) is None
    words = from_panels(tw.planes[0], FRAG_PANEL, FRAG_PANEL).to(torch.int64) & 0xFFFFFFFF
    ref = qw.dequantize().to(dtype)
    per = max(1, tw.group_k // 64)  # 64-K blocks a scale row
    for b in range(6):
        got = _bytes_like_the_kernel(words[:, 16 * b : 16 * (b + 1)], tw.scales[min(b // per, len(tw.scales) - 1)],
                                     bool(tw.fmt["W_SIGNED"]), dtype)  # fmt: skip
        assert torch.equal(got, ref[:, 64 * b : 64 * (b + 1)])


@pytest.mark.parametrize(
    "text, why",
    [
        ("nvfp4", None),
        ("mxfp4", None),
        ("w4a8-nvfp4", None),  # FP8 x as its codes in x's dtype (`codes_a16`)
        ("w4a16:e2m1:g64:ue8m0", "groups of 16 or 32"),
        ("w4a16:e2m1:g32:bf16", "e4m3 or ue8m0 scales"),
        ("w4a8:e2m1:g32:ue8m0:e4m3-g128", "bf16/fp16 activations"),  # per-group x scales: not a row's
    ],
)
def test_e2m1_schemes_the_kernel_takes(text, why):
    got = e2m1_ws_why_not(Scheme.parse(text), torch.bfloat16)
    assert (got is None) if why is None else (why in got)


@pytest.mark.parametrize(
    "text, why",
    [
        ("w4a16", "CUDA GPU"),  # on this machine: the CPU
    ],
)
def test_why_not_on_the_cpu(text, why):
    tw = to_triton_layout(quantize(torch.randn(256, 512), text))
    assert why in frag_ws_why_not(tw.scheme, tw.k, torch.bfloat16, torch.device("cpu"))


# (M, N) -> the block_m the H200 sweeps found fastest, or None where dequantize + cuBLAS won (BENCHMARKS.md;
# M=128 N=8192 and N=4096 from CUDA-graph timings, session 12: the eager ones of session 11 were host-bound)
MEASURED = {(128, 28672): 128, (128, 8192): 128, (128, 4096): None, (256, 28672): 256, (256, 8192): "swap 256",
            (256, 4096): None, (512, 8192): 256, (512, 6144): None, (512, 4096): None, (1024, 8192): 256,
            (1024, 6144): None, (1024, 4096): 256, (1024, 28672): 256}  # fmt: skip


@pytest.mark.parametrize("m, n", sorted(MEASURED))
def test_tile_rule_follows_the_h200_sweeps(m, n):
    tile = ws_tile(m, n, 132)
    got = None if tile is None else ("swap " if tile.get("swap") else "") + str(tile["block_m"])
    assert got == (None if MEASURED[(m, n)] is None else str(MEASURED[(m, n)]))


# (M, N, K) -> the swapped tile the H200 sweeps found fastest (tokens, weight rows), or None where the row-major tiles
# or the frag kernel stayed ahead (BENCHMARKS.md, sessions 20-21: MXFP4, W4A16, NVFP4, graphs)
SWAP_MEASURED = {(96, 8192, 8192): (96, 64), (128, 8192, 8192): (128, 64), (160, 8192, 8192): (160, 64),
                 (192, 8192, 8192): (192, 64), (256, 8192, 8192): (256, 64), (128, 8192, 28672): None,
                 (96, 8192, 28672): None, (192, 8192, 28672): (192, 64), (256, 8192, 28672): (256, 64),
                 (128, 28672, 8192): None, (160, 28672, 8192): (160, 128), (192, 28672, 8192): (192, 128),
                 (256, 28672, 8192): None, (192, 4096, 4096): None}  # fmt: skip


@pytest.mark.parametrize("m, n, k", sorted(SWAP_MEASURED))
def test_swapped_tile_rule_follows_the_h200_sweeps(m, n, k):
    tile = swap_tile(m, n, 132, k)
    assert (None if tile is None else (tile["block_m"], tile["block_n"])) == SWAP_MEASURED[(m, n, k)]
    if tile is not None:  # the route takes it, at 65-128 rows too
        assert ws_tile(m, n, 132, k) == tile and ws_takes(tile, m)
    elif m <= 128:  # the frag kernel's 128-token tiles keep the call
        assert not ws_takes(ws_tile(m, n, 132, k), m)


def test_swapped_tiles_split_into_power_of_two_token_tensors():
    assert [swap_parts(m) for m in (16, 64, 96, 128, 160, 192, 256)] == [
        (16, 0), (64, 0), (64, 32), (128, 0), (128, 32), (128, 64), (256, 0)
    ]  # fmt: skip
    assert [swap_parts(m) for m in (0, 24, 112, 224, 320)] == [(0, 0)] * 5  # 24 = 16 + 8, 112 = 64 + 48, ...


@pytest.mark.parametrize(
    "text, m, n, k, says",
    [
        ("mxfp4", 192, 8192, 8192, "(swapped), 1 MMA warpgroup(s)), tile 192x64x64, 5 stages"),
        ("nvfp4", 96, 8192, 8192, "two decoder partitions (alternate 128-K blocks) write W per 64-K step"),
        ("nvfp4", 512, 8192, 8192, "two MMA warpgroups), tile 256x128x64, 4 stages"),
        ("w4a16", 96, 8192, 8192, "(swapped), 1 MMA warpgroup(s)), tile 96x64x64"),
        ("mxfp4", 160, 28672, 8192, "(swapped), 2 MMA warpgroup(s)), tile 160x128x64"),
        ("w4a8-nvfp4", 1024, 8192, 8192, "as their codes in x's dtype, x's scales per row after the MMA"),
    ],
)
def test_explain_names_the_tile_the_route_takes(monkeypatch, fake_hopper, text, m, n, k, says):
    """`anybit explain` on a Hopper (faked: Gluon available, 132 SMs) names the tile `ws_tile` gives (the
    register-operand kernel off: `frag_rs.rs_tile` takes some of these calls by default)."""
    from anybit.tools.explain import triton_plan

    monkeypatch.setenv("ANYBIT_FRAG_RS", "0")
    plan = triton_plan(Scheme.parse(text), m, n, k, torch.device("cuda"), torch.bfloat16)
    assert "warp-specialised" in plan and says in plan, plan


def test_gluon_kernels_say_which_triton_they_need(monkeypatch):
    """The Gluon kernels are written in Triton 3.6's Gluon API (3.9 renamed parts of it): on another Triton the reason
    names both versions, and a launcher called anyway fails with it instead of a compile error deep in a kernel."""
    import triton

    import anybit.kernels.frag_ws as frag_ws

    monkeypatch.setattr(triton, "__version__", "3.9.0")
    frag_ws._gluon.cache_clear()
    try:
        assert "Triton 3.6" in frag_ws._gluon() and "3.9.0" in frag_ws._gluon()
        with pytest.raises(RuntimeError, match="written for Triton 3.6"):
            frag_ws.gluon_api()
    finally:
        frag_ws._gluon.cache_clear()


@pytest.mark.skipif(isinstance(_gluon(), str), reason="this Triton has no Gluon Hopper API")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_x_descriptors_are_the_checked_ones_with_x_put_in(dtype):
    """`x_desc` copies one checked descriptor a tile and dtype (its checks cost host time every call): the same fields
    as Gluon's own for every x; an x the checks refuse (misaligned) still gets their error."""
    from anybit.kernels.frag_ws import gluon_api, x_desc

    td = gluon_api()[1]
    for m in (256, 13, 256):
        x = torch.randn(m, 512, dtype=dtype)
        d = x_desc(x, 64)
        want = td.from_tensor(x, [64, 64], d.layout)
        assert type(d) is td and d.__dict__ == want.__dict__ and d.base is x
    misaligned = torch.empty(13 * 512 + 1, dtype=dtype)[1:].view(13, 512)
    with pytest.raises(AssertionError, match="16-byte aligned"):
        x_desc(misaligned, 64)


def _half_from_pairs_like_the_kernel(pairs: list) -> torch.Tensor:
    """`_half_from_pairs`: pair j of each word [R, 4 (t), 2 (cl)] -> the half's codes [R, 64] in K order."""
    r = pairs[0].shape[0]
    rr = torch.stack([torch.stack([pairs[0], pairs[2]], -1), torch.stack([pairs[1], pairs[3]], -1)], -1)
    v = torch.stack([rr & 0xFFFF, rr >> 16], -1).reshape(r, 4, 2, 4, 2)  # (t, cl, j, e)
    return v.permute(0, 2, 3, 1, 4).reshape(r, 64)


def test_two_bit_steps_decode_in_k_order():
    """2-bit codes on the decoder (`_int_block`, W2): a 256-K block of the layout is four K steps; step st is word
    4t + st of each row (`_quarter`), whose pairs (j, l) at shifts 2j + 8l (`_pairs2`) are the half's pairs j of word
    cl = l (`_half_from_pairs`): codes 64 st .. 64 st + 63 of the block."""
    n, k = FRAG_PANEL, 768
    codes = torch.randint(0, 4, (n, k), dtype=torch.uint8)
    words = from_panels(pack_frag(codes, bits=2), n, FRAG_PANEL).to(torch.int64) & 0xFFFFFFFF
    for b in range(k // 256):
        cur = words[:, 16 * b : 16 * (b + 1)]  # [R, 16] as the decoder loads it
        q0, q1 = cur.reshape(n, 4, 2, 2).unbind(-1)  # (t, h, q): gl.split of the last dim
        for st in range(4):
            w = (q0, q1)[st % 2].unbind(-1)[st // 2].unsqueeze(-1)  # [R, 4 (t), 1]
            pairs = [torch.stack([(w >> (2 * j + 8 * lo)) & 0x00030003 for lo in (0, 1)], -1).reshape(n, 4, 2)
                     for j in range(4)]  # fmt: skip
            got = _half_from_pairs_like_the_kernel(pairs)
            assert torch.equal(got, codes[:, 256 * b + 64 * st : 256 * b + 64 * (st + 1)].to(torch.int64))


def test_three_bit_units_in_the_decoders_slot():
    """3-bit codes on the decoder (W3): `_w_fetch` puts each 64-row panel's low unit b // 2 into the slot's first half
    and its high unit lo_units + b // 4 into the second, so the slot read as [2 BN, 16] holds the tile's low units
    then its high units row by row; `_words3` (b's parity) rebuilds the 4-bit words, which decode to block b."""
    from anybit.kernels.frag_layout import HIGH1, LOW2, frag3_low_units, pack_frag3

    bn, k = 2 * FRAG_PANEL, 1664  # two panels; K off the 512-K unit (the last unit half used)
    codes = torch.randint(0, 8, (bn, k), dtype=torch.uint8)
    packed = pack_frag3(codes)
    nb = packed.shape[-1] // 16  # units a row
    rows = packed.to(torch.int64).reshape(-1, 256) & 0xFFFFFFFF  # the TMA descriptor's rows of 256 words
    lo_units = frag3_low_units(k)
    for b in range(-(-k // 128)):
        slot = torch.zeros(2 * bn // 16, 256, dtype=torch.int64)  # [BN // 8, 256] words
        panels = bn // FRAG_PANEL
        for q in range(panels):
            low, high = (q * nb + b // 2) * 4, (q * nb + lo_units + b // 4) * 4  # the units' first rows
            slot[4 * q : 4 * q + 4] = rows[low : low + 4]
            slot[4 * (panels + q) : 4 * (panels + q) + 4] = rows[high : high + 4]
        units = slot.reshape(2 * bn, 16)
        lo, hi = units[:bn], units[bn:]
        words = ((lo >> (2 * (b % 2))) & LOW2) | (((hi >> (b % 4)) & HIGH1) << 2)
        for h in range(2):
            want = codes[:, 128 * b + 64 * h : min(k, 128 * b + 64 * (h + 1))].to(torch.int64)
            assert torch.equal(_decode_half_like_the_kernel(words, h)[:, : want.shape[1]], want)
