"""Large-M dequantize + cuBLAS with the dequantize pass hidden under the GEMM: W's rows in C chunks, a side stream
dequantizes chunk i + 1 while the current stream's cuBLAS multiplies chunk i into y's columns (`torch.mm(out=y[:,
a:b])`, row stride N: no copy). Against the route's one dequantize then one GEMM, cuBLAS alone on W dequantized once
(the ceiling) and Humming, one GPU call:

    python tools/probe_overlap.py [--scheme w4a16] [--shapes 8192x8192,28672x8192,8192x28672] [--m 2048,4096,8192]
                                  [--chunks 2,4,8] [--peers humming] [--graph]

The chunks are weights of their own (W's row ranges quantized apart: the same codes and scales as the rows of the
whole), so the probe needs no library change. Every cell is checked against the exact product of its first rows and
relaunched bit for bit; writes DIR/probe_overlap.json.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import humming_peers, probe_parser, relaunch_check, time_cells, write_probe  # noqa: E402

from anybit import quantize  # noqa: E402
from anybit.backends.triton_layout import to_triton_layout  # noqa: E402
from anybit.formats.scheme import Scheme  # noqa: E402
from anybit.kernels.frag_dequant import dequantize_frag  # noqa: E402


def overlapped(x: torch.Tensor, chunks: list, rows: list, side: torch.Stream) -> torch.Tensor:
    """y = x @ W^T with chunk i's dequantize (side stream) under chunk i - 1's GEMM (current stream)."""
    cur = torch.cuda.current_stream()
    y = torch.empty(x.shape[0], rows[-1][1], device=x.device, dtype=x.dtype)
    side.wait_stream(cur)  # (x is written on the current stream)
    ws, done = [], []
    with torch.cuda.stream(side):
        for tw in chunks:
            ws.append(dequantize_frag(tw, dtype=x.dtype))
            done.append(torch.cuda.Event())
            done[-1].record(side)
    for (a, b), w, ev in zip(rows, ws, done, strict=True):
        cur.wait_event(ev)
        torch.mm(x, w.t(), out=y[:, a:b])
        w.record_stream(cur)  # (allocated on the side stream, last read here)
    return y


def main() -> int:
    ap = probe_parser(__doc__, "w4a16", "2048,4096,8192", "", "humming", "humming, none")
    ap.add_argument("--chunks", default="2,4,8")
    args = ap.parse_args()
    dev = torch.device("cuda")
    scheme = Scheme.parse(args.scheme)
    side = torch.cuda.Stream()
    rows, errors = [], {}
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        w = torch.randn(n, k, device=dev) * 0.02
        tw = to_triton_layout(quantize(w, scheme), allow_frag3=True)
        parts = {}
        for c in (int(v) for v in args.chunks.split(",")):
            step = -(-n // c // 64) * 64  # (64-row panels)
            bounds = [(a, min(n, a + step)) for a in range(0, n, step)]
            parts[c] = ([to_triton_layout(quantize(w[a:b], scheme), allow_frag3=True) for a, b in bounds], bounds)
        wd = dequantize_frag(tw, dtype=torch.bfloat16)
        humm = humming_peers([w], scheme, args.peers, errors, shape)
        exact = quantize(w, scheme).dequantize().double()
        del w
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev).bfloat16()
            ref = x[:64].double() @ exact.T
            cells = {
                "dequant+cublas": [lambda x=x, t=tw: torch.nn.functional.linear(x, dequantize_frag(t, dtype=x.dtype))],
                "cublas-bf16 (W dequantized once)": [lambda x=x, wd=wd: torch.nn.functional.linear(x, wd)],
            }
            if humm:
                cells["humming"] = [lambda x=x, h=humm[0]: h(x)]
            for c, (chunks, bounds) in parts.items():
                call = lambda x=x, ch=chunks, b=bounds: overlapped(x, ch, b, side)  # noqa: E731
                why = relaunch_check(call, ref)
                if why:
                    errors[f"overlap {c} {shape} M={m}"] = why
                    continue
                cells[f"overlap {c} chunks"] = [call]
            rows += time_cells(cells, n, k, m, args.graph)
    print(write_probe(args.out, "probe_overlap", rows, errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
