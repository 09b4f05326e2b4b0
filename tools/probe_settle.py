"""What `settled` (ANYBIT_FRAG_SETTLE: each frag K block waits for its wgmma) costs: anybit's route for each
(scheme, shape, M) with settle off and on, in one process, each checked against the exact product and a
relaunch bit for bit, then CUDA-graph µs per call over weight copies beyond L2 (the two variants timed
alternately, twice each, so drift lands on both).

    python tools/probe_settle.py [--schemes w4a16,w8a16,nvfp4] [--shapes 8192x8192] [--m 1,16,64,128] [--out DIR]

Prints µs off / on and on/off per cell; writes DIR/probe_settle.json.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import relaunch_check, write_probe  # noqa: E402

import anybit  # noqa: E402
from anybit.bench.timing import median, time_graph  # noqa: E402
from anybit.formats.scheme import Scheme  # noqa: E402

VARIANTS = ("0", "1")  # ANYBIT_FRAG_SETTLE


def _timed(x, preps, settle: str) -> float:
    os.environ["ANYBIT_FRAG_SETTLE"] = settle  # read per call: the graph captures this variant's kernel
    return median(time_graph([lambda p=p: anybit.gemm(x, p) for p in preps], 20, 15, 20))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default="w4a16,w8a16,nvfp4,mxfp4,w4a16:e2m1:g64:bf16,w2a16,w4a8")
    ap.add_argument("--shapes", default="8192x8192,28672x8192")
    ap.add_argument("--m", default="1,16,64,128")
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows, errors = [], {}
    for name in args.schemes.split(","):
        scheme = Scheme.parse(name)
        for shape in args.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            qws = [anybit.quantize(torch.randn(n, k, device=dev) * 0.02, scheme) for _ in range(args.copies)]
            preps = [anybit.prepare(qw) for qw in qws]
            for m in (int(v) for v in args.m.split(",")):
                x = torch.randn(m, k, device=dev).bfloat16()
                ref = x[:64].double() @ qws[0].dequantize().double().T
                row, ok = dict(scheme=name, n=n, k=k, m=m), True
                for settle in VARIANTS:
                    os.environ["ANYBIT_FRAG_SETTLE"] = settle
                    why = relaunch_check(lambda x=x, p=preps[0]: anybit.gemm(x, p), ref)
                    if why:
                        errors[f"{name} {shape} M={m} settle={settle}"] = why
                        ok = False
                if ok:
                    samples = {v: [] for v in VARIANTS}
                    for settle in VARIANTS + VARIANTS:
                        samples[settle].append(_timed(x, preps, settle))
                    row.update({f"settle{v}_us": min(s) for v, s in samples.items()})
                    ratio = row["settle1_us"] / row["settle0_us"]
                    print(f"{name:24s} {shape:11s} M={m:4d}  off {row['settle0_us']:7.1f}  on {row['settle1_us']:7.1f}"
                          f"  on/off {ratio:5.3f}", flush=True)  # fmt: skip
                rows.append(row)
            torch.cuda.empty_cache()
    os.environ.pop("ANYBIT_FRAG_SETTLE", None)
    write_probe(args.out, "probe_settle", rows, errors)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
