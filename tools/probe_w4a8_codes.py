"""int4 W4A8 as `codes_a16` (ANYBIT_W4A8_CODES=1: x's e4m3 codes in bf16 on the A16 kernels, as NVFP4 runs) against
its FP8-MMA route, W4A16's route and Humming's W4A8, one GPU call — the evidence to turn the switch on by default (or
not) per M and shape.

    python tools/probe_w4a8_codes.py [--shapes 4096x4096,6144x4096,4096x14336] [--m 1,16,64,128,256,1024] [--graph]

The codes route is first checked against the product of the quantized x and the bf16-rounded scales and relaunched
bit for bit. Writes DIR/probe_w4a8_codes.json.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import humming_peers, probe_parser, relaunch_check, time_cells, write_probe  # noqa: E402

import anybit  # noqa: E402
from anybit.formats.scheme import Scheme  # noqa: E402
from anybit.kernels.quant_act import quantize_act  # noqa: E402


def prepare_codes(qw):
    """The weight prepared with ANYBIT_W4A8_CODES=1 (read when prepared)."""
    saved = os.environ.get("ANYBIT_W4A8_CODES")
    os.environ["ANYBIT_W4A8_CODES"] = "1"
    try:
        p = anybit.prepare(qw, backend="triton")
    finally:
        if saved is None:
            del os.environ["ANYBIT_W4A8_CODES"]
        else:
            os.environ["ANYBIT_W4A8_CODES"] = saved
    if not p.data.codes_a16:
        raise ValueError(f"{qw.scheme} N={qw.n}: not laid out as codes (int4_codes_scheme, N < 8192)")
    return p


def main() -> int:
    ap = probe_parser(__doc__, "w4a8", "1,16,64,128,256,1024", "", "humming", "humming, none")
    ap.set_defaults(shapes="4096x4096,6144x4096,4096x14336", copies=2)
    args = ap.parse_args()
    dev = torch.device("cuda")
    scheme = Scheme.parse(args.scheme)
    rows, errors = [], {}
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        ws = [torch.randn(n, k, device=dev) * 0.02 for _ in range(args.copies)]
        q8 = [anybit.quantize(w, scheme) for w in ws]
        p8 = [anybit.prepare(q, backend="triton") for q in q8]
        pc = [prepare_codes(q) for q in q8]
        p16 = [anybit.prepare(anybit.quantize(w, "w4a16"), backend="triton") for w in ws]
        humm = humming_peers(ws, scheme, args.peers, errors, shape)
        del ws
        rounded = dataclasses.replace(q8[0], scales=q8[0].scales.to(torch.bfloat16).to(q8[0].scales.dtype))
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev).bfloat16()
            xq, xs = quantize_act(x[:64], scheme.act)
            ref = (xq.double() * xs.double()) @ rounded.dequantize().double().T
            cells = {"w4a8 route": [lambda p=p, x=x: anybit.gemm(x, p) for p in p8]}
            why = relaunch_check(lambda x=x, p=pc[0]: anybit.gemm(x, p), ref)
            if why is None:
                cells["w4a8 as codes"] = [lambda p=p, x=x: anybit.gemm(x, p) for p in pc]
            else:
                errors[f"codes {shape} M={m}"] = why
            cells["w4a16 route"] = [lambda p=p, x=x: anybit.gemm(x, p) for p in p16]
            if humm:
                cells["humming w4a8"] = [lambda h=h, x=x: h(x) for h in humm]
            rows += time_cells(cells, n, k, m, args.graph)
    print(write_probe(args.out, "probe_w4a8_codes", rows, errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
