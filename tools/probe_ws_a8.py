"""The W4A8 Gluon kernels (`anybit.kernels.frag_ws_a8`: warp-specialised and register-operand, one-tile and stream-K)
against the backend's route as the environment's switches set it (`route`: `backend.gemm`), row-wise FP8
`_scaled_mm` on x quantized once (the bare FP8 GEMM the targets are stated against) and Humming W4A8, one GPU call.

    python tools/probe_ws_a8.py [--shapes 8192x8192,28672x8192,8192x28672] [--m 256,1024,4096,8192]
                                [--tiles "stages=5;stages=6"] [--peers humming] [--graph] [--out DIR]

Tiles are `gemm_frag_ws_a8` options, ";" between variants and ":" inside one: "" the narrow kernel, "wide=1" the
wide one, "wide=1:rs=1" its register-operand twin (`frag_rs_a8_kernel`; "tokens=128", "stages=5" …),
"wide=1:rs=1:persistent=1" that one's stream-K form (`frag_rsw_a8_kernel`; "head=1", "ctas=…"), ":cvt=1" on any wide
kernel its y stored 16 bytes a thread. `--scheme w4a8-mxfp4`: MXFP4 weights, on the register-operand kernels only
("wide=1:rs=1[:persistent=1]"). The routes before session 53's defaults: ANYBIT_FRAG_RS_A8=0 (above 512 rows: the
warp-specialised wide kernel up to 1536, then the codes pass + cuBLAS's 1x128 GEMM; MXFP4 the e4m3 pass + cuBLAS
row-wise) and ANYBIT_FRAG_RSW_A8_MAX_M=0 (33-256 rows: the frag kernel / the narrow warp-specialised kernel).

Every ws variant is first checked against the exact product (float64, the kernel's own quantized x and
`dequantize()`, 64 rows) and relaunched bit for bit; then eager CUDA-event medians over weight copies that do
not fit L2 together. Prints µs and TF/s per cell, writes DIR/probe_ws_a8.json.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import (  # noqa: E402
    humming_peers,
    probe_parser,
    relaunch_err,
    relaunch_why,
    tile_overrides,
    time_cells,
    write_probe,
)

from anybit import prepare, quantize  # noqa: E402
from anybit.backends import get_backend  # noqa: E402
from anybit.bench.peers import torch_fp8  # noqa: E402
from anybit.formats.scheme import Scheme  # noqa: E402
from anybit.kernels.frag_ws_a8 import frag_ws_a8_why_not, gemm_frag_ws_a8, rs_e2m1_why_not  # noqa: E402
from anybit.kernels.quant_act import quantize_act  # noqa: E402
from anybit.quant.activations import dequantize_activation  # noqa: E402


def main() -> int:
    ap = probe_parser(__doc__, "w4a8", "256,1024,4096,8192", "stages=5", "humming,scaled_mm,route,quantizer",
                      "humming, scaled_mm, route, quantizer")  # fmt: skip
    args = ap.parse_args()
    dev = torch.device("cuda")
    scheme = Scheme.parse(args.scheme)
    backend = get_backend("triton")
    rows, errors = [], {}
    tiles = [tile_overrides(part) for part in args.tiles.split(";")] if args.tiles else [{}]
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        ws = [torch.randn(n, k, device=dev) * 0.02 for _ in range(args.copies)]
        qws = [quantize(w, scheme) for w in ws]
        preps = [prepare(qw, backend="triton") for qw in qws]
        tws = [p.data for p in preps]
        e2m1 = tws[0].e2m1_a8  # MXFP4 (by its groups' tables): the register-operand kernels only
        why = rs_e2m1_why_not(tws[0], dev) if e2m1 else frag_ws_a8_why_not(tws[0].scheme, tws[0].k, tws[0].n, dev)
        if why:
            errors[shape] = why
            continue
        peers = {}
        humm = humming_peers(ws, scheme, args.peers, errors, shape)
        if humm:
            peers["humming"] = humm
        if "scaled_mm" in args.peers:
            peers["scaled_mm row-wise (x quantized once)"] = [torch_fp8(w, quantize_x=False) for w in ws]
        del ws
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev).bfloat16()
            xq, xs = quantize_act(x[:64], scheme.act)
            ref = dequantize_activation(xq, xs, scheme.act).double() @ qws[0].dequantize().double().T
            cells = {name: [lambda f=f, x=x: f(x) for f in fns] for name, fns in peers.items()}
            if "route" in args.peers:
                # the backend's call as routed now (the switches in the environment decide: e.g. set
                # ANYBIT_FRAG_RS_A8=0 / ANYBIT_FRAG_RSW_A8_MAX_M=0 for the routes before the register-operand kernels)
                cells["route (backend.gemm)"] = [lambda p=p, x=x: backend.gemm(x, p) for p in preps]
            if "quantizer" in args.peers:
                cells["quantizer alone"] = [lambda x=x: quantize_act(x, scheme.act)]
            for tile in tiles:
                name = "ws-a8 " + (":".join(f"{a}={b}" for a, b in tile.items()) or "default")
                try:
                    err, same = relaunch_err(lambda t=tile, x=x, tw=tws[0]: gemm_frag_ws_a8(x, tw, **t), ref)
                    print(f"{name} {shape} M={m}: rel err {err:.3e} against float64, relaunch equal {same}")
                    why = relaunch_why(err, same)
                    if why is not None and not tile.get("diag"):  # diag variants time wrong results
                        errors[f"{name} {shape} M={m}"] = why
                        continue
                    cells[name] = [lambda tw=tw, t=tile, x=x: gemm_frag_ws_a8(x, tw, **t) for tw in tws]
                except Exception as ex:
                    errors[f"{name} {shape} M={m}"] = f"{type(ex).__name__}: {str(ex)[:400]}"
            rows += time_cells(cells, n, k, m, args.graph, width=38)
    print(write_probe(args.out, "probe_ws_a8", rows, errors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
