"""The host time of the Gluon launchers' Python on this machine, without a GPU: Triton compiles for sm_90a through
`sm90_check`'s stand-in driver, the compiled kernel's launcher is stubbed (nothing runs), so a call's time is ours and
Triton's Python before the launch (the device's host is ~1.5-2.5x slower; compare changes here, confirm there).

    PYTHONPATH=. python tools/host_cpu.py [--calls 2000] [--profile 15]     (a Triton with Gluon's Hopper API)
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import sm90_check  # noqa: E402
import torch  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from anybit import quantize  # noqa: E402
from anybit.backends.triton_layout import to_triton_layout  # noqa: E402


def _compile_only(self, *args, grid, warmup, **kwargs):
    """JITFunction.run that compiles and returns the kernel with its launcher stubbed (the Launcher then keeps it)."""
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    kernel._run, kernel.function = (lambda *a: None), 0
    return kernel


_run = JITFunction.run


def per_call_us(fn, calls: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", type=int, default=0, help="cProfile rows to print per case (0: none)")
    args = ap.parse_args()
    driver.set_active(sm90_check._StandInDriver())
    JITFunction.run = _compile_only
    from anybit.kernels.frag_rs import gemm_frag_rs
    from anybit.kernels.frag_ws import gemm_frag_ws

    tw = to_triton_layout(quantize(torch.randn(4096, 4096) * 0.05, "w4a16"))
    cases = {
        "gemm_frag_rs M=256": (gemm_frag_rs, torch.randn(256, 4096, dtype=torch.bfloat16), dict(block_m=128)),
        "gemm_frag_ws M=1024": (gemm_frag_ws, torch.randn(1024, 4096, dtype=torch.bfloat16), {}),
    }
    for name, (fn, x, kw) in cases.items():
        call = lambda fn=fn, x=x, kw=kw: fn(x, tw, **kw)  # noqa: E731
        print(f"{name:22s} {per_call_us(call, args.calls):6.1f} µs a call", flush=True)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.calls):
                call()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
