"""Where an eager call's host time goes, layer by layer: `anybit.gemm` (routing included), the Triton backend's
`gemm`, and the kernel launchers it ends in (`gemm_frag`, `gemm_frag_rs`, `gemm_frag_ws`, `dequantize_frag`,
`torch.nn.functional.linear`) replayed with the arguments the call gave them; beside a bare launch of a trivial
Triton kernel and a `torch.empty`.

    python tools/probe_host_layers.py [--cases w4a16:256:4096:4096,...] [--calls 50]

Host µs per call = the Python loop's time to enqueue `calls` calls (the GPU may still be busy after). Writes
DIR/probe_host_layers.json.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import host_us, write_probe  # noqa: E402

import anybit  # noqa: E402
from anybit.backends import get_backend  # noqa: E402
from anybit.backends import triton as tb  # noqa: E402

LEAVES = ("gemm_frag", "gemm_frag_rs", "gemm_frag_ws", "gemm_frag_ws_a8", "dequantize_frag", "blockscaled_gemm",
          "rowwise_gemm")  # fmt: skip


@triton.jit
def _nothing(a, b, c, d, e, f, g, h, i, j, n0, n1, n2, n3, n4, n5, n6, n7, BLOCK: tl.constexpr, C1: tl.constexpr,
             C2: tl.constexpr, C3: tl.constexpr):  # fmt: skip
    pass


def leaves_of(call) -> list[tuple[str, object, tuple, dict]]:
    """The launchers one call of `call` went through, with their arguments (the backend module's names patched)."""
    seen = []
    saved = {}
    for name in LEAVES:
        fn = getattr(tb, name, None)
        if fn is None:
            continue
        saved[name] = fn

        def rec(*a, _n=name, _f=fn, **k):
            seen.append((_n, _f, a, k))
            return _f(*a, **k)

        setattr(tb, name, rec)
    try:
        call()
    finally:
        for name, fn in saved.items():
            setattr(tb, name, fn)
    return seen


def profile_rows(call, calls: int, top: int) -> list[tuple[str, float, float]]:
    """cProfile of `calls` calls: the `top` functions by own time, (name, own µs a call, cumulative µs a call)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    prof.disable()
    st = pstats.Stats(prof).stats  # {(file, line, fn): (cc, nc, tt, ct, callers)}
    rows = [
        (f"{os.path.basename(f)}:{ln}:{fn}", tt * 1e6 / calls, ct * 1e6 / calls)
        for (f, ln, fn), (_, _, tt, ct, _) in st.items()
    ]
    return sorted(rows, key=lambda r: -r[1])[:top]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="w4a16:256:4096:4096,w4a16:256:4096:14336,nvfp4:256:4096:4096")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--profile", type=int, default=12, help="cProfile rows to print per case (0: none)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    bufs = [torch.empty(16, device=dev) for _ in range(10)]
    _nothing[(1,)](*bufs, *range(8), BLOCK=16, C1=1, C2=2, C3=3)
    base = dict(
        trivial_launch=host_us(lambda: _nothing[(1,)](*bufs, *range(8), BLOCK=16, C1=1, C2=2, C3=3), args.calls),
        torch_empty=host_us(lambda: torch.empty((256, 4096), device=dev, dtype=torch.bfloat16), args.calls),
    )
    print("  ".join(f"{k} {v:.1f} µs" for k, v in base.items()), flush=True)
    rows = []
    for case in args.cases.split(","):
        scheme, m, n, k = case.split(":")
        m, n, k = int(m), int(n), int(k)
        p = anybit.prepare(anybit.quantize(torch.randn(n, k, device=dev) * 0.05, scheme))
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        anybit.gemm(x, p)
        torch.cuda.synchronize()
        backend = get_backend(p.backend)
        row = dict(case=case, backend=p.backend, gemm=host_us(lambda x=x, p=p: anybit.gemm(x, p), args.calls),
                   backend_gemm=host_us(lambda x=x, p=p, b=backend: b.gemm(x, p), args.calls))  # fmt: skip
        leaves = leaves_of(lambda x=x, p=p: anybit.gemm(x, p))
        row["leaves"] = []
        for name, fn, a, kw in leaves:
            row["leaves"].append((name, round(host_us(lambda fn=fn, a=a, kw=kw: fn(*a, **kw), args.calls), 1)))
        if args.profile:
            row["profile"] = profile_rows(lambda x=x, p=p: anybit.gemm(x, p), args.calls, args.profile)
        rows.append(row)
        lv = "  ".join(f"{nm} {us:.1f}" for nm, us in row["leaves"])
        print(
            f"{case:26s} {p.backend:7s} gemm {row['gemm']:6.1f}  backend {row['backend_gemm']:6.1f}  leaves: {lv}",
            flush=True,
        )
        for r in row.get("profile", []):
            print(f"    {r[1]:7.1f} µs own {r[2]:7.1f} cum  {r[0]}")
    write_probe(args.out, "probe_host_layers", [dict(base=base)] + rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
