"""The warp-specialised large-M kernel (`anybit.kernels.frag_ws`): the Gluon kernel itself runs only on a
Hopper GPU (tests/kernels/test_frag_ws_gpu.py); here, on the CPU, the decoder's word -> K order written
with the same reshape / permute / split / join steps in torch against the layout's own unpacker, and the
reasons the kernel is not taken."""

import pytest
import torch

from anybit import quantize
from anybit.backends.triton_layout import to_triton_layout
from anybit.kernels.frag_layout import FRAG_PANEL, from_panels, pack_frag
from anybit.kernels.frag_ws import frag_ws_why_not, ws_tile


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
MEASURED = {(128, 28672): 128, (128, 8192): 128, (128, 4096): None, (256, 28672): 256, (256, 8192): 128,
            (256, 4096): None, (512, 8192): 256, (512, 6144): None, (512, 4096): None, (1024, 8192): 256,
            (1024, 6144): None, (1024, 4096): 256, (1024, 28672): 256}  # fmt: skip


@pytest.mark.parametrize("m, n", sorted(MEASURED))
def test_tile_rule_follows_the_h200_sweeps(m, n):
    tile = ws_tile(m, n, 132)
    assert (tile["block_m"] if tile else None) == MEASURED[(m, n)]
