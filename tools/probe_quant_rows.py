"""How fast the FP8 activation quantizer runs at prefill sizes: `quantize_act` (its route: per token up to 8192
columns `quantize_rows` with one row a program since session 32, else `_quant_act_kernel`, longer rows read twice;
per group 1024 columns a step) against `quantize_rows` (several rows a program, each held whole) over rows a program
and warps — each variant checked bit for bit against `quantize_act` first. --scheme fp8-block: per-128-column
scales, M-major as the block-scaled cuBLAS route takes them. CUDA-graph µs per call over copies of x beyond twice
the L2, GB/s of bf16 read + FP8 written. One GPU call; prints a table, writes DIR/probe_quant_rows.json.

    python tools/probe_quant_rows.py [--scheme w8a8-fp8] [--k 4096,7168,8192,14336] [--m 1024,4096]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import write_probe  # noqa: E402

from anybit.bench.timing import median, time_graph  # noqa: E402
from anybit.formats.scheme import Scheme  # noqa: E402
from anybit.kernels.dequant import cdiv, next_pow2  # noqa: E402
from anybit.kernels.quant_act import quantize_act, quantize_rows  # noqa: E402

VARIANTS = ((1, 4), (1, 8), (1, 16), (2, 4), (2, 8), (4, 8), (4, 16), (8, 16))  # (rows a program, warps)
MAX_PER_THREAD = 64  # values of x a thread holds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="w8a8-fp8", help="whose activation spec: per token, or fp8-block")
    ap.add_argument("--k", default="4096,7168,8192,14336")
    ap.add_argument("--m", default="1024,4096")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    spec = Scheme.parse(args.scheme).act
    kw = dict(blockwise=spec.group == 128)  # FP8-block's scales as its block-scaled route writes them
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows_out, errors = [], {}
    for m in (int(v) for v in args.m.split(",")):
        for k in (int(v) for v in args.k.split(",")):
            copies = max(2, cdiv(4 * l2, 3 * m * k))
            xs = [torch.randn(m, k, device="cuda").bfloat16() * 3 for _ in range(copies)]
            want = quantize_act(xs[0], spec, **kw)
            cells = {"quantize_act": [lambda x=x: quantize_act(x, spec, **kw) for x in xs]}
            for rows, warps in VARIANTS:
                if rows * next_pow2(k) > MAX_PER_THREAD * 32 * warps:
                    continue
                got = quantize_rows(xs[0], spec, rows, warps, **kw)
                name = f"rows{rows}_w{warps}"
                if not all(torch.equal(a.float(), b.float()) for a, b in zip(want, got, strict=True)):
                    errors[f"M={m} K={k} {name}"] = "not bit for bit quantize_act's"
                    continue
                cells[name] = [lambda x=x, r=rows, w=warps: quantize_rows(x, spec, r, w, **kw) for x in xs]
            row = dict(m=m, k=k, copies=copies)
            for name, fns in cells.items():
                row[name] = median(time_graph(fns, 2 * len(fns), 9, 5))
            best = min((v, n) for n, v in row.items() if n not in ("m", "k", "copies"))
            print(f"M={m:5d} K={k:5d}  " + "  ".join(
                f"{n} {row[n]:6.1f}" for n in cells
            ) + f"  | best {best[1]} {3 * m * k / best[0] / 1e3:5.0f} GB/s", flush=True)  # fmt: skip
            rows_out.append(row)
            del xs
            torch.cuda.empty_cache()
    write_probe(args.out, f"probe_quant_rows_{args.scheme}", rows_out, errors)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
