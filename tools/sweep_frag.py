"""Sweep the fragment-layout (swap-AB) W4A16 kernel's tiles on the GPU against the bit-plane kernel
and Humming on the same weights (CUDA-graph µs per call, weight copies beyond L2), to set `frag_tile`.

    python tools/sweep_frag.py [--shapes 8192x8192,28672x4096] [--m 1,4,16,32,64] [--scheme w4a16] [--out DIR]

Prints per (shape, M): the default tile's time, the best swept tile, the bit-plane kernel's default
and humming (when installed); writes every sample to DIR/sweep_frag_<scheme>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import relaunch_check  # noqa: E402

import anybit  # noqa: E402
from anybit.backends import get_backend  # noqa: E402
from anybit.backends.base import Prepared  # noqa: E402
from anybit.backends.triton import pick_config  # noqa: E402
from anybit.backends.triton_layout import to_triton_layout  # noqa: E402
from anybit.bench.timing import median, time_graph  # noqa: E402
from anybit.kernels.gemm import GemmConfig  # noqa: E402

TILES = [(64, 4, 4), (128, 4, 4), (128, 4, 6), (128, 8, 3), (256, 8, 3), (256, 4, 3)]  # (block_n, warps, stages)
COPIES = 4


def _time(backend, x, preps, config=None) -> float:
    """Graph µs per call of backend.gemm over the weight copies."""
    kw = {} if config is None else {"config": config}
    fns = [lambda p=p: backend.gemm(x, p, **kw) for p in preps]
    return median(time_graph(fns, 20, 15, 20))


def note_tile(res: dict, n: int, k: int, m: int, name: str, us: float) -> None:
    """Print one timed tile and keep it as res["best"] when it is the fastest so far."""
    print(f"  {n}x{k} M={m} {name}: {us:7.1f}", flush=True)
    if us < res.get("best", (1e9,))[0]:
        res["best"] = (us, name)


def write_sweep(out_dir: str, name: str, rows: list, summary: list) -> None:
    """Every sample and the per-(shape, M) summary as out_dir/name.json (":" of scheme names as "_")."""
    with open(os.path.join(out_dir, f"{name}.json".replace(":", "_")), "w") as f:
        json.dump(dict(rows=rows, summary=summary, commit=os.environ.get("ANYBIT_COMMIT")), f, indent=1)


def humming_copies(qw) -> list:
    """COPIES of `qw` prepared for the humming backend, or none (said why: not installed, or refused)."""
    try:
        return [anybit.prepare(qw, backend="humming") for _ in range(COPIES)]
    except Exception as e:  # the sweep goes on without it
        print("humming:", repr(e)[:160])
        return []


def checked_time(backend, x, preps, config, ref) -> float | None:
    """Graph µs of `config` after it matched `ref` (first rows) and its relaunch bit for bit; None (said why) when
    it is wrong or does not compile or fit."""
    try:
        why = relaunch_check(lambda: backend.gemm(x, preps[0], config=config), ref)
        if why is None:
            return _time(backend, x, preps, config)
        print("wrong", config, why)
    except Exception as e:  # a tile that does not compile or fit is reported and skipped
        print("skip", config, repr(e)[:120])
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8192x8192,28672x4096,4096x14336,8192x28672", help="NxK,...")
    ap.add_argument("--m", default="1,4,16,32,64")
    ap.add_argument("--scheme", default="w4a16")
    ap.add_argument(
        "--tiles",
        default="",
        help="only these tiles, [BMx]BNxWARPSxSTAGES,... (default: all of TILES; "
        "BM: the default rule's token tile where not given)",
    )
    ap.add_argument("--splits", default="1,2,4,8")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--label", default="", help="suffix of the JSON file's name")
    args = ap.parse_args()
    tri = get_backend("triton")
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")] if args.tiles else TILES
    splits = [int(v) for v in args.splits.split(",")]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, summary = [], []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        qw = anybit.quantize(torch.randn(n, k, device="cuda") * 0.02, args.scheme)
        frag = [anybit.prepare(qw, backend="triton") for _ in range(COPIES)]
        planes = [Prepared("triton", qw, to_triton_layout(qw, allow_frag=False)) for _ in range(COPIES)]
        hum = humming_copies(qw)
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda").bfloat16()
            if qw.scheme.act.quantized:  # x is quantized inside the call: the route (GPU-tested) is the reference
                ref = tri.gemm(x[:64], frag[0]).double()
            else:
                ref = x[:64].double() @ qw.dequantize().double().T
            tw = frag[0].data  # the backend's rule for this weight (FP8-MMA weights pick their own splits)
            default = dataclasses.asdict(pick_config(m, n, k, tw.kernel_scheme, sms, False, tw.nk, tw.mma_a8, tw.frag))
            bm = default["block_m"]
            res = {"default": _time(tri, x, frag)}
            for tile in tiles:
                tbm, (bn, warps, stages), regs = (tile[0], tile[1:4], tile[4:]) if len(tile) >= 4 else (bm, tile, ())
                for split in splits:
                    cfg = GemmConfig(tbm, bn, 128, split, num_warps=warps, num_stages=stages,
                                     maxnreg=regs[0] if regs else None)  # fmt: skip
                    us = checked_time(tri, x, frag, cfg, ref)
                    if us is None:
                        continue
                    name = f"bm{tbm} bn{bn} w{warps} s{stages} sk{split}" + (f" r{regs[0]}" if regs else "")
                    rows.append(dict(n=n, k=k, m=m, bm=tbm, bn=bn, warps=warps, stages=stages, split=split, us=us,
                                     maxnreg=cfg.maxnreg))  # fmt: skip
                    note_tile(res, n, k, m, name, us)
            try:
                res["planes"] = _time(tri, x, planes)
            except ValueError as e:  # the bit-plane kernels refuse some formats (MXFP4 under FP8 x: groups < 128)
                print("planes:", str(e)[:120])
                res["planes"] = float("nan")
            try:
                if hum:
                    res["humming"] = _time(get_backend("humming"), x, hum)
            except Exception as e:  # humming refuses some formats at its first call (fp16 scales, bf16 x)
                print("humming:", repr(e)[:160])
                hum = []
            bits = qw.scheme.weight_bits
            floor = (n * k * bits / 8 + n * k / 128 * 2 + 2 * m * (n + k)) / 4.2e12 * 1e6
            summary.append(dict(n=n, k=k, m=m, floor_us=floor, default_tile=default, **res))
            b = res.setdefault("best", (float("nan"), "none ran"))
            print(f"{n}x{k} M={m:<3d} floor {floor:6.1f}  frag default {res['default']:6.1f} (bn{default['block_n']} "
                  f"sk{default['split_k']})  best {b[0]:6.1f} {b[1]:20s} planes {res['planes']:6.1f}  "
                  f"humming {res.get('humming', float('nan')):6.1f}", flush=True)  # fmt: skip
    write_sweep(args.out, f"sweep_frag_{args.scheme}{args.label}", rows, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
