"""One dense GEMM problem run a few times, for Nsight Compute to read its kernel's counters on the device:

    ncu --clock-control none --kernel-name regex:frag --launch-skip 2 --launch-count 1 \
        --section SpeedOfLight --section WarpStateStats ... python3 tools/ncu_frag.py --scheme w4a16 --m 1

(`tools/device.sh ncu` runs that with the sections it names). The weight is prepared for the Triton
backend with the default (or --split) tile, as `anybit.gemm` would run it.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import anybit  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="w4a16")
    ap.add_argument("--shape", default="8192x8192", help="NxK")
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    n, k = (int(v) for v in args.shape.split("x"))
    qw = anybit.quantize(torch.randn(n, k, device="cuda") * 0.02, args.scheme)
    p = anybit.prepare(qw, backend="triton")
    x = torch.randn(args.m, k, device="cuda").bfloat16()
    for _ in range(args.runs):
        anybit.gemm(x, p)
    torch.cuda.synchronize()
    print(f"{args.scheme} {n}x{k} M={args.m}: {args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
