"""Whether Triton's cache of a Gluon kernel compiled on the CPU machine (sm_90a through `sm90_check.py`'s stand-in
driver, same Triton 3.6 wheel and Python 3.12) is hit on the device — if so, a carried cache skips the compiles that
dominate GPU test time. Here:

    TRITON_CACHE_DIR=$PWD/.tcache /tmp/v312/bin/python tools/sm90_check.py --ws --formats w4a16 --m 1024 \
        --shape 8192,8192
    python tools/cache_probe.py --keys     # this side's key parts

On the device (carrying .tcache): python tools/cache_probe.py --cache .tcache — the same call (`check_ws`'s weight,
x and tile) with the cache copied to a fresh directory: prints the key parts, the first call's seconds and whether
it compiled anything new (a miss).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import time


def key_parts() -> dict:
    """What Triton's cache key is made of besides the kernel: its own source and libtriton, ptxas, the env vars it
    counts."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.nvidia.compiler import get_ptxas_version
    from triton.runtime.cache import triton_key

    return {"triton_key": hashlib.sha256(triton_key().encode()).hexdigest()[:16], "ptxas": get_ptxas_version(90),
            "env": get_cache_invalidating_env_vars(), "python": sys.version.split()[0]}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=None, help="the carried cache directory (device side)")
    ap.add_argument("--keys", action="store_true", help="print the key parts only")
    ap.add_argument("--fmt", default="w4a16")
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--shape", default="8192,8192")
    args = ap.parse_args()
    if args.keys:
        print(key_parts())
        return 0
    fresh = "/tmp/anybit-tcache"
    shutil.rmtree(fresh, ignore_errors=True)
    shutil.copytree(args.cache, fresh)
    os.environ["TRITON_CACHE_DIR"] = fresh  # (before Triton reads its knobs)
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from anybit import quantize
    from anybit.backends.triton_layout import to_triton_layout
    from anybit.kernels.frag_ws import gemm_frag_ws, ws_tile

    print(key_parts())
    before = set(os.listdir(fresh))
    n, k = (int(v) for v in args.shape.split(","))
    tw = to_triton_layout(quantize(torch.randn(n, k, device="cuda") * 0.05, args.fmt), allow_frag3=True)
    bits = tw.fmt["W_BITS"]
    tile = ws_tile(args.m, n, bits=bits) or ws_tile(1024, 8192, bits=bits)
    x = torch.randn(args.m, k, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    gemm_frag_ws(x, tw, **tile)
    torch.cuda.synchronize()
    new = {d: sorted(os.listdir(os.path.join(fresh, d))) for d in sorted(set(os.listdir(fresh)) - before)}
    # (the driver's launcher and utility modules are cached there too, and a CPU-built cache never holds them: a new
    # entry without a cubin is one of those, not the kernel compiled again)
    kernel = [d for d, files in new.items() if any(f.endswith(".cubin") for f in files)]
    print(f"first call {time.perf_counter() - t0:.2f} s; new entries {new}")
    print(f"MISS: the kernel compiled again in {kernel}" if kernel else "HIT: no kernel compiled")
    return 0


if __name__ == "__main__":
    sys.exit(main())
