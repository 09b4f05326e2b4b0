"""Compile anybit's GPU kernels for sm_90a on a machine without a GPU and read what ptxas made of them.

    python tools/sm90_check.py [--formats w4a16,nvfp4] [--m 1,4,16] [--sass-dir DIR] [--arch 80]

Triton compiles through a stand-in driver (no launch); cuobjdump, shipped with Triton, reports
registers, spills (stack) and shared memory, and the main loop's SASS gives the instruction mix:
how many instructions per iteration, how wide the global loads are (LDG.E.128 = 16 bytes), and
whether the loop goes through shared memory (STS/LDS/BAR) or the tensor cores (HGMMA/HMMA).
Spend device minutes only on kernels that look right here.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import tile_overrides  # noqa: E402

from anybit import quantize  # noqa: E402
from anybit.backends.triton import a8_config, default_config, frag_mid  # noqa: E402
from anybit.backends.triton_layout import to_triton_layout  # noqa: E402
from anybit.kernels.frag import frag_tile, gemm_frag  # noqa: E402
from anybit.kernels.frag_layout import frag_block_k  # noqa: E402
from anybit.kernels.gemm import GemmConfig, gemm_dense  # noqa: E402
from anybit.kernels.quant_act import quantize_act  # noqa: E402


class _StandInDriver(DriverBase):
    """Enough of a CUDA driver for Triton to compile for sm_90a (or `arch`); nothing is launched."""

    arch = 90

    @classmethod
    def is_active(cls):
        return True

    def map_python_to_cpp_type(self, ty):
        return ty

    def get_current_target(self):
        return GPUTarget("cuda", self.arch, 32)

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_benchmarker(self):
        raise NotImplementedError

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


_compiled = []
_run = JITFunction.run


def stand_in(arch: int = 90) -> None:
    """Make the stand-in driver Triton's active one, kernel launches compile only (`_compiled` keeps them)."""
    _StandInDriver.arch = arch
    driver.set_active(_StandInDriver())
    JITFunction.run = _compile_only


def _compile_only(self, *args, grid, warmup, **kwargs):
    kernel = _run(self, *args, grid=grid, warmup=True, **kwargs)
    _compiled.append(kernel)
    return kernel


def loop_stats(sass: str) -> dict:
    """Instruction mix of the innermost loop holding an MMA, else of the largest loop; HAZARD over every
    MMA loop (a kernel may hold several, e.g. the grouped GEMM's half-width tail path)."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)(.*);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(4)))
    loops = []
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if target and int(target.group(1), 16) < addr:
            loops.append([x for x in ins if int(target.group(1), 16) <= x[0] <= addr])
    if not loops:
        return {"loop": 0}
    mma = [b for b in loops if any("MMA" in x[1] for x in b)]
    body = min(mma, key=len) if mma else max(loops, key=len)
    ops = collections.Counter(x[1] for x in body)
    short = collections.Counter(x[1].split(".")[0] for x in body)
    out = {"loop": len(body)}
    out["LDG128"] = sum(v for k, v in ops.items() if k.startswith("LDG") and k.endswith(".128"))
    out["LDGSTS"] = short["LDGSTS"]
    keys = "LDG HGMMA QGMMA HMMA QMMA STS LDS LDSM BAR SHFL FFMA FMUL FADD LOP3 SHF IMAD PRMT I2F F2F HADD2 HMUL2 HFMA2"
    keys += " F2FP"
    for key in keys.split():
        if short[key]:
            out[key] = short[key]
    out["HAZARD"] = sum(pending_operand_writes(b) for b in mma) if mma else pending_operand_writes(body)  # every loop
    return out


def pending_operand_writes(body: list) -> int:
    """Instructions in the loop that write a register a still-pending wgmma reads as its A operand
    (issued, not yet waited for: `WARPGROUP.DEPBAR.LE gsb0, N` leaves the last N wgmma in flight): undefined
    behaviour. Walks the loop twice so a wgmma left in flight at the back edge is seen against the next
    iteration (the 8-bit frag loop's `DEPBAR.LE gsb0, 0x3` of session 15 gave runs of wrong rows on the H200)."""
    pending, hits = [], 0  # A registers of each wgmma in flight, oldest first
    for _, op, rest in body + body:
        regs = re.findall(r"\bR(\d+)\b", rest)
        if op.startswith(("HGMMA", "QGMMA")) and len(regs) >= 2 and re.match(r"\s*R\d+\s*,\s*R\d+", rest):
            pending.append(set(range(int(regs[1]), int(regs[1]) + 4)))
        elif op.startswith("WARPGROUP.DEPBAR"):
            left = re.search(r"0x([0-9a-f]+)", rest)
            keep = int(left.group(1), 16) if left else 0
            pending = pending[len(pending) - keep :] if keep else []
        elif regs and re.match(r"\s*R\d+", rest) and not op.startswith(("ST", "BRA", "ISETP", "FSETP")):
            hits += any(int(regs[0]) in a for a in pending)
    return hits // 2


def check(fmt: str, m: int, n: int, k: int, cuobjdump: str, sass_dir: str | None, pdl: bool = False,
          tiles: dict | None = None, dtype: torch.dtype = torch.bfloat16) -> str:  # fmt: skip
    qw = quantize(torch.randn(n, k) * 0.05, fmt)
    tw = to_triton_layout(qw, allow_frag3=True)  # as the dense backend prepares it
    x = torch.randn(m, k, dtype=dtype)
    cfg = default_config(m, n, k, qw.scheme.weight_bits, 132, interpret=False)
    act, extra = qw.scheme.act, {}
    if tw.codes_a16:  # FP8 codes in bf16 on the A16 frag kernel
        x, xs = quantize_act(x, act, codes_dtype=torch.bfloat16)
        extra = dict(x_scales=xs)
    elif act.quantized:
        cfg = a8_config(cfg, qw.scheme, m, k, tw.nk, interpret=False)
        # compiled, not run: xq holds garbage, which is fine here; frag FP8 x comes with its block sums
        x, xs, *sums = quantize_act(x, act, block_sums=tw.takes_sums)
        extra = dict(x_scales=xs, x_group=act.group, out_dtype=torch.bfloat16, x_sums=sums[0] if sums else None)
    cnt = torch.zeros(1 << 14, dtype=torch.int32)
    _compiled.clear()
    if tw.frag:
        mid = frag_mid(qw.scheme, m, n, k, dtype)
        two = not act.quantized and qw.scheme.weight_bits == 4  # as `pick_config`
        tile = frag_tile(m, n, k, 132, interpret=False, bits=qw.scheme.weight_bits, mid=mid, two=two) | (tiles or {})
        gemm_frag(x, tw, None, workspace=torch.empty(max(1, tile["split_k"] * m * n)), counters=cnt,
                  x_scales=extra.get("x_scales"), x_sums=extra.get("x_sums"), pdl=pdl, **tile)  # fmt: skip
        cfg = GemmConfig(
            tile["block_m"], tile["block_n"], frag_block_k(qw.scheme.weight_bits), num_warps=tile["num_warps"]
        )
    else:
        ws = torch.empty(max(1, cfg.split_k * m * n))
        extra.pop("x_sums", None)
        gemm_dense(x, tw, None, config=cfg, workspace=ws, counters=cnt, **extra)
    return _report(f"{fmt:28s} M={m:<4d}", _compiled[-1], cfg.block_k, cfg.block_n, cfg.num_warps, cuobjdump,
                   sass_dir and (sass_dir, f"{fmt}_m{m}"))  # fmt: skip


def check_moe(
    fmt: str, per_expert: int, n: int, k: int, cuobjdump: str, sass_dir: str | None, maxnreg: int | None = None,
    pdl: bool = False, tiles: dict | None = None, slots: bool = False,
) -> str:  # fmt: skip
    """The grouped MoE GEMM with the tile `moe_tiles` picks for `per_expert` rows per expert (`tiles`:
    overrides of it); slots: its slot-block form (`moe_gemm(sorted_ids=None)`, the down GEMM's top-k sum)."""
    from anybit.backends.triton_layout import stack_experts
    from anybit.kernels.moe_gemm import moe_block_k, moe_block_n, moe_gemm, moe_tile_kind
    from anybit.moe.align import moe_align
    from anybit.moe.layer import moe_tiles

    e, top_k = 8, 2
    tw = stack_experts(quantize(torch.randn(e, n, k) * 0.05, fmt))
    t = max(1, per_expert * e // top_k)
    tiles = moe_tiles(t * top_k, e, cuda=True, kind=moe_tile_kind(tw, torch.bfloat16)) | (tiles or {})
    ids = torch.randint(0, e, (t, top_k))
    sorted_ids, expert_ids, total = moe_align(ids, e, tiles["block_m"])
    x, extra = torch.randn(t, k, dtype=torch.bfloat16), {}
    if tw.codes_a16:  # FP8 codes in bf16 on the A16 grouped kernel
        x, xs = quantize_act(x, tw.scheme.act, codes_dtype=torch.bfloat16)
        extra = dict(x_scales=xs, out_dtype=torch.bfloat16)
    elif tw.scheme.act.quantized:  # compiled, not run: the quantized x holds garbage, which is fine here
        x, xs, *sums = quantize_act(x, tw.scheme.act, block_sums=tw.takes_sums)
        group = tw.scheme.act.group if tw.scheme.act.mode.name == "GROUP" else 0
        extra = dict(x_scales=xs, x_group=group, out_dtype=torch.bfloat16, x_sums=sums[0] if sums else None)
    _compiled.clear()
    if slots:  # x's rows stand in for the down GEMM's slots
        ws, cnt = torch.empty(t * top_k * tiles["block_m"] * n), torch.zeros(t * n, dtype=torch.int32)
        moe_gemm(x, tw, None, ids.reshape(-1)[:t], None, num_rows=t, top_k=1, sum_slots=top_k, workspace=ws,
                 counters=cnt, routed_weights=torch.ones(t), **tiles, maxnreg=maxnreg, pdl=pdl and tw.frag,
                 **extra)  # fmt: skip
    else:
        moe_gemm(x, tw, sorted_ids, expert_ids, total, num_rows=t * top_k, top_k=top_k, silu_mul=True, **tiles,
                 maxnreg=maxnreg, pdl=pdl and tw.frag, **extra)  # fmt: skip
    bits = tw.fmt["W_BITS"]
    block_k = frag_block_k(bits) if tw.frag else moe_block_k(tw, tiles["block_k"], tw.scheme.act.quantized)
    block_n = moe_block_n(tw, tiles["block_n"], tiles["num_warps"])
    return _report(f"moe {fmt:24s} rows/E={per_expert:<4d}", _compiled[-1], block_k, block_n,
                   tiles["num_warps"], cuobjdump, sass_dir and (sass_dir, f"moe_{fmt}_{per_expert}"))  # fmt: skip


def check_ws(fmt: str, m: int, n: int, k: int, cuobjdump: str, sass_dir: str | None, tiles: dict | None = None,
             dtype: torch.dtype = torch.bfloat16) -> str:  # fmt: skip
    """The warp-specialised large-M Gluon kernel (`anybit.kernels.frag_ws`) on a frag weight."""
    from anybit.kernels.frag_ws import gemm_frag_ws, ws_tile

    tw = to_triton_layout(quantize(torch.randn(n, k) * 0.05, fmt), allow_frag3=True)  # (as the dense backend)
    bits = tw.fmt["W_BITS"]
    tile = (ws_tile(m, n, bits=bits) or ws_tile(1024, 8192, bits=bits)) | (tiles or {})
    _compiled.clear()
    gemm_frag_ws(torch.randn(m, k, dtype=dtype), tw, **tile)
    return _report(f"ws {fmt:25s} M={m:<4d}", _compiled[-1], 64, tile["block_n"], tile["dq_warps"], cuobjdump,
                   sass_dir and (sass_dir, f"ws_{fmt}_{m}"))  # fmt: skip


def check_rs(fmt: str, m: int, n: int, k: int, cuobjdump: str, sass_dir: str | None, tiles: dict | None = None,
             dtype: torch.dtype = torch.bfloat16) -> str:  # fmt: skip
    """The experimental register-operand Gluon kernel (`anybit.kernels.frag_rs`) on a frag weight."""
    from anybit.kernels.frag_rs import gemm_frag_rs

    tw = to_triton_layout(quantize(torch.randn(n, k) * 0.05, fmt), allow_frag3=True)
    tile = dict(block_m=128) | (tiles or {})
    _compiled.clear()
    if tile.pop("wide", 0):  # the wide persistent stream-K form (`frag_rsp.gemm_frag_rsw`), 132 CTAs
        from anybit.kernels.frag_rsp import gemm_frag_rsw

        times = torch.zeros(132 * 80, dtype=torch.int64) if tile.pop("times", 0) else None  # (TIMES; 4 panels)
        gemm_frag_rsw(torch.randn(m, k, dtype=dtype), tw, ctas=132, times=times, **tile)
    elif tile.pop("persistent", 0):  # the persistent stream-K form (`frag_rsp`), 132 CTAs
        from anybit.kernels.frag_rsp import gemm_frag_rsp

        gemm_frag_rsp(torch.randn(m, k, dtype=dtype), tw, ctas=132, **tile)
    else:
        gemm_frag_rs(torch.randn(m, k, dtype=dtype), tw, **tile)
    return _report(f"rs {fmt:25s} M={m:<4d}", _compiled[-1], 128, 64, 4, cuobjdump,
                   sass_dir and (sass_dir, f"rs_{fmt}_{m}"))  # fmt: skip


def check_ws_a8(fmt: str, m: int, n: int, k: int, cuobjdump: str, sass_dir: str | None,
                tiles: dict | None = None) -> str:  # fmt: skip
    """The warp-specialised large-M W4A8 Gluon kernel (`anybit.kernels.frag_ws_a8`) on an FP8-frag weight."""
    from anybit.kernels.frag_ws_a8 import WIDE_TOKENS, gemm_frag_ws_a8

    tw = to_triton_layout(quantize(torch.randn(n, k) * 0.05, fmt))
    tile = dict(dq_warps=2 if (tiles or {}).get("wide") else 4) | (tiles or {})
    _compiled.clear()
    gemm_frag_ws_a8(torch.randn(m, k, dtype=torch.bfloat16), tw, **tile)
    rows = WIDE_TOKENS if tile.get("wide") else 128
    return _report(f"ws-a8 {fmt:22s} M={m:<4d}", _compiled[-1], rows, tile.get("block_n", 128), tile["dq_warps"],
                   cuobjdump, sass_dir and (sass_dir, f"ws_a8_{fmt}_{m}"))  # fmt: skip


def check_moe_ws(fmt: str, per_expert: int, n: int, k: int, cuobjdump: str, sass_dir: str | None,
                 tiles: dict | None = None) -> str:  # fmt: skip
    """The warp-specialised grouped MoE kernel (`anybit.kernels.moe_ws`; W4A8 experts: `moe_ws_a8`), gate_up with
    silu * mul."""
    from anybit.backends.triton_layout import stack_experts
    from anybit.kernels.moe_ws import moe_gemm_ws, moe_ws_tile
    from anybit.kernels.moe_ws_a8 import WS_A8_BLOCK_M, moe_gemm_ws_a8
    from anybit.moe.align import moe_align

    e, top_k = 8, 2
    tw = stack_experts(quantize(torch.randn(e, n, k) * 0.05, fmt))
    t = max(1, per_expert * e // top_k)
    a8 = tw.scheme.act.quantized
    tile = (dict(block_m=WS_A8_BLOCK_M) if a8 else moe_ws_tile(t * top_k, e)) | (tiles or {})
    sorted_ids, expert_ids, total = moe_align(torch.randint(0, e, (t, top_k)), e, tile["block_m"])
    x = torch.randn(t, k, dtype=torch.bfloat16)
    _compiled.clear()
    if a8:  # compiled, not run: the quantized x holds garbage, which is fine here
        xq, xs = quantize_act(x, tw.scheme.act)
        moe_gemm_ws_a8(xq, tw, sorted_ids, expert_ids, total, num_rows=t * top_k, top_k=top_k, x_scales=xs,
                       silu_mul=True, **tile)  # fmt: skip
    else:
        moe_gemm_ws(x, tw, sorted_ids, expert_ids, total, num_rows=t * top_k, top_k=top_k, silu_mul=True, **tile)
    return _report(f"moe-ws {fmt:21s} rows/E={per_expert:<4d}", _compiled[-1], 128 if a8 else 64,
                   tile.get("block_n", 128), tile.get("dq_warps", 4), cuobjdump,
                   sass_dir and (sass_dir, f"moe_ws_{fmt}_{per_expert}"))  # fmt: skip


def check_moe_rs(fmt: str, per_expert: int, n: int, k: int, cuobjdump: str, sass_dir: str | None,
                 tiles: dict | None = None) -> str:  # fmt: skip
    """The register-operand grouped MoE kernel (`anybit.kernels.moe_rs`), the down GEMM's scatter epilogue."""
    from anybit.backends.triton_layout import stack_experts
    from anybit.kernels.moe_rs import moe_gemm_rs, moe_rs_block_m
    from anybit.moe.align import moe_align

    e, top_k = 8, 2
    tw = stack_experts(quantize(torch.randn(e, n, k) * 0.05, fmt))
    t = max(1, per_expert * e // top_k)
    tile = dict(block_m=moe_rs_block_m(t * top_k, e)) | (tiles or {})
    sorted_ids, expert_ids, total = moe_align(torch.randint(0, e, (t, top_k)), e, tile["block_m"])
    _compiled.clear()
    x = torch.randn(sorted_ids.numel(), k, dtype=torch.bfloat16)
    moe_gemm_rs(x, tw, sorted_ids, expert_ids, total, num_rows=t * top_k, scatter=True,
                routed_weights=torch.rand(t * top_k), **tile)  # fmt: skip
    return _report(f"moe-rs {fmt:21s} rows/E={per_expert:<4d} BM={tile['block_m']:<3d}", _compiled[-1], 128, 64, 4,
                   cuobjdump, sass_dir and (sass_dir, f"moe_rs_{fmt}_{per_expert}"))  # fmt: skip


def _report(label: str, kernel, block_k: int, block_n: int, warps: int, cuobjdump: str, sass_to) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True).stdout
    if sass_to:
        sass_dir, name = sass_to
        os.makedirs(sass_dir, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9]+", "_", name)
        with open(os.path.join(sass_dir, name + ".sass"), "w") as f:
            f.write(sass)
        for ext in ("ttgir", "ptx"):
            with open(os.path.join(sass_dir, f"{name}.{ext}"), "w") as f:
                f.write(kernel.asm[ext])
    regs = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    stats = loop_stats(sass)
    per_thread = block_k * block_n / (32 * warps)
    ipe = stats["loop"] / per_thread
    mix = " ".join(f"{key}:{v}" for key, v in stats.items() if key != "loop")
    if "griddepcontrol.wait" in kernel.asm["ptx"]:
        mix += " PDL-WAIT"
    return (
        f"{label} REG={regs.group(1) if regs else '?':>3s} STACK={regs.group(2) if regs else '?':<3s}"
        f" SMEM={kernel.metadata.shared:<6d} loop={stats['loop']:<4d} instr/weight={ipe:.2f}  {mix}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--formats", default="w4a16,w8a16,w3a16,nvfp4,mxfp4,w4a16:e2m1:g64:bf16")
    ap.add_argument("--m", default="1,4,16")
    ap.add_argument("--shape", default="8192,8192", help="N,K")
    ap.add_argument("--sass-dir", default=None, help="write each kernel's SASS and PTX here")
    ap.add_argument("--moe", default=None, help="check the grouped MoE GEMM at these rows per expert, e.g. 1,32,128")
    ap.add_argument("--maxnreg", type=int, default=None, help="with --moe: cap its registers per thread")
    ap.add_argument("--slots", action="store_true", help="with --moe: the slot-block form (few tokens, top-k sum)")
    ap.add_argument("--tiles", default="", help="tile overrides, e.g. block_m=256:num_warps=8 (frag, --moe, --ws)")
    ap.add_argument("--ws", action="store_true", help="the warp-specialised large-M Gluon kernel (frag_ws)")
    ap.add_argument("--rs", action="store_true", help="the register-operand Gluon kernel (frag_rs; --moe: moe_rs)")
    ap.add_argument("--pdl", action="store_true", help="frag kernels as programmatic dependents (ANYBIT_PDL)")
    ap.add_argument("--arch", type=int, default=90, help="compute capability to compile for (80: Ampere, 89: Ada)")
    ap.add_argument("--fp16", action="store_true", help="fp16 activations (A16 dense, ws and rs kernels; default bf16)")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: this compiles real sm_90a code")
    stand_in(args.arch)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    n, k = (int(v) for v in args.shape.split(","))
    failed = 0
    tiles = tile_overrides(args.tiles)
    dtype = torch.float16 if args.fp16 else torch.bfloat16
    run = (
        functools.partial(check_moe_rs, tiles=tiles)
        if args.rs and args.moe
        else functools.partial(check_rs, tiles=tiles, dtype=dtype)
        if args.rs
        else functools.partial(check_moe_ws, tiles=tiles)
        if args.ws and args.moe
        else functools.partial(check_ws_a8, tiles=tiles)
        if args.ws and "a8" in args.formats
        else functools.partial(check_ws, tiles=tiles, dtype=dtype)
        if args.ws
        else functools.partial(
            check_moe,
            maxnreg=args.maxnreg,
            pdl=args.pdl,
            tiles=tiles,
            slots=args.slots,
        )
        if args.moe
        else functools.partial(check, pdl=args.pdl, tiles=tiles, dtype=dtype)
    )
    for fmt in args.formats.split(","):
        for m in (int(v) for v in (args.moe or args.m).split(",")):
            try:
                print(run(fmt, m, n, k, cuobjdump, args.sass_dir), flush=True)
            except Exception as ex:  # report and go on: one broken kernel should not hide the others
                failed += 1
                chain = [ex]
                while chain[-1].__cause__ is not None:  # Triton nests the failing helper's error
                    chain.append(chain[-1].__cause__)
                where = str(chain[-2])[-600:] if len(chain) > 1 else ""
                print(f"{fmt:28s} M={m:<4d} COMPILE FAIL {type(chain[-1]).__name__}: {str(chain[-1])[-300:]}\n{where}",
                      flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
