"""What one switch of anybit's route costs or gains: the route for each (scheme, shape, M) with the switch
off and on, in one process, each checked against the exact product (FP8 activations: against the product
of the route's own quantized x) and a relaunch bit for bit, then CUDA-graph µs per call over weight copies
beyond L2 (the two variants timed alternately, twice each, so drift lands on both). Switches:
  settle      ANYBIT_FRAG_SETTLE: each frag K block waits for its wgmma (`settled`)
  quant-wide  the activation quantizer reads a decode row in one step (`quant_act.WIDE_MAX_M`; off: 0)
  quant-group-block  per-group activation scales on rows past the decode: 4096 columns a step (off: 1024,
              `quant_act.GROUP_BLOCK`)
  quant-split several programs share a decode row, SPLIT_CHUNK columns each (`split_chunk`; off: SPLIT_MAX_M 0)
  quant-early the quantizer lets its frag GEMM launch at once at every M (off: at none; `QUANT_EARLY_MAX_M`)
  pdl         ANYBIT_PDL: programmatic dependent launch at all
  mid256-e2m1 NVFP4 / MXFP4 (A16) at 129-256 rows on the frag kernel's 256-token tiles (`FRAG_MID_256`; off: the
              large-M paths, as before 2026-12-01)
  scale-bits  NVFP4 / MXFP4 folded scales built from their bits (`frag.SCALE_BITS`; off: decoded)
  rowwise     MXFP4 under FP8 x: e4m3 W and cuBLAS row-wise above ROWWISE_MIN_M(_A8) rows (off: never; on: always)
  pairs       the dense frag kernel's decode tiles take two 128-K blocks an iteration (`frag.FRAG_PAIRS`)
  pairs3      3-bit codes two blocks an iteration by `frag.FRAG3_PAIRS`'s rule (off: one block; FRAG_PAIRS off)
  a8-acc      e2m1 under FP8 x: the FP8 MMA accumulates the whole K (`frag.A8_MMA_ACC`; off: a product per block
              added in fp32)
  subs        e2m1 under FP8 x at 129-192 rows: three 64-token tiles on one decode (`frag.FRAG_SUBS`; off: a 256-token
              tile); the tile is picked per prepared weight, so each variant prepares its own copies
  e2m1-a8     ANYBIT_E2M1_A8 when the weights are prepared: MXFP4 under FP8 x on the FP8 MMA by look-up tables (off:
              x's codes on the A16 kernels, `codes_a16`); each variant prepares its own copies
  rs          ANYBIT_FRAG_RS: A16 at 33-256 rows on the register-operand kernel where `rs_tile` takes them (`frag_rs`;
              off: the warp-specialised kernel's tiles or the frag kernel's); each variant prepares its own copies
  rs-parts    ANYBIT_FRAG_RS_PARTS: 257-384 rows that the register-operand kernel's tiles would overfill as two of
              its launches (`frag_rs.rs_parts`; off: the warp-specialised kernel's tile or dequantize + cuBLAS); each
              variant prepares its own copies
  rs-w2       2-bit codes on the register-operand kernel (ANYBIT_RS_W2; off: the frag kernel's decode tiles and
              dequantize + cuBLAS); each variant prepares its own copies

    python tools/probe_toggle.py --switch settle [--schemes w4a16,w8a16] [--shapes 8192x8192] [--m 1,16,64,128]

Prints µs off / on and on/off per cell; writes DIR/probe_<switch>.json.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import relaunch_err, relaunch_why, write_probe  # noqa: E402

import anybit  # noqa: E402
from anybit.backends import triton as triton_backend  # noqa: E402
from anybit.bench.timing import median, time_graph  # noqa: E402
from anybit.formats.scheme import Scheme  # noqa: E402
from anybit.kernels import frag, quant_act  # noqa: E402
from anybit.kernels.quant_act import quantize_act  # noqa: E402
from anybit.quant.activations import dequantize_activation  # noqa: E402

VARIANTS = ("off", "on")


def _settle(on: bool) -> None:
    os.environ["ANYBIT_FRAG_SETTLE"] = "1" if on else "0"  # read per call


def _quant_wide(on: bool, wide=quant_act.WIDE_MAX_M) -> None:
    quant_act.WIDE_MAX_M = wide if on else 0  # read per call


def _quant_group_block(on: bool, off=quant_act.GROUP_BLOCK) -> None:
    quant_act.GROUP_BLOCK = 4096 if on else off  # read per call


def _quant_split(on: bool, rows=quant_act.SPLIT_MAX_M or 64) -> None:
    quant_act.SPLIT_MAX_M = rows if on else 0  # read per call (on: the shipped rule, `split_chunk`)


def _quant_early(on: bool) -> None:
    triton_backend.QUANT_EARLY_MAX_M = 1 << 30 if on else 0  # read per call


def _pdl(on: bool) -> None:
    os.environ["ANYBIT_PDL"] = "1" if on else "0"  # read per call


def _scale_bits(on: bool) -> None:
    frag.SCALE_BITS = on  # read per call


def _rowwise(on: bool) -> None:
    triton_backend.ROWWISE_MIN_M = triton_backend.ROWWISE_MIN_M_A8 = 0 if on else 1 << 30  # read per call


def _mid256_e2m1(on: bool) -> None:
    if on:
        triton_backend.FRAG_MID_256["e2m1"] = 0  # read per call (any shape)
    else:
        triton_backend.FRAG_MID_256.pop("e2m1", None)


def _pairs(on: bool) -> None:
    frag.FRAG_PAIRS = on  # read per call


def _pairs3(on: bool) -> None:
    frag.FRAG3_PAIRS = on  # read per call


def _rs_w2(on: bool) -> None:
    os.environ["ANYBIT_RS_W2"] = "1" if on else "0"  # read when a prepared weight first sees a dtype


def _a8_acc(on: bool) -> None:
    frag.A8_MMA_ACC = on  # read per call


def _subs(on: bool) -> None:
    frag.FRAG_SUBS = on  # read when a call's tile is picked (once per prepared weight and M)


def _rs(on: bool) -> None:
    os.environ["ANYBIT_FRAG_RS"] = "1" if on else "0"  # read when a prepared weight first sees an M


def _e2m1_a8(on: bool) -> None:
    os.environ["ANYBIT_E2M1_A8"] = "1" if on else "0"  # read when a weight is prepared


def _rs_wide(on: bool) -> None:
    os.environ["ANYBIT_RS_WIDE"] = "1" if on else "0"  # read when a prepared weight first sees an M


def _rs_parts(on: bool) -> None:
    os.environ["ANYBIT_FRAG_RS_PARTS"] = "1" if on else "0"  # read when a prepared weight first sees an M


# switches read by `prepare`, or by the tile a prepared weight keeps per M: each variant times its own prepared copies
PREPARE_TIME = {"e2m1-a8", "subs", "a8-acc", "rs", "rs-parts", "rs-w2", "rs-wide"}

SWITCHES = {
    "a8-acc": _a8_acc,
    "subs": _subs,
    "rs": _rs,
    "rs-parts": _rs_parts,
    "rs-wide": _rs_wide,
    "e2m1-a8": _e2m1_a8,
    "pairs": _pairs,
    "pairs3": _pairs3,
    "rs-w2": _rs_w2,
    "mid256-e2m1": _mid256_e2m1,
    "scale-bits": _scale_bits,
    "rowwise": _rowwise,
    "settle": _settle,
    "quant-wide": _quant_wide,
    "quant-group-block": _quant_group_block,
    "quant-split": _quant_split,
    "quant-early": _quant_early,
    "pdl": _pdl,
}


def _timed(x, preps, switch, on: bool) -> float:
    switch(on)  # the graph captures this variant's kernels
    return median(time_graph([lambda p=p: anybit.gemm(x, p) for p in preps], 20, 15, 20))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", choices=sorted(SWITCHES), required=True)
    ap.add_argument("--schemes", default="w4a16,w8a16,nvfp4,mxfp4,w4a16:e2m1:g64:bf16,w2a16,w4a8")
    ap.add_argument("--shapes", default="8192x8192,28672x8192")
    ap.add_argument("--m", default="1,16,64,128")
    ap.add_argument("--copies", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    dev = torch.device("cuda")
    rows, errors = [], {}
    switch = SWITCHES[args.switch]
    for name in args.schemes.split(","):
        scheme = Scheme.parse(name)
        for shape in args.shapes.split(","):
            n, k = (int(v) for v in shape.split("x"))
            qws = [anybit.quantize(torch.randn(n, k, device=dev) * 0.02, scheme) for _ in range(args.copies)]
            preps = {}
            for v in VARIANTS:
                if args.switch in PREPARE_TIME or not preps:
                    switch(v == "on")
                    preps[v] = [anybit.prepare(qw) for qw in qws]
                else:
                    preps[v] = preps["off"]
            for m in (int(v) for v in args.m.split(",")):
                x = torch.randn(m, k, device=dev).bfloat16()
                xr = x[:64]
                if scheme.act.quantized:  # the route's own quantized activations
                    xq, xs = quantize_act(xr, scheme.act, qws[0].input_scale)
                    xr = dequantize_activation(xq, xs, scheme.act)
                ref = xr.double() @ qws[0].dequantize().double().T
                row, ok = dict(scheme=name, n=n, k=k, m=m, switch=args.switch), True
                for v in VARIANTS:
                    switch(v == "on")
                    err, same = relaunch_err(lambda x=x, p=preps[v][0]: anybit.gemm(x, p), ref)
                    row[f"{v}_err"] = err
                    why = relaunch_why(err, same)
                    if why:
                        errors[f"{name} {shape} M={m} {args.switch} {v}"] = why
                        ok = False
                if ok:
                    samples = {v: [] for v in VARIANTS}
                    for v in VARIANTS + VARIANTS:
                        samples[v].append(_timed(x, preps[v], switch, v == "on"))
                    row.update({f"{v}_us": min(s) for v, s in samples.items()})
                    ratio = row["on_us"] / row["off_us"]
                    errs = f"err {row['off_err']:.1e} / {row['on_err']:.1e}"
                    print(f"{name:24s} {shape:11s} M={m:4d}  off {row['off_us']:7.1f}  on {row['on_us']:7.1f}"
                          f"  on/off {ratio:5.3f}  {errs}", flush=True)  # fmt: skip
                rows.append(row)
            torch.cuda.empty_cache()
    write_probe(args.out, f"probe_{args.switch.replace('-', '_')}", rows, errors)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
