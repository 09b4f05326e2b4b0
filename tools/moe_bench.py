"""Time anybit's grouped MoE GEMMs on the GPU at the MoE issue's shapes (DeepSeek-V3, Qwen3-30B-A3B):
gate_up (silu-and-mul fused), down (top-k weights fused), moe_align, and the whole QuantMoE layer; with
`--peers humming` Humming's two indexed GEMMs and a whole layer around them (`_humming_layer_parts`).

    python tools/moe_bench.py [--schemes w4a16,mxfp4] [--models deepseek-v3] [--m 1,4,16,64,256,1024,4096]
                              [--budget 200] [--out DIR] [--peers humming,bf16] [--splits 1,2,4,8] [--eager]
                              [--tiles num_stages=6,block_n=64:split_k=2] [--tiles-large block_m=256] [--kernels]

Weights are random codes and scales in the scheme's layout (quantizing 7.5 G DeepSeek weights from
floats would cost minutes and says nothing about speed). Each timed graph holds 20 calls rotating over
20 routings, so decode calls touch different experts (Qwen3's 8 experts would otherwise sit in L2).
Floor = (bytes of the distinct experts each call touches + activations + outputs) / 4.2 TB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from probe_out import kernel_us, tile_overrides  # noqa: E402

from anybit.bench.timing import median, time_eager, time_graph  # noqa: E402
from anybit.formats import FloatType  # noqa: E402
from anybit.formats.scheme import Scheme  # noqa: E402
from anybit.kernels.moe_gemm import moe_gemm, moe_tile_kind  # noqa: E402
from anybit.moe import QuantMoE, moe_align, softmax_topk  # noqa: E402
from anybit.moe.layer import down_tiles, grouped_inputs, moe_tiles, takes_slot_blocks  # noqa: E402
from anybit.quant.weights import QuantizedWeight  # noqa: E402

MODELS = {"deepseek-v3": dict(E=256, top_k=8, H=7168, I=2048), "qwen3-30b-a3b": dict(E=128, top_k=8, H=2048, I=768),
          "mixtral-8x7b": dict(E=8, top_k=2, H=4096, I=14336)}  # fmt: skip
ISSUE_MODELS = "deepseek-v3,qwen3-30b-a3b"  # the MoE issue's shapes: the default
HBM = 4.2e12


def random_weight(scheme: Scheme, shape, dev) -> QuantizedWeight:
    qw = QuantizedWeight.empty(scheme, shape, device=dev)
    qw.qweight.random_(-(2**31), 2**31 - 1)
    if scheme.weight_bits == 8 and isinstance(scheme.weight, FloatType):  # no NaN / inf codes: top exponent bit off
        qw.qweight.view(torch.uint8).bitwise_and_(0xBF)
    s = qw.scales
    if s.dtype == torch.uint8:  # 8-bit float scale codes: ue8m0 near 2**-7, e4m3 small positive values
        s.random_(120, 124) if scheme.scale_dtype.name == "ue8m0" else s.random_(0x20, 0x30)
    else:
        s.uniform_(0.001, 0.003)
    if qw.zeros is not None:
        qw.zeros.random_(0, 2**scheme.weight_bits)
    if qw.global_scale is not None:
        qw.global_scale.fill_(1.0)
    return qw


def cell(name, us, rows, n, k, touched_bytes, x_bytes, y_bytes) -> dict:
    floor = (touched_bytes + x_bytes + y_bytes) / HBM * 1e6
    return dict(part=name, us=round(us, 2), tflops=round(2 * rows * n * k / us / 1e6, 1), floor_us=round(floor, 2),
                pct_floor=round(100 * floor / us, 1))  # fmt: skip


def _variants(splits: list, tiles_arg: str) -> list:
    """(tag, forced split or None, tile overrides): the layer's plan, each forced split, each `--tiles`
    variant ("num_stages=6:block_n=64", split_k among the keys)."""
    out = [("", None, {})] + [(f"@sk{s}", s, {}) for s in splits]
    for v in filter(None, tiles_arg.split(",")):
        kv = tile_overrides(v)
        split = kv.pop("split_k", None)
        out.append(("@" + v.replace("num_stages=", "s").replace("block_n=", "bn").replace("split_k=", "sk")
                    .replace("block_m=", "bm").replace("num_warps=", "w").replace(":", ""), split, kv))  # fmt: skip
    return out


def _parts(moe: QuantMoE, x: torch.Tensor, routes: list, tiles: dict, variants: list, ws_tiles: str = "") -> dict:
    """Callables per timed part, one per routing: the two grouped GEMMs alone (with the layer's own
    split-K plan and tile, and each of `variants`; where the layer takes the warp-specialised kernel, it too as
    "@ws", and each of `ws_tiles`), the alignment, the layer."""
    gu, dn, fused = moe._stacked
    e, i, h = moe.num_experts, moe.intermediate, moe.hidden
    m, top_k = routes[0][1].shape
    aligned = {}  # block_m -> the routings aligned to it (a variant may change block_m)
    act = torch.empty(m * top_k, i, device=x.device, dtype=x.dtype).normal_()
    y = torch.zeros(m * top_k, h, device=x.device, dtype=x.dtype)
    # FP8-activation schemes: the inputs quantized once, outside the timed GEMMs (the layer times it all)
    xin, ain = grouped_inputs(x, gu), grouped_inputs(act, dn)
    y_tok = torch.zeros(m, h, device=x.device, dtype=x.dtype)
    out = {}

    def layer(w, ids, slot_rows=None, split=None):
        def run():
            keep = moe.slot_max_rows, moe.split_k
            moe.slot_max_rows = keep[0] if slot_rows is None else slot_rows
            moe.split_k = split
            try:
                return moe(x, w, ids)
            finally:
                moe.slot_max_rows, moe.split_k = keep

        return run

    dn_tiles = down_tiles(tiles, moe_tile_kind(dn, x.dtype), dn.k)  # the layer's own down tile; variants' keys over it
    for tag, split, over in variants:
        moe.split_k = split
        t_tiles = tiles | over
        bm = t_tiles["block_m"]
        aligned.setdefault(bm, [moe_align(ids, e, bm) for _, ids in routes])
        t_dn = dn_tiles | over
        kgu, kdn = moe._launch(x, gu, m * top_k, t_tiles, fused), moe._launch(x, dn, m * top_k, t_dn, False)
        out["gate_up" + tag] = [
            (lambda a=a, kw=kgu: moe_gemm(tw=gu, sorted_ids=a[0], expert_ids=a[1], total=a[2], top_k=top_k,
                                          silu_mul=fused, **xin, **kw))
            for a in aligned[bm]
        ]  # fmt: skip
        out["down" + tag] = [
            (lambda a=a, w=w, kw=kdn: moe_gemm(tw=dn, sorted_ids=a[0], expert_ids=a[1], total=a[2], top_k=1, out=y,
                                               routed_weights=_rw(w), **ain, **kw))
            for a, (w, _) in zip(aligned[bm], routes, strict=True)
        ]  # fmt: skip
        if takes_slot_blocks(m * top_k, bm, SLOT_TRY_TOKENS * top_k):  # the same launches on slot blocks (no
            kgu, kdn = moe._slot_plan(x, m * top_k, kgu, kdn)  # alignment; the down GEMM sums each token's slots)
            out["gate_up@slots" + tag] = [
                (lambda ids=ids, kw=kgu: moe_gemm(tw=gu, sorted_ids=None, expert_ids=ids.reshape(-1), total=None,
                                                  top_k=top_k, silu_mul=fused, **xin, **kw))
                for _, ids in routes
            ]  # fmt: skip
            out["down@slots" + tag] = [
                (lambda w=w, ids=ids, kw=kdn: moe_gemm(tw=dn, sorted_ids=None, expert_ids=ids.reshape(-1), total=None,
                                                       top_k=1, out=y_tok, routed_weights=_rw(w), sum_slots=top_k,
                                                       **ain, **kw))
                for w, ids in routes
            ]  # fmt: skip
        if split is not None and not over:  # the whole layer with that split forced (tile overrides: GEMMs only)
            out["layer" + tag] = [layer(w, ids, split=split) for w, ids in routes]
    moe.split_k = None
    # the warp-specialised kernel where the layer takes it (`moe_gemm_ws`, W4A8: `moe_gemm_ws_a8`), and its variants
    ws, run = moe._ws_plan(x, m * top_k)
    variants = [("@ws", {})] + [("@ws" + v.replace("=", "").replace(":", ""), tile_overrides(v))
                                for v in filter(None, ws_tiles.split(","))]  # fmt: skip
    for tag, over in variants if ws else []:
        kw = ws | over
        bm = kw["block_m"]
        aligned.setdefault(bm, [moe_align(ids, e, bm) for _, ids in routes])
        out["gate_up" + tag] = [
            (lambda a=a, kw=kw: run(tw=gu, sorted_ids=a[0], expert_ids=a[1], total=a[2], top_k=top_k,
                                    num_rows=m * top_k, silu_mul=fused, **xin, **kw))
            for a in aligned[bm]
        ]  # fmt: skip
        out["down" + tag] = [
            (lambda a=a, w=w, kw=kw: run(tw=dn, sorted_ids=a[0], expert_ids=a[1], total=a[2], top_k=1,
                                         num_rows=m * top_k, out=y, routed_weights=_rw(w), **ain, **kw))
            for a, (w, _) in zip(aligned[bm], routes, strict=True)
        ]  # fmt: skip

    def align(ids):
        return lambda: moe_align(ids, e, tiles["block_m"])

    out |= {"align": [align(ids) for _, ids in routes], "layer": [layer(w, ids) for w, ids in routes]}
    if m * top_k <= moe.slot_max_rows:  # the layer without its slot blocks, for comparison
        out["layer@aligned"] = [layer(w, ids, 0) for w, ids in routes]
    elif m <= SLOT_TRY_TOKENS:  # slot blocks forced where more tokens share experts
        out["layer@slots"] = [layer(w, ids, m * top_k) for w, ids in routes]
    return out


# Up to how many tokens `layer@slots` times the layer's slot blocks (`QuantMoE.slot_max_rows`) beside its plan.
SLOT_TRY_TOKENS = 16


def _rw(w: torch.Tensor) -> torch.Tensor:
    return w.reshape(-1).float().contiguous()


def _bf16_parts(weights: tuple, x: torch.Tensor, routes: list, tiles: dict) -> dict:
    """The bf16 baseline (tools/moe_bf16.py) over the same routings and alignment, gate_up unfused."""
    from moe_bf16 import bf16_moe_gemm

    gu, dn = weights
    e, m, top_k = gu.shape[0], *routes[0][1].shape
    bm = tiles["block_m"]
    aligned = [moe_align(ids, e, bm) for _, ids in routes]
    act = torch.empty(m * top_k, dn.shape[2], device=x.device, dtype=x.dtype).normal_()
    kw = dict(num_rows=m * top_k, block_m=bm)
    return {
        "bf16:gate_up": [(lambda a=a: bf16_moe_gemm(x, gu, *a, top_k=top_k, **kw)) for a in aligned],
        "bf16:down": [(lambda a=a: bf16_moe_gemm(act, dn, *a, top_k=1, **kw)) for a in aligned],
    }


def _humming_layers(moe: QuantMoE, dtype) -> tuple:
    """Humming's indexed-MoE layers holding the same expert weights (gate rows then up rows, as the
    checkpoint has them; Humming's gate_up does not fuse the activation), and a note when they are not
    exactly the same: fp32 scales (W8A8-FP8's channel scales) rounded to Humming's bf16 ones — the same
    work timed, a result within bf16 rounding (checked against the exact product like the others)."""
    from anybit.backends.humming import humming_configs, humming_moe_layer
    from anybit.errors import Unsupported

    try:
        humming_configs(moe.gate_up.scheme)
        exact, note = True, ""
    except Unsupported as ex:
        humming_configs(moe.gate_up.scheme, exact_scales=False)  # raises what no rounding can map
        exact, note = False, f"humming with its own scale dtype ({ex})"
        print(note, flush=True)
    layers = tuple(humming_moe_layer(w, dtype, exact_scales=exact) for w in (moe.gate_up, moe.down))
    return layers, note


# Humming's heuristic tile of the last `_humming_parts` call per part, recorded beside its timings
PEER_TILE_KEYS = ("block_shape", "warp_shape", "num_stages", "num_ctas_per_sm", "use_warp_spec", "mma_type")
PEER_TILES: dict[str, dict] = {}


def _humming_parts(layers: tuple, moe: QuantMoE, x: torch.Tensor, routes: list) -> dict:
    """Humming's indexed GEMMs over the same routings: its own heuristic tile for R = M * top_k rows
    pinned as the only tuning interval, and its own alignment with that tile's block rows (what its
    KernelTestRunner does); gate_up output checked against the exact per-slot product first."""
    from humming.testing.data import generate_moe_tensors
    from humming.tune import get_heuristics_config

    e, i = moe.num_experts, moe.intermediate
    m, top_k = routes[0][1].shape
    r = m * top_k
    act = torch.empty(r, i, device=x.device, dtype=x.dtype).normal_()
    cc = json.dumps({"gemm_type": "indexed"})
    out = {}
    for name, layer, inp, tk in (("humming:gate_up", layers[0], x, top_k), ("humming:down", layers[1], act, 1)):
        cfg = json.loads(json.dumps(get_heuristics_config(layer.humming_config, shape_m=r, gemm_type="indexed"),
                                    default=lambda o: getattr(o, "value", None) or str(o)))  # fmt: skip
        tc = json.dumps([[0, 1 << 30, cfg]])
        PEER_TILES[name] = {k: cfg.get(k) for k in PEER_TILE_KEYS}
        print(f"{name} tile at {r} rows: {PEER_TILES[name]}", flush=True)
        bm = int(cfg["block_shape"][0])
        aligned = [generate_moe_tensors(ids.int(), e, "indexed", block_size_config=bm)[2:] for _, ids in routes]

        def call(a, layer=layer, inp=inp, tk=tk, tc=tc):
            return lambda: layer(inp, sorted_ids=a[0], expert_ids=a[1], num_tokens_padded=a[2], top_k=tk,
                                 compute_config=cc, tuning_config=tc)  # fmt: skip

        out[name] = [call(a) for a in aligned]
    y = out["humming:gate_up"][0]()
    ids = routes[0][1].reshape(-1)
    for slot in range(min(r, 4)):
        w = moe.gate_up.expert(int(ids[slot])).dequantize()
        ref = x[slot // top_k].float() @ w.T
        err = float((y[slot].float() - ref).norm() / ref.norm())
        if not err < (6e-2 if moe.gate_up.scheme.act.quantized else 2e-2):  # FP8 x: e4m3 rounding of x
            raise RuntimeError(f"humming gate_up slot {slot}: rel. error {err:.2e} vs the exact product")
    return out


def _humming_layer_parts(layers: tuple, moe: QuantMoE, x: torch.Tensor, routes: list) -> dict:
    """A whole MoE layer around Humming's two indexed GEMMs, timed like ours (alignment included): anybit's
    `moe_align` (vLLM's contract) at each GEMM's block rows, silu·mul between them and the top-k weighted sum
    after, each one pass as vLLM's kernels do (`tools/moe_glue.py`; before session 42 torch ops, whose float
    casts and separate multiplies added ~0.45 ms to the DeepSeek-V3 layer at M=1024); checked against our
    layer's output first."""
    from humming.tune import get_heuristics_config
    from moe_glue import silu_mul, weighted_sum

    e = moe.num_experts
    m, top_k = routes[0][1].shape
    cc = json.dumps({"gemm_type": "indexed"})
    plans = []
    for layer in layers:
        cfg = json.loads(json.dumps(get_heuristics_config(layer.humming_config, shape_m=m * top_k,
                                                          gemm_type="indexed"),
                                    default=lambda o: getattr(o, "value", None) or str(o)))  # fmt: skip
        plans.append((layer, int(cfg["block_shape"][0]), json.dumps([[0, 1 << 30, cfg]])))

    def layer_call(w, ids):
        def run():
            a = {bm: moe_align(ids, e, bm) for bm in {bm for _, bm, _ in plans}}
            (gu, bm_gu, tc_gu), (dn, bm_dn, tc_dn) = plans
            hid = gu(x, sorted_ids=a[bm_gu][0], expert_ids=a[bm_gu][1], num_tokens_padded=a[bm_gu][2], top_k=top_k,
                     compute_config=cc, tuning_config=tc_gu)  # fmt: skip
            y = dn(silu_mul(hid), sorted_ids=a[bm_dn][0], expert_ids=a[bm_dn][1], num_tokens_padded=a[bm_dn][2],
                   top_k=1, compute_config=cc, tuning_config=tc_dn)  # fmt: skip
            return weighted_sum(y, w)

        return run

    calls = [layer_call(w, ids) for w, ids in routes]
    w, ids = routes[0]
    ours = moe(x, w, ids).float()
    err = float((calls[0]().float() - ours).norm() / ours.norm())
    if not err < (8e-2 if moe.gate_up.scheme.act.quantized else 3e-2):
        raise RuntimeError(f"humming layer: rel. error {err:.2e} against anybit's layer")
    return {"humming:layer": calls}


def run(args) -> list[dict]:
    dev = torch.device("cuda")
    rows_out, t0 = [], time.time()
    for model, c in ((name, MODELS[name]) for name in args.models.split(",")):
        e, top_k, h, i = c["E"], c["top_k"], c["H"], c["I"]
        bf16 = None
        if "bf16" in args.peers.split(","):  # once per model, timed beside the first scheme
            from moe_bf16 import bf16_weights

            bf16 = (bf16_weights(e, 2 * i, h, dev), bf16_weights(e, h, i, dev))
        for text in args.schemes.split(","):
            scheme = Scheme.parse(text)
            moe = QuantMoE(random_weight(scheme, (e, 2 * i, h), dev), random_weight(scheme, (e, h, i), dev))
            per_expert = {"gate_up": moe.gate_up.nbytes / e, "down": moe.down.nbytes / e}
            hum, hum_why, hum_note = None, None, ""
            if "humming" in args.peers.split(","):
                try:
                    hum, hum_note = _humming_layers(moe, torch.bfloat16)
                except Exception as ex:  # noqa: BLE001 - the peer's failure is a result, not a crash
                    hum_why = f"humming peer: {type(ex).__name__}: {ex}"[:300]
                    print(hum_why, flush=True)
            for m in (int(v) for v in args.m.split(",")):
                if time.time() - t0 > args.budget:
                    rows_out.append(dict(model=model, scheme=text, m=m, status="skipped: over budget"))
                    continue
                g = torch.Generator(device=dev).manual_seed(m)
                routes = [softmax_topk(torch.randn(m, e, device=dev, generator=g), top_k) for _ in range(20)]
                x = torch.randn(m, h, device=dev, dtype=torch.bfloat16)
                moe(x, *routes[0])  # builds the stacked layout, compiles
                tiles = moe_tiles(m * top_k, e, True, moe_tile_kind(moe._stacked[0], x.dtype))  # the layer's
                touched = sum(len(torch.unique(ids)) for _, ids in routes) / len(routes)
                splits = [int(v) for v in args.splits.split(",") if v] if m <= 64 else []
                parts = _parts(
                    moe, x, routes, tiles, _variants(splits, args.tiles if m <= 64 else args.tiles_large), args.ws_tiles
                )
                if hum is not None:
                    for what, fn in (("humming", _humming_parts), ("humming:layer", _humming_layer_parts)):
                        try:
                            parts |= fn(hum, moe, x, routes)
                        except Exception as ex:  # noqa: BLE001
                            rows_out.append(dict(model=model, scheme=text, m=m, part=what,
                                                 status=f"error: {type(ex).__name__}: {ex}"[:300]))  # fmt: skip
                elif hum_why:
                    rows_out.append(dict(model=model, scheme=text, m=m, part="humming", status=hum_why))
                if bf16 is not None and text == args.schemes.split(",")[0]:
                    parts |= _bf16_parts(bf16, x, routes, tiles)
                r = m * top_k
                if args.parts:  # only these parts (and their @variants) timed; the peers' checks still run
                    keep = args.parts.split(",")
                    parts = {name: fns for name, fns in parts.items() if name.split("@")[0] in keep}
                for name, fns in parts.items():
                    row = dict(model=model, scheme=text, m=m, rows=r, tile=tiles, touched_experts=touched)
                    if name.startswith("humming:") and hum_note:
                        row["note"] = hum_note
                    if name in PEER_TILES:
                        row["peer_tile"] = PEER_TILES[name]
                    try:
                        us = median(time_graph(fns, 20, args.repeats, 20))
                        if args.eager:  # the same 20 calls launched one by one: host time shows
                            row["eager_us"] = round(median(time_eager(fns, 20, args.repeats, 20, True)), 2)
                    except Exception as ex:  # noqa: BLE001 - reported per cell
                        rows_out.append(row | dict(part=name, status=f"error: {type(ex).__name__}: {ex}"[:200]))
                        torch.cuda.synchronize()
                        continue
                    if name.startswith("bf16:"):  # bf16 weights: 2 bytes each, gate_up unfused
                        up = name == "bf16:gate_up"
                        nn, kk = (2 * i, h) if up else (h, i)
                        x_bytes = (m * h if up else r * i) * 2
                        row |= cell(name, us, r, nn, kk, touched * nn * kk * 2, x_bytes, r * nn * 2)
                    elif name == "humming:gate_up":  # unfused: writes both halves
                        row |= cell(name, us, r, 2 * i, h, touched * per_expert["gate_up"], m * h * 2, r * i * 4)
                    elif name.startswith("gate_up"):
                        row |= cell(name, us, r, 2 * i, h, touched * per_expert["gate_up"], m * h * 2, r * i * 2)
                    elif name.startswith("down") or name == "humming:down":
                        row |= cell(name, us, r, h, i, touched * per_expert["down"], r * i * 2, r * h * 2)
                    elif name.split("@")[0] in ("layer", "humming:layer"):
                        wb = touched * (per_expert["gate_up"] + per_expert["down"])
                        row |= cell(name, us, r, 3 * i, h, wb, m * h * 2, m * h * 2)
                    else:
                        row |= dict(part=name, us=round(us, 2))
                    if args.kernels and name.split("@")[0] in ("layer", "humming:layer"):
                        row["kernels_us"] = kernel_us(fns)  # eager, one call per routing
                        print(f"  {name} kernels: " + ", ".join(f"{k} {v}" for k, v in row["kernels_us"].items()))
                    rows_out.append(row | {"status": "ok"})
                    eager = f"  eager {row['eager_us']:9.1f}" if "eager_us" in row else ""
                    print(f"{model:14s} {text:8s} M={m:<5d} {name:16s} {us:9.1f} µs  {row.get('pct_floor', '')}{eager}",
                          flush=True)  # fmt: skip
            del moe, hum
            torch.cuda.empty_cache()
        del bf16
    return rows_out


def summary(rows: list[dict]) -> str:
    """The short table a device call ends with: per model, scheme and M, each part's µs against Humming's same part
    (Humming ÷ anybit; above 1: anybit faster), the parts without a Humming twin alone."""
    us = {(r["model"], r["scheme"], r["m"], r["part"]): r["us"] for r in rows if r.get("status") == "ok"}
    lines = ["", f"{'model':14s} {'scheme':8s} {'M':6s} {'part':24s} anybit µs   Humming µs   Humming/anybit"]
    for (model, scheme, m, part), t in us.items():
        if part.startswith(("humming:", "bf16:")):
            continue
        peer = us.get((model, scheme, m, "humming:" + part.split("@")[0]))
        ratio = f"{peer:12.1f}   {peer / t:14.2f}" if peer else ""
        lines.append(f"{model:14s} {scheme:8s} {m:<6d} {part:24s} {t:9.1f}   {ratio}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", default="w4a16,mxfp4")
    ap.add_argument("--models", default=ISSUE_MODELS, help=f"some of {', '.join(MODELS)}")
    ap.add_argument("--m", default="1,4,16,64,256,1024,4096")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--budget", type=float, default=240)
    ap.add_argument("--eager", action="store_true", help="also time each part eagerly (CUDA events, no graph)")
    ap.add_argument("--kernels", action="store_true", help="the layers' kernels one by one (torch.profiler, µs a call)")
    ap.add_argument("--splits", default="", help="also time the GEMMs with these forced split-K values at M <= 64")
    ap.add_argument("--tiles", default="", help="and with these tile overrides at M <= 64, e.g. "
                    "num_stages=6,block_n=64:split_k=2 (comma between variants, colon inside one)")  # fmt: skip
    ap.add_argument("--parts", default="", help="time only these parts (with their @variants), e.g. "
                    "layer,humming:layer (default: all)")  # fmt: skip
    ap.add_argument("--tiles-large", default="", help="tile overrides at M > 64, e.g. block_m=256:num_warps=8")
    ap.add_argument("--ws-tiles", default="", help="where the layer takes moe_ws: also these of its tiles, e.g. "
                    "block_m=256:stages=4,stages=4")  # fmt: skip
    ap.add_argument("--peers", default="", help="humming: its indexed MoE GEMMs on the same weights; bf16: a "
                    "plain Triton grouped GEMM on bf16 weights (tools/moe_bf16.py)")  # fmt: skip
    ap.add_argument(
        "--quant-early-max-rows",
        type=int,
        default=None,
        help="rows of x up to which the FP8 quantizer triggers its GEMM's early launch",
    )
    ap.add_argument(
        "--pairs",
        choices=("0", "1"),
        default=None,
        help="two K blocks a frag-kernel iteration on decode tiles (`frag.FRAG_PAIRS`; default: shipped)",
    )
    ap.add_argument(
        "--a8-acc",
        choices=("0", "1"),
        default=None,
        help="e2m1 experts under FP8 x: the FP8 MMA accumulates the whole K (`frag.A8_MMA_ACC`; default: shipped)",
    )
    ap.add_argument(
        "--rescale",
        choices=("0", "1"),
        default=None,
        help="W4A8's integer experts accumulate in the FP8 MMA rescaled per K block (`frag.A8_RESCALE`; default: "
        "shipped)",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    from anybit.kernels import frag

    if args.pairs is not None:
        frag.FRAG_PAIRS = args.pairs == "1"
    if args.a8_acc is not None:
        frag.A8_MMA_ACC = args.a8_acc == "1"
    if args.rescale is not None:
        frag.A8_RESCALE = args.rescale == "1"
    if args.quant_early_max_rows is not None:
        import anybit.moe.layer as moe_layer

        moe_layer.QUANT_EARLY_MAX_ROWS = args.quant_early_max_rows
    rows = run(args)
    print(summary(rows), flush=True)
    os.makedirs(args.out, exist_ok=True)
    name, n = "moe_bench.json", 1
    while os.path.exists(os.path.join(args.out, name)):  # several runs in one device call keep every result
        n += 1
        name = f"moe_bench_{n}.json"
    with open(os.path.join(args.out, name), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                   "commit": os.environ.get("ANYBIT_COMMIT"), "quant_early_max_rows": args.quant_early_max_rows,
                   "pairs": args.pairs, "a8_acc": args.a8_acc, "rescale": args.rescale}, f,
                  indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
