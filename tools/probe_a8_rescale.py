"""W4A8 at large M: the route (quantizer + codes pass + cuBLAS's 1x128 block-scaled GEMM) against the codes pass + the
Triton FP8 GEMM with the accumulator rescaled per 128-K block (`anybit.kernels.a8_rescale`, opt-in), whole calls and
the GEMMs alone (x quantized and the codes written once), each checked against the exact product of the route's own
quantized x and a relaunch bit for bit; CUDA-graph µs over weight copies beyond L2, and TF/s.

    python tools/probe_a8_rescale.py [--shapes 8192x8192] [--m 1024,4096] [--tiles "block_m=128:num_stages=3"]

--tiles: `;`-separated `a8_rescale` tile variants besides its default (`A8_RESCALE_TILE`). Writes
DIR/probe_a8_rescale.json.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import relaunch_err, relaunch_why, tile_overrides, write_probe  # noqa: E402

import anybit  # noqa: E402
from anybit.bench.timing import median, time_graph  # noqa: E402
from anybit.kernels.a8_rescale import A8_RESCALE_TILE, a8_rescale_gemm, gemm_a8_rescale  # noqa: E402
from anybit.kernels.frag_dequant import dequantize_frag  # noqa: E402
from anybit.kernels.quant_act import quantize_act  # noqa: E402
from anybit.quant.activations import dequantize_activation  # noqa: E402


def _us(fns) -> float:
    return median(time_graph(fns, 20, 9, 20))


def _calls(x, xq, xs, preps, codes, variants) -> dict:
    """what -> (one call, the calls over the weight copies): the route, and per tile variant the whole rescaled call
    and its GEMM alone."""
    tws = [p.data for p in preps]

    def route(p):
        return lambda: anybit.gemm(x, p)

    def whole(t, tile):
        return lambda: a8_rescale_gemm(x, t, **tile)

    def gemm(t, c, tile):
        return lambda: gemm_a8_rescale(xq, xs, c, t, **(A8_RESCALE_TILE | tile))

    out = {"route": (route(preps[0]), [route(p) for p in preps])}
    for name, tile in variants:
        out[f"call {name}"] = (whole(tws[0], tile), [whole(t, tile) for t in tws])
        pairs = zip(tws, codes, strict=True)
        out[f"gemm {name}"] = (gemm(tws[0], codes[0], tile), [gemm(t, c, tile) for t, c in pairs])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8192x8192,28672x8192,7168x7168,18432x7168")
    ap.add_argument("--m", default="1024,4096")
    ap.add_argument("--tiles", default="block_m=128:num_stages=3;block_n=256:block_m=128")
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    variants = [("default", {})] + [(v, tile_overrides(v)) for v in filter(None, args.tiles.split(";"))]
    rows, errors = [], {}
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        qws = [anybit.quantize(torch.randn(n, k, device=dev) * 0.02, "w4a8") for _ in range(args.copies)]
        preps = [anybit.prepare(qw) for qw in qws]
        codes = [dequantize_frag(p.data, dtype=torch.float8_e4m3fn) for p in preps]
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev).bfloat16()
            xq, xs = quantize_act(x, qws[0].scheme.act)
            ref = dequantize_activation(xq[:256], xs[:256], qws[0].scheme.act).double() @ qws[0].dequantize().double().T
            flop = 2 * m * n * k
            row = dict(n=n, k=k, m=m)
            calls = _calls(x, xq, xs, preps, codes, variants)
            line = []
            for what, (one, fns) in calls.items():
                try:
                    err, same = relaunch_err(one, ref)
                    why = relaunch_why(err, same)
                    if why:
                        raise RuntimeError(why)
                    us = _us(fns)
                except Exception as ex:  # report and go on
                    errors[f"{shape} M={m} {what}"] = str(ex)[:300]
                    continue
                row[what] = dict(us=us, tflops=flop / us / 1e6, err=err)
                line.append(f"{what} {us:7.1f} ({flop / us / 1e6:5.0f})")
            print(f"{shape:11s} M={m:5d}  " + "  ".join(line), flush=True)
            rows.append(row)
        del qws, preps, codes
        torch.cuda.empty_cache()
    write_probe(args.out, "probe_a8_rescale", rows, errors)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
