"""Dense A16 benchmark on one GPU, peers in the same run: anybit (triton), humming-kernels (if importable),
torch bf16 (cuBLAS) and torch's int4 tinygemm. Checks every timed anybit output against the exact
dequantized reference first; times eager (triton.testing.do_bench median, L2 flushed) and, for
M <= 64, CUDA-graph replay of 20 calls rotating over weight copies larger than L2.

    python benchmarks/dense_a16.py [--quick] [--budget 520] [--no-humming]

Prints a table last; writes $OUT/dense_a16.json (or ./dense_a16.json).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from datetime import date

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import anybit  # noqa: E402
from anybit.backends import get_backend  # noqa: E402

# name: (anybit scheme, humming weight_config); the pairs move the same bytes per weight
FORMATS = {
    "w4a16": ("w4a16:int4:g128:bf16", {"dtype": "uint4", "group_size": 128}),
    "w8a16": ("w8a16:int8:ch:bf16", {"dtype": "uint8"}),
    "w3a16": ("w3a16:int3:g128:bf16", {"dtype": "uint3", "group_size": 128}),
    "w2a16": ("w2a16:int2:g128:bf16", {"dtype": "uint2", "group_size": 128}),
    "nvfp4": (
        "nvfp4",
        {"dtype": "float4e2m1", "group_size": 16, "scale_dtype": "float8e4m3", "weight_scale_2_type": "tensor"},
    ),
    "mxfp4": ("mxfp4", {"dtype": "float4e2m1", "group_size": 32, "scale_dtype": "float8e8m0"}),
}
SHAPES = [(8192, 8192), (28672, 8192), (8192, 28672)]
M_ALL = [1, 4, 16, 64, 256, 1024, 4096, 8192]
GRAPH_CALLS = 20


def ceilings():
    a = torch.empty(1 << 28, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    t = triton.testing.do_bench(lambda: b.copy_(a), warmup=20, rep=100, return_mode="median") * 1e-3
    bw = 2 * a.numel() * 4 / t
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = triton.testing.do_bench(lambda: x @ x, warmup=20, rep=200, return_mode="median") * 1e-3
    return bw, 2 * 8192**3 / t


def graph_us(calls):
    """Median µs per call of one CUDA graph holding `calls` (warm them first)."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    for _ in range(3):
        g.replay()
    ts = []
    for _ in range(15):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / len(calls))
    return statistics.median(ts)


def eager_us(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3


def tinygemm_weight(qw):
    """torch's int4 tinygemm layout from anybit int4 g128 codes: w = (u - 8) * s + 0."""
    u = (qw.codes().to(torch.int32) + 8) & 0xF  # two's complement code -> unsigned offset 8
    packed = (u[:, ::2] << 4 | u[:, 1::2]).to(torch.uint8)
    w4 = torch.ops.aten._convert_weight_to_int4pack(packed, 8)
    s = qw.scale_values().t().contiguous()  # [K/g, N]
    sz = torch.stack([s, torch.zeros_like(s)], dim=-1).to(torch.bfloat16)
    return w4, sz


class Runner:
    def __init__(self, args):
        self.args = args
        self.t0 = time.time()
        self.rows = []
        self.notes = []
        self.hum = None
        if not args.no_humming:
            try:
                from humming.layer import HummingLayer

                self.hum = HummingLayer
            except Exception as e:  # noqa: BLE001 - report and go on without the peer
                self.notes.append(f"humming not importable: {e!r}")
        p = torch.cuda.get_device_properties(0)
        self.l2 = int(getattr(p, "L2_cache_size", 50 << 20))
        self.bw, self.peak = ceilings()

    def left(self):
        return self.args.budget - (time.time() - self.t0)

    def run_case(self, fmt, n, k, ms):
        scheme, hwc = FORMATS[fmt]
        w = torch.randn(n, k, device="cuda") * 0.02
        qw = anybit.quantize(w, scheme)
        deq = qw.dequantize(torch.float32)
        be = get_backend("triton")
        copies = max(1, math.ceil(2 * self.l2 / qw.nbytes) + 1)
        preps = [anybit.prepare(qw, backend="triton") for _ in range(copies)]
        wb = [w.bfloat16() for _ in range(max(1, math.ceil(2 * self.l2 / (2 * n * k)) + 1))]
        tiny = tinygemm_weight(qw) if fmt == "w4a16" else None
        hums = []
        if self.hum is not None and self.left() > 120:
            try:
                for _ in range(copies):
                    layer = self.hum(
                        shape_n=n, shape_k=k, weight_config=dict(hwc), input_config=None, torch_dtype=torch.bfloat16
                    ).cuda()
                    layer.load_from_unquantized(w.bfloat16())
                    layer.transform()
                    hums.append(layer)
            except Exception as e:  # noqa: BLE001
                self.notes.append(f"humming {fmt} {n}x{k}: {e!r}"[:300])
                hums = []
        for m in ms:
            if self.left() < 20:
                self.notes.append(f"budget: skipped {fmt} {n}x{k} M={m} and later")
                return
            x = torch.randn(m, k, device="cuda").bfloat16()
            ref = x.float() @ deq.T
            row = dict(fmt=fmt, scheme=scheme, n=n, k=k, m=m, weight_bytes=qw.nbytes)
            y = be.gemm(x, preps[0])
            row["rel_err"] = float((y.float() - ref).norm() / ref.norm())
            if row["rel_err"] > 2e-2:
                row["error"] = "anybit output wrong: not timed"
                self.rows.append(row)
                continue
            calls = {"anybit": [lambda p=p, x=x: be.gemm(x, p) for p in preps]}
            calls["bf16"] = [lambda wi=wi, x=x: x @ wi.T for wi in wb]
            if tiny is not None and m <= 256:
                calls["tinygemm"] = [lambda x=x: torch.ops.aten._weight_int4pack_mm(x, tiny[0], 128, tiny[1])]
            if hums and self.left() > 60:
                try:
                    yh = hums[0](x)
                    row["humming_rel_err_vs_float"] = float((yh.float() - x.float() @ w.T).norm() / ref.norm())
                    calls["humming"] = [lambda h=h, x=x: h(x) for h in hums]
                except Exception as e:  # noqa: BLE001
                    self.notes.append(f"humming {fmt} {n}x{k} M={m}: {e!r}"[:300])
            for name, fns in calls.items():
                row[f"{name}_us"] = eager_us(fns[0])
                if m <= 64:
                    seq = [fns[i % len(fns)] for i in range(GRAPH_CALLS)]
                    row[f"{name}_graph_us"] = graph_us(seq)
            bytes_ = qw.nbytes + 2 * m * (k + n)
            row["floor_us"] = max(bytes_ / self.bw, 2 * m * n * k / self.peak) * 1e6
            self.rows.append(row)
            self.print_row(row)

    @staticmethod
    def best(row, name):
        return row.get(f"{name}_graph_us", row.get(f"{name}_us"))

    def print_row(self, r):
        def f(name):
            v = self.best(r, name)
            return f"{v:9.1f}" if v is not None else "        -"

        a = self.best(r, "anybit")
        tf = 2 * r["m"] * r["n"] * r["k"] / (a * 1e-6) / 1e12 if a else 0
        pct = 100 * r["floor_us"] / a if a else 0
        h = self.best(r, "humming")
        vs = f"{h / a:5.2f}x" if (h and a) else "    -"
        print(
            f"{r['fmt']:6} {r['n']:>5}x{r['k']:<5} M={r['m']:<5} anybit{f('anybit')} humming{f('humming')} "
            f"bf16{f('bf16')} tiny{f('tinygemm')}  {tf:6.1f} TF/s {pct:5.1f}% floor  hum/any {vs} "
            f"err {r['rel_err']:.1e}",
            flush=True,
        )


def sweep_decode(shapes, ms=(1, 16, 64)):
    """Graph µs of w4a16 decode tiles (split-K by the default rule), to choose default_config."""
    from anybit.backends.triton import default_config
    from anybit.kernels.gemm_a16 import A16Config

    be = get_backend("triton")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    tiles = [(64, 256, 4, 3), (64, 128, 4, 4), (128, 128, 4, 4), (32, 256, 4, 3), (64, 512, 4, 2), (128, 256, 8, 3)]
    out = []
    for n, k in shapes:
        qw = anybit.quantize(torch.randn(n, k, device="cuda") * 0.02, "w4a16")
        preps = [anybit.prepare(qw, backend="triton") for _ in range(4)]
        for m in ms:
            x = torch.randn(m, k, device="cuda").bfloat16()
            base = default_config(m, n, k, 4, sms, False)
            for bn, bk, warps, stages in tiles:
                bm = 16 if m <= 16 else 64
                split = base.split_k * base.block_n // bn
                for sk in sorted({max(1, split // 2), max(1, split), split * 2}):
                    for pairs in (False, True):
                        cfg = A16Config(bm, bn, bk, split_k=sk, num_warps=warps, num_stages=stages, pairs=pairs)
                        try:
                            us = graph_us([lambda p=p, c=cfg, x=x: be.gemm(x, p, config=c) for p in preps] * 5)
                        except Exception as e:  # a config that does not compile or fit is skipped
                            us = float("nan")
                            print("sweep", cfg, repr(e)[:120])
                        out.append(dict(n=n, k=k, m=m, cfg=cfg.__dict__, graph_us=us))
    best = {}
    for r in out:
        key = (r["n"], r["k"], r["m"], r["cfg"]["pairs"])
        if r["graph_us"] == r["graph_us"] and (key not in best or r["graph_us"] < best[key]["graph_us"]):
            best[key] = r
    for key, r in sorted(best.items()):
        print(f"sweep best {key}: {r['graph_us']:.1f} us {r['cfg']}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="w4a16 on 8192x8192 only")
    ap.add_argument("--budget", type=float, default=520.0, help="seconds before remaining cells are skipped")
    ap.add_argument("--no-humming", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="first sweep decode tiles for w4a16")
    ap.add_argument("--commit", default="", help="commit measured, where the tree has no .git (device copies)")
    ap.add_argument("--formats", default="w4a16,w8a16,nvfp4,mxfp4,w3a16,w2a16")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK,NxK,...")
    args = ap.parse_args()
    r = Runner(args)
    print(f"ceilings: copy {r.bw / 1e12:.2f} TB/s, cuBLAS bf16 {r.peak / 1e12:.0f} TFLOP/s", flush=True)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    sweep = sweep_decode(shapes[:2]) if args.sweep else []
    plan = [("w4a16", n, k, M_ALL) for n, k in (shapes[:1] if args.quick else shapes)]
    if not args.quick:
        for fmt in args.formats.split(","):
            if fmt != "w4a16":
                plan += [(fmt, n, k, [1, 16, 64, 1024, 4096]) for n, k in shapes[:2]]
    for fmt, n, k, ms in plan:
        if fmt in args.formats.split(","):
            r.run_case(fmt, n, k, ms)
        torch.cuda.empty_cache()
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    commit = args.commit or git.stdout.strip()
    env = dict(
        date=str(date.today()),
        gpu=torch.cuda.get_device_name(0),
        torch=torch.__version__,
        triton=triton.__version__,
        anybit=anybit.__version__,
        commit=commit or "unknown",
        copy_tbps=r.bw / 1e12,
        bf16_tflops=r.peak / 1e12,
        humming=getattr(sys.modules.get("humming"), "__version__", None),
    )
    out = os.path.join(os.environ.get("OUT", "."), "dense_a16.json")
    with open(out, "w") as fh:
        json.dump(dict(env=env, rows=r.rows, notes=r.notes, sweep=sweep), fh, indent=1)
    print("\nnotes:", *r.notes, sep="\n  ")
    print(json.dumps(env))
    print("\n== summary (µs; graph for M<=64) ==")
    for row in r.rows:
        if "error" in row:
            print(row["fmt"], row["n"], row["k"], row["m"], row["error"], row["rel_err"])
        else:
            r.print_row(row)


if __name__ == "__main__":
    main()
