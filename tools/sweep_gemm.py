"""Sweep the dense (not fragment-layout) GEMM kernel's tiles on the GPU — FP8 weights read as stored
(w8a8-fp8), bit-plane weights — against the route and the humming backend on the same weights
(CUDA-graph µs per call, weight copies beyond L2), to set `default_config` / `a8_config`.

    python tools/sweep_gemm.py --scheme w8a8-fp8 [--shapes 8192x8192,28672x8192] [--m 1,16,64]
        [--tiles BMxBNxBKxWARPSxSTAGES,...] [--splits 1,2,4,8] [--out DIR]

Every tile is checked against the exact product and a bit-equal relaunch before it is timed. Prints
per (shape, M): the route's time, the best swept tile, humming; writes DIR/sweep_gemm_<scheme>.json.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from sweep_frag import COPIES, _time, checked_time, humming_copies, note_tile, write_sweep  # noqa: E402

import anybit  # noqa: E402
from anybit.backends import get_backend  # noqa: E402
from anybit.kernels.gemm import GemmConfig  # noqa: E402

TILES = "16x128x128x4x4,16x128x256x4x3,16x64x256x4x4,16x256x128x8x3,16x128x128x4x6,16x64x128x4x6"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="w8a8-fp8")
    ap.add_argument("--shapes", default="8192x8192,28672x8192,8192x28672", help="NxK,...")
    ap.add_argument("--m", default="1,16")
    ap.add_argument("--tiles", default=TILES, help="BMxBNxBKxWARPSxSTAGES,...")
    ap.add_argument("--splits", default="1,2,4,8")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    tri = get_backend("triton")
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
    splits = [int(v) for v in args.splits.split(",")]
    rows, summary = [], []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        qw = anybit.quantize(torch.randn(n, k, device="cuda") * 0.02, args.scheme)
        preps = [anybit.prepare(qw, backend="triton") for _ in range(COPIES)]
        hum = humming_copies(qw)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = tri.gemm(x, preps[0]).double()  # the route, itself checked by the GPU tests
            res = {"route": _time(tri, x, preps)}
            for bm, bn, bk, warps, stages in tiles:
                for split in splits:
                    cfg = GemmConfig(bm, bn, bk, split, num_warps=warps, num_stages=stages)
                    us = checked_time(tri, x, preps, cfg, ref)
                    if us is None:
                        continue
                    name = f"bm{bm} bn{bn} bk{bk} w{warps} s{stages} sk{split}"
                    rows.append(dict(n=n, k=k, m=m, bm=bm, bn=bn, bk=bk, warps=warps, stages=stages, split=split,
                                     us=us))  # fmt: skip
                    note_tile(res, n, k, m, name, us)
            if hum:
                res["humming"] = _time(get_backend("humming"), x, hum)
            floor = (n * k * qw.scheme.weight_bits / 8 + 2 * m * (n + k)) / 4.2e12 * 1e6
            summary.append(dict(n=n, k=k, m=m, floor_us=floor, **res))
            b = res.setdefault("best", (float("nan"), "none ran"))
            print(f"{n}x{k} M={m:<3d} floor {floor:6.1f}  route {res['route']:6.1f}  best {b[0]:6.1f} {b[1]:28s} "
                  f"humming {res.get('humming', float('nan')):6.1f}", flush=True)  # fmt: skip
    write_sweep(args.out, f"sweep_gemm_{args.scheme}", rows, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
