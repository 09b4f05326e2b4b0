"""Where the register-operand MoE layer's time goes (`anybit.kernels.moe_rs`): gather, gate_up, silu, down, at a
model's shapes, each part timed alone (CUDA events, median of repeats), against `moe_gemm`'s two GEMMs.

    python tools/probe_moe_rs.py [--model deepseek-v3] [--m 4096] [--tiles 128,160,192] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from moe_bench import random_weight  # noqa: E402

from anybit.formats.scheme import Scheme  # noqa: E402
from anybit.kernels.moe_rs import moe_gather, moe_gemm_rs, moe_rs_block_m, moe_silu_sorted  # noqa: E402
from anybit.moe import QuantMoE, moe_align, softmax_topk  # noqa: E402

MODELS = {"deepseek-v3": (256, 8, 7168, 2048), "qwen3-30b-a3b": (128, 8, 2048, 768)}


def _time(fn, reps: int = 9) -> float:
    fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return sorted(out)[reps // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deepseek-v3")
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--tiles", default="")
    ap.add_argument("--scheme", default="w4a16")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    e, k, h, i = MODELS[args.model]
    dev = torch.device("cuda")
    scheme = Scheme.parse(args.scheme)
    moe = QuantMoE(random_weight(scheme, (e, 2 * i, h), dev), random_weight(scheme, (e, h, i), dev))
    x = torch.randn(args.m, h, device=dev).bfloat16()
    w, ids = softmax_topk(torch.randn(args.m, e, device=dev), k)
    moe(x, w, ids)  # builds the stacks
    gu, dn, fused = moe._stacked
    rows = args.m * k
    tiles = [int(t) for t in args.tiles.split(",") if t] or [moe_rs_block_m(rows, e)]
    y = torch.empty(rows, h, device=dev, dtype=x.dtype)
    rw = w.reshape(-1).float().contiguous()
    res = []
    for bm in tiles:
        s, ex, tot = moe_align(ids, e, bm)
        xs = moe_gather(x, s, tot, k)
        hh = moe_gemm_rs(xs, gu, s, ex, tot, block_m=bm, num_rows=rows)
        act = moe_silu_sorted(hh, tot, fused)
        parts = {
            "gather": _time(lambda s=s, tot=tot: moe_gather(x, s, tot, k)),
            "gate_up": _time(
                lambda xs=xs, s=s, ex=ex, tot=tot, bm=bm: moe_gemm_rs(xs, gu, s, ex, tot, block_m=bm, num_rows=rows)
            ),  # fmt: skip
            "silu": _time(lambda hh=hh, tot=tot: moe_silu_sorted(hh, tot, fused)),
            "down": _time(
                lambda act=act, s=s, ex=ex, tot=tot, bm=bm: moe_gemm_rs(
                    act, dn, s, ex, tot, block_m=bm, num_rows=rows, scatter=True, routed_weights=rw, out=y
                )
            ),
        }
        res.append(dict(block_m=bm, padded=int(tot), **parts))
        print(f"{args.model} {args.scheme} M={args.m} BM={bm:<4d} padded {int(tot):<6d} "
              + "  ".join(f"{p} {v:8.1f}" for p, v in parts.items()), flush=True)  # fmt: skip
    with open(os.path.join(args.out, "probe_moe_rs.json"), "w") as f:
        json.dump(dict(model=args.model, m=args.m, scheme=args.scheme, rows=res), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
