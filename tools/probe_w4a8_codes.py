"""Would int4 W4A8 weights run faster as `codes_a16` (x's e4m3 codes in bf16 on the A16 kernels, as NVFP4 does) than on
their FP8-MMA route? One GPU call, before building it: for each shape and M, W4A8's route (`anybit.gemm`), the estimate
of the codes route — the quantizer writing codes in bf16, then the A16 route of a W4A16 weight of the same shape with
x's row scales in its epilogue (above 64 rows the very launchers it would take: `dequant_matmul`'s rs / ws / dequantize
+ cuBLAS; at 64 rows or fewer the frag decode without the row scales, whose epilogue costs ~nothing) —, W4A16's route,
and Humming's W4A8.

    python tools/probe_w4a8_codes.py [--shapes 4096x4096,6144x4096,4096x14336] [--m 1,16,64,128,256,1024] [--graph]

The codes cells above 64 rows are checked against their exact product (x as quantized, the W4A16 weight dequantized).
Writes DIR/probe_w4a8_codes.json.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import probe_parser, time_cells, write_probe  # noqa: E402

import anybit  # noqa: E402
from anybit.backends import get_backend  # noqa: E402
from anybit.formats.scheme import Scheme  # noqa: E402
from anybit.kernels.quant_act import quantize_act  # noqa: E402

REL_BUDGET = 1.6e-2  # bf16 outputs (tests/tolerances.py GEMM_REL_ERR)


def main() -> int:
    ap = probe_parser(__doc__, "w4a8", "1,16,64,128,256,1024", "", "humming", "humming, none")
    ap.set_defaults(shapes="4096x4096,6144x4096,4096x14336", copies=2)
    args = ap.parse_args()
    dev = torch.device("cuda")
    act = Scheme.parse("w4a8").act
    backend = get_backend("triton")
    rows, errors = [], {}
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        ws = [torch.randn(n, k, device=dev) * 0.02 for _ in range(args.copies)]
        p8 = [anybit.prepare(anybit.quantize(w, "w4a8")) for w in ws]
        q16 = [anybit.quantize(w, "w4a16") for w in ws]
        p16 = [anybit.prepare(q) for q in q16]
        humm = None
        if "humming" in args.peers:
            try:
                from anybit.bench.peers import humming

                humm = [humming(w, Scheme.parse("w4a8")) for w in ws]
            except Exception as ex:  # reported, not hidden
                errors[f"humming {shape}"] = f"{type(ex).__name__}: {ex}"
        del ws
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev).bfloat16()
            cells = {
                "w4a8 route": [lambda p=p, x=x: anybit.gemm(x, p) for p in p8],
                "w4a16 route": [lambda p=p, x=x: anybit.gemm(x, p) for p in p16],
            }

            def codes(p, x=x, m=m):
                xq, xs = quantize_act(x, act, codes_dtype=x.dtype)
                if m <= 64:  # the frag decode (its row-scale epilogue left out)
                    return anybit.gemm(xq, p)
                tw = p.data
                return backend.dequant_matmul(xq, tw, None, xs, backend._ws_tile(xq, tw))

            if m > 64:
                xq, xs = quantize_act(x, act, codes_dtype=x.dtype)
                ref = (xq.double() * xs.double()) @ q16[0].dequantize().double().T
                err = float((codes(p16[0]).double() - ref).norm() / ref.norm())
                if err > REL_BUDGET:
                    errors[f"codes {shape} M={m}"] = f"relative error {err:.3g} > {REL_BUDGET}"
            cells["codes route (estimate)"] = [lambda p=p: codes(p) for p in p16]
            if humm:
                cells["humming w4a8"] = [lambda h=h, x=x: h(x) for h in humm]
            rows += time_cells(cells, n, k, m, args.graph)
    print(write_probe(args.out, "probe_w4a8_codes", rows, errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
