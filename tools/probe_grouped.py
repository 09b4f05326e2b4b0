"""Does this torch run cuBLAS/CUTLASS grouped GEMMs on the GPU (`torch._scaled_grouped_mm` with row-wise
FP8 scales, `torch._grouped_mm` in bf16), are they right, and how fast are they at the MoE issue's
shapes with tokens grouped by expert? The candidate for large-M MoE with FP8 channel weights (W8A8-FP8)
and the bf16 baseline peer. One GPU call; prints a table, writes DIR/probe_grouped.json.

    python tools/probe_grouped.py [--models deepseek-v3,qwen3-30b-a3b] [--m 256,1024,4096]

Per (model, M): routing as softmax top-k of random logits, rows sorted by expert (offs = group ends,
int32), gate_up then down as two grouped GEMMs; µs by CUDA events (median), TF/s over the rows computed,
and the relative error of a few experts against a float64 product.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import write_probe  # noqa: E402

from anybit.bench.timing import median, time_eager  # noqa: E402
from anybit.moe import softmax_topk  # noqa: E402

MODELS = {"deepseek-v3": dict(E=256, top_k=8, H=7168, I=2048), "qwen3-30b-a3b": dict(E=128, top_k=8, H=2048, I=768)}


def _scaled(xq, sx, wq, sw, offs):
    """x [rows, K] e4m3 row-major, scales [rows]; W [E, N, K] e4m3 (read as [E, K, N] column-major),
    scales [E, N]; offs int32 [E] group ends."""
    return torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), sx, sw, offs, out_dtype=torch.bfloat16)


def _bf16(x, w, offs):
    return torch._grouped_mm(x, w.transpose(-2, -1), offs, out_dtype=torch.bfloat16)


def _check(y, x, w, offs, sx=None, sw=None, experts=(0, 1, 2)) -> float:
    """Relative error of the rows of a few experts against float64."""
    ends = [0] + offs.tolist()
    num, den = 0.0, 0.0
    for e in experts:
        lo, hi = ends[e], ends[e + 1]
        if hi <= lo:
            continue
        xe, we = x[lo:hi].double(), w[e].double()
        if sx is not None:
            xe, we = xe * sx[lo:hi, None].double(), we * sw[e][:, None].double()
        ref = xe @ we.T
        num += float((y[lo:hi].double() - ref).norm() ** 2)
        den += float(ref.norm() ** 2)
    return (num / den) ** 0.5 if den else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--m", default="256,1024,4096")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev, fp8 = "cuda", torch.float8_e4m3fn
    rows, errors = [], {}
    for model in args.models.split(","):
        c = MODELS[model]
        e, k, h, i = c["E"], c["top_k"], c["H"], c["I"]
        for part, n, kk in (("gate_up", 2 * i, h), ("down", h, i)):
            wb = torch.randn(e, n, kk, device=dev, dtype=torch.bfloat16) * 0.05  # DeepSeek gate_up: 15 GB
            wq, sw = (wb * 20).to(fp8), torch.rand(e, n, device=dev) * 0.01 + 0.001
            for m in (int(v) for v in args.m.split(",")):
                _, ids = softmax_topk(torch.randn(m, e, device=dev), k)
                counts = torch.bincount(ids.flatten(), minlength=e)
                offs = counts.cumsum(0).to(torch.int32)
                total = m * k
                x = torch.randn(total, kk, device=dev)
                xq, sx = (x * 20).clamp(-448, 448).to(fp8), torch.rand(total, device=dev) * 0.01 + 0.001
                xb = x.bfloat16()
                row = dict(model=model, part=part, m=m, rows=total, n=n, k=kk)
                cases = (
                    ("fp8_rowwise", functools.partial(_scaled, xq, sx, wq, sw, offs), (xq, wq, offs, sx, sw)),
                    ("bf16", functools.partial(_bf16, xb, wb, offs), (xb, wb, offs)),
                )
                for name, fn, operands in cases:
                    try:
                        row[f"err_{name}"] = _check(fn(), *operands)
                        row[name] = median(time_eager([fn], 5, 7, 5, True))
                    except Exception as ex:  # noqa: BLE001 - a probe reports what failed
                        errors[name] = repr(ex)[:300]
                        row[name] = float("nan")
                flops = 2 * total * n * kk
                cols = [f"{nm} {row[nm]:8.1f} µs {flops / row[nm] / 1e6:6.0f} TF/s err {row['err_' + nm]:.1e}"
                        if f"err_{nm}" in row else f"{nm} failed" for nm in ("fp8_rowwise", "bf16")]  # fmt: skip
                print(f"{model:14s} {part:8s} M={m:5d} " + "  ".join(cols), flush=True)
                rows.append(row)
    write_probe(args.out, "probe_grouped", rows, errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
