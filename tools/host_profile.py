"""Where an eager `anybit.gemm` call spends its time: host (Python, launches) against GPU, per op.

    python tools/host_profile.py [--cases fp8-block:1024:7168:7168,w4a8:1024:4096:4096] [--calls 20]

Per case (scheme:M:N:K): eager µs per call (back to back, then synchronised), CUDA-graph µs per call
(the GPU's own time), host µs per call (the Python loop without waiting), and the top host ops of
`torch.profiler` by self CPU time. An eager cell far above its graph cell is host-bound; this names
the ops and the Python functions (cProfile, by own time over `--calls` calls) that make it so.
Writes DIR/host_profile.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import host_us, write_probe  # noqa: E402

import anybit  # noqa: E402
from anybit.bench.timing import median, time_eager, time_graph  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="fp8-block:1024:7168:7168,fp8-block:1024:8192:8192,w4a8:1024:4096:4096,"
                    "w4a16:1024:4096:4096,w4a16:256:4096:4096")  # fmt: skip
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    rows = []
    for case in args.cases.split(","):
        scheme, m, n, k = case.split(":")
        m, n, k = int(m), int(n), int(k)
        qw = anybit.quantize(torch.randn(n, k, device="cuda") * 0.05, scheme)
        p = anybit.prepare(qw)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

        def call(x=x, p=p):
            return anybit.gemm(x, p)

        call()
        eager = median(time_eager([call], args.calls, 5, args.calls, True))
        graph = median(time_graph([call], args.calls, 5, args.calls))
        host = host_us(call, args.calls)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(args.calls):
                call()
            torch.cuda.synchronize()
        py = cProfile.Profile()
        py.enable()
        for _ in range(args.calls):
            call()
        py.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(py, stream=text).sort_stats("tottime").print_stats(14)
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
        top = [(e.key, round(e.self_cpu_time_total / args.calls, 1), e.count // args.calls) for e in ops]
        rows.append(dict(case=case, eager_us=round(eager, 1), graph_us=round(graph, 1), host_us=round(host, 1),
                         top_host_ops=top, python_profile=text.getvalue()))  # fmt: skip
        print(f"{case:28s} eager {eager:8.1f}  graph {graph:8.1f}  host {host:8.1f} µs/call", flush=True)
        for key, us, count in top:
            print(f"    {us:8.1f} µs/call  x{count:<3d} {key[:90]}", flush=True)
        lines = text.getvalue().splitlines()
        start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
        print("\n".join(line[:150] for line in lines[start : start + 15]), flush=True)
    write_probe(args.out, "host_profile", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
