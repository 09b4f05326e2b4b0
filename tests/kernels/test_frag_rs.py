"""The register-operand kernel (`anybit.kernels.frag_rs`): the Gluon kernel runs only on a Hopper GPU
(tests/kernels/test_frag_rs_gpu.py); here, on the CPU, its decode's word -> (thread, K) order written with the same
join / reshape / permute / split steps in torch against the layout's own unpacker, and what it refuses."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import to_triton_layout
from anybit.kernels.frag_layout import FRAG_PANEL, from_panels, pack_frag
from anybit.kernels.frag_rs import frag_rs_why_not, gemm_frag_rs


def _a_operand_like_the_kernel(words: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """words int64 [64, 16] (one 128-K block of 64 rows) -> the codes of its two 64-K halves, by the steps of
    `frag_rs_kernel._a_operand` (gl.join = stack on a new last dim, gl.split = unbind it)."""
    return _halves_like_the_kernel([(words.reshape(64, 4, 4) >> (4 * j)) & 0x000F000F for j in range(4)])


def _halves_like_the_kernel(pairs: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The four pairs [64, 4 (t), 4 (c)] of a block's words (pair j: codes k = 32c + 8j + 2t + e, e the half) -> the
    codes of its two 64-K halves, by `_a_operand`'s steps."""
    rr = torch.stack([torch.stack([pairs[0], pairs[2]], -1), torch.stack([pairs[1], pairs[3]], -1)], -1)
    lo, hi = rr & 0xFFFF, rr >> 16
    v = torch.stack([lo, hi], -1).permute(0, 2, 3, 4, 1, 5)  # (row, t, c, j1, j0, e) -> (row, c, j1, j0, t, e)
    return v.reshape(64, 2, 64).permute(0, 2, 1).unbind(-1)


def test_decode_order_is_the_frag_layout():
    codes = torch.randint(0, 16, (FRAG_PANEL, 384), dtype=torch.uint8)
    words = from_panels(pack_frag(codes), FRAG_PANEL, FRAG_PANEL).to(torch.int64) & 0xFFFFFFFF
    for b in range(3):
        v0, v1 = _a_operand_like_the_kernel(words[:, 16 * b : 16 * (b + 1)])
        assert torch.equal(v0, codes[:, 128 * b : 128 * b + 64].to(torch.int64))
        assert torch.equal(v1, codes[:, 128 * b + 64 : 128 * (b + 1)].to(torch.int64))


def test_words_layout_gives_each_thread_its_a_fragments():
    """`_words_layout`'s bases over (row, t, c): thread (warp w, lane l) holds rows 16 w + l // 4 (+ 8) and words 4 t
    + c with t = l % 4 — the A fragments of wgmma m64nNk16 for its rows (k = 2 (l % 4) + e (+ 8) in every k16 slab)."""
    regs, lanes = [[0, 0, 1], [0, 0, 2], [8, 0, 0]], [[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]]
    warps = [[16, 0, 0], [32, 0, 0]]

    def where(reg, lane, warp):
        at = [0, 0, 0]
        for bases, v in ((regs, reg), (lanes, lane), (warps, warp)):
            for i, basis in enumerate(bases):
                if v >> i & 1:
                    at = [a ^ d for a, d in zip(at, basis, strict=True)]
        return at[0], 4 * at[1] + at[2]  # row, word

    cells = {where(reg, lane, warp) for reg in range(8) for lane in range(32) for warp in range(4)}
    assert len(cells) == 64 * 16  # every word of the block exactly once
    for lane in range(32):
        for warp in range(4):
            rows = {where(reg, lane, warp)[0] for reg in range(8)}
            words = {where(reg, lane, warp)[1] for reg in range(8)}
            assert rows == {16 * warp + lane // 4, 16 * warp + lane // 4 + 8}
            assert words == {4 * (lane % 4) + c for c in range(4)}  # word 4t + c holds k = 2t + e + 8j + 32c


def test_refuses_what_it_does_not_run():
    tw = to_triton_layout(quantize(torch.randn(256, 512), "w4a16"))
    assert "GPU" in frag_rs_why_not(tw, torch.bfloat16, torch.device("cpu"))
    with pytest.raises(ValueError, match="block_m must be a power of two or the sum of two"):
        gemm_frag_rs(torch.randn(4, 512).bfloat16(), tw, block_m=112)
    with pytest.raises(ValueError, match="8-bit codes: also 256 . 16, 32 or 64., got 288"):  # 4-bit: 234 KB
        gemm_frag_rs(torch.randn(4, 512).bfloat16(), tw, block_m=288)
    with pytest.raises(ValueError, match="stages=2 .block_m=64.: the ring needs at least 3 slots"):  # 2 slots hang
        gemm_frag_rs(torch.randn(4, 512).bfloat16(), tw, block_m=64, stages=2)


def test_stages_fit_the_shared_memory_the_sm90_compile_reported():
    """`rs_stages`: the most slots that fit (sm_90a compiles, the limit 227 KB: 96 tokens x 6 stages 172 KB, 128 x 6
    221 KB, 160 x 5 223 KB, 192 x 4 211 KB, 256 x 3 206 KB; 8-bit codes, one x slice a slot: 256 x 6 217 KB);
    `rs_block_m`: 193-256 rows as two 128-token tiles where their CTAs fit one wave (4096-row weights), else one of
    256; 257-384 rows as two 192-token tiles, 385-512 as two of 256, where those fit one wave."""
    from anybit.kernels.frag_rs import RS_MIN_STAGES, rs_block_m, rs_stages, rs_tile

    assert [rs_stages(bm) for bm in (64, 96, 128, 160, 192, 256, 512)] == [6, 6, 6, 5, 4, 3, 1]
    assert [rs_stages(bm, bits=8) for bm in (64, 128, 160, 192, 256, 512)] == [6, 6, 6, 6, 6, 3]
    assert rs_tile(256, 8192, 8192, bits=8) == dict(rs=True, block_m=256, stages=6)
    assert [rs_block_m(m, 4096) for m in (33, 100, 160, 192, 193, 256, 257)] == [48, 128, 160, 192, 128, 128, 192]
    assert [rs_block_m(m, 4096) for m in (384, 385, 512, 513)] == [192, 256, 256, None]
    assert rs_block_m(300, 6144) is None and rs_block_m(300, 8192) is None  # 256-token tiles overfill a wave
    assert rs_tile(300, 4096, 4096) == dict(rs=True, block_m=192, stages=4)  # NVFP4 too (192)
    # 8-bit codes, 257-320 rows of 6144/8192-row weights: one 320-token tile (5 slots); 4096-row weights keep 192
    for n in (6144, 8192):
        assert [rs_block_m(m, n, bits=8) for m in (257, 320, 321)] == [320, 320, None]
        assert rs_tile(300, n, 8192, bits=8) == dict(rs=True, block_m=320, stages=5)
    assert rs_block_m(300, 4096, bits=8) == 192 and rs_block_m(300, 28672, bits=8) is None
    assert rs_tile(300, 4096, 14336, bits=8) == dict(rs=True, block_m=320, stages=5, split_k=2)  # K >= 2N: split
    assert rs_tile(300, 4096, 4096, bits=8) == dict(rs=True, block_m=192, stages=6)
    assert rs_tile(512, 4096, 4096) == dict(rs=True, block_m=256, stages=3)
    assert [rs_block_m(m, 6144) for m in (192, 193, 256)] == [192, 256, 256]
    assert all(rs_stages(rs_block_m(m, n)) >= RS_MIN_STAGES for m in range(33, 257) for n in (4096, 8192))
    assert rs_tile(256, 8192, 8192) == dict(rs=True, block_m=256, stages=3)
    assert rs_tile(256, 4096, 4096) == dict(rs=True, block_m=128, stages=6)
    assert rs_tile(32, 8192, 8192) is None and rs_tile(257, 8192, 28672) is None
    assert rs_tile(40, 8192, 8192) == dict(rs=True, block_m=48, stages=6)  # 32 + 16 tokens
    assert rs_tile(64, 8192, 8192) == dict(rs=True, block_m=64, stages=6)
    assert rs_tile(40, 6144, 4096) == dict(rs=True, block_m=48, stages=6)  # 96 tiles: 73 % of a wave
    assert rs_tile(64, 4096, 4096) == dict(rs=True, block_m=64, stages=6, split_k=2)  # 64 tiles: two CTAs each
    assert rs_tile(64, 28672, 4096) is None and rs_tile(64, 2048, 4096) is None
    # 8-bit codes at 33-64 rows: split in two where two CTAs a tile fill one wave, else the frag kernel's decode
    assert rs_tile(40, 4096, 14336, bits=8) == dict(rs=True, block_m=48, stages=6, split_k=2)
    assert rs_tile(64, 6144, 4096, bits=8) is None and rs_tile(40, 8192, 8192, bits=8) is None
    assert rs_tile(100, 8192, 8192) == dict(rs=True, block_m=128, stages=6)  # 112 = 64 + 48 is not two powers of two
    assert rs_tile(96, 8192, 8192) == dict(rs=True, block_m=96, stages=6)


def test_8_bit_codes_take_up_to_320_tokens_a_tile():
    """`rs_token_parts`: 272-320 tokens as 256 + 16 / 32 / 64 for 8-bit codes (an x slot a 64-K slice: 5 slots fit,
    sm_90a 168 registers, no spill, HAZARD 0), never for 4-bit codes; `rs_stages` 5 there."""
    from anybit.kernels.frag_rs import rs_stages, rs_token_parts

    assert [rs_token_parts(b, 8) for b in (96, 256, 272, 288, 320)] == [(64, 32), (256, 0), (256, 16), (256, 32),
                                                                        (256, 64)]  # fmt: skip
    assert rs_token_parts(288, 4) == (0, 0) and rs_token_parts(384, 8) == (0, 0) and rs_token_parts(304, 8) == (0, 0)
    assert [rs_stages(b, bits=8) for b in (272, 288, 320)] == [5, 5, 5]


@pytest.mark.parametrize("m, n, k, takes", [
    (96, 8192, 8192, True), (192, 8192, 8192, True), (256, 8192, 8192, True),  # one wave of 64-row tiles
    (160, 6144, 4096, True), (256, 6144, 4096, True), (192, 4096, 4096, True), (256, 4096, 4096, True),
    (128, 28672, 8192, True), (160, 28672, 8192, False), (256, 28672, 8192, False),  # taller: to 128
    (256, 28672, 4096, False), (160, 14336, 4096, False),
    (256, 8192, 28672, True), (160, 4096, 14336, True),  # K >= 2N: to 256
    (64, 8192, 8192, True), (33, 7168, 7168, True), (32, 8192, 8192, False),  # 33-64 rows: one filled wave, K < 2N
    (64, 28672, 8192, False), (64, 8192, 28672, False), (64, 2048, 4096, False),
    (64, 4096, 4096, True), (48, 4096, 14336, True),  # 33-64 rows of 4096-row weights: split in two (session 31)
    (384, 4096, 4096, True), (512, 4096, 14336, True), (512, 6144, 4096, False), (513, 4096, 4096, False),  # session 28
])  # fmt: skip
def test_rs_tile_follows_the_h200_measurements(m, n, k, takes):
    """`rs_tile`'s rule against the session-22 and -24 H200 probes: where the kernel was faster than the route before
    it (or, 8192^2 and 4096^2 at M=256, as fast)."""
    from anybit.kernels.frag_rs import rs_tile

    assert (rs_tile(m, n, k, 132) is not None) == takes


@pytest.mark.parametrize("m, n, k, takes", [
    (96, 8192, 8192, True), (128, 6144, 4096, True), (96, 4096, 4096, True), (128, 4096, 14336, True),
    (512, 4096, 4096, True), (385, 4096, 14336, True), (384, 4096, 4096, True), (512, 6144, 4096, False),  # s29
    (64, 8192, 8192, False), (48, 6144, 4096, False),  # 33-64 rows: the frag kernel's
    (64, 4096, 14336, True), (40, 4096, 4096, True),  # ... but split in two where two CTAs a tile fill a wave (s32)
    (160, 28672, 8192, False),  # the warp-specialised kernel's
    (96, 28672, 4096, False), (128, 28672, 8192, False), (96, 8192, 28672, True),  # tall: the frag kernel's
])  # fmt: skip
def test_rs_tile_of_8_bit_codes_follows_the_h200_measurements(m, n, k, takes):
    """8-bit codes: `rs_tile`'s rule above 64 rows (session 27's H200 probe: faster than the route at 96 and 128
    rows on 8192^2, 6144x4096, 4096^2 and 4096x14336), at 33-64 rows only split in two on 4096-row weights (session
    32; unsplit on 8192^2 / 6144x4096 the frag kernel's decode was faster), not
    at 65-128 rows of tall weights whose 64-row tiles overfill a wave (session 28: 28672x4096 / 28672x8192 slower
    than the frag kernel; 8192x28672, K >= 2N, faster); at 385-512 rows where 256-token tiles fit one wave (session
    29: 4096^2 and 4096x14336 faster than the route at M=512) and on 192-token tiles at 257-384 (faster there
    too)."""
    from anybit.kernels.frag_rs import rs_tile

    assert (rs_tile(m, n, k, 132, bits=8) is not None) == takes


@pytest.mark.parametrize("m, n, k, split", [(96, 4096, 14336, 2), (128, 4096, 14336, 2), (65, 2048, 8192, 2),
                                            (160, 4096, 14336, 2), (192, 4096, 14336, 2), (256, 4096, 14336, None),
                                            (96, 8192, 28672, None),
                                            (96, 4096, 4096, None), (256, 4096, 4096, None),
                                            (128, 28672, 8192, None), (40, 4096, 4096, 2), (64, 4096, 14336, 2),
                                            (64, 6144, 4096, None), (32, 4096, 4096, None),
                                            (64, 4096, 128, None)])  # fmt: skip
def test_rs_tile_splits_k_where_two_ctas_a_tile_fit_a_wave(m, n, k, split):
    """Sessions 23 and 24's H200 probes: 65-256 rows, K >= 2N, two CTAs a 64-row tile within one wave: split in two
    (4096x14336 M=160 / 256 61.8 / 74.8 -> 44.8 / 64.4 µs); K < 2N unsplit (4096^2 M=256 26.7 vs 36.5). 193-256 rows
    are two 128-token tiles where they fit one wave (`rs_block_m`): 128 CTAs, unsplit."""
    from anybit.kernels.frag_rs import rs_tile

    assert (rs_tile(m, n, k, 132) or {}).get("split_k") == split


@pytest.mark.parametrize(
    "m, n, k",
    [(96, 8192, 8192), (96, 28672, 8192), (192, 8192, 28672), (192, 8192, 8192), (64, 8192, 8192), (40, 7168, 7168),
     (96, 4096, 14336), (256, 4096, 14336), (192, 4096, 4096), (256, 6144, 4096)],
)  # fmt: skip
def test_frag_rs_takes_the_mid_calls(monkeypatch, fake_hopper, m, n, k):
    """On a Hopper (faked: Gluon available, 132 SMs): A16 calls of 65-256 rows that the warp-specialised kernel would
    take, or the frag kernel's mid tiles or dequantize + cuBLAS would keep (4096- and 6144-row weights), and 33-64-row
    calls of weights one wave of 64-row tiles covers, go to the register-operand kernel where `rs_tile` says so, and
    `anybit explain` says so; ANYBIT_FRAG_RS=0 gives the warp-specialised tile back (or none; the decode path at 64
    rows)."""
    import anybit.backends.triton as triton_backend
    from anybit.formats.scheme import Scheme
    from anybit.kernels.frag_rs import rs_block_m
    from anybit.tools.explain import triton_plan

    cuda = torch.device("cuda")
    monkeypatch.setenv("ANYBIT_FRAG_RS", "0")
    before = triton_backend.ws_route_tile(m, n, k, 132)
    assert not (before or {}).get("rs")
    monkeypatch.delenv("ANYBIT_FRAG_RS")
    monkeypatch.setenv("ANYBIT_RS_WIDE", "0")  # (the one-tile kernel's tiles; the wide form's below)
    tile = triton_backend.ws_route_tile(m, n, k, 132)
    assert tile["rs"] and tile["block_m"] == rs_block_m(m, n)
    assert not triton_backend.frag_mid(Scheme.parse("w4a16"), m, n, k, torch.bfloat16, cuda)
    for text in ("mxfp4", "w4a16", "w4a8-nvfp4"):
        plan = triton_plan(Scheme.parse(text), m, n, k, cuda, torch.bfloat16)
        assert "register-operand Gluon kernel" in plan and f"tile {tile['block_m']}x64x128" in plan, (text, plan)
        assert ("K split 2 ways" in plan) == ("split_k" in tile), plan  # few 64-row tiles, K >= 2N: split in two
    assert ("split_k" in tile) == (n == 4096 and k >= 2 * n and m <= 192)  # 193-256 rows: 128 CTAs unsplit
    monkeypatch.delenv("ANYBIT_RS_WIDE")  # weights whose 64-row tiles overfill a wave: the wide form (`rsw_tile`)
    plan = triton_plan(Scheme.parse("w4a16"), m, n, k, cuda, torch.bfloat16)
    wide = f"{tile['block_m']}-token tile: the register-operand Gluon kernel's wide persistent stream-K form"
    assert (wide in plan) == (n > 64 * 132), plan


def test_split_k_leaves_every_split_some_blocks():
    """split_k shares K's 128-K blocks out, every share non-empty: 3 blocks take 1 to 3 splits (4 would leave the
    last none), and the error says which are valid."""
    tw = to_triton_layout(quantize(torch.randn(64, 384) * 0.05, "w4a16"))
    for split in (0, 4):
        with pytest.raises(ValueError, match=f"split_k={split}: K=384 has 3 blocks of 128, so split_k must leave each "
                                             "split some \\(1 to 3\\)"):  # fmt: skip
            gemm_frag_rs(torch.randn(16, 384, dtype=torch.bfloat16), tw, block_m=16, split_k=split)


@pytest.mark.parametrize(
    "m, n, k, plan",
    [(96, 8192, 8192, "register-operand"), (128, 6144, 4096, "register-operand"),
     (128, 4096, 14336, "K split 2 ways"), (256, 28672, 4096, "warp-specialised"),
     (1024, 4096, 14336, "dequantize"), (1024, 28672, 4096, "dequantize"), (48, 8192, 8192, None)],
)  # fmt: skip
def test_bytes_route(fake_hopper, m, n, k, plan):
    """W8A16 (8-bit codes) on a faked Hopper: the register-operand kernel where `rs_tile` takes 8-bit codes (65-256
    rows), else the warp-specialised kernel's tile where `ws_tile` has one up to 512 rows (`WS_BYTES_MAX_M`), else
    dequantize + cuBLAS; at 33-64 rows no tile (the frag kernel's decode path), where 4-bit weights of the same shape
    take the register-operand kernel's. `anybit explain` says which, with the 64-K blocks of bytes."""
    import anybit.backends.triton as triton_backend
    from anybit.formats.scheme import Scheme
    from anybit.kernels.frag_rs import rs_scheme_why_not
    from anybit.tools.explain import triton_plan

    tw = to_triton_layout(quantize(torch.randn(64, 256) * 0.05, "w8a16"))
    assert rs_scheme_why_not(tw.kernel_scheme) is None
    assert frag_rs_why_not(tw, torch.bfloat16, torch.device("cuda")) is None
    tile = triton_backend.ws_route_tile(m, n, k, 132, bits=8)
    if plan is None:  # (the frag kernel's plan reads the tuning cache of a real device)
        assert tile is None and triton_backend.ws_route_tile(m, n, k, 132)["rs"]  # 4-bit codes: the kernel's
        return
    got = triton_plan(Scheme.parse("w8a16"), m, n, k, torch.device("cuda"), torch.bfloat16)
    assert bool((tile or {}).get("rs")) == (plan in ("register-operand", "K split 2 ways"))
    assert plan in got, got
    if tile and tile.get("rs"):
        assert "64-K blocks" in got and f"tile {tile['block_m']}x64x64" in got, got


@pytest.mark.parametrize("text, m", [("w4a16", 512), ("mxfp4", 300), ("nvfp4", 300), ("nvfp4", 449), ("w8a16", 512),
                                     ("w8a16", 300)])  # fmt: skip
def test_explain_says_the_route_at_257_to_512_rows(fake_hopper, text, m):
    """`anybit explain` on a faked H200 at 257-512 rows of a 4096x4096 weight: the register-operand kernel (`rs_tile`:
    two 192-token tiles to 384 rows, 256 above) for 4-bit and 8-bit codes."""
    from anybit.formats.scheme import Scheme
    from anybit.tools.explain import triton_plan

    got = triton_plan(Scheme.parse(text), m, 4096, 4096, torch.device("cuda"), torch.bfloat16)
    assert "register-operand" in got and f"{256 if m > 384 else 192}-token tile" in got, got


def test_a_call_whose_tiles_would_overfill_a_wave_runs_as_two_launches():
    """`rs_parts`: 257-384 rows of a weight whose 256-token tiles fit one wave only once (6144- and 8192-row, and K >=
    2N): the first 256 rows on `rs_tile(256)`'s tile, the rest on their own (at least 64 tokens); none where
    `rs_tile` takes the call (4096-row weights), on taller weights (`rs_tile(256)` does not run them) or past 384."""
    from anybit.kernels.frag_rs import rs_parts, rs_tile

    assert rs_parts(288, 8192, 8192) == dict(
        rs=True, parts=((256, dict(rs=True, block_m=256, stages=3)), (32, dict(rs=True, block_m=64, stages=6)))
    )
    assert rs_parts(384, 6144, 4096, bits=8)["parts"][1] == (128, dict(rs=True, block_m=128, stages=6))
    assert rs_parts(384, 8192, 28672)["parts"] == ((256, rs_tile(256, 8192, 28672)), (128, rs_tile(128, 8192, 28672)))
    assert rs_parts(321, 8192, 8192)["parts"][1] == (65, dict(rs=True, block_m=80, stages=6))
    for m, n, k in ((256, 8192, 8192), (385, 8192, 8192), (384, 4096, 4096), (300, 28672, 8192), (300, 28672, 4096)):
        assert rs_parts(m, n, k) is None, (m, n, k)


@pytest.mark.parametrize("on", [True, False])
def test_explain_says_two_launches(fake_hopper, monkeypatch, on):
    """`anybit explain` on a faked H200, W4A16 8192^2 at 384 rows: the two launches (ANYBIT_FRAG_RS_PARTS=0: the
    warp-specialised kernel's tile, as before)."""
    from anybit.formats.scheme import Scheme
    from anybit.tools.explain import triton_plan

    monkeypatch.setenv("ANYBIT_FRAG_RS_PARTS", "1" if on else "0")
    got = triton_plan(Scheme.parse("w4a16"), 384, 8192, 8192, torch.device("cuda"), torch.bfloat16)
    assert ("two launches" in got) == on, got
    if on:
        assert "rows 0-255: 4-bit fragment layout, 256-token tile" in got and "the other 128: " in got, got
    else:
        assert "warp-specialised" in got, got


def test_three_bit_blocks_are_rebuilt_from_the_units_the_loader_fetches():
    """3-bit codes (`W3`): block b's slot holds low unit b // 2 and high unit lo_units + b // 4 of its panel
    (`frag_ws_kernel._w_fetch`, rows of 256 words as `weight_descs` views them); `_block_words` rebuilds the 4-bit
    words from them by b's parity — the 4-bit layout of the same codes, every block of a K off the 512-K unit."""
    from anybit.kernels.frag_layout import HIGH1, LOW2, frag3_low_units, pack_frag3

    n, k = 2 * FRAG_PANEL, 640
    codes = torch.randint(0, 8, (n, k), dtype=torch.uint8)
    rows = pack_frag3(codes).to(torch.int64).reshape(-1, 256) & 0xFFFFFFFF  # the TMA descriptor's view
    want = from_panels(pack_frag(codes), n, FRAG_PANEL).to(torch.int64) & 0xFFFFFFFF
    nb, lo_units = pack_frag3(codes).shape[-1] // 16, frag3_low_units(k)
    for p in range(n // FRAG_PANEL):
        for b in range(-(-k // 128)):
            lo = rows[(p * nb + b // 2) * 4 : (p * nb + b // 2) * 4 + 4].reshape(64, 16)
            hi = rows[(p * nb + lo_units + b // 4) * 4 :][:4].reshape(64, 16)
            words = ((lo >> (2 * (b % 2))) & LOW2) | (((hi >> (b % 4)) & HIGH1) << 2)
            assert torch.equal(words, want[64 * p : 64 * (p + 1), 16 * b : 16 * (b + 1)])


def test_decode_offsets_are_the_magic_plus_the_code_bias():
    """The decode's packed subtraction (`frag_ws_kernel._ASM`): MAGIC (128 bf16, 1024 fp16) plus the bias of signed
    4-bit (8) and 3-bit (4) codes, in both halves; with zero points a register."""
    from anybit.kernels.frag_ws_kernel import _pairs_off

    for bf16, dtype, magic in ((True, torch.bfloat16, 128), (False, torch.float16, 1024)):
        for bias in (0, 4, 8):
            word = int(_pairs_off(bf16, bias), 16)
            halves = torch.tensor([word & 0xFFFF, word >> 16], dtype=torch.int32).to(torch.int16).view(dtype)
            assert halves.tolist() == [magic + bias] * 2
        assert _pairs_off(bf16, "zp") == "{$6, $6}"


@pytest.mark.parametrize("text, why", [
    ("w4a16:uint4:g128:bf16:zp-int", None), ("w3a16", None), ("w3a16:int3:g128:bf16", None),
    ("w4a16:int4:g128:fp16", None),  # scales of the other 16-bit type: rounded to x's once
    ("w8a16:int8:ch:bf16", None), ("w4a16:uint4:g128:bf16:zp-float", "integer zero points of 2- to 4-bit"),
    ("w8a16:uint8:ch:bf16:zp-int", "integer zero points of 2- to 4-bit"), ("w2a16", None),
    ("w2a16:int2:g256:bf16", None), ("w2a16:int2:g128:bf16", "(or every 64 K)"),
    ("w4a16:int4:g64:bf16", "whole 128-K blocks"), ("nvfp4", "integer weights"),
    ("w4a8:int4:g128:bf16", "integer weights"),
])  # fmt: skip
def test_integer_weights_the_kernel_decodes(monkeypatch, text, why):
    """`rs_int_why_not`: zero points (integer, 2 to 4 bits), 2- and 3-bit codes and scales of either 16-bit type —
    beyond the warp-specialised kernel's weights; the GPU is asked last (here: the CPU's reason). (2-bit codes with
    ANYBIT_RS_W2 on, as by default.)"""
    from anybit.formats.scheme import Scheme
    from anybit.kernels.frag_rs import rs_int_why_not

    monkeypatch.setenv("ANYBIT_RS_W2", "1")

    got = rs_int_why_not(Scheme.parse(text), 4096, 4096, torch.bfloat16, torch.device("cpu"))
    assert why in got if why else "GPU" in got


def test_zero_points_need_n_a_multiple_of_16():
    from anybit.formats.scheme import Scheme
    from anybit.kernels.frag_rs import rs_int_why_not

    why = rs_int_why_not(Scheme.parse("w3a16"), 4096, 4104, torch.bfloat16, torch.device("cpu"))
    assert "N=4104 must be a multiple of 16" in why
    assert "GPU" in rs_int_why_not(Scheme.parse("w3a16:int3:g128:bf16"), 4096, 4104, torch.bfloat16,
                                   torch.device("cpu"))  # fmt: skip


def test_three_bit_tiles_take_the_four_bit_rule():
    """`rs_tile` for 3-bit codes: the 4-bit rule; two 4 KB units a slot still leave 3 slots at 256 tokens (sm_90a: 217
    KB, 168 registers, no spill)."""
    from anybit.kernels.frag_rs import RS_MIN_STAGES, rs_stages, rs_tile

    assert [rs_stages(bm, bits=3) for bm in (64, 96, 128, 160, 192, 256)] == [6, 6, 5, 4, 3, 3]
    for m in range(33, 513):
        for n, k in ((4096, 4096), (8192, 8192), (8192, 28672), (28672, 8192)):
            t = rs_tile(m, n, k, bits=3)
            assert t == rs_tile(m, n, k, bits=4) if t is None else t["block_m"] == rs_tile(m, n, k)["block_m"]
            assert t is None or t["stages"] >= RS_MIN_STAGES


@pytest.mark.parametrize("text", ["w3a16", "w4a16:uint4:g128:bf16:zp-int", "w4a16:int4:g128:fp16", "w2a16"])
@pytest.mark.parametrize("m, n, k, plan", [(96, 8192, 8192, "register-operand"), (160, 4096, 14336, "K split 2"),
                                           (64, 8192, 8192, "register-operand"),
                                           (1024, 8192, 8192, "warp-specialised"),
                                           (256, 28672, 8192, "register-operand"),
                                           (512, 8192, 8192, "warp-specialised"),
                                           (640, 4096, 4096, "dequantize"),
                                           (200, 8192, 28672, "register-operand")])  # fmt: skip
def test_weights_only_the_register_operand_kernel_runs_route_there(fake_hopper, text, m, n, k, plan):
    """Zero points, 3-bit codes and scales of the other 16-bit type on a faked Hopper: the register-operand kernel
    where `rs_tile` takes the call (its route up to 256 rows, `rs_only_tile`), above that the warp-specialised
    kernel's row-major tiles (`ws_int_why_not`; never its swapped ones), else dequantize + cuBLAS (640 rows of
    4096 x 4096: its 256-row tiles would leave the last wave thin) — the backend's tile and `anybit explain`
    agree."""
    import anybit.backends.triton as triton_backend
    from anybit.formats.scheme import Scheme
    from anybit.tools.explain import triton_plan

    qw = quantize(torch.randn(64, 512) * 0.05, text)
    tw = to_triton_layout(qw, allow_frag3=True)
    assert frag_rs_why_not(tw, torch.bfloat16, torch.device("cuda")) is None
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    tw.n, tw.k = n, k  # (the route reads the shape only)
    tw.ws_ok.clear()
    tile = triton_backend.TritonBackend._ws_tile(x, tw)
    assert tw.ws_ok[torch.bfloat16] == (False, True, True)
    assert bool(tile and tile.get("rs")) == (plan in ("register-operand", "K split 2"))
    assert bool(tile and not tile.get("rs")) == (plan == "warp-specialised")
    assert not (tile and tile.get("swap"))
    got = triton_plan(Scheme.parse(text), m, n, k, torch.device("cuda"), torch.bfloat16)
    assert plan in got, got
    if plan != "dequantize":  # what is particular to the weight, said
        notes = {"w3a16": "1-bit plane", "w4a16:uint4:g128:bf16:zp-int": "zero points subtracted"}
        two = "four 64-K steps" if plan == "warp-specialised" else "half of a 256-K block"
        notes |= {"w4a16:int4:g128:fp16": "fp16 scales rounded to bfloat16", "w2a16": two}
        assert notes[text] in got, got


@pytest.mark.parametrize("text, rs", [("w3a16", True), ("w4a16:uint4:g128:bf16:zp-int", False)])
def test_three_bit_codes_take_the_kernel_from_33_rows_on_every_shape(fake_hopper, text, rs):
    """`rs_only_tile`: 33-64 rows of tall or long-K weights — 4-bit codes keep the frag kernel's decode tiles there,
    3-bit ones (whose decode costs more) take this kernel (H200, session 34: 28672x8192 M=64 117.7 -> 102.7 µs)."""
    import anybit.backends.triton as triton_backend

    for n, k in ((28672, 8192), (8192, 28672)):
        tile = triton_backend.ws_route_tile(64, n, k, 132, bits=3 if rs else 4, ws=False)
        assert bool(tile and tile["rs"]) == rs


def test_two_bit_halves_decode_to_the_four_bit_pairs():
    """2-bit codes (`W2`): kernel block b is half h = b % 2 of the layout's 256-K block b // 2 — each row's words
    2h and 2h + 1 (`_half_words`), whose pairs (j, l) at shifts 2j + 8l (`frag_ws_kernel._pairs2`) are the pairs j of
    the 4-bit words c = 2q + l; through `_a_operand`'s steps they are the block's codes in K order, and each word's
    64-K group is 2b + q (`_group_values`)."""
    n, k = FRAG_PANEL, 768
    codes = torch.randint(0, 4, (n, k), dtype=torch.uint8)
    words = from_panels(pack_frag(codes, bits=2), n, FRAG_PANEL).to(torch.int64) & 0xFFFFFFFF
    for b in range(k // 128):
        block = words[:, 16 * (b // 2) : 16 * (b // 2 + 1)].reshape(64, 4, 4)  # (row, t, q)
        h = b % 2
        half = block.reshape(64, 4, 2, 2).permute(0, 1, 3, 2)[..., h]  # words 2h + q, q = 0, 1
        pairs = [torch.stack([(half >> (2 * j + 8 * lo)) & 0x00030003 for lo in (0, 1)], -1).reshape(64, 4, 4)
                 for j in range(4)]  # fmt: skip
        v0, v1 = _halves_like_the_kernel(pairs)
        assert torch.equal(v0, codes[:, 128 * b : 128 * b + 64].to(torch.int64))
        assert torch.equal(v1, codes[:, 128 * b + 64 : 128 * (b + 1)].to(torch.int64))
        for q in (0, 1):  # word q's codes: K 64 q .. 64 q + 63 of the block, one 64-K group
            c = torch.cat([v0, v1], 1)[:, 64 * q : 64 * (q + 1)]
            assert torch.equal(c, codes[:, 128 * b + 64 * q : 128 * b + 64 * (q + 1)].to(torch.int64))


def test_two_bit_codes_switched_off_stay_off_the_route(fake_hopper, monkeypatch):
    """`RS_W2` off (ANYBIT_RS_W2=0): the route keeps W2A16 on the frag kernel's decode tiles and dequantize + cuBLAS,
    and says why."""
    import anybit.backends.triton as triton_backend
    from anybit.formats.scheme import Scheme
    from anybit.kernels.frag_rs import rs_int_why_not

    monkeypatch.setenv("ANYBIT_RS_W2", "0")

    assert "ANYBIT_RS_W2=0" in rs_int_why_not(Scheme.parse("w2a16"), 4096, 4096, torch.bfloat16, torch.device("cuda"))
    tw = to_triton_layout(quantize(torch.randn(64, 512) * 0.05, "w2a16"))
    assert "ANYBIT_RS_W2=0" in frag_rs_why_not(tw, torch.bfloat16, torch.device("cuda"))
    x = torch.empty(256, 8192, dtype=torch.bfloat16, device="meta")
    tw.n, tw.k = 8192, 8192
    assert triton_backend.TritonBackend._ws_tile(x, tw) is None
    from anybit.tools.explain import triton_plan

    got = triton_plan(Scheme.parse("w2a16"), 256, 8192, 8192, torch.device("cuda"), torch.bfloat16)
    assert "dequantize" in got and "register-operand kernel not used: 2-bit codes" in got, got


def _run_pairs_ptx(text: str, word: int, s: float, zo: float | None, dtype: torch.dtype) -> list[list[float]]:
    """The decode's inline PTX (`frag_ws_kernel._pairs_scaled`) run on the CPU: its mov / shr / lop3 0xea / packed
    sub / packed mul on one word, s (and zo) as 16-bit values of `dtype`; -> each output register's two halves."""

    def bits16(v: float) -> int:
        return int(torch.tensor([v]).to(dtype).view(torch.int16)[0]) & 0xFFFF

    def half(v: int) -> torch.Tensor:
        return torch.tensor([v & 0xFFFF], dtype=torch.int32).to(torch.int16).view(dtype).float()

    def packed(a: int, b: int, op) -> int:
        lo = bits16(float(op(half(a), half(b))))
        hi = bits16(float(op(half(a >> 16), half(b >> 16))))
        return lo | hi << 16

    regs = {"$4": word, "$5": bits16(s), "$6": bits16(zo) if zo is not None else 0}
    for line in text.strip("{}\n").splitlines():
        op, _, args = line.rstrip(";").partition(" ")
        a = [t.strip() for t in args.replace("{", "").replace("}", "").split(",")]
        if op == ".reg":
            continue
        if op == "mov.b32":
            regs[a[0]] = regs[a[1]] | regs[a[2]] << 16 if len(a) == 3 else int(a[1], 16)
        elif op == "shr.u32":
            regs[a[0]] = regs[a[1]] >> int(a[2])
        elif op == "lop3.b32":
            assert a[4] == "0xea"  # (a & b) | c
            regs[a[0]] = (regs[a[1]] & regs[a[2]]) | regs[a[3]]
        elif op.startswith("sub.rn."):
            regs[a[0]] = packed(regs[a[1]], regs[a[2]], torch.sub)
        elif op.startswith("mul.rn."):
            regs[a[0]] = packed(regs[a[1]], regs[a[2]], torch.mul)
        else:
            raise AssertionError(f"unknown instruction {line}")
    return [[float(half(regs[f"${j}"])), float(half(regs[f"${j}"] >> 16))] for j in range(4)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width, bias", [(4, 0), (4, 8), (4, 4), (4, "zp"), (2, 0), (2, 2), (2, "zp")])
def test_decode_ptx_gives_each_pair_code_less_bias_times_scale(dtype, width, bias):
    """The packed decode's PTX, run instruction by instruction on the CPU: pair j of a 4-bit word is nibbles j and
    j + 4; of a 2-bit word's half l, fields j + 4l and j + 4l + 8 (`frag_layout._frag_order`) — each (code - bias or
    zero point) * s rounded once to x's dtype (as the GPU runs give them: tests/kernels/test_frag_*_gpu.py)."""
    from anybit.kernels.frag_ws_kernel import _ASM

    g = torch.Generator().manual_seed(width * 7 + (bias if isinstance(bias, int) else 3))
    magic = 128.0 if dtype == torch.bfloat16 else 1024.0
    for _ in range(20):
        word = int(torch.randint(0, 2**32, (1,), generator=g, dtype=torch.int64))
        s = float(torch.randn(1, generator=g).to(dtype))
        z = int(torch.randint(0, 2**width, (1,), generator=g)) if bias == "zp" else None
        off = z if z is not None else bias
        for half_l in (0, 1) if width == 2 else (0,):
            text = _ASM[(dtype == torch.bfloat16, bias, width, half_l)]
            got = _run_pairs_ptx(text, word, s, None if z is None else magic + z, dtype)
            for j in range(4):
                f = (j + 4 * half_l, j + 4 * half_l + 8) if width == 2 else (j, j + 4)
                codes = [(word >> (width * i)) & ((1 << width) - 1) for i in f]
                want = [float(torch.tensor([(c - off) * s]).to(dtype)) for c in codes]
                assert got[j] == want, (j, half_l, codes, got[j], want)
