"""Sweep the A16 GEMM's small-M tiles on the GPU (CUDA-graph µs per call), to set `default_config`.

    python tools/sweep_a16.py [--shape 8192,8192] [--m 1,16,64] [--scheme w4a16] [--out sweep.json]

Each tile runs with split-K around the default rule's choice and with the two-per-instruction decode
on and off; the best per (M, decode) is printed last. Shapes, formats and peers at large: `anybit bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import anybit  # noqa: E402
from anybit.backends import get_backend  # noqa: E402
from anybit.backends.triton import default_config  # noqa: E402
from anybit.bench.timing import median, time_graph  # noqa: E402
from anybit.kernels.gemm import GemmConfig  # noqa: E402

TILES = [(64, 256, 4, 3), (64, 128, 4, 4), (128, 128, 4, 4), (32, 256, 4, 3), (64, 512, 4, 2), (128, 256, 8, 3)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192,8192", help="N,K")
    ap.add_argument("--m", default="1,16,64")
    ap.add_argument("--scheme", default="w4a16")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "sweep_a16.json"))
    args = ap.parse_args()
    n, k = (int(v) for v in args.shape.split(","))
    be = get_backend("triton")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    qw = anybit.quantize(torch.randn(n, k, device="cuda") * 0.02, args.scheme)
    preps = [anybit.prepare(qw, backend="triton") for _ in range(4)]
    rows = []
    for m in (int(v) for v in args.m.split(",")):
        x = torch.randn(m, k, device="cuda").bfloat16()
        base = default_config(m, n, k, qw.scheme.weight_bits, sms, False)
        for bn, bk, warps, stages in TILES:
            split = max(1, base.split_k * base.block_n // bn)
            for sk in sorted({max(1, split // 2), split, split * 2}):
                for pairs in (False, True):
                    cfg = GemmConfig(base.block_m, bn, bk, sk, num_warps=warps, num_stages=stages, pairs=pairs)
                    try:
                        fns = [lambda p=p, c=cfg, x=x: be.gemm(x, p, config=c) for p in preps]
                        us = median(time_graph(fns, 20, 15, 20))
                    except Exception as e:  # a tile that does not compile or fit is reported and skipped
                        print("skip", cfg, repr(e)[:120])
                        continue
                    rows.append(dict(n=n, k=k, m=m, scheme=args.scheme, cfg=cfg.__dict__, graph_us=us))
    best = {}
    for r in rows:
        key = (r["m"], r["cfg"]["pairs"])
        if key not in best or r["graph_us"] < best[key]["graph_us"]:
            best[key] = r
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    for (m, pairs), r in sorted(best.items()):
        print(f"M={m:<5d} pairs={pairs!s:5s} best {r['graph_us']:7.1f} us  {r['cfg']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
