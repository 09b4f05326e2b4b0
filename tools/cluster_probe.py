"""Can this Triton's Gluon share one TMA load between the CTAs of a cluster (Hopper TMA multicast, what Humming's
2-CTA clusters use)? Compiles small kernels for sm_90a on this machine (the stand-in driver of `sm90_check.py`, no
GPU) and reads their PTX. Each case runs in its own process (a layout the compiler rejects aborts it in LLVM).

    python tools/cluster_probe.py        # needs Triton with Gluon (3.6: the sm_90a compile-check venv)

Cases: "one" one CTA; "replicated" num_ctas=2 with the tile replicated in both CTAs' shared memory (a multicast
candidate); "split" num_ctas=2, each CTA holding half the rows, converted to a replicated register layout (an
exchange through distributed shared memory). Prints per case whether it compiled, whether the PTX asks for a
cluster and whether any load is `.multicast::cluster`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

CASE = r"""
import sys
sys.path.insert(0, {tools!r}); sys.path.insert(0, {root!r})
import torch
from sm90_check import stand_in, _compiled
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma, mbarrier, fence_async_shared
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

CASE, BM, BK = {case!r}, 128, 64
CTAS = 1 if CASE == "one" else 2
CGA = [] if CASE == "one" else ([[0, 0]] if CASE == "replicated" else [[64, 0]])
REP = [] if CASE == "one" else [[0, 0]]


@gluon.jit
def kernel(desc, out_ptr, BM: gl.constexpr, BK: gl.constexpr, SMEM: gl.constexpr, LOADED: gl.constexpr,
           OUT: gl.constexpr):
    buf = gl.allocate_shared_memory(gl.bfloat16, [BM, BK], SMEM)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    fence_async_shared()
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [0, 0], bar, buf)
    mbarrier.wait(bar, 0)
    v = gl.convert_layout(buf.load(LOADED), OUT)
    r = gl.arange(0, BM, layout=gl.SliceLayout(1, OUT))
    c = gl.arange(0, BK, layout=gl.SliceLayout(0, OUT))
    gl.store(out_ptr + r[:, None] * BK + c[None, :], v)


stand_in(90)
smem = gl.NVMMASharedLayout(128, 16, 2, cga_layout=CGA)
loaded = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=CGA)
out_layout = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=REP)
x = torch.empty(BM * 4, BK * 4, dtype=torch.bfloat16)
box = [BM // 2 if CASE == "split" else BM, BK]
desc = TensorDescriptor.from_tensor(x, box, gl.NVMMASharedLayout(128, 16, 2))
kernel[(CTAS,)](desc, torch.empty(BM, BK, dtype=torch.bfloat16), BM, BK, smem, loaded, out_layout, num_warps=4,
                num_ctas=CTAS)
ptx = _compiled[-1].asm["ptx"]
print("cluster" if ".reqnctapercluster" in ptx else "no-cluster", "multicast" if ".multicast::cluster" in ptx else
      "no-multicast", "dsmem" if "mapa" in ptx or "shared::cluster.u" in ptx else "no-dsmem")
"""


def main() -> int:
    tools = os.path.dirname(os.path.abspath(__file__))
    for case in ("one", "replicated", "split"):
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:  # Gluon reads the kernel's source
            f.write(CASE.format(tools=tools, root=os.path.dirname(tools), case=case))
        run = subprocess.run([sys.executable, f.name], capture_output=True, text=True)
        os.unlink(f.name)
        lines = (run.stdout + run.stderr).strip().splitlines()
        tail = (
            lines[-1]
            if run.returncode == 0 and lines
            else next((ln for ln in lines if "ERROR" in ln or "Error" in ln), lines[-1] if lines else "no output")
        )
        print(f"{case:11s} {'compiled' if run.returncode == 0 else 'FAILED':9s} {tail[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
