"""The FP8 activation quantizer alone on the GPU (CUDA-graph µs per call), per M and K, FP8 codes and codes in bf16,
rows read in one step (`WIDE_MAX_M`) or in 4096-column steps, beside the frag GEMM alone on the codes it wrote
(`codes_a16` weights) — to split a `codes_a16` call's time into its two launches.

    python tools/probe_quant.py [--m 1,16,64] [--k 8192,28672] [--n 8192] [--scheme w4a8-mxfp4]
"""

# ruff: noqa: B023 -- every lambda is timed inside the iteration that made it
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import write_probe  # noqa: E402

import anybit  # noqa: E402
from anybit.backends.triton import _sm_count  # noqa: E402
from anybit.bench.timing import median, time_graph  # noqa: E402
from anybit.kernels import quant_act  # noqa: E402
from anybit.kernels.frag import frag_tile, gemm_frag  # noqa: E402


def _us(fns) -> float:
    return median(time_graph(fns, 20, 15, 20))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", default="1,16,64")
    ap.add_argument("--k", default="8192,28672")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--scheme", default="w4a8-mxfp4")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    rows = []
    wide = quant_act.WIDE_MAX_M
    for k in (int(v) for v in args.k.split(",")):
        qw = anybit.quantize(torch.randn(args.n, k, device="cuda") * 0.02, args.scheme)
        tws = [anybit.prepare(qw).data for _ in range(3)]
        act = qw.scheme.act
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda").bfloat16()
            row = dict(m=m, k=k, n=args.n, scheme=args.scheme)
            for name, w, codes in (("fp8_wide", wide, None), ("fp8_steps", 0, None), ("bf16_wide", wide, x.dtype),
                                   ("bf16_steps", 0, x.dtype)):  # fmt: skip
                quant_act.WIDE_MAX_M = w
                row[name] = _us([lambda c=codes: quant_act.quantize_act(x, act, codes_dtype=c)])
            quant_act.WIDE_MAX_M = wide
            xq, xs = quant_act.quantize_act(x, act, codes_dtype=x.dtype)
            t = frag_tile(m, args.n, k, _sm_count(x.device), False, 4)
            ws = torch.empty(max(1, t["split_k"] * m * args.n), device="cuda")
            cnt = torch.zeros(4096, dtype=torch.int32, device="cuda")
            row["gemm_alone"] = _us([lambda tw=tw: gemm_frag(xq, tw, None, x_scales=xs, workspace=ws, counters=cnt, **t)
                                     for tw in tws])  # fmt: skip
            row["gemm_bf16_x"] = _us([lambda tw=tw: gemm_frag(x, tw, None, x_scales=xs, workspace=ws, counters=cnt,
                                                             **t) for tw in tws])  # fmt: skip
            p = [anybit.prepare(qw) for _ in range(3)]
            row["route"] = _us([lambda pp=pp: anybit.gemm(x, pp) for pp in p])
            rows.append(row)
            print(" ".join(f"{key}={v:.1f}" if isinstance(v, float) else f"{key}={v}" for key, v in row.items()),
                  flush=True)  # fmt: skip
    write_probe(args.out, "probe_quant", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
