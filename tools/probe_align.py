"""`moe_align`'s cost at prefill sizes on the GPU: CUDA-graph µs a call (20 calls a graph, median of 7 replays) and
each kernel's time (torch.profiler), for the library's version and, where tools/_old_moe_align.py exists, an older
one side by side (its file copied there for the A/B).

    python tools/probe_align.py [--tokens 256,1024,4096] [--experts 128,256] [--dtype int64]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import kernel_us, write_probe  # noqa: E402

from anybit.bench.timing import median, time_graph  # noqa: E402
from anybit.kernels.moe_align import moe_align_triton  # noqa: E402
from anybit.moe.layer import moe_tiles  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="256,1024,4096")
    ap.add_argument("--experts", default="128,256")
    ap.add_argument("--dtype", default="int64")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    impls = {"now": moe_align_triton}
    if os.path.exists(os.path.join(os.path.dirname(__file__), "_old_moe_align.py")):
        impls["old"] = importlib.import_module("_old_moe_align").moe_align_triton
    rows = []
    for e in map(int, args.experts.split(",")):
        for t in map(int, args.tokens.split(",")):
            ids = torch.stack([torch.randperm(e, device="cuda")[:8] for _ in range(t)]).to(getattr(torch, args.dtype))
            bm = moe_tiles(t * 8, e, True, "wide")["block_m"]
            for name, fn in impls.items():
                call = lambda fn=fn, ids=ids, e=e, bm=bm: fn(ids, e, bm, None, True)  # noqa: E731 (checked ids)
                us, ks = median(time_graph([call], 20, 7, 20)), kernel_us([call] * 20)
                rows.append(dict(impl=name, experts=e, tokens=t, block_m=bm, graph_us=round(us, 2), kernels=ks))
                print(f"{name:4s} E={e:<4d} T={t:<5d} bm={bm:<4d} graph {us:7.2f} µs  kernels {sum(ks.values()):6.2f}: "
                      + ", ".join(f"{k} {v}" for k, v in ks.items()), flush=True)  # fmt: skip
    write_probe(args.out, "probe_align", rows)


if __name__ == "__main__":
    main()
