"""Check the 8-bit frag kernel on 8/16-warp tiles (wrong, run-to-run different results with channel scales in the
epilogue, BENCHMARKS.md sessions 14-15; now `CHANNEL_AS_BLOCKS`) on small and real shapes, also under
`compute-sanitizer` (racecheck / memcheck / synccheck).

    python tools/probe_w8_warps.py [--shapes 512x4096,6144x4096] [--m 128] [--tile 128x128x8x3] [--split 1]
        [--first-failing] [--pdl]

Prints per shape the relative error against the exact product, whether a relaunch is bit-equal and which
rows / columns are wrong; --first-failing stops after the first failing shape (for the sanitizer: fewer
launches to trace).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import anybit  # noqa: E402
from anybit.kernels import frag  # noqa: E402


def _call(x, tw, args, ws, cnt):
    """One launch of the tile under test into a NaN-poisoned output."""
    bm, bn, warps, stages = (int(v) for v in args.tile.split("x"))
    y = torch.full((x.shape[0], tw.n), float("nan"), device="cuda", dtype=torch.bfloat16)
    return frag.gemm_frag(x, tw, block_m=bm, block_n=bn, split_k=args.split, num_warps=warps, num_stages=stages,
                          workspace=ws, counters=cnt, out=y, pdl=args.pdl)  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="w8a16")
    ap.add_argument("--shapes", default="512x4096,1024x4096,6144x4096,8192x8192")
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--tile", default="128x128x8x3", help="BMxBNxWARPSxSTAGES")
    ap.add_argument("--split", type=int, default=1)
    ap.add_argument("--first-failing", action="store_true")
    ap.add_argument("--pdl", action="store_true", help="launch as a programmatic dependent (the route's default)")
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        torch.manual_seed(0)
        qw = anybit.quantize(torch.randn(n, k, device="cuda") * 0.02, args.scheme)
        tw = anybit.prepare(qw, backend="triton").data
        x = torch.randn(args.m, k, device="cuda").bfloat16()
        ref = x.double() @ qw.dequantize().double().T
        ws = torch.empty(args.split * args.m * n, device="cuda", dtype=torch.float32)
        cnt = torch.zeros(4096, device="cuda", dtype=torch.int32)

        y1, y2 = (_call(x, tw, args, ws, cnt) for _ in range(2))
        torch.cuda.synchronize()
        err = float((y1.double() - ref).norm() / ref.norm())
        bad = (y1.double() - ref).abs() > 0.05 * ref.abs().max()
        rows = bad.any(1).nonzero().flatten().tolist()
        cols = bad.any(0).nonzero().flatten().tolist()
        same = bool(torch.equal(y1, y2))
        print(
            f"{args.scheme} {n}x{k} M={args.m} tile {args.tile} sk{args.split}: rel err {err:.2e}, relaunch equal "
            f"{same}, bad rows {len(rows)} (first {rows[:8]}), bad cols {len(cols)} (first {cols[:8]})",
            flush=True,
        )
        if args.first_failing and (err > 1e-2 or not same):
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
