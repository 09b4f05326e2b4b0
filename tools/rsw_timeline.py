"""When each CTA of the wide persistent kernel (`frag_rsp.gemm_frag_rsw`) starts, ends each segment and ends, on the
device: the kernel's TIMES stamps (%globaltimer, ns) of one launch after warm-up, per CTA and warpgroup.

    bash tools/device.sh py tools/rsw_timeline.py --shapes 8192x8192,28672x8192 --m 128 [--variants 'default;head=1']

Why (session 39, ncu): on 8192^2 at 128 tokens the SMs were active 69 % of the kernel's cycles (28672x8192: 82 %) with
every CTA given the same number of K blocks — so CTAs end at different times. Prints per shape the spread of starts and
ends, the slowest CTAs' segments, and the end time against the segment count and the SM; writes $OUT/rsw_timeline.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import tile_overrides  # noqa: E402

from anybit import quantize  # noqa: E402
from anybit.backends.triton_layout import to_triton_layout  # noqa: E402
from anybit.kernels.frag_rs import rs_block_m  # noqa: E402
from anybit.kernels.frag_rsp import gemm_frag_rsw, rsw_block_m  # noqa: E402


def timeline(scheme: str, n: int, k: int, m: int, options: dict) -> dict:
    dev = torch.device("cuda")
    tw = to_triton_layout(quantize(torch.randn(n, k, device=dev) * 0.02, scheme), allow_frag3=True)
    x = torch.randn(m, k, device=dev).bfloat16()
    ctas = torch.cuda.get_device_properties(dev).multi_processor_count
    panels = int(options.get("panels", 2))
    times = torch.zeros(ctas * 20 * panels, dtype=torch.int64, device=dev)
    block_m = rsw_block_m(rs_block_m(m, n) or 128)
    for _ in range(5):
        gemm_frag_rsw(x, tw, block_m=block_m, times=times, **options)
    begin, finish = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    gemm_frag_rsw(x, tw, block_m=block_m, times=times, **options)  # (the stamps read are this launch's)
    finish.record()
    torch.cuda.synchronize()
    t = times.view(ctas, panels, 20).cpu()
    t0 = int(t[:, 0, 17].min())  # the first CTA's entry
    rows = []
    for q in range(ctas):
        segs = int(t[q, 0, 15])
        done = [(int(t[q, 0, 1 + i]) - t0) / 1e3 for i in range(min(segs, 6))]
        summed = [(int(t[q, 0, 7 + i]) - t0) / 1e3 for i in range(min(segs, 6))]
        stored = [bool(int(t[q, 0, 16]) >> i & 1) for i in range(min(segs, 6))]
        rows.append(dict(cta=q, sm=int(t[q, 0, 14]), segments=segs, start=(int(t[q, 0, 0]) - t0) / 1e3,
                         end=(int(t[q, 0, 13]) - t0) / 1e3, end_wg1=(int(t[q, 1, 13]) - t0) / 1e3,
                         blocks_done=done, summed=summed, stored=stored, entry=(int(t[q, 0, 17]) - t0) / 1e3,
                         loader=((int(t[q, 0, 19]) - t0) / 1e3, (int(t[q, 0, 18]) - t0) / 1e3)))  # fmt: skip
    event_us = begin.elapsed_time(finish) * 1e3
    return dict(scheme=scheme, n=n, k=k, m=m, block_m=block_m, options=options, event_us=event_us, rows=rows)


def report(r: dict) -> None:
    rows = r["rows"]
    starts = [c["start"] for c in rows]
    ends = [c["end"] for c in rows]
    print(f"{r['scheme']} {r['n']}x{r['k']} M={r['m']} block_m={r['block_m']} {r['options'] or 'defaults'}: "
          f"{len(rows)} CTAs; "
          f"start {min(starts):.1f}-{max(starts):.1f} µs (median {statistics.median(starts):.1f}), end "
          f"{min(ends):.1f}-{max(ends):.1f} (median {statistics.median(ends):.1f})")  # fmt: skip
    span = max(max(c["end"], c["end_wg1"]) for c in rows)
    print(f"  one launch: CUDA events {r['event_us']:.1f} µs; stamped from the first entry to the last end {span:.1f}; "
          f"entry {min(c['entry'] for c in rows):.1f}-{max(c['entry'] for c in rows):.1f}, entry -> MMA start median "
          f"{statistics.median(c['start'] - c['entry'] for c in rows):.2f}, loader start median "
          f"{statistics.median(c['loader'][0] for c in rows):.1f} / end median "
          f"{statistics.median(c['loader'][1] for c in rows):.1f}")  # fmt: skip
    by_segs: dict[int, list[float]] = {}
    for c in rows:
        by_segs.setdefault(c["segments"], []).append(c["end"] - c["start"])
    print(
        "  run time by segment count: "
        + ", ".join(
            f"{s}: {len(v)} CTAs median {statistics.median(v):.1f} max {max(v):.1f}" for s, v in sorted(by_segs.items())
        )
    )
    fix = {True: [], False: []}  # the segment-end cost: blocks done -> products summed / stored (the fixup)
    for c in rows:
        for d, e, st in zip(c["blocks_done"], c["summed"], c["stored"], strict=True):
            fix[st].append(e - d)
    for st, v in fix.items():
        if v:
            print(f"  segment ends {'storing y (last in or whole)' if st else 'leaving a part'}: {len(v)}, "
                  f"done -> summed median {statistics.median(v):.2f} µs, max {max(v):.2f}")  # fmt: skip
    for c in sorted(rows, key=lambda c: -c["end"])[:6] + sorted(rows, key=lambda c: c["end"])[:3]:
        segs = " ".join(f"{d:.1f}->{e:.1f}{'*' if st else ''}" for d, e, st in
                        zip(c["blocks_done"], c["summed"], c["stored"], strict=True))  # fmt: skip
        print(f"  CTA {c['cta']:3d} SM {c['sm']:3d} start {c['start']:5.1f} segments (done->summed, * stored y) "
              f"{segs} end {c['end']:.1f} (warpgroup 1 {c['end_wg1']:.1f})")  # fmt: skip
    by_sm = sorted(rows, key=lambda c: c["sm"])
    print("  end by SM (µs, SM order): " + " ".join(f"{c['end']:.0f}" for c in by_sm))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="w4a16")
    ap.add_argument("--shapes", default="8192x8192,28672x8192")
    ap.add_argument("--m", default="128")
    ap.add_argument(
        "--variants",
        default="default",
        help="gemm_frag_rsw options a variant, ';' between: e.g. 'default;cvt=0;head=1'",
    )
    args = ap.parse_args()
    out = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        for m in (int(v) for v in args.m.split(",")):
            for text in args.variants.split(";"):
                options = {a: v if a == "panels" else bool(v)
                           for a, v in tile_overrides("" if text == "default" else text).items()}  # fmt: skip
                r = timeline(args.scheme, n, k, m, options)
                report(r)
                out.append(r)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "rsw_timeline.json"), "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
