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

_BOUND, _LAUNCHED = [], []  # what Triton's run binds (its binder), and what a fast launch passes to the launcher


def _compile_only(self, *args, grid, warmup, **kwargs):
    """JITFunction.run that compiles and returns the kernel with its launcher stubbed (the Launcher then keeps it);
    records the argument list Triton's run would launch with."""
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    kernel._run, kernel.function = (lambda *a: _LAUNCHED.append(a[9:])), 0
    bound = self.device_caches[0][4](*args, **kwargs)[0]
    _BOUND.append(list(bound.values()))
    return kernel


def _same(a, b) -> bool:
    """Whether two launch arguments are the same kind of value: tensors of one shape, dtype and strides, descriptors of
    one tile, layout and tensor shape, equal scalars."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return type(a) is type(b) and (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
    if hasattr(a, "block_shape"):
        key = lambda d: (type(d), list(d.block_shape), d.layout, tuple(d.shape), tuple(d.strides))  # noqa: E731
        return key(a) == key(b)
    return type(a) is type(b) and a == b


def check_arguments(cases: dict) -> int:
    """Each launcher twice with the same inputs: the fast launch's arguments against Triton's bound ones."""
    bad = 0
    for name, call in cases.items():
        _BOUND.clear()
        _LAUNCHED.clear()
        call()
        call()
        if not _BOUND or len(_BOUND) != len(_LAUNCHED):  # each kernel of the call once through each path
            print(f"{name:22s} FAIL: {len(_BOUND)} Triton runs, {len(_LAUNCHED)} fast launches (want as many)")
            bad += 1
            continue
        for want, got in zip(_BOUND, map(list, _LAUNCHED), strict=True):
            diff = [i for i in range(max(len(want), len(got)))
                    if i >= len(want) or i >= len(got) or not _same(want[i], got[i])]  # fmt: skip
            print(f"{name:22s} {'ok' if not diff else f'FAIL at {diff}'} ({len(got)} arguments)")
            bad += bool(diff)
    return bad


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
    ap.add_argument("--check", action="store_true", help="compare each launcher's fast launch with Triton's binding")
    args = ap.parse_args()
    driver.set_active(sm90_check._StandInDriver())
    JITFunction.run = _compile_only
    from anybit.kernels.frag_rs import gemm_frag_rs
    from anybit.kernels.frag_ws import gemm_frag_ws

    tw = to_triton_layout(quantize(torch.randn(4096, 4096) * 0.05, "w4a16"))
    if args.check:
        return check_arguments(_check_cases(tw))
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


def _check_cases(tw) -> dict:
    """Every Launcher call site on CPU inputs (W4A16, NVFP4, W8A16 and W4A8 weights; bias and split-K where they take
    them)."""
    from anybit.formats.scheme import Scheme
    from anybit.kernels.frag import gemm_frag
    from anybit.kernels.frag_dequant import dequantize_frag
    from anybit.kernels.frag_rs import gemm_frag_rs
    from anybit.kernels.frag_ws import gemm_frag_ws
    from anybit.kernels.frag_ws_a8 import gemm_frag_ws_a8
    from anybit.kernels.quant_act import quantize_act

    nv = to_triton_layout(quantize(torch.randn(4096, 4096) * 0.05, "nvfp4"))
    a8 = to_triton_layout(quantize(torch.randn(8192, 2048) * 0.05, "w4a8"))
    w8 = to_triton_layout(quantize(torch.randn(4096, 4096) * 0.05, "w8a16"))
    x = torch.randn(256, 4096, dtype=torch.bfloat16)
    b = torch.randn(4096, dtype=torch.bfloat16)
    y = torch.empty(256, 4096, dtype=torch.bfloat16)
    ws, cnt = torch.empty(2 * 256 * 4096), torch.zeros(4096, dtype=torch.int32)
    x16 = x[:16].contiguous()
    y16 = torch.empty(16, 4096, dtype=torch.bfloat16)
    return {
        "gemm_frag_rs": lambda: gemm_frag_rs(x, tw, b, out=y, block_m=128),
        "gemm_frag_rs split": lambda: gemm_frag_rs(x, tw, out=y, block_m=128, split_k=2, workspace=ws, counters=cnt),
        "gemm_frag_rs nvfp4 96": lambda: gemm_frag_rs(x[:96], nv, out=y[:96], block_m=96),
        "gemm_frag_ws": lambda: gemm_frag_ws(x, tw, b, out=y),
        "gemm_frag_ws swap": lambda: gemm_frag_ws(x, tw, out=y, swap=True, block_m=160, block_n=64),
        "gemm_frag_ws w8a16 two decoders": lambda: gemm_frag_ws(x, w8, b, out=y, ndec=2, stages=3, depth=2),
        "gemm_frag_rs w8a16 split": lambda: gemm_frag_rs(
            x, w8, out=y, block_m=128, split_k=2, workspace=ws, counters=cnt
        ),  # fmt: skip
        "gemm_frag": lambda: gemm_frag(x16, tw, b, out=y16, block_m=16, block_n=64),
        "gemm_frag split": lambda: gemm_frag(
            x16, tw, out=y16, block_m=16, block_n=64, split_k=2, workspace=ws, counters=cnt
        ),  # fmt: skip
        "gemm_frag_ws_a8": lambda: gemm_frag_ws_a8(
            torch.randn(256, 2048, dtype=torch.bfloat16), a8, out=torch.empty(256, 8192, dtype=torch.bfloat16)
        ),  # fmt: skip
        "dequantize_frag": lambda: dequantize_frag(tw, dtype=torch.bfloat16),
        **_moe_cases(),
        "quantize_act": lambda: quantize_act(x, Scheme.parse("w4a8").act),
    }


def _moe_cases() -> dict:
    """`moe_gemm` on fragment-layout experts (W4A16 gate_up with SiLU-and-mul; the down GEMM with routed weights)."""
    from anybit.backends.triton_layout import stack_experts
    from anybit.kernels.moe_gemm import moe_gemm
    from anybit.moe.align import moe_align

    e, t, top = 8, 5, 2
    gate_up = stack_experts(quantize(torch.randn(e, 512, 1024) * 0.05, "w4a16"))
    down = stack_experts(quantize(torch.randn(e, 1024, 256) * 0.05, "w4a16"))
    ids = torch.randint(0, e, (t, top), generator=torch.Generator().manual_seed(0)).int()
    sorted_ids, expert_ids, total = moe_align(ids, e, 16, impl="torch")
    x = torch.randn(t, 1024, dtype=torch.bfloat16)
    h = torch.empty(t * top, 256, dtype=torch.bfloat16)
    y = torch.empty(t * top, 1024, dtype=torch.bfloat16)
    routed = torch.rand(t * top)
    return {
        "moe_gemm gate_up": lambda: moe_gemm(
            x, gate_up, sorted_ids, expert_ids, total, block_m=16, num_rows=t * top, top_k=top, out=h, silu_mul=True
        ),  # fmt: skip
        "moe_gemm down": lambda: moe_gemm(
            h, down, sorted_ids, expert_ids, total, block_m=16, num_rows=t * top, top_k=1, out=y, routed_weights=routed
        ),  # fmt: skip
    }


if __name__ == "__main__":
    sys.exit(main())
