"""The large-M W4A8 Gluon kernels (narrow, wide, its register-operand twin and that one's stream-K form) on a Hopper
GPU: against float64 products of the kernels' own quantized x and `dequantize()`, awkward shapes (M, N off the tile,
K off the 128-K block), int4 / uint4, channel / 128 / 256-K scales in fp32 and bf16, fp16 x, bias, every tile option
(the stream-K form on few CTAs, so tiles are summed from three parts and more, and on more CTAs than SMs), poisoned
outputs, bit-equal relaunches; the wide kernels' rescale over many binades and their refusal, the backend's routing
to each."""

import pytest
import torch

from anybit.backends.triton_layout import to_triton_layout
from anybit.formats.scheme import Scheme
from anybit.kernels.frag_ws_a8 import frag_ws_a8_why_not, gemm_frag_ws_a8, ws_a8_tile
from tests.kernels.test_frag_ws_gpu import SM90_GPU, random_case
from tests.kernels.test_gemm_a8 import a8_reference
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = SM90_GPU

# the narrow kernel, the wide one, the wide one with the weight as the register operand, its stream-K form
RSW = dict(wide=True, rs=True, persistent=True)
KERNELS = pytest.mark.parametrize(
    "kernel", [{}, dict(wide=True), dict(wide=True, rs=True), RSW], ids=["narrow", "wide", "rs", "rsw"]
)


def _case(text, m, n, k, dtype=torch.bfloat16, seed=0):
    x, qw = random_case(text, m, n, k, dtype, seed)
    return x, qw, to_triton_layout(qw)


@pytest.mark.parametrize("text", ["w4a8", "w4a8:uint4:g128:fp32:e4m3-token", "w4a8:int4:ch:fp32:e4m3-token",
                                  "w4a8:int4:g256:fp32:e4m3-token", "w4a8:int4:g128:bf16:e4m3-token"])  # fmt: skip
@pytest.mark.parametrize("m, n, k", [(1, 256, 512), (13, 4160, 1024), (257, 1000, 1536), (1024, 2048, 4224),
                                     (600, 4224, 7168)])  # fmt: skip
@KERNELS
def test_matches_the_exact_product(text, m, n, k, kernel):
    if "g256" in text:
        k = 2048
    x, qw, tw = _case(text, m, n, k, seed=m + n)
    assert frag_ws_a8_why_not(tw.scheme, tw.k, tw.n, x.device) is None
    out = torch.full((m, n), float("nan"), device="cuda", dtype=x.dtype)
    y = gemm_frag_ws_a8(x, tw, out=out, **kernel)
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y, gemm_frag_ws_a8(x, tw, **kernel))  # relaunch: the same bits


@pytest.mark.parametrize("m, n, k", [(1, 256, 512), (257, 1008, 1536), (1024, 2048, 4224), (600, 4224, 7168),
                                     (40, 3008, 2080)])  # fmt: skip
@pytest.mark.parametrize("kernel", [dict(wide=True, rs=True), RSW, RSW | dict(tokens=64, cvt=True)],
                         ids=["rs", "rsw", "rsw64"])  # fmt: skip
def test_mxfp4_weights_by_their_groups_tables(m, n, k, kernel):
    """W4A8-MXFP4 (e2m1 codes, ue8m0 scales per 32-K group) decoded into the register operand by each group's
    table of e4m3 bytes (`TritonWeight.e2m1_a8`), the rows' powers of two after the K loop; N off the tile, K off
    the 128-K block."""
    x, qw, tw = _case("w4a8-mxfp4", m, n, k, seed=m + n)
    assert tw.e2m1_a8
    out = torch.full((m, n), float("nan"), device="cuda", dtype=x.dtype)
    y = gemm_frag_ws_a8(x, tw, out=out, **kernel)
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]
    assert torch.equal(y, gemm_frag_ws_a8(x, tw, **kernel))


@KERNELS
def test_fp16_x_and_a_k_tail(kernel):
    x, qw, tw = _case("w4a8:int4:ch:fp32:e4m3-token", 300, 1000, 2880, torch.float16)  # 22.5 blocks of 128
    assert rel_err(gemm_frag_ws_a8(x, tw, **kernel), a8_reference(x, qw)) < GEMM_REL_ERR[torch.float16]


@pytest.mark.parametrize("tile", [dict(stages=3), dict(stages=5), dict(group_m=1), dict(order=1), dict(order=2),
                                  dict(early_scales=False), dict(block_n=64), dict(wide=True, rs=True, stages=2),
                                  dict(wide=True, rs=True, stages=5, group_m=1), RSW | dict(head=True),
                                  RSW | dict(ctas=7), RSW | dict(ctas=7, head=True), RSW | dict(tokens=128, stages=3),
                                  RSW | dict(ctas=200), RSW | dict(cvt=True), RSW | dict(cvt=True, tokens=128),
                                  dict(wide=True, rs=True, cvt=True), dict(wide=True, cvt=True)])  # fmt: skip
def test_every_tile_with_bias(tile):
    x, qw, tw = _case("w4a8", 777, 3000, 2048, seed=3)
    b = torch.randn(3000, device="cuda").bfloat16()
    y = gemm_frag_ws_a8(x, tw, b, **tile)
    assert rel_err(y, a8_reference(x, qw) + b.double()) < GEMM_REL_ERR[torch.bfloat16]


def test_channel_scales_accumulate_the_whole_k_in_the_wgmma():
    x, qw, tw = _case("w4a8:int4:ch:fp32:e4m3-token", 513, 2048, 8192, seed=5)
    y = gemm_frag_ws_a8(x, tw, promote=False)
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]


def test_not_taken_with_a_reason():
    _, _, tw = _case("w4a8:uint4:g64:fp16:zp-int:e4m3-token", 16, 256, 512)
    assert "zero points" in frag_ws_a8_why_not(tw.scheme, tw.k, tw.n, torch.device("cuda"))
    for text in ("w4a8:int4:g128:bf16:e4m3-g128", "w4a8:int4:g128:fp32:e4m3-static"):
        scheme = Scheme.parse(text)
        assert "per token only" in frag_ws_a8_why_not(scheme, 512, 256, torch.device("cuda"))


def _captured_on_fresh_x(be, x, p, qw):
    """The backend's call captured in a CUDA graph and replayed on fresh x: still the exact product."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        yg = be.gemm(x, p)
    x.copy_(torch.randn_like(x))
    graph.replay()
    assert rel_err(yg, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("m", [65, 200, 256, 513, 1024])
def test_the_triton_backend_routes_w4a8_here_and_captures(m, monkeypatch):
    from anybit import prepare
    from anybit.backends import get_backend

    monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", "0")  # (GPUs of < 128 SMs would take the stream-K form here)
    x, qw, _ = _case("w4a8", m, 8192, 1024, seed=m)
    p = prepare(qw, backend="triton")
    be = get_backend("triton")
    y = be.gemm(x, p)
    wide = m > 512  # (there the register-operand kernel by default, `ws_a8_tile`)
    assert p.data.ws_ok.get("a8-wide" if wide else "a8") is True
    assert torch.equal(y, gemm_frag_ws_a8(x, p.data, **(ws_a8_tile(m, 8192, wide=True) if wide else {})))
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]
    _captured_on_fresh_x(be, x, p, qw)
    monkeypatch.setenv("ANYBIT_FRAG_WS_A8_MAX_M", "0")  # the block-scaled route instead: the same product
    monkeypatch.setenv("ANYBIT_FRAG_WS_A8_WIDE_MAX_M", "0")
    assert rel_err(be.gemm(x, p), a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]


@pytest.mark.parametrize("level, kernel", [("0", dict()), ("1", dict(rs=True, cvt=True)),
                                           ("2", dict(rs=True, cvt=True, persistent=True))])  # fmt: skip
def test_the_backend_takes_the_register_operand_kernel_when_asked_and_captures(level, kernel, monkeypatch):
    from anybit import prepare
    from anybit.backends import get_backend

    monkeypatch.setenv("ANYBIT_FRAG_RS_A8", level)
    x, qw, _ = _case("w4a8", 1024, 8192, 1024, seed=9)
    p = prepare(qw, backend="triton")
    be = get_backend("triton")
    y = be.gemm(x, p)
    assert torch.equal(y, gemm_frag_ws_a8(x, p.data, wide=True, **kernel))
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]
    _captured_on_fresh_x(be, x, p, qw)


# asked (the variable set): any weight, here 7168 x 2048; by default: tall int4 weights, DeepSeek-V3's 18432 x 7168 the
# rule was measured on (144 tiles of 128 rows, 61 steps a CTA), and at 65-256 rows 7168^2 (int4 below the narrow
# kernel's N, MXFP4)
@pytest.mark.parametrize("scheme, asked, n, k, m", [("w4a8", "256", 7168, 2048, m) for m in (33, 64, 100, 256)]
                         + [("w4a8", None, 18432, 7168, m) for m in (40, 64, 200)]
                         + [(s, None, 7168, 7168, 130) for s in ("w4a8", "w4a8-mxfp4")])  # fmt: skip
def test_the_backend_takes_the_stream_k_form_at_few_rows_and_captures(scheme, asked, n, k, m, monkeypatch):
    from anybit import prepare
    from anybit.backends import get_backend
    from anybit.kernels.frag import sm_count
    from anybit.kernels.frag_ws_a8 import rsw_a8_tile

    if asked is None:
        monkeypatch.delenv("ANYBIT_FRAG_RSW_A8_MAX_M", raising=False)
    else:
        monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", asked)
    sms = sm_count(torch.device("cuda"))
    e2m1 = scheme == "w4a8-mxfp4"
    tile = rsw_a8_tile(m, n, k, sms, e2m1)
    if tile is None:
        pytest.skip(f"the default rule leaves {n}x{k} to the other routes on {sms} SMs")
    x, qw, _ = _case(scheme, m, n, k, seed=m)
    p = prepare(qw, backend="triton")
    be = get_backend("triton")
    y = be.gemm(x, p)
    assert p.data.ws_ok.get("a8-e2m1" if e2m1 else "a8-wide") is True
    assert torch.equal(y, gemm_frag_ws_a8(x, p.data, **tile))
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]
    _captured_on_fresh_x(be, x, p, qw)


@pytest.mark.parametrize("m, switch, value", [(64, "ANYBIT_FRAG_RSW_A8_MAX_M", "256"), (1024, "ANYBIT_FRAG_RS_A8", "1"),
                                              (1024, "ANYBIT_FRAG_RS_A8", "2")])  # fmt: skip
def test_the_backend_takes_mxfp4_on_the_register_operand_kernels_when_asked(m, switch, value, monkeypatch):
    from anybit import prepare
    from anybit.backends import get_backend
    from anybit.tools.explain import triton_plan

    monkeypatch.setenv(switch, value)
    x, qw, _ = _case("w4a8-mxfp4", m, 8192, 1024, seed=m)
    p = prepare(qw, backend="triton")
    be = get_backend("triton")
    y = be.gemm(x, p)
    assert p.data.ws_ok.get("a8-e2m1") is True
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]
    _captured_on_fresh_x(be, x, p, qw)
    plan = triton_plan(Scheme.parse("w4a8-mxfp4"), m, 8192, 1024, x.device, torch.bfloat16)
    assert "register-operand W4A8 Gluon kernel" in plan and f"{switch}={value}" in plan


@pytest.mark.parametrize("kernel", [{}, dict(rs=True), dict(rs=True, persistent=True)], ids=["wide", "rs", "rsw"])
def test_the_wide_kernel_rescales_blocks_over_many_binades_with_bias(kernel):
    """Each (weight row, 128-K block) times 2**u, u in [-8, 8]: the accumulator's units change by up to 2**16 from
    one block to the next; fp16 x; bias."""
    g = torch.Generator(device="cuda").manual_seed(11)
    n, k, m = 1000, 4096, 333
    w = torch.randn(n, k, generator=g, device="cuda") * 0.05
    w = w * torch.exp2(torch.randint(-8, 9, (n, k // 128, 1), generator=g, device="cuda").float()).repeat_interleave(
        128, 2).reshape(n, k)  # fmt: skip
    from anybit import quantize

    qw = quantize(w, "w4a8")
    tw = to_triton_layout(qw)
    assert tw.rescale
    x = torch.randn(m, k, generator=g, device="cuda").half()
    b = torch.randn(n, generator=g, device="cuda").half()
    y = gemm_frag_ws_a8(x, tw, b, wide=True, stages=2, **kernel)
    assert rel_err(y, a8_reference(x, qw) + b.double()) < GEMM_REL_ERR[torch.float16]


def test_the_wide_kernel_refuses_scales_it_cannot_rescale_by():
    x, qw, tw = _case("w4a8", 256, 256, 512)
    qw.scales[0, 0] = 0.0
    tw = to_triton_layout(qw)
    assert not tw.rescale
    with pytest.raises(ValueError, match="rescale"):
        gemm_frag_ws_a8(x, tw, wide=True)
    with pytest.raises(ValueError, match="rescale"):
        gemm_frag_ws_a8(x, tw, wide=True, rs=True)
    with pytest.raises(ValueError, match="wide=True"):
        gemm_frag_ws_a8(x, tw, rs=True)
    from anybit import prepare
    from anybit.backends import get_backend

    p = prepare(qw, backend="triton")
    x = torch.randn(600, 512, device="cuda").bfloat16()
    y = get_backend("triton").gemm(x, p)  # the codes pass + cuBLAS instead
    assert p.data.ws_ok["a8-wide"] is False
    assert rel_err(y, a8_reference(x, qw)) < GEMM_REL_ERR[torch.bfloat16]


def test_explain_names_the_register_operand_kernel_when_asked(monkeypatch):
    from anybit.tools.explain import triton_plan

    device = torch.device("cuda")
    plan = triton_plan(Scheme.parse("w4a8"), 1024, 8192, 8192, device, torch.bfloat16)  # the default
    assert "register-operand W4A8 Gluon kernel" in plan and "ANYBIT_FRAG_RS_A8=1" in plan
    monkeypatch.setenv("ANYBIT_FRAG_RS_A8", "0")
    assert "wide warp-specialised W4A8" in triton_plan(Scheme.parse("w4a8"), 1024, 8192, 8192, device, torch.bfloat16)
    monkeypatch.setenv("ANYBIT_FRAG_RS_A8", "2")
    plan = triton_plan(Scheme.parse("w4a8"), 1024, 8192, 8192, device, torch.bfloat16)
    assert "stream-K" in plan and "ANYBIT_FRAG_RS_A8=2" in plan
    monkeypatch.setenv("ANYBIT_FRAG_RSW_A8_MAX_M", "256")
    plan = triton_plan(Scheme.parse("w4a8"), 64, 8192, 8192, device, torch.bfloat16)
    assert "stream-K form" in plan and "ANYBIT_FRAG_RSW_A8_MAX_M=256" in plan and "64 tokens a tile" in plan
