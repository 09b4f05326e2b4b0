"""Does this torch run cuBLAS's block-scaled FP8 GEMM (`torch.nn.functional.scaled_mm` with 1x128 /
128x128 scales, Hopper), is it exact enough, and how fast is it beside row-wise `_scaled_mm` and
anybit's own W4A8 / FP8-block paths — and anybit's W8A8-FP8 call (its per-token quantizer, then its Triton GEMM on the
e4m3 weights as stored: against bare row-wise `_scaled_mm`, the quantization a serving engine pays included)? One GPU
call; prints a table, writes DIR/probe_blockwise.json.

    python tools/probe_blockwise.py [--shapes 8192x8192,28672x4096,4096x14336] [--m 256,1024,4096,8192] [--graph]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import write_probe  # noqa: E402

import anybit  # noqa: E402
from anybit.bench.timing import median, time_eager, time_graph  # noqa: E402

NAMES = ("1x128", "128x128", "rowwise", "anybit_w8a8", "anybit_w4a8", "anybit_fp8block")


def _outer_major(t: torch.Tensor) -> torch.Tensor:
    """[R, G] with the R axis contiguous (stride (1, R)): what cuBLAS reads for 1x128 scales."""
    return t.t().contiguous().t()


def blockwise(xq, sx, wq, sw, block_w: bool):
    """x [M, K] e4m3 with per (row, 128-K) scales sx [M, K/128]; w [N, K] e4m3 with per (row, 128-K)
    scales sw [N, K/128] (or [N/128, K/128] blocks when block_w)."""
    from torch.nn.functional import ScalingType, scaled_mm

    if block_w:
        g = sw.shape[1]
        pad = (-g) % 4
        swp = torch.nn.functional.pad(sw, (0, pad)) if pad else sw
        sb, rb = swp.t(), ScalingType.BlockWise128x128
    else:
        sb, rb = _outer_major(sw), ScalingType.BlockWise1x128
    return scaled_mm(xq, wq.t(), _outer_major(sx), ScalingType.BlockWise1x128, sb, rb,
                     output_dtype=torch.bfloat16)  # fmt: skip


def _cases(xq, sx, sxg, wq, sw, sw_blk, xb, p_a8, p_blk, p_w8):
    """(name, call) of one problem: cuBLAS block-scaled (1x128 / 128x128 weight scales), row-wise, anybit."""
    return (
        ("1x128", lambda: blockwise(xq, sxg, wq, sw, False)),
        ("128x128", lambda: blockwise(xq, sxg, wq, sw_blk, True)),
        ("rowwise", lambda: torch._scaled_mm(xq, wq.t(), sx, sw[:, :1].t().contiguous(), out_dtype=torch.bfloat16)),
        ("anybit_w8a8", lambda: anybit.gemm(xb, p_w8)),
        ("anybit_w4a8", lambda: anybit.gemm(xb, p_a8)),
        ("anybit_fp8block", lambda: anybit.gemm(xb, p_blk)),
    )


def _quant(x, xq, s, act, group, block, one, warps):
    from anybit.kernels.quant_act import _quant_act_kernel
    from anybit.quant.activations import act_qmax, min_act_scale

    _quant_act_kernel[(x.shape[0],)](x, xq, s, s, x.shape[1], x.stride(0), xq.stride(0), s.stride(0), 0,
                                     QMAX=act_qmax(act), MIN_SCALE=min_act_scale(act), GROUP=group, BLOCK=block,
                                     ONE_PASS=one, num_warps=warps)  # fmt: skip


def parts(out_rows: list) -> None:
    """Where the W4A8 / FP8-block route's time goes at large M: the activation quantizer (per token:
    row read once vs twice, block and warps; per 128-group) and the W4A8 codes pass, each alone."""
    from anybit.backends.triton_layout import to_triton_layout
    from anybit.formats.scheme import Scheme
    from anybit.kernels.frag_dequant import dequantize_frag

    dev = "cuda"
    for m, k in ((4096, 4096), (4096, 8192), (4096, 14336)):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        xq = torch.empty((m, k), device=dev, dtype=torch.float8_e4m3fn)
        for text in ("w4a8", "fp8-block"):
            act = Scheme.parse(text).act
            group = act.group if act.group else 0
            cols = k // group if group else 1
            s = torch.empty((m, cols), device=dev)
            variants = (
                [(128, 4, 1), (1024, 4, 1), (4096, 4, 1), (4096, 8, 1)]
                if group
                else [
                    (2048, 4, 0),
                    (4096, 4, 0),
                    (4096, 4, 1),
                    (4096, 8, 1),
                    (8192, 8, 1),
                    (16384, 8, 1),
                    (16384, 16, 1),
                ]
            )
            for block, warps, allow_one in variants:
                block = min(block, triton.next_power_of_2(k)) if not group else block
                one = bool(allow_one) and k <= block
                run = functools.partial(_quant, x, xq, s, act, group, max(block, group), one, warps)
                us = median(time_eager([run], 10, 7, 5, True))
                gbs = (x.numel() * 3) / us / 1e3
                print(f"quant {text:9s} M={m} K={k:5d} block {block:5d} warps {warps} one-pass {one!s:5s} "
                      f"{us:7.1f} µs {gbs:6.0f} GB/s", flush=True)  # fmt: skip
                out_rows.append(dict(part="quant", scheme=text, m=m, k=k, block=block, warps=warps, us=us))
    for n, k in ((8192, 8192), (28672, 4096), (4096, 14336)):
        tw = to_triton_layout(anybit.quantize(torch.randn(n, k, device=dev) * 0.02, "w4a8"))
        for bn in (64, 128):
            run = functools.partial(dequantize_frag, tw, dtype=torch.float8_e4m3fn, block_n=bn)
            us = median(time_eager([run], 10, 7, 5, True))
            print(f"codes w4a8 {n}x{k} block_n {bn} {us:7.1f} µs {n * k * 1.5 / us / 1e3:6.0f} GB/s", flush=True)
            out_rows.append(dict(part="codes", n=n, k=k, block_n=bn, us=us))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8192x8192,28672x4096,4096x14336")
    ap.add_argument("--m", default="256,1024,4096,8192")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--parts", action="store_true", help="only time the route's parts (quantizer, codes)")
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (no host time), not eager calls")
    args = ap.parse_args()
    if args.parts:
        rows = []
        parts(rows)
        write_probe(args.out, "probe_blockwise_parts", rows)
        return 0
    dev, fp8 = "cuda", torch.float8_e4m3fn
    rows, errors = [], {}
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        g = k // 128
        wq = torch.randint(-8, 8, (n, k), device=dev).to(fp8)  # int4 codes as e4m3 (exact)
        sw = torch.rand(n, g, device=dev) * 0.01 + 0.001
        sw_blk = torch.rand(n // 128, g, device=dev) * 0.01 + 0.001
        qw_a8 = anybit.quantize(torch.randn(n, k, device=dev) * 0.02, "w4a8")
        qw_blk = anybit.quantize(torch.randn(n, k, device=dev) * 0.02, "fp8-block")
        qw_w8 = anybit.quantize(torch.randn(n, k, device=dev) * 0.02, "w8a8-fp8")
        p_a8, p_blk = anybit.prepare(qw_a8, backend="triton"), anybit.prepare(qw_blk, backend="triton")
        p_w8 = anybit.prepare(qw_w8, backend="triton")
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device=dev)
            sx = torch.rand(m, 1, device=dev) * 0.01 + 0.001
            xq = (x * 20).clamp(-448, 448).to(fp8)
            sxg = sx.expand(m, g)
            ref = (xq.float() * sx) @ (wq.float().view(n, g, 128) * sw[:, :, None]).view(n, k).t()
            row = dict(n=n, k=k, m=m, timing="graph" if args.graph else "eager")
            xb = x.bfloat16()
            for name, fn in _cases(xq, sx, sxg, wq, sw, sw_blk, xb, p_a8, p_blk, p_w8):
                try:
                    y = fn()
                    if name == "1x128":
                        row["rel_err_1x128"] = float((y.float() - ref).norm() / ref.norm())
                    us = median(time_graph([fn], 5, 7, 5) if args.graph else time_eager([fn], 5, 7, 5, True))
                    row[name] = us
                except Exception as e:  # noqa: BLE001 - a probe reports what failed
                    errors[name] = repr(e)[:300]
                    row[name] = float("nan")
            flops = 2 * m * n * k
            print(f"{n}x{k} M={m:5d} " + "  ".join(
                f"{nm} {row[nm]:8.1f} µs {flops / row[nm] / 1e6:6.0f} TF/s" for nm in NAMES
            ) + f"  err {row.get('rel_err_1x128', float('nan')):.1e}", flush=True)  # fmt: skip
            rows.append(row)
    write_probe(args.out, "probe_blockwise", rows, errors)
    return 0


if __name__ == "__main__":
    sys.exit(main())
