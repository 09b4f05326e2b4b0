"""How fast can one launch read a decode-sized weight on this GPU? The practical floor of an M=1 GEMM.

    python tools/probe_stream.py [--mb 8.6,17.3,34.6,69,118] [--out DIR]

A Triton kernel reads B bytes once (16-byte loads, each CTA a contiguous slice, an xor of what it read
written per CTA so nothing is optimised away), timed like `anybit bench` times M <= 64: a CUDA graph of
20 launches rotating over buffer copies larger than twice the L2, median of 15 replays. Prints µs and
TB/s per size and per grid (CTAs per SM), writes DIR/probe_stream.json. The sizes are the weights of the
issue's decode shapes: 8192x8192 int4 g128 is 34.6 MB with its scales, 28672x8192 118 MB.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import write_probe  # noqa: E402

from anybit.bench.timing import median, time_graph  # noqa: E402


@triton.jit
def _read_kernel(src, out, words, per_cta, BLOCK: tl.constexpr):
    """Each CTA xors its slice of `words` int32 values, BLOCK at a time (4 per thread = 16 bytes)."""
    pid = tl.program_id(0)
    lo = pid * per_cta
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(lo, lo + per_cta, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc ^= tl.load(src + offs, mask=offs < words, other=0)
    tl.store(out + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def _launcher(buf: torch.Tensor, out: torch.Tensor, ctas: int, block: int, warps: int):
    words = buf.numel()
    per_cta = triton.cdiv(triton.cdiv(words, ctas), block) * block
    grid = (triton.cdiv(words, per_cta),)
    return lambda: _read_kernel[grid](buf, out, words, per_cta, BLOCK=block, num_warps=warps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="8.6,17.3,34.6,69,118")
    ap.add_argument("--ctas-per-sm", default="1,2,4,8")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    rows = []
    for mb in [float(v) for v in args.mb.split(",")]:
        words = int(mb * 1e6) // 4
        copies = max(2, -(-2 * l2 // (words * 4)) + 1)
        bufs = [torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, device=dev) for _ in range(copies)]
        out = torch.empty(64 * sms, dtype=torch.int32, device=dev)
        for cps in [int(v) for v in args.ctas_per_sm.split(",")]:
            for block, warps in ((4096, 8), (2048, 4)):
                fns = [_launcher(b, out, cps * sms, block, warps) for b in bufs]
                us = median(time_graph(fns, calls=20, repeats=15, warmup=3))
                rows.append(dict(mb=mb, ctas_per_sm=cps, block=block, warps=warps, us=us, tbs=words * 4 / us / 1e6))
                tbs = rows[-1]["tbs"]
                print(f"{mb:7.1f} MB  {cps} CTA/SM  block {block:5d} w{warps}: {us:7.2f} µs  {tbs:.2f} TB/s")
        del bufs
    best = {}
    for r in rows:
        if r["mb"] not in best or r["us"] < best[r["mb"]]["us"]:
            best[r["mb"]] = r
    print("\nbest per size (floor at 4.2 TB/s, 80 % of it):")
    for mb, r in best.items():
        floor = mb / 4.2
        share = floor / r["us"]
        print(f"{mb:7.1f} MB  {r['us']:7.2f} µs = {share:.0%} of the floor ({floor:.1f} µs; 80 %: {floor / 0.8:.1f})")
    print(write_probe(args.out, "probe_stream", rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
