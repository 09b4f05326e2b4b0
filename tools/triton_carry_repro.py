"""A Triton 3.6 miscompile met in session 38 (`frag_rsp_kernel` hung on the H200): a scalar carried by an outer loop
whose only uses in the loop are an inner loop's trip count and its own update is dropped — every outer iteration
runs the inner loop with the scalar's first value. Plain Triton loses it in `tritongpu-remove-layout-conversions`,
Gluon in `gluon-inline`; used inside the inner body too, it is kept. Compiles for sm_90a through `sm90_check`'s
stand-in driver (no GPU) and says whether this Triton still drops it:

    PYTHONPATH=. python tools/triton_carry_repro.py   (with a Triton that has the sm_90a backend, e.g. 3.6)

Workaround in the kernels: derive such a value from a counter the loop carries and uses (`frag_rsp_kernel._p_mma`)."""

import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(__file__))
import sm90_check  # noqa: E402


@triton.jit
def _carry(y_ptr, u0, u1, nb):
    kb = 2 * u0
    g = 0
    for t in range(u0, u1):
        kb_hi = nb - t
        n = (kb_hi - kb + 1) // 2
        for _ in range(n):
            g += 2
        kb = kb + 2 * n - kb_hi  # the next outer iteration's start: dropped
    tl.store(y_ptr, g)


def main() -> int:
    sm90_check.stand_in(90)
    kernel = _carry.warmup(torch.empty(1, dtype=torch.int32), 3, 9, 11, grid=(1,))
    outer = next(line for line in kernel.asm["ttgir"].splitlines() if "scf.for" in line)
    dropped = "(i32)  :" in outer  # the outer loop carries g alone
    print(f"triton {triton.__version__}: the loop-carried kb is {'DROPPED (miscompile)' if dropped else 'kept'}")
    print(outer.strip())
    return 1 if dropped else 0


if __name__ == "__main__":
    sys.exit(main())
