"""The warp-specialised large-M W4A8 kernel (`anybit.kernels.frag_ws_a8`): the Gluon kernel runs only on a Hopper
GPU (tests/kernels/test_frag_ws_a8_gpu.py); here, on the CPU, its decoder — the inline PTX's byte arithmetic and the
reshape / permute from words to the w slot's int32 columns — written in torch against the layout's unpacker and
e4m3's own reading of the bytes, and the reasons the kernel is not taken."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import to_triton_layout
from anybit.formats.scheme import Scheme
from anybit.kernels.frag_layout import FRAG_PANEL, from_panels, pack_frag
from anybit.kernels.frag_ws_a8 import frag_ws_a8_why_not, gemm_frag_ws_a8, rsw_a8_tile, ws_a8_plan, ws_a8_tile

M32 = 0xFFFFFFFF


def _prmt_sign(a: torch.Tensor) -> torch.Tensor:
    """prmt.b32 d, a, 0, 0xBA98: each byte of d is bit 7 of that byte of a, replicated."""
    return sum(((a >> (8 * i + 7)) & 1) * (0xFF << (8 * i)) for i in range(4))


def _decode_signed(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`_A8_SIGNED` step by step on int64 words (32-bit arithmetic)."""
    out = []
    for a, src in (((w << 4) & M32, w), (w >> 4, None)):
        m = (w if src is not None else a) & 0x07070707
        n = (0x88888888 - m) & M32
        p = _prmt_sign(a if src is not None else w)
        out.append((m & p) | (n & ~p & M32))  # LOP3 0xE4
    return out[0], out[1]


def _decode_unsigned(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return w & 0x0F0F0F0F, (w >> 4) & 0x0F0F0F0F


def _slot_bytes(r0: torch.Tensor, r1: torch.Tensor) -> torch.Tensor:
    """The decoder's join / reshape / permute (gl.join = stack on a new last dim) -> [R, 32] int32 columns ->
    [R, 128] bytes in memory order."""
    rows = r0.shape[0]
    v = torch.stack([r0, r1], -1).reshape(rows, 4, 4, 2).permute(0, 2, 3, 1).reshape(rows, 32)
    return torch.stack([(v >> (8 * i)) & 0xFF for i in range(4)], -1).reshape(rows, 128)


def _operand_bytes(r0: torch.Tensor, r1: torch.Tensor) -> torch.Tensor:
    """The register-operand kernel's `_a8_operand` after the decode: bytes [R, 4 (t), 4 (c), 4 (i)] of words 4t + c
    (pack=4: byte i of the word in, byte i of each register out), joined (j) and permuted to (row, c, j, t, i) ->
    [R, 128] in K order."""
    rows = r0.shape[0]
    b0, b1 = (torch.stack([(r >> (8 * i)) & 0xFF for i in range(4)], -1).reshape(rows, 4, 4, 4) for r in (r0, r1))
    return torch.stack([b0, b1], -1).permute(0, 2, 4, 1, 3).reshape(rows, 128)


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize("order", [_slot_bytes, _operand_bytes], ids=["w-slot", "register-operand"])
def test_decoded_bytes_are_e4m3_of_the_codes_over_512_in_k_order(signed, order):
    """The decode, then the shared-memory kernels' w slot order or the register-operand kernel's A operand order."""
    codes = torch.randint(0, 16, (FRAG_PANEL, 256), dtype=torch.uint8)
    codes[0, :16] = torch.arange(16)  # every code once
    words = from_panels(pack_frag(codes, a8=True), FRAG_PANEL, FRAG_PANEL).to(torch.int64) & M32
    for b in range(2):
        r0, r1 = (_decode_signed if signed else _decode_unsigned)(words[:, 16 * b : 16 * (b + 1)])
        got = order(r0, r1).to(torch.uint8).view(torch.float8_e4m3fn).double() * 512
        want = codes[:, 128 * b : 128 * (b + 1)].double() - (8 if signed else 0)
        assert torch.equal(got, want)


def _table(sel: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """prmt.b32 d, lo, hi, sel on int64 words (selector nibbles' bit 3 clear): byte n of d is byte (sel >> 4n) & 7 of
    the eight bytes hi:lo."""
    table = lo | (hi << 32)
    return sum(((table >> (8 * ((sel >> (4 * n)) & 7))) & 0xFF) << (8 * n) for n in range(4))


def test_e2m1_register_operand_bytes_are_e4m3_of_the_values_in_k_order():
    """`frag_rs_a8_kernel._E2M1_RS` step by step (each word's group table from its row-relative code, then
    `frag_decode._E2M1_A8`) and the register operand's byte order: e4m3 of each e2m1 value times 2**(r + 6)."""
    from anybit.kernels.frag_decode import _LUT_HI_BASE, _LUT_HI_STEP, _LUT_LO_BASE, _LUT_LO_STEP, E2M1_A8_SHIFT

    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (FRAG_PANEL, 256), dtype=torch.uint8, generator=g)
    codes[0, :16] = torch.arange(16)  # every code once
    rel = torch.randint(127 - 11, 128, (FRAG_PANEL, 256 // 32), generator=g)  # 127 + r, r in [-11, 0]
    words = from_panels(pack_frag(codes, a8=True, e2m1=True), FRAG_PANEL, FRAG_PANEL).to(torch.int64) & M32
    mags = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    for b in range(2):
        w = words[:, 16 * b : 16 * (b + 1)]
        c = rel[:, 4 * b : 4 * (b + 1)].repeat(1, 4)  # word 4t + g is group g
        lo = (c * _LUT_LO_STEP.value + _LUT_LO_BASE.value) & M32
        hi = (c * _LUT_HI_STEP.value + _LUT_HI_BASE.value) & M32
        m = w & 0x77777777
        r0 = _table(m, lo, hi) | (w & 0x80808080)
        r1 = _table(m >> 16, lo, hi) | ((w << 4) & 0x80808080)
        got = _operand_bytes(r0, r1).to(torch.uint8).view(torch.float8_e4m3fn).double()
        q = codes[:, 128 * b : 128 * (b + 1)].long()
        r = rel[:, 4 * b : 4 * (b + 1)].repeat_interleave(32, 1) - 127
        want = torch.where(q >= 8, -1.0, 1.0).double() * mags[q & 7] * torch.exp2((r + E2M1_A8_SHIFT).double())
        assert torch.equal(got, want)


def test_register_operand_options_are_checked():
    tw = to_triton_layout(quantize(torch.randn(256, 512), "w4a8"))
    x = torch.randn(4, 512).half()
    with pytest.raises(ValueError, match="wide=True"):
        gemm_frag_ws_a8(x, tw, rs=True)
    with pytest.raises(ValueError, match="tokens=128: only the register-operand kernel"):
        gemm_frag_ws_a8(x, tw, wide=True, tokens=128)
    with pytest.raises(ValueError, match="64, 128 or 256"):
        gemm_frag_ws_a8(x, tw, wide=True, rs=True, tokens=96)
    with pytest.raises(ValueError, match="persistent=True is the register-operand .* rs=True"):
        gemm_frag_ws_a8(x, tw, wide=True, persistent=True)
    with pytest.raises(ValueError, match="head=True .* persistent=True"):
        gemm_frag_ws_a8(x, tw, wide=True, rs=True, head=True)
    with pytest.raises(ValueError, match="diag=1: the timing-only variants are the one-tile kernel's"):
        gemm_frag_ws_a8(x, tw, wide=True, rs=True, persistent=True, diag=1)
    with pytest.raises(ValueError, match="cvt=True .* wide=True"):
        gemm_frag_ws_a8(x, tw, cvt=True)
    mx = to_triton_layout(quantize(torch.randn(256, 512) * 0.05, "w4a8-mxfp4"))
    assert mx.e2m1_a8
    with pytest.raises(ValueError, match="e2m1 weights on the FP8 MMA run on the register-operand kernel only"):
        gemm_frag_ws_a8(x, mx, wide=True)
    mx = to_triton_layout(quantize(torch.randn(1000, 512) * 0.05, "w4a8-mxfp4"))
    with pytest.raises(ValueError, match="N=1000: e2m1 weights' uint8 scale rows"):
        gemm_frag_ws_a8(x, mx, wide=True, rs=True)


@pytest.mark.parametrize("text, why", [("w4a8", "CUDA GPU")])  # on this machine: the CPU
def test_why_not_on_the_cpu(text, why):
    tw = to_triton_layout(quantize(torch.randn(256, 512), text))
    assert why in frag_ws_a8_why_not(tw.scheme, tw.k, tw.n, torch.device("cpu"))


def test_plan_names_why_not(monkeypatch):
    cpu = torch.device("cpu")
    assert "CUDA GPU" in ws_a8_plan(Scheme.parse("w4a8"), 128, 8192, 8192, cpu)[1]
    assert "CUDA GPU" in ws_a8_plan(Scheme.parse("w4a8"), 1024, 8192, 8192, cpu)[1]  # the wide kernel's rows
    assert "512 < M <= ANYBIT_FRAG_WS_A8_WIDE_MAX_M=65536" in ws_a8_plan(Scheme.parse("w4a8"), 512, 8192, 8192, cpu)[1]
    assert "CUDA GPU" in ws_a8_plan(Scheme.parse("w4a8"), 4096, 8192, 8192, cpu)[1]  # the register-operand kernel's
    assert "ANYBIT_FRAG_WS_A8_WIDE_MAX_M=65536" in ws_a8_plan(Scheme.parse("w4a8"), 1 << 17, 8192, 8192, cpu)[1]
    monkeypatch.setenv("ANYBIT_FRAG_RS_A8", "0")  # the warp-specialised wide kernel alone: up to 1536 rows
    assert "ANYBIT_FRAG_WS_A8_WIDE_MAX_M=1536" in ws_a8_plan(Scheme.parse("w4a8"), 4096, 8192, 8192, cpu)[1]
    monkeypatch.setenv("ANYBIT_FRAG_WS_A8_MAX_M", "0")
    assert "ANYBIT_FRAG_WS_A8_MAX_M=0" in ws_a8_plan(Scheme.parse("w4a8"), 128, 8192, 8192, cpu)[1]
    monkeypatch.setenv("ANYBIT_FRAG_WS_A8_WIDE_MAX_M", "0")
    assert "ANYBIT_FRAG_WS_A8_WIDE_MAX_M=0" in ws_a8_plan(Scheme.parse("w4a8"), 1024, 8192, 8192, cpu)[1]
    monkeypatch.setenv("ANYBIT_FRAG_WS_A8_MAX_M", "lots")
    with pytest.raises(ValueError, match="ANYBIT_FRAG_WS_A8_MAX_M='lots'"):
        ws_a8_plan(Scheme.parse("w4a8"), 128, 8192, 8192, cpu)


def test_the_register_operand_switch_picks_the_wide_tile(monkeypatch):
    monkeypatch.delenv("ANYBIT_FRAG_RS_A8", raising=False)
    assert ws_a8_tile(1024, 8192, wide=True) == {"wide": True, "rs": True, "cvt": True}  # the default
    assert "rs" not in ws_a8_tile(128, 8192)  # the narrow kernel's tiles are its own
    monkeypatch.setenv("ANYBIT_FRAG_RS_A8", "0")  # the warp-specialised wide kernel
    assert ws_a8_tile(1024, 8192, wide=True) == {"wide": True}
    monkeypatch.setenv("ANYBIT_FRAG_RS_A8", "2")  # its stream-K form
    assert ws_a8_tile(1024, 8192, wide=True) == {"wide": True, "rs": True, "cvt": True, "persistent": True}
    monkeypatch.setenv("ANYBIT_FRAG_RS_A8", "3")
    with pytest.raises(ValueError, match="ANYBIT_FRAG_RS_A8='3': expected one of 0, 1, 2"):
        ws_a8_tile(1024, 8192, wide=True)


def test_the_stream_k_form_takes_its_measured_weights_at_33_to_256_rows_by_default(monkeypatch):
    monkeypatch.delenv("ANYBIT_FRAG_RSW_A8_MAX_M", raising=False)
    tall, square = (18432, 7168), (8192, 8192)  # 144 / 64 tiles of 128 rows on 132 SMs: only the first overfills a wave
    assert [rsw_a8_tile(m, *tall) and rsw_a8_tile(m, *tall)["tokens"] for m in (32, 33, 64, 65, 128, 256, 257)] == [
        None, 64, 64, 128, 128, 128, None]  # fmt: skip
    assert rsw_a8_tile(100, *tall) == dict(wide=True, rs=True, persistent=True, tokens=128, cvt=True)
    assert rsw_a8_tile(40, *tall)["cvt"] is False
    assert rsw_a8_tile(64, *square) is None and rsw_a8_tile(64, 64 * 132, 8192) is None
    assert rsw_a8_tile(64, 64 * 132 + 16, 16384) is not None and rsw_a8_tile(64, 6416, 16384, num_sms=100) is not None
    assert rsw_a8_tile(64, 28672, 4096) is None  # 54 128-K steps a CTA: too few to share
    assert rsw_a8_tile(64, 28672, 8192) is None  # 224 tiles: one wave of two CTAs an SM, the route's
    assert rsw_a8_tile(64, 160 * 132, 16384) is not None and rsw_a8_tile(64, 160 * 132 + 16, 16384) is None
    assert rsw_a8_tile(64, *tall, e2m1=True) is None  # MXFP4: up to 64 rows only where asked
    # 65-256 rows: every 4-bit weight (int4, MXFP4) with >= 16 128-K steps a CTA
    assert rsw_a8_tile(65, *square, e2m1=True)["tokens"] == 128 and rsw_a8_tile(256, *tall, e2m1=True) is not None
    assert rsw_a8_tile(128, 7168, 7168) is not None and rsw_a8_tile(64, 7168, 7168) is None  # 24 steps a CTA
    assert rsw_a8_tile(128, *square) is not None and rsw_a8_tile(200, 28672, 8192) is not None
    assert rsw_a8_tile(128, 28672, 4096) is not None
    assert rsw_a8_tile(128, 4096, 4096) is None and rsw_a8_tile(128, 4096, 4096, e2m1=True) is None  # 8 steps a CTA
    monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", "512")  # asked: every weight, any N (at most 256 rows)
    assert rsw_a8_tile(64, *square)["tokens"] == 64 and rsw_a8_tile(200, *square, e2m1=True)["tokens"] == 128
    assert rsw_a8_tile(64, 28672, 4096) is not None and rsw_a8_tile(257, *square) is None
    monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", "0")  # off
    assert rsw_a8_tile(64, *tall) is None
    monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", "many")
    with pytest.raises(ValueError, match="ANYBIT_FRAG_RSW_A8_MAX_M='many'"):
        rsw_a8_tile(64, *tall)


def test_explain_names_the_stream_k_rule_for_mxfp4(monkeypatch):
    from anybit.tools.explain import _rs_e2m1_plan

    monkeypatch.delenv("ANYBIT_FRAG_RSW_A8_MAX_M", raising=False)
    monkeypatch.delenv("ANYBIT_FRAG_RS_A8", raising=False)
    plan = _rs_e2m1_plan(128, 8192, 8192, torch.device("cpu"))  # (132 SMs where the device has none)
    assert "stream-K form" in plan and "65-256 rows of weights with >= 16 128-K steps a CTA" in plan
    assert _rs_e2m1_plan(64, 8192, 8192, torch.device("cpu")) is None  # 33-64 rows: the frag kernel's
    monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", "256")
    assert "ANYBIT_FRAG_RSW_A8_MAX_M=256 (every weight)" in _rs_e2m1_plan(64, 8192, 8192, torch.device("cpu"))


def test_explain_says_why_the_w4a8_kernel_is_not_used():
    from anybit.tools.explain import triton_plan

    plan = triton_plan(Scheme.parse("w4a8"), 128, 8192, 8192, torch.device("cpu"), torch.bfloat16)
    assert "warp-specialised W4A8 kernel not used: a Gluon kernel: a CUDA GPU" in plan


@pytest.mark.parametrize("text", ["w4a8:int4:g128:fp32:e4m3-static", "w4a16"])
def test_a_weight_in_another_layout_is_named(text):
    tw = to_triton_layout(quantize(torch.randn(256, 512), text, input_scale=0.01 if "static" in text else None))
    with pytest.raises(ValueError, match="FP8 fragment layout"):
        gemm_frag_ws_a8(torch.randn(4, 512).half(), tw)
