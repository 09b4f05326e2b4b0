"""W4A8 and FP8-block at large M: the route (W4A8: quantizer + codes pass + cuBLAS's 1x128 block-scaled GEMM;
FP8-block: quantizer + cuBLAS's 128x128 one) against the Triton FP8 GEMMs with the accumulator rescaled per 128-K
block (`anybit.kernels.a8_rescale`, opt-in), whole calls and the GEMMs alone (x quantized and W4A8's codes written
once), each checked against the exact product of the route's own quantized x and a relaunch bit for bit; CUDA-graph
µs over weight copies beyond L2, and TF/s.

    python tools/probe_a8_rescale.py [--schemes w4a8,fp8-block] [--shapes 8192x8192] [--m 1024,4096]
                                     [--tiles "block_m=128:num_stages=3"]

--tiles: `;`-separated tile variants besides each kernel's default (`A8_RESCALE_TILE`, `BLOCK_RESCALE_TILE`;
FP8-block skips those of more than 128 weight rows). Writes DIR/probe_a8_rescale.json.
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
from anybit.kernels.a8_rescale import (  # noqa: E402
    A8_RESCALE_TILE,
    BLOCK_RESCALE_TILE,
    gemm_a8_rescale,
    gemm_block_rescale,
    rescale_gemm,
)
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
        return lambda: rescale_gemm(x, t, **tile)

    def gemm(t, c, tile):
        if t.nk:  # FP8-block: the weight as stored
            return lambda: gemm_block_rescale(xq, xs, t, **(BLOCK_RESCALE_TILE | tile))
        return lambda: gemm_a8_rescale(xq, xs, c, t, **(A8_RESCALE_TILE | tile))

    out = {"route": (route(preps[0]), [route(p) for p in preps])}
    for name, tile in variants:
        if tws[0].nk and tile.get("block_n", 128) > 128:  # (FP8-block: a tile lies in one weight scale block)
            continue
        out[f"call {name}"] = (whole(tws[0], tile), [whole(t, tile) for t in tws])
        pairs = zip(tws, codes, strict=True)  # (FP8-block: no codes)
        out[f"gemm {name}"] = (gemm(tws[0], codes[0], tile), [gemm(t, c, tile) for t, c in pairs])
    return out


def _shape(scheme: str, shape: str, args, variants: list, errors: dict) -> list:
    """The rows of one scheme and N x K at each M (errors: what failed, by cell)."""
    dev = torch.device("cuda")
    n, k = (int(v) for v in shape.split("x"))
    qws = [anybit.quantize(torch.randn(n, k, device=dev) * 0.02, scheme) for _ in range(args.copies)]
    preps = [anybit.prepare(qw) for qw in qws]
    codes = [None if p.data.nk else dequantize_frag(p.data, dtype=torch.float8_e4m3fn) for p in preps]
    rows = []
    for m in (int(v) for v in args.m.split(",")):
        x = torch.randn(m, k, device=dev).bfloat16()
        xq, xs = quantize_act(x, qws[0].scheme.act)
        ref = dequantize_activation(xq[:256], xs[:256], qws[0].scheme.act).double() @ qws[0].dequantize().double().T
        flop = 2 * m * n * k
        row, line = dict(scheme=scheme, n=n, k=k, m=m), []
        for what, (one, fns) in _calls(x, xq, xs, preps, codes, variants).items():
            try:
                err, same = relaunch_err(one, ref)
                why = relaunch_why(err, same)
                if why:
                    raise RuntimeError(why)
                us = _us(fns)
            except Exception as ex:  # report and go on
                errors[f"{scheme} {shape} M={m} {what}"] = str(ex)[:300]
                continue
            row[what] = dict(us=us, tflops=flop / us / 1e6, err=err)
            line.append(f"{what} {us:7.1f} ({flop / us / 1e6:5.0f})")
        print(f"{scheme:9s} {shape:11s} M={m:5d}  " + "  ".join(line), flush=True)
        rows.append(row)
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default="w4a8,fp8-block")
    ap.add_argument("--shapes", default="8192x8192,28672x8192,7168x7168,18432x7168")
    ap.add_argument("--m", default="1024,4096")
    ap.add_argument("--tiles", default="block_m=128:num_stages=3;block_n=256:block_m=128")
    ap.add_argument("--copies", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    variants = [("default", {})] + [(v, tile_overrides(v)) for v in filter(None, args.tiles.split(";"))]
    rows, errors = [], {}
    for scheme in args.schemes.split(","):
        for shape in args.shapes.split(","):
            rows += _shape(scheme, shape, args, variants, errors)
    write_probe(args.out, "probe_a8_rescale", rows, errors)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
