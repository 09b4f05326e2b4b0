"""Which shapes hang or go wrong in the persistent stream-K register-operand kernels (`frag_rsp`; --kernel rsw: the wide
form): each case in its own process under a time limit (a hung kernel takes only its process down), against the
float64 product of `dequantize()`. python tools/rsp_isolate.py [--limit S] [--kernel rsp|rsw]"""

import argparse
import json
import os
import subprocess
import sys
import time

CASES = [  # text, m, n, k, block_m, ctas
    ("w4a16", 13, 4160, 1024, 128, 1),  # passed in the GPU tests (session 38)
    ("w4a16", 13, 4160, 1408, 128, 1),  # odd block count
    ("w4a16", 96, 4160, 1024, 96, 1),  # two token parts
    ("w4a16", 13, 2000, 1024, 128, 1),  # N off the tile
    ("w4a16", 13, 128, 512, 128, 2),  # two CTAs, a whole tile each
    ("w4a16", 13, 64, 512, 128, 2),  # one tile shared by two CTAs
    ("w4a16", 13, 4160, 1024, 128, 7),
    ("w4a16", 13, 4160, 1024, 128, 132),
    ("w4a16", 128, 28672, 8192, 128, 132),  # a real size
    ("nvfp4", 96, 4160, 2944, 96, 132),  # e2m1 and its global scale, two token parts, odd block count
]

ONE = """
import torch, sys
from anybit import quantize
from anybit.backends.triton_layout import to_triton_layout
from anybit.kernels import frag_rsp
fn = getattr(frag_rsp, "gemm_frag_" + sys.argv[1])
text, m, n, k, bm, ctas = sys.argv[2], *map(int, sys.argv[3:])
g = torch.Generator(device="cuda").manual_seed(m + n)
qw = quantize(torch.randn(n, k, generator=g, device="cuda") * 0.05, text)
x = torch.randn(m, k, generator=g, device="cuda").bfloat16()
tw = to_triton_layout(qw)
ref = x.double() @ qw.dequantize().double().T
y = fn(x, tw, block_m=bm, ctas=ctas)
torch.cuda.synchronize()
err = ((y.double() - ref).norm() / ref.norm()).item()
same = torch.equal(y, fn(x, tw, block_m=bm, ctas=ctas))
print("RESULT", err, same)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=float, default=40)
    ap.add_argument("--kernel", choices=["rsp", "rsw"], default="rsp")
    args = ap.parse_args()
    rows = []
    for case in CASES:
        t0 = time.time()
        try:
            cmd = [sys.executable, "-c", ONE, args.kernel, *map(str, case)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.limit)
            line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT")]
            what = line[0] if line else "ERROR " + p.stderr.strip().splitlines()[-1][:200] if p.stderr else "?"
        except subprocess.TimeoutExpired:
            what = "HANG"
        rows.append((case, what, round(time.time() - t0, 1)))
        print(*case, what, f"{rows[-1][2]} s", flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, f"{args.kernel}_isolate.json"), "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
