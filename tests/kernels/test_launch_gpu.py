"""`Launcher` on a Hopper GPU: every route of `anybit.gemm` (frag decode and mid tiles, the register-operand and the
warp-specialised kernels, split-K; W4A8's quantizer, FP8 kernels and codes pass) gives the same bits launched past
`JITFunction.run` as through it, with calls of other M (another specialisation: M == 1, M a multiple of 16) between
them. Run with ANYBIT_LAUNCH_CHECK=1 as well: each fast call then checks Triton's specialisation of every argument
against the compiling call's."""

import pytest
import torch

import anybit
from tests.kernels.test_frag_ws_gpu import SM90_GPU, random_case
from tests.tolerances import GEMM_REL_ERR, rel_err

pytestmark = SM90_GPU

MS = (1, 16, 1, 40, 64, 96, 160, 256, 33, 600, 1024, 17)


@pytest.mark.parametrize("text, n, k", [("w4a16", 4096, 4096), ("nvfp4", 4096, 14336), ("w4a16", 8192, 2048),
                                        ("mxfp4", 6144, 4096), ("w8a16", 4096, 4096), ("w4a8", 4096, 4096),
                                        ("w4a8", 8192, 2048), ("w4a8-nvfp4", 4096, 4096)])  # fmt: skip
def test_fast_launches_give_the_jit_launches_bits(text, n, k, monkeypatch):
    x, qw = random_case(text, max(MS), n, k, seed=n + k)
    p = anybit.prepare(qw, backend="triton")
    b = torch.randn(n, device="cuda").to(x.dtype)
    monkeypatch.setenv("ANYBIT_FAST_LAUNCH", "0")
    slow = [anybit.gemm(x[:m], p, b if m % 2 else None) for m in MS]
    monkeypatch.setenv("ANYBIT_FAST_LAUNCH", "1")
    for _ in range(2):  # the first round may compile or reuse, the second launches past the JIT
        fast = [anybit.gemm(x[:m], p, b if m % 2 else None) for m in MS]
        for m, ys, yf in zip(MS, slow, fast, strict=True):
            assert torch.equal(ys, yf), f"M={m}"
    xr = x
    if qw.scheme.act.quantized:  # against x as the quantizer gives it (e4m3 per token: the same on every route)
        from anybit.kernels.quant_act import quantize_act

        xq, xs = quantize_act(x, qw.scheme.act)
        xr = xq.double() * xs.double()
    ref = xr.double() @ qw.dequantize().double().T
    for m, y in zip(MS, fast, strict=True):
        want = ref[:m] + (b.double() if m % 2 else 0)
        assert rel_err(y, want) < GEMM_REL_ERR[torch.bfloat16], f"M={m}"


def test_an_x_off_16_bytes_is_copied_for_the_tma_kernels():
    """x viewed 2 bytes into a buffer (a serving engine's slice) still runs the register-operand / warp-specialised
    route — copied aligned — and gives the aligned x's bits."""
    x, qw = random_case("w4a16", 256, 4096, 4096, seed=3)
    p = anybit.prepare(qw, backend="triton")
    buf = torch.empty(x.numel() + 1, device="cuda", dtype=x.dtype)
    off = buf[1:].view(x.shape)
    off.copy_(x)
    assert off.data_ptr() % 16 and torch.equal(anybit.gemm(off, p), anybit.gemm(x, p))
